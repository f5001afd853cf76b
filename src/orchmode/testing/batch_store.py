"""The scripted server's message batches: their state, their clock, and what was submitted.

A batch waits ``delay`` seconds (its processing time, on the server's event loop), then
hands its requests to an answering function; it ends once every request has a result, or
when it is canceled or expires first, leaving the rest ``canceled`` or ``expired``. The
store also counts every ``custom_id`` ever submitted, so a test can prove a client never
paid for the same request twice.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from ..core.events import TokenUsage
from ..core.wire import ApiObject, JsonRecord
from .cache import CacheUsage, EditedPrompt
from .replies import Fault, Reply, _new_id

__all__ = ["Batch", "BatchItem", "BatchSettings", "BatchStore"]

BatchStatus = Literal["in_progress", "canceling", "ended"]
_RESULT_KINDS = ("succeeded", "errored", "canceled", "expired")


@dataclass(frozen=True)
class BatchSettings:
    """How the scripted batch endpoints behave; the limits default to the real API's.

    ``delay`` is each batch's processing time before its requests are answered;
    ``cancel_delay`` how long a canceled batch stays ``canceling``; ``expiry`` how long
    after creation a batch still unanswered ends with its requests ``expired`` (the API's
    24 hours). The limits are here so a test can reach them with a small batch.
    ``create_faults`` answer the first creates, one each, in order: an error status (the
    batch is not made), or ``drop`` — the batch is made, then the connection is cut before
    the answer, so the client cannot know it was.
    """

    delay: float = 0.0
    create_faults: tuple[Fault, ...] = ()
    cancel_delay: float = 0.0
    expiry: float = 24 * 3600.0
    max_requests: int = 100_000
    max_body_bytes: int = 256 * 1024 * 1024


@dataclass
class BatchItem:
    """One request of a batch: its params as validated, and its result once it has one."""

    custom_id: str
    #: The params as validated, after any context edit: what the model is shown; None when
    #: they are not valid (the API checks params only once the batch runs).
    prompt: EditedPrompt | None
    #: Why the params are not valid: what ``POST /v1/messages`` would answer for them.
    refused: str = ""
    #: The API's result object (``{"type": "succeeded", "message": ...}`` and so on).
    result: ApiObject | None = None
    #: What the scripted model said and how its input was billed, for a succeeded result.
    reply: Reply | None = None
    usage: CacheUsage | None = None

    @property
    def billed(self) -> TokenUsage | None:
        """What a succeeded result was billed at the interactive price (the batch price is
        the client's to apply); None for any other result."""
        if self.usage is None or self.reply is None or self.reply.output_tokens is None:
            return None
        usage = self.usage
        return TokenUsage(
            usage.input_tokens,
            self.reply.output_tokens,
            usage.cache_read_input_tokens,
            usage.cache_creation_input_tokens,
        )


def _rfc3339(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass
class Batch:
    """A message batch as the server keeps it for its whole life."""

    id: str
    items: list[BatchItem]
    #: The ``anthropic-beta`` names and headers of the create request, for every item.
    betas: set[str]
    headers: dict[str, str]
    created_at: datetime
    expires_at: datetime
    status: BatchStatus = "in_progress"
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None
    deleted: bool = False
    answering: asyncio.Task[None] | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)

    def request_counts(self) -> dict[str, int]:
        """Every request is ``processing`` until the batch ends, as the API counts them."""
        counts = dict.fromkeys(("processing", *_RESULT_KINDS), 0)
        if self.status != "ended":
            counts["processing"] = len(self.items)
            return counts
        for item in self.items:
            counts[str((item.result or {}).get("type", "expired"))] += 1
        return counts

    def as_json(self, origin: str) -> JsonRecord:
        """The ``MessageBatch`` object; ``origin`` is where its results can be fetched."""
        ended = self.status == "ended"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.status,
            "request_counts": self.request_counts(),
            "created_at": _rfc3339(self.created_at),
            "expires_at": _rfc3339(self.expires_at),
            "ended_at": _rfc3339(self.ended_at) if self.ended_at else None,
            "cancel_initiated_at": (
                _rfc3339(self.cancel_initiated_at) if self.cancel_initiated_at else None
            ),
            "archived_at": None,
            "results_url": f"{origin}/v1/messages/batches/{self.id}/results" if ended else None,
        }

    def results_jsonl(self) -> bytes:
        """The results file: one JSON line per request, in the order they were sent."""
        lines = [json.dumps({"custom_id": i.custom_id, "result": i.result}) for i in self.items]
        return ("\n".join(lines) + "\n").encode()


#: Answers one batch's requests, filling in each item's result as it comes.
Answerer = Callable[[Batch], Awaitable[None]]


class BatchStore:
    """All batches of one server, newest first, and the ``custom_id`` submission counts.

    The clock runs on the server's event loop; :meth:`finish` and :meth:`submissions` may
    be called from a test's own thread.
    """

    def __init__(self, settings: BatchSettings, answer: Answerer) -> None:
        self.settings = settings
        self._answer = answer
        self._lock = threading.Lock()
        self._batches: dict[str, Batch] = {}
        self._submitted: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ----------------------------------------------------------------- observation

    @property
    def submissions(self) -> dict[str, int]:
        """How many times each ``custom_id`` was submitted, over all batches."""
        with self._lock:
            return dict(self._submitted)

    def all(self) -> list[Batch]:
        """Every batch created (deleted ones too), oldest first."""
        with self._lock:
            return list(self._batches.values())

    def get(self, batch_id: str) -> Batch | None:
        """The batch, unless there is none by that id or it was deleted."""
        with self._lock:
            batch = self._batches.get(batch_id)
        return None if batch is None or batch.deleted else batch

    def page(self, after_id: str | None, before_id: str | None, limit: int) -> list[Batch]:
        """Live batches newest first, the ``limit`` just after ``after_id`` or just before
        ``before_id``; one more than ``limit`` when there are more, for ``has_more``."""
        with self._lock:
            newest_first = [b for b in reversed(self._batches.values()) if not b.deleted]
        ids = [b.id for b in newest_first]
        if after_id is not None:
            start = ids.index(after_id) + 1 if after_id in ids else len(ids)
            return newest_first[start : start + limit + 1]
        if before_id is not None:
            end = ids.index(before_id) if before_id in ids else 0
            return newest_first[max(0, end - limit - 1) : end]
        return newest_first[: limit + 1]

    # ----------------------------------------------------------------- life cycle

    def create(self, items: list[BatchItem], betas: set[str], headers: dict[str, str]) -> Batch:
        """Record and count a new batch and start its clock (on the running loop)."""
        loop = self._loop = asyncio.get_running_loop()
        now = datetime.now(UTC)
        settings = self.settings
        batch = Batch(
            id=_new_id("msgbatch"),
            items=items,
            betas=betas,
            headers=headers,
            created_at=now,
            expires_at=now + timedelta(seconds=settings.expiry),
        )
        with self._lock:
            self._batches[batch.id] = batch
            self._submitted.update(item.custom_id for item in items)
        batch.timers.append(loop.call_later(settings.delay, self._start_answering, batch))
        batch.timers.append(loop.call_later(settings.expiry, self._end, batch, "expired"))
        return batch

    def cancel(self, batch: Batch) -> None:
        """Stop answering: what has no result yet ends ``canceled`` after ``cancel_delay``."""
        assert self._loop is not None
        batch.status = "canceling"
        batch.cancel_initiated_at = datetime.now(UTC)
        if batch.answering is not None:
            batch.answering.cancel()
        batch.timers.append(
            self._loop.call_later(self.settings.cancel_delay, self._end, batch, "canceled")
        )

    def delete(self, batch: Batch) -> None:
        batch.deleted = True

    def close(self) -> None:
        """Stop every clock and every answering task (the server is stopping)."""
        for batch in self.all():
            for timer in batch.timers:
                timer.cancel()
            if batch.answering is not None:
                batch.answering.cancel()

    def finish(self, batch_id: str) -> None:
        """End the batch's processing time now (a test's shortcut past ``delay``)."""
        if self._loop is None:
            raise RuntimeError("no batch has been created yet")
        batch = self._batches[batch_id]
        self._loop.call_soon_threadsafe(self._start_answering, batch)

    def _start_answering(self, batch: Batch) -> None:
        if batch.status != "in_progress" or batch.answering is not None:
            return
        batch.answering = asyncio.ensure_future(self._answer_then_end(batch))

    async def _answer_then_end(self, batch: Batch) -> None:
        await self._answer(batch)
        self._end(batch, "expired")

    def _end(self, batch: Batch, leftover: str) -> None:
        """End the batch; a request still without a result gets ``leftover``."""
        if batch.status == "ended":
            return
        for timer in batch.timers:
            timer.cancel()
        answering = batch.answering
        if answering is not None and answering is not asyncio.current_task():
            answering.cancel()
        for item in batch.items:
            if item.result is None:
                item.result = {"type": leftover}
        batch.status = "ended"
        batch.ended_at = datetime.now(UTC)
