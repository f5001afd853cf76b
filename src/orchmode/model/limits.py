"""Adaptive concurrency: how many model requests a session keeps in flight, learnt from the API.

One limit is shared by every agent of a session. It starts at the configured ceiling and
never passes it. When the API answers 429 or 529 it is cut to 90 % (once per round of
requests: only a request that started after the last cut can cut again, so one burst of
refusals is one signal), and never left above the number of other requests that were in
flight when one was refused. A refusal at as many in flight as the last one (a probe past
the wall found before) is not cut: the limit just drops below that wall again. Successes
grow it quickly back to just under the level that was refused, then slowly (about one
request per round) to probe for more. The refused request itself waits its
``retry-after`` and goes back in the queue, not started.
"""

from __future__ import annotations

import asyncio
from collections import deque

#: The factor a refusal cuts the limit by, and the fraction of the refused level that the
#: limit climbs back to quickly (half a request per success) before probing slowly (about
#: one more request per round). Tuned on bench/ratelimit.py.
CUT = 0.9
KNEE = 0.95


class AdaptiveLimit:
    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self.peak = 0
        self._last_cut = float("-inf")
        self._overload_level = float(ceiling)
        #: How many were in flight, the refused one among them, at the latest refusal.
        self._wall = ceiling + 1
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self) -> float:
        """Wait for room; returns the time the request may start."""
        loop = asyncio.get_running_loop()
        while True:
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
        # Quickly back to just under the level that was refused last, then probe slowly.
        step = 0.5 if self.limit < KNEE * self._overload_level else 1 / self.limit
        self.limit = min(float(self.ceiling), self.limit + step)
        self._wake()

    def overloaded(self, started: float) -> None:
        """A request that started at ``started`` was refused for load (before its release).

        Besides the once-a-round cut, the API refused it while ``in_flight - 1`` others were
        out, so more than that is too many for now: the limit drops there at once. From far
        above (a ceiling of 100 against a server that takes 20) that finds the level within
        one burst of refusals instead of a dozen rounds of cuts.
        """
        if started > self._last_cut:
            if self.in_flight >= self._wall:
                # A probe past the wall found before, refused there again: the wall has not
                # moved in, so back to just below it, without the cut (which would leave a
                # tenth of the slots idle for the rounds it takes to climb back).
                self._overload_level = float(self.in_flight)
            else:
                self._overload_level = self.limit
                self.limit = max(1.0, self.limit * CUT)
            self._last_cut = asyncio.get_running_loop().time()
        self._wall = self.in_flight
        # The level to climb back to quickly stays the round's: after a storm of refusals
        # that left next to nothing in flight (a per-minute quota running out), the limit
        # recovers in a few dozen successes rather than probing up one by one.
        self.limit = min(self.limit, float(max(1, self.in_flight - 1)))

    def _wake(self) -> None:
        room = self.allowed - self.in_flight
        while room > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1
