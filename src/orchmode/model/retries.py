"""When a failed request is sent again, and after how long.

Waits grow exponentially with full jitter, so agents cut off together do not come back
together. A rate-limited request is waited out for as long as ``overload_patience`` allows;
a 5xx, a timeout or a lost connection is tried again up to ``max_retries`` times, and a
stream that broke off part-way (safe: a request has no effect until its response is
complete) up to ``stream_retries`` times.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from ..core.errors import Overloaded, StreamInterrupted, TransientFailure
from ..core.settings import Settings

log = logging.getLogger("orchmode")

#: Seconds before the first retry of a broken stream, and the most any wait grows to.
RETRY_BASE = 0.25
RETRY_CAP = 8.0


def backoff(attempt: int) -> float:
    """Full-jitter exponential backoff: a random wait up to base * 2**(attempt - 1)."""
    return random.uniform(0, min(RETRY_CAP, RETRY_BASE * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Retry:
    """One more try: why (as the retry event names it), after how long, and the error's words."""

    kind: str
    wait: float
    reason: str


@dataclass
class Retries:
    """One request's tries so far, counted by what went wrong."""

    settings: Settings
    #: The event loop's time after which an overloaded API is no longer waited for.
    give_up_at: float
    overloads: int = 0
    failures: int = 0
    breaks: int = 0
    #: Tries after the first, so far.
    attempts: int = 0

    def after_overload(self, exc: Overloaded, now: float) -> Retry:
        """The wait the API asked for (else a backoff); raise once patience is spent.

        The refused request waits out of the limit (it is not started); the others go on,
        fewer at once."""
        self.overloads += 1
        if now > self.give_up_at:
            raise Overloaded(
                f"{exc} — still refused after {self.settings.overload_patience:g} s of retrying"
            ) from exc
        wait = backoff(self.overloads) if exc.retry_after is None else exc.retry_after
        return Retry("overloaded", wait, str(exc))

    def after_failure(self, exc: TransientFailure | StreamInterrupted) -> Retry:
        """A backoff before the next try; raise ``exc`` once its kind has no tries left."""
        if isinstance(exc, StreamInterrupted):
            self.breaks += 1
            if self.breaks > self.settings.stream_retries:
                raise exc
            log.info("retrying a broken response stream (%s)", exc)
            return Retry("interrupted", backoff(self.breaks), str(exc))
        self.failures += 1
        if self.failures > self.settings.max_retries:
            raise exc
        return Retry("failed", backoff(self.failures), str(exc))
