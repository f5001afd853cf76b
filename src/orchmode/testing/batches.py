"""The Message Batches endpoints of the scripted server, answered by its own responder.

``POST /v1/messages/batches`` and its retrieve, list, cancel, delete and ``results``
(JSONL) are served as strictly as the API serves them, so a client's batch mode is tested
with the SDK's own batch client. Every batched request is answered by the responder that
answers interactive ones (the :class:`.replies.ScriptedRequest` names its batch and
``custom_id``), with the same prompt-cache accounting; a responder picks an ``errored``,
``expired`` or ``canceled`` result with a :class:`.batch_fate.BatchFate`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from ..core.wire import ApiObject, JsonRecord
from .answer import _Answer
from .apikey import check_api_key
from .arrivals import Arrival
from .batch_fate import BatchFate
from .batch_requests import read_batch_requests
from .batch_store import Batch, BatchItem, BatchSettings, BatchStore
from .cache import EditedPrompt
from .replies import Answer, Fault, Recorded, Reply, Responder, ScriptedRequest, _new_id
from .responses import Outcome, abort, error_body, fault_refusal, invalid

__all__ = ["BATCHES_PATH", "BatchSettings", "MessageBatches", "Respond"]

log = logging.getLogger(__name__)

BATCHES_PATH = "/v1/messages/batches"
_ONE = BATCHES_PATH + "/{batch_id}"
_LIST_LIMIT = (1, 1000, 20)  # least, most, default

#: Answers a request the server has read and logged: the server's own request handling.
Respond = Callable[[web.Request, Arrival, int, str], Awaitable[web.StreamResponse]]
#: The server's entry point, which logs the request and turns an Outcome into an error.
Handle = Callable[[web.Request, Respond], Awaitable[web.StreamResponse]]
_Operation = Callable[[web.Request, Arrival], Awaitable[web.Response]]


class BatchHost(Protocol):
    """What the batch endpoints use of the scripted server, so a batched request is
    checked, answered, billed and logged exactly as an interactive one."""

    api_key: str | None
    responder: Responder
    context_window: int | None

    def _prepare(self, betas: set[str], body: Any, counting: bool) -> EditedPrompt: ...
    def _next_responder_index(self) -> int: ...
    def _answer(self, prompt: EditedPrompt, reply: Reply) -> _Answer: ...
    def _finish(self, index: int, status: int, outcome: str, **extra: Any) -> None: ...


class MessageBatches:
    """The batch endpoints and batch store of one scripted server.

    ``submissions`` counts each ``custom_id`` over all batches; ``all()`` lists every batch
    with its items (results, replies and billed usage); ``finish(batch_id)`` ends a batch's
    processing time at once. ``settings`` (:class:`.batch_store.BatchSettings`) may be
    replaced between batches.
    """

    def __init__(self, server: BatchHost, settings: BatchSettings) -> None:
        self._server = server
        self._store = BatchStore(settings, self._answer_batch)
        #: Creates answered so far, to pick each one's ``create_faults`` entry.
        self._creates = 0

    @property
    def settings(self) -> BatchSettings:
        return self._store.settings

    @settings.setter
    def settings(self, settings: BatchSettings) -> None:
        self._store.settings = settings

    @property
    def submissions(self) -> dict[str, int]:
        """How many times each ``custom_id`` was submitted, over all batches."""
        return self._store.submissions

    def all(self) -> list[Batch]:
        """Every batch created, deleted ones included, oldest first."""
        return self._store.all()

    def finish(self, batch_id: str) -> None:
        """Answer the batch now instead of after ``settings.delay`` (safe from any thread)."""
        self._store.finish(batch_id)

    def close(self) -> None:
        self._store.close()

    # ----------------------------------------------------------------- routing

    def add_routes(self, router: web.UrlDispatcher, handle: Handle) -> None:
        """Serve the endpoints through ``handle``, so they are logged like any request."""
        operations: list[tuple[str, str, _Operation]] = [
            ("POST", BATCHES_PATH, self._create),
            ("GET", BATCHES_PATH, self._list),
            ("GET", _ONE, self._retrieve),
            ("DELETE", _ONE, self._delete),
            ("POST", _ONE + "/cancel", self._cancel),
            ("GET", _ONE + "/results", self._results),
        ]
        for method, path, operation in operations:
            router.add_route(method, path, self._entry(handle, operation))

    def _entry(
        self, handle: Handle, operation: _Operation
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def respond(
            request: web.Request, arrival: Arrival, index: int, request_id: str
        ) -> web.StreamResponse:
            check_api_key(request.headers, self._server.api_key)
            response = await operation(request, arrival)
            response.headers["request-id"] = request_id
            self._server._finish(index, response.status, "ok")
            return response

        async def entry(request: web.Request) -> web.StreamResponse:
            # A batch may be far larger than a single message: read it with its own limit.
            larger = request.clone(client_max_size=self.settings.max_body_bytes + 1)
            return await handle(larger, respond)

        return entry

    def _found(self, request: web.Request) -> Batch:
        batch_id = request.match_info["batch_id"]
        batch = self._store.get(batch_id)
        if batch is None:
            message = f"message_batch_id: no message batch with id {batch_id!r}"
            raise Outcome(404, "not_found_error", message, "not_found")
        return batch

    @staticmethod
    def _shown(request: web.Request, batch: Batch) -> web.Response:
        return web.json_response(batch.as_json(str(request.url.origin())))

    # ----------------------------------------------------------------- operations

    async def _create(self, request: web.Request, arrival: Arrival) -> web.Response:
        if arrival.parse_error is not None:
            raise invalid(arrival.parse_error)

        def prepare(params: Any) -> EditedPrompt:
            return self._server._prepare(arrival.betas, params, False)

        items = read_batch_requests(arrival.raw, arrival.body, self.settings, prepare)
        faults, self._creates = self.settings.create_faults, self._creates + 1
        fault = faults[self._creates - 1] if self._creates <= len(faults) else None
        if fault is not None and fault.kind != "drop":
            refusal = fault_refusal(fault, False, 1.0)
            assert refusal is not None  # only a drop cuts a reply short
            raise refusal
        batch = self._store.create(items, arrival.betas, arrival.entry.headers)
        if fault is not None:  # made, and the answer lost on the way
            abort(request)
        return self._shown(request, batch)

    async def _retrieve(self, request: web.Request, arrival: Arrival) -> web.Response:
        return self._shown(request, self._found(request))

    async def _list(self, request: web.Request, arrival: Arrival) -> web.Response:
        query = request.query
        least, most, default = _LIST_LIMIT
        try:
            limit = int(query.get("limit", default))
        except ValueError:
            raise invalid("limit: Input should be a valid integer") from None
        if not least <= limit <= most:
            raise invalid(f"limit: Input should be between {least} and {most}")
        before_id = query.get("before_id")
        page = self._store.page(query.get("after_id"), before_id, limit)
        has_more = len(page) > limit
        if has_more:
            page = page[1:] if before_id is not None else page[:limit]
        origin = str(request.url.origin())
        answer: JsonRecord = {
            "data": [batch.as_json(origin) for batch in page],
            "has_more": has_more,
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
        }
        return web.json_response(answer)

    async def _cancel(self, request: web.Request, arrival: Arrival) -> web.Response:
        batch = self._found(request)
        if batch.status == "ended":
            raise invalid(f"message batch {batch.id} has already ended and cannot be canceled")
        if batch.status == "in_progress":
            self._store.cancel(batch)
        return self._shown(request, batch)

    async def _delete(self, request: web.Request, arrival: Arrival) -> web.Response:
        batch = self._found(request)
        if batch.status != "ended":
            raise invalid(
                f"message batch {batch.id} is still processing; cancel it before deleting it"
            )
        self._store.delete(batch)
        return web.json_response({"id": batch.id, "type": "message_batch_deleted"})

    async def _results(self, request: web.Request, arrival: Arrival) -> web.Response:
        batch = self._found(request)
        if batch.status != "ended":
            raise invalid(
                f"message batch {batch.id} has not ended yet; its results are available "
                "once processing ends"
            )
        return web.Response(body=batch.results_jsonl(), content_type="application/binary")

    # ----------------------------------------------------------------- answering

    async def _answer_batch(self, batch: Batch) -> None:
        """Answer every request of the batch at once, each as an interactive one would be."""
        await asyncio.gather(*(self._answer_item(batch, item) for item in batch.items))

    async def _answer_item(self, batch: Batch, item: BatchItem) -> None:
        server = self._server
        if item.prompt is None:
            item.result = _errored("invalid_request_error", item.refused)
            return
        window = server.context_window
        tokens = item.prompt.input_tokens
        if window is not None and tokens > window:
            message = f"prompt is too long: {tokens} tokens > {window} maximum"
            item.result = _errored("invalid_request_error", message)
            return
        scripted = ScriptedRequest(
            index=server._next_responder_index(),
            body=item.prompt.body,
            headers=batch.headers,
            batch_id=batch.id,
            custom_id=item.custom_id,
        )
        try:
            answer = await _ask(server.responder(scripted))
        except Exception as exc:
            log.exception("scripted responder failed on %s of %s", item.custom_id, batch.id)
            message = f"scripted responder raised {type(exc).__name__}: {exc}"
            item.result = _errored("api_error", message)
            return
        await asyncio.sleep(answer.delay)
        self._settle(item, answer)

    def _settle(self, item: BatchItem, answer: Answer) -> None:
        """Give the item the result its answer makes."""
        if isinstance(answer, Reply):
            assert item.prompt is not None  # a request with invalid params is not asked
            prepared = self._server._answer(item.prompt, answer)
            item.reply, item.usage = prepared.reply, prepared.cache
            item.result = {"type": "succeeded", "message": prepared.message()}
        elif isinstance(answer, BatchFate):
            fate = answer
            item.result = (
                _errored(fate.error_type, fate.message)
                if fate.kind == "errored"
                else {"type": fate.kind}
            )
        elif isinstance(answer, Fault):
            refusal = fault_refusal(answer, False, 0.0)
            kind, message = ("api_error", "Internal server error")
            if refusal is not None:
                kind, message = refusal.kind, refusal.message
            item.result = _errored(kind, message)
        else:
            message = f"the recorded stream {answer.name} answers streaming requests only"
            item.result = _errored("api_error", message)


async def _ask(answer: Any) -> Answer:
    """The responder's answer, awaited if need be, checked to be one a batch can give."""
    if inspect.isawaitable(answer):
        answer = await answer
    if not isinstance(answer, Reply | Fault | Recorded | BatchFate):
        raise TypeError(
            f"responder returned {type(answer).__name__}, not Reply, Fault, Recorded or BatchFate"
        )
    return answer


def _errored(kind: str, message: str) -> ApiObject:
    return {"type": "errored", "error": error_body(kind, message, _new_id("req"))}
