"""A scripted Anthropic Messages API server, spoken over real HTTP.

No real model is reachable in tests, so every test drives the official ``anthropic`` SDK
against this server instead of mocking it: retries, SSE parsing, timeouts and error
mapping are then exercised exactly as in production. A *responder* decides what the
"model" says (a :class:`.replies.Reply`) or how the API fails (a :class:`.replies.Fault`);
the server does the wire format (see :mod:`.answer` and :mod:`.responses`), strict
request validation (see :mod:`.validate`), authentication, concurrency limits, a
prompt-cache simulation (see :mod:`.cache`), an optional context window,
``POST /v1/messages/count_tokens`` and the beta context editing
(``clear_tool_uses_20250919``). Prompt sizes are the cache module's
token estimate throughout, so the window, ``count_tokens`` and ``usage`` always agree.
The Message Batches endpoints are served too, by the same responder: see :mod:`.batches`.

The same scripted model also answers on Amazon Bedrock's and Google Vertex AI's wire
formats (SigV4 or OAuth, the model in the path, event-stream framing), so the SDK's own
platform clients can be tested too: see :mod:`.providers`.

Usage::

    async with ScriptedServer(lambda req: Reply.text("hi")) as server:
        client = AsyncAnthropic(base_url=server.url, api_key="test-key")
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from types import TracebackType
from typing import Any

from aiohttp import web

from .answer import CountedTokens, _Answer
from .apikey import check_api_key
from .arrivals import Arrival, read_arrival
from .batches import BatchSettings, MessageBatches, Respond
from .cache import EditedPrompt, PromptCache, apply_context_edits
from .providers import (
    GOOGLE_TOKEN_PATH,
    AuthRefused,
    AwsKeys,
    Route,
    check_bedrock_access,
    check_vertex_access,
    google_token_answer,
    messages_body,
)
from .replies import (
    Fault,
    LoggedRequest,
    Recorded,
    Reply,
    Responder,
    ScriptedRequest,
    SseEvent,
    _new_id,
)
from .responses import (
    Outcome,
    abort,
    answer_headers,
    error_body,
    error_response,
    fault_refusal,
    invalid,
    retry_headers,
    send_events,
    with_invocation_metrics,
)
from .threads import LoopThread
from .validate import (
    BlockShape,
    InvalidRequest,
    check_context_management,
    learn_block_shapes,
    validate_request,
)

__all__ = [
    "AwsKeys",
    "ScriptedServer",
]

log = logging.getLogger(__name__)

_MAX_BODY_BYTES = 32 * 1024 * 1024  # the real API's request size limit
_SHUTDOWN_GRACE = 1.0  # seconds stop() lets unfinished handlers run before cancelling
#: Not part of the Messages API: the scripted server's own request log, as JSON.
LOG_PATH = "/v1/_scripted/log"
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"


# --------------------------------------------------------------------------- the server


class ScriptedServer:
    """The scripted Messages API; see the module docstring.

    ``max_in_flight`` caps concurrently *admitted* requests; a request arriving while
    the cap is reached gets 429 ``rate_limit_error`` (retry-after
    ``rate_limit_retry_after``) and is not counted. ``max_in_flight_seen`` is the peak
    number of admitted requests open at once, a streamed one until its last byte.
    ``ping_every=0`` sends one ping after ``message_start``; N > 0 sends one after every
    N events. ``api_key=None`` accepts any key. ``system_messages=False`` plays a
    compatible endpoint that refuses ``system`` messages inside ``messages`` (400).

    ``context_window`` (tokens, after context edits) refuses a larger prompt with the
    API's 400 ``prompt is too long: N tokens > W maximum``; ``count_tokens`` is never
    refused for size, since callers use it to find out whether a prompt fits.
    ``context_management=True`` accepts the beta ``context_management`` field under
    ``anthropic-beta: context-management-2025-06-27``; ``False`` plays an endpoint
    without the beta, refusing the field and the header (see
    :func:`.validate.check_context_management`).

    Bedrock requests must be SigV4-signed by ``aws_keys`` for ``aws_region`` (any region
    when None), or carry ``bedrock_api_key`` as a bearer token; with neither configured
    they need only some ``Authorization``. Vertex requests need ``vertex_token`` as their
    bearer token (any token when None), for ``vertex_project`` and ``vertex_region`` when
    those are set; :data:`.providers.GOOGLE_TOKEN_PATH` hands ``vertex_token`` to a
    service account's JWT grant, for google-auth to refresh against. ``batches`` sets the
    batch endpoints' delay, expiry and limits; their state and counts are ``server.batches``.
    """

    def __init__(
        self,
        responder: Responder,
        *,
        api_key: str | None = "test-key",
        max_in_flight: int | None = None,
        rate_limit_retry_after: float = 0.05,
        chunk_size: int = 24,
        ping_every: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        system_messages: bool = True,
        context_window: int | None = None,
        context_management: bool = True,
        aws_keys: AwsKeys | None = None,
        aws_region: str | None = None,
        bedrock_api_key: str | None = None,
        vertex_token: str | None = None,
        vertex_project: str | None = None,
        vertex_region: str | None = None,
        batches: BatchSettings | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if context_window is not None and context_window < 1:
            raise ValueError("context_window must be >= 1 or None")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1 or None")
        self.responder = responder
        self.api_key = api_key
        self.max_in_flight = max_in_flight
        self.system_messages = system_messages
        self.context_window = context_window
        self.context_management = context_management
        self.aws_keys = aws_keys
        self.aws_region = aws_region
        self.bedrock_api_key = bedrock_api_key
        self.vertex_token = vertex_token
        self.vertex_project = vertex_project
        self.vertex_region = vertex_region
        #: Access tokens handed out at GOOGLE_TOKEN_PATH (not in the request log).
        self.token_requests = 0
        self.rate_limit_retry_after = rate_limit_retry_after
        self.chunk_size = chunk_size
        self.ping_every = ping_every
        self.host = host
        self.port = port
        self.cache = PromptCache()
        self.batches = MessageBatches(self, batches or BatchSettings())
        #: Block types and fields a replayed recording sent that the SDK does not declare,
        #: as sent: the validation takes them back (see :class:`.replies.Recorded`).
        self.learned_blocks: dict[str, BlockShape] = {}
        self._lock = threading.Lock()
        self._log: list[LoggedRequest] = []
        self._in_flight = 0
        self._max_in_flight_seen = 0
        self._responder_calls = 0
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._thread = LoopThread("ScriptedServer", "scripted-anthropic-server")

    # ----------------------------------------------------------------- observation

    @property
    def url(self) -> str:
        """Base URL for ``AsyncAnthropic(base_url=...)``; only valid once started."""
        if self._url is None:
            raise RuntimeError("ScriptedServer is not running; call start() first")
        return self._url

    @property
    def vertex_url(self) -> str:
        """Base URL for ``AsyncAnthropicVertex(base_url=...)``: Vertex's paths are under
        ``/v1``, which the SDK's default base URL carries."""
        return f"{self.url}/v1"

    @property
    def token_uri(self) -> str:
        """Where a service-account key's ``token_uri`` points to get ``vertex_token``."""
        return f"{self.url}{GOOGLE_TOKEN_PATH}"

    @property
    def log(self) -> list[LoggedRequest]:
        """A snapshot of every request so far, in arrival order (safe from any thread)."""
        with self._lock:
            return list(self._log)

    @property
    def max_in_flight_seen(self) -> int:
        with self._lock:
            return self._max_in_flight_seen

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    @property
    def responder_calls(self) -> int:
        """How many times the responder has been called."""
        with self._lock:
            return self._responder_calls

    async def _serve_log(self, request: web.Request) -> web.StreamResponse:
        """The request log as JSON, for a benchmark or test in another process; with
        ``?bodies=1``, each request's whole body too (a benchmark replays them)."""
        summaries = [entry.summary() for entry in self.log]
        if request.query.get("bodies") == "1":
            for summary, entry in zip(summaries, self.log, strict=True):
                summary["body"] = entry.body
        return web.json_response(summaries)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Bind and start serving on the current event loop."""
        if self._runner is not None:
            raise RuntimeError("ScriptedServer already started")
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        app.router.add_get(LOG_PATH, self._serve_log)
        app.router.add_post(GOOGLE_TOKEN_PATH, self._google_token)
        self.batches.add_routes(app.router, self._handle)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_GRACE)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        host, port = runner.addresses[0][:2]
        self._runner = runner
        self._url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def stop(self) -> None:
        """Stop listening; unfinished handlers get a short grace period, then are cancelled."""
        runner, self._runner = self._runner, None
        self._url = None
        self.batches.close()
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> ScriptedServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def start_in_thread(self, timeout: float = 10.0) -> None:
        """Serve from a private event loop in a daemon thread (for sync tests, subprocesses)."""
        self._thread.start(self.start, timeout)

    def stop_thread(self, timeout: float = 10.0) -> None:
        """Stop a server started with :meth:`start_in_thread` and join its thread."""
        self._thread.stop(self.stop, timeout)

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[ScriptedServer]:
        """``with server.in_thread():`` runs it in a background thread for the block."""
        self.start_in_thread()
        try:
            yield self
        finally:
            self.stop_thread()

    # ----------------------------------------------------------------- bookkeeping

    def _arrive(self, entry: LoggedRequest) -> int:
        with self._lock:
            index = len(self._log)
            self._log.append(replace(entry, index=index))
            return index

    def _note(self, index: int, **fields: Any) -> None:
        """Record facts learnt about a request before it finishes."""
        with self._lock:
            self._log[index] = replace(self._log[index], **fields)

    def _finish(self, index: int, status: int, outcome: str, **extra: Any) -> None:
        with self._lock:
            self._log[index] = replace(
                self._log[index], status=status, outcome=outcome, finished=time.monotonic(), **extra
            )

    def _admit(self) -> bool:
        """Take an in-flight slot, or refuse if the simulated limit is reached."""
        with self._lock:
            if self.max_in_flight is not None and self._in_flight >= self.max_in_flight:
                return False
            self._in_flight += 1
            self._max_in_flight_seen = max(self._max_in_flight_seen, self._in_flight)
            return True

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _next_responder_index(self) -> int:
        with self._lock:
            self._responder_calls += 1
            return self._responder_calls - 1

    # ----------------------------------------------------------------- HTTP handling

    async def _handle(
        self, request: web.Request, respond: Respond | None = None
    ) -> web.StreamResponse:
        """Every request lands here, so every request is logged the same way."""
        request_id = _new_id("req")
        arrival = await read_arrival(request)
        index = self._arrive(arrival.entry)
        try:
            return await (respond or self._respond)(request, arrival, index, request_id)
        except Outcome as out:
            response = error_response(arrival.route, out, request_id)
            self._finish(index, response.status, out.outcome)  # as sent: Bedrock's numbers
            return response
        except asyncio.CancelledError:
            self._finish(index, 499, "cancelled")
            raise

    async def _respond(
        self, request: web.Request, arrival: Arrival, index: int, request_id: str
    ) -> web.StreamResponse:
        """Check the request as the API does, in its order, then answer it."""
        route = arrival.route
        if route is None:
            raise Outcome(404, "not_found_error", "Not found", "not_found")
        self._authenticate(request, route, arrival.received, arrival.raw)
        if arrival.raw is None:
            message = "Request exceeds the maximum allowed size"
            raise Outcome(413, "request_too_large", message, f"invalid:{message}")
        if arrival.parse_error is not None:
            raise invalid(arrival.parse_error)
        try:
            body, betas = messages_body(route, arrival.body, arrival.betas)
        except InvalidRequest as exc:
            raise invalid(str(exc)) from None
        prompt = self._prepare(betas, body, route.counting)
        self._note(index, prompt_tokens=prompt.input_tokens)
        if route.counting:
            return self._count(index, prompt, request_id)
        if self.context_window is not None and prompt.input_tokens > self.context_window:
            raise invalid(
                f"prompt is too long: {prompt.input_tokens} tokens > {self.context_window} maximum"
            )
        if not self._admit():
            raise Outcome(
                429,
                "rate_limit_error",
                "Number of concurrent connections has exceeded your rate limit. "
                "Please try again later.",
                "rate_limited",
                retry_headers(self.rate_limit_retry_after),
            )
        try:
            return await self._serve(
                request, index, prompt, arrival.entry.headers, request_id, route
            )
        finally:
            self._release()

    async def _google_token(self, request: web.Request) -> web.StreamResponse:
        """Google's OAuth token endpoint, as far as a service account's refresh needs it."""
        form = {k: str(v) for k, v in (await request.post()).items()}
        status, answer = google_token_answer(form, self.vertex_token or "scripted-google-token")
        if status == 200:
            with self._lock:
                self.token_requests += 1
        return web.json_response(answer, status=status)

    def _prepare(self, betas: set[str], body: Any, counting: bool) -> EditedPrompt:
        """Validate, then apply context edits: the real API clears before it counts."""
        try:
            valid = validate_request(body, count_tokens=counting, more_blocks=self.learned_blocks)
            edits = check_context_management(valid, betas, supported=self.context_management)
        except InvalidRequest as exc:
            raise invalid(str(exc)) from None
        if not self.system_messages and any(
            isinstance(m, dict) and m.get("role") == "system" for m in valid["messages"]
        ):
            raise invalid("messages: roles must be 'user' or 'assistant'")
        return apply_context_edits(valid, edits)

    def _count(self, index: int, prompt: EditedPrompt, request_id: str) -> web.StreamResponse:
        """Answer ``count_tokens``: the size a messages request would be billed for."""
        answer: CountedTokens = {"input_tokens": prompt.input_tokens}
        if prompt.applied_edits is not None:
            original = prompt.original_input_tokens
            answer["context_management"] = {"original_input_tokens": original}
        self._finish(index, 200, "ok")
        return web.json_response(answer, headers={"request-id": request_id})

    def _authenticate(
        self, request: web.Request, route: Route, received: dict[str, str], raw: bytes | None
    ) -> None:
        """Each front door's own authentication: an API key, SigV4, or an OAuth token."""
        try:
            if route.provider == "bedrock":
                check_bedrock_access(
                    method=request.method,
                    url=f"http://{received.get('host', '')}{request.raw_path}",
                    headers=received,
                    body=raw,
                    keys=self.aws_keys,
                    region=self.aws_region,
                    api_key=self.bedrock_api_key,
                )
            elif route.provider == "vertex":
                check_vertex_access(
                    route,
                    received,
                    token=self.vertex_token,
                    project=self.vertex_project,
                    region=self.vertex_region,
                )
        except AuthRefused as refused:
            raise Outcome(
                refused.status, refused.kind, refused.message, f"auth:{refused.kind}"
            ) from None
        if route.provider == "anthropic":
            check_api_key(request.headers, self.api_key)

    async def _ask(self, scripted: ScriptedRequest) -> Reply | Fault | Recorded:
        answer: Any = self.responder(scripted)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, Reply | Fault | Recorded):
            raise TypeError(
                f"responder returned {type(answer).__name__}, not Reply, Fault or Recorded"
            )
        return answer

    async def _serve(
        self,
        request: web.Request,
        index: int,
        prompt: EditedPrompt,
        headers: dict[str, str],
        request_id: str,
        route: Route,
    ) -> web.StreamResponse:
        body = prompt.body  # the model sees the prompt as edited, as on the real API
        scripted = ScriptedRequest(index=self._next_responder_index(), body=body, headers=headers)
        try:
            answer = await self._ask(scripted)
        except Exception as exc:
            log.exception("scripted responder failed on request %d", index)
            # x-should-retry: false stops the SDK retrying, so the test fails loudly once.
            raise Outcome(
                500,
                "api_error",
                f"scripted responder raised {type(exc).__name__}: {exc}",
                f"error:{type(exc).__name__}: {exc}",
                {"x-should-retry": "false"},
            ) from None
        await asyncio.sleep(answer.delay)
        streaming = bool(body.get("stream", False))
        if isinstance(answer, Recorded):
            return await self._replay(request, index, answer, streaming, request_id, route)
        if isinstance(answer, Fault):
            return await self._fault(request, index, prompt, answer, streaming, request_id, route)
        prepared = self._answer(prompt, answer)
        if not streaming:
            gone = request.transport is None or request.transport.is_closing()
            outcome = "disconnected" if gone else "ok"
            self._finish(index, 200, outcome, **prepared.logged())
            return web.json_response(
                prepared.message(), headers=answer_headers(route, request_id, prepared)
            )
        events = prepared.events(self.chunk_size)
        if route.provider == "bedrock":
            events = with_invocation_metrics(events, prepared)
        response, delivered = await send_events(
            request,
            request_id,
            events,
            prepared.reply.event_delay,
            ping_every=self.ping_every,
            route=route,
        )
        outcome = "ok" if delivered else "disconnected"
        self._finish(index, 200, outcome, **prepared.logged())
        return response

    async def _replay(
        self,
        request: web.Request,
        index: int,
        recorded: Recorded,
        streaming: bool,
        request_id: str,
        route: Route,
    ) -> web.StreamResponse:
        """Send a recorded stream as it was recorded; learn the block types it holds."""
        if not streaming:
            raise Outcome(
                500,
                "api_error",
                f"the recorded stream {recorded.name or ''} answers streaming requests only",
                "error:recorded stream for a non-streaming request",
                {"x-should-retry": "false"},
            )
        with self._lock:
            learn_block_shapes(self.learned_blocks, recorded.blocks())
        events: list[SseEvent] = recorded.fresh()
        start = next((d for n, d in events if n == "message_start" and isinstance(d, dict)), None)
        message = start.get("message") if start is not None else None
        message_id = message.get("id") if isinstance(message, dict) else None
        response, delivered = await send_events(
            request, request_id, events, recorded.event_delay, ping_every=None, route=route
        )
        outcome = "ok" if delivered else "disconnected"
        self._finish(index, 200, outcome, message_id=message_id)
        return response

    def _answer(self, prompt: EditedPrompt, reply: Reply) -> _Answer:
        """Finalise the reply and do the cache/diagnostics accounting for a 200 response."""
        message_id = _new_id("msg")
        body = prompt.body  # edited: a cleared block breaks the cached prefix from there on
        diagnostics = self.cache.diagnose(body)
        usage = self.cache.account(body)
        self.cache.remember(message_id, body)
        managed = None if prompt.applied_edits is None else {"applied_edits": prompt.applied_edits}
        return _Answer(
            message_id, str(body["model"]), reply.finalised(), usage, diagnostics, managed
        )

    async def _fault(
        self,
        request: web.Request,
        index: int,
        prompt: EditedPrompt,
        fault: Fault,
        streaming: bool,
        request_id: str,
        route: Route,
    ) -> web.StreamResponse:
        outcome = f"fault:{fault.kind}"
        refusal = fault_refusal(fault, streaming, self.rate_limit_retry_after)
        if refusal is not None:
            raise refusal
        kind = fault.kind
        if not streaming:  # drop without streaming: vanish before answering
            self._finish(index, 0, outcome)
            abort(request)
            return web.Response(status=500)  # never reaches the client
        prepared = self._answer(prompt, fault.cut_reply)
        events = prepared.events(self.chunk_size)
        events = events[: min(fault.after_events, len(events) - 1)]
        if kind == "sse_error":
            error = error_body("overloaded_error", "Overloaded", request_id)
            del error["request_id"]
            events.append(("error", error))
        response, _ = await send_events(
            request,
            request_id,
            events,
            prepared.reply.event_delay,
            ping_every=self.ping_every,
            cut=kind == "drop",
            route=route,
        )
        self._finish(index, 200, outcome, **prepared.logged())
        return response
