"""Run history read back from recorded events: turns, their agents, commands and findings.

``orchmode runs``, ``orchmode show`` and the HTML report all draw from here. Everything is a
pure function of the store's rows, so a crashed or still-running session reads the same way
as a finished one. A row that cannot be understood (bad JSON, an unknown kind, a missing or
mistyped field) is skipped and counted, never fatal: an older or newer orchmode may have
written it, and one bad row must not hide the rest of a run.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ..core.events import (
    BashDone,
    BashStarted,
    BudgetStatus,
    ChangeSettled,
    ContextCompacted,
    Event,
    FanoutDone,
    FanoutStarted,
    McpCallDone,
    ModelRequestDone,
    ResultCondensed,
    Role,
    ScriptDone,
    ScriptStarted,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)
from ..core.prompts import SEVERITIES  # the order a reader wants; anything else sorts after
from ..store import EventRow
from .progress import CHANGE_STYLES, change_fate, compaction_text, condensed_text
from .totals import SessionTotals

#: Where an MCP call ran, in the report's sandbox column: not in the bash sandbox.
MCP_SANDBOX = "none: an MCP server, with your rights"

# --- reading rows -------------------------------------------------------------------------


class _Bad(Exception):
    """A row field is missing or has the wrong type."""


_REQUIRED: Any = object()


def _value(data: Mapping[str, Any], key: str, default: Any) -> Any:
    value = data.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _Bad(key)
        return default
    return value


def _int(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> int:
    value = _value(data, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(key)
    return value


def _float(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> float:
    value = _value(data, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(key)
    return float(value)


def _str(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> str:
    value = _value(data, key, default)
    if not isinstance(value, str):
        raise _Bad(key)
    return value


def _optional_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise _Bad(key)
    return value


def _bool(data: Mapping[str, Any], key: str) -> bool:
    value = _value(data, key, False)
    if not isinstance(value, bool):
        raise _Bad(key)
    return value


def _usage(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> TokenUsage:
    value = _value(data, key, default)
    if isinstance(value, TokenUsage):
        return value
    if not isinstance(value, dict):
        raise _Bad(key)
    return TokenUsage(
        input_tokens=_int(value, "input_tokens", 0),
        output_tokens=_int(value, "output_tokens", 0),
        cache_read_tokens=_int(value, "cache_read_tokens", 0),
        cache_write_tokens=_int(value, "cache_write_tokens", 0),
    )


def _role(data: Mapping[str, Any]) -> Role:
    value = data.get("role")
    if value == "worker":
        return "worker"
    if value == "verifier":
        return "verifier"
    raise _Bad("role")


def _notices(data: Mapping[str, Any]) -> tuple[str, ...]:
    value = _value(data, "notices", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad("notices")
    return tuple(value)


_PARSERS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    "TurnStarted": lambda d: TurnStarted(text=_str(d, "text"), notices=_notices(d)),
    "TurnDone": lambda d: TurnDone(stop=_str(d, "stop"), model_calls=_int(d, "model_calls", 0)),
    "ModelRequestDone": lambda d: ModelRequestDone(
        agent=_str(d, "agent"),
        message_id=_str(d, "message_id", ""),
        stop_reason=_optional_str(d, "stop_reason"),
        usage=_usage(d, "usage"),
        duration=_float(d, "duration", 0.0),
        cost=_float(d, "cost", 0.0),
        cache_miss=_optional_str(d, "cache_miss"),
        cache_missed_tokens=_int(d, "cache_missed_tokens", 0),
    ),
    "BudgetStatus": lambda d: BudgetStatus(
        line=_str(d, "line"), subagents_left=_int(d, "subagents_left", 0)
    ),
    "BashStarted": lambda d: BashStarted(agent=_str(d, "agent"), command=_str(d, "command")),
    "BashDone": lambda d: BashDone(
        agent=_str(d, "agent"),
        command=_str(d, "command"),
        exit_code=None if d.get("exit_code") is None else _int(d, "exit_code"),
        timed_out=_bool(d, "timed_out"),
        duration=_float(d, "duration", 0.0),
        sandbox=_str(d, "sandbox", ""),
    ),
    "McpCallDone": lambda d: McpCallDone(
        agent=_str(d, "agent"),
        server=_str(d, "server"),
        tool=_str(d, "tool"),
        duration=_float(d, "duration", 0.0),
        ok=_bool(d, "ok"),
        error=_str(d, "error", ""),
    ),
    "FanoutStarted": lambda d: FanoutStarted(
        call=_int(d, "call"), subtasks=_int(d, "subtasks", 0), not_run=_int(d, "not_run", 0)
    ),
    "FanoutDone": lambda d: FanoutDone(call=_int(d, "call"), duration=_float(d, "duration", 0.0)),
    "ScriptStarted": lambda d: ScriptStarted(call=_int(d, "call"), lines=_int(d, "lines", 0)),
    "ScriptDone": lambda d: ScriptDone(
        call=_int(d, "call"),
        duration=_float(d, "duration", 0.0),
        agents=_int(d, "agents", 0),
        error=_optional_str(d, "error"),
    ),
    "SubagentStarted": lambda d: SubagentStarted(
        call=_int(d, "call"),
        index=_int(d, "index"),
        role=_role(d),
        title=_str(d, "title", ""),
        prompt=_str(d, "prompt", ""),
        node=_str(d, "node", ""),
    ),
    "SubagentDone": lambda d: SubagentDone(
        call=_int(d, "call"),
        index=_int(d, "index"),
        role=_role(d),
        status=_str(d, "status"),
        turns=_int(d, "turns", 0),
        usage=_usage(d, "usage", TokenUsage()),
        duration=_float(d, "duration", 0.0),
        from_journal=_bool(d, "from_journal"),
        verdict=_optional_str(d, "verdict"),
        result=_str(d, "result", ""),
        cost=_float(d, "cost", 0.0),
        node=_str(d, "node", ""),
        report_path=_str(d, "report_path", ""),  # absent in records older than result files
    ),
    "ContextCompacted": lambda d: ContextCompacted(
        agent=_str(d, "agent"),
        how=_str(d, "how"),
        tokens_before=_int(d, "tokens_before", 0),
        tokens_after=_int(d, "tokens_after", 0),
        detail=_str(d, "detail", ""),
        refused=_bool(d, "refused"),
    ),
    "ResultCondensed": lambda d: ResultCondensed(
        call=_int(d, "call"),
        tokens_full=_int(d, "tokens_full", 0),
        tokens_shown=_int(d, "tokens_shown", 0),
        budget=_int(d, "budget", 0),
        omitted=_str(d, "omitted", ""),
        path=_str(d, "path", ""),
    ),
    "ChangeSettled": lambda d: ChangeSettled(
        call=_int(d, "call"),
        index=_int(d, "index"),
        fate=_str(d, "fate"),
        files=_str(d, "files", ""),
        added=_int(d, "added", 0),
        removed=_int(d, "removed", 0),
        detail=_str(d, "detail", ""),
        path=_str(d, "path", ""),
    ),
}


def parse_row(row: EventRow) -> Event | None:
    """The event a recorded row holds, or None if the row cannot be understood."""
    parse = _PARSERS.get(row.kind)
    at = row.at
    if parse is None or isinstance(at, bool) or not isinstance(at, int | float):
        return None
    if not math.isfinite(at):
        return None
    try:
        data = json.loads(row.data)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return parse(data)
    except (_Bad, ValueError, TypeError):
        return None


def session_totals(rows: Iterable[EventRow]) -> SessionTotals:
    """A session's totals rebuilt from its records (rows that cannot be read are skipped)."""
    totals = SessionTotals()
    for row in rows:
        event = parse_row(row)
        if event is not None:
            totals(event)
    return totals


# --- findings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    claim: str
    evidence: str
    severity: str


@dataclass(frozen=True)
class Report:
    """What a subagent handed in through report_findings."""

    summary: str
    findings: tuple[Finding, ...]


def parse_report(result: str) -> Report | None:
    """A subagent's ``report_findings`` JSON; None for anything else (an error, a limit note)."""
    try:
        data = json.loads(result)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    summary = data.get("summary")
    raw = data.get("findings")
    if not isinstance(summary, str) and not isinstance(raw, list):
        return None
    findings = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("claim"), str):
            continue
        evidence = item.get("evidence")
        severity = item.get("severity")
        findings.append(
            Finding(
                claim=item["claim"],
                evidence=evidence if isinstance(evidence, str) else "",
                severity=severity.strip().lower() if isinstance(severity, str) else "info",
            )
        )
    return Report(summary if isinstance(summary, str) else "", tuple(findings))


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


# --- records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compaction:
    """A conversation made smaller to fit the context window: what an agent lost, and when."""

    event: ContextCompacted
    at: float

    @property
    def agent(self) -> str:
        return self.event.agent

    def describe(self) -> str:
        return compaction_text(self.event)


@dataclass(frozen=True)
class CondensedResult:
    """A Workflow result the model saw condensed: what it missed, and where the whole is."""

    event: ResultCondensed
    at: float

    def describe(self) -> str:
        return condensed_text(self.event)


@dataclass(frozen=True)
class SettledChange:
    """What became of a worker's change to its copy of the tree, and where its patch is."""

    event: ChangeSettled
    at: float

    @property
    def fate(self) -> str:
        return self.event.fate

    @property
    def path(self) -> str:
        return self.event.path

    @property
    def what(self) -> str:
        """Its fate, with why: ``conflict in a.py``, ``not merged (refuted)``."""
        return change_fate(self.event)

    def describe(self) -> str:
        """``merged: 2 files (+10 −2): src/a.py (+8 −2), b.py (+2 −0)``."""
        files = self.event.files.strip()
        text = self.what + (f": {files}" if files else "")
        return " ".join(text.split())  # one line, whatever the file names hold


@dataclass(frozen=True)
class Command:
    """One bash command or MCP tool call, the main agent's or a subagent's."""

    agent: str
    #: The command line; for an MCP call, ``mcp <server>/<tool>``.
    command: str
    exit_code: int | None
    timed_out: bool
    duration: float
    sandbox: str
    at: float
    #: ``bash`` or ``mcp``; an MCP call has no exit code, only ok or its error.
    kind: str = "bash"
    error: str = ""

    @property
    def outcome(self) -> str:
        if self.kind == "mcp":
            return "ok" if self.ok else f"error: {self.error or 'failed'}"
        if self.timed_out:
            return "timed out"
        return "no exit code" if self.exit_code is None else f"exit {self.exit_code}"

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    @classmethod
    def of_mcp(cls, event: McpCallDone, at: float) -> Command:
        """An MCP call, shown like a command: it runs outside the sandbox, as the user."""
        return cls(
            event.agent,
            f"mcp {event.server}/{event.tool}",
            0 if event.ok else 1,
            False,
            event.duration,
            MCP_SANDBOX,
            at,
            "mcp",
            event.error,
        )


#: Subagent states as the report colours them, with the words a reader sees.
STATE_LABELS = {
    "done": "done",
    "failed": "failed",
    "journal": "journal hit",
    "skipped": "skipped by budget",
    "interrupted": "interrupted",
}
AGENT_STATES = tuple(STATE_LABELS)


@dataclass
class AgentRecord:
    """A worker or verifier: what it was asked, what it did, what it cost and found."""

    call: int
    index: int
    role: Role
    title: str = ""
    prompt: str = ""
    started_at: float | None = None
    done_at: float | None = None
    #: the SubagentDone status (finished, failed, skipped, …); None if it never ended
    status: str | None = None
    from_journal: bool = False
    turns: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0
    duration: float = 0.0
    verdict: str | None = None
    result: str = ""
    requests: int = 0
    commands: list[Command] = field(default_factory=list)
    #: the Ray node it ran on; empty when it ran in the user's own process (or never ran)
    node: str = ""
    #: the file holding its full result; empty if none was saved (or the record predates them)
    report_path: str = ""
    #: its commands and compactions in the order they happened
    activity: list[Command | Compaction] = field(default_factory=list)
    #: what became of a worker's change to its copy of the tree (``worktree`` isolation)
    change: SettledChange | None = None

    @property
    def compactions(self) -> list[Compaction]:
        return [step for step in self.activity if isinstance(step, Compaction)]

    @property
    def name(self) -> str:
        """The name its requests and commands are recorded under (see ``workflow.py``)."""
        return f"{self.role} {self.call}.{self.index}"

    @property
    def state(self) -> str:
        """done, failed, journal (a recorded result served), skipped (budget) or interrupted."""
        if self.status is None:
            return "interrupted"
        if self.status == "finished":
            return "journal" if self.from_journal else "done"
        if self.status == "skipped":
            return "skipped"
        return "failed"

    @property
    def report(self) -> Report | None:
        return parse_report(self.result) if self.status == "finished" else None

    @property
    def tokens(self) -> int:
        return self.usage.total_input + self.usage.output_tokens


@dataclass
class Fanout:
    """One Workflow call: a flat list of subtasks or an orchestration script, and its agents."""

    call: int
    started_at: float
    subtasks: int = 0
    not_run: int = 0
    duration: float | None = None
    #: set when the call ran a script
    script_lines: int | None = None
    script_error: str | None = None
    agents: list[AgentRecord] = field(default_factory=list)
    #: its result as the model saw it, when that was condensed to fit the result budget
    condensed: CondensedResult | None = None
    #: its agents' compactions, in the order they happened
    compactions: list[Compaction] = field(default_factory=list)
    _by_key: dict[tuple[int, Role], AgentRecord] = field(default_factory=dict, repr=False)

    def agent(self, index: int, role: Role) -> AgentRecord:
        """The agent at ``index`` in ``role``, created when first heard of."""
        agent = self._by_key.get((index, role))
        if agent is None:
            agent = self._by_key[index, role] = AgentRecord(self.call, index, role)
            self.agents.append(agent)  # kept in index order, each worker before its verifier
            self.agents.sort(key=lambda a: (a.index, a.role != "worker"))
        return agent

    def verifier_of(self, worker: AgentRecord) -> AgentRecord | None:
        """The verifier that checked ``worker``, if one did.

        A flat fan-out gives a worker and its verifier the same index. A script numbers
        every agent apart, so there the verifier is the one whose prompt quotes both the
        worker's subtask and its result (a verification prompt carries both).
        """
        for agent in self.agents:
            if agent.role != "verifier":
                continue
            if self.script_lines is None:
                paired = agent.index == worker.index
            else:
                quoted = (worker.prompt, worker.result)
                paired = all(part and part in agent.prompt for part in quoted)
            if paired:
                return agent
        return None

    def describe(self) -> str:
        if self.script_lines is not None:
            what = f"script of {self.script_lines} lines, {len(self.agents)} agents"
        else:
            what = f"{self.subtasks} subtasks" + (
                f" ({self.not_run} over the per-call limit not run)" if self.not_run else ""
            )
        took = "unfinished" if self.duration is None else seconds(self.duration)
        return f"workflow {self.call}: {what} · {took}"


#: What a turn did, in order: the main agent's commands and compactions, and its fan-outs.
Step = Command | Compaction | Fanout

#: Stops that mean the turn ended with an answer.
FINISHED_STOPS = frozenset({"end_turn", "stop_sequence"})


@dataclass
class Turn:
    """A user turn and everything it set off, until the next user turn."""

    number: int
    text: str
    notices: tuple[str, ...]
    started_at: float
    ended_at: float | None = None
    #: TurnDone's stop (end_turn, turn_limit, error, …); None if the turn never finished
    stop: str | None = None
    model_calls: int = 0
    requests: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0
    last_at: float = 0.0
    steps: list[Step] = field(default_factory=list)
    #: the main agent's final answer, when the saved conversation has it
    answer: str | None = None
    #: every compaction in the turn, the main agent's and the subagents', in order
    compactions: list[Compaction] = field(default_factory=list)
    #: every Workflow result the model saw condensed, in order
    condensed: list[CondensedResult] = field(default_factory=list)

    @property
    def status(self) -> str:
        """finished, failed (it ended without an answer) or interrupted (it never ended)."""
        if self.stop is None:
            return "interrupted"
        return "finished" if self.stop in FINISHED_STOPS else "failed"

    @property
    def status_text(self) -> str:
        return f"failed ({self.stop})" if self.status == "failed" else self.status

    @property
    def task(self) -> str:
        """The first non-empty line of the user turn."""
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")

    @property
    def fanouts(self) -> list[Fanout]:
        return [step for step in self.steps if isinstance(step, Fanout)]

    @property
    def agents(self) -> list[AgentRecord]:
        return [agent for fanout in self.fanouts for agent in fanout.agents]

    def fanout(self, call: int, at: float) -> Fanout:
        for fanout in self.fanouts:
            if fanout.call == call:
                return fanout
        fanout = Fanout(call, at)
        self.steps.append(fanout)
        return fanout


@dataclass
class SessionHistory:
    id: str
    workdir: str
    turns: list[Turn]
    totals: SessionTotals
    first_at: float | None
    last_at: float | None
    #: rows that could not be understood and were left out
    skipped: int = 0

    @property
    def agents(self) -> list[AgentRecord]:
        return [agent for turn in self.turns for agent in turn.agents]

    @property
    def elapsed(self) -> float:
        if self.first_at is None or self.last_at is None:
            return 0.0
        return max(0.0, self.last_at - self.first_at)


_AGENT_NAME = re.compile(r"(worker|verifier) (\d+)\.(\d+)")


def read_session(
    rows: Iterable[EventRow], *, session: str = "", workdir: str = "", state: str | None = None
) -> SessionHistory:
    """A session's history from its event rows (in order); ``state`` adds the answers."""
    totals = SessionTotals()
    turns: list[Turn] = []
    skipped = 0
    first_at: float | None = None
    last_at: float | None = None
    for row in rows:
        event = parse_row(row)
        if event is None:
            skipped += 1
            continue
        at = float(row.at)
        first_at = at if first_at is None else min(first_at, at)
        last_at = at if last_at is None else max(last_at, at)
        totals(event)
        if isinstance(event, TurnStarted):
            turns.append(Turn(len(turns) + 1, event.text, event.notices, at, last_at=at))
            continue
        if not turns:
            continue  # nothing to hang it on; it still counts in the totals
        _apply(turns[-1], event, at)
    if state is not None:
        for turn, answer in zip(turns, answers(state, len(turns)), strict=True):
            turn.answer = answer
    return SessionHistory(session, workdir, turns, totals, first_at, last_at, skipped)


def _apply(turn: Turn, event: Event, at: float) -> None:
    """Fold one event into the turn it happened in."""
    turn.last_at = max(turn.last_at, at)
    match event:
        case TurnDone():
            turn.stop, turn.model_calls, turn.ended_at = event.stop, event.model_calls, at
        case ModelRequestDone():
            turn.requests += 1
            turn.usage = turn.usage + event.usage
            turn.cost += event.cost
            agent = _agent_named(turn, event.agent, at)
            if agent is not None:
                agent.requests += 1
        case BashDone() | McpCallDone():
            if isinstance(event, McpCallDone):
                command = Command.of_mcp(event, at)
            else:
                command = Command(
                    event.agent,
                    event.command,
                    event.exit_code,
                    event.timed_out,
                    event.duration,
                    event.sandbox,
                    at,
                )
            agent = _agent_named(turn, event.agent, at)
            if agent is None:
                turn.steps.append(command)
            else:
                agent.commands.append(command)
                agent.activity.append(command)
        case ContextCompacted():
            compaction = Compaction(event, at)
            turn.compactions.append(compaction)
            agent = _agent_named(turn, event.agent, at)
            if agent is None:  # the main agent's: a step of the turn, between its commands
                turn.steps.append(compaction)
            else:
                agent.activity.append(compaction)
                turn.fanout(agent.call, at).compactions.append(compaction)
        case ResultCondensed():
            condensed = CondensedResult(event, at)
            turn.condensed.append(condensed)
            turn.fanout(event.call, at).condensed = condensed
        case ChangeSettled():
            worker = turn.fanout(event.call, at).agent(event.index, "worker")
            worker.change = SettledChange(event, at)
        case FanoutStarted():
            fanout = turn.fanout(event.call, at)
            fanout.started_at = at
            fanout.subtasks, fanout.not_run = event.subtasks, event.not_run
        case ScriptStarted():
            fanout = turn.fanout(event.call, at)
            fanout.started_at = at
            fanout.script_lines = event.lines
        case FanoutDone():
            turn.fanout(event.call, at).duration = event.duration
        case ScriptDone():
            fanout = turn.fanout(event.call, at)
            fanout.duration, fanout.script_error = event.duration, event.error
        case SubagentStarted():
            agent = turn.fanout(event.call, at).agent(event.index, event.role)
            agent.started_at, agent.title, agent.prompt = at, event.title, event.prompt
            if event.node:  # a rerun after a lost node starts again elsewhere
                agent.node = event.node
        case SubagentDone():
            agent = turn.fanout(event.call, at).agent(event.index, event.role)
            agent.done_at = at
            if agent.started_at is None:  # a journal hit or a budget skip never started
                agent.started_at = at - max(0.0, event.duration)
            agent.status, agent.turns, agent.usage = event.status, event.turns, event.usage
            agent.duration, agent.from_journal = event.duration, event.from_journal
            agent.verdict, agent.result, agent.cost = event.verdict, event.result, event.cost
            if event.node:  # where it finished, if it was placed on a node
                agent.node = event.node
            if event.report_path:
                agent.report_path = event.report_path


def _agent_named(turn: Turn, name: str, at: float) -> AgentRecord | None:
    match = _AGENT_NAME.fullmatch(name)
    if match is None:
        return None
    role: Role = "worker" if match[1] == "worker" else "verifier"
    return turn.fanout(int(match[2]), at).agent(int(match[3]), role)


def answers(state: str, turns: int) -> list[str | None]:
    """The main agent's final answer to each user turn, from the saved conversation.

    User turns are the user messages with plain text content (tool results are lists). If
    their number does not match the recorded turns, the pairing cannot be trusted and no
    answers are given.
    """
    nothing: list[str | None] = [None] * turns
    try:
        history = json.loads(state)["history"]
    except (ValueError, TypeError, KeyError):
        return nothing
    if not isinstance(history, list):
        return nothing
    found: list[str | None] = []
    for message in history:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            found.append(None)
        elif message.get("role") == "assistant" and found:
            found[-1] = _final_text(message.get("content"))
    return found if len(found) == turns else nothing


def _final_text(content: object) -> str | None:
    """The text of an assistant message that ends a turn; None if it asks for tools."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    blocks = [b for b in content if isinstance(b, dict)]
    if any(b.get("type") == "tool_use" for b in blocks):
        return None
    text = "\n\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    return text or None


# --- formatting ---------------------------------------------------------------------------


def money(dollars: float) -> str:
    """Cents for real spend, more digits below a dollar so small runs do not read $0.00."""
    return f"${dollars:,.2f}" if dollars >= 1 else f"${dollars:.4f}"


def seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def when(at: float | None, form: str = "%Y-%m-%d %H:%M") -> str:
    """Local time; a dash for a time that is missing or that no calendar can show."""
    if at is None:
        return "—"
    try:
        return time.strftime(form, time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "—"


def clip(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


NOTICE_LABELS = {
    "enter": "orchestration mode ON",
    "refresh": "orchestration mode still ON (reminder)",
    "exit": "orchestration mode OFF",
}

RUN_COLUMNS = ("RUN", "WHEN", "TURN", "TASK", "AGENTS", "COST", "STATUS")
#: columns whose values are numbers, aligned right
RUN_NUMERIC = frozenset({"TURN", "AGENTS", "COST"})


def run_rows(histories: Sequence[SessionHistory], task_width: int = 60) -> list[tuple[str, ...]]:
    """One row per turn, sessions newest first, a session's turns in the order they ran."""
    rows: list[tuple[str, ...]] = []
    for history in histories:
        if not history.turns:
            rows.append(
                (history.id, when(history.first_at), "", "(no turns recorded)", "0",
                 money(history.totals.all.cost), "interrupted")
            )  # fmt: skip
            continue
        for turn in history.turns:
            rows.append(
                (
                    history.id if turn.number == 1 else "",
                    when(turn.started_at),
                    str(turn.number),
                    clip(turn.task, task_width),
                    str(len(turn.agents)),
                    money(turn.cost),
                    turn.status_text,
                )
            )
    return rows


def format_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[str] = RUN_NUMERIC
) -> str:
    """Plain aligned columns, two spaces apart, no trailing blanks: for pipes and tests."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.rjust(width) if name in numeric else cell.ljust(width)
            for name, cell, width in zip(header, row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# --- the transcript -----------------------------------------------------------------------

#: A line of output: (text, style) pieces; the style is a Rich style, ignored in plain text.
Line = tuple[tuple[str, str], ...]

_STATE_STYLES = {
    "done": "green",
    "journal": "cyan",
    "skipped": "yellow",
    "failed": "red",
    "interrupted": "magenta",
    "finished": "green",
    "confirmed": "green",
    "refuted": "red",
    "unclear": "yellow",
}
_SEVERITY_STYLES = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _line(*pieces: tuple[str, str] | str) -> Line:
    return tuple(p if isinstance(p, tuple) else (p, "") for p in pieces)


def _block(label: str, text: str, indent: str, style: str = "") -> list[Line]:
    """``label`` then ``text``, its later lines indented under the first."""
    lines = text.splitlines() or [""]
    label = label.ljust(7)
    pad = " " * (len(label) + 1)
    out = [_line(indent, (label, "bold"), " ", (lines[0], style))]
    out.extend(_line(indent, pad, (line, style)) for line in lines[1:])
    return out


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _usage_text(agent: AgentRecord) -> str:
    return (
        f"{plural(agent.turns, 'turn')} · {plural(agent.tokens, 'token')} · "
        f"{money(agent.cost)} · {seconds(agent.duration)}"
    )


def _agent_lines(agent: AgentRecord, indent: str) -> list[Line]:
    state = agent.state
    head: list[tuple[str, str] | str] = [indent, (agent.name, "bold")]
    if agent.title and agent.role == "worker":  # a verifier's title is its stock opening
        head += [" · ", clip(agent.title, 80)]
    if agent.verdict:
        head += [" · ", (agent.verdict, _STATE_STYLES.get(agent.verdict, ""))]
    label = f"failed ({agent.status})" if state == "failed" else STATE_LABELS[state]
    head += [" · ", (label, _STATE_STYLES[state])]
    if agent.node:  # only runs on a cluster have nodes: a local run reads as it always has
        head += [" · ", (f"node {agent.node}", "blue")]
    if agent.status is not None and not agent.from_journal:
        head += [f" · {_usage_text(agent)}"]
    lines = [_line(*head)]
    inner = indent + "  "
    for step in agent.activity:  # commands and compactions, as they happened
        if isinstance(step, Command):
            lines.append(_command_line(step, inner))
        else:
            lines.append(_compaction_line(step, inner, named=False))
    report = agent.report
    if report is not None:
        lines.extend(_block("summary", report.summary, inner))
        for finding in sorted(report.findings, key=lambda f: severity_rank(f.severity)):
            label = f"[{finding.severity}]"
            lines.extend(
                _block(label, finding.claim, inner, _SEVERITY_STYLES.get(finding.severity, ""))
            )
            if finding.evidence:
                lines.extend(_block("evidence", finding.evidence, inner + " " * 8, "dim"))
    elif agent.result:
        lines.extend(_block("result", agent.result, inner))
    if agent.report_path:  # the whole of it, whatever the model was shown
        lines.append(_line(inner, ("full result ", "bold"), agent.report_path))
    if agent.change is not None:  # only a worker with its own copy of the tree has one
        style = CHANGE_STYLES.get(agent.change.fate, "")
        lines.append(_line(inner, ("change ", "bold"), (agent.change.describe(), style)))
        if agent.change.path:
            lines.append(_line(inner, ("patch ", "bold"), agent.change.path))
    return lines


def _compaction_line(compaction: Compaction, indent: str, *, named: bool) -> Line:
    """``named`` for a line that is not already under the agent it happened to."""
    who = f"{compaction.agent}: " if named else ""
    return _line(indent, ("context ", "bold"), (who + compaction.describe(), "yellow"))


def _condensed_line(condensed: CondensedResult, indent: str) -> Line:
    return _line(indent, (condensed.describe(), "yellow"))  # it reads "result condensed to …"


def _command_line(command: Command, indent: str) -> Line:
    style = "green" if command.ok else "red"
    return _line(
        indent,
        ("$ " if command.kind == "bash" else "", "bold"),
        clip(command.command, 100),
        "  ",
        (command.outcome, style),
        f" · {seconds(command.duration)}",
    )


def transcript(history: SessionHistory) -> list[Line]:
    """The session as a reader wants it: turns, commands, fan-outs, findings, verdicts, totals."""
    lines: list[Line] = [
        _line(("session ", "bold"), (history.id, "bold"),
              f" · {history.workdir or 'workdir not recorded'} · "
              f"{plural(len(history.turns), 'turn')}"),
    ]  # fmt: skip
    for turn in history.turns:
        lines.append(_line())
        lines.append(
            _line(
                (f"turn {turn.number}", "bold underline"),
                f" · {when(turn.started_at)} · ",
                (turn.status_text, _STATE_STYLES.get(turn.status, "")),
                f" · {plural(turn.requests, 'model request')} · "
                f"{plural(len(turn.agents), 'agent')} · {money(turn.cost)}",
            )
        )
        lines.extend(_block("user", turn.text, "  ", "bold"))
        for notice in turn.notices:
            label = NOTICE_LABELS.get(notice, notice)
            lines.append(_line("  ", ("mode   ", "bold"), " ", (f"{notice}: {label}", "cyan")))
        for step in turn.steps:
            if isinstance(step, Command):
                lines.append(_command_line(step, "  "))
                continue
            if isinstance(step, Compaction):
                lines.append(_compaction_line(step, "  ", named=True))
                continue
            lines.append(_line("  ", (step.describe(), "bold")))
            if step.script_error:
                lines.append(_line("    ", ("script error: ", "red"), step.script_error))
            for agent in step.agents:
                lines.extend(_agent_lines(agent, "    "))
            if step.condensed is not None:  # the model got this call's result condensed
                lines.append(_condensed_line(step.condensed, "    "))
        if turn.answer:
            lines.extend(_block("answer", turn.answer, "  "))
    if history.turns and history.turns[-1].status == "interrupted":
        lines.append(_line())
        lines.append(
            _line(
                ("interrupted", _STATE_STYLES["interrupted"]),
                f" — continue it from its last recorded step with `orchmode resume {history.id}`",
            )
        )
    lines.append(_line())
    lines.append(_line(("totals", "bold"), " ", totals_text(history)))
    if history.skipped:
        lines.append(_line((f"{history.skipped} unreadable event rows were left out", "yellow")))
    return lines


def totals_text(history: SessionHistory) -> str:
    total = history.totals.all
    return (
        f"{plural(total.requests, 'model request')} · {total.usage.total_input:,} input tokens "
        f"({total.usage.cache_hit:.0%} read from cache) · {total.usage.output_tokens:,} output "
        f"· {money(total.cost)} · {plural(len(history.agents), 'agent')} · "
        f"{seconds(history.elapsed)} elapsed"
    )


def plain(lines: Iterable[Line]) -> str:
    return "\n".join("".join(text for text, _ in line).rstrip() for line in lines)


def print_lines(lines: Iterable[Line], stream: IO[str]) -> None:
    """Styled through Rich on a terminal; plain text into a pipe or a file."""
    if not stream.isatty():
        print(plain(lines), file=stream)
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=stream, highlight=False)
    for line in lines:
        console.print(Text.assemble(*line), soft_wrap=True)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], stream: IO[str]) -> None:
    """A Rich table on a terminal (only TASK gives way when narrow); plain columns elsewhere."""
    if not stream.isatty():
        print(format_columns(header, rows), file=stream)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream, highlight=False)
    table = Table(box=None, header_style="bold", pad_edge=False)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    task = header.index("TASK") if "TASK" in header else -1
    fixed = sum(w for i, w in enumerate(widths) if i != task) + 2 * (len(header) - 1)
    for i, name in enumerate(header):
        width = max(12, min(widths[i], console.width - fixed)) if i == task else widths[i]
        table.add_column(
            name,
            justify="right" if name in RUN_NUMERIC else "left",
            no_wrap=True,
            overflow="ellipsis",
            width=width,
        )
    for row in rows:
        # Text, never markup: a task is the user's words and may contain [brackets].
        status = _STATE_STYLES.get(row[-1].split(" ", 1)[0], "")
        table.add_row(*(Text(cell) for cell in row[:-1]), Text(row[-1], style=status))
    console.print(table)
