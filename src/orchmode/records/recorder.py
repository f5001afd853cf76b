"""Run records: every event goes into the store, so a run can be inspected and resumed.

The recorder is an event subscriber. It numbers events in order, encodes each by its
declaration (:mod:`.codec`) and writes them in batches from a background task, so recording
never sits on an agent's critical path; ``flush`` waits for everything written so far.
A batch gathers for :data:`BATCH_WINDOW` before it is written: a wide fan-out emits a few
events per model request, and one transaction for each burst cost more CPU than the
events' encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..core.errors import OrchmodeError
from ..core.events import Event
from ..store import EventRow, Store
from .codec import event_row

log = logging.getLogger("orchmode")

#: Seconds a batch of events gathers before it is written (``flush`` writes at once).
BATCH_WINDOW = 0.025


class EventRecorder:
    def __init__(self, store: Store, session: str, first_seq: int) -> None:
        self.store = store
        self.session = session
        self._next_seq = first_seq
        self._pending: list[EventRow] = []
        self._writer: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    @classmethod
    async def start(cls, store: Store, session: str) -> EventRecorder:
        return cls(store, session, await store.next_event_seq(session))

    def __call__(self, event: Event) -> None:
        self._pending.append(event_row(self._next_seq, event))
        self._next_seq += 1
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), BATCH_WINDOW)
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                await self.store.append_events(self.session, batch)
            except OrchmodeError as exc:  # a record lost is logged, never a failed run
                log.warning("could not record %d events: %s", len(batch), exc)

    async def flush(self) -> None:
        self._hurry.set()
        try:
            while self._writer is not None and not self._writer.done():
                await self._writer
        finally:
            self._hurry.clear()
