"""Stopping a turn whose store has failed, rather than a run that goes on losing its records."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.errors import StoreError

if TYPE_CHECKING:
    from ..store.base import Failure
    from .agent import Conversation

log = logging.getLogger("orchmode")
T = TypeVar("T")


async def unless_the_store_fails(conversation: Conversation, turn: Coroutine[Any, Any, T]) -> T:
    """Run ``turn``, stopped if the store fails in a way no run can go on through.

    The disk full (under the journal or the result files) or the PostgreSQL server lost
    past its outage limit: every later record would be lost too, so the turn is cancelled
    as Ctrl-C cancels it (what is recorded stays recorded) and the failure is raised, for
    one line and a non-zero exit; `orchmode resume` continues once the cause is gone.
    """
    failure = conversation.store.failure
    results = conversation.results
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(turn)

    def stop(_: StoreError) -> None:
        loop.call_soon_threadsafe(task.cancel)

    def full(path: Path) -> None:
        failure.trip(
            StoreError(
                f"could not write {path}: the disk is full — free space there, then "
                "`orchmode resume` continues the run from its last recorded step"
            )
        )

    failure.listen(stop)
    results.on_full = full
    if not any(isinstance(f, _Repeats) and f.failure is failure for f in log.filters):
        log.addFilter(_Repeats(failure))
    try:
        done = await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if failure.error is None or (current is not None and current.cancelling()):
            raise  # Ctrl-C, or the command torn down
        raise StoreError(str(failure.error)) from None
    finally:
        failure.forget(stop)
        results.on_full = None
    if failure.error is not None:  # it failed as the turn ended: its end is not recorded
        raise StoreError(str(failure.error))
    return done


class _Repeats(logging.Filter):
    """Leaves out the warnings that only repeat the store's failure: writes refused after
    it, while the run is being stopped (the failure itself is the command's one line)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__()
        self.failure = failure

    def filter(self, record: logging.LogRecord) -> bool:
        error = self.failure.error
        if error is None or log.level <= logging.DEBUG:
            return True
        return str(error) not in record.getMessage()
