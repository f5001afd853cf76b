"""Sandboxed shells started before the agents that will use them.

An agent's first bash command should find its sandbox already built. So a host keeps a
few shells started ahead — each, under ``worktree`` isolation, in a freshly made copy of
the tree of its own — and hands one to each agent as it starts. A pooled shell is used
by one agent only and closed (its copy discarded) when that agent ends, exactly like a
shell made for the agent: the pool moves the start-up earlier, never shares a shell.

Refills start only once the agent that took a shell has sent its first model request,
through the host's spawn gate (a few at a time), so a wave's requests go out before any
sandbox is built for the agents after it.

How many to keep ready follows the fan-out: enough for the agents that start while one
shell is being made (doubled, for bursts), never more than the fan-out's width. Agents
are paced from the first shell the pool has made on: the first wave starts all at once,
and its own shells, and would otherwise size the pool to the whole width. At the end of
the fan-out the unused ones are closed, which is what the pool costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from ..core.background import Background
from ..shell.bash import BashSession
from ..trees.workspaces import Workspace

#: Shells kept ready before the pool has seen how fast agents start and shells get made.
FIRST_TARGET = 2
#: Weight of the newest observation in the running means of the two paces.
SMOOTHING = 0.2


@dataclass
class Ready:
    """A shell for one agent: started (or being started) in its copy, if it has one."""

    shell: BashSession
    #: Under ``worktree`` isolation: the workspace the shell works in, and the task opening it.
    workspace: Workspace | None = None
    made: asyncio.Task[None] | None = None


@dataclass
class Pace:
    """A running mean (exponentially weighted) of something measured in seconds."""

    mean: float | None = None

    def observe(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.mean = seconds if self.mean is None else self.mean + SMOOTHING * (seconds - self.mean)


@dataclass
class SandboxPool:
    """Shells of a few kinds (one per snapshot of the tree, or one for a shared tree),
    started ahead; see the module's docstring."""

    #: The most shells it keeps ready: the fan-out's width.
    width: int
    #: The host's spawn gate, shared with the shells that agents start themselves.
    gate: asyncio.Semaphore
    #: Closes a shell that no agent took (and discards its copy).
    discard: Callable[[Ready], Awaitable[None]]
    clock: Callable[[], float] = time.monotonic
    #: Seconds between agents starting, and from a refill's start to its shell ready.
    arrivals: Pace = field(default_factory=Pace)
    spawns: Pace = field(default_factory=Pace)
    hits: int = 0
    misses: int = 0
    _ready: dict[Hashable, deque[Ready]] = field(default_factory=dict, repr=False)
    _starting: dict[Hashable, int] = field(default_factory=dict, repr=False)
    _tasks: Background = field(default_factory=Background, repr=False)
    _last_arrival: float | None = field(default=None, repr=False)
    _draining: bool = field(default=False, repr=False)

    def target(self) -> int:
        """How many of a kind to keep ready (counting those being started)."""
        gap, spawn = self.arrivals.mean, self.spawns.mean
        if gap is None or spawn is None:
            wanted = FIRST_TARGET
        else:
            wanted = math.ceil(2 * spawn / max(gap, 1e-3)) + 1
        return max(1, min(wanted, self.width))

    def take(self, kind: Hashable) -> Ready | None:
        """A started shell of ``kind`` for an agent starting now, or None (make one)."""
        now = self.clock()
        # Paced only once a shell has been made: the first wave arrives all at once and
        # starts its own shells, and its burst would size the pool to the fan-out's width.
        if self._last_arrival is not None and self.spawns.mean is not None:
            self.arrivals.observe(now - self._last_arrival)
        self._last_arrival = now
        queue = self._ready.get(kind)
        while queue:
            ready = queue.popleft()
            if ready.shell.running:
                self.hits += 1
                return ready
            self._background(self.discard(ready))  # its shell died while it waited
        self.misses += 1
        return None

    def refill(self, kind: Hashable, make: Callable[[], Ready]) -> None:
        """Start shells of ``kind`` until the pool holds its target of them."""
        if self._draining:
            return
        held = len(self._ready.get(kind, ())) + self._starting.get(kind, 0)
        for _ in range(self.target() - held):
            self._starting[kind] = self._starting.get(kind, 0) + 1
            self._background(self._start(kind, make))

    @property
    def idle(self) -> int:
        """Shells started and waiting for an agent."""
        return sum(len(queue) for queue in self._ready.values())

    async def wait_for_starts(self) -> None:
        """Wait until no shell is being started (or closed) by the pool."""
        await self._tasks.wait()

    async def drain(self) -> None:
        """Close every shell no agent took, once the ones being started are up: the
        fan-out is over, and the next one (another snapshot, perhaps) fills it anew."""
        self._draining = True
        try:
            await self.wait_for_starts()
            leftovers = [ready for queue in self._ready.values() for ready in queue]
            self._ready.clear()
            await asyncio.gather(*(self.discard(r) for r in leftovers), return_exceptions=True)
        finally:
            self._draining = False
            self._last_arrival = None  # the gap until the next fan-out is not a pace

    async def _start(self, kind: Hashable, make: Callable[[], Ready]) -> None:
        try:
            async with self.gate:
                if self._draining:
                    return
                started = self.clock()
                ready = make()
                try:
                    await ready.shell.start()
                except BaseException:
                    await _quietly(self.discard(ready))
                    raise
                if not ready.shell.running or self._draining:
                    await self.discard(ready)  # a copy or sandbox that failed: agents report it
                    return
                self.spawns.observe(self.clock() - started)
                self._ready.setdefault(kind, deque()).append(ready)
        finally:
            self._starting[kind] -= 1

    def _background(self, work: Awaitable[None]) -> None:
        self._tasks.start(work)


async def _quietly(work: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):
        await work
