"""Parking an agent that waits for the user: its concurrency slot goes to the next agent meanwhile.

The fan-out that gives an agent its slot says how to park it (:data:`PARKING`, a context
variable set around the agent's run, so it reaches whatever the agent starts in this
process); whoever waits for the user on an agent's behalf (an approval) waits inside
:func:`parked`. Outside a fan-out (the main agent, a test) parking does nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Protocol

from ..core.events import ApprovalAnswered, ApprovalRequested, Event

__all__ = ["PARKING", "Parking", "RemoteParking", "current", "parked"]


class Parking(Protocol):
    """How one agent gives its slot away while it waits, and takes one back after."""

    def parked(self) -> AbstractAsyncContextManager[None]: ...


#: The running agent's parking, set by the fan-out around its run.
PARKING: ContextVar[Parking | None] = ContextVar("orchmode_parking", default=None)


def current() -> Parking | None:
    """The parking of the agent this code runs for, if it runs for one in a fan-out."""
    return PARKING.get()


@asynccontextmanager
async def _nowhere() -> AsyncIterator[None]:
    yield


def parked(parking: Parking | None) -> AbstractAsyncContextManager[None]:
    """Wait parked with ``parking`` (the agent's slot given away), or simply wait."""
    return parking.parked() if parking is not None else _nowhere()


class RemoteParking:
    """Parks an agent that runs elsewhere (a Ray node) from the events it sends back.

    The node asks the user through the store and waits there; here its slot is given away
    from its :class:`~orchmode.core.events.ApprovalRequested` to its answer. The node goes
    on as soon as it has the answer, while the slot comes back here when one is free: for a
    moment the cluster may run one agent more than ``max_concurrent``.
    """

    def __init__(self, parking: Parking | None) -> None:
        self._parking = parking
        self._asked: set[int] = set()
        self._answered = asyncio.Event()
        self._away: asyncio.Task[None] | None = None

    def follow(self, event: Event) -> None:
        """Park at a question, come back at its answer (the last one's, if several)."""
        if self._parking is None:
            return
        if isinstance(event, ApprovalRequested):
            self._asked.add(event.id)
            if self._away is None or self._away.done():
                self._answered = asyncio.Event()
                self._away = asyncio.create_task(self._park(self._answered))
        elif isinstance(event, ApprovalAnswered) and event.id in self._asked:
            self._asked.discard(event.id)
            if not self._asked:
                self._answered.set()

    async def _park(self, answered: asyncio.Event) -> None:
        assert self._parking is not None
        async with self._parking.parked():
            await answered.wait()

    async def end(self) -> None:
        """The agent is done (or gone): stop waiting for a slot it no longer needs."""
        away = self._away
        if away is not None and not away.done():
            away.cancel()
            await asyncio.gather(away, return_exceptions=True)
