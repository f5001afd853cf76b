"""The conversation: its history, its mode notices, and the main agent loop with Workflow and bash.

The history is append-only (a truncated or refused reply is the one thing ever dropped) so
every request extends the previous one and the prompt cache keeps hitting. Whatever
happens inside a turn — a failed request, a tool that raises, a cancellation — the history
is left valid for the next turn: every ``tool_use`` gets its ``tool_result``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import AuthError, OrchmodeError, PromptTooLong
from ..core.events import ContextCompacted, EventBus, TurnDone, TurnStarted
from ..core.mode import ModeState
from ..core.prompts import (
    MAIN_SYSTEM,
    MAIN_TOOLS,
    MAX_TOKENS_NOTE,
    NOTICES,
    notice_as_user_text,
    turn_limit_note,
)
from ..core.settings import Settings
from ..executors import Executor, open_executor
from ..executors.host import AgentHost, ShellFactory
from ..fanout.workflow import Workflow
from ..model.budget import SessionBudget
from ..model.context import (
    ESTIMATE_SLACK,
    Compaction,
    Meter,
    Window,
    compact,
    content_text,
    estimate_tokens,
    turn_starts,
)
from ..model.gateway import Message, ModelGateway, ModelReply
from ..store import Store
from ..store.claims import holder_name
from ..store.result_files import ResultFiles, results_dir
from ..tools.calls import Block, run_bash, tool_result, unknown_tool
from ..tools.mcptools import McpHub, with_mcp_tools
from ..trees.copies import Trees

log = logging.getLogger("orchmode")

#: Stop reasons whose reply is not kept in the history, with the note the user sees.
_DROPPED = {
    "max_tokens": MAX_TOKENS_NOTE,
    "model_context_window_exceeded": (
        "[orchmode: the conversation no longer fits the model's context window; the reply "
        "was dropped]"
    ),
    "refusal": "[orchmode: the model declined to continue (refusal); the reply was dropped]",
}
#: Tool uses the API's context editing leaves whole at the end of the conversation.
KEEP_TOOL_USES = 2
#: The result of a bash command that was running when orchmode stopped, on resume.
CUT_OFF_NOTE = (
    "[orchmode: this command was cut off when orchmode stopped, and it was not run again "
    "on resume: it may have done part of its work. Check its effects before running it again.]"
)


def new_session_id() -> str:
    """Sortable and unique enough: when it started, and a little randomness."""
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


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

    Opened, claimed and closed by :func:`orchmode.open_session`, the one start-up; built
    directly only by tests and benchmarks that bring their own gateway and store.
    """

    def __init__(
        self,
        settings: Settings,
        gateway: ModelGateway,
        *,
        workdir: Path,
        store: Store,
        session_id: str | None = None,
        events: EventBus | None = None,
        on_text: Callable[[str], None] | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.settings = settings
        self.gateway = gateway
        self.workdir = workdir
        self.events = events or gateway.events
        self.on_text = on_text
        self.mode = ModeState(mode_on=settings.mode, refresh_every=settings.refresh_every)
        self.history: list[Message] = []
        #: The history as last checkpointed: the same message objects, so what is new (or
        #: rewritten by a compaction) is found by identity, without serialising anything.
        self._recorded: list[Message] = []
        #: What the session was started for, kept with its state (``orchmode run`` records
        #: its task and phase, so a resume can finish the run).
        self.meta: dict[str, Any] = {}
        #: Where the current turn begins (its user text), and where its own messages begin:
        #: after that text and its notices.
        self._turn_start = 0
        self._turn_body = 0
        #: The main conversation's last response, for the API's cache diagnostics.
        self.last_message_id: str | None = None
        self.store = store
        self.session_id = session_id or settings.session or new_session_id()
        #: Who holds this session's claim: this host, this process, this session object.
        self.holder = holder_name()
        #: The user's MCP servers (``mcp_config``), started when an agent first needs them.
        self.mcp = McpHub.from_settings(settings, workdir, self.events, os.environ)
        credentials = gateway.credentials
        keys: tuple[str, ...] = credentials.secrets
        if self.mcp is not None:
            keys += self.mcp.secrets
        #: Every agent's full result, and every tool result a compaction took out.
        self.results = ResultFiles(results_dir(workdir, self.session_id), keys)
        readable = (self.results.directory,) if self.results.make_directory() else ()
        self.make_shell = ShellFactory.build(settings, workdir, keys, readable)
        self.shell = self.make_shell()
        self.window = Window.from_settings(settings)
        self.meter = Meter([MAIN_SYSTEM, MAIN_TOOLS])
        #: What the main agent is offered: Workflow, bash and its MCP tools (known once the
        #: first turn starts their servers).
        self.tools: list[Block] = MAIN_TOOLS
        self.budget = SessionBudget(store, self.session_id, settings)
        gateway.budget = self.budget
        #: Where subagents run: the one ``settings`` ask for, opened (and closed) here,
        #: unless the caller brought its own, which the caller then closes.
        self._owns_executor = executor is None
        #: The tree's private store and this process's copies of it (``worktree``).
        self.trees = Trees(workdir)
        self.trees.sweep()  # copies left by a run that was killed
        self.executor = executor or open_executor(
            settings,
            gateway.credentials,
            workdir,
            AgentHost(settings, gateway, store, self.make_shell, self.trees, self.mcp),
        )
        self.workflow = Workflow(
            settings,
            gateway,
            self.budget,
            self.events,
            self.executor,
            results=self.results,
            trees=self.trees,
            mcp=self.mcp,
        )

    def set_mode(self, on: bool) -> None:
        """Switch orchestration mode; the model hears of it with the next user turn."""
        self.mode.set_mode(on)

    async def turn(self, text: str) -> TurnResult:
        text = text.strip()
        if not text:
            raise OrchmodeError("a user turn needs some text")
        notices = self.mode.user_turn()
        self._turn_start = len(self.history)
        if self.gateway.notices_in_user_text:
            folded = "".join(notice_as_user_text(NOTICES[n]) for n in notices)
            self.history.append({"role": "user", "content": text + folded})
        else:
            self.history.append({"role": "user", "content": text})
            for notice in notices:
                self.history.append({"role": "system", "content": NOTICES[notice]})
        self._turn_body = len(self.history)
        self.events.emit(TurnStarted(text, tuple(n.value for n in notices)))
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
        body = self._turn_start + 1
        while body < len(self.history) and self.history[body].get("role") == "system":
            body += 1
        self._turn_body = body
        last = self.history[-1]
        if last.get("role") == "assistant":
            pending = [
                b
                for b in last.get("content") or []
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
            if not pending:
                text = _message_text(last)
                self.events.emit(TurnDone("end_turn", 0))
                return TurnResult(text, "end_turn", 0)
            return await self._finish(self._settle_then_loop(pending))
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

    async def _settle_then_loop(self, pending: list[Block]) -> TurnResult:
        await self._run_tools(pending, resumed=True)
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
            meta = state.get("meta") or {}
            checkpoints = await self.store.load_messages(self.session_id)
            if checkpoints:
                history = [json.loads(text) for text in checkpoints]
            if not isinstance(history, list) or not all(isinstance(m, dict) for m in history):
                raise TypeError("history is not a list of messages")
            if not isinstance(meta, dict):
                raise TypeError("meta is not an object")
        except (ValueError, TypeError, KeyError) as exc:
            raise OrchmodeError(
                f"session {self.session_id!r} is recorded but cannot be resumed ({exc}) — "
                "start a new one without --session"
            ) from exc
        self.history, self.mode, self.meta = history, mode, meta
        self._recorded = list(history) if checkpoints else []
        self.meter.forget()
        return True

    async def save(self) -> None:
        """Record the conversation and its mode; a failure is logged, not fatal."""
        state = json.dumps(
            {"history": self.history, "mode": self.mode.snapshot(), "meta": self.meta}
        )
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
        texts = [json.dumps(m, ensure_ascii=False) for m in history[same:]]
        try:
            await self.store.record_messages(self.session_id, same, texts)
        except OrchmodeError as exc:
            log.warning("could not checkpoint session %s: %s", self.session_id, exc)
            return
        self._recorded = list(history)

    async def _list_tools(self) -> None:
        if self.mcp is not None and self.tools is MAIN_TOOLS:
            self.tools = await with_mcp_tools(MAIN_TOOLS, self.mcp, "main")
            self.meter.fixed_tokens = Meter([MAIN_SYSTEM, self.tools]).fixed_tokens

    async def _loop(self) -> TurnResult:
        limit = self.settings.main_turns
        await self._list_tools()
        paused_text: list[str] = []
        #: A request refused as too long is compacted and sent again once, not more.
        retried = False
        for call in range(1, limit + 1):
            await self._make_room()
            sent = len(self.history)
            try:
                reply = await self.gateway.complete(
                    agent="main",
                    system=MAIN_SYSTEM,
                    messages=self.history,
                    tools=self.tools,
                    on_text=self.on_text,
                    previous_message_id=self.last_message_id,
                    context_edits=self._context_edits(),
                )
                self.last_message_id = reply.message_id
            except AuthError:
                raise
            except PromptTooLong as exc:
                if exc.tokens is not None:
                    self.meter.observe(sent, exc.tokens)
                if not retried and self._compact(refused=True):
                    retried = True
                    continue
                return self._give_up(str(exc), call)
            except OrchmodeError as exc:
                return TurnResult(
                    f"[orchmode: the model request failed: {exc}]", "error", call, exc
                )
            self._measured(sent, reply)
            stop = reply.stop_reason or "end_turn"
            refused = stop == "model_context_window_exceeded"
            if refused and not retried and self._compact(refused=True):
                retried = True
                continue
            retried = False
            if stop == "pause_turn":
                if reply.content:
                    self.history.append({"role": "assistant", "content": reply.content})
                    paused_text.append(reply.text)
                    await self.checkpoint()
                continue
            if stop != "tool_use" or not reply.tool_uses:
                text = "\n\n".join(t for t in [*paused_text, reply.text] if t)
                if stop in _DROPPED:
                    return TurnResult(f"{text}\n\n{_DROPPED[stop]}".strip(), stop, call)
                if not reply.content:
                    return TurnResult("[orchmode: the model sent an empty reply]", "empty", call)
                self.history.append({"role": "assistant", "content": reply.content})
                await self.checkpoint()
                return TurnResult(text, stop, call)
            paused_text.clear()
            self.history.append({"role": "assistant", "content": reply.content})
            await self.checkpoint()
            await self._run_tools(reply.tool_uses)
        return TurnResult(turn_limit_note(limit), "turn_limit", limit)

    # ------------------------------------------------------------------ context

    def _context_edits(self) -> list[Block] | None:
        """The API's context editing, asked for while the endpoint takes it."""
        if self.settings.context_management != "auto" or not self.gateway.context_editing:
            return None
        w = self.window
        return [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": w.compact_at},
                "keep": {"type": "tool_uses", "value": KEEP_TOOL_USES},
                # One large step, so the cached prefix is rebuilt seldom.
                "clear_at_least": {"type": "input_tokens", "value": w.compact_at - w.compact_to},
            }
        ]

    def _measured(self, sent: int, reply: ModelReply) -> None:
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
                    "main",
                    "api",
                    original,
                    counted,
                    f"{uses} tool {'result' if uses == 1 else 'results'} cleared by the API, "
                    f"{reply.cleared_tokens:,} tokens",
                )
            )
            self._compact(size=original)

    async def _make_room(self, extra: int = 0) -> None:
        """Compact before a request (or a result of ``extra`` tokens) would pass the point.

        While the API's context editing is on, it gets the first go at ``compact_at``, and
        orchmode's own compaction is the backstop half-way from there to the window's end.
        """
        point = self._compaction_point()
        size = self.meter.size(self.history) + extra
        if (
            size > point
            and not extra
            and size - point < ESTIMATE_SLACK * self.meter.uncounted(self.history)
        ):
            # Past the point only by what the estimate may overstate: ask the API to count.
            counted = await self.gateway.count_tokens(
                system=MAIN_SYSTEM,
                messages=self.history,
                tools=self.tools,
                context_edits=self._context_edits(),
            )
            if counted is not None:
                self.meter.observe(len(self.history), counted)
                size = counted
        if size > point:
            self._compact(size=size)

    async def _result_budget(self, pending: int) -> int:
        """The most tokens the next Workflow result may take, room made for it first.

        It may take the conversation up to the backstop, half-way from ``compact_at`` to
        the window's end: the next request's compaction (or the API's context editing) then
        makes room again, keeping this newest result whole. Where even the result's full
        share would pass the backstop, older results give way now, before this one shrinks.
        """
        w = self.window
        limit = (w.compact_at + w.tokens) // 2
        if self._context_edits() is None:
            size = self.meter.size(self.history) + pending
            if size + w.result_tokens > limit:
                self._compact(size=size)
        return w.result_budget(self.meter.size(self.history) + pending, limit)

    def _compaction_point(self) -> int:
        """Where orchmode compacts: ``compact_at``, or, while the API's context editing is
        on (it clears at ``compact_at`` itself), half-way from there to the window's end."""
        w = self.window
        if self._context_edits() is not None:
            return (w.compact_at + w.tokens) // 2
        return w.compact_at

    def _compact(self, *, refused: bool = False, size: int | None = None) -> bool:
        """Stub old tool results down to ``compact_to``; False if there was nothing to stub."""
        before = size if size is not None else self.meter.size(self.history)
        estimate = self.meter.estimate(self.history)
        target = self.meter.target(self.history, self.window.compact_to)
        done = compact(self.history, estimate, target, self._save_tool_result)
        if not done.stubbed and refused:  # the latest results may go too, rather than fail
            done = compact(self.history, estimate, target, self._save_tool_result, keep_last=False)
        if not done.stubbed:
            return False
        self._take(done, "stubbed", before, refused)
        return True

    def _take(self, done: Compaction, how: str, before: int, refused: bool) -> None:
        self.history = done.messages
        self.meter.forget()
        self.events.emit(
            ContextCompacted(
                "main",
                how,
                before,
                self.meter.estimate(self.history),
                f"{done.detail} (saved copies in {self.results.directory})",
                refused,
            )
        )

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

    async def _run_tools(self, tool_uses: list[Block], *, resumed: bool = False) -> None:
        """Run the calls in order and append all results in one user message, whatever happens.

        ``resumed``: these calls were cut off when orchmode stopped; a bash command among them
        is not run again (it may have done half its work), its result says so instead.
        """
        results: list[Block] = []
        try:
            for tool_use in tool_uses:
                if resumed and tool_use.get("name") == "bash":
                    results.append(tool_result(tool_use["id"], CUT_OFF_NOTE, is_error=True))
                    continue
                results.append(await self._run_tool(tool_use, estimate_tokens(results)))
        finally:
            answered = {r["tool_use_id"] for r in results}
            for tool_use in tool_uses:
                if tool_use["id"] not in answered:
                    results.append(
                        tool_result(tool_use["id"], "[orchmode: interrupted]", is_error=True)
                    )
            self.history.append({"role": "user", "content": results})
        await self.checkpoint()

    async def _run_tool(self, tool_use: Block, pending: int = 0) -> Block:
        """One tool call; ``pending`` is the tokens of results already gathered beside it."""
        name = tool_use.get("name")
        if name == "bash":
            return await run_bash(self.shell, tool_use, agent="main", events=self.events)
        if name == "Workflow":
            try:
                tokens = await self._result_budget(pending)
                text, is_error = await self.workflow.run(tool_use.get("input"), tokens)
            except AuthError:
                raise
            except Exception as exc:
                log.exception("the Workflow tool failed")
                text, is_error = f"error: the workflow failed: {exc}", True
            return tool_result(tool_use["id"], text, is_error=is_error)
        if self.mcp is not None and self.mcp.handles(name):
            return await self.mcp.call(tool_use, agent="main", role="main")
        return unknown_tool(tool_use, [str(t["name"]) for t in self.tools])

    async def close(self) -> None:
        try:
            await self.shell.close()
            await self.budget.flush()
            if self._owns_executor:
                await self.executor.close()
            if self.mcp is not None:
                await self.mcp.close()
        finally:
            # After an interrupt, closes cancelled mid-way (or never begun) leave shells up,
            # and pooled ones no agent took: none outlives the session.
            self.make_shell.abandon_all()
            self.trees.close()


def _message_text(message: Message) -> str:
    return content_text(message.get("content"))


def _second_turn_start(history: list[Message]) -> int | None:
    """Where the conversation's second user turn begins: cutting there lets go of the first
    turn and keeps the rest valid (it starts at a user text, never at a tool result)."""
    return next((i for i in turn_starts(history) if i > 0), None)
