"""Fan-outs inside fan-outs: the level a call runs at, and what a worker is given to nest.

A worker whose depth is below ``max_depth`` is offered Workflow (through
:data:`~orchmode.executors.nesting.NESTING`); its call runs on the session's own engine —
the same slots, store, budget ledger, events and call numbers — one level down, while the
worker waits parked (its slot given to the agents it started, and taken back before any
queued agent when they are done). The level is a context variable, so every agent the
nested call starts, and everything they start, knows its depth and its parent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from ..core.agents import AgentDefinition
from ..core.background import Background
from ..core.errors import OrchmodeError
from ..core.prompts import workflow_tool
from ..core.results import AgentResult, Status
from ..core.settings import Settings
from ..core.wire import ToolUseBlock
from ..executors import Executor, Job, TreeJob
from ..executors.local import LocalExecutor
from ..executors.nesting import Nesting
from ..executors.parking import PARKING, parked
from ..store import Store
from ..trees.nested import AGENT_WORKSPACE, change_so_far


class Engine(Protocol):
    """What nesting needs of the fan-out engine: its settings, store and roles, where its
    agents run, and a Workflow call run from start to end."""

    settings: Settings
    executor: Executor
    roles: Mapping[str, AgentDefinition]

    @property
    def store(self) -> Store: ...

    async def run(self, tool_input: object, tokens: int | None = None) -> tuple[str, bool]: ...


@dataclass(frozen=True)
class Level:
    """Where a Workflow call runs in the tree of agents."""

    #: The depth of the agents it starts: 1 for the main agent's.
    depth: int = 1
    #: ``3.2`` when worker 2 of call 3 made the call; "" for the main agent.
    parent: str = ""
    #: That worker's journal key: its children's keys are made under it.
    key: str = ""
    #: That worker's copy of the tree (None: it worked in the shared one).
    tree: TreeJob | None = None
    #: The nested call's own housekeeping, waited for before its result is given back
    #: (others' may go on meanwhile); None at the top, where the engine's is used.
    housekeeping: Background | None = field(default=None, compare=False)

    @property
    def nested(self) -> bool:
        return self.depth > 1


#: The level of the Workflow call whose agents run in this context.
LEVEL: ContextVar[Level] = ContextVar("orchmode_level", default=Level())  # noqa: B039


def nested_key(key: str) -> str:
    """``key`` placed under the parent's: the same subtask under two parents is two results
    (at the top, keys are as they always were)."""
    parent = LEVEL.get().key
    if not parent:
        return key
    return hashlib.sha256(f"{parent}/{key}".encode()).hexdigest()


def offers_nesting(engine: Engine, role: str) -> bool:
    """Whether an agent of ``role`` started at this level is offered Workflow: below
    ``max_depth``, running in this process (the level does not reach a Ray node, so there
    every agent is a leaf).

    Its verifier is offered the tool too, though only a worker may use it: the tools open
    every request, and the same tools keep one cached prefix across the whole wave."""
    return (
        role in ("worker", "verifier")
        and LEVEL.get().depth < engine.settings.max_depth
        and isinstance(engine.executor, LocalExecutor)
    )


def too_deep(engine: Engine) -> str | None:
    """Why a call at this level may not run (a script's agents included), or None."""
    limit = engine.settings.max_depth
    if LEVEL.get().depth <= limit:
        return None
    return (
        f"error: this Workflow call would start agents {LEVEL.get().depth} levels deep, past "
        f"max_depth ({limit}). Do the work yourself and call report_findings."
    )


def nesting_for(engine: Engine, call: int, index: int, job: Job) -> Nesting | None:
    """What worker ``index`` of call ``call`` is given to fan out; None if it may not."""
    if not offers_nesting(engine, job.role):
        return None
    level = LEVEL.get()
    below = Level(level.depth + 1, f"{call}.{index}", job.key, job.tree, Background())
    calls_key = _call_key(job.key)

    async def fan_out(tool_input: object, tokens: int | None) -> tuple[str, bool]:
        entered = LEVEL.set(below)
        try:
            async with parked(PARKING.get()):  # its slot goes to its children meanwhile
                return await engine.run(tool_input, tokens)
        finally:
            LEVEL.reset(entered)

    async def recorded_call() -> ToolUseBlock | None:
        if engine.settings.fresh:
            return None
        found = await engine.store.lookup(calls_key)
        if found is None:
            return None
        block: ToolUseBlock = json.loads(found.text)
        return block

    async def record_call(tool_use: ToolUseBlock) -> None:
        text = json.dumps(dict(tool_use), sort_keys=True, ensure_ascii=False)
        prompt = f"the Workflow call of worker {call}.{index}"
        await engine.store.record(calls_key, "main", prompt, AgentResult(text, Status.FINISHED))

    return Nesting(workflow_tool(engine.roles), level.depth, fan_out, recorded_call, record_call)


def _call_key(worker_key: str) -> str:
    """Where the journal keeps the Workflow call the worker at ``worker_key`` made."""
    return hashlib.sha256(f"Workflow call of {worker_key}".encode()).hexdigest()


async def child_tree(level: Level) -> TreeJob | None:
    """The copy a nested call's workers start from: their parent's workspace as it is now
    (its snapshot with what it has written so far on top), or None when the parent worked
    in the shared tree.

    Raises when the parent's workspace is not open here: its children must not fall back
    to the working directory, where their changes would skip the parent's verification.
    """
    if level.tree is None:
        return None
    here = AGENT_WORKSPACE.get()
    if here is None:
        raise OrchmodeError(
            f"worker {level.parent} has no workspace open in this process for its agents to "
            "start from"
        )
    workspace = await here.opened()  # a call in the worker's first reply comes early
    so_far = await change_so_far(workspace)
    return TreeJob(so_far.base, patch=so_far.patch, ignored=workspace.spec.ignored)
