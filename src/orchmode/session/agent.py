"""The conversation: its history, its mode notices, and the main agent loop with Workflow and bash.

The history is append-only (a truncated or refused reply is the one thing ever dropped) so
every request extends the previous one and the prompt cache keeps hitting. Whatever
happens inside a turn — a failed request, a tool that raises, a cancellation — the history
is left valid for the next turn: every ``tool_use`` gets its ``tool_result``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from typing_extensions import Unpack

from ..core.errors import AuthError, OrchmodeError
from ..core.events import ContextCompacted, TurnDone, TurnResumed, TurnStarted
from ..core.mode import ModeState
from ..core.prompts import (
    MAIN_SYSTEM,
    NOTICES,
    main_tools,
    notice_as_user_text,
    turn_limit_note,
)
from ..core.settings import Settings
from ..core.web_tools import main_web_tool_names, session_web_tools
from ..core.wire import (
    Message,
    ToolResultBlock,
    ToolSchema,
    ToolUseBlock,
    blocks_of,
    message_json,
    read_history,
)
from ..fanout.workflow import Workflow
from ..loop import AgentLoop, Ending, Gathered, Handler, Hooks, LoopResult, Room, Toolbox
from ..model.context import (
    Meter,
    Window,
    compact,
    content_text,
    estimate_tokens,
    turn_starts,
)
from ..model.providers import Credentials
from ..model.reply import ModelReply
from ..shell.bash import BashSession
from ..store.claims import holder_name
from ..tools.calls import run_bash, tool_result
from ..tools.mcptools import with_mcp_tools
from .run_record import RunRecord
from .saved_state import state_json
from .wiring import Parts, StartOptions, session_parts

log = logging.getLogger("orchmode")

#: The result of a bash command that was running when orchmode stopped, on resume.
CUT_OFF_NOTE = (
    "[orchmode: this command was cut off when orchmode stopped, and it was not run again "
    "on resume: it may have done part of its work. Check its effects before running it again.]"
)


@dataclass(frozen=True)
class TurnResult:
    text: str
    #: end_turn, stop_sequence, max_tokens, refusal, model_context_window_exceeded,
    #: turn_limit, empty or error
    stop: str
    model_calls: int
    #: set when the turn ended because a model request failed
    error: OrchmodeError | None = None

    @property
    def ok(self) -> bool:
        return self.stop != "error"


class SessionBusy(OrchmodeError):
    """Another process drives this session now."""


class Conversation:
    """One conversation with the main agent: what a session runs its turns in.

    It takes its parts finished (see :func:`~orchmode.session.wiring.session_parts`) and
    owns only what is its own: the history, the mode, the main shell and its room in the
    context window.
    """

    def __init__(self, parts: Parts, closer: AsyncExitStack | None = None) -> None:
        self.parts = parts
        #: Closes the parts when the conversation closes, for one started without a
        #: ``with`` block (:func:`start_conversation`).
        self._closer = closer
        self.settings = settings = parts.settings
        self.gateway = parts.gateway
        self.workdir = parts.workdir
        self.events = parts.events
        self.store = parts.store
        self.session_id = parts.session_id
        self.mode = ModeState(mode_on=settings.mode, refresh_every=settings.refresh_every)
        self.history: list[Message] = []
        #: The history as last checkpointed: the same message objects, so what is new (or
        #: rewritten by a compaction) is found by identity, without serialising anything.
        self._recorded: list[Message] = []
        #: What the session was started for, kept with its state: a run's task and how far
        #: it got, so a resume can finish it (None: a chat).
        self.run: RunRecord | None = None
        #: Where the current turn begins (its user text), and where its own messages begin:
        #: after that text and its notices.
        self._turn_start = self._turn_body = 0
        #: The main conversation's last response, for the API's cache diagnostics.
        self.last_message_id: str | None = None
        #: Who holds this session's claim: this host, this process, this session object.
        self.holder = holder_name()
        self.mcp = parts.mcp
        self.secrets = parts.secrets
        self.results = parts.results
        self.make_shell = parts.make_shell
        self.budget = parts.budget
        self.trees = parts.trees
        self.approvals = parts.approvals
        self.permits = parts.permits
        self.executor = parts.executor
        self.shell = self._main_shell()
        self.window = Window.from_settings(settings)
        self.roles = parts.roles
        #: Workflow (listing the roles), bash, the web tools asked for: the same all session.
        self.main_tools = main_tools(self.roles) + self._web_tools()
        self.meter = Meter([MAIN_SYSTEM, self.main_tools])
        #: The conversation's room in the window, kept the way every agent's is.
        self.room = Room(
            "main",
            self.gateway,
            self.events,
            MAIN_SYSTEM,
            self.meter,
            self.window,
            save=self._save_tool_result,
            saved_in=str(self.results.directory),
            api_edits=settings.context_management == "auto",
        )
        #: What the main agent is offered: Workflow, bash and its MCP tools (known once the
        #: first turn starts their servers).
        self.tools: list[ToolSchema] = self.main_tools
        self.workflow = Workflow(
            settings, self.gateway, self.budget, self.events, self.executor,
            results=self.results, trees=self.trees, mcp=self.mcp, roles=self.roles,
        )  # fmt: skip

    def _web_tools(self) -> list[ToolSchema]:
        """The API's web tools that ``main_web_tools`` asks for, limited by the rules."""
        wanted = main_web_tool_names(self.settings)
        if not wanted:
            return []
        rules = self.permits.rules if self.permits is not None else None
        offered, _ = session_web_tools(self.settings, rules)
        return [tool for tool in offered if tool["name"] in wanted]

    def _main_shell(self) -> BashSession:
        """The main agent's shell: its connections said as events, its commands asked of
        the permission rules."""
        shell = self.make_shell()
        shell.seat.emit = self.events.emit
        if self.permits is not None:
            self.permits.attach(shell, "main", self.events.emit)
        return shell

    def set_mode(self, on: bool) -> None:
        """Switch orchestration mode; the model hears of it with the next user turn."""
        self.mode.set_mode(on)

    async def turn(self, text: str) -> TurnResult:
        text = text.strip()
        if not text:
            raise OrchmodeError("a user turn needs some text")
        notices = self.mode.user_turn()
        # Secret files the user made since the last turn are withheld from this one: the
        # main shell is replaced before its next command if it shows any.
        await asyncio.to_thread(self.secrets.look)
        self._turn_start = len(self.history)
        if self.gateway.notices_in_user_text:
            folded = "".join(notice_as_user_text(NOTICES[n]) for n in notices)
            self.history.append({"role": "user", "content": text + folded})
        else:
            self.history.append({"role": "user", "content": text})
            for notice in notices:
                self.history.append({"role": "system", "content": NOTICES[notice]})
        self._turn_body = len(self.history)
        number = len(turn_starts(self.history))
        self.events.emit(TurnStarted(text, tuple(n.value for n in notices), number))
        await self.save()  # the mode as this turn has it, for a resume
        await self.checkpoint()
        return await self._finish(self._loop())

    async def resume_turn(self) -> TurnResult:
        """Go on with an interrupted turn from its last recorded step, without a new plan.

        The last assistant message's tool calls that have no result are settled first: a
        Workflow call runs again from its recorded input (finished agents come from the
        journal), a bash command that was cut off is not run again — its result says so,
        and the model decides. A turn whose answer was already recorded is returned as is.
        """
        starts = turn_starts(self.history)
        if not starts:
            raise OrchmodeError(f"session {self.session_id!r} has no turn to resume")
        self._turn_start = starts[-1]
        await asyncio.to_thread(self.secrets.look)
        self.events.emit(TurnResumed(len(starts)))
        body = self._turn_start + 1
        while body < len(self.history) and self.history[body].get("role") == "system":
            body += 1
        self._turn_body = body
        last = self.history[-1]
        if last.get("role") == "assistant":
            pending = blocks_of(last.get("content"), "tool_use")
            if not pending:
                text = _message_text(last)
                self.events.emit(TurnDone("end_turn", 0))
                return TurnResult(text, "end_turn", 0)
            return await self._finish(self._answer_cut_off_then_loop(pending))
        return await self._finish(self._loop())

    def answer_of_turn(self, number: int) -> str | None:
        """The recorded final text of user turn ``number`` (1-based), if it has one."""
        starts = [*turn_starts(self.history), len(self.history)]
        if not 0 < number < len(starts):
            return None
        last = self.history[starts[number] - 1]
        if last.get("role") != "assistant":
            return None
        return _message_text(last) or None

    async def _answer_cut_off_then_loop(self, pending: list[ToolUseBlock]) -> TurnResult:
        """Answer the calls cut off when orchmode stopped, then go on with the turn.

        A bash command among them is not run again (it may have done half its work): its
        result says so instead.
        """

        async def cut_off(tool_use: ToolUseBlock, _gathered: object) -> ToolResultBlock:
            return tool_result(tool_use["id"], CUT_OFF_NOTE, is_error=True)

        await self._list_tools()
        tools = self._toolbox().with_handler("bash", cut_off)
        await self._agent_loop().run_tools(self.history, tools, pending)
        return await self._loop()

    async def _finish(self, work: Coroutine[Any, Any, TurnResult]) -> TurnResult:
        """Run a turn's loop, and record how it ended whatever happens."""
        try:
            result = await work
        except Exception:
            # A turn that raised (a rejected key, a store gone bad) is recorded as failed;
            # only one that never got here — a killed process — reads as interrupted.
            self.events.emit(TurnDone("error", 0))
            raise
        finally:
            await self.save()
        self.events.emit(TurnDone(result.stop, result.model_calls))
        return result

    async def restore(self) -> bool:
        """Take up this session's recorded conversation and mode, if it has been recorded.

        The conversation comes from its step-by-step checkpoints when there are any (they
        are newer than the state saved at a turn's start and end), else from the state.
        """
        record = await self.store.load_session(self.session_id)
        if record is None:
            return False
        try:
            state = json.loads(record.state)
            history, mode = state["history"], ModeState(**state["mode"])
            run = RunRecord.read(state.get("meta"))
            checkpoints = await self.store.load_messages(self.session_id)
            if checkpoints:
                history = [json.loads(text) for text in checkpoints]
            history = read_history(history)
        except (ValueError, TypeError, KeyError, OrchmodeError) as exc:
            raise OrchmodeError(
                f"session {self.session_id!r} is recorded but cannot be resumed ({exc}) — "
                "start a new one without --session"
            ) from exc
        self.history, self.mode, self.run = history, mode, run
        self._recorded = list(history) if checkpoints else []
        self.meter.forget()
        return True

    async def save(self) -> None:
        """Record the conversation and its mode; a failure is logged, not fatal."""
        state = state_json(self.history, self.mode, self.run)
        try:
            await self.store.save_session(self.session_id, str(self.workdir), state)
        except OrchmodeError as exc:
            log.warning("could not record session %s: %s", self.session_id, exc)

    async def checkpoint(self) -> None:
        """Record what the history gained (or had rewritten) since the last checkpoint.

        Append-only in the common case: only the new messages are written. A failure is
        logged, not fatal: the turn goes on, and the next checkpoint writes what was missed.
        """
        history, recorded = self.history, self._recorded
        same = 0
        limit = min(len(history), len(recorded))
        while same < limit and history[same] is recorded[same]:
            same += 1
        if same == len(history) == len(recorded):
            return
        texts = [message_json(m) for m in history[same:]]
        try:
            await self.store.record_messages(self.session_id, same, texts)
        except OrchmodeError as exc:
            log.warning("could not checkpoint session %s: %s", self.session_id, exc)
            return
        self._recorded = list(history)

    async def _list_tools(self) -> None:
        if self.mcp is not None and self.tools is self.main_tools:
            self.tools = await with_mcp_tools(self.main_tools, self.mcp, "main")
            self.meter.fixed_tokens = Meter([MAIN_SYSTEM, self.tools]).fixed_tokens

    def _agent_loop(self) -> AgentLoop:
        """The agent loop as the main agent runs it: streaming its text, checkpointing."""
        return AgentLoop(
            self.gateway,
            "main",
            MAIN_SYSTEM,
            self.room,
            _MainHooks(self),
            last_message_id=self.last_message_id,
        )

    def _toolbox(self) -> Toolbox:
        """Workflow, bash and the user's MCP tools."""

        async def bash(tool_use: ToolUseBlock, _gathered: object) -> ToolResultBlock:
            return await run_bash(self.shell, tool_use, agent="main", events=self.events)

        async def workflow(tool_use: ToolUseBlock, gathered: Gathered) -> ToolResultBlock:
            try:
                tokens = self.room.result_budget(self.history, estimate_tokens(gathered))
                text, is_error = await self.workflow.run(tool_use.get("input"), tokens)
            except AuthError:
                raise
            except Exception as exc:
                log.exception("the Workflow tool failed")
                text, is_error = f"error: the workflow failed: {exc}", True
            return tool_result(tool_use["id"], text, is_error=is_error)

        prefixes: dict[str, Handler] = {}
        mcp = self.mcp
        if mcp is not None:

            async def mcp_tool(tool_use: ToolUseBlock, _gathered: object) -> ToolResultBlock:
                permit = self.permits.for_agent("main").mcp if self.permits else None
                return await mcp.call(tool_use, agent="main", role="main", permit=permit)

            prefixes["mcp__"] = mcp_tool
        return Toolbox(self.tools, {"bash": bash, "Workflow": workflow}, prefixes)

    async def _loop(self) -> TurnResult:
        limit = self.settings.main_turns
        await self._list_tools()
        done = await self._agent_loop().run(self.history, self._toolbox(), limit)
        return self._turn_result(done, limit)

    def _turn_result(self, done: LoopResult, limit: int) -> TurnResult:
        """How the loop ended, as a main turn's result."""
        calls = done.requests
        if done.ending is Ending.TOO_LONG:
            return self._give_up(str(done.error), calls)
        if done.ending is Ending.FAILED:
            return TurnResult(
                f"[orchmode: the model request failed: {done.error}]", "error", calls, done.error
            )
        if done.ending is Ending.TURN_LIMIT:
            return TurnResult(turn_limit_note(limit), "turn_limit", limit)
        rule = done.rule
        if rule is not None and not rule.kept:
            return TurnResult(f"{done.text}\n\n{rule.note}".strip(), done.stop, calls)
        if done.empty:
            return TurnResult("[orchmode: the model sent an empty reply]", "empty", calls)
        return TurnResult(done.text, done.stop or "end_turn", calls)

    # ------------------------------------------------------------------ context

    def _save_tool_result(self, tool_use_id: str, text: str) -> str | None:
        return self.results.write_text("tool", tool_use_id, text)

    def _give_up(self, why: str, call: int) -> TurnResult:
        """End a turn that cannot be made to fit, leaving a conversation the next turn can use.

        Every tool result is stubbed; if that is not enough, the turn's own work after its
        user message is let go, then the user message itself is stubbed, then the oldest
        turns are let go — until the conversation is back under ``compact_to``.
        """
        before = self.meter.size(self.history)
        target = self.meter.target(self.history, self.window.compact_to)
        done = compact(
            self.history,
            self.meter.estimate(self.history),
            0,
            self._save_tool_result,
            keep_last=False,
        )
        history, notes = done.messages, [done.detail] if done.stubbed else []
        if self.meter.estimate(history) > target and len(history) > self._turn_body:
            history = history[: self._turn_body]
            notes.append("the turn's work after its user message")
        start = self._turn_start
        if self.meter.estimate(history) > target and start < len(history):
            text = _message_text(history[start])
            saved = self.results.write_text("message", f"{self.session_id}:{start}", text)
            history[start] = {
                "role": "user",
                "content": f"[orchmode: the user's message (about {estimate_tokens(text):,} "
                f"tokens) did not fit the context window; it is saved at {saved}]",
            }
            notes.append("the user's message")
        dropped = 0
        while self.meter.estimate(history) > target:
            cut = _second_turn_start(history)
            if cut is None:
                break
            history = history[cut:]
            dropped += 1
        if dropped:
            notes.append(f"the {dropped} oldest {'turn' if dropped == 1 else 'turns'}")
        self._turn_start = min(self._turn_start, len(history))
        self.history = history
        self.meter.forget()
        self.events.emit(
            ContextCompacted(
                "main", "dropped", before, self.meter.estimate(history), "; ".join(notes), True
            )
        )
        return TurnResult(
            "[orchmode: this turn could not go on — the conversation does not fit the model's "
            f"context window even after compaction ({why}). Its tool results are saved in "
            f"{self.results.directory}; the next turn starts from a smaller conversation.]",
            "context_exceeded",
            call,
        )

    async def close(self) -> None:
        """Close the main shell, and the parts if the conversation was given their closing."""
        try:
            await self.shell.close()
        finally:
            if self._closer is not None:
                closer, self._closer = self._closer, None
                await closer.aclose()


class _MainHooks(Hooks):
    """The main agent's part in the loop: every step checkpointed, the last response kept."""

    def __init__(self, session: Conversation) -> None:
        self.session = session

    async def changed(self) -> None:
        await self.session.checkpoint()

    def replied(self, reply: ModelReply) -> None:
        self.session.last_message_id = reply.message_id


def _message_text(message: Message) -> str:
    return content_text(message.get("content"))


def _second_turn_start(history: list[Message]) -> int | None:
    """Where the conversation's second user turn begins: cutting there lets go of the first
    turn and keeps the rest valid (it starts at a user text, never at a tool result)."""
    return next((i for i in turn_starts(history) if i > 0), None)


@asynccontextmanager
async def open_conversation(
    settings: Settings, credentials: Credentials | None = None, **options: Unpack[StartOptions]
) -> AsyncIterator[Conversation]:
    """A conversation on freshly built parts (``options`` as :func:`session_parts` takes
    them), closed with its parts on the way out; not claimed and its executor not started
    (:func:`orchmode.open_session` does both)."""
    conversation = await start_conversation(settings, credentials, **options)
    try:
        yield conversation
    finally:
        await conversation.close()


async def start_conversation(
    settings: Settings, credentials: Credentials | None = None, **options: Unpack[StartOptions]
) -> Conversation:
    """A conversation on freshly built parts, for a caller without a ``with`` block (a test,
    a benchmark): its :meth:`~Conversation.close` closes the parts too."""
    stack = AsyncExitStack()
    try:
        parts = await stack.enter_async_context(session_parts(settings, credentials, **options))
    except BaseException:
        await stack.aclose()
        raise
    return Conversation(parts, closer=stack)
