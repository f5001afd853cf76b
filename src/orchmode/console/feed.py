"""The live stream of a run: server-sent events, one each time the store holds new events
of the session, whichever process (or Ray node) wrote them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from ..store import Store

#: How often the store is asked for the session's last event number: one cheap query.
POLL_SECONDS = 0.2
#: A comment line this often keeps proxies and the browser from closing a quiet stream.
KEEPALIVE_SECONDS = 15.0


async def changes(
    store: Store,
    session: str,
    *,
    since: int = 0,
    disconnected: Callable[[], object] | None = None,
    poll: float = POLL_SECONDS,
) -> AsyncIterator[str]:
    """SSE messages for ``session``: ``event: change`` with the next event number whenever
    it moves past ``since`` (0: the first poll tells the number as it is)."""
    seen = since
    quiet = 0.0
    while True:
        if disconnected is not None and await _awaited(disconnected()):
            return
        next_seq = await store.next_event_seq(session)
        if next_seq != seen:
            seen = next_seq
            quiet = 0.0
            yield f"event: change\ndata: {next_seq}\n\n"
        elif quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield ": still here\n\n"
        await asyncio.sleep(poll)
        quiet += poll


async def _awaited(value: object) -> bool:
    if asyncio.iscoroutine(value):
        value = await value
    return bool(value)
