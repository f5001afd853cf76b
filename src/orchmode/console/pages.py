"""The console's pages: the runs, a run (its page, its body alone, its live stream), and
the approvals waiting."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse

from ..records.history import SessionHistory
from ..views.pages import agent_transcript, run_sections
from .feed import changes
from .runs import RunSummary, driver, list_runs, one_run
from .state import console_of


async def runs_page(request: Request) -> Response:
    console = console_of(request)
    query = request.query_params.get("q", "")
    runs = await list_runs(console.opened(), console.cache, query)
    console.runs.reap()
    return await console.page(
        request, "runs.html", runs=runs, query=query, directory=str(console.workdir)
    )


async def run_page(request: Request) -> Response:
    console = console_of(request)
    shown = await _run_shown(request)
    if isinstance(shown, Response):
        return shown
    session, run, seq, body = shown
    return await console.page(
        request, "run.html", session=session, state=run.state, pid=run.pid, body=body, seq=seq
    )


async def run_body(request: Request) -> Response:
    """The run's sections alone, which its page swaps in as the run goes."""
    shown = await _run_shown(request)
    if isinstance(shown, Response):
        return shown
    _, run, seq, body = shown
    return HTMLResponse(body, headers={"X-Run-State": run.state, "X-Run-Seq": str(seq)})


async def _run_shown(request: Request) -> tuple[str, RunSummary, int, str] | Response:
    """The run a request names, the number of its next event and its sections (the body
    holds at least the events before that number, read first); a 404 when there is none."""
    console, session = console_of(request), request.path_params["session"]
    run = await one_run(console.opened(), console.cache, session)
    if run is None:
        return _no_run(session)
    seq = await console.opened().next_event_seq(session)
    history = await console.cache.history(console.opened(), session)
    return session, run, seq, await _sections(history)


async def run_events(request: Request) -> Response:
    store, session = console_of(request).opened(), request.path_params["session"]
    since = request.query_params.get("since", "0")

    async def look() -> tuple[int, bool]:
        return await store.next_event_seq(session), await driver(store, session) is not None

    stream = changes(
        look, since=int(since) if since.isdigit() else 0, disconnected=request.is_disconnected
    )
    return StreamingResponse(
        stream, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
    )


async def agent_page(request: Request) -> Response:
    """One agent's transcript, which a run's page loads when the agent is opened."""
    console, session = console_of(request), request.path_params["session"]
    agent = request.path_params["agent"]
    if await one_run(console.opened(), console.cache, session) is None:
        return _no_run(session)
    history = await console.cache.history(console.opened(), session)
    shown = await run_in_threadpool(agent_transcript, history, agent)
    if shown is None:
        return PlainTextResponse(f"no agent {agent} in run {session}\n", 404)
    return HTMLResponse(shown)


async def approvals_page(request: Request) -> Response:
    console = console_of(request)
    found = await console.opened().approvals(None)
    return await console.page(request, "approvals.html", approvals=found)


async def _sections(history: SessionHistory) -> str:
    """A run's sections, rendered off the event loop: a thousand agents take a while, and
    the live streams of every open page poll meanwhile. Each agent's transcript is left
    out, to be loaded when it is opened: the page stays small however long the run."""
    return await run_in_threadpool(lambda: run_sections(history, transcripts=False))


def _no_run(session: str) -> Response:
    return PlainTextResponse(f"no run {session} in this store\n", 404)
