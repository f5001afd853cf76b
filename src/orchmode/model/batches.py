"""Requests sent through the Message Batches API, at half price, for agents nobody waits on.

Each batched agent turn is one request in a batch. Requests that become ready together are
gathered (for ``batch_window`` seconds, or until a batch is full) into one batch; each batch
is watched until it ends and its results go back to the turns that asked. A request is
recorded in the store, durably, before its batch is created, and the batch's id as soon as
the API gives it: a run stopped at any moment and resumed asks the same requests under the
same ids (:mod:`.batch_ids`), finds the batches that hold them and takes their results, so
nothing is paid for twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic

from ..core.errors import BatchFailed
from ..store import Store
from .batch_ids import custom_id

log = logging.getLogger("orchmode")

#: Creates of one batch that the API turned away as busy, before the turns hear of it.
CREATE_ATTEMPTS = 6
#: The API's limits on one batch.
MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
#: Room kept under the byte limit for the envelope around the requests.
_BYTES_MARGIN = 1024 * 1024
#: The longest wait between two looks at a batch.
LONGEST_POLL = 60.0
#: How far this machine's clock and the API's may differ, in seconds: a batch created this
#: long before a request was recorded is still looked in for it.
CLOCK_SKEW = 600.0
#: How far behind its end a batch is seen at most, as a share of its age.
POLL_SHARE = 0.05

Outcome = Literal["succeeded", "errored", "expired", "canceled"]


@dataclass(frozen=True)
class BatchResult:
    """One request's result: the message (the API's JSON) when it succeeded, else why not."""

    custom_id: str
    outcome: Outcome
    message: Mapping[str, Any] | None = None
    #: An errored result's error: its type (``invalid_request_error``, ``api_error``, …)
    #: and message.
    error_type: str = ""
    error: str = ""


class _Unsent(Exception):
    """A gathered request dropped by a cancel before its batch was created."""


def _future() -> asyncio.Future[str]:
    return asyncio.get_running_loop().create_future()


@dataclass
class _Waiting:
    custom_id: str
    params: Mapping[str, Any]
    size: int
    #: The id of the batch it went in, once the batch is created.
    sent: asyncio.Future[str] = field(default_factory=_future)


@dataclass
class BatchDesk:
    """Gathers a session's batched requests into batches and hands each its result.

    ``create``, ``retrieve``, ``results``, ``listing`` and ``cancel`` are the SDK's batch
    calls (``client.messages.batches``), taken apart so the desk holds no client of its own.
    """

    store: Store
    session: str
    batches: Any
    window: float
    max_requests: int = MAX_REQUESTS
    first_poll: float = 1.0
    on_sent: Callable[[str, int], None] | None = None
    on_ended: Callable[[str, dict[str, int], float], None] | None = None
    _gathering: list[_Waiting] = field(default_factory=list)
    _flush: asyncio.TimerHandle | None = None
    _watchers: dict[str, asyncio.Task[dict[str, BatchResult]]] = field(default_factory=dict)
    _listed: asyncio.Task[list[tuple[str, float]]] | None = None
    _sending: set[asyncio.Task[None]] = field(default_factory=set)
    #: The batches sent or looked in that have not been seen to end.
    _open: set[str] = field(default_factory=set)

    async def ask(
        self,
        params: Mapping[str, Any],
        attempt: int = 0,
        on_waiting: Callable[[str], None] | None = None,
    ) -> BatchResult:
        """The result of ``params`` (a Messages request's body, without ``stream``) at
        ``attempt``: from the batch that already holds it, if one does, else from a new one.

        ``on_waiting`` hears the id of the batch the request waits on, once it is known."""
        cid = custom_id(params, attempt)
        while True:
            record = await self.store.batch_request(cid)
            if record is not None and record.batch_id:
                return await self._result(record.batch_id, cid, on_waiting)
            if record is not None:
                found = await self._find(cid, record.recorded_at)
                if found is not None:
                    return found
            try:
                batch_id = await self._gather(cid, params)
            except _Unsent:
                return BatchResult(cid, "canceled", error="canceled before its batch was sent")
            if batch_id:
                return await self._result(batch_id, cid, on_waiting)
            # The create's answer was lost: its batch may exist. Look for it again, as a
            # resumed run would, before sending anything twice.
            self._listed = None

    async def cancel(self) -> None:
        """Cancel every batch still being processed (the run was interrupted), the ones
        being created at this moment included. Requests still being gathered are not sent:
        never recorded, they are asked afresh on a resume."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        unsent, self._gathering = self._gathering, []
        for waiting in unsent:
            if not waiting.sent.done():
                waiting.sent.set_exception(_Unsent())
        await asyncio.gather(*self._sending, return_exceptions=True)
        for batch_id in list(self._open):
            with contextlib.suppress(Exception):
                await self.batches.cancel(batch_id)

    async def close(self) -> None:
        """Stop watching; batches already sent go on at the API, found again on a resume."""
        if self._flush is not None:
            self._flush.cancel()
        tasks: list[asyncio.Task[Any]] = [*self._watchers.values(), *self._sending]
        if self._listed is not None:
            tasks.append(self._listed)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiting in self._gathering:
            waiting.sent.cancel()

    # ------------------------------------------------------------------ gathering and sending

    async def _gather(self, cid: str, params: Mapping[str, Any]) -> str:
        """Put the request in the batch being gathered; its batch's id once it is sent."""
        entry = {"custom_id": cid, "params": params}
        waiting = _Waiting(cid, params, len(json.dumps(entry, ensure_ascii=False)))
        if self._gathered_bytes() + waiting.size > MAX_BYTES - _BYTES_MARGIN:
            self._send_now()
        self._gathering.append(waiting)
        if len(self._gathering) >= self.max_requests:
            self._send_now()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(self.window, self._send_now)
        return await asyncio.shield(waiting.sent)

    def _gathered_bytes(self) -> int:
        return sum(waiting.size for waiting in self._gathering)

    def _send_now(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        batch, self._gathering = self._gathering, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Waiting]) -> None:
        """Record the requests, create their batch, record its id; tell each request the
        batch's id ('' when the API's answer was lost, so the batch may or may not exist)."""
        ids = [waiting.custom_id for waiting in batch]
        try:
            await self.store.record_batch_requests(self.session, ids)
            batch_id = await self._create(batch)
            if batch_id:
                await self.store.record_batch_requests(self.session, ids, batch_id)
        except Exception as exc:  # every waiting turn hears of it, none is left hanging
            failed = (
                exc
                if isinstance(exc, BatchFailed)
                else BatchFailed(f"could not send a batch of {len(batch)} requests: {exc}")
            )
            for waiting in batch:
                if not waiting.sent.done():
                    waiting.sent.set_exception(failed)
            return
        if batch_id:
            self._open.add(batch_id)
            if self.on_sent is not None:
                self.on_sent(batch_id, len(batch))
        for waiting in batch:
            if not waiting.sent.done():
                waiting.sent.set_result(batch_id)

    async def _create(self, batch: list[_Waiting]) -> str:
        """The new batch's id; '' when the connection broke before the API answered. A
        create the API turned away as overloaded, rate-limited or failing (nothing was
        made) is tried again after a wait; one it refused is a :class:`BatchFailed`."""
        requests = [{"custom_id": w.custom_id, "params": dict(w.params)} for w in batch]
        for attempt in range(CREATE_ATTEMPTS):
            try:
                created = await self.batches.create(requests=requests)
                return str(created.id)
            except anthropic.APIStatusError as exc:
                busy = exc.status_code in (408, 409, 429, 529) or exc.status_code >= 500
                if not busy or attempt == CREATE_ATTEMPTS - 1:
                    raise BatchFailed(
                        f"the API refused a batch of {len(batch)} requests "
                        f"({exc.status_code}): {exc.message}"
                    ) from exc
                log.info("batch create answered %s; trying again", exc.status_code)
                await asyncio.sleep(min(LONGEST_POLL, self.first_poll * 2**attempt))
            except anthropic.APIConnectionError as exc:  # timeouts too: made or not, unknown
                log.info("the answer to a batch create was lost (%s); looking for it", exc)
                return ""
        raise AssertionError("unreachable")  # the last attempt returns or raises

    # ------------------------------------------------------------------ watching and finding

    async def _result(
        self, batch_id: str, cid: str, on_waiting: Callable[[str], None] | None = None
    ) -> BatchResult:
        if on_waiting is not None:
            on_waiting(batch_id)
        results = await asyncio.shield(self._watch(batch_id))
        return results.get(cid) or BatchResult(
            cid, "errored", error=f"batch {batch_id} ended without a result for this request"
        )

    def _watch(self, batch_id: str) -> asyncio.Task[dict[str, BatchResult]]:
        """The task that waits for a batch to end and reads its results (one per batch)."""
        task = self._watchers.get(batch_id)
        if task is None:
            self._open.add(batch_id)
            task = asyncio.get_running_loop().create_task(self._until_ended(batch_id))
            self._watchers[batch_id] = task
        return task

    async def _until_ended(self, batch_id: str) -> dict[str, BatchResult]:
        """Look at the batch, each time after a twentieth of its age (so it is seen ended within
        about a twentieth of its run), then read its results."""
        started = time.monotonic()
        wait = self.first_poll
        while True:
            batch = await self.batches.retrieve(batch_id)
            if batch.processing_status == "ended":
                self._open.discard(batch_id)
                break
            await asyncio.sleep(wait)
            age = time.monotonic() - started
            wait = min(LONGEST_POLL, max(self.first_poll, age * POLL_SHARE))
        results: dict[str, BatchResult] = {}
        async for line in await self.batches.results(batch_id):
            result = _read_result(line)
            results[result.custom_id] = result
        if self.on_ended is not None:
            counts = batch.request_counts
            tally = {name: int(getattr(counts, name, 0) or 0) for name in _COUNTED}
            self.on_ended(batch_id, tally, time.monotonic() - started)
        return results

    async def _find(self, cid: str, recorded_at: float) -> BatchResult | None:
        """A request recorded but whose batch's id never was (the run stopped between the
        two): look for it in each batch created since, once that batch has ended."""
        if self._listed is None:
            self._listed = asyncio.get_running_loop().create_task(self._list(recorded_at))
        for batch_id, created_at in await asyncio.shield(self._listed):
            if created_at < recorded_at - CLOCK_SKEW:
                continue
            results = await asyncio.shield(self._watch(batch_id))
            if cid in results:
                await self.store.record_batch_requests(self.session, [cid], batch_id)
                return results[cid]
        return None

    async def _list(self, since: float) -> list[tuple[str, float]]:
        """The batches created since a little before ``since``, newest first (as listed)."""
        listed: list[tuple[str, float]] = []
        async for batch in self.batches.list(limit=100):
            created_at = batch.created_at.timestamp()
            if created_at < since - CLOCK_SKEW:
                break
            listed.append((batch.id, created_at))
        return listed


_COUNTED = ("processing", "succeeded", "errored", "canceled", "expired")


def _read_result(line: Any) -> BatchResult:
    """One line of a batch's results (the SDK's object) as a :class:`BatchResult`."""
    data = line.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False)
    cid = str(data.get("custom_id", ""))
    result = data.get("result") or {}
    outcome = result.get("type")
    if outcome == "succeeded":
        return BatchResult(cid, "succeeded", message=result.get("message") or {})
    if outcome in ("errored", "expired", "canceled"):
        error = result.get("error") or {}
        detail = error.get("error", error) if isinstance(error, dict) else error
        if not isinstance(detail, dict):
            return BatchResult(cid, outcome, error=str(detail))
        kind, message = detail.get("type", ""), detail.get("message", "")
        return BatchResult(cid, outcome, error_type=str(kind), error=str(message))
    return BatchResult(cid, "errored", error=f"a result of unknown type {outcome!r}")
