"""One conversation's room in the context window: its size, and how it is made smaller.

Every agent's conversation is kept the same way: before each request, compacted once it
passes the compaction point (the API asked to count first when only the estimate's slack
puts it past); after each response, the meter is calibrated on the API's count and an
edit the API's context editing made is taken into the history at once; after a refusal
as too long, compacted harder (the latest results may go too) for the one retry. The
roles differ only in what they pass in: the window (None: no limit kept), where stubbed
results are saved, and whether the API's context editing is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.events import ContextCompacted, EventBus
from ..core.wire import ContextEdit, Message, ToolSchema
from ..model.context import ESTIMATE_SLACK, Meter, Saver, Window, compact
from ..model.gateway import ModelGateway
from ..model.reply import ModelReply

#: Tool uses the API's context editing leaves whole at the end of the conversation.
KEEP_TOOL_USES = 2


def _not_saved(_tool_use_id: str, _text: str) -> str | None:
    return None


@dataclass
class Room:
    """The size of one agent's conversation, kept within its window."""

    agent: str
    gateway: ModelGateway
    events: EventBus
    system: str
    meter: Meter
    #: The window the conversation must stay within; None keeps no limit.
    window: Window | None = None
    #: Keeps a stubbed tool result's text and says where (the main agent's result files);
    #: a subagent's are not kept (it may run on another machine): its stubs say to re-run.
    save: Saver = _not_saved
    #: Named on the compaction event: where the saved copies are.
    saved_in: str | None = None
    #: Ask for the API's context editing (while the endpoint takes it).
    api_edits: bool = False
    #: The model the agent runs on, which counts its tokens (None: the main agent's).
    model: str | None = None

    def context_edits(self) -> list[ContextEdit] | None:
        """The API's context editing, asked for while the endpoint takes it."""
        w = self.window
        if w is None or not self.api_edits or not self.gateway.context_editing:
            return None
        return [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": w.compact_at},
                "keep": {"type": "tool_uses", "value": KEEP_TOOL_USES},
                # One large step, so the cached prefix is rebuilt seldom.
                "clear_at_least": {"type": "input_tokens", "value": w.compact_at - w.compact_to},
            }
        ]

    def compaction_point(self) -> int | None:
        """Where orchmode compacts: ``compact_at``, or, while the API's context editing is
        on (it clears at ``compact_at`` itself), half-way from there to the window's end."""
        w = self.window
        if w is None:
            return None
        if self.context_edits() is not None:
            return (w.compact_at + w.tokens) // 2
        return w.compact_at

    async def make_room(self, messages: list[Message], tools: Sequence[ToolSchema]) -> None:
        """Compact before a request would pass the compaction point.

        Past it only by what the estimate may overstate, the API is asked to count first:
        a compaction rebuilds the cached prefix, so it is not done on a guess.
        """
        point = self.compaction_point()
        if point is None:
            return
        size = self.meter.size(messages)
        if size > point and size - point < ESTIMATE_SLACK * self.meter.uncounted(messages):
            counted = await self.gateway.count_tokens(
                system=self.system,
                messages=messages,
                tools=tools,
                context_edits=self.context_edits(),
                model=self.model,
            )
            if counted is not None:
                self.meter.observe(len(messages), counted)
                size = counted
        if size > point:
            self.compact(messages, size=size)

    def measured(self, messages: list[Message], sent: int, reply: ModelReply) -> None:
        """Calibrate the meter on the API's count, and follow the API's context editing.

        The API's edit is stateless: it would clear the same results from every request
        from now on, a little more each turn, and each time the cached prefix would break
        at a new place. So once it has cleared, orchmode makes the same room in its own
        history (stubs that name the saved copies) in one step, and later requests are
        append-only again below the trigger.
        """
        counted = reply.usage.total_input
        self.meter.observe(sent, counted)
        if reply.cleared_tokens or reply.cleared_tool_uses:
            uses = reply.cleared_tool_uses
            original = counted + reply.cleared_tokens
            self.events.emit(
                ContextCompacted(
                    self.agent,
                    "api",
                    original,
                    counted,
                    f"{uses} tool {'result' if uses == 1 else 'results'} cleared by the API, "
                    f"{reply.cleared_tokens:,} tokens",
                )
            )
            self.compact(messages, size=original)

    def refused(self, sent: int, tokens: int | None) -> None:
        """The API refused a request of ``sent`` messages as ``tokens`` long (if it said)."""
        if tokens is not None:
            self.meter.observe(sent, tokens)

    def result_budget(self, messages: list[Message], pending: int) -> int:
        """The most tokens the next large tool result (a Workflow's) may take, room made first.

        It may take the conversation up to the backstop, half-way from ``compact_at`` to
        the window's end: the next request's compaction (or the API's context editing) then
        makes room again, keeping this newest result whole. Where even the result's full
        share would pass the backstop, older results give way now, before this one shrinks.
        """
        w = self.window
        assert w is not None, "a result budget needs a window"
        limit = (w.compact_at + w.tokens) // 2
        if self.context_edits() is None:
            size = self.meter.size(messages) + pending
            if size + w.result_tokens > limit:
                self.compact(messages, size=size)
        return w.result_budget(self.meter.size(messages) + pending, limit)

    def compact(
        self, messages: list[Message], *, refused: bool = False, size: int | None = None
    ) -> bool:
        """Stub old tool results down to ``compact_to``, in place; False if none could go.

        After a refusal (``refused``) the latest results may go too, last of all, rather
        than the retry fail: the order of what goes is the same, it only goes further.
        """
        w = self.window
        if w is None:
            return False
        before = size if size is not None else self.meter.size(messages)
        estimate = self.meter.estimate(messages)
        target = self.meter.target(messages, w.compact_to)
        done = compact(messages, estimate, target, self.save, keep_last=not refused)
        if not done.stubbed:
            return False
        messages[:] = done.messages
        self.meter.forget()
        detail = done.detail
        if self.saved_in is not None:
            detail += f" (saved copies in {self.saved_in})"
        self.events.emit(
            ContextCompacted(
                self.agent, "stubbed", before, self.meter.estimate(messages), detail, refused
            )
        )
        return True
