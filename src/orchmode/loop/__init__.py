"""The agent loop that every agent — main, worker, verifier, resolver — runs through.

Below the executors (which run subagents) and the session (which runs the main agent),
above the gateway and the tools it drives. The roles differ only in what they pass in:
the tools (a :class:`Toolbox`), the conversation's :class:`Room` (its window and where
stubbed results are saved) and a few :class:`Hooks`. Everything a response's stop
reason means is in one table, :data:`STOPS`.
"""

from __future__ import annotations

from .core import AgentLoop, Ending, Hooks, LoopResult
from .room import Room
from .stops import STOPS, Step, StopRule, rule_for
from .toolbox import Finish, Gathered, Handler, Outcome, Toolbox

__all__ = [
    "STOPS",
    "AgentLoop",
    "Ending",
    "Finish",
    "Gathered",
    "Handler",
    "Hooks",
    "LoopResult",
    "Outcome",
    "Room",
    "Step",
    "StopRule",
    "Toolbox",
    "rule_for",
]
