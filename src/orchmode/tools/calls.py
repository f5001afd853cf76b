"""Running the model's tool calls for every agent: bash with its event, and tool_result blocks."""

from __future__ import annotations

from ..core.events import BashDone, BashStarted, EventBus
from ..core.wire import ToolResultBlock, ToolUseBlock
from ..shell.bash import BashSession


def tool_result(tool_use_id: str, text: str, *, is_error: bool = False) -> ToolResultBlock:
    """A tool_result block; never empty, because the API rejects empty content."""
    block: ToolResultBlock = {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": text or "(empty)",
    }
    if is_error:
        block["is_error"] = True
    return block


def unknown_tool(tool_use: ToolUseBlock, known: list[str]) -> ToolResultBlock:
    return tool_result(
        tool_use["id"],
        f"error: there is no tool named {tool_use.get('name')!r}; available: {', '.join(known)}",
        is_error=True,
    )


async def run_bash(
    shell: BashSession, tool_use: ToolUseBlock, *, agent: str, events: EventBus
) -> ToolResultBlock:
    tool_input = tool_use.get("input")
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    shown = command if isinstance(command, str) else "(restart)"
    events.emit(BashStarted(agent=agent, command=shown))
    result = await shell.handle(tool_input)
    events.emit(
        BashDone(
            agent=agent,
            command=shown,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration=result.duration,
            sandbox=shell.sandbox_mode,
        )
    )
    return tool_result(tool_use["id"], result.output, is_error=result.is_error)
