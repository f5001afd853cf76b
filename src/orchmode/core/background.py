"""Tasks started off the critical path, held until they end, then awaited or cancelled together.

asyncio keeps only a weak reference to a task, so a task nobody holds may vanish part-way;
and a task nobody awaits hides its failure. Whoever starts work in the background keeps it
here, and waits for it (or cancels it) before saying it is finished.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class Background:
    """A set of background tasks; each leaves the set when it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run ``work`` in the background and hold it until it ends."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self) -> list[Exception]:
        """Wait until no task is left, including those started meanwhile; their failures."""
        failures: list[Exception] = []
        while self._tasks:
            for outcome in await asyncio.gather(*self._tasks, return_exceptions=True):
                if isinstance(outcome, Exception):
                    failures.append(outcome)
        return failures

    def cancel(self) -> None:
        """Cancel every task still running (they leave the set as they end)."""
        for task in list(self._tasks):
            task.cancel()
