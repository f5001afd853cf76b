"""Tool dispatch by name, the same for every agent: handlers in, one results message out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeAlias

from ..core.wire import ToolResultBlock, ToolSchema, ToolUseBlock
from ..tools.calls import tool_result, unknown_tool

#: The result of a call that never ran (the round was cut short, or the agent finished).
NOT_RUN = "[orchmode: interrupted]"
#: The result of the call that finished the agent's run (kept so the conversation is valid).
FINISHED = "[orchmode: the run ended with this call]"


@dataclass(frozen=True)
class Finish:
    """A tool call that ends the agent's run with ``value`` (a subagent's report_findings)."""

    value: str


#: The results a round has gathered so far.
Gathered: TypeAlias = Sequence[ToolResultBlock]
#: What a handler answers: the call's result, or the end of the agent's run.
Outcome: TypeAlias = ToolResultBlock | Finish
#: A tool's handler: the call and the results gathered before it in the same round (their
#: size bounds what a large result may take) → its ``tool_result``, or :class:`Finish`.
Handler: TypeAlias = Callable[[ToolUseBlock, Gathered], Awaitable[Outcome]]


@dataclass(frozen=True)
class Toolbox:
    """What an agent is offered (``schemas``) and what runs each call."""

    schemas: list[ToolSchema]
    handlers: Mapping[str, Handler]
    #: Handlers for whole families of names (``mcp__``: the user's MCP servers).
    prefixes: Mapping[str, Handler] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [t["name"] for t in self.schemas]

    def with_handler(self, name: str, handler: Handler) -> Toolbox:
        """The same tools with ``name`` run by ``handler`` (a resumed turn's bash)."""
        return replace(self, handlers={**self.handlers, name: handler})

    def handler_for(self, name: object) -> Handler | None:
        """What runs a call of ``name``. A named handler runs only a tool the agent was
        offered (a role given no bash has bash's handler all the same); a family's handler
        answers every name of its family, as it can say best why one is not there."""
        if not isinstance(name, str):
            return None
        handler = self.handlers.get(name) if name in self.names else None
        if handler is None:
            handler = next((h for p, h in self.prefixes.items() if name.startswith(p)), None)
        return handler

    async def run(
        self, tool_uses: Sequence[ToolUseBlock], results: list[ToolResultBlock]
    ) -> Finish | None:
        """Run the calls in order, each result appended to ``results`` as it comes; the
        :class:`Finish` that ended the round early, if one did.

        Whatever happens — a handler that raises, a cancellation — every call ends with a
        result in ``results`` (calls that never ran say so), so the conversation stays valid.
        """
        finish: Finish | None = None
        try:
            for tool_use in tool_uses:
                handler = self.handler_for(tool_use.get("name"))
                if handler is None:
                    results.append(unknown_tool(tool_use, self.names))
                    continue
                done = await handler(tool_use, results)
                if isinstance(done, Finish):
                    finish = done
                    results.append(tool_result(tool_use["id"], FINISHED))
                    break
                results.append(done)
        finally:
            answered = {r["tool_use_id"] for r in results}
            results.extend(
                tool_result(t["id"], NOT_RUN, is_error=True)
                for t in tool_uses
                if t["id"] not in answered
            )
        return finish
