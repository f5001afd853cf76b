"""What a worker may start below itself: a nested Workflow call, while its depth allows one.

The fan-out sets :data:`NESTING` around a worker's run when the worker may fan out (its
depth below ``max_depth``, agents run in this process); the worker's toolbox offers the
Workflow tool then and calls back through it. Nothing here knows how a fan-out runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass

from ..core.wire import ToolSchema, ToolUseBlock

__all__ = ["NESTING", "Nesting", "not_offered"]


@dataclass(frozen=True)
class Nesting:
    """A worker's way to fan out: the tool it is offered, and what runs a call of it."""

    #: The Workflow tool as the session offers it.
    tool: ToolSchema
    #: The depth of the worker itself (1: a subagent of the main agent).
    depth: int
    #: Runs one call's input within the given tokens: the tool result and whether it failed.
    fan_out: Callable[[object, int | None], Awaitable[tuple[str, bool]]]
    #: The Workflow call an earlier run of this very worker made, if it made one: a rerun
    #: makes it again instead of asking its model for another plan.
    recorded_call: Callable[[], Awaitable[ToolUseBlock | None]]
    #: Keeps the worker's call for such a rerun, before the call runs.
    record_call: Callable[[ToolUseBlock], Awaitable[None]]


#: The running worker's nesting, set by the fan-out around its run; None: it may not fan out.
NESTING: ContextVar[Nesting | None] = ContextVar("orchmode_nesting", default=None)


def not_offered(role: str, max_depth: int, *, on_cluster: bool = False) -> str:
    """Why an agent may not fan out, for the tool result of its Workflow call."""
    if role != "worker":
        return (
            f"only workers may call Workflow, and this agent is a {role}. Do the work "
            "yourself and call report_findings."
        )
    if on_cluster:
        return (
            "Workflow is not offered to agents running on a Ray cluster's nodes: they cannot "
            "reach the engine that would run their agents. Do the subtask yourself and call "
            "report_findings."
        )
    return (
        f"Workflow is not offered at this depth: agents may nest {max_depth} "
        f"level{'s' if max_depth != 1 else ''} deep (the max_depth setting), and this agent "
        "is at the deepest one. Do the subtask yourself and call report_findings."
    )
