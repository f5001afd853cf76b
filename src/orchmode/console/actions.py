"""The console's POSTs: answer an approval, start a run, stop one. Each is checked for
its CSRF token and origin first, and goes back to a page saying what happened."""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ..core.errors import OrchmodeError
from .control import ControlError
from .runs import one_run
from .state import back, console_of


async def _refusal(request: Request) -> Response | None:
    refused = await console_of(request).access.allows_post(request)
    return None if refused is None else PlainTextResponse(refused + "\n", 403)


async def answer(request: Request) -> Response:
    """approve, always or deny: the same store records ``orchmode approve`` answers."""
    if (refused := await _refusal(request)) is not None:
        return refused
    from ..session.stored import approve, deny

    console, form = console_of(request), await request.form()
    choice, reason = str(form.get("answer", "")), str(form.get("reason", ""))
    number: int = request.path_params["number"]
    try:
        if choice == "deny":
            answered = await deny(
                number, reason, settings=console.settings, workdir=console.workdir
            )
        elif choice in ("approve", "always"):
            answered = await approve(
                number, choice == "always", settings=console.settings, workdir=console.workdir
            )
        else:
            return back("/approvals", error="answer approve, always or deny")
    except OrchmodeError as exc:
        return back("/approvals", error=str(exc))
    return back("/approvals", said=f"{answered.status} {answered.id}: {answered.request.what}")


async def start(request: Request) -> Response:
    if (refused := await _refusal(request)) is not None:
        return refused
    form = await request.form()
    task, directory = str(form.get("task", "")), str(form.get("directory", ""))
    try:
        pid = console_of(request).runs.start(task, directory)
    except ControlError as exc:
        return back("/", error=str(exc))
    return back("/", said=f"started `orchmode run` in {directory} (process {pid})")


async def stop(request: Request) -> Response:
    """SIGINT to the run's process, found again from the store (never from the form)."""
    if (refused := await _refusal(request)) is not None:
        return refused
    console, session = console_of(request), request.path_params["session"]
    run = await one_run(console.opened(), console.cache, session)
    page = f"/runs/{quote(session)}"
    if run is None or run.pid is None:
        return back(page, error=f"run {session} is not running in a process this server may stop")
    try:
        console.runs.stop(run.pid)
    except ControlError as exc:
        return back(page, error=str(exc))
    return back(page, said=f"stopping {session}: `orchmode resume {session}` continues it")
