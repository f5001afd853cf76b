"""A session's tracer: started when traces are asked for, and flushed when the session ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ..core.events import EventBus
from ..core.settings import Settings
from .traces import Traces
from .tracing import start_tracing, tracing_wanted


def session_tracing(
    settings: Settings, secrets: Iterable[str], bus: EventBus, session_id: str
) -> Traces | None:
    """The session's tracer, subscribed to its events and told every secret it must not
    export; None when no OTLP endpoint is set."""
    if not tracing_wanted(settings):
        return None
    traces = start_tracing(settings, secrets)
    traces.session_id = session_id
    bus.subscribe(traces)
    return traces


async def close_tracing(traces: Traces) -> None:
    """Send every span still queued, also when the session is being cancelled."""
    await asyncio.shield(asyncio.to_thread(traces.close))
