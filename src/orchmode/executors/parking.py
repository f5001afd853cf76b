"""Parking an agent that waits for the user: its concurrency slot goes to the next agent meanwhile.

The fan-out that gives an agent its slot says how to park it (:data:`PARKING`, a context
variable set around the agent's run, so it reaches whatever the agent starts in this
process); whoever waits for the user on an agent's behalf (an approval) waits inside
:func:`parked`. Outside a fan-out (the main agent, a test) parking does nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from typing import Protocol

__all__ = ["PARKING", "Parking", "current", "parked"]


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
