"""``orchmode chat``: an interactive session, with slash commands and Ctrl-C that cancels a turn.

Lines come from prompt_toolkit (history, editing) on a terminal, and from plain stdin lines
otherwise, so the same loop runs under a test with its input piped in. A cancelled turn
leaves the conversation valid — :meth:`orchmode.Session.turn` answers every tool call and
saves the history even when cancelled — and the subagents that finished stay in the journal.

An answer is printed once its turn has ended: as rendered Markdown when stdout is a terminal
(a half-written answer could not be drawn), its control characters shown as escapes; exactly
as the model wrote it otherwise.

While a turn runs, lines are still read (on a terminal as plain typed lines, the prompt
coming back once the turn ends): ``/approve`` and ``/deny`` answer a waiting agent at once,
since the turn may be waiting for exactly that; every other line is kept, in order, for
after the turn, as if typed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from ..core.errors import AuthError, OrchmodeError, StoreError
from ..core.events import ApprovalAnswered, ApprovalRequested, Event
from ..core.settings import Settings
from ..model.providers import Credentials
from ..records.totals import SessionTotals
from ..session.api import Session, TurnResult, open_session
from ..views.display import Display, DisplayMode, make_display
from ..views.escape import visible
from ..views.markdown import print_answer
from .answers import answer, doing

PROMPT = "you> "

HELP = """\
/mode on|off   switch orchestration mode (the model is told with your next message)
/status        mode, session id and turns so far
/budget        subagents launched and tokens spent against the caps
/cost          requests, tokens, cache share and dollars of this session
/resume        finish a resumed session's interrupted turn from where it stopped
/approvals     the approvals waiting for your answer
/approve N     let the agent waiting on approval N go on (/approve N always: and remember
               the rule for this directory); works while a turn runs
/deny N [why]  refuse approval N, telling the agent why; works while a turn runs
/exit          leave (so do Ctrl-D and a second Ctrl-C)"""

#: Commands taken at once while a turn runs: the turn may be waiting for their answer.
ANSWERED_MID_TURN = ("/approve", "/deny", "/approvals")


class Lines(Protocol):
    """Where the user's lines come from; ``None`` at the end of input."""

    async def read(self, prompt: str) -> str | None: ...

    def meanwhile(self) -> Lines:
        """Where lines come from while a turn runs (no prompt is drawn then)."""


class PromptLines:
    """A terminal: prompt_toolkit, with the history kept across chats."""

    def __init__(self, history_file: Path | None, fd: int | None = None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory

        history = FileHistory(str(history_file)) if history_file else InMemoryHistory()
        self.session: PromptSession[str] = PromptSession(history=history)
        #: Lines typed while turns run: one reader, so a line it read is never lost.
        self.typed = TypedLines(sys.stdin.fileno() if fd is None else fd)

    async def read(self, prompt: str) -> str | None:
        if self.typed.lines:  # typed during the last turn, not yet taken
            return self.typed.lines.popleft()
        try:
            # handle_sigint=False: prompt_toolkit would otherwise take over SIGINT while it
            # reads and remove the handler on return, leaving a running turn deaf to Ctrl-C.
            return await self.session.prompt_async(prompt, handle_sigint=False)
        except EOFError:
            return None

    def meanwhile(self) -> Lines:
        return self.typed


class TypedLines:
    """Lines typed on the terminal while a turn runs, read as the terminal hands them over.

    No prompt_toolkit then: the terminal stays as it is between prompts (it echoes what is
    typed, and Ctrl-C is a signal that cancels the turn), and only whole lines are taken —
    what is half typed when the turn ends is still there for the prompt that comes back.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""
        self.lines: deque[str | None] = deque()

    async def read(self, prompt: str) -> str | None:
        while not self.lines:
            await _readable(self.fd)
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:  # woken for nothing (the descriptor is non-blocking)
                continue
            if not chunk:
                self.lines.append(None)
                break
            self.pending += chunk
            *whole, self.pending = self.pending.split(b"\n")
            self.lines.extend(line.decode("utf-8", "replace") for line in whole)
        return self.lines.popleft()

    def meanwhile(self) -> Lines:
        return self


async def _readable(fd: int) -> None:
    """Wait until ``fd`` has something to read (a whole line, on a terminal between prompts)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


class PipeLines:
    """Plain lines from a stream (a pipe in tests), read by a daemon thread.

    A daemon thread, not the loop's executor: a read blocked on a pipe that never closes
    must not hold the process open once the user has left.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def pump() -> None:
            for line in stream:
                loop.call_soon_threadsafe(self.queue.put_nowait, line)
            loop.call_soon_threadsafe(self.queue.put_nowait, None)

        threading.Thread(target=pump, name="orchmode-stdin", daemon=True).start()

    async def read(self, prompt: str) -> str | None:
        return await self.queue.get()

    def meanwhile(self) -> Lines:
        return self  # the same queue: a line is read once, whoever reads it


@dataclass
class Chat:
    session: Session
    totals: SessionTotals
    display: Display
    lines: Lines
    out: TextIO = field(default_factory=lambda: sys.stdout)
    #: A person types the lines (a terminal), so lines kept for after a turn are said so.
    interactive: bool = False

    def __post_init__(self) -> None:
        self.turn_task: asyncio.Task[TurnResult] | None = None
        #: Lines read while a turn ran, for after it (``None``: the input ended).
        self.held: deque[str | None] = deque()
        #: the last thing the user did was Ctrl-C: another one leaves
        self.interrupted = False
        #: the resumed session's last turn never ended: /resume finishes it
        self.unfinished = False
        self.leaving = asyncio.Event()

    def say(self, text: str) -> None:
        """One line of the chat's own on stdout (it may quote what the user typed)."""
        print(visible(text), file=self.out, flush=True)

    def interrupt(self) -> None:
        """Ctrl-C: cancel the running turn; with none running, or the second time, leave."""
        task = self.turn_task
        if task is not None and not task.done() and not self.interrupted:
            self.interrupted = True
            task.cancel()
            return
        if self.interrupted:
            self.leaving.set()
            if task is not None:
                task.cancel()
            return
        self.interrupted = True
        self.display.notice("[chat] Ctrl-C again or /exit to leave")

    async def run(self) -> None:
        while not self.leaving.is_set():
            try:
                line = await self._next_line()
            except KeyboardInterrupt:  # prompt_toolkit's Ctrl-C at the prompt
                self.interrupt()
                continue
            if line is None:
                break
            line = line.strip()
            if not line:
                continue
            self.interrupted = False
            if line.startswith("/"):
                if not await self.command(line):
                    break
            else:
                await self.turn(line)

    async def _next_line(self) -> str | None:
        if self.held:
            return self.held.popleft()
        read = asyncio.ensure_future(self.lines.read(PROMPT))
        leave = asyncio.ensure_future(self.leaving.wait())
        done, _ = await asyncio.wait({read, leave}, return_when=asyncio.FIRST_COMPLETED)
        if read in done:
            leave.cancel()
            return read.result()
        read.cancel()
        return None

    async def turn(self, text: str) -> None:
        await self._drive(self.session.turn(text))

    async def _drive(self, work: Coroutine[Any, Any, TurnResult]) -> None:
        """Run one turn (a new one, or an interrupted one finished) so Ctrl-C cancels it,
        reading lines meanwhile."""
        self.turn_task = asyncio.create_task(work)
        reader = asyncio.create_task(self._meanwhile())
        try:
            result = await self.turn_task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the chat itself is being torn down
            self.display.stop()
            self.display.notice(
                "[chat] turn cancelled; finished subagents are kept in the journal "
                "(Ctrl-C again to leave)"
            )
            return
        except (AuthError, StoreError):
            raise  # every later turn would fail the same way: the chat stops, in one line
        except OrchmodeError as exc:
            self.display.notice(f"orchmode: {exc}")
            return
        finally:
            self.turn_task = None
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        print_answer(result.text, self.out)

    async def _meanwhile(self) -> None:
        """While a turn runs: answer approvals at once, keep every other line for after it."""
        lines = self.lines.meanwhile()
        while True:
            line = await lines.read("")
            text = None if line is None else line.strip()
            if text is not None and text.split(" ", 1)[0].lower() in ANSWERED_MID_TURN:
                # shielded: the turn ending does not cut an answer off half-given
                await asyncio.shield(self.command(text))
                continue
            if text == "":
                continue
            self.held.append(text)
            if text is None:
                return
            if self.interactive:
                self.say(
                    "[chat] a turn is running: that is kept for after it (Ctrl-C cancels the "
                    "turn; /approve and /deny answer at once)"
                )

    def on_event(self, event: Event) -> None:
        """Say an approval asked for, and its answer, on the chat's own lines."""
        if isinstance(event, ApprovalRequested):
            self.say(
                f"[chat] approval {event.id}: {event.agent} asks to {doing(event.kind)} "
                f"{event.what} ({event.why}) — /approve {event.id}, /approve {event.id} "
                f"always, or /deny {event.id} [why]"
            )
        elif isinstance(event, ApprovalAnswered):
            said = f": {event.reason}" if event.reason else ""
            always = " (always)" if event.always else ""
            self.say(f"[chat] approval {event.id} {event.answer}{always}{said}")

    async def command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        name, _, rest = line.partition(" ")
        arg = rest.strip().lower()
        match name.lower():
            case "/exit" | "/quit":
                return False
            case "/mode" if arg in ("on", "off"):
                self.session.set_mode(arg == "on")
                self.say(
                    f"[chat] orchestration mode {arg}; the model hears of it with your next message"
                )
            case "/mode":
                self.say(f"[chat] mode is {self._mode()}; /mode on or /mode off to switch")
            case "/status":
                self.say(
                    f"[chat] mode {self._mode()} · session {self.session.id} · {self.turns()} turns"
                )
            case "/budget":
                self.say(f"[chat] {(await self.session.budget()).describe()}")
            case "/cost":
                self.say(f"[chat] {self.totals.describe()}")
            case "/resume" if self.unfinished:
                self.unfinished = False
                await self._drive(self.session.resume_turn())
            case "/resume":
                self.say("[chat] there is no interrupted turn to finish")
            case "/approvals":
                await self._list_approvals()
            case "/approve" | "/deny":
                await self._answer(line)
            case "/help":
                self.say(HELP)
            case _:
                self.say(f"[chat] unknown command {name}; /help lists them")
        return True

    def _mode(self) -> str:
        return "on" if self.session.mode else "off"

    async def _list_approvals(self) -> None:
        waiting = await self.session.approvals()
        if not waiting:
            self.say("[chat] no approval is waiting for an answer")
        for approval in waiting:
            request = approval.request
            self.say(
                f"[chat] approval {approval.id}: {request.agent} asks to "
                f"{doing(request.kind)} {request.what} ({request.why})"
            )

    async def _answer(self, line: str) -> None:
        """``/approve N [always]`` or ``/deny N [why]``."""
        self.say(f"[chat] {await answer(self.session, line)}")

    def turns(self) -> int:
        """User turns in the conversation, resumed ones included (tool results are not turns)."""
        return self.session.user_turns


def _install_interrupt(handler: Callable[[], None]) -> Callable[[], None]:
    """Route SIGINT to ``handler`` while the chat runs; returns the undo."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, handler)
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        return lambda: None

    def undo() -> None:
        loop.remove_signal_handler(signal.SIGINT)

    return undo


async def run_chat(
    settings: Settings,
    workdir: Path,
    credentials: Credentials | None,
    *,
    display_mode: DisplayMode,
    stdin: TextIO | None = None,
) -> None:
    """The ``chat`` command: open the session (resumed if recorded), then talk until /exit."""
    stdin = stdin or sys.stdin
    warnings: list[str] = []  # shown once the display is made: it draws the session's totals
    async with open_session(
        settings, workdir=workdir, credentials=credentials, on_warning=warnings.append
    ) as session:
        display: Display | None = None
        undo: Callable[[], None] = lambda: None  # noqa: E731
        try:
            # a resumed session's totals so far, so /cost speaks for all of it
            totals = session.running_totals
            display = make_display(display_mode, totals)
            for warning in warnings:
                display.notice(f"orchmode: warning: {warning}")
            session.subscribe(display)
            cut_off = session.resumed and await session.interrupted()
            if session.resumed:
                state = "on" if session.mode else "off"
                display.notice(f"[session] resuming {session.id} (mode {state})")
            if cut_off:
                display.notice(
                    "[session] its last turn was interrupted; /resume finishes it from the "
                    "step where it stopped, without a new plan"
                )
            if stdin.isatty():
                history = workdir / ".orchmode" / "chat_history"
                history.parent.mkdir(parents=True, exist_ok=True)
                lines: Lines = PromptLines(history, stdin.fileno())
            else:
                lines = PipeLines(stdin)
            chat = Chat(session, totals, display, lines, interactive=stdin.isatty())
            session.subscribe(chat.on_event)
            chat.unfinished = cut_off
            undo = _install_interrupt(chat.interrupt)
            await chat.run()
            display.notice(
                f"[session] {totals.describe()}; continue it with "
                f"orchmode chat --session {session.id}"
            )
        finally:
            undo()
            if display is not None:
                display.stop()
