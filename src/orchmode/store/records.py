"""Run records: every event goes into the store, so a run can be inspected and resumed.

The recorder is an event subscriber. It numbers events in order and writes them in
batches from a background task, so recording never sits on an agent's critical path;
``flush`` waits for everything written so far.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time

from ..core.errors import OrchmodeError
from ..core.events import Event
from . import EventRow, Store

log = logging.getLogger("orchmode")


def event_row(seq: int, event: Event) -> EventRow:
    data = json.dumps(_plain(event), ensure_ascii=False, default=str)
    return EventRow(seq, time.time(), type(event).__name__, data)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain(value: object) -> object:
    """``dataclasses.asdict`` without its deep copies of every value (the same JSON, at a
    third of the cost: a fan-out records a dozen events per subtask)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


class EventRecorder:
    def __init__(self, store: Store, session: str, first_seq: int) -> None:
        self.store = store
        self.session = session
        self._next_seq = first_seq
        self._pending: list[EventRow] = []
        self._writer: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, store: Store, session: str) -> EventRecorder:
        return cls(store, session, await store.next_event_seq(session))

    def __call__(self, event: Event) -> None:
        self._pending.append(event_row(self._next_seq, event))
        self._next_seq += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self.store.append_events(self.session, batch)
            except OrchmodeError as exc:  # a record lost is logged, never a failed run
                log.warning("could not record %d events: %s", len(batch), exc)

    async def flush(self) -> None:
        while self._writer is not None and not self._writer.done():
            await self._writer
