"""The live stream of a run: server-sent events, one each time the store holds new events
of the session (whichever process or Ray node wrote them) or its process comes or goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

#: How often the store is asked: the session's last event number and its claim, two
#: small queries.
POLL_SECONDS = 0.2
#: A comment line this often keeps proxies and the browser from closing a quiet stream.
KEEPALIVE_SECONDS = 15.0

#: What a poll reads: the next event number and whether a live process drives the run.
Look = Callable[[], Awaitable[tuple[int, bool]]]


async def changes(
    look: Look,
    *,
    since: int = 0,
    disconnected: Callable[[], Awaitable[bool]] | None = None,
    poll: float = POLL_SECONDS,
) -> AsyncIterator[str]:
    """SSE messages: ``event: change`` with the next event number whenever it moves past
    ``since``, or the run's process starts or ends (its last events come before it lets go
    of the session, so the page would otherwise still say it runs)."""
    seen, driven = since, None
    quiet = 0.0
    while disconnected is None or not await disconnected():
        next_seq, alive = await look()
        if next_seq != seen or (driven is not None and alive != driven):
            seen, driven, quiet = next_seq, alive, 0.0
            yield f"event: change\ndata: {next_seq}\n\n"
        elif quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield ": still here\n\n"
        driven = alive
        await asyncio.sleep(poll)
        quiet += poll
