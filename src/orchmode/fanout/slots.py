"""Slots for agents: at most ``max_concurrent`` run at once, verifiers before queued workers.

A worker hands its slot on to a verifier, never to a worker that queued meanwhile, so a
started chain finishes as soon as it can.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class PrioritySlots:
    """A counting semaphore that wakes lower ``priority`` numbers first, FIFO within one."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @asynccontextmanager
    async def slot(self, priority: int, relay: Relay | None = None) -> AsyncIterator[Tenure]:
        """Hold a slot: the one ``relay`` has waiting, if it has one, else a new one.

        The :class:`Tenure` it gives can park the holder: give the slot away while it waits
        for the user, and take one back (before any queued agent) when it goes on.
        """
        ticket = relay.take() if relay is not None else None
        if ticket is None:
            await self._acquire(priority)
        else:
            try:
                await ticket
            except asyncio.CancelledError:
                if ticket.done() and not ticket.cancelled():
                    self._release()
                raise
        tenure = Tenure(self)
        try:
            yield tenure
        finally:
            if tenure.held:
                self._release()

    def queue(self, priority: int) -> asyncio.Future[None]:
        """Join the queue now and wait later: the future is done once a slot is ours."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._free > 0 and not self._waiters:
            self._free -= 1
            future.set_result(None)
        else:
            heapq.heappush(self._waiters, (priority, next(self._order), future))
        return future

    def drop(self, ticket: asyncio.Future[None]) -> None:
        """Give up a place taken with :meth:`queue`, or the slot it was already given."""
        if ticket.done():
            if not ticket.cancelled():
                self._release()
        else:
            ticket.cancel()  # _release skips it

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # we were handed a slot at the moment we were cancelled
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
                return
        self._free += 1


class Tenure:
    """One holder's slot, which it may give away while it is parked (waiting for the user).

    Parks may overlap (two downloads of one command, each waiting for an answer): the slot
    goes at the first and comes back after the last. Coming back, the holder goes before
    every queued agent: it was running, and finishing started work keeps the makespan short.
    """

    def __init__(self, slots: PrioritySlots) -> None:
        self._slots = slots
        self.held = True
        #: Seconds spent parked so far (not counted as the agent's time).
        self.parked_seconds = 0.0
        self._parks = 0
        self._since = 0.0
        self._back: asyncio.Future[None] | None = None

    @asynccontextmanager
    async def parked(self) -> AsyncIterator[None]:
        """Give the slot away for as long as the body waits; take one back after."""
        self._parks += 1
        if self._parks == 1 and self.held:  # (not held: still coming back from the last one)
            self.held = False
            self._since = time.monotonic()
            self._slots._release()
        try:
            yield
        finally:
            self._parks -= 1
            if self._parks == 0:
                await self._return()

    async def _return(self) -> None:
        """Take a slot back (every parked waiter of this holder waits for the same one)."""
        if self.held:
            return
        if self._back is None:
            self._back = self._slots.queue(RETURNING_PRIORITY)
        back = self._back
        try:
            await asyncio.shield(back)
        except asyncio.CancelledError:
            if self._parks == 0 and not self.held and self._back is back:
                # nobody of ours waits for it any more: give up the place (or the slot)
                self._back = None
                self._slots.drop(back)
            raise
        if self._back is back:
            self._back = None
            self.held = True
            self.parked_seconds += time.monotonic() - self._since


class Relay:
    """Hands a chain's slot from its worker straight to its verifier.

    The worker queues for the verifier's slot just before it gives its own back, so the
    slot it frees goes to a verifier (its own, or one that was waiting longer) and never to
    a worker that queued meanwhile: each chain finishes as soon as it can, which is what
    keeps the fan-out's makespan near its bound. If the verifier does not run after all
    (journal hit, claim held elsewhere, no budget), the place is dropped at once.
    """

    def __init__(self, slots: PrioritySlots) -> None:
        self._slots = slots
        self._ticket: asyncio.Future[None] | None = None

    def queue_next(self, priority: int) -> None:
        if self._ticket is None:
            self._ticket = self._slots.queue(priority)

    def take(self) -> asyncio.Future[None] | None:
        ticket, self._ticket = self._ticket, None
        return ticket

    def drop(self) -> None:
        ticket = self.take()
        if ticket is not None:
            self._slots.drop(ticket)


WORKER_PRIORITY = 1
VERIFIER_PRIORITY = 0
#: An agent coming back from a park goes first: it had started.
RETURNING_PRIORITY = -1
