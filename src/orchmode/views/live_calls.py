"""The live view's state of each Workflow call: its agents' rows, their states and waves."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.events import ChangeSettled, ResultCondensed, Role, TokenUsage
from ..records.history import AGENT_RANKS, RESOLUTION_RANK
from ..records.wording import STATUS_WORDS

QUEUED = "queued"
RUNNING = "running"
JOURNAL = "journal hit"
DONE = "done"
FAILED = "failed"
SKIPPED = "skipped by budget"
BUDGET = STATUS_WORDS["budget"]


@dataclass
class AgentRow:
    index: int
    role: Role
    #: set on the verifier that checks a resolver's resolution, not the worker's change
    resolution: bool = False
    title: str = ""
    state: str = QUEUED
    status: str = ""
    turns: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0
    started: float | None = None
    duration: float | None = None
    verdict: str | None = None
    #: the bash command it is running at this moment, if any
    running: str = ""
    #: the Ray node it runs on; empty in the user's own process
    node: str = ""
    #: what became of a worker's change to its copy of the tree, once settled
    change: ChangeSettled | None = None

    def elapsed(self, now: float) -> float | None:
        if self.duration is not None:
            return self.duration
        return now - self.started if self.started is not None else None

    @property
    def label(self) -> str:
        """Its role as shown: a resolution's verifier is told from the worker's verifier."""
        return "verifier (resolution)" if self.resolution else self.role

    @property
    def order(self) -> int:
        return RESOLUTION_RANK if self.resolution else AGENT_RANKS[self.role]


@dataclass
class CallView:
    """One Workflow call: a fan-out of ``subtasks`` chains, or a script's agents."""

    call: int
    script: bool = False
    subtasks: int = 0
    not_run: int = 0
    rows: dict[tuple[int, Role, bool], AgentRow] = field(default_factory=dict)
    duration: float | None = None
    error: str | None = None
    #: set when the model got this call's result condensed to fit the result budget
    condensed: ResultCondensed | None = None

    def row(self, index: int, role: Role, resolution: bool = False) -> AgentRow:
        """The row of ``role`` at ``index`` (``resolution``: the verifier of a resolution)."""
        key = (index, role, resolution)
        if key not in self.rows:
            self.rows[key] = AgentRow(index, role, resolution)
        return self.rows[key]

    def subtask(self, index: int) -> str:
        """The title of the worker at ``index``, if there is one (a script's verifier has a
        number of its own, with no worker at it)."""
        worker = self.rows.get((index, "worker", False))
        return worker.title if worker is not None else ""

    def wave(self, role: Role) -> tuple[int, int]:
        """(finished, expected) for one wave; a fan-out expects a worker and a verifier per
        subtask, and a resolver only for a change that conflicted."""
        rows = [r for r in self.rows.values() if r.role == role and not r.resolution]
        finished = sum(r.state not in (QUEUED, RUNNING) for r in rows)
        fixed = self.script or role == "resolver"
        expected = len(rows) if fixed else max(self.subtasks, len(rows))
        return finished, expected
