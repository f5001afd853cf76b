"""The console's routes: runs, a run (live), approvals, start and stop, and its assets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core.errors import OrchmodeError
from ..core.settings import Settings
from ..store import Store, open_store
from ..views.report import run_sections
from ..views.report_assets import STYLE
from .auth import Access, Guard
from .control import ControlError, Runs
from .feed import changes
from .runs import HistoryCache, list_runs, one_run
from .templates_env import environment, render

STATIC = Path(__file__).parent / "static"


@dataclass
class Console:
    """What every request of one server shares: its store, its secret, the runs it started."""

    settings: Settings
    workdir: Path
    access: Access = field(default_factory=Access)
    store: Store | None = None
    cache: HistoryCache = field(default_factory=HistoryCache)

    def __post_init__(self) -> None:
        self.store_url = self.settings.store_url(self.workdir)
        self.runs = Runs(self.store_url)
        self.templates = environment()

    def opened(self) -> Store:
        assert self.store is not None, "the console's store opens with the app"
        return self.store

    async def page(self, request: Request, name: str, **values: object) -> HTMLResponse:
        """A console page, with what every page shows: the store, the waiting count, and a
        message a POST left for it (escaped like everything else)."""
        waiting = len(await self.opened().approvals(None))
        said, error = request.query_params.get("said"), request.query_params.get("error")
        html = render(
            self.templates, name, store=self.opened().location, waiting=waiting,
            csrf=self.access.csrf, message=error or said or "",
            message_kind="error" if error else "", **values,
        )  # fmt: skip
        return HTMLResponse(html)


def create_app(console: Console) -> Guard:
    """The ASGI app: Starlette's routes behind the token guard."""

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        console.store = await open_store(console.store_url)
        try:
            yield
        finally:
            console.runs.close()
            await console.store.close()

    async def runs_page(request: Request) -> Response:
        query = request.query_params.get("q", "")
        runs = await list_runs(console.opened(), console.cache, query)
        console.runs.reap()
        return await console.page(
            request, "runs.html", runs=runs, query=query, directory=str(console.workdir)
        )

    async def run_page(request: Request) -> Response:
        session = request.path_params["session"]
        run = await one_run(console.opened(), console.cache, session)
        if run is None:
            return PlainTextResponse(f"no run {session} in this store\n", 404)
        history = await console.cache.history(console.opened(), session)
        seq = await console.opened().next_event_seq(session)
        return await console.page(
            request, "run.html", session=session, state=run.state, pid=run.pid,
            body=run_sections(history), seq=seq,
        )  # fmt: skip

    async def run_body(request: Request) -> Response:
        session = request.path_params["session"]
        run = await one_run(console.opened(), console.cache, session)
        if run is None:
            return PlainTextResponse(f"no run {session} in this store\n", 404)
        # the number read first: the body holds at least the events before it
        seq = await console.opened().next_event_seq(session)
        history = await console.cache.history(console.opened(), session)
        headers = {"X-Run-State": run.state, "X-Run-Seq": str(seq)}
        return HTMLResponse(run_sections(history), headers=headers)

    async def run_events(request: Request) -> Response:
        since = request.query_params.get("since", "0")
        stream = changes(
            console.opened(), request.path_params["session"],
            since=int(since) if since.isdigit() else 0, disconnected=request.is_disconnected,
        )  # fmt: skip
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    async def stop(request: Request) -> Response:
        if (refused := await console.access.allows_post(request)) is not None:
            return PlainTextResponse(refused + "\n", 403)
        session = request.path_params["session"]
        run = await one_run(console.opened(), console.cache, session)
        back = f"/runs/{quote(session)}"
        if run is None or run.pid is None:
            return _back(
                back, error=f"run {session} is not running in a process this server may stop"
            )
        try:
            console.runs.stop(run.pid)
        except ControlError as exc:
            return _back(back, error=str(exc))
        return _back(back, said=f"stopping {session}: `orchmode resume {session}` continues it")

    async def start(request: Request) -> Response:
        if (refused := await console.access.allows_post(request)) is not None:
            return PlainTextResponse(refused + "\n", 403)
        form = await request.form()
        task, directory = str(form.get("task", "")), str(form.get("directory", ""))
        try:
            pid = console.runs.start(task, directory)
        except ControlError as exc:
            return _back("/", error=str(exc))
        return _back("/", said=f"started `orchmode run` in {directory} (process {pid})")

    async def approvals_page(request: Request) -> Response:
        found = await console.opened().approvals(None)
        return await console.page(request, "approvals.html", approvals=found)

    async def answer(request: Request) -> Response:
        if (refused := await console.access.allows_post(request)) is not None:
            return PlainTextResponse(refused + "\n", 403)
        from ..session.stored import approve, deny

        form = await request.form()
        choice, reason = str(form.get("answer", "")), str(form.get("reason", ""))
        number = request.path_params["number"]
        where = {"settings": console.settings, "workdir": console.workdir}
        try:
            if choice == "deny":
                answered = await deny(number, reason, **where)  # type: ignore[arg-type]
            elif choice in ("approve", "always"):
                answered = await approve(number, choice == "always", **where)  # type: ignore[arg-type]
            else:
                return _back("/approvals", error="answer approve, always or deny")
        except OrchmodeError as exc:
            return _back("/approvals", error=str(exc))
        return _back("/approvals", said=f"{answered.status} {answered.id}: {answered.request.what}")

    async def report_css(_: Request) -> Response:
        return Response(STYLE, media_type="text/css")

    routes = [
        Route("/", runs_page),
        Route("/runs/{session:str}", run_page),
        Route("/runs/{session:str}/body", run_body),
        Route("/runs/{session:str}/events", run_events),
        Route("/runs/{session:str}/stop", stop, methods=["POST"]),
        Route("/start", start, methods=["POST"]),
        Route("/approvals", approvals_page),
        Route("/approvals/{number:int}", answer, methods=["POST"]),
        Route("/static/report.css", report_css),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Guard(Starlette(routes=routes, lifespan=lifespan), console.access)


def _back(path: str, **message: str) -> RedirectResponse:
    """After a POST, to the page it came from with what happened (Post/Redirect/Get)."""
    return RedirectResponse(f"{path}?{urlencode(message)}", 303)
