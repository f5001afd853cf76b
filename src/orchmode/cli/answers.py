"""Answering an approval typed as a line: ``/approve N [always]`` and ``/deny N [why]``.

Chat takes them between and during turns; ``orchmode run`` takes them on its terminal while
the run goes on (the live view shows the question and says how to answer it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from ..core.errors import AuthError, OrchmodeError, StoreError

if TYPE_CHECKING:
    from ..session.api import Session

__all__ = ["answer", "answering_typed_lines", "doing", "is_answer"]


def doing(kind: str) -> str:
    """What an approval of ``kind`` lets the agent do, as a verb."""
    return {"command": "run", "domain": "connect to", "mcp": "call"}.get(kind, "do")


def is_answer(line: str) -> bool:
    """Whether ``line`` is ``/approve …`` or ``/deny …``."""
    return line.split(" ", 1)[0].lower() in ("/approve", "/deny")


async def answer(session: Session, line: str) -> str:
    """Answer the approval ``line`` names; what to tell the user, in one line."""
    name, _, rest = line.strip().partition(" ")
    approved = name.lower() == "/approve"
    number, _, more = rest.strip().partition(" ")
    more = more.strip()
    usage = "/approve N [always]" if approved else "/deny N [why]"
    if not number.isdigit() or (approved and more.lower() not in ("", "always")):
        return f"{usage}: N is the approval's number, as /approvals lists it"
    try:
        if approved:
            answered = await session.approve(int(number), more.lower() == "always")
        else:
            answered = await session.deny(int(number), more)
    except (AuthError, StoreError):
        raise
    except OrchmodeError as exc:
        return str(exc)
    verb = "approved" if approved else "denied"
    remembered = (
        f"; {answered.request.rule} is allowed in {answered.request.workdir} from now on"
        if answered.always
        else ""
    )
    return f"{verb} {answered.id}{remembered}"


@contextlib.asynccontextmanager
async def answering_typed_lines(
    session: Session,
    read: Callable[[], Awaitable[str | None]],
    say: Callable[[str], None],
) -> AsyncIterator[None]:
    """While the body runs, answer each ``/approve``/``/deny`` line ``read`` gives (from the
    terminal); any other line is said to be not taken now."""

    async def pump() -> None:
        while (line := await read()) is not None:
            if not line.strip():
                continue
            if is_answer(line):
                say(f"[approvals] {await answer(session, line)}")
            else:
                say(
                    "[approvals] while a run goes on only /approve N [always] and "
                    "/deny N [why] are taken"
                )

    task = asyncio.create_task(pump())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def terminal_input() -> bool:
    """Whether a person at a terminal could type answers (stdin is one)."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False
