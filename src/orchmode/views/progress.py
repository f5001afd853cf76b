"""Plain progress lines on stderr, drawn from events: what the agents are doing, as it happens."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from ..core.events import (
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BatchEnded,
    BatchSent,
    ChangeSettled,
    ContextCompacted,
    Event,
    FanoutDone,
    FanoutStarted,
    McpCallDone,
    ModelRefused,
    ModelRequestDone,
    NetworkConnection,
    ResultCondensed,
    ScriptDone,
    ScriptStarted,
    SubagentDone,
    TokenUsage,
    TurnStarted,
    WorkspacesChosen,
)
from ..records.agent_tree import CostRollUp
from ..records.batches import BatchLog
from ..records.history import Resolving
from ..records.network import hint, question_text
from ..records.totals import web_uses
from ..records.wording import change_fate, compaction_text, condensed_text, seconds, status_words
from .escape import visible_event

#: A settled change's fate, coloured: merged is good news, a conflict or a refusal is not.
CHANGE_STYLES = {
    "merged": "green",
    "conflict": "red",
    "refused": "red",
    "not merged": "yellow",
    "kept": "cyan",
}


#: Seconds between two lines saying what waits on a batch, while anything does.
WAITING_EVERY = 60.0

#: A line's opening ``[workflow 7]`` or ``[worker 7.1]``: where a nested call's path goes.
_OPENING = re.compile(r"\[(?:workflow (\d+)|(?:worker|verifier|resolver) (\d+)\.\d+)[\] ]")


def _one_line(text: str, width: int = 100) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _usage(usage: TokenUsage, cost: float) -> str:
    web = web_uses(usage)
    return (
        f"{usage.total_input + usage.output_tokens:,} tokens, "
        f"{usage.cache_hit:.0%} of input cached, {web + ', ' if web else ''}${cost:.3f}"
    )


def workspaces_text(event: WorkspacesChosen) -> str:
    """The one line that says what the agents' workspaces are, and why."""
    if event.overlays:
        return "each agent works in an overlay on one checkout of the tree"
    return f"each agent works in a full copy of the tree: {_one_line(event.reason)}"


def change_count(event: ChangeSettled) -> str:
    """The files text up to its list of files: ``2 files (+10 −2)``."""
    return event.files.partition(":")[0].strip()


def change_text(event: ChangeSettled, *, whole: bool = True) -> str:
    """A worker's change settled: its fate, its files (``whole``) or their count, its patch."""
    files = event.files.strip() if whole else change_count(event)
    line = change_fate(event) + (f": {files}" if files else "")
    if event.path:
        line += f" — patch kept at {event.path}"
    if event.left_out:
        line += f" — left out as too big for a patch: {event.left_out}"
    return line


def mcp_call_text(event: McpCallDone) -> str:
    """``mcp github/search  (0.4 s, ok)``: an MCP call as a plain line shows it."""
    status = "ok" if event.ok else f"error: {_one_line(event.error) or 'failed'}"
    return f"mcp {event.server}/{event.tool}  ({event.duration:.1f} s, {status})"


def approval_text(event: ApprovalRequested) -> str:
    """``[worker 1.2] waiting for approval 3: domain pypi.org:443 (why) — answer: …``."""
    return (
        f"[{event.agent}] waiting for approval {event.id}: {question_text(event)} "
        f"— answer: {hint(event.id)}"
    )


def answered_text(event: ApprovalAnswered) -> str:
    """``approval 3 approved (remembered for this directory): reason``."""
    line = f"approval {event.id} {event.answer}"
    if event.always:
        line += " (remembered for this directory)"
    return line + (f": {_one_line(event.reason)}" if event.reason else "")


def denied_text(event: NetworkConnection) -> str:
    """``network: denied evil.example:443 (rule)``."""
    rule = event.rule or "named by no rule"
    return " ".join(f"network: denied {event.domain}:{event.port} ({rule})".split())


def batch_ended_text(event: BatchEnded) -> str:
    """``msgbatch_01 ended after 42 s: 6 succeeded, 1 expired``."""
    outcomes = (
        ("succeeded", event.succeeded),
        ("errored", event.errored),
        ("expired", event.expired),
        ("canceled", event.canceled),
    )
    counts = ", ".join(f"{n} {outcome}" for outcome, n in outcomes if n) or "no results"
    return f"{event.batch_id} ended after {seconds(event.duration)}: {counts}"


@dataclass
class StderrProgress:
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    resolving: Resolving = field(default_factory=Resolving)
    #: (agent, domain) refusals already said this turn: a retrying tool says nothing new
    refused: set[tuple[str, str]] = field(default_factory=set)
    #: the batches sent and the agents waiting on them, said every ``WAITING_EVERY`` seconds
    batches: BatchLog = field(default_factory=BatchLog)
    #: which worker made each nested call, and what each call's agents spent
    costs: CostRollUp = field(default_factory=CostRollUp)
    _waiting_timer: asyncio.TimerHandle | None = None

    def _say_waiting(self) -> None:
        """Say what waits on batches now, and again in a while if anything still does."""
        self._waiting_timer = None
        text = self.batches.waiting_text(time.time())
        if text:
            print(f"[batch] {text}", file=self.stream, flush=True)
            self._keep_saying_waiting()

    def _keep_saying_waiting(self) -> None:
        if self._waiting_timer is not None or not self.batches.waiting:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # events read back outside a run: nothing is waiting now
            return
        self._waiting_timer = loop.call_later(WAITING_EVERY, self._say_waiting)

    def __call__(self, event: Event) -> None:
        event = visible_event(event)  # its texts are the agents': escaped before use
        self.batches.follow(event, time.time())
        self._keep_saying_waiting()
        if isinstance(event, TurnStarted):
            self.refused.clear()
        if isinstance(event, NetworkConnection):
            # Allowed ones are not listed (a pip install makes dozens); each refused
            # domain is said once per agent.
            if event.decision != "denied" or (event.agent, event.domain) in self.refused:
                return
            self.refused.add((event.agent, event.domain))
        self.resolving.follow(event)
        resolution = isinstance(event, SubagentDone) and self.resolving.checks_resolution(
            event.call, event.index, event.role
        )
        self.costs.follow(event)
        line = self.describe(event, resolution=resolution)
        if line:
            print(self._placed(line, event), file=self.stream, flush=True)

    def _placed(self, line: str, event: Event) -> str:
        """A nested call's line says where it is (``[worker 3.2 › workflow 7]``), and a
        worker that made calls says, when it ends, what its whole subtree cost."""
        if not self.costs.tree:
            return line  # a flat run's lines read as they always have
        opening = _OPENING.match(line)
        if opening is not None:
            path = self.costs.tree.path(int(opening[1] or opening[2]))
            line = f"[{path}{line[1:]}"
        if isinstance(event, SubagentDone) and event.role == "worker":
            key = (event.call, event.index)
            if self.costs.tree.calls_by(key):
                subtree = self.costs.subtree_cost(key, event.cost)
                line += f" · own ${event.cost:.3f} · subtree ${subtree:.3f}"
        return line

    @classmethod
    def describe(cls, event: Event, *, resolution: bool = False) -> str | None:
        """``event``'s line; ``resolution`` when it is the verifier of a resolution."""
        line = cls._describe(event, resolution)
        if line and isinstance(event, SubagentDone) and event.node:
            line += f" on {event.node}"  # a Ray node; nothing when it ran in this process
        return line

    @staticmethod
    def _describe(event: Event, resolution: bool) -> str | None:
        match event:
            case BashDone(agent=agent, command=command, exit_code=code, timed_out=timed_out):
                status = "timed out" if timed_out else f"exit {code}"
                return f"[{agent}] $ {_one_line(command)}  ({event.duration:.1f} s, {status})"
            case McpCallDone(agent=agent):
                return f"[{agent}] {mcp_call_text(event)}"
            case FanoutStarted(call=call, subtasks=n, not_run=not_run):
                extra = f", {not_run} over the per-call limit not run" if not_run else ""
                return f"[workflow {call}] fanning out {n} subtasks{extra}"
            case SubagentDone(from_journal=True, role=role, call=call, index=i):
                who = "verify resolution" if resolution else role
                return f"[workflow {call}] {who} {i}: result taken from the journal"
            case SubagentDone(role="verifier", call=call, index=i, verdict=verdict):
                what = "verify resolution" if resolution else "verify"
                return (
                    f"[workflow {call}] {what} {i}: {verdict or status_words(event.status)} "
                    f"({event.duration:.1f} s, {_usage(event.usage, event.cost)})"
                )
            case SubagentDone(role=role, call=call, index=i, status=status, turns=turns):
                return (
                    f"[workflow {call}] {role} {i}: {status_words(status)} after {turns} turns "
                    f"({event.duration:.1f} s, {_usage(event.usage, event.cost)})"
                )
            case FanoutDone(call=call, duration=duration):
                return f"[workflow {call}] done in {duration:.1f} s"
            case ScriptStarted(call=call, lines=lines):
                return f"[workflow {call}] running a script of {lines} lines"
            case ScriptDone(call=call, duration=duration, agents=n, error=str(error)):
                why = _one_line(error)
                return f"[workflow {call}] script failed after {duration:.1f} s, {n} agents: {why}"
            case ScriptDone(call=call, duration=duration, agents=n):
                return f"[workflow {call}] script done in {duration:.1f} s, {n} agents"
            case ContextCompacted(agent=agent):
                return f"[context] {agent}: {compaction_text(event)}"
            case ResultCondensed(call=call):
                return f"[workflow {call}] {condensed_text(event)}"
            case ChangeSettled(call=call, index=i):
                line = f"[workflow {call}] change {call}.{i} {change_text(event, whole=False)}"
                return " ".join(line.split())  # one line, whatever the file names hold
            case WorkspacesChosen():
                return f"[isolation] {workspaces_text(event)}"
            case BatchSent(batch_id=batch_id, requests=n):
                return f"[batch] sent {batch_id}: {n} request{'s' if n != 1 else ''}"
            case BatchEnded():
                return f"[batch] {batch_ended_text(event)}"
            case ModelRefused(agent=agent):
                return f"[{agent}] {_one_line(event.text)}"
            case ApprovalRequested():
                return " ".join(approval_text(event).split())
            case ApprovalAnswered(agent=agent):
                return f"[{agent}] {answered_text(event)}"
            case NetworkConnection(agent=agent, decision="denied"):
                return f"[{agent}] {denied_text(event)}"
            case ModelRequestDone(agent=agent, cache_miss=str(reason), cache_missed_tokens=n):
                return f"[{agent}] prompt cache miss: {reason} ({n:,} tokens not read from cache)"
        return None
