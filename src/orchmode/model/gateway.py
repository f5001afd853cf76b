"""The only code that talks to the Messages API: streaming, effort, prompt caching, usage.

Every request carries ``output_config.effort``, the per-request timeout and top-level
automatic prompt caching, so a multi-turn loop reads its growing prefix from the cache.
SDK and transport errors are turned into :mod:`orchmode.core.errors` exceptions here, so the
loops above never see an HTTP library. On Amazon Bedrock and Google Vertex AI (see
:mod:`orchmode.model.providers`) what the endpoint is not known to take is left out or sent in
a form it does take, and the gateway says so once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import anthropic
import httpx2

from ..core.errors import (
    AuthError,
    ModelRequestError,
    Overloaded,
    PromptTooLong,
    StreamInterrupted,
    TransientFailure,
)
from ..core.events import (
    EventBus,
    ModelRefused,
    ModelRequestDone,
    ModelRequestFailed,
    ModelRequestRetried,
    Role,
    TokenUsage,
)
from ..core.prompts import notice_as_user_text
from ..core.settings import Settings
from ..core.wire import Block, Message, blocks_of, joined_text
from .context import too_long_count
from .limits import AdaptiveLimit
from .providers import (
    Capabilities,
    Client,
    Credentials,
    auth_failures,
    build_client,
    capabilities_of,
    require_access,
)

if TYPE_CHECKING:
    from ..core.agents import AgentDefinition
    from .budget import SessionBudget

log = logging.getLogger("orchmode")

#: Seconds before the first retry of a broken stream, and the most any wait grows to.
RETRY_BASE = 0.25
RETRY_CAP = 8.0

#: A 5-minute cache breakpoint, as the API spells it.
EPHEMERAL: Any = {"type": "ephemeral"}
#: The beta that carries the API's own context editing (``context_management``).
CONTEXT_BETA = "context-management-2025-06-27"


@dataclass(frozen=True)
class ModelReply:
    """One finished response, its content already in request (param) form."""

    message_id: str
    content: list[Block]
    stop_reason: str | None
    usage: TokenUsage
    cache_miss: str | None = None
    cache_missed_tokens: int = 0
    #: What the API's context editing cleared from this request, if it did.
    cleared_tool_uses: int = 0
    cleared_tokens: int = 0
    #: The model the response names.
    model: str = ""
    #: Times the request was tried again before this answer.
    retries: int = 0
    #: The API's ``stop_details`` (a refusal's ``category`` and ``explanation``), as sent.
    stop_details: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return joined_text(self.content).strip()

    @property
    def tool_uses(self) -> list[Block]:
        return blocks_of(self.content, "tool_use")

    @property
    def refusal(self) -> ModelRefused | None:
        """A refusal's ``stop_details`` (its agent left blank); None for any other stop."""
        if self.stop_reason != "refusal":
            return None
        details = self.stop_details or {}
        category, explanation = details.get("category"), details.get("explanation")
        return ModelRefused(
            "",
            category if isinstance(category, str) else "",
            " ".join(explanation.split()) if isinstance(explanation, str) else "",
        )


class _ReplyBuilder:
    """Builds a :class:`ModelReply` from the SDK's raw stream events.

    The SDK's ``messages.stream()`` helper rebuilds a typed snapshot on every event and
    re-parses a tool call's partial JSON on every delta; measured on a fan-out, that was
    most of the harness's CPU. The events are the SDK's own types; only the assembly is ours.

    A block goes back in the next request exactly as the API sent it: each is taken as the
    API's JSON (field names as the API spells them, ``from`` not ``from_``; only the fields
    it sent, nulls included; fields and block types this SDK does not know kept too), and
    only what its deltas add is added to it.
    """

    def __init__(self) -> None:
        self.message_id = ""
        self.model = ""
        self.stop_reason: str | None = None
        self.stop_details: dict[str, Any] | None = None
        #: The blocks by their index in the response (the API numbers them from 0).
        self.blocks: dict[int, Block] = {}
        self.json_parts: dict[int, list[str]] = {}
        self.open: set[int] = set()
        self.usage: dict[str, int] = {}
        self.cache_miss: str | None = None
        self.cache_missed_tokens = 0
        self.cleared_tool_uses = 0
        self.cleared_tokens = 0
        #: The stream's framing events seen, to say what an incomplete stream lacked.
        self.started = self.delta_seen = self.stopped = False

    def feed(self, event: Any) -> str | None:
        """Take one event; return the text it adds, if any."""
        kind = event.type
        if kind == "content_block_delta":
            delta = event.delta
            try:
                block = self.blocks[event.index]
            except KeyError:
                raise StreamInterrupted(
                    f"the response stream sent a delta for content block {event.index}, "
                    "which it never started (no content_block_start)"
                ) from None
            dtype = delta.type
            if dtype == "text_delta":
                text = cast(str, delta.text)
                block["text"] = block.get("text", "") + text
                return text
            if dtype == "input_json_delta":
                self.json_parts.setdefault(event.index, []).append(delta.partial_json)
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.thinking
            elif dtype == "signature_delta":
                block["signature"] = delta.signature
            elif dtype == "citations_delta":
                citations = block.get("citations") or []
                block["citations"] = [*citations, _as_json(delta.citation)]
            elif dtype == "compaction_delta":
                _add_compaction(block, _as_json(delta))
        elif kind == "content_block_start":
            self.open.add(event.index)
            self.blocks[event.index] = _as_json(event.content_block)
        elif kind == "content_block_stop":
            self.open.discard(event.index)
            parts = self.json_parts.pop(event.index, None)
            if parts is not None and event.index in self.blocks:
                self.blocks[event.index]["input"] = _tool_input("".join(parts))
        elif kind == "message_start":
            self.started = True
            self.message_id = event.message.id
            self.model = str(getattr(event.message, "model", "") or "")
            self._take_usage(event.message.usage)
            diagnostics = getattr(event.message, "diagnostics", None)
            reason = getattr(diagnostics, "cache_miss_reason", None)
            if reason is not None:
                self.cache_miss = str(reason.type)
                self.cache_missed_tokens = getattr(reason, "cache_missed_input_tokens", 0) or 0
        elif kind == "message_delta":
            self.delta_seen = True
            self.stop_reason = event.delta.stop_reason
            details = getattr(event.delta, "stop_details", None)
            if details is not None:
                self.stop_details = _as_json(details)
            self._take_usage(event.usage)
            managed = getattr(event, "context_management", None)
            for edit in getattr(managed, "applied_edits", None) or []:
                self.cleared_tool_uses += getattr(edit, "cleared_tool_uses", 0) or 0
                self.cleared_tokens += getattr(edit, "cleared_input_tokens", 0) or 0
        elif kind == "message_stop":
            self.stopped = True
        return None

    def _take_usage(self, usage: Any) -> None:
        # message_delta carries cumulative totals: they replace, and absent ones keep theirs.
        for field_name in (
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ):
            value = getattr(usage, field_name, None)
            if value is not None:
                self.usage[field_name] = value

    def missing(self) -> str | None:
        """What the stream lacked to be a whole response, in the API's own terms; None when
        nothing did."""
        if not self.started or not self.message_id:
            return "without a message_start (no message id)"
        if self.open:
            index = min(self.open)
            kind = self.blocks[index].get("type", "?")
            return f"inside content block {index} ({kind}), before its content_block_stop"
        if not self.delta_seen:
            also = "" if self.stopped else " or message_stop"
            return f"without a message_delta{also} (no stop reason or final usage)"
        if self.stop_reason is None:
            return "with a message_delta that gave no stop reason"
        return None

    def reply(self) -> ModelReply:
        ordered = (self.blocks[i] for i in sorted(self.blocks))
        content = [b for b in map(_request_block, ordered) if b is not None]
        usage = TokenUsage(
            input_tokens=self.usage.get("input_tokens", 0),
            output_tokens=self.usage.get("output_tokens", 0),
            cache_read_tokens=self.usage.get("cache_read_input_tokens", 0),
            cache_write_tokens=self.usage.get("cache_creation_input_tokens", 0),
        )
        return ModelReply(
            self.message_id,
            content,
            self.stop_reason,
            usage,
            self.cache_miss,
            self.cache_missed_tokens,
            self.cleared_tool_uses,
            self.cleared_tokens,
            self.model,
            stop_details=self.stop_details,
        )


def _as_json(value: Any) -> dict[str, Any]:
    """An SDK object as the API's JSON: its fields by the API's names, only those the API
    sent (an explicit null kept), fields the SDK does not declare kept as they came."""
    if isinstance(value, dict):
        return dict(value)
    return cast(
        dict[str, Any],
        value.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False),
    )


def _add_compaction(block: Block, delta: dict[str, Any]) -> None:
    """A ``compaction_delta`` into its block: the summary (``content``) is streamed in
    pieces and joined; ``encrypted_content`` is opaque, so the latest one sent stands."""
    piece = delta.get("content")
    if isinstance(piece, str):
        block["content"] = (block.get("content") or "") + piece
    secret = delta.get("encrypted_content")
    if secret is not None:
        block["encrypted_content"] = secret


def _tool_input(raw: str) -> dict[str, Any]:
    """A tool call's input; malformed JSON is kept visibly so the tool can say what is wrong."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_unparsed_input": raw}
    return value if isinstance(value, dict) else {"_unparsed_input": raw}


def _request_block(block: Block) -> Block | None:
    """A response block as the next request sends it back: as it came, except that a text
    block with no visible text, which the API refuses in a request, is left out."""
    if block.get("type") == "text" and not str(block.get("text", "")).strip():
        return None
    return block


class _BetaRefused(Exception):
    """A 400 that says the context-editing beta is the problem: send it again without."""


#: What a 400 says when the context-editing beta itself is what the endpoint refuses: the
#: field (``context_management: Extra inputs are not permitted``), the beta's name or the
#: header (``Unexpected value(s) … for the anthropic-beta header``), or a beta it does not
#: know or take. Any other 400 is about something else and leaves context editing on.
_BETA_REFUSALS = re.compile(
    r"context[_-]management|anthropic-beta"
    r"|\b(unknown|unsupported|invalid|unexpected)\b[^.]*\bbetas?\b"
    r"|\bbetas?\b[^.]*\b(not (supported|available|enabled|recogni[sz]ed)|unknown)\b",
    re.IGNORECASE,
)


def beta_is_the_problem(message: str) -> bool:
    """Whether an API error's words say the context-editing beta is what it refused."""
    return _BETA_REFUSALS.search(message) is not None


def _backoff(attempt: int) -> float:
    """Full-jitter exponential backoff: a random wait up to base * 2**(attempt - 1)."""
    return random.uniform(0, min(RETRY_CAP, RETRY_BASE * 2 ** (attempt - 1)))


def _retry_after(exc: anthropic.APIStatusError) -> float | None:
    """The wait the API asked for, from ``retry-after-ms`` or ``retry-after`` (seconds)."""
    headers = exc.response.headers
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


def _api_message(exc: anthropic.APIStatusError) -> str:
    """The error's own words: ``error.message`` (Anthropic, Google) or Bedrock's ``message``."""
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return cast(str, error["message"])
        for key in ("message", "Message"):
            if isinstance(body.get(key), str):
                return cast(str, body[key])
    return exc.message


_BREAKPOINT_BLOCKS = frozenset({"text", "tool_result", "tool_use", "image", "document"})


def _with_breakpoint(messages: list[Message]) -> list[Message]:
    """The last message with a cache breakpoint on its last block: the same prefix caching
    the top-level ``cache_control`` asks for, in the form every platform documents. Only
    the request's copy is marked; the history is not touched."""
    if not messages:
        return messages
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str):
        if not content.strip():
            return messages
        blocks: list[Block] = [{"type": "text", "text": content}]
    elif isinstance(content, list) and content and isinstance(content[-1], dict):
        blocks = list(content)
    else:
        return messages
    if blocks[-1].get("type") not in _BREAKPOINT_BLOCKS:
        return messages
    blocks[-1] = {**blocks[-1], "cache_control": EPHEMERAL}
    return [*messages[:-1], {**last, "content": blocks}]


def _fold_system_messages(messages: Sequence[Message]) -> list[Message]:
    """``system`` messages folded into the user turn before them, as user-text notices.

    For an endpoint that takes none: a history recorded with system notices (a session
    begun on the Messages API, resumed here) is still sent in a form it accepts.
    """
    folded: list[Message] = []
    for message in messages:
        if message.get("role") != "system":
            folded.append(message)
            continue
        notice = notice_as_user_text(joined_text(message.get("content"), "\n"))
        previous = folded[-1] if folded else None
        if previous is None or previous.get("role") != "user":
            folded.append({"role": "user", "content": notice.lstrip()})
            continue
        content = previous.get("content")
        if isinstance(content, str):
            folded[-1] = {**previous, "content": content + notice}
        else:
            blocks = list(content) if isinstance(content, list) else []
            folded[-1] = {**previous, "content": [*blocks, {"type": "text", "text": notice}]}
    return folded


@dataclass(frozen=True)
class ModelChoice:
    """The model an agent runs on and the effort it asks for (each role may have its own)."""

    model: str
    effort: str

    @classmethod
    def of(
        cls, settings: Settings, role: Role = "main", agent: AgentDefinition | None = None
    ) -> ModelChoice:
        """The role's settings, or where its agent definition names a model or an effort,
        that one."""
        model = agent.model if agent is not None and agent.model else settings.model_for(role)
        effort = agent.effort if agent is not None and agent.effort else settings.effort_for(role)
        return cls(model, effort)


@dataclass
class ModelGateway:
    """Sends requests for every agent of a session and keeps the session's usage."""

    settings: Settings
    credentials: Credentials
    events: EventBus = field(default_factory=EventBus)
    usage: TokenUsage = field(default_factory=TokenUsage)
    requests: int = 0
    #: Dollars for every request so far, from the price table (0 for an unpriced model).
    cost: float = 0.0
    #: The session's budget: requests reserve against it first and settle after.
    budget: SessionBudget | None = None
    #: False once the endpoint has refused the context-editing beta: not asked again;
    #: False from the start for a provider not known to take it.
    context_editing: bool = True
    _client: Client | None = None
    _limit: AdaptiveLimit | None = None

    def __post_init__(self) -> None:
        """Check the provider's access now (not on the first request), and say once what
        this provider makes orchmode do differently."""
        require_access(self.settings.provider, self.credentials)
        if not self.capabilities.context_editing:
            self.context_editing = False
        adaptations = self.capabilities.adaptations(self.settings)
        if adaptations:
            log.warning("%s: %s", self.capabilities.label, "; ".join(adaptations))

    @property
    def capabilities(self) -> Capabilities:
        """What the provider's endpoint is known to take."""
        return capabilities_of(self.settings.provider)

    @property
    def notices_in_user_text(self) -> bool:
        """Whether mode notices go in the user's turn: asked for, or the only way the
        provider takes them."""
        return self.settings.notice_delivery == "user-text" or not self.capabilities.system_messages

    @property
    def limit(self) -> AdaptiveLimit:
        """Requests in flight across every agent of the session, adapted to the API's load."""
        if self._limit is None:
            self._limit = AdaptiveLimit(self.settings.max_concurrent)
        return self._limit

    @property
    def client(self) -> Client:
        """The SDK client for the provider (see :func:`orchmode.model.providers.build_client`)."""
        if self._client is None:
            self._client = build_client(self.settings, self.credentials)
        return self._client

    @property
    def endpoint(self) -> str:
        return str(self.client.base_url).rstrip("/")

    async def complete(
        self,
        *,
        agent: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[Block],
        on_text: Callable[[str], None] | None = None,
        previous_message_id: str | None = None,
        on_send: Callable[[], None] | None = None,
        context_edits: Sequence[Block] | None = None,
        choice: ModelChoice | None = None,
    ) -> ModelReply:
        """Stream one response to the end and return it; raise an ``OrchmodeError`` on failure.

        ``choice`` is the model and effort of the agent's role (default: the main agent's).

        ``previous_message_id`` is the conversation's last response: the API then says why,
        if it could not reuse that request's cached prefix (recorded on the event).
        ``on_send`` is called once, just before the request first goes out: work started
        from it runs while the request is in flight, not ahead of it. ``context_edits``
        asks the API's context editing beta to make room; an endpoint that refuses the beta
        is sent the request again without it, and never again with it
        (:attr:`context_editing` turns false).
        """
        started = time.monotonic()
        choice = choice or ModelChoice.of(self.settings)
        reservation = None
        if self.budget is not None:
            reservation = await self.budget.before_request(system, messages, tools, choice.model)
        try:
            reply = await self._send(
                system,
                messages,
                tools,
                on_text,
                previous_message_id,
                on_send,
                context_edits,
                choice,
                agent,
            )
        except BaseException as exc:
            if self.budget is not None:
                await self.budget.after_request(reservation, TokenUsage(), choice.model)
            if isinstance(exc, Exception):
                self.events.emit(
                    ModelRequestFailed(
                        agent,
                        choice.model,
                        type(exc).__name__,
                        str(exc),
                        time.monotonic() - started,
                    )
                )
            raise
        price = self.settings.price(choice.model)
        cost = price.cost(reply.usage) if price else 0.0
        if self.budget is not None:
            await self.budget.after_request(reservation, reply.usage, choice.model)
        self.usage = self.usage + reply.usage
        self.cost += cost
        self.requests += 1
        self.events.emit(
            ModelRequestDone(
                agent=agent,
                message_id=reply.message_id,
                stop_reason=reply.stop_reason,
                usage=reply.usage,
                duration=time.monotonic() - started,
                cost=cost,
                cache_miss=reply.cache_miss,
                cache_missed_tokens=reply.cache_missed_tokens,
                model=choice.model,
                response_model=reply.model,
                retries=reply.retries,
            )
        )
        refusal = reply.refusal
        if refusal is not None:
            self.events.emit(replace(refusal, agent=agent))
        return reply

    async def _send(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[Block],
        on_text: Callable[[str], None] | None,
        previous_message_id: str | None,
        on_send: Callable[[], None] | None = None,
        context_edits: Sequence[Block] | None = None,
        choice: ModelChoice | None = None,
        agent: str = "main",
    ) -> ModelReply:
        """Send one request under the adaptive limit, retrying what is worth retrying.

        The SDK's own retries are off so that every 429 and 529 reaches the limit, which
        halves; a rate-limited request goes back to waiting, not started, for as long as
        ``overload_patience`` allows. A 5xx, a timeout or a lost connection is tried again
        up to ``max_retries`` times, and a stream that broke off part-way (safe: a request
        has no effect until its response is complete) up to ``stream_retries`` times. Waits
        grow exponentially with full jitter, so agents cut off together do not come back
        together. ``on_text`` sees a retried reply again from its start.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.settings.overload_patience
        overloads = failures = breaks = attempts = 0
        retry = ("", "")
        while True:
            started = await self.limit.acquire()
            if on_send is not None:
                on_send()  # runs once this task next waits: after the request is written
                on_send = None
            wait: float | None = None
            edits = context_edits if self.context_editing else None
            try:
                reply = await self._stream(
                    system,
                    messages,
                    tools,
                    on_text,
                    previous_message_id,
                    edits,
                    choice or ModelChoice.of(self.settings),
                )
            except _BetaRefused as exc:
                log.info("the endpoint refused context editing (%s); orchmode compacts itself", exc)
                self.context_editing = False
                wait = 0.0
                retry = ("context_editing_refused", str(exc))
            except Overloaded as exc:
                overloads += 1
                self.limit.overloaded(started)
                if loop.time() > give_up_at:
                    raise Overloaded(
                        f"{exc} — still refused after "
                        f"{self.settings.overload_patience:g} s of retrying"
                    ) from exc
                # The refused request waits as the API asked, out of the limit (it is not
                # started); the others go on, fewer at once.
                wait = _backoff(overloads) if exc.retry_after is None else exc.retry_after
                retry = ("overloaded", str(exc))
            except TransientFailure as exc:
                failures += 1
                if failures > self.settings.max_retries:
                    raise
                wait = _backoff(failures)
                retry = ("failed", str(exc))
            except StreamInterrupted as exc:
                breaks += 1
                if breaks > self.settings.stream_retries:
                    raise
                log.info("retrying a broken response stream (%s)", exc)
                wait = _backoff(breaks)
                retry = ("interrupted", str(exc))
            finally:
                self.limit.release()
            if wait is not None:
                attempts += 1
                self.events.emit(ModelRequestRetried(agent, retry[0], wait, attempts, retry[1]))
                await asyncio.sleep(wait)
                continue
            self.limit.succeeded()
            return replace(reply, retries=attempts)

    async def _stream(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[Block],
        on_text: Callable[[str], None] | None,
        previous_message_id: str | None,
        context_edits: Sequence[Block] | None,
        choice: ModelChoice,
    ) -> ModelReply:
        builder = _ReplyBuilder()
        caps = self.capabilities
        # Typed loosely: the platform clients' resources are the first-party ones re-bound,
        # which the SDK's own annotations do not express.
        client: Any = self.client
        try:
            create: Any = client.messages.create
            beta: dict[str, Any] = {}
            if context_edits:
                create = client.beta.messages.create
                beta = {
                    "betas": [CONTEXT_BETA],
                    "context_management": {"edits": list(context_edits)},
                }
            stream = await create(
                **beta,
                model=choice.model,
                max_tokens=self.settings.max_tokens,
                # The system prompt is its own cache breakpoint: every agent of a role sends
                # the same tools and system bytes first, so the wave shares that prefix.
                system=[{"type": "text", "text": system, "cache_control": EPHEMERAL}],
                messages=cast(Any, self._wire_messages(messages, breakpoint=True)),
                tools=cast(Any, list(tools)),
                **self._optional_fields(previous_message_id, choice.effort),
                timeout=self.settings.request_timeout,
                stream=True,
            )
            async with stream:
                async for event in stream:
                    text = builder.feed(event)
                    if text and on_text is not None:
                        on_text(text)
        except anthropic.AuthenticationError as exc:
            raise AuthError(
                f"{self._who} rejected the credentials ({exc.status_code}: "
                f"{_api_message(exc)}) — {caps.credentials_hint}"
            ) from exc
        except anthropic.PermissionDeniedError as exc:
            hint = (
                "check that the key may use this model"
                if self.settings.provider == "anthropic"
                else caps.credentials_hint
            )
            raise AuthError(
                f"{self._who} denied access ({exc.status_code}: {_api_message(exc)}) — {hint}"
            ) from exc
        except auth_failures(self.settings.provider) as exc:
            raise AuthError(
                f"the credentials for {caps.label} stopped working: {exc} — {caps.credentials_hint}"
            ) from exc
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            message_text = _api_message(exc)
            if status < 400:  # an `error` event in the middle of a successful stream
                raise StreamInterrupted(
                    f"the response stream from {self.endpoint} reported an error: {message_text}"
                ) from exc
            # Bedrock and Vertex say "no capacity now" with 503 (ServiceUnavailable), where
            # the Messages API says 529: both are waited out under overload_patience.
            platform_busy = status == 503 and self.settings.provider != "anthropic"
            if status in (429, 529) or platform_busy:
                raise Overloaded(
                    f"{self._who} is overloaded ({status}: {message_text})", _retry_after(exc)
                ) from exc
            if status >= 500 or status in (408, 409):
                raise TransientFailure(
                    f"the API kept failing ({status}: {message_text}) after "
                    f"{self.settings.max_retries} retries"
                ) from exc
            tokens = too_long_count(message_text)
            if tokens is not None or "prompt is too long" in message_text:
                raise PromptTooLong(
                    f"the API refused a request as too long ({status}): {message_text}", tokens
                ) from exc
            if context_edits and status == 400 and beta_is_the_problem(message_text):
                raise _BetaRefused(f"{status}: {message_text}") from exc
            raise ModelRequestError(
                f"the API rejected a request ({status}): {message_text}"
            ) from exc
        except anthropic.APITimeoutError as exc:
            raise TransientFailure(
                f"a request to {self.endpoint} timed out after {self.settings.request_timeout:g} s"
            ) from exc
        except anthropic.APIConnectionError as exc:
            where = "the Messages API" if self.settings.provider == "anthropic" else caps.label
            raise TransientFailure(
                f"cannot reach {where} at {self.endpoint} — {caps.endpoint_hint}"
            ) from exc
        except (anthropic.AnthropicError, httpx2.HTTPError) as exc:
            raise StreamInterrupted(
                f"the response stream from {self.endpoint} broke off: {exc or type(exc).__name__}"
            ) from exc

        missing = builder.missing()
        if missing is not None:
            raise StreamInterrupted(f"the response stream from {self.endpoint} ended {missing}")
        return builder.reply()

    @property
    def _who(self) -> str:
        return "the API" if self.settings.provider == "anthropic" else self.capabilities.label

    def _wire_messages(
        self, messages: Sequence[Message], *, breakpoint: bool = False
    ) -> list[Message]:
        """The messages as this provider takes them: system notices folded into the user
        turn where it takes none, and the prompt cache's breakpoint on the last message
        where top-level ``cache_control`` is not known to work."""
        caps = self.capabilities
        wire = list(messages) if caps.system_messages else _fold_system_messages(messages)
        if breakpoint and not caps.automatic_caching:
            wire = _with_breakpoint(wire)
        return wire

    def _optional_fields(self, previous_message_id: str | None, effort: str) -> dict[str, Any]:
        """The request fields only some providers take; the body version some require."""
        caps = self.capabilities
        fields: dict[str, Any] = {}
        if caps.effort:
            fields["output_config"] = {"effort": effort}
        if caps.automatic_caching:
            fields["cache_control"] = EPHEMERAL
        if caps.cache_diagnostics:
            fields["diagnostics"] = {"previous_message_id": previous_message_id}
        if caps.body_version is not None:
            fields["extra_body"] = {"anthropic_version": caps.body_version}
        return fields

    async def count_tokens(
        self,
        *,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[Block],
        context_edits: Sequence[Block] | None = None,
        model: str | None = None,
    ) -> int | None:
        """The API's own count of a request's input (after its context edits, if any), or
        None when it cannot say: counting is an aid, so no failure of it is an error."""
        if not self.capabilities.count_tokens:
            return None
        edits = context_edits if self.context_editing else None
        request: dict[str, Any] = {
            "model": model or self.settings.model,
            "system": [{"type": "text", "text": system}],
            "messages": cast(Any, self._wire_messages(messages)),
            "tools": cast(Any, list(tools)),
            "timeout": min(self.settings.request_timeout, 60.0),
        }
        if self.capabilities.body_version is not None:
            request["extra_body"] = {"anthropic_version": self.capabilities.body_version}
        client: Any = self.client
        failures: tuple[type[BaseException], ...] = (
            anthropic.AnthropicError,
            httpx2.HTTPError,
            *auth_failures(self.settings.provider),
        )
        try:
            if edits:
                counted: Any = await client.beta.messages.count_tokens(
                    **request,
                    betas=[CONTEXT_BETA],
                    context_management={"edits": cast(Any, list(edits))},
                )
            else:
                counted = await client.messages.count_tokens(**request)
        except failures as exc:
            log.info("could not count a request's tokens: %s", exc)
            return None
        tokens = getattr(counted, "input_tokens", None)
        return tokens if isinstance(tokens, int) else None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
