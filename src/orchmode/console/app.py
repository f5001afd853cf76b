"""The console's ASGI app: its routes, its assets, its store opened for its lifetime, all
behind the token guard."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..store import open_store
from ..views.pages import report_style
from . import actions, pages
from .auth import Guard
from .state import Console

STATIC = Path(__file__).parent / "static"

__all__ = ["Console", "create_app"]


async def report_css(_: Request) -> Response:
    """The report's own style, so a run looks the same in the console and in its file."""
    return Response(report_style(), media_type="text/css")


ROUTES = [
    Route("/", pages.runs_page),
    Route("/runs/{session:str}", pages.run_page),
    Route("/runs/{session:str}/body", pages.run_body),
    Route("/runs/{session:str}/events", pages.run_events),
    Route("/runs/{session:str}/agents/{agent:str}", pages.agent_page),
    Route("/runs/{session:str}/stop", actions.stop, methods=["POST"]),
    Route("/start", actions.start, methods=["POST"]),
    Route("/approvals", pages.approvals_page),
    Route("/approvals/{number:int}", actions.answer, methods=["POST"]),
    Route("/static/report.css", report_css),
    Mount("/static", StaticFiles(directory=STATIC), name="static"),
]


def create_app(console: Console) -> Guard:
    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        console.store = await open_store(console.store_url)
        try:
            yield
        finally:
            console.runs.close()
            await console.store.close()

    app = Starlette(routes=ROUTES, lifespan=lifespan)
    app.state.console = console
    return Guard(app, console.access)
