"""A session: the conversation, its mode notices, and the main agent loop with Workflow and bash.

The history is append-only (a truncated or refused reply is the one thing ever dropped) so
every request extends the previous one and the prompt cache keeps hitting. Whatever
happens inside a turn — a failed request, a tool that raises, a cancellation — the history
is left valid for the next turn: every ``tool_use`` gets its ``tool_result``.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from .budget import SessionBudget
from .errors import AuthError, OrchmodeError
from .events import EventBus, TurnDone, TurnStarted
from .executors import Executor, open_executor
from .executors.host import AgentHost, ShellFactory
from .executors.local import LocalExecutor
from .mode import ModeState
from .model import Credentials, Message, ModelGateway
from .prompts import (
    MAIN_SYSTEM,
    MAIN_TOOLS,
    MAX_TOKENS_NOTE,
    NOTICES,
    notice_as_user_text,
    turn_limit_note,
)
from .settings import Settings
from .store import Store, open_store
from .tools import Block, run_bash, tool_result, unknown_tool
from .workflow import Workflow

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


class Session:
    """One conversation with the main agent."""

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
        #: The main conversation's last response, for the API's cache diagnostics.
        self.last_message_id: str | None = None
        credentials = gateway.credentials
        self.make_shell = ShellFactory.build(
            settings, workdir, (credentials.api_key or "", credentials.auth_token or "")
        )
        self.shell = self.make_shell()
        self.store = store
        self.session_id = session_id or settings.session or new_session_id()
        self.budget = SessionBudget(store, self.session_id, settings)
        gateway.budget = self.budget
        #: Where subagents run: here unless the caller brought another executor (Ray),
        #: which the caller then closes.
        self._owns_executor = executor is None
        self.executor = executor or LocalExecutor(
            AgentHost(settings, gateway, store, self.make_shell)
        )
        self.workflow = Workflow(settings, gateway, self.budget, self.events, self.executor)

    def set_mode(self, on: bool) -> None:
        """Switch orchestration mode; the model hears of it with the next user turn."""
        self.mode.set_mode(on)

    async def turn(self, text: str) -> TurnResult:
        text = text.strip()
        if not text:
            raise OrchmodeError("a user turn needs some text")
        notices = self.mode.user_turn()
        if self.settings.notice_delivery == "user-text":
            folded = "".join(notice_as_user_text(NOTICES[n]) for n in notices)
            self.history.append({"role": "user", "content": text + folded})
        else:
            self.history.append({"role": "user", "content": text})
            for notice in notices:
                self.history.append({"role": "system", "content": NOTICES[notice]})
        self.events.emit(TurnStarted(text, tuple(n.value for n in notices)))
        try:
            result = await self._loop()
        except Exception:
            # A turn that raised (a rejected key, a store gone bad) is recorded as failed;
            # only one that never got here — a killed process — reads as interrupted.
            self.events.emit(TurnDone("error", 0))
            raise
        finally:
            await self._save()
        self.events.emit(TurnDone(result.stop, result.model_calls))
        return result

    async def restore(self) -> bool:
        """Take up this session's recorded conversation and mode, if it has been recorded."""
        record = await self.store.load_session(self.session_id)
        if record is None:
            return False
        try:
            state = json.loads(record.state)
            history, mode = state["history"], ModeState(**state["mode"])
            if not isinstance(history, list):
                raise TypeError("history is not a list")
        except (ValueError, TypeError, KeyError) as exc:
            raise OrchmodeError(
                f"session {self.session_id!r} is recorded but cannot be resumed ({exc}) — "
                "start a new one without --session"
            ) from exc
        self.history, self.mode = history, mode
        return True

    async def _save(self) -> None:
        """Record the conversation and its mode; a failure is logged, not fatal."""
        state = json.dumps({"history": self.history, "mode": self.mode.snapshot()})
        try:
            await self.store.save_session(self.session_id, str(self.workdir), state)
        except OrchmodeError as exc:
            log.warning("could not record session %s: %s", self.session_id, exc)

    async def _loop(self) -> TurnResult:
        limit = self.settings.main_turns
        paused_text: list[str] = []
        for call in range(1, limit + 1):
            try:
                reply = await self.gateway.complete(
                    agent="main",
                    system=MAIN_SYSTEM,
                    messages=self.history,
                    tools=MAIN_TOOLS,
                    on_text=self.on_text,
                    previous_message_id=self.last_message_id,
                )
                self.last_message_id = reply.message_id
            except AuthError:
                raise
            except OrchmodeError as exc:
                return TurnResult(
                    f"[orchmode: the model request failed: {exc}]", "error", call, exc
                )
            stop = reply.stop_reason or "end_turn"
            if stop == "pause_turn":
                if reply.content:
                    self.history.append({"role": "assistant", "content": reply.content})
                    paused_text.append(reply.text)
                continue
            if stop != "tool_use" or not reply.tool_uses:
                text = "\n\n".join(t for t in [*paused_text, reply.text] if t)
                if stop in _DROPPED:
                    return TurnResult(f"{text}\n\n{_DROPPED[stop]}".strip(), stop, call)
                if not reply.content:
                    return TurnResult("[orchmode: the model sent an empty reply]", "empty", call)
                self.history.append({"role": "assistant", "content": reply.content})
                return TurnResult(text, stop, call)
            paused_text.clear()
            self.history.append({"role": "assistant", "content": reply.content})
            await self._run_tools(reply.tool_uses)
        return TurnResult(turn_limit_note(limit), "turn_limit", limit)

    async def _run_tools(self, tool_uses: list[Block]) -> None:
        """Run the calls in order and append all results in one user message, whatever happens."""
        results: list[Block] = []
        try:
            for tool_use in tool_uses:
                results.append(await self._run_tool(tool_use))
        finally:
            answered = {r["tool_use_id"] for r in results}
            for tool_use in tool_uses:
                if tool_use["id"] not in answered:
                    results.append(
                        tool_result(tool_use["id"], "[orchmode: interrupted]", is_error=True)
                    )
            self.history.append({"role": "user", "content": results})

    async def _run_tool(self, tool_use: Block) -> Block:
        name = tool_use.get("name")
        if name == "bash":
            return await run_bash(self.shell, tool_use, agent="main", events=self.events)
        if name == "Workflow":
            try:
                text, is_error = await self.workflow.run(tool_use.get("input"))
            except AuthError:
                raise
            except Exception as exc:
                log.exception("the Workflow tool failed")
                text, is_error = f"error: the workflow failed: {exc}", True
            return tool_result(tool_use["id"], text, is_error=is_error)
        return unknown_tool(tool_use, [str(t["name"]) for t in MAIN_TOOLS])

    async def close(self) -> None:
        await self.shell.close()
        await self.budget.flush()
        if self._owns_executor:
            await self.executor.close()


@asynccontextmanager
async def open_session(
    settings: Settings, workdir: Path, credentials: Credentials, events: EventBus
) -> AsyncIterator[Session]:
    """A session with its executor (started), store and gateway; all closed on the way out."""
    executor = open_executor(settings, credentials, workdir)
    store = await open_store(settings.store_url(workdir))
    gateway = ModelGateway(settings, credentials, events)
    session = Session(
        settings, gateway, workdir=workdir, store=store, events=events, executor=executor
    )
    try:
        if executor is not None:
            await executor.start()
        yield session
    finally:
        await session.close()
        if executor is not None:
            await executor.close()
        await gateway.close()
        await store.close()
