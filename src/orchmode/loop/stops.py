"""What each stop reason of a response means to an agent loop, as a table.

Pure data and one lookup, so both the main agent and every subagent read the same answer
to "go on, run the tools, or stop — and is the reply kept?".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from ..core.events import ModelRefused
from ..core.prompts import MAX_TOKENS_NOTE
from ..core.results import Status


class Step(StrEnum):
    """What the loop does after a response."""

    #: ``pause_turn``: the server paused a long turn; send the conversation back as is.
    CONTINUE = "continue"
    #: Run the reply's tool calls, send their results, go on.
    TOOLS = "tools"
    #: The agent's turn is over.
    STOP = "stop"


@dataclass(frozen=True)
class StopRule:
    step: Step
    #: How an agent that ends here ended (a subagent's status; the main turn keeps the
    #: stop reason itself).
    status: Status = Status.FINISHED
    #: Whether the reply stays in the conversation. A truncated or refused reply is
    #: dropped, so later requests do not build on it (and the prefix stays append-only).
    kept: bool = True
    #: Compact the conversation and ask again, once, before taking this stop.
    compact_first: bool = False
    #: What the result's text says after the reply's own text.
    note: str = ""


#: Every stop reason the API documents; an unknown one ends the turn like ``end_turn``.
STOPS: MappingProxyType[str, StopRule] = MappingProxyType(
    {
        "end_turn": StopRule(Step.STOP),
        "stop_sequence": StopRule(Step.STOP),
        "tool_use": StopRule(Step.TOOLS),
        "pause_turn": StopRule(Step.CONTINUE),
        # The API's own compaction paused the turn after summarising (beta): the reply,
        # its compaction block included, goes back as it came and the turn goes on.
        "compaction": StopRule(Step.CONTINUE),
        "max_tokens": StopRule(Step.STOP, Status.MAX_TOKENS, kept=False, note=MAX_TOKENS_NOTE),
        "refusal": StopRule(
            Step.STOP,
            Status.REFUSAL,
            kept=False,
            note="[orchmode: the model declined to continue (refusal)]",
        ),
        "model_context_window_exceeded": StopRule(
            Step.STOP,
            Status.CONTEXT_EXCEEDED,
            kept=False,
            compact_first=True,
            note="[orchmode: the conversation no longer fits the model's context window "
            "(model_context_window_exceeded)]",
        ),
    }
)
_UNKNOWN = StopRule(Step.STOP)


def refusal_note(refusal: ModelRefused) -> str:
    """What a refused agent's result says in place of the dropped reply: the API's reasons
    (``stop_details``), so the main agent (and the user) can tell what was declined."""
    why = f"refusal, category {refusal.category}" if refusal.category else "refusal"
    said = f": {refusal.explanation}" if refusal.explanation else ""
    return f"[orchmode: the model declined to continue ({why}){said}]"


_NO_TOOLS = StopRule(Step.STOP)


def rule_for(stop_reason: str | None, has_tool_calls: bool) -> StopRule:
    """The rule for a response; ``tool_use`` without a tool call ends the turn."""
    rule = STOPS.get(stop_reason or "end_turn", _UNKNOWN)
    if rule.step is Step.TOOLS and not has_tool_calls:
        return _NO_TOOLS
    return rule
