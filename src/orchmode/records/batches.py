"""A session's Message Batches as its events tell them: sent, waited on, ended, what they saved.

The live view, ``--plain``, ``orchmode show`` and the report all read batches through
:class:`BatchLog`, so each tells the same story of the same events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.events import (
    BatchEnded,
    BatchSent,
    BatchWaiting,
    Event,
    ModelRequestDone,
    ModelRequestFailed,
)
from ..core.pricing import BATCH_SHARE
from .wording import seconds


def saved_by_batching(paid: float) -> float:
    """What batched requests that cost ``paid`` would have cost more interactively."""
    return paid / BATCH_SHARE - paid


@dataclass
class BatchRecord:
    """One Message Batch: when it was sent (or first waited on), its requests, its end."""

    batch_id: str
    #: When it was first heard of: sent, or (a resumed run's) first waited on.
    since: float
    #: Requests it holds; 0 for a batch sent by an earlier run and only waited on here.
    requests: int = 0
    ended: BatchEnded | None = None
    ended_at: float | None = None
    #: The agents that have waited on it, in the order they began to.
    agents: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        """``in progress``, or ``ended`` with its results by outcome."""
        if self.ended is None:
            return "in progress"
        counts = [
            f"{count} {outcome}"
            for outcome, count in (
                ("succeeded", self.ended.succeeded),
                ("errored", self.ended.errored),
                ("expired", self.ended.expired),
                ("canceled", self.ended.canceled),
            )
            if count
        ]
        return "ended: " + (", ".join(counts) or "no results")

    def age(self, now: float) -> float:
        """Seconds since it was sent, up to its end if it has ended."""
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - self.since)


@dataclass
class BatchLog:
    """The batches of a session and the agents waiting on one, followed event by event."""

    batches: dict[str, BatchRecord] = field(default_factory=dict)
    #: Each agent waiting on a batch now, and which.
    waiting: dict[str, str] = field(default_factory=dict)

    def follow(self, event: Event, at: float) -> bool:
        """Fold ``event`` (heard at ``at``) in; whether it was a batch's own event."""
        match event:
            case BatchSent(batch_id=batch_id, requests=requests):
                self._batch(batch_id, at).requests = requests
            case BatchWaiting(agent=agent, batch_id=batch_id):
                batch = self._batch(batch_id, at)
                if agent not in batch.agents:
                    batch.agents.append(agent)
                self.waiting[agent] = batch_id
            case BatchEnded(batch_id=batch_id):
                batch = self._batch(batch_id, at)
                batch.ended, batch.ended_at = event, at
                batch.since = min(batch.since, at - event.duration)
                self.waiting = {a: b for a, b in self.waiting.items() if b != batch_id}
            case ModelRequestDone(agent=agent) | ModelRequestFailed(agent=agent):
                self.waiting.pop(agent, None)  # answered (or asked at once after all, or failed)
                return False
            case _:
                return False
        return True

    def _batch(self, batch_id: str, at: float) -> BatchRecord:
        batch = self.batches.get(batch_id)
        if batch is None:
            batch = self.batches[batch_id] = BatchRecord(batch_id, at)
        return batch

    def waiting_text(self, now: float) -> str:
        """``3 agents wait on 2 batches (12 requests), the oldest sent 4 min ago``; "" if none."""
        if not self.waiting:
            return ""
        batches = [self.batches[b] for b in dict.fromkeys(self.waiting.values())]
        requests = sum(b.requests for b in batches)
        oldest = max(b.age(now) for b in batches)
        agents = len(self.waiting)
        return (
            f"{agents} agent{'s' if agents != 1 else ''} wait on {len(batches)} "
            f"batch{'es' if len(batches) != 1 else ''} ({requests} "
            f"request{'s' if requests != 1 else ''}), the oldest sent {seconds(oldest)} ago"
        )

    def __bool__(self) -> bool:
        return bool(self.batches)
