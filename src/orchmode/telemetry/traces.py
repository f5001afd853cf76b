"""OpenTelemetry traces of a session, made from its events.

Every span is made here, from the events the rest of orchmode already emits, so no module
that runs agents knows about tracing; with tracing off the OpenTelemetry SDK and its
exporter are never imported (the ``anthropic`` SDK itself imports the small API package).
The spans follow the GenAI semantic conventions:

- ``invoke_agent main``: one user turn, a trace of its own, linked to the session by
  ``session.id``; a resumed turn is a new trace with a link to the interrupted one;
- ``execute_tool Workflow``: one Workflow call, a flat fan-out or a script; each change it
  settled is an ``orchmode.merge`` span; a call a worker made (a nested call) is a child of
  that worker's span, so the trace is the tree of agents (each agent's span carries its own
  cost, ``orchmode.cost_usd``: a subtree's is the sum over its spans);
- ``invoke_agent <role> <call>.<index>``: each subagent, in its Workflow call;
- ``chat <model>``: each model request, in its agent; retries as span events;
- ``execute_tool bash`` and ``execute_tool mcp__<server>__<tool>``: each tool call;
- ``connect <domain>``: each connection a sandboxed command made through the network proxy,
  in its agent, with the rules' decision and the bytes each way;
- ``orchmode.approval <id>``: an agent parked on a question to the user, from the request
  to its answer.

A span that ends with a ``…Done`` event is given its start as the event's time less its
duration, so spans of agents on a Ray cluster, whose events come back here, take their
places in the driver's trace as if made where they ran. Prompts, replies and command
output go in only with ``trace_content``, and the session's secrets are masked in them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from ..core.events import (
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BatchEnded,
    BatchSent,
    BatchWaiting,
    ChangeSettled,
    Event,
    FanoutDone,
    FanoutStarted,
    McpCallDone,
    McpCallStarted,
    ModelRequestDone,
    ModelRequestFailed,
    ModelRequestRetried,
    NetworkConnection,
    ScriptDone,
    ScriptStarted,
    SubagentDone,
    SubagentStarted,
    TurnDone,
    TurnResumed,
    TurnStarted,
)
from ..core.secrets import Masker
from ..core.settings import Settings
from .ids import TurnIds, turn_ids

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

#: A span's attributes, as OpenTelemetry takes them.
Attributes: TypeAlias = "dict[str, AttributeValue]"

#: ``gen_ai.provider.name`` for each of orchmode's providers.
PROVIDERS = {"anthropic": "anthropic", "bedrock": "aws.bedrock", "vertex": "gcp.vertex_ai"}
#: Characters of a prompt, reply or output put in a span with ``trace_content``.
CONTENT_LIMIT = 8000


@dataclass
class Traces:
    """Turns a session's events into spans: subscribe it to the session's events."""

    provider: TracerProvider
    settings: Settings
    secrets: Iterable[str] = ()
    #: On the turns' and agents' spans: the session they belong to.
    session_id: str = ""
    tracer: Tracer = field(init=False, repr=False)
    #: Where a turn's own IDs are planned (set by :func:`.tracing.start_tracing`).
    ids: TurnIds | None = field(default=None, init=False, repr=False)
    _turn: Span | None = field(default=None, init=False, repr=False)
    _calls: dict[int, Span] = field(default_factory=dict, init=False, repr=False)
    #: Each running subagent's span, by the name its requests and commands carry.
    _agents: dict[str, Span] = field(default_factory=dict, init=False, repr=False)
    #: Each agent's MCP call in flight.
    _tools: dict[str, Span] = field(default_factory=dict, init=False, repr=False)
    #: Each parked agent's wait for the user's answer, by the approval's id.
    _waits: dict[int, Span] = field(default_factory=dict, init=False, repr=False)
    #: Each Message Batch not yet ended, and the batch each agent's request waits on.
    _batches: dict[str, Span] = field(default_factory=dict, init=False, repr=False)
    _batch_of: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    #: Retries of each agent's request in flight, until the request's span is made.
    _retries: dict[str, list[tuple[int, ModelRequestRetried]]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self.tracer = self.provider.get_tracer("orchmode")
        self._masker = Masker()
        self.hide(self.secrets)

    def hide(self, secrets: Iterable[str]) -> None:
        """Mask these too in what spans hold (an MCP server's keys, known once it is read;
        the session's event bus has masked every other secret before an event comes)."""
        self._masker.add(s for s in secrets if len(s) >= 8)

    # ------------------------------------------------------------------ events

    def __call__(self, event: Event) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def close(self) -> None:
        """End what is still open (an interrupted turn) and send every span."""
        now = time.time_ns()
        open_spans = [
            *self._waits.values(),
            *self._tools.values(),
            *self._agents.values(),
            *self._batches.values(),
        ]
        for span in [*open_spans, *self._calls.values()]:
            span.set_attribute("orchmode.interrupted", True)
            span.end(now)
        if self._turn is not None:
            self._turn.set_attribute("orchmode.interrupted", True)
            self._turn.end(now)
        self._waits.clear()
        self._batches.clear()
        self._tools.clear()
        self._agents.clear()
        self._calls.clear()
        self._turn = None
        self.provider.shutdown()  # flushes the batch processor first

    def _turn_started(self, event: TurnStarted) -> None:
        if self.ids is not None and event.number and self.session_id:
            self.ids.planned = turn_ids(self.session_id, event.number)
        self._begin_turn(
            event.number,
            {"orchmode.notices": list(event.notices)},
            {"orchmode.user_text": event.text},
        )

    def _turn_resumed(self, event: TurnResumed) -> None:
        """A new trace, linked to the trace of the turn as it was first run."""
        from opentelemetry.trace import Link, SpanContext, TraceFlags

        links = []
        attributes: Attributes = {"orchmode.resumed": True}
        if event.number and self.session_id:
            trace_id, span_id = turn_ids(self.session_id, event.number)
            first = SpanContext(trace_id, span_id, True, TraceFlags(TraceFlags.SAMPLED))
            links.append(Link(first, {"orchmode.link": "resumes"}))
            # Also as attributes: some backends (Phoenix) keep no links.
            attributes["orchmode.resumes.trace_id"] = f"{trace_id:032x}"
            attributes["orchmode.resumes.span_id"] = f"{span_id:016x}"
        self._begin_turn(event.number, attributes, {}, links)

    def _begin_turn(
        self,
        number: int,
        attributes: Attributes,
        content: dict[str, str],
        links: list[Any] | None = None,
    ) -> None:
        from opentelemetry.context import Context

        if self._turn is not None:
            self._turn.end()
        self._turn = self._start(
            "invoke_agent main",
            None,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "main",
                "gen_ai.request.model": self.settings.model,
                "orchmode.role": "main",
                "orchmode.turn": number,
                "orchmode.sandbox": self.settings.sandbox,
                **attributes,
            },
            content=content,
            context=Context(),  # a new trace for every turn
            links=links,
            labelled=True,
        )

    def _turn_done(self, event: TurnDone) -> None:
        if self._turn is None:
            return
        self._turn.set_attribute("orchmode.stop", event.stop)
        self._turn.set_attribute("orchmode.model_calls", event.model_calls)
        self._turn.end()
        self._turn = None

    def _call_started(self, event: FanoutStarted | ScriptStarted) -> None:
        attributes: Attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "Workflow",
            "orchmode.workflow.call": event.call,
        }
        parent = self._turn
        if isinstance(event, FanoutStarted):
            attributes["orchmode.workflow.form"] = "subtasks"
            attributes["orchmode.workflow.subtasks"] = event.subtasks
            attributes["orchmode.workflow.not_run"] = event.not_run
        else:
            attributes["orchmode.workflow.form"] = "script"
            attributes["orchmode.script.lines"] = event.lines
        if event.parent:  # a worker's own call: under that worker's span
            attributes["orchmode.workflow.parent"] = event.parent
            attributes["orchmode.depth"] = event.depth
            parent = self._agents.get(f"worker {event.parent}", self._turn)
        self._calls[event.call] = self._start("execute_tool Workflow", parent, attributes)

    def _call_done(self, event: FanoutDone | ScriptDone) -> None:
        span = self._calls.pop(event.call, None)
        if span is None:
            return
        if isinstance(event, ScriptDone):
            span.set_attribute("orchmode.script.agents", event.agents)
            if event.error:
                self._fail(span, "ScriptError", event.error)
        span.end()

    def _subagent_started(self, event: SubagentStarted) -> None:
        name = f"{event.role} {event.call}.{event.index}"
        parent = self._calls.get(event.call, self._turn)
        self._agents[name] = self._start(
            f"invoke_agent {name}",
            parent,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": name,
                "orchmode.role": event.role,
                "orchmode.workflow.call": event.call,
                "orchmode.subtask.index": event.index,
                **({"orchmode.node": event.node} if event.node else {}),
            },
            content={"orchmode.subtask.title": event.title, "orchmode.prompt": event.prompt},
            labelled=True,
        )

    def _subagent_done(self, event: SubagentDone) -> None:
        span = self._agents.pop(f"{event.role} {event.call}.{event.index}", None)
        if span is None:
            return
        span.set_attributes(
            {
                "orchmode.status": event.status,
                "orchmode.turns": event.turns,
                "orchmode.journal_hit": event.from_journal,
                "orchmode.cost_usd": event.cost,
                "gen_ai.usage.input_tokens": event.usage.total_input,
                "gen_ai.usage.output_tokens": event.usage.output_tokens,
            }
        )
        if event.verdict is not None:
            span.set_attribute("orchmode.verdict", event.verdict)
        if event.node:
            span.set_attribute("orchmode.node", event.node)
        self._content(span, {"orchmode.result": event.result})
        if event.status == "failed":
            self._fail(span, "SubagentFailed", event.result[:500])
        span.end()

    def _request_done(self, event: ModelRequestDone) -> None:
        end = time.time_ns()
        usage = event.usage
        model = event.model or self.settings.model
        span = self._start(
            f"chat {model}",
            self._agent(event.agent),
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDERS.get(self.settings.provider, "anthropic"),
                "gen_ai.request.model": model,
                "gen_ai.response.model": event.response_model or model,
                "gen_ai.response.id": event.message_id,
                "gen_ai.response.finish_reasons": [event.stop_reason or ""],
                # The conventions count every input token, cached or not, in input_tokens.
                "gen_ai.usage.input_tokens": usage.total_input,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cache_read_tokens,
                "gen_ai.usage.cache_creation.input_tokens": usage.cache_write_tokens,
                "orchmode.cost_usd": event.cost,
            },
            start=end - int(event.duration * 1e9),
            kind="client",
        )
        span.set_attribute("orchmode.batched", event.batched)
        batch_id = self._batch_of.pop(event.agent, None)
        if event.batched and batch_id is not None:
            span.set_attribute("orchmode.batch.id", batch_id)
        if event.retries:
            span.set_attribute("orchmode.retries", event.retries)
        if usage.web_search_requests or usage.web_fetch_requests:  # a search is billed per use
            span.set_attribute("orchmode.web_search_requests", usage.web_search_requests)
            span.set_attribute("orchmode.web_fetch_requests", usage.web_fetch_requests)
        if event.cache_miss:
            span.set_attribute("orchmode.cache_miss", event.cache_miss)
        self._add_retries(span, event.agent)
        span.end(end)

    def _batch(self, batch_id: str) -> Span:
        """A batch's span, from when it was sent (or, sent by an earlier run, first waited on)."""
        span = self._batches.get(batch_id)
        if span is None:
            attributes: Attributes = {"orchmode.batch.id": batch_id}
            span = self._batches[batch_id] = self._start(
                f"batch {batch_id}", self._turn, attributes
            )
        return span

    def _batch_sent(self, event: BatchSent) -> None:
        self._batch(event.batch_id).set_attribute("orchmode.batch.requests", event.requests)

    def _batch_waiting(self, event: BatchWaiting) -> None:
        self._batch_of[event.agent] = event.batch_id
        span = self._batch(event.batch_id)
        span.add_event("agent waiting", {"gen_ai.agent.name": event.agent})

    def _batch_ended(self, event: BatchEnded) -> None:
        span = self._batch(event.batch_id)
        del self._batches[event.batch_id]
        span.set_attributes(
            {
                "orchmode.batch.succeeded": event.succeeded,
                "orchmode.batch.errored": event.errored,
                "orchmode.batch.expired": event.expired,
                "orchmode.batch.canceled": event.canceled,
            }
        )
        span.end()

    def _request_failed(self, event: ModelRequestFailed) -> None:
        end = time.time_ns()
        span = self._start(
            f"chat {event.model}",
            self._agent(event.agent),
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDERS.get(self.settings.provider, "anthropic"),
                "gen_ai.request.model": event.model,
            },
            start=end - int(event.duration * 1e9),
            kind="client",
        )
        self._add_retries(span, event.agent)
        self._fail(span, event.error_type, event.message)
        span.end(end)

    def _request_retried(self, event: ModelRequestRetried) -> None:
        self._retries.setdefault(event.agent, []).append((time.time_ns(), event))

    def _bash_done(self, event: BashDone) -> None:
        end = time.time_ns()
        span = self._start(
            "execute_tool bash",
            self._agent(event.agent),
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "bash",
                "orchmode.bash.command": self._mask(event.command)[:CONTENT_LIMIT],
                "orchmode.bash.exit_code": -1 if event.exit_code is None else event.exit_code,
            },
            start=end - int(event.duration * 1e9),
        )
        if event.timed_out:
            span.set_attribute("orchmode.bash.timed_out", True)
            self._fail(span, "TimeoutError", "the command ran past its time limit")
        span.end(end)

    def _mcp_started(self, event: McpCallStarted) -> None:
        """Begun when the call is, so the call can carry its ``traceparent``."""
        self._tools[event.agent] = self._start(
            f"execute_tool mcp__{event.server}__{event.tool}",
            self._agent(event.agent),
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": f"mcp__{event.server}__{event.tool}",
                "orchmode.mcp.server": event.server,
                "orchmode.mcp.tool": event.tool,
            },
        )

    def _mcp_done(self, event: McpCallDone) -> None:
        span = self._tools.pop(event.agent, None)
        if span is None:
            return
        if not event.ok:
            self._fail(span, "McpToolError", event.error)
        span.end()

    def _connection(self, event: NetworkConnection) -> None:
        """A connection through the proxy, once it is over: where, what decided, bytes."""
        end = time.time_ns()
        domain = self._mask(event.domain)[:CONTENT_LIMIT]
        span = self._start(
            f"connect {domain}",
            self._agent(event.agent),
            {
                "server.address": domain,
                "server.port": event.port,
                "orchmode.network.decision": event.decision,
                "orchmode.network.rule": self._mask(event.rule)[:CONTENT_LIMIT],
                "orchmode.network.bytes_sent": event.bytes_sent,
                "orchmode.network.bytes_received": event.bytes_received,
            },
            start=end - int(event.duration * 1e9),
            kind="client",
        )
        if event.decision == "denied":
            self._fail(span, "NetworkDenied", f"refused: {event.rule or 'no rule names it'}")
        elif event.decision == "failed":
            self._fail(span, "ConnectionFailed", "the destination could not be reached")
        span.end(end)

    def _approval_requested(self, event: ApprovalRequested) -> None:
        """Begun when the agent is parked; ended by the answer (or the run's end)."""
        if event.id in self._waits:  # a resumed run asking again: the wait goes on
            return
        self._waits[event.id] = self._start(
            f"orchmode.approval {event.id}",
            self._agent(event.agent),
            {
                "orchmode.approval.id": event.id,
                "orchmode.approval.kind": event.kind,
                "orchmode.approval.what": self._mask(event.what)[:CONTENT_LIMIT],
                "orchmode.approval.why": self._mask(event.why)[:CONTENT_LIMIT],
            },
        )

    def _approval_answered(self, event: ApprovalAnswered) -> None:
        span = self._waits.pop(event.id, None)
        if span is None:
            return
        span.set_attribute("orchmode.approval.answer", event.answer)
        span.set_attribute("orchmode.approval.always", event.always)
        self._content(span, {"orchmode.approval.reason": event.reason})
        span.end()

    def traceparent(self, agent: str) -> str | None:
        """The W3C ``traceparent`` of ``agent``'s MCP call in flight, if tracing sampled it."""
        span = self._tools.get(agent)
        if span is None:
            return None
        context = span.get_span_context()
        if not context.is_valid:
            return None
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

    def _change_settled(self, event: ChangeSettled) -> None:
        span = self._start(
            "orchmode.merge",
            self._calls.get(event.call, self._turn),
            {
                "orchmode.workflow.call": event.call,
                "orchmode.subtask.index": event.index,
                "orchmode.change": event.fate,
                "orchmode.change.files": event.files,
                "orchmode.change.added": event.added,
                "orchmode.change.removed": event.removed,
            },
        )
        span.end()

    # ------------------------------------------------------------------ helpers

    def _agent(self, name: str) -> Span | None:
        """The span a request or command of agent ``name`` belongs in."""
        return self._agents.get(name) or self._turn

    def _start(
        self,
        name: str,
        parent: Span | None,
        attributes: Attributes,
        *,
        content: dict[str, str] | None = None,
        start: int | None = None,
        kind: str = "internal",
        context: Any = None,
        links: list[Any] | None = None,
        labelled: bool = False,
    ) -> Span:
        from opentelemetry.trace import SpanKind, set_span_in_context

        if context is None and parent is not None:
            context = set_span_in_context(parent)
        if labelled:
            # On the turns and agents, not on each request and command in them: a
            # backend finds those through their parents, and every attribute costs.
            attributes = {"session.id": self.session_id, **attributes}
        span = self.tracer.start_span(
            name,
            context=context,
            kind=SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
            links=links,
        )
        if content:
            self._content(span, content)
        return span

    def _content(self, span: Span, values: dict[str, str]) -> None:
        """Texts a span holds only with ``trace_content``, secrets masked, capped."""
        if not self.settings.trace_content:
            return
        for key, value in values.items():
            if value:
                span.set_attribute(key, self._mask(value)[:CONTENT_LIMIT])

    def _mask(self, text: str) -> str:
        return self._masker.mask(text)

    def _add_retries(self, span: Span, agent: str) -> None:
        for at, retried in self._retries.pop(agent, []):
            span.add_event(
                "orchmode.retry",
                {
                    "orchmode.retry.reason": retried.reason,
                    "orchmode.retry.wait_s": retried.wait,
                    "orchmode.retry.attempt": retried.attempt,
                },
                timestamp=at,
            )

    def _fail(self, span: Span, error_type: str, message: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, self._mask(message)[:500]))


_HANDLERS: dict[type[Any], Any] = {
    TurnStarted: Traces._turn_started,
    TurnResumed: Traces._turn_resumed,
    TurnDone: Traces._turn_done,
    FanoutStarted: Traces._call_started,
    ScriptStarted: Traces._call_started,
    FanoutDone: Traces._call_done,
    ScriptDone: Traces._call_done,
    SubagentStarted: Traces._subagent_started,
    SubagentDone: Traces._subagent_done,
    ModelRequestDone: Traces._request_done,
    ModelRequestFailed: Traces._request_failed,
    ModelRequestRetried: Traces._request_retried,
    BatchSent: Traces._batch_sent,
    BatchWaiting: Traces._batch_waiting,
    BatchEnded: Traces._batch_ended,
    BashDone: Traces._bash_done,
    McpCallStarted: Traces._mcp_started,
    McpCallDone: Traces._mcp_done,
    ChangeSettled: Traces._change_settled,
    NetworkConnection: Traces._connection,
    ApprovalRequested: Traces._approval_requested,
    ApprovalAnswered: Traces._approval_answered,
}
