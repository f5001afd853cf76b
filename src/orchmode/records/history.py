"""Run history read back from recorded events: turns, agents, commands, findings, network.

``orchmode runs``, ``orchmode show``, the HTML report and ``orchmode resume`` all read from
here. Everything is a pure function of the store's rows, so a crashed or still-running session
reads the same way as a finished one. Rows that cannot be understood are skipped and counted
(see :mod:`.codec`); drawing the history is left to the views (``transcript.py``,
``run_table.py`` and ``report.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.events import (
    BashDone,
    BatchWaiting,
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
from ..core.results import Report, read_report
from ..core.wire import has_block, joined_text, read_history
from ..store import EventRow
from .agent_tree import CallTree
from .batches import BatchLog, saved_by_batching
from .codec import parse_row
from .network import NetworkLog
from .steps import Command, Compaction, CondensedResult, SettledChange
from .totals import SessionTotals
from .wording import STATUS_WORDS, seconds


@dataclass
class Resolving:
    """The subtasks whose change has gone to a resolver, per call, as the events come.

    A resolution is checked by a second verifier with the same name, ``verifier c.i``, as
    the one that checked the worker's change; only the order tells them apart: a verifier
    heard of after its subtask's resolver checks the resolution. Every view that follows
    the events asks this one rule.
    """

    seen: set[tuple[int, int]] = field(default_factory=set)

    def follow(self, event: Event) -> None:
        match event:
            case SubagentStarted(role="resolver") | SubagentDone(role="resolver"):
                self.seen.add((event.call, event.index))
            case FanoutStarted(call=call) | ScriptStarted(call=call):  # a call (re)starts
                self.seen = {seen for seen in self.seen if seen[0] != call}

    def checks_resolution(self, call: int, index: int, role: Role) -> bool:
        """Whether the agent ``role c.i`` heard of now is the verifier of a resolution."""
        return role == "verifier" and (call, index) in self.seen


#: Subagent states as the report colours them, with the words a reader sees.
STATE_LABELS = {
    "done": "done",
    "failed": "failed",
    "journal": "journal hit",
    "skipped": "skipped by budget",
    "interrupted": "interrupted",
    "budget": STATUS_WORDS["budget"],
}
AGENT_STATES = tuple(STATE_LABELS)


#: Where each kind of agent of a subtask is listed: its worker, the worker's verifier, then
#: a resolver of its change's conflict and the verifier of that resolution.
AGENT_RANKS = {"worker": 0, "verifier": 1, "resolver": 2, "main": 4}
RESOLUTION_RANK = 3


@dataclass
class AgentRecord:
    """A worker, verifier or resolver: what it was asked, did, cost and found."""

    call: int
    index: int
    role: Role
    #: set on the verifier that checked a resolver's resolution, not the worker's change
    resolution: bool = False
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
    #: its requests answered from a Message Batch, the dollars paid for them, and the batches
    batched: int = 0
    batched_cost: float = 0.0
    batches: list[str] = field(default_factory=list)
    #: what its requests cost as each was paid for (a batched one at the batch price)
    paid: float = 0.0
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
    def label(self) -> str:
        """Its name as shown: a resolution's verifier is told from the worker's verifier."""
        return self.name + (" (resolution)" if self.resolution else "")

    @property
    def rank(self) -> int:
        """Its place among its subtask's agents (see ``AGENT_RANKS``)."""
        return RESOLUTION_RANK if self.resolution else AGENT_RANKS[self.role]

    @property
    def state(self) -> str:
        """done, failed, journal (a recorded result served), skipped (budget) or interrupted."""
        if self.status is None:
            return "interrupted"
        if self.status == "finished":
            return "journal" if self.from_journal else "done"
        if self.status in ("skipped", "budget"):
            return self.status
        return "failed"

    @property
    def spent(self) -> float:
        """What it cost: its recorded cost once it ended, its requests' so far until then."""
        return self.cost if self.status is not None else self.paid

    @property
    def report(self) -> Report | None:
        return read_report(self.result) if self.status == "finished" else None

    @property
    def tokens(self) -> int:
        return self.usage.total_input + self.usage.output_tokens

    @property
    def saved(self) -> float:
        """Dollars its batched requests saved against the same requests sent at once."""
        return saved_by_batching(self.batched_cost)


@dataclass
class Fanout:
    """One Workflow call: a flat list of subtasks or an orchestration script, and its agents."""

    call: int
    started_at: float
    subtasks: int = 0
    not_run: int = 0
    #: ``3.2`` when worker 2 of call 3 made it; "" for the main agent's calls
    parent: str = ""
    #: how deep its agents are: 1 for the main agent's subagents
    depth: int = 1
    duration: float | None = None
    #: set when the call ran a script
    script_lines: int | None = None
    script_error: str | None = None
    agents: list[AgentRecord] = field(default_factory=list)
    #: its result as the model saw it, when that was condensed to fit the result budget
    condensed: CondensedResult | None = None
    #: its agents' compactions, in the order they happened
    compactions: list[Compaction] = field(default_factory=list)
    _by_key: dict[tuple[int, Role, bool], AgentRecord] = field(default_factory=dict, repr=False)

    def agent(self, index: int, role: Role, resolution: bool = False) -> AgentRecord:
        """The agent at ``index`` in ``role`` (``resolution``: the verifier of a resolution),
        created when first heard of."""
        key = (index, role, resolution)
        agent = self._by_key.get(key)
        if agent is None:
            agent = self._by_key[key] = AgentRecord(self.call, index, role, resolution)
            self.agents.append(agent)  # kept in index order, then worker, verifier, resolver
            self.agents.sort(key=lambda a: (a.index, a.rank))
        return agent

    def resolution_verifier(self, agent: AgentRecord) -> AgentRecord | None:
        """The verifier that checked ``agent``'s resolution, if it is a resolver and one did."""
        if agent.role != "resolver":
            return None
        return self._by_key.get((agent.index, "verifier", True))

    def verifier_of(self, worker: AgentRecord) -> AgentRecord | None:
        """The verifier that checked ``worker``, if one did.

        A flat fan-out gives a worker and its verifier the same index. A script numbers
        every agent apart, so there the verifier is the one whose prompt quotes both the
        worker's subtask and its result (a verification prompt carries both).
        """
        for agent in self.agents:
            if agent.role != "verifier" or agent.resolution:  # that one judged a resolution
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
    #: which subtasks' changes have gone to a resolver so far, as the events are read
    resolving: Resolving = field(default_factory=Resolving, repr=False)
    #: the agents' connections through the network proxy, and their questions to the user
    network: NetworkLog = field(default_factory=NetworkLog)
    #: which worker made each nested call
    tree: CallTree = field(default_factory=CallTree, repr=False)

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

    def subagent(self, call: int, index: int, role: Role, at: float) -> AgentRecord:
        """The subagent ``role call.index`` heard of now: a verifier heard of after its
        subtask's resolver is the one that checks the resolution (see :class:`Resolving`)."""
        resolution = self.resolving.checks_resolution(call, index, role)
        return self.fanout(call, at).agent(index, role, resolution)

    @property
    def agents(self) -> list[AgentRecord]:
        return [agent for fanout in self.fanouts for agent in fanout.agents]

    def maker(self, fanout: Fanout) -> AgentRecord | None:
        """The agent that made a nested call: the worker at its parent's place (a script's
        agent at that number when no worker is), if the turn has heard of it."""
        key = self.tree.maker(fanout.call)
        if key is None:
            return None
        call, index = key
        at_index = [a for f in self.fanouts if f.call == call for a in f.agents if a.index == index]
        workers = [agent for agent in at_index if agent.role == "worker"]
        return next(iter(workers or at_index), None)

    def nested(self, agent: AgentRecord) -> list[Fanout]:
        """The calls ``agent`` made itself, in their order."""
        return [f for f in self.fanouts if self.tree.maker(f.call) and self.maker(f) is agent]

    @property
    def top_fanouts(self) -> list[Fanout]:
        """The calls drawn at the top: the main agent's, and any whose maker is unknown."""
        return [fanout for fanout in self.fanouts if self.maker(fanout) is None]

    def subtree_cost(self, agent: AgentRecord) -> float:
        """What ``agent`` and every agent of every call nested under it spent."""
        if not self.tree or not self.nested(agent):
            return agent.spent
        costs = {f.call: sum(a.spent for a in f.agents) for f in self.fanouts}
        return self.tree.subtree_cost((agent.call, agent.index), agent.spent, costs)

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
    #: its Message Batches and who waited on them
    batches: BatchLog = field(default_factory=BatchLog)

    @property
    def agents(self) -> list[AgentRecord]:
        return [agent for turn in self.turns for agent in turn.agents]

    @property
    def elapsed(self) -> float:
        if self.first_at is None or self.last_at is None:
            return 0.0
        return max(0.0, self.last_at - self.first_at)


_AGENT_NAME = re.compile(r"(worker|verifier|resolver) (\d+)\.(\d+)")
_NAMED_ROLES: dict[str, Role] = {"worker": "worker", "verifier": "verifier", "resolver": "resolver"}


def read_session(
    rows: Iterable[EventRow], *, session: str = "", workdir: str = "", state: str | None = None
) -> SessionHistory:
    """A session's history from its event rows (in order); ``state`` adds the answers."""
    totals = SessionTotals()
    batches = BatchLog()
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
        batches.follow(event, at)
        if isinstance(event, TurnStarted):
            turns.append(Turn(len(turns) + 1, event.text, event.notices, at, last_at=at))
            continue
        if not turns:
            continue  # nothing to hang it on; it still counts in the totals
        _apply(turns[-1], event, at)
    if state is not None:
        for turn, answer in zip(turns, answers(state, len(turns)), strict=True):
            turn.answer = answer
    return SessionHistory(session, workdir, turns, totals, first_at, last_at, skipped, batches)


def _apply(turn: Turn, event: Event, at: float) -> None:
    """Fold one event into the turn it happened in."""
    turn.last_at = max(turn.last_at, at)
    turn.resolving.follow(event)
    if turn.network.follow(event, at):
        return
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
                agent.paid += event.cost
                agent.batched += event.batched
                agent.batched_cost += event.cost if event.batched else 0.0
        case BatchWaiting():
            agent = _agent_named(turn, event.agent, at)
            if agent is not None and event.batch_id not in agent.batches:
                agent.batches.append(event.batch_id)
        case BashDone() | McpCallDone():
            _command_done(turn, event, at)
        case ContextCompacted():
            _compacted(turn, event, at)
        case ResultCondensed():
            condensed = CondensedResult(event, at)
            turn.condensed.append(condensed)
            turn.fanout(event.call, at).condensed = condensed
        case ChangeSettled():
            worker = turn.fanout(event.call, at).agent(event.index, "worker")
            worker.change = SettledChange(event, at)
        case _:
            _apply_to_fanout(turn, event, at)


def _apply_to_fanout(turn: Turn, event: Event, at: float) -> None:
    """Fold an event of a fan-out or of one of its agents into the turn."""
    match event:
        case FanoutStarted():
            fanout = turn.fanout(event.call, at)
            fanout.started_at = at
            fanout.subtasks, fanout.not_run = event.subtasks, event.not_run
            fanout.parent, fanout.depth = event.parent, event.depth
            turn.tree.link(event.call, event.parent)
        case ScriptStarted():
            fanout = turn.fanout(event.call, at)
            fanout.started_at = at
            fanout.script_lines = event.lines
            fanout.parent, fanout.depth = event.parent, event.depth
            turn.tree.link(event.call, event.parent)
        case FanoutDone():
            turn.fanout(event.call, at).duration = event.duration
        case ScriptDone():
            fanout = turn.fanout(event.call, at)
            fanout.duration, fanout.script_error = event.duration, event.error
        case SubagentStarted():
            agent = turn.subagent(event.call, event.index, event.role, at)
            agent.started_at, agent.title, agent.prompt = at, event.title, event.prompt
            if event.node:  # a rerun after a lost node starts again elsewhere
                agent.node = event.node
        case SubagentDone():
            _subagent_done(turn, event, at)


def _command_done(turn: Turn, event: BashDone | McpCallDone, at: float) -> None:
    """A command is a step of the turn when the main agent ran it, else its agent's."""
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


def _compacted(turn: Turn, event: ContextCompacted, at: float) -> None:
    compaction = Compaction(event, at)
    turn.compactions.append(compaction)
    agent = _agent_named(turn, event.agent, at)
    if agent is None:  # the main agent's: a step of the turn, between its commands
        turn.steps.append(compaction)
    else:
        agent.activity.append(compaction)
        turn.fanout(agent.call, at).compactions.append(compaction)


def _subagent_done(turn: Turn, event: SubagentDone, at: float) -> None:
    agent = turn.subagent(event.call, event.index, event.role, at)
    agent.done_at = at
    if agent.started_at is None:  # a journal hit or a budget skip never started
        agent.started_at = at - max(0.0, event.duration)
    agent.status, agent.turns, agent.usage = event.status, event.turns, event.usage
    agent.duration, agent.from_journal = event.duration, event.from_journal
    agent.verdict, agent.result, agent.cost = event.verdict, event.result, event.cost
    if agent.batched:  # its requests' own costs: any it had to ask at once are at full price
        agent.cost = agent.paid
    if event.node:  # where it finished, if it was placed on a node
        agent.node = event.node
    if event.report_path:
        agent.report_path = event.report_path


def _agent_named(turn: Turn, name: str, at: float) -> AgentRecord | None:
    match = _AGENT_NAME.fullmatch(name)
    if match is None:
        return None
    return turn.subagent(int(match[2]), int(match[3]), _NAMED_ROLES[match[1]], at)


def answers(state: str, turns: int) -> list[str | None]:
    """The main agent's final answer to each user turn, from the saved conversation.

    User turns are the user messages with plain text content (tool results are lists). If
    their number does not match the recorded turns, the pairing cannot be trusted and no
    answers are given.
    """
    nothing: list[str | None] = [None] * turns
    try:
        history = read_history(json.loads(state)["history"])
    except (ValueError, TypeError, KeyError):
        return nothing
    found: list[str | None] = []
    for message in history:
        if message["role"] == "user" and isinstance(message["content"], str):
            found.append(None)
        elif message["role"] == "assistant" and found:
            found[-1] = _final_text(message["content"])
    return found if len(found) == turns else nothing


def _final_text(content: object) -> str | None:
    """The text of an assistant message that ends a turn; None if it asks for tools."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    if has_block(content, "tool_use"):
        return None
    return joined_text(content) or None
