"""Typed events: what happened, emitted in one place and consumed by progress output and tests.

Events are small frozen dataclasses, declared once here: the store records them and reads
them back by these declarations (:mod:`orchmode.records.codec`), and the public list of events
is :data:`EVENTS`. A field's type says what a record must hold; a field with a default, or
marked :class:`Absent` (``Count``, ``Seconds``, ``Text``, ``Flag``), may be left out of a
record (one written before the field existed) and reads back as that value.

Subscribers are plain callables run synchronously in the event loop, so they must be quick
and must not raise (a raising subscriber is logged and ignored: a display bug never stops a
run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler

log = logging.getLogger("orchmode")

Role = Literal["main", "worker", "verifier", "resolver"]


@dataclass(frozen=True)
class Absent:
    """What a record that leaves a field out reads it as (older records, hand-written rows).

    The field is still required when an event is made; only reading a record back fills it.
    """

    value: object

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        """The field's schema, with this value when a record leaves it out (see records)."""
        from pydantic_core import core_schema  # only reading records needs pydantic

        return core_schema.with_default_schema(handler(source), default=self.value)


#: A count, duration, text or flag that a record may leave out: it reads back as zero.
Count = Annotated[int, Absent(0)]
Seconds = Annotated[float, Absent(0.0)]
Text = Annotated[str, Absent("")]
Flag = Annotated[bool, Absent(False)]


@dataclass(frozen=True)
class TokenUsage:
    """Tokens of one request or a sum of them, as the API bills them."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    #: Of ``cache_write_tokens``, those written to be kept an hour (billed at a higher rate).
    cache_write_1h_tokens: int = 0
    #: Uses of the API's server tools (``usage.server_tool_use``): searches are billed per use.
    web_search_requests: int = 0
    web_fetch_requests: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cache_write_1h_tokens + other.cache_write_1h_tokens,
            self.web_search_requests + other.web_search_requests,
            self.web_fetch_requests + other.web_fetch_requests,
        )

    @property
    def total_input(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def cache_hit(self) -> float:
        """The fraction of input tokens read from the prompt cache (0 with no input)."""
        total = self.total_input
        return self.cache_read_tokens / total if total else 0.0


@dataclass(frozen=True)
class ModelRequestDone:
    """One model request finished: whose, what it used and cost, and any cache miss."""

    agent: str
    message_id: Text
    stop_reason: Annotated[str | None, Absent(None)]
    usage: TokenUsage
    duration: Seconds
    cost: float = 0.0
    #: Why the prompt cache could not reuse the previous request's prefix (the API's
    #: diagnostics: messages_changed, system_changed, …), and how many tokens it missed.
    cache_miss: str | None = None
    cache_missed_tokens: int = 0
    #: The model asked for ("" in records made before roles could have their own).
    model: str = ""
    #: The model the response names (the API may answer with a dated version of it).
    response_model: str = ""
    #: How many times the request was tried before this answer (rate limits, 5xx, breaks).
    retries: int = 0
    #: Answered from a Message Batch, at half the price (``cost`` is what was paid).
    batched: bool = False


@dataclass(frozen=True)
class ModelRequestRetried:
    """A request is tried again after a wait: the API was overloaded or rate-limited
    (``overloaded``), failed (``failed``) or its stream broke off (``interrupted``)."""

    agent: str
    reason: str
    wait: Seconds
    attempt: Count
    detail: Text


@dataclass(frozen=True)
class ModelRefused:
    """The model declined to go on (stop reason ``refusal``): the API's ``stop_details``,
    its policy ``category`` and ``explanation`` (either may be empty: not every refusal
    names one)."""

    agent: str
    category: Text
    explanation: Text

    @property
    def text(self) -> str:
        """``refused by the model (cyber): <explanation>``, as the user and the agent see it."""
        line = "refused by the model" + (f" ({self.category})" if self.category else "")
        return f"{line}: {self.explanation}" if self.explanation else line


@dataclass(frozen=True)
class ModelRequestFailed:
    """A model request gave up: the error's kind (its exception's name) and message."""

    agent: str
    model: str
    error_type: str
    message: Text
    duration: Seconds


@dataclass(frozen=True)
class BashStarted:
    """A command began: the live view shows what each agent is running now."""

    agent: str
    command: str


@dataclass(frozen=True)
class BashDone:
    """A command ended: its exit code (None if it was cut off), time and sandbox."""

    agent: str
    command: str
    exit_code: Annotated[int | None, Absent(None)]
    timed_out: Flag
    duration: Seconds
    #: The sandbox the command ran in: ``workspace-write``, ``read-only`` or ``off``.
    sandbox: Text


@dataclass(frozen=True)
class McpCallStarted:
    """An agent called a tool of one of the user's MCP servers."""

    agent: str
    server: str
    tool: str


@dataclass(frozen=True)
class McpCallDone:
    """An MCP tool call returned, or failed; ``error`` says how."""

    agent: str
    server: str
    tool: str
    duration: Seconds
    ok: Flag
    #: The error in a few words (secrets masked) when it failed.
    error: str = ""


@dataclass(frozen=True)
class McpServerFailed:
    """An MCP server could not start or stopped answering: said once per server."""

    server: str
    message: str


@dataclass(frozen=True)
class NetworkConnection:
    """A sandboxed command's connection through the filtering proxy, once it is over: where
    it went, what the rules decided (and which rule), and the bytes each way."""

    agent: str
    #: The name asked for (or the address, when a command named one).
    domain: str
    port: int
    #: ``allowed``, ``denied``, ``approved`` (an ``ask`` answered yes) or ``failed`` (allowed,
    #: but the destination could not be reached).
    decision: str
    #: The rule that decided, as written, and where it came from; empty for the default.
    rule: Text
    bytes_sent: Count
    bytes_received: Count
    duration: Seconds


@dataclass(frozen=True)
class ApprovalRequested:
    """An agent needs the user's answer (an ``ask`` rule matched): it is parked, not failed."""

    id: int
    agent: str
    #: ``command``, ``domain`` or ``mcp``.
    kind: str
    #: What it wants to do: the command, ``domain:port``, or ``server/tool``.
    what: str
    #: Why it asks: the rule that matched, and where it came from.
    why: str


@dataclass(frozen=True)
class ApprovalAnswered:
    """An approval was answered (or timed out): the parked agent goes on."""

    id: int
    agent: str
    #: ``approved``, ``denied`` or ``timed out``.
    answer: str
    #: Whether the answer was remembered as a rule for this directory (``--always``).
    always: Flag
    reason: Text


@dataclass(frozen=True)
class FanoutStarted:
    """A Workflow call fanned out ``subtasks``; ``not_run`` were over the per-call limit."""

    call: int
    subtasks: Count
    not_run: Count
    #: ``3.2`` when worker 2 of call 3 made this call (a nested fan-out); "" when the
    #: main agent did. Calls are numbered across the session, nested ones included.
    parent: str = ""
    #: How deep its agents are: 1 for the main agent's subagents, 2 for theirs, …
    depth: int = 1


@dataclass(frozen=True)
class SubagentStarted:
    """A worker or verifier of a Workflow call began."""

    call: int
    index: int
    role: Role
    title: Text
    prompt: str = ""
    #: The Ray node it runs on; empty when it runs in the user's own process.
    node: str = ""


@dataclass(frozen=True)
class SubagentDone:
    """A worker or verifier ended: how, what it used, its verdict and report file."""

    call: int
    index: int
    role: Role
    status: str
    turns: Count
    usage: Annotated[TokenUsage, Absent(TokenUsage())]
    duration: Seconds
    from_journal: bool = False
    verdict: str | None = None
    result: str = ""
    #: Dollars for this subagent's own requests (0 for a journal hit: nothing was asked).
    cost: float = 0.0
    #: The Ray node it ran on; empty when it ran in the user's own process.
    node: str = ""
    #: The file holding its full result (see :mod:`orchmode.store.result_files`); empty if none.
    report_path: str = ""


@dataclass(frozen=True)
class FanoutDone:
    """A Workflow call's fan-out ended, verifications included."""

    call: int
    duration: Seconds


@dataclass(frozen=True)
class BudgetStatus:
    """The session's budget as a Workflow call ended it (the line its tool result ends with)."""

    line: str
    #: subagents the session may still launch under ``max_subagents``
    subagents_left: Count


@dataclass(frozen=True)
class TurnStarted:
    """A user turn, with the mode notices that went out with it."""

    text: str
    notices: Annotated[tuple[str, ...], Absent(())]
    #: Which turn of the session it is, from 1 (0 in records made before it was kept).
    number: int = 0


@dataclass(frozen=True)
class TurnResumed:
    """An interrupted turn goes on from its last recorded step (``orchmode resume``)."""

    number: Count


@dataclass(frozen=True)
class TurnDone:
    """A user turn ended: why (``stop``) and after how many model calls."""

    stop: str
    model_calls: Count


@dataclass(frozen=True)
class ScriptStarted:
    """A Workflow call ran an orchestration script; its agents follow as Subagent events."""

    call: int
    lines: Count
    #: As :class:`FanoutStarted`'s: the worker that ran the script ("" for the main
    #: agent), and how deep the script's agents are.
    parent: str = ""
    depth: int = 1


@dataclass(frozen=True)
class ScriptDone:
    """A Workflow call's script ended: how long it took, how many agents, and any error."""

    call: int
    duration: Seconds
    #: agents the script asked for, journal hits included
    agents: Count
    #: the first line of the error the model was shown, if the script failed
    error: str | None = None


@dataclass(frozen=True)
class ContextCompacted:
    """A conversation was made smaller so that its next request fits the context window."""

    agent: str
    #: ``stubbed``: the harness replaced old tool results with stubs naming their saved
    #: copies; ``api``: the API's context editing cleared old tool results itself;
    #: ``dropped``: nothing more could be stubbed, so the turn's unfittable part was let go.
    how: str
    tokens_before: Count
    tokens_after: Count
    #: What was condensed or stubbed, in a few words ("14 tool results, 61,200 tokens").
    detail: str = ""
    #: Set when a request refused as too long caused it (the request is then retried).
    refused: bool = False


@dataclass(frozen=True)
class ResultCondensed:
    """A Workflow result over its token budget reached the model condensed."""

    call: int
    tokens_full: Count
    tokens_shown: Count
    budget: Count
    #: What was left out, e.g. "31 low and 12 info findings not shown".
    omitted: Text
    #: Where the whole result is saved (every agent's report is a file beside it).
    path: Text


@dataclass(frozen=True)
class ChangeSettled:
    """What became of one worker's change to its copy of the tree (``worktree`` isolation)."""

    call: int
    index: int
    #: ``merged``, ``conflict``, ``refused``, ``not merged`` or ``kept`` (``merge = none``).
    fate: str
    #: e.g. "2 files (+10 −2): src/a.py (+8 −2), b.py (+2 −0)".
    files: Text
    added: Count
    removed: Count
    #: The conflicting files, the refusal's reasons, or why it was not merged.
    detail: str = ""
    #: Where the patch is kept ("" when none was saved).
    path: str = ""
    #: Files left out of the change as too big for a patch, with sizes and the limit.
    left_out: str = ""


@dataclass(frozen=True)
class WorkspacesChosen:
    """What agents' workspaces are here (``worktree`` isolation), said once per session."""

    #: True: copy-on-write overlays on one checkout of the tree; False: full copies.
    overlays: Flag
    #: Why full copies: what refused the overlays. Empty for overlays.
    reason: str = ""


@dataclass(frozen=True)
class BatchSent:
    """A Message Batch was created: its id and how many agent turns it holds."""

    batch_id: str
    requests: Count


@dataclass(frozen=True)
class BatchEnded:
    """A Message Batch ended: its results by outcome, and how long it was watched."""

    batch_id: str
    succeeded: Count
    errored: Count
    expired: Count
    canceled: Count
    duration: Seconds

    @property
    def requests(self) -> int:
        return self.succeeded + self.errored + self.expired + self.canceled


@dataclass(frozen=True)
class BatchWaiting:
    """An agent's turn waits on a Message Batch for its answer (until its request is done)."""

    agent: str
    batch_id: str


Event = (
    ModelRequestDone
    | ModelRequestRetried
    | ModelRefused
    | ModelRequestFailed
    | BashStarted
    | BashDone
    | McpCallStarted
    | McpCallDone
    | McpServerFailed
    | NetworkConnection
    | ApprovalRequested
    | ApprovalAnswered
    | FanoutStarted
    | SubagentStarted
    | SubagentDone
    | FanoutDone
    | BudgetStatus
    | TurnStarted
    | TurnResumed
    | TurnDone
    | ScriptStarted
    | ScriptDone
    | ContextCompacted
    | ResultCondensed
    | ChangeSettled
    | WorkspacesChosen
    | BatchSent
    | BatchEnded
    | BatchWaiting
)

#: Every kind of event, in the order of :data:`Event`: what the store records and reads back,
#: and what ``orchmode`` exports.
EVENTS: tuple[type[Event], ...] = get_args(Event)

Subscriber = Callable[[Event], None]


@dataclass
class EventBus:
    subscribers: list[Subscriber] = field(default_factory=list)
    #: Masks the session's secrets in an event's texts before anyone sees it: the live
    #: view, the journal's records, the traces.
    mask: Callable[[Event], Event] | None = None

    def subscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.append(subscriber)

    def emit(self, event: Event) -> None:
        if self.mask is not None:
            event = self.mask(event)
        for subscriber in self.subscribers:
            try:
                subscriber(event)
            except Exception:  # a display bug must never stop a run
                log.exception("event subscriber failed on %s", type(event).__name__)
