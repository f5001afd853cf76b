"""Claims: which process runs a piece of work now, renewed while it runs, lapsing if it dies.

A claim is a row in the store with a holder and a lease, so it works the same for the
agents of one process, of several, and of a cluster's nodes sharing a PostgreSQL store.
The fan-out claims each subagent's journal key, the session start-up claims the session,
and whoever runs the work renews the claim; a holder that dies stops renewing and its
claim lapses for someone else to take.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..core.errors import OrchmodeError
from ..core.events import Role
from ..core.results import AgentResult
from .base import Store

log = logging.getLogger("orchmode")

#: How often one waiting on another's claim looks for the result: first, at most.
POLL_FIRST = 0.05
POLL_MAX = 1.0


def holder_name(*, renewed_here: bool = True) -> str:
    """A claim holder's name: this host and process, and a part of its own so that two
    claims of one process are told apart.

    ``renewed_here=False`` for a claim that another process renews (a Ray actor on some
    node): its name then carries no process id, so it is never taken for a dead one's.
    """
    pid = str(os.getpid()) if renewed_here else "remote"
    return f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:12]}"


def holder_is_dead(holder: str) -> bool:
    """True only for a holder on this host whose process is gone (killed, crashed).

    A holder elsewhere, or one whose name does not say, is taken to be alive: its claim
    is left to lapse. A process id reused since is taken to be alive too — safe, just slow.
    """
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process: alive
        return False
    return False


async def claim_or_take_over(store: Store, key: str, holder: str, lease: float) -> bool:
    """Claim ``key``; if a process on this host that died holds it, take it over at once
    rather than wait out its lease (after ``kill -9`` the resume starts straight away)."""
    if await store.claim(key, holder, lease):
        return True
    current = await store.holder(key)
    if current is None or not holder_is_dead(current):
        return False
    log.info("taking over a claim from %s, a process that is gone", current)
    await store.release(key, current)
    return await store.claim(key, holder, lease)


#: The claims held in this process, by key and holder: a claim handed to an executor that
#: runs here is the very object its taker holds, so between them it is let go once.
_HELD: weakref.WeakValueDictionary[tuple[str, str], Claim] = weakref.WeakValueDictionary()


@dataclass(eq=False)
class Claim:
    """A claim held on one key: renewed in the background while held, let go exactly once.

    Taken by :meth:`within` or :meth:`or_result`. Whoever runs the work renews it
    (:meth:`keep`); a taker that hands the work to an executor stops renewing
    (:meth:`hand_over`) and the executor, on whatever node, picks it up by its key and
    holder (:meth:`held`). It ends once, by :meth:`release` or :meth:`record`, however
    often either is called and even if the caller is cancelled on the way.
    """

    store: Store
    key: str
    holder: str
    lease: float
    _renewing: asyncio.Task[None] | None = field(default=None, repr=False)
    _ending: asyncio.Future[None] | None = field(default=None, repr=False)

    @classmethod
    def held(cls, store: Store, key: str, holder: str, lease: float) -> Claim:
        """The claim ``holder`` already holds on ``key``: the taker's own object when it was
        taken in this process, else one for this process to renew (a node's actor)."""
        claim = _HELD.get((key, holder))
        if claim is None:
            claim = cls(store, key, holder, lease)
            _HELD[(key, holder)] = claim
        return claim

    @classmethod
    async def within(
        cls, store: Store, key: str, holder: str, lease: float, wait: float
    ) -> Claim | None:
        """Claim ``key``, trying again for up to ``wait`` seconds; None if it stayed taken."""
        deadline = time.monotonic() + wait
        while not await claim_or_take_over(store, key, holder, lease):
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(min(1.0, lease / 10))
        return cls.held(store, key, holder, lease)

    @classmethod
    async def or_result(
        cls,
        store: Store,
        key: str,
        holder: str,
        lease: float,
        *,
        look_again: bool = True,
        on_wait: Callable[[], None] | None = None,
    ) -> Claim | AgentResult:
        """Claim ``key``, or wait until its holder records a result and return that.

        Polls the store: that works across processes and machines alike. A holder that
        died stops renewing, its lease lapses, and the claim comes to us. ``on_wait`` is
        called before each wait (to give back what others can use meanwhile).
        ``look_again``: once claimed, look for a result once more, as its last holder may
        have recorded one and let go between the caller's first look and this claim.
        """
        pause = POLL_FIRST
        while not await claim_or_take_over(store, key, holder, lease):
            if on_wait is not None:
                on_wait()
            await asyncio.sleep(pause)
            pause = min(pause * 2, POLL_MAX)
            recorded = await store.lookup(key)
            if recorded is not None:
                return recorded
        claim = cls.held(store, key, holder, lease)
        try:
            recorded = await store.lookup(key) if look_again else None
        except BaseException:
            await claim.release()
            raise
        if recorded is None:
            return claim
        await claim.release()
        return recorded

    def keep(self) -> None:
        """Renew it a third of the lease at a time from now on, until it ends or is handed over."""
        if self._renewing is None and self._ending is None:
            self._renewing = asyncio.create_task(self._renew())

    def hand_over(self) -> None:
        """Stop renewing it here: the executor it was handed to renews it from now on."""
        if self._renewing is not None:
            self._renewing.cancel()
            self._renewing = None

    async def release(self) -> None:
        """Let it go, so the next run may take it at once (a no-op once it has ended)."""
        await self._end(self._let_go)

    async def record(self, role: Role, prompt: str, result: AgentResult) -> None:
        """Keep ``result`` and let the claim go in the same write: one waiting for the
        result never finds neither. Once the claim has ended, the result is kept alone."""
        if self._ending is not None:
            await self.store.record(self.key, role, prompt, result)
            return

        async def write() -> None:
            await self.store.record(self.key, role, prompt, result, holder=self.holder)

        await self._end(write)

    async def around(
        self,
        work: Awaitable[AgentResult],
        role: Role,
        prompt: str,
        *,
        later: Callable[[Coroutine[Any, Any, None]], None],
    ) -> AgentResult:
        """``work``'s result, with the claim renewed meanwhile. It ends as the work does:
        with the result recorded, or let go if the work was cancelled or broken (the next
        run may take it at once); ``later`` finishes that write off the caller's path."""
        self.keep()
        try:
            result = await work
        except BaseException:
            later(self.release())
            raise
        later(self.record(role, prompt, result))
        return result

    async def __aenter__(self) -> Claim:
        self.keep()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.release()

    async def _end(self, how: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._ending is None:
            self.hand_over()
            self._ending = asyncio.ensure_future(how())
            _HELD.pop((self.key, self.holder), None)
        # shielded: a caller cancelled meanwhile does not stop the write half-way
        await asyncio.shield(self._ending)

    async def _let_go(self) -> None:
        try:
            await self.store.release(self.key, self.holder)
        except OrchmodeError as exc:
            log.warning("could not let a claim go (it lapses instead): %s", exc)

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                if not await self.store.renew(self.key, self.holder, self.lease):
                    log.warning("lost the claim on a running subtask; it may run twice")
                    return
            except OrchmodeError as exc:
                log.warning("could not renew a claim: %s", exc)
