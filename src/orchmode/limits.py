"""Adaptive concurrency: how many model requests a session keeps in flight, learnt from the API.

One limit is shared by every agent of a session. It starts at the configured ceiling,
halves when the API answers 429 or 529 (once per round of requests: only a request that
started after the last cut can cut again, so one burst of refusals is one signal), grows
by about one for every round that succeeds, and never passes the ceiling. A
``retry-after`` pauses new requests until it has passed.
"""

from __future__ import annotations

import asyncio
from collections import deque


class AdaptiveLimit:
    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self.peak = 0
        self._not_before = 0.0
        self._last_cut = float("-inf")
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self) -> float:
        """Wait for room (and for any retry-after); returns when the request may start."""
        loop = asyncio.get_running_loop()
        while True:
            pause = self._not_before - loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
                continue
            if self.in_flight < self.allowed and not self._waiters:
                break
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # pass on the turn we were given
                raise
            if self.in_flight < self.allowed:
                break
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return loop.time()

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def succeeded(self) -> None:
        self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
        self._wake()

    def overloaded(self, started: float, retry_after: float | None) -> None:
        """A request that started at ``started`` was refused for load."""
        now = asyncio.get_running_loop().time()
        if started > self._last_cut:
            self.limit = max(1.0, self.limit / 2)
            self._last_cut = now
        if retry_after:
            self._not_before = max(self._not_before, now + retry_after)

    def _wake(self) -> None:
        room = self.allowed - self.in_flight
        while room > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1
