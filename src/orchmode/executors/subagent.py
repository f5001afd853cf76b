"""The subagent role: one subtask, bash, report_findings and the user's MCP tools, a bounded
number of model turns.

Every agent runs :mod:`orchmode.loop`'s loop; this module is only what a subagent brings to
it — its tools — and what its ending comes to as an :class:`AgentResult`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.errors import AllowanceSpent, AuthError
from ..core.events import EventBus, Role
from ..core.results import AgentResult, Report, Status, TypedReport, parse_report
from ..core.schemas import ReportAttempts
from ..core.wire import JsonSchema, Message, ToolSchema, ToolUseBlock
from ..loop import AgentLoop, Ending, Finish, Gathered, Handler, LoopResult, Outcome, Room, Toolbox
from ..model.allowance import ALLOWANCE
from ..model.context import Meter, Window, estimate_tokens
from ..model.gateway import ModelChoice, ModelGateway
from ..shell.bash import BashSession
from ..tools.calls import run_bash, tool_result, unknown_tool
from ..trees.limits import WriteWatch
from .nesting import NESTING, Nesting, not_offered

#: What a stopped agent is told, after why.
LAST_CHANCE = (
    "Its shell was stopped, and no command or tool of it runs any more: call "
    "report_findings now with what it found (any other call ends its run)"
)

if TYPE_CHECKING:
    from ..core.agents import AgentDefinition
    from ..tools.mcptools import McpHub, McpPermit


@dataclass
class Subagent:
    """A subagent: its tools and the shape of its result, for the loop every agent runs."""

    gateway: ModelGateway
    shell: BashSession
    events: EventBus
    name: str
    system: str
    tools: list[ToolSchema]
    max_turns: int
    #: Called as the first model request goes out (the fan-out starts the shell then).
    on_first_request: Callable[[], None] | None = None
    #: The context window its conversation must stay within (None: no check).
    window: Window | None = None
    #: The user's MCP servers, whose tools among ``tools`` it may call.
    mcp: McpHub | None = None
    role: Role = "worker"
    #: The JSON Schema its report's ``data`` must follow (None: an untyped report).
    schema: JsonSchema | None = None
    #: Its model and effort (None: its role's, from the settings).
    choice: ModelChoice | None = None
    #: The agent definition it runs in, whose ``tools`` may leave out some MCP tools.
    agent: AgentDefinition | None = None
    #: Watches what it writes (None: it cannot write). Once the watch stops it (past its
    #: disk cap, or the disk nearly full), it is told so, and may only report.
    watch: WriteWatch | None = None
    #: Asks the permission rules (and the user) before each MCP call; None: no rules.
    mcp_permit: McpPermit | None = None
    #: Set when its last allowed report was still invalid: the run failed with this.
    _rejected: str | None = field(default=None, init=False, repr=False)
    #: Set when its run was ended because the watch had stopped it.
    _cut: bool = field(default=False, init=False, repr=False)
    #: The round of tool calls in which it was told it was stopped (its results list).
    _told_in: Gathered | None = field(default=None, init=False, repr=False)
    #: Its room and conversation while it runs: a nested Workflow result is fitted to them.
    _room: Room | None = field(default=None, init=False, repr=False)
    _messages: list[Message] = field(default_factory=list, init=False, repr=False)
    #: Set once its first Workflow call is in the journal (or was made again from it).
    _call_recorded: bool = field(default=False, init=False, repr=False)

    async def run(self, prompt: str) -> AgentResult:
        messages: list[Message] = [{"role": "user", "content": prompt}]
        choice = self.choice or ModelChoice.of(self.gateway.settings, self.role)
        room = Room(
            self.name,
            self.gateway,
            self.events,
            self.system,
            Meter([self.system, self.tools]),
            self.window,
            model=choice.model,
        )
        loop = AgentLoop(
            self.gateway,
            self.name,
            self.system,
            room,
            on_first_send=self.on_first_request,
            choice=choice,
        )
        self._room, self._messages = room, messages
        toolbox = self.toolbox()
        turns = self.max_turns
        if await self._replay_fan_out(loop, messages, toolbox):
            turns = max(1, turns - 1)  # the turn that asked for the fan-out
        done = await loop.run(messages, toolbox, turns)
        return self._result(done)

    async def _replay_fan_out(
        self, loop: AgentLoop, messages: list[Message], toolbox: Toolbox
    ) -> bool:
        """Make again the Workflow call an earlier run of this worker made (a killed run,
        resumed), rather than ask the model for a new plan: the children that finished
        then are served from the journal. False when there was none."""
        nesting = self._nesting()
        if nesting is None:
            return False
        call = await nesting.recorded_call()
        if call is None:
            return False
        self._call_recorded = True
        messages.append({"role": "assistant", "content": [call]})
        await loop.run_tools(messages, toolbox, [call])
        return True

    def _nesting(self) -> Nesting | None:
        """How it fans out, if it was offered Workflow."""
        nesting = NESTING.get()
        offered = any(tool["name"] == "Workflow" for tool in self.tools)
        if nesting is None or self.role != "worker" or not offered:
            return None
        return nesting

    def toolbox(self) -> Toolbox:
        """bash, report_findings (which ends the run with a valid report) and MCP tools.

        An invalid report is answered with its problems, up to the attempts allowed; the
        last one still invalid ends a typed run as a failure (see :class:`ReportAttempts`).
        """
        attempts = ReportAttempts(self.schema)

        async def bash(tool_use: ToolUseBlock, gathered: Gathered) -> Outcome:
            refused = self._refused(tool_use, gathered)
            if refused is not None:
                return refused
            block = await run_bash(self.shell, tool_use, agent=self.name, events=self.events)
            if self.watch is not None and await self.watch.check() is not None:
                # what it wrote with this command stopped it: it is told so, with the output
                self._told_in = gathered
                text = f"{block['content']}\n({self.watch.reason}. {LAST_CHANCE})"
                return tool_result(tool_use["id"], text, is_error=True)
            return block

        async def report_findings(tool_use: ToolUseBlock, _gathered: object) -> Outcome:
            # still taken once the agent is stopped: a report costs no disk
            if self.schema is None:  # untyped: asked again as often as it takes, as always
                untyped = parse_report(tool_use["input"])
                if isinstance(untyped, Report):
                    return self._report(untyped)
                return tool_result(tool_use["id"], untyped, is_error=True)
            report = attempts.take(tool_use["input"])
            if isinstance(report, TypedReport):
                return self._report(report)
            if report.final:
                self._rejected = report.message
                return Finish(report.message)
            return tool_result(tool_use["id"], report.message, is_error=True)

        prefixes: dict[str, Handler] = {}
        mcp = self.mcp
        if mcp is not None:

            async def mcp_tool(tool_use: ToolUseBlock, gathered: Gathered) -> Outcome:
                refused = self._refused(tool_use, gathered)
                if refused is not None:
                    return refused
                role = self.agent
                if role is not None and not role.allows(str(tool_use["name"])):
                    return tool_result(
                        tool_use["id"],
                        f"error: the role {role.name!r} is not given {tool_use['name']} (its "
                        "tools in its agent definition leave it out)",
                        is_error=True,
                    )
                return await mcp.call(
                    tool_use, agent=self.name, role=self.role, permit=self.mcp_permit
                )

            prefixes["mcp__"] = mcp_tool
        prefixes["Workflow"] = self._workflow()  # a fan-out where it may, else why not
        return Toolbox(self.tools, {"bash": bash, "report_findings": report_findings}, prefixes)

    def _workflow(self) -> Handler:
        """Its Workflow calls, each run as a nested fan-out and fitted to its own window;
        refused with the reason where it may not fan out."""
        nesting = self._nesting()
        if nesting is None:
            return self._workflow_refused

        async def workflow(tool_use: ToolUseBlock, gathered: Gathered) -> Outcome:
            if tool_use.get("name") != "Workflow":  # only a name that starts so
                return await self._workflow_refused(tool_use, gathered)
            refused = self._refused(tool_use, gathered)
            if refused is not None:
                return refused
            if not self._call_recorded:  # its first call is what a rerun makes again
                self._call_recorded = True
                await nesting.record_call(tool_use)
            try:
                text, is_error = await nesting.fan_out(
                    tool_use.get("input"), self._result_tokens(gathered)
                )
            except AuthError:
                raise
            except Exception as exc:
                text, is_error = f"error: the workflow failed: {exc}", True
            return tool_result(tool_use["id"], text, is_error=is_error)

        return workflow

    async def _workflow_refused(self, tool_use: ToolUseBlock, _gathered: object) -> Outcome:
        """A Workflow call from an agent that may not fan out, with the reason (a name
        that only starts with Workflow is no tool at all)."""
        names = [str(tool["name"]) for tool in self.tools]
        settings = self.gateway.settings
        why = not_offered(self.role, settings.max_depth, on_cluster=settings.executor == "ray")
        if tool_use.get("name") not in names:
            block = unknown_tool(tool_use, names)
            if tool_use.get("name") == "Workflow":
                block["content"] = f"{block['content']}. {why}"
            return block
        return tool_result(tool_use["id"], f"error: {why}", is_error=True)

    def _result_tokens(self, gathered: Gathered) -> int | None:
        """The most a nested Workflow result may take of its window (None: no window)."""
        room = self._room
        if room is None or room.window is None:
            return None
        return room.result_budget(self._messages, estimate_tokens(gathered))

    def _refused(self, tool_use: ToolUseBlock, gathered: Gathered) -> Outcome | None:
        """The answer to a call other than its report once the watch has stopped the agent
        (None until then): it is told, once, that it may only report; a call in a later
        round ends its run."""
        watch = self.watch
        if watch is None or watch.reason is None:
            return None
        if self._told_in is not None and self._told_in is not gathered:
            self._cut = True
            return Finish("")
        self._told_in = gathered
        return tool_result(tool_use["id"], f"({watch.reason}. {LAST_CHANCE})", is_error=True)

    def _report(self, report: Report) -> Finish:
        """Its report as its run's value; once the watch stopped it, its summary says so
        first (the main agent and the verifier read it there)."""
        reason = self.watch.reason if self.watch is not None else None
        if reason is not None:
            report = report.model_copy(update={"summary": f"[{reason}] {report.summary}"})
        return Finish(json.dumps(report.model_dump(), ensure_ascii=False))

    def _result(self, done: LoopResult) -> AgentResult:
        """How the run ended, as a subagent's result."""
        ending, turns, usage = done.ending, done.turns, done.usage
        watch = self.watch
        stopped = watch.reason if watch is not None else None
        if stopped is not None and (self._cut or ending is not Ending.FINISHED):
            return AgentResult(
                f"[{stopped}. It was stopped before it called report_findings]",
                Status.FAILED,
                turns,
                usage,
            )
        if ending is Ending.FINISHED and self._rejected is not None:
            return AgentResult(self._rejected, Status.FAILED, turns, usage)
        if ending is Ending.FINISHED:
            return AgentResult(done.text, Status.FINISHED, turns, usage)
        if ending is Ending.FAILED:
            assert done.error is not None
            if isinstance(done.error, AllowanceSpent):
                return _stopped_by_budget(done.error.reason, done)
            raise done.error  # the executor makes it the slot's error string
        if ending is Ending.TOO_LONG:
            return AgentResult(
                f"[orchmode: the subagent's conversation no longer fits the context "
                f"window ({done.error})]",
                Status.CONTEXT_EXCEEDED,
                turns,
                usage,
            )
        if ending is Ending.TURN_LIMIT:
            note = (
                f"[orchmode: the subagent used its {self.max_turns} model turns without calling "
                "report_findings]"
            )
            return AgentResult(f"{note}\n{done.text}".strip(), Status.TURN_LIMIT, turns, usage)
        assert done.rule is not None
        status, text = done.rule.status, done.text
        allowance = ALLOWANCE.get()
        if status is Status.MAX_TOKENS and allowance is not None and allowance.cut:
            # its reply was cut to the output its budget had room for: that budget is spent
            reason = "its budget (or its subtree's) had room for only part of its last reply"
            return _stopped_by_budget(reason, done)
        if status is Status.FINISHED and not text:
            return AgentResult(
                "[orchmode: the subagent ended without a report or any text]",
                Status.EMPTY,
                turns,
                usage,
            )
        if done.rule.note:
            text = f"{text}\n{done.rule.note}".strip()
        return AgentResult(text, status, turns, usage)


def _stopped_by_budget(reason: str, done: LoopResult) -> AgentResult:
    """A run its budget stopped: partial, saying why, with the last text it wrote."""
    note = f"[orchmode: stopped: {reason}; this result is partial]"
    return AgentResult(f"{note}\n{done.text}".strip(), Status.BUDGET, done.turns, done.usage)


def describe_failure(exc: BaseException) -> str:
    """The error string that takes a failed subagent's slot in the tool result."""
    return f"error: the subagent failed: {str(exc) or type(exc).__name__}"
