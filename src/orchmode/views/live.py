"""The Rich live view of a run on a terminal: commands, each Workflow call's agents, totals.

An event subscriber like the plain progress, but it keeps state — every agent's row from
queued to its verdict — and redraws it in place. Each user turn gets its own live region,
started by ``TurnStarted`` and stopped by ``TurnDone`` (or :meth:`LiveView.stop` when a
turn is cut short), so the answers printed between turns never fight with the redraws.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO, cast

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..core.events import (
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BashStarted,
    BudgetStatus,
    ChangeSettled,
    ContextCompacted,
    Event,
    FanoutDone,
    FanoutStarted,
    McpCallDone,
    McpCallStarted,
    ModelRefused,
    ModelRequestDone,
    NetworkConnection,
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
from ..records.agent_tree import CostRollUp
from ..records.batches import BatchLog
from ..records.history import Resolving
from ..records.network import NetworkLog, connection_text, hint, question_text
from ..records.totals import SessionTotals, web_uses
from ..records.wording import compaction_text, condensed_text, seconds
from .escape import visible, visible_event
from .live_calls import (
    BUDGET,
    DONE,
    FAILED,
    JOURNAL,
    QUEUED,
    RUNNING,
    SKIPPED,
    AgentRow,
    CallView,
)
from .progress import CHANGE_STYLES

#: Commands kept on screen; a long turn shows its latest ones and how many came before.
COMMANDS_SHOWN = 12
#: Refused domains kept on screen (one line per agent and domain), the latest ones.
DENIALS_SHOWN = 8
#: Batches the live view lists: the latest, as a long run sends many.
BATCHES_SHOWN = 6

#: The subagents' names begin with their role: ``worker 2.7``, ``resolver 2.7``.
_SUBAGENTS = ("worker", "verifier", "resolver")

_STYLES = {
    QUEUED: "dim",
    RUNNING: "yellow",
    JOURNAL: "cyan",
    DONE: "green",
    FAILED: "red",
    SKIPPED: "magenta",
    BUDGET: "magenta",
}


def _short(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _counted_only(event: Event) -> bool:
    """A connection let through: it only moves a count, so it waits for the next of the four
    redraws a second (a ``pip install`` in each of 100 agents makes thousands)."""
    return isinstance(event, NetworkConnection) and event.decision != "denied"


def _tokens(usage: TokenUsage) -> int:
    return usage.total_input + usage.output_tokens


def _change_cell(change: ChangeSettled | None, resolver: bool = False) -> Text | str:
    """``+10 −2 merged``, ``+3 −1 conflict``, ``+1 −0 not merged (refuted)``; after a
    resolver (``resolver``), ``+3 −1 merged (resolved)`` or ``+3 −1 conflict (unresolved)``."""
    if change is None:
        return ""
    fate = change.fate
    if fate == "not merged" and change.detail:
        fate += f" ({_short(change.detail, 30)})"
    elif fate == "merged" and (resolver or change.detail):  # its only detail: what it resolved
        fate += " (resolved)"
    elif fate == "conflict" and resolver:
        fate += " (unresolved)"
    style = CHANGE_STYLES.get(change.fate, "")
    return Text(_short(f"+{change.added} −{change.removed} {fate}", 40), style=style)


@dataclass
class LiveView:
    """The live view's state, fed by events; :meth:`renderable` draws it at any moment."""

    totals: SessionTotals
    console: Console | None = None
    clock: Callable[[], float] = time.monotonic
    calls: dict[int, CallView] = field(default_factory=dict)
    commands: list[BashDone | McpCallDone] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.began = self.clock()
        self.commands_before = 0
        #: the budget as the last Workflow call left it (none before the first)
        self.budget_line = ""
        #: the turn's latest compaction, and how many there were: why an agent forgot
        self.compaction: ContextCompacted | None = None
        self.compactions = 0
        #: which subtasks' changes have gone to a resolver: tells a resolution's verifier
        self.resolving = Resolving()
        #: the turn's connections through the network proxy and its questions to the user
        self.network = NetworkLog()
        #: the turn's Message Batches and the agents waiting on one
        self.batches = BatchLog()
        #: which worker made each nested call, and what each call's agents have spent
        self.costs = CostRollUp()
        self._lock = threading.Lock()  # Rich redraws from its own thread
        self._live: Live | None = None

    @classmethod
    def on_stream(cls, stream: TextIO, totals: SessionTotals) -> LiveView:
        return cls(totals, Console(file=stream, stderr=True))

    def __call__(self, event: Event) -> None:
        event = visible_event(event)  # its texts are the agents': escaped before they are kept
        with self._lock:
            self._apply(event)
        if isinstance(event, ModelRefused):  # a line above the live region, as it happens
            self.notice(f"[{event.agent}] {event.text}")
        elif isinstance(event, ApprovalAnswered):  # kept above the region once answered
            answered = self.network.approvals.get(event.id)
            if answered is not None:
                self.notice(f"approval {event.id} · {event.agent}: {answered.outcome()}")
        if isinstance(event, TurnStarted):
            self._start()
        elif isinstance(event, TurnDone):
            self.stop()
        elif self._live is not None and not _counted_only(event):
            self._live.refresh()

    def notice(self, text: str) -> None:
        console = self.console or Console(stderr=True)
        text = visible(text)
        if self._live is not None:
            self._live.console.print(Text(text))  # printed above the live region
        else:
            console.print(Text(text), soft_wrap=True)

    def _start(self) -> None:
        if self.console is None or self._live is not None:
            return
        self._live = Live(
            console=self.console,
            get_renderable=self._locked_render,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def stop(self) -> None:
        """Draw the final frame and give the terminal back."""
        live, self._live = self._live, None
        if live is not None:
            live.stop()

    def _locked_render(self) -> RenderableType:
        with self._lock:
            return self.renderable()

    def _apply(self, event: Event) -> None:
        self.resolving.follow(event)
        self.costs.follow(event)
        if isinstance(event, NetworkConnection | ApprovalRequested | ApprovalAnswered):
            self.network.follow(event, self.clock())
            return
        if self.batches.follow(event, self.clock()):
            return
        match event:
            case TurnStarted():
                self.calls.clear()
                self.commands.clear()
                self.commands_before = 0
                self.compaction, self.compactions = None, 0
                self.resolving = Resolving()
                self.network = NetworkLog()
                self.batches = BatchLog()
                self.costs = CostRollUp()
            case BashStarted(agent=agent, command=command):
                row = self._row_of(agent)
                if row is not None:
                    row.running = command
            case McpCallStarted(agent=agent):
                row = self._row_of(agent)
                if row is not None:
                    row.running = f"mcp {event.server}/{event.tool}"
            case BashDone() | McpCallDone():
                self._command_done(event)
            case ModelRequestDone(agent=agent):
                self._count_request(agent, event.usage, event.cost)
            case BudgetStatus(line=line):
                self.budget_line = line
            case ContextCompacted():
                self.compaction = event
                self.compactions += 1
            case _:
                self._apply_to_call(event)

    def _apply_to_call(self, event: Event) -> None:
        """Fold an event of one Workflow call, or of one of its agents, into its view."""
        match event:
            case FanoutStarted(call=call, subtasks=n, not_run=not_run):
                view = self.calls.setdefault(call, CallView(call))
                view.subtasks, view.not_run = n, not_run
                for index in range(1, n + 1):
                    view.row(index, "worker")
            case ScriptStarted(call=call):
                self.calls.setdefault(call, CallView(call, script=True))
            case SubagentStarted():
                self._subagent_started(event)
            case SubagentDone():
                self._subagent_done(event)
            case FanoutDone(call=call, duration=duration):
                self._call(call).duration = duration
            case ScriptDone(call=call, duration=duration, error=error):
                view = self._call(call)
                view.duration, view.error = duration, error
            case ResultCondensed(call=call):
                self._call(call).condensed = event
            case ChangeSettled(call=call, index=index):
                self._call(call).row(index, "worker").change = event

    def _command_done(self, event: BashDone | McpCallDone) -> None:
        row = self._row_of(event.agent)
        if row is not None:
            row.running = ""
        self.commands.append(event)
        if len(self.commands) > COMMANDS_SHOWN:
            self.commands.pop(0)
            self.commands_before += 1

    def _subagent_started(self, event: SubagentStarted) -> None:
        call, index, role, title = event.call, event.index, event.role, event.title
        view = self._call(call)
        row = view.row(index, role, self.resolving.checks_resolution(call, index, role))
        if role != "worker":  # its prompt is a stock brief: show the subtask
            title = view.subtask(index) or title
        row.title, row.state, row.started = title, RUNNING, self.clock()
        if event.node:  # a rerun after a lost node starts again elsewhere
            row.node = event.node

    def _subagent_done(self, event: SubagentDone) -> None:
        call, index, role = event.call, event.index, event.role
        view = self._call(call)
        row = view.row(index, role, self.resolving.checks_resolution(call, index, role))
        row.status, row.turns, row.verdict = event.status, event.turns, event.verdict
        row.usage, row.cost, row.duration = event.usage, event.cost, event.duration
        row.state = self._state(event)
        if event.node:
            row.node = event.node
        if not row.title and role != "worker":
            row.title = view.subtask(index)

    @staticmethod
    def _state(event: SubagentDone) -> str:
        if event.from_journal:
            return JOURNAL
        if event.status == "finished":
            return DONE
        if event.status == "budget":
            return BUDGET
        return SKIPPED if event.status == "skipped" else FAILED

    def _call(self, call: int) -> CallView:
        return self.calls.setdefault(call, CallView(call))

    def _row_of(self, agent: str) -> AgentRow | None:
        """The row of a subagent named like ``worker 2.7`` (call 2, subtask 7), if shown."""
        name, _, place = agent.partition(" ")
        call, _, index = place.partition(".")
        if name not in _SUBAGENTS or not (call.isdigit() and index.isdigit()):
            return None
        role = cast(Role, name)
        view = self.calls.get(int(call))
        resolution = self.resolving.checks_resolution(int(call), int(index), role)
        return view.rows.get((int(index), role, resolution)) if view else None

    def _count_request(self, agent: str, usage: TokenUsage, cost: float) -> None:
        """A running agent's tokens so far, from its requests."""
        row = self._row_of(agent)
        if row is not None and row.state == RUNNING:
            row.usage, row.cost = row.usage + usage, row.cost + cost

    def renderable(self) -> RenderableType:
        now = self.clock()
        parts: list[RenderableType] = []
        if self.commands:
            parts.append(self._commands())
        for view in self.calls.values():
            if self.costs.tree.maker(view.call) is not None:
                continue  # drawn in its maker's table, under its maker
            parts.append(self._table(view, now))
            if view.condensed is not None:  # a line under its table, the layout unchanged
                parts.append(Text(condensed_text(view.condensed), style="yellow"))
        if self.compaction is not None:
            parts.append(self._context_line(self.compaction))
        if self.network.reaches:
            parts.append(self._network())
        if self.batches:
            parts.append(self._batches(now))
        if self.network.pending:  # last above the footer: where the eye lands
            parts.append(self._waiting(now))
        parts.append(self.footer(now))
        return Group(*parts)

    def _network(self) -> Table:
        """Each agent's connections counted, and every refused domain once per agent."""
        denials = self.network.denials()
        title = "network"
        if len(denials) > DENIALS_SHOWN:
            title += f" ({len(denials) - DENIALS_SHOWN} earlier refusals not shown)"
        table = Table(title=Text(title), title_justify="left", show_header=False, box=None)
        table.add_column("agent", no_wrap=True)
        table.add_column("what")
        for traffic in self.network.traffic():
            if traffic.domains:  # an agent only refused has its refusals' lines below
                table.add_row(Text(f"[{traffic.agent}]"), Text(traffic.summary()))
        for reach in denials[-DENIALS_SHOWN:]:
            table.add_row(Text(f"[{reach.agent}]"), Text(connection_text(reach), style="red"))
        return table

    def _batches(self, now: float) -> Table:
        """The turn's latest batches: requests, state, age, and how many agents wait on each."""
        shown = list(self.batches.batches.values())[-BATCHES_SHOWN:]
        title = "batches"
        if len(self.batches.batches) > len(shown):
            title += f" ({len(self.batches.batches) - len(shown)} earlier not shown)"
        table = Table(title=Text(title), title_justify="left", show_header=False, box=None)
        for column in ("batch", "requests", "state", "age", "waiting"):
            table.add_column(column, no_wrap=True)
        waiting = list(self.batches.waiting.values())
        for batch in shown:
            style = "yellow" if batch.ended is None else "green"
            agents = waiting.count(batch.batch_id)
            table.add_row(
                Text(batch.batch_id),
                f"{batch.requests} requests" if batch.requests else "",
                Text(batch.state, style=style),
                seconds(batch.age(now)),
                f"{agents} agent{'s' if agents != 1 else ''} waiting" if agents else "",
            )
        return table

    def _waiting(self, now: float) -> Panel:
        """The parked agents, each with its question and how to answer it."""
        lines = Text()
        for approval in self.network.pending:
            waited = approval.waited(now) or 0.0
            if lines:
                lines.append("\n")
            lines.append(f"{approval.agent} · approval {approval.id}", style="bold")
            so_far = f"{waited:.0f} s" if waited < 60 else seconds(waited)  # 3 min 07 s
            lines.append(f" · waiting {so_far}\n  {question_text(approval)}")
            lines.append(f"\n  answer: {hint(approval.id)}")
        count = len(self.network.pending)
        title = f"waiting for approval ({count})" if count > 1 else "waiting for approval"
        return Panel(lines, title=Text(title, style="bold"), title_align="left",
                     border_style="bold yellow", expand=False)  # fmt: skip

    def _context_line(self, latest: ContextCompacted) -> Text:
        """The turn's latest compaction, above the footer, and how many came before it."""
        earlier = self.compactions - 1
        before = f" ({earlier} earlier this turn)" if earlier else ""
        return Text(f"context{before} · {latest.agent}: {compaction_text(latest)}", style="yellow")

    def _commands(self) -> Table:
        title = "commands"
        if self.commands_before:
            title += f" ({self.commands_before} earlier not shown)"
        table = Table(title=Text(title), title_justify="left", show_header=False, box=None)
        for column in ("agent", "command", "took", "status"):
            table.add_column(column, no_wrap=column != "command")
        for done in self.commands:
            if isinstance(done, McpCallDone):
                shown = f"mcp {done.server}/{done.tool}"
                status = "ok" if done.ok else f"error: {_short(done.error, 40)}"
                good = done.ok
            else:
                shown = "$ " + done.command
                status = "timed out" if done.timed_out else f"exit {done.exit_code}"
                good = done.exit_code == 0 and not done.timed_out
            table.add_row(
                Text(f"[{done.agent}]"),
                Text(_short(shown, 102)),
                f"{done.duration:.1f} s",
                Text(status, style="green" if good else "red"),
            )
        return table

    def _title(self, view: CallView) -> str:
        workers, verifiers = view.wave("worker"), view.wave("verifier")
        kind = "script" if view.script else "fan-out"
        title = (
            f"Workflow {view.call} ({kind}) · workers {workers[0]}/{workers[1]} · "
            f"verifiers {verifiers[0]}/{verifiers[1]}"
        )
        resolvers = view.wave("resolver")
        if resolvers[1]:  # only a call whose changes conflicted had any
            title += f" · resolvers {resolvers[0]}/{resolvers[1]}"
        if view.not_run:
            title += f" · {view.not_run} over the per-call limit not run"
        if view.duration is not None:
            title += f" · done in {view.duration:.1f} s"
        if view.error:
            title += f" · failed: {_short(view.error, 60)}"
        return title

    def _nested(self, view: CallView, row: AgentRow) -> list[CallView]:
        """The calls the worker in ``row`` made, as far as they are shown."""
        if row.role != "worker":
            return []
        calls = self.costs.tree.calls_by((view.call, row.index))
        return [self.calls[call] for call in calls if call in self.calls]

    def _subtree(self, view: CallView) -> list[CallView]:
        """``view`` and every call nested under its workers."""
        found = [view]
        for row in view.rows.values():
            for nested in self._nested(view, row):
                found.extend(self._subtree(nested))
        return found

    def _table(self, view: CallView, now: float) -> Table:
        # Text, never markup: a script's error can quote the model's words, [brackets] and all
        table = Table(title=Text(self._title(view)), title_justify="left", expand=False)
        table.add_column("#", justify="right")
        table.add_column("subtask", max_width=48, no_wrap=True, overflow="ellipsis")
        rows = [row for shown in self._subtree(view) for row in shown.rows.values()]
        # Only a call with an agent on a cluster node shows where each ran.
        nodes = any(row.node for row in rows)
        for name in ("role", "node", "state") if nodes else ("role", "state"):
            table.add_column(name, no_wrap=True)
        for name in ("turns", "tokens", "cost", "elapsed"):
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("now", max_width=40, no_wrap=True, overflow="ellipsis")
        table.add_column("verdict", no_wrap=True)
        # Only a call whose workers changed their copies of the tree shows what became of it.
        changes = any(row.change for row in rows)
        if changes:
            table.add_column("change", max_width=40, no_wrap=True, overflow="ellipsis")
        self._add_rows(table, view, now, (nodes, changes), "")
        return table

    def _add_rows(
        self, table: Table, view: CallView, now: float, shown: tuple[bool, bool], indent: str
    ) -> None:
        """``view``'s rows, each worker's nested calls under it, indented a step deeper."""
        nodes, changes = shown
        resolved = {row.index for row in view.rows.values() if row.role == "resolver"}
        for row in sorted(view.rows.values(), key=lambda r: (r.index, r.order)):
            elapsed = row.elapsed(now)
            state = row.state if row.state != FAILED else f"{FAILED} ({row.status})"
            nested = self._nested(view, row)
            table.add_row(
                f"{view.call}.{row.index}" if indent else str(row.index),
                Text(indent + (row.title or "…")),
                row.label,
                *([Text(row.node)] if nodes else []),
                Text(state, style=_STYLES[row.state]),
                str(row.turns) if row.turns else "",
                f"{_tokens(row.usage):,}" if _tokens(row.usage) else "",
                self._cost_cell(view, row) if nested else f"${row.cost:.3f}" if row.cost else "",
                f"{elapsed:.1f} s" if elapsed is not None else "",
                self._now_cell(row),
                Text(row.verdict or ""),
                *([_change_cell(row.change, row.index in resolved)] if changes else []),
            )
            for call in nested:
                inner = indent + "  "
                table.add_row("", Text(f"{inner}› {self._title(call)}", style="bold"))
                self._add_rows(table, call, now, shown, inner)

    def _cost_cell(self, view: CallView, row: AgentRow) -> str:
        """A worker that made calls: its own cost and its subtree's, so far."""
        subtree = self.costs.subtree_cost((view.call, row.index), row.cost)
        return f"own ${row.cost:.3f} · subtree ${subtree:.3f}"

    def _now_cell(self, row: AgentRow) -> Text | str:
        """What the agent does now: the approval it is parked on, or its command."""
        for parked in self.network.pending:
            if row.state == RUNNING and self._row_of(parked.agent) is row:
                return Text(f"waiting for approval {parked.id}", style="bold yellow")
        for agent, batch_id in self.batches.waiting.items():
            if row.state == RUNNING and self._row_of(agent) is row:
                return Text(f"waiting on batch {batch_id}", style="cyan")
        return Text("$ " + _short(row.running, 60)) if row.running else ""

    def footer(self, now: float | None = None) -> Text:
        """Session totals: tokens, the share of input read from cache, dollars, elapsed."""
        total = self.totals.all
        elapsed = (self.clock() if now is None else now) - self.began
        budget = f" · budget: {self.budget_line}" if self.budget_line else ""
        if total.batched:
            budget = f" · {total.batched} batched, ${total.saved:.2f} saved" + budget
        models = visible(self.totals.describe_models())  # the names the API answered with
        web = web_uses(total.usage)
        return Text(
            f"session · {total.requests} requests · {_tokens(total.usage):,} tokens · "
            f"{total.usage.cache_hit:.0%} cache hit · {web + ' · ' if web else ''}"
            f"${total.cost:.2f} · {elapsed:.1f} s"
            f"{budget}" + (f"\nmodels · {models}" if models else ""),
            style="bold",
        )
