"""The subagent loop: one subtask, bash, report_findings and the user's MCP tools, a bounded
number of model turns."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import PromptTooLong
from ..core.events import ContextCompacted, EventBus, Role, TokenUsage
from ..core.prompts import MAX_TOKENS_NOTE
from ..core.results import AgentResult, Report, Status, parse_report
from ..model.context import Meter, Window, compact
from ..model.gateway import Message, ModelGateway
from ..shell.bash import BashSession
from ..tools.calls import Block, run_bash, tool_result, unknown_tool

if TYPE_CHECKING:
    from ..tools.mcptools import McpHub


_STOP_STATUS = {
    "max_tokens": Status.MAX_TOKENS,
    "refusal": Status.REFUSAL,
    "model_context_window_exceeded": Status.CONTEXT_EXCEEDED,
}


@dataclass
class Subagent:
    gateway: ModelGateway
    shell: BashSession
    events: EventBus
    name: str
    system: str
    tools: list[Block]
    max_turns: int
    #: Called as the first model request goes out (the fan-out starts the shell then).
    on_first_request: Callable[[], None] | None = None
    #: The context window its conversation must stay within (None: no check).
    window: Window | None = None
    #: The user's MCP servers, whose tools among ``tools`` it may call.
    mcp: McpHub | None = None
    role: Role = "worker"

    async def run(self, prompt: str) -> AgentResult:
        messages: list[Message] = [{"role": "user", "content": prompt}]
        usage = TokenUsage()
        last_text = ""
        previous: str | None = None
        meter = Meter([self.system, self.tools])
        retried = False
        turn = 0
        while turn < self.max_turns:
            turn += 1
            messages = self._fit(messages, meter, meter.size(messages), refused=False)
            sent = len(messages)
            try:
                reply = await self.gateway.complete(
                    agent=self.name,
                    system=self.system,
                    messages=messages,
                    tools=self.tools,
                    previous_message_id=previous,
                    on_send=self.on_first_request if turn == 1 else None,
                )
            except PromptTooLong as exc:
                if exc.tokens is not None:
                    meter.observe(sent, exc.tokens)
                fitted = None if retried else self._fit(messages, meter, None, refused=True)
                if fitted is None or fitted is messages:
                    return AgentResult(
                        f"[orchmode: the subagent's conversation no longer fits the context "
                        f"window ({exc})]",
                        Status.CONTEXT_EXCEEDED,
                        turn,
                        usage,
                    )
                messages, retried = fitted, True
                turn -= 1  # the refused request used no turn
                continue
            retried = False
            meter.observe(sent, reply.usage.total_input)
            previous = reply.message_id
            usage = usage + reply.usage
            last_text = reply.text or last_text
            if reply.stop_reason == "pause_turn":
                if reply.content:
                    messages.append({"role": "assistant", "content": reply.content})
                continue
            if reply.stop_reason != "tool_use" or not reply.tool_uses:
                return self._stopped(reply.stop_reason, reply.text, turn, usage)
            messages.append({"role": "assistant", "content": reply.content})
            results: list[Block] = []
            for tool_use in reply.tool_uses:
                if tool_use["name"] == "report_findings":
                    report = parse_report(tool_use["input"])
                    if isinstance(report, Report):
                        text = json.dumps(report.model_dump(), ensure_ascii=False)
                        return AgentResult(text, Status.FINISHED, turn, usage)
                    results.append(tool_result(tool_use["id"], report, is_error=True))
                elif tool_use["name"] == "bash":
                    results.append(
                        await run_bash(self.shell, tool_use, agent=self.name, events=self.events)
                    )
                elif self.mcp is not None and self.mcp.handles(tool_use["name"]):
                    results.append(await self.mcp.call(tool_use, agent=self.name, role=self.role))
                else:
                    results.append(unknown_tool(tool_use, [t["name"] for t in self.tools]))
            messages.append({"role": "user", "content": results})
        note = (
            f"[orchmode: the subagent used its {self.max_turns} model turns without calling "
            "report_findings]"
        )
        return AgentResult(f"{note}\n{last_text}".strip(), Status.TURN_LIMIT, self.max_turns, usage)

    def _fit(
        self, messages: list[Message], meter: Meter, size: int | None, *, refused: bool
    ) -> list[Message]:
        """``messages``, or a compacted copy when they pass the window's compaction point.

        A subagent's outputs are not saved (it may run on another machine), so a stub says
        to run the command again. ``size`` None forces a compaction (after a refusal).
        """
        window = self.window
        if window is None or (size is not None and size <= window.compact_at):
            return messages
        before = meter.size(messages) if size is None else size
        estimate = meter.estimate(messages)
        target = meter.target(messages, window.compact_to)
        done = compact(messages, estimate, target, lambda _id, _text: None, keep_last=not refused)
        if not done.stubbed:
            return messages
        meter.forget()
        self.events.emit(
            ContextCompacted(
                self.name, "stubbed", before, meter.estimate(done.messages), done.detail, refused
            )
        )
        return done.messages

    @staticmethod
    def _stopped(stop_reason: str | None, text: str, turn: int, usage: TokenUsage) -> AgentResult:
        status = _STOP_STATUS.get(stop_reason or "", Status.FINISHED)
        if status is Status.FINISHED and not text:
            return AgentResult(
                "[orchmode: the subagent ended without a report or any text]",
                Status.EMPTY,
                turn,
                usage,
            )
        if status is Status.MAX_TOKENS:
            text = f"{text}\n{MAX_TOKENS_NOTE}".strip()
        elif status is not Status.FINISHED:
            text = f"[orchmode: the subagent stopped: {stop_reason}]\n{text}".strip()
        return AgentResult(text, status, turn, usage)


def describe_failure(exc: BaseException) -> str:
    """The error string that takes a failed subagent's slot in the tool result."""
    return f"error: the subagent failed: {str(exc) or type(exc).__name__}"
