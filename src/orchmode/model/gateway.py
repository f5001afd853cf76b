"""The only code that talks to the Messages API: streaming, effort, prompt caching, usage.

Every request carries ``output_config.effort``, the per-request timeout and top-level
automatic prompt caching, so a multi-turn loop reads its growing prefix from the cache.
SDK and transport errors reach the loops above as :mod:`orchmode.core.errors` exceptions
(:mod:`orchmode.model.failures`), never as an HTTP library's. On Amazon Bedrock and Google
Vertex AI what the endpoint is not known to take is left out or sent in a form it does take
(:mod:`orchmode.model.request_form`), and the gateway says so once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import anthropic
import httpx2

from ..core.errors import Overloaded, StreamInterrupted, TransientFailure
from ..core.events import (
    BatchEnded,
    BatchSent,
    BatchWaiting,
    EventBus,
    ModelRequestDone,
    ModelRequestFailed,
    ModelRequestRetried,
    Role,
    TokenUsage,
)
from ..core.settings import Settings
from ..core.web_tools import most_searches
from ..core.wire import ContextEdit, Message, ToolSchema
from .allowance import ALLOWANCE, Hold
from .batches import BatchDesk
from .budget import Reservation, estimate_input_tokens
from .failures import BetaRefused, FailureWords, refused_in_batch
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
from .reply import ModelReply, ReplyBuilder, reply_of_message
from .request_form import (
    CONTEXT_BETA,
    EPHEMERAL,
    HOUR_BREAKPOINT,
    optional_fields,
    wire_messages,
)
from .retries import Retries, Retry

if TYPE_CHECKING:
    from ..core.agents import AgentDefinition
    from ..store import Store
    from .budget import SessionBudget

log = logging.getLogger("orchmode")


@dataclass(frozen=True)
class _Request:
    """What one call to :meth:`ModelGateway.complete` asks for, sent again as it is on a retry."""

    system: str
    messages: Sequence[Message]
    tools: Sequence[ToolSchema]
    on_text: Callable[[str], None] | None
    previous_message_id: str | None
    context_edits: Sequence[ContextEdit] | None


@dataclass(frozen=True)
class ModelChoice:
    """The model an agent runs on and the effort it asks for (each role may have its own)."""

    model: str
    effort: str
    #: Sent through the Message Batches API (see :mod:`orchmode.model.batches`).
    batched: bool = False
    #: The output a request may ask for, when the agent's budget leaves less than
    #: ``max_tokens`` (None: ``max_tokens`` of the settings).
    max_tokens: int | None = None

    @classmethod
    def of(
        cls, settings: Settings, role: Role = "main", agent: AgentDefinition | None = None
    ) -> ModelChoice:
        """The role's settings, or where its agent definition names a model or an effort,
        that one."""
        model = agent.model if agent is not None and agent.model else settings.model_for(role)
        effort = agent.effort if agent is not None and agent.effort else settings.effort_for(role)
        return cls(model, effort, settings.batched(role))


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
    #: Gathers batched agents' requests into Message Batches; None when batching is off.
    desk: BatchDesk | None = None
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
        tools: Sequence[ToolSchema],
        on_text: Callable[[str], None] | None = None,
        previous_message_id: str | None = None,
        on_send: Callable[[], None] | None = None,
        context_edits: Sequence[ContextEdit] | None = None,
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
        hold, reservation = await self._reserve(system, messages, tools, choice)
        if hold is not None:
            choice = replace(choice, max_tokens=hold.output_tokens)
        request = _Request(system, messages, tools, on_text, previous_message_id, context_edits)
        try:
            if choice.batched and self.desk is not None:
                reply = await self._through_batches(request, choice, agent, on_send)
            else:
                reply = await self._send(request, replace(choice, batched=False), agent, on_send)
        except BaseException as exc:
            await self._settle(hold, reservation, TokenUsage(), choice.model)
            if isinstance(exc, Exception):
                failed = ModelRequestFailed(
                    agent, choice.model, type(exc).__name__, str(exc), time.monotonic() - started
                )
                self.events.emit(failed)
            raise
        await self._settle(hold, reservation, reply.usage, choice.model, batched=reply.batched)
        self._account(reply, choice, agent, time.monotonic() - started)
        return reply

    async def _reserve(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        choice: ModelChoice,
    ) -> tuple[Hold | None, Reservation | None]:
        """Reserve the request's worst case on the running agent's allowance and every
        ancestor's (its output cut to what they leave room for), then on the session's
        budget; raise ``AllowanceSpent`` or ``BudgetExhausted`` instead when one cannot pay."""
        hold = None
        allowance = ALLOWANCE.get()
        if allowance is not None and allowance.limited:
            hold = await allowance.reserve(
                estimate_input_tokens(system, messages, tools),
                self.settings.max_tokens,
                self.settings.price(choice.model, batched=choice.batched),
                hour_writes=choice.batched,
                searches=most_searches(tools),
            )
        if self.budget is None:
            return hold, None
        try:
            reservation = await self.budget.before_request(
                system,
                messages,
                tools,
                choice.model,
                batched=choice.batched,
                output_tokens=hold.output_tokens if hold is not None else None,
            )
        except BaseException:
            if hold is not None:
                hold.settle(0, 0.0)
            raise
        return hold, reservation

    async def _settle(
        self,
        hold: Hold | None,
        reservation: Reservation | None,
        usage: TokenUsage,
        model: str,
        *,
        batched: bool = False,
    ) -> None:
        """Settle the allowances and the session's budget to what the request used."""
        if hold is not None:
            price = self.settings.price(model, batched=batched)
            cost = price.cost(usage) if price else 0.0
            hold.settle(usage.total_input + usage.output_tokens, cost)
        if self.budget is not None:
            await self.budget.after_request(reservation, usage, model, batched=batched)

    def _account(self, reply: ModelReply, choice: ModelChoice, agent: str, duration: float) -> None:
        """Add a finished request's usage and cost to the session's, and say so."""
        price = self.settings.price(choice.model, batched=reply.batched)
        cost = price.cost(reply.usage) if price else 0.0
        self.usage = self.usage + reply.usage
        self.cost += cost
        self.requests += 1
        self.events.emit(
            ModelRequestDone(
                agent=agent,
                message_id=reply.message_id,
                stop_reason=reply.stop_reason,
                usage=reply.usage,
                duration=duration,
                cost=cost,
                cache_miss=reply.cache_miss,
                cache_missed_tokens=reply.cache_missed_tokens,
                model=choice.model,
                response_model=reply.model,
                retries=reply.retries,
                batched=reply.batched,
            )
        )
        refusal = reply.refusal
        if refusal is not None:
            self.events.emit(replace(refusal, agent=agent))

    async def _send(
        self,
        request: _Request,
        choice: ModelChoice,
        agent: str,
        on_send: Callable[[], None] | None,
    ) -> ModelReply:
        """Send one request under the adaptive limit, retrying what is worth retrying
        (see :mod:`orchmode.model.retries`).

        The SDK's own retries are off so that every 429 and 529 reaches the limit, which
        halves; a rate-limited request goes back to waiting, not started. ``on_text`` sees
        a retried reply again from its start.
        """
        loop = asyncio.get_running_loop()
        retries = Retries(self.settings, loop.time() + self.settings.overload_patience)
        while True:
            started = await self.limit.acquire()
            if on_send is not None:
                on_send()  # runs once this task next waits: after the request is written
                on_send = None
            retry: Retry | None = None
            edits = request.context_edits if self.context_editing else None
            try:
                reply = await self._stream(
                    request.system,
                    request.messages,
                    request.tools,
                    request.on_text,
                    request.previous_message_id,
                    edits,
                    choice,
                )
            except BetaRefused as exc:
                log.info("the endpoint refused context editing (%s); orchmode compacts itself", exc)
                self.context_editing = False
                retry = Retry("context_editing_refused", 0.0, str(exc))
            except Overloaded as exc:
                self.limit.overloaded(started)
                retry = retries.after_overload(exc, loop.time())
            except (TransientFailure, StreamInterrupted) as exc:
                retry = retries.after_failure(exc)
            finally:
                self.limit.release()
            if retry is None:
                self.limit.succeeded()
                return replace(reply, retries=retries.attempts)
            retries.attempts += 1
            self.events.emit(
                ModelRequestRetried(agent, retry.kind, retry.wait, retries.attempts, retry.reason)
            )
            await asyncio.sleep(retry.wait)

    async def _stream(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        on_text: Callable[[str], None] | None,
        previous_message_id: str | None,
        context_edits: Sequence[ContextEdit] | None,
        choice: ModelChoice,
    ) -> ModelReply:
        builder = ReplyBuilder()
        # Typed loosely: the platform clients' resources are the first-party ones re-bound,
        # which the SDK's own annotations do not express.
        client: Any = self.client
        opened = False
        try:
            create: Any = client.messages.create
            beta: dict[str, object] = {}
            if context_edits:
                create = client.beta.messages.create
                beta = {
                    "betas": [CONTEXT_BETA],
                    "context_management": {"edits": list(context_edits)},
                }
            body = self._body(system, messages, tools, previous_message_id, choice)
            stream = await create(
                **beta, **body, timeout=self.settings.request_timeout, stream=True
            )
            opened = True
            async with stream:
                async for event in stream:
                    text = builder.feed(event)
                    if text and on_text is not None:
                        on_text(text)
        except Exception as exc:
            words = FailureWords(
                self.settings, self.capabilities, self.endpoint, bool(context_edits)
            )
            error = words.translate(exc, opened=opened)
            if error is None:
                raise
            raise error from exc
        missing = builder.missing()
        if missing is not None:
            raise StreamInterrupted(f"the response stream from {self.endpoint} ended {missing}")
        return builder.reply()

    def _body(
        self,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        previous_message_id: str | None,
        choice: ModelChoice,
    ) -> dict[str, Any]:
        """The request's body, as streamed or as one request of a batch."""
        # The system prompt is its own cache breakpoint: every agent of a role sends the same
        # tools and system bytes first, so the wave shares that prefix. A batched one keeps
        # it for an hour, past the wait for its batch.
        breakpoint = HOUR_BREAKPOINT if choice.batched else EPHEMERAL
        return {
            "model": choice.model,
            "max_tokens": choice.max_tokens or self.settings.max_tokens,
            "system": [{"type": "text", "text": system, "cache_control": breakpoint}],
            "messages": wire_messages(messages, self.capabilities, breakpoint=True),
            "tools": list(tools),
            **optional_fields(self.capabilities, previous_message_id, choice.effort),
        }

    async def _through_batches(
        self, request: _Request, choice: ModelChoice, agent: str, on_send: Callable[[], None] | None
    ) -> ModelReply:
        """A turn answered from a batch at half the price: asked again in a new batch when
        its result comes back errored, expired or canceled, and interactively once
        ``batch_timeout`` has passed."""
        assert self.desk is not None
        body = self._body(
            request.system, request.messages, request.tools, request.previous_message_id, choice
        )
        if on_send is not None:
            on_send()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.batch_timeout
        attempt = 0

        def waiting(batch_id: str) -> None:
            self.events.emit(BatchWaiting(agent, batch_id))

        while (left := deadline - loop.time()) > 0:
            try:
                result = await asyncio.wait_for(self.desk.ask(body, attempt, waiting), left)
            except TimeoutError:
                break
            if result.outcome == "succeeded" and result.message is not None:
                reply = reply_of_message(result.message)
                if request.on_text is not None and reply.text:
                    request.on_text(reply.text)
                return replace(reply, retries=attempt, batched=True)
            if result.error_type == "invalid_request_error":
                raise refused_in_batch(result.error)
            attempt += 1
            self.events.emit(
                ModelRequestRetried(agent, f"batch_{result.outcome}", 0.0, attempt, result.error)
            )
        self.events.emit(
            ModelRequestRetried(
                agent, "batch_timeout", 0.0, attempt + 1,
                f"no result from its batch in {self.settings.batch_timeout:g} s: asked at once",
            )
        )  # fmt: skip
        return await self._send(request, replace(choice, batched=False), agent, None)

    async def count_tokens(
        self,
        *,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSchema],
        context_edits: Sequence[ContextEdit] | None = None,
        model: str | None = None,
    ) -> int | None:
        """The API's own count of a request's input (after its context edits, if any), or
        None when it cannot say: counting is an aid, so no failure of it is an error."""
        if not self.capabilities.count_tokens:
            return None
        edits = context_edits if self.context_editing else None
        request: dict[str, object] = {
            "model": model or self.settings.model,
            "system": [{"type": "text", "text": system}],
            "messages": cast(Any, wire_messages(messages, self.capabilities)),
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

    async def cancel_batches(self) -> None:
        """Cancel the batches in flight (the run was interrupted): what they have not
        answered is not paid for, and a resume asks it again."""
        if self.desk is not None:
            await self.desk.cancel()

    async def close(self) -> None:
        if self.desk is not None:
            await self.desk.close()
        if self._client is not None:
            await self._client.close()
            self._client = None


def session_gateway(
    settings: Settings, credentials: Credentials, events: EventBus, store: Store, session: str
) -> ModelGateway:
    """A session's gateway: its requests reserved against the session's budget, and those
    the settings batch gathered into Message Batches."""
    from .budget import SessionBudget

    gateway = ModelGateway(settings, credentials, events)
    gateway.budget = SessionBudget(store, session, settings)
    if settings.batch != "off":
        batches = cast(Any, gateway.client).messages.batches
        gateway.desk = BatchDesk(
            store,
            session,
            batches,
            window=settings.batch_window,
            max_requests=settings.batch_max_requests,
            first_poll=settings.batch_poll,
            on_sent=lambda batch_id, requests: events.emit(BatchSent(batch_id, requests)),
            on_ended=lambda batch_id, counts, took: events.emit(_ended(batch_id, counts, took)),
        )
    return gateway


def _ended(batch_id: str, counts: dict[str, int], duration: float) -> BatchEnded:
    """The event of a batch that ended, from its counts by outcome."""
    return BatchEnded(
        batch_id,
        counts.get("succeeded", 0),
        counts.get("errored", 0),
        counts.get("expired", 0),
        counts.get("canceled", 0),
        duration,
    )
