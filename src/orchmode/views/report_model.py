"""What the report's templates compute from a session: anchors, timeline geometry, groups, facts.

The templates hold the markup; the arithmetic and the lookups that would be clumsy in Jinja
live here, as plain values.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from ..core.results import SEVERITIES, Finding, Report, severity_rank
from ..records.history import AGENT_STATES, STATE_LABELS, AgentRecord, Fanout, SessionHistory, Turn
from ..records.network import size as byte_size
from ..records.steps import Command, Compaction
from ..records.totals import web_uses
from ..records.wording import status_words
from .formatting import money, seconds, when

#: What the templates read here, as ``model.NAME``, that is defined elsewhere.
__all__ = ["AGENT_STATES", "STATE_LABELS", "byte_size", "status_words", "web_uses"]

#: A connection's decision, an approval's answer, as a badge's class.
DECISION_CLASSES = {
    "allowed": "allowed",
    "approved": "approved",
    "failed": "failed",
    "denied": "denied",
    "timed out": "timed-out",
}

#: A settled change's fate as a CSS class (anything a newer orchmode records reads "other").
CHANGE_CLASSES = {
    "merged": "merged",
    "conflict": "conflict",
    "refused": "refused",
    "not merged": "not-merged",
    "kept": "kept",
}

#: The verdicts a badge has a colour for.
VERDICTS = ("confirmed", "refuted", "unclear")

T = TypeVar("T")

#: What the rendering under way has worked out, by key: a worker's report and its findings'
#: Markdown show in the Findings section and again in its details.
_remembered: ContextVar[dict[Hashable, object] | None] = ContextVar("remembered", default=None)


@contextmanager
def rendering() -> Iterator[None]:
    """One rendering of a page: what it works out is kept until it ends."""
    token = _remembered.set({})
    try:
        yield
    finally:
        _remembered.reset(token)


def remembered(key: Hashable, make: Callable[[], T]) -> T:
    """``make()``, once per key in a rendering (every time outside one)."""
    memo = _remembered.get()
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]  # type: ignore[return-value]


def report(agent: AgentRecord) -> Report | None:
    """The agent's report, read from its result once per rendering."""
    return remembered(("report", id(agent)), lambda: agent.report)


def clock(at: float | None) -> str:
    return when(at, "%Y-%m-%d %H:%M:%S")


def agent_id(turn: Turn, agent: AgentRecord) -> str:
    """A unique anchor: call numbers restart when a session is resumed in a new process, and
    a resolution's verifier has its subtask's verifier's name."""
    resolution = "-resolution" if agent.resolution else ""
    return f"agent-t{turn.number}-{agent.call}-{agent.index}-{agent.role}{resolution}"


def on_nodes(history: SessionHistory) -> bool:
    """Whether any agent ran on a cluster node: then every agent's facts say where."""
    return any(agent.node for agent in history.agents)


def find_agent(history: SessionHistory, anchor: str) -> tuple[Turn, Fanout, AgentRecord] | None:
    """The agent whose :func:`agent_id` is ``anchor``, with its turn and its call."""
    for turn in history.turns:
        for fanout in turn.fanouts:
            for agent in fanout.agents:
                if agent_id(turn, agent) == anchor:
                    return turn, fanout, agent
    return None


def turn_agent(turn: Turn, name: str) -> AgentRecord | None:
    """The subagent of this turn recorded under ``name`` (never a resolution's verifier)."""
    return next((a for a in turn.agents if a.name == name and not a.resolution), None)


def severity_class(severity: str) -> str:
    return severity if severity in SEVERITIES else "other"


def by_severity(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: severity_rank(f.severity))


def is_command(step: object) -> bool:
    return isinstance(step, Command)


def is_compaction(step: object) -> bool:
    return isinstance(step, Compaction)


# --- totals -------------------------------------------------------------------------------


def totals(history: SessionHistory) -> list[tuple[str, str, str, str]]:
    """Each total's id, label, text as shown and exact value (for tests and scripts)."""
    total = history.totals.all
    usage = total.usage
    counts = [
        ("total-input-tokens", "input tokens", usage.total_input),
        ("total-output-tokens", "output tokens", usage.output_tokens),
    ]
    cached = [
        ("total-cache-read-tokens", "cache reads", usage.cache_read_tokens),
        ("total-cache-write-tokens", "cache writes", usage.cache_write_tokens),
        ("total-requests", "model requests", total.requests),
    ]
    hit = usage.cache_hit
    web = [
        ("total-web-searches", "web searches", usage.web_search_requests),
        ("total-web-fetches", "web fetches", usage.web_fetch_requests),
    ]
    return [
        ("total-cost", "dollars", money(total.cost), repr(total.cost)),
        *[(key, label, f"{count:,}", str(count)) for key, label, count in counts],
        ("total-cache-hit", "input read from cache", f"{hit:.1%}", repr(hit)),
        *[(key, label, f"{count:,}", str(count)) for key, label, count in cached],
        *[(key, label, f"{count:,}", str(count)) for key, label, count in web if count],
        ("total-agents", "agents", str(len(history.agents)), str(len(history.agents))),
        ("total-elapsed", "elapsed", seconds(history.elapsed), repr(history.elapsed)),
    ]


def cost_split(history: SessionHistory) -> str:
    """The main agent's cost against the subagents', and the cost by model."""
    totals = history.totals
    split = (
        f"main agent {money(totals.main.cost)} in {totals.main.requests} "
        f"requests · subagents {money(totals.subagents.cost)} in "
        f"{totals.subagents.requests} requests"
    )
    if roles := _by_role(history):
        split += f" · by role: {roles}"
    if models := totals.describe_models():
        split += f" · by model: {models}"
    return split


def _by_role(history: SessionHistory) -> str:
    """``worker $0.12, verifier $0.04``: what the subagents of each role spent, in the
    order a subtask's agents run (a run from the journal spent nothing)."""
    spent: dict[str, float] = {}
    for agent in sorted(history.agents, key=lambda a: a.rank):
        role = "resolution verifier" if agent.resolution else agent.role
        spent[role] = spent.get(role, 0.0) + agent.spent
    return ", ".join(f"{role} {money(dollars)}" for role, dollars in spent.items())


# --- the timeline -------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One agent's bar on its call's timeline, in percent of the call's span."""

    agent: AgentRecord
    left: str
    width: str
    tip: str


@dataclass(frozen=True)
class Lane:
    index: int
    label: str
    bars: list[Bar]


@dataclass(frozen=True)
class Chart:
    """A call's timeline: its axis's ticks (position, label) and a lane per subtask."""

    ticks: list[tuple[str, str]]
    lanes: list[Lane]


def legend_states(history: SessionHistory) -> list[str]:
    """The states the legend offers: a state newer than most runs only when it came."""
    shown = {agent.state for agent in history.agents}
    return [state for state in AGENT_STATES if state != "budget" or state in shown]


def _tick_step(span: float) -> float:
    """A round step that puts at most about eight ticks on the axis."""
    steps = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800)
    for step in (*steps, 3600):
        if span / step <= 8:
            return float(step)
    return 3600.0 * math.ceil(span / 3600 / 8)


def _tick_label(value: float) -> str:
    if value >= 60:
        minutes, rest = divmod(round(value), 60)
        return f"{minutes}:{rest:02d}"
    return f"{value:g}"


def _bounds(turn: Turn, fanout: Fanout) -> tuple[float, float]:
    starts = [a.started_at for a in fanout.agents if a.started_at is not None]
    start = min([fanout.started_at, *starts])
    ends = [a.done_at if a.done_at is not None else turn.last_at for a in fanout.agents]
    end = max([start, *ends])
    if fanout.duration is not None:
        end = max(end, fanout.started_at + fanout.duration)
    return start, end


def _bar(turn: Turn, agent: AgentRecord, start: float, span: float) -> Bar:
    began = agent.started_at if agent.started_at is not None else start
    ended = agent.done_at if agent.done_at is not None else turn.last_at
    verdict = f" · {agent.verdict}" if agent.verdict else ""
    node = f" · node {agent.node}" if agent.node else ""
    tip = (
        f"{agent.label} · {STATE_LABELS[agent.state]}{verdict}{node} · "
        f"{seconds(max(0.0, ended - began))} · {agent.tokens:,} tokens · {money(agent.cost)}"
    )
    left = (began - start) / span * 100
    width = max(0.0, ended - began) / span * 100
    return Bar(agent, f"{left:.3f}", f"{width:.3f}", tip)


def chart(turn: Turn, fanout: Fanout) -> Chart:
    start, end = _bounds(turn, fanout)
    span = max(end - start, 1e-3)
    step = _tick_step(span)
    ticks = [
        (f"{t / span * 100:.3f}", _tick_label(t))
        for t in (step * i for i in range(int(span / step) + 1))
    ]
    by_index: dict[int, list[AgentRecord]] = {}
    for agent in fanout.agents:
        by_index.setdefault(agent.index, []).append(agent)
    lanes = []
    for index, agents in sorted(by_index.items()):
        label = next((a.title for a in agents if a.role == "worker" and a.title), "")
        if not label:
            label = next((a.title for a in agents if a.title), "") if len(agents) == 1 else ""
        bars = [_bar(turn, agent, start, span) for agent in agents]
        lanes.append(Lane(index, label, bars))
    return Chart(ticks, lanes)


# --- findings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FoundBy:
    """A finding with the worker that reported it and what its verifier made of it."""

    turn: Turn
    worker: AgentRecord
    finding: Finding
    verdict: str

    @property
    def verdict_class(self) -> str:
        return self.verdict if self.verdict in VERDICTS else "none"


def _verdict(verifier: AgentRecord | None) -> str:
    if verifier is None:
        return "not verified"
    if verifier.verdict:
        return verifier.verdict
    return f"verifier {STATE_LABELS[verifier.state]}"


def findings(history: SessionHistory) -> list[tuple[str, list[FoundBy]]]:
    """Every worker's findings grouped by severity, most severe first."""
    groups: dict[str, list[FoundBy]] = {}
    for turn in history.turns:
        for fanout in turn.fanouts:
            for agent in fanout.agents:
                if agent.role != "worker" or (found_report := report(agent)) is None:
                    continue
                verdict = _verdict(fanout.verifier_of(agent))
                for finding in found_report.findings:
                    found = FoundBy(turn, agent, finding, verdict)
                    groups.setdefault(finding.severity, []).append(found)
    order = sorted(groups, key=lambda s: (severity_rank(s), s))
    return [(severity, groups[severity]) for severity in order]


# --- agents -------------------------------------------------------------------------------


def batched(agent: AgentRecord) -> str:
    """``2 of 3 requests, saved $0.0040 (msgbatch_…, msgbatch_…)``."""
    batches = f" ({', '.join(agent.batches)})" if agent.batches else ""
    return f"{agent.batched} of {agent.requests} requests, saved {money(agent.saved)}{batches}"


def subtree_cost(turn: Turn, agent: AgentRecord) -> float | None:
    """The cost of the agent and every agent under it, when it made calls of its own."""
    return turn.subtree_cost(agent) if turn.nested(agent) else None


def compaction_owners(fanout: Fanout) -> dict[int, AgentRecord]:
    """Each of the call's compactions' agent, by the compaction's identity: a resolution's
    verifier has its subtask's verifier's name."""
    return {id(c): agent for agent in fanout.agents for c in agent.compactions}


def batch_state(ended: float | None) -> str:
    return "in-progress" if ended is None else "ended"


def now() -> float:
    return time.time()


def identity(value: object) -> int:
    """An object's identity, the key of :func:`compaction_owners`."""
    return id(value)
