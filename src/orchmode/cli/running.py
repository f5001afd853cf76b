"""The commands that drive a session: ``run``, ``resume``, ``chat`` and ``demo``.

They start sessions through the library (:func:`orchmode.open_session`), run them with
:meth:`~orchmode.Session.run` and :meth:`~orchmode.Session.resume`, and show them with
their views as the session's subscribers: what a library caller can do, they do the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.settings import Settings
from .common import say, settings_of, workdir_of

if TYPE_CHECKING:
    from ..model.providers import Credentials
    from ..records.totals import SessionTotals
    from ..session.api import Session, TurnResult
    from ..session.runs import RunAnswer
    from ..views.display import Display, DisplayMode


#: The session the command was driving when it was interrupted, for the line naming how to
#: resume it.
_driving: list[str] = []


def cmd_run(args: argparse.Namespace) -> int:
    from ..core.prompts import DEFAULT_TASK
    from ..session.stored import interrupted_run
    from ..views.display import choose_mode

    settings = settings_of(args)
    fixture = _make_fixture() if settings.test_mode else None
    try:
        workdir = fixture or workdir_of(settings)
        task = args.task or DEFAULT_TASK
        earlier = None
        if fixture is None and not settings.session and workdir.is_dir():
            earlier = asyncio.run(interrupted_run(task, settings, workdir=workdir))
        mode = choose_mode(json_lines=args.json_lines, plain=args.plain, stream=sys.stderr)
        if earlier is not None and args.resume:
            asyncio.run(_continued(settings, workdir, earlier.id, mode))
            return 0
        if earlier is not None:
            say(
                f"orchmode: session {earlier.id} was interrupted on this same task — "
                f"`orchmode resume {earlier.id}` (or `orchmode run --resume`) continues "
                "it where it stopped; starting a new session",
                sys.stderr,
            )
        asyncio.run(_run(settings, task, workdir, display_mode=mode))
    finally:
        if fixture is not None:
            shutil.rmtree(fixture, ignore_errors=True)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from ..views.display import choose_mode

    mode = choose_mode(json_lines=args.json_lines, plain=args.plain, stream=sys.stderr)
    settings = settings_of(args)
    asyncio.run(_resume(settings, workdir_of(settings), args.session_id, display_mode=mode))
    return 0


async def _run(
    settings: Settings,
    task: str,
    workdir: Path,
    credentials: Credentials | None = None,
    *,
    kept: bool = True,
    display_mode: DisplayMode = "plain",
    opening: Sequence[str] = (),
) -> None:
    """The ``run`` command's session; ``kept=False`` for one whose records are thrown away.

    Progress and orchmode's own notices (``opening`` first) go to stderr in
    ``display_mode``; the answers go to stdout.
    """
    async with _shown_session(
        settings, workdir, credentials, display_mode, opening=opening, kept=kept
    ) as (session, display, totals):
        if session.resumed:
            display.notice(f"[session] resuming {session.id}")
        result = await session.run(task, _printer(display))
        _raise_failure(result.task, result.summary)
        display.notice(f"[session] {totals.describe()}")
        if kept:
            display.notice(
                f"[session] recorded as {session.id}; continue it with --session {session.id}"
            )


async def _resume(
    settings: Settings,
    workdir: Path,
    wanted: str | None,
    *,
    display_mode: DisplayMode = "plain",
    credentials: Credentials | None = None,
) -> None:
    """``orchmode resume``: the interrupted session, continued from its last step."""
    from ..session.stored import resumable

    found = await resumable(settings, workdir=workdir, session=wanted)
    await _continued(settings, workdir, found.id, display_mode, credentials)


async def _continued(
    settings: Settings,
    workdir: Path,
    session: str,
    display_mode: DisplayMode,
    credentials: Credentials | None = None,
) -> None:
    """The interrupted ``session`` finished, its answers printed as a whole run prints them."""
    async with _shown_session(settings, workdir, credentials, display_mode, name=session) as (
        opened,
        display,
        totals,
    ):
        display.notice(f"[session] resuming {opened.id} from its last recorded step")
        result = await opened.resume(_printer(display))
        _raise_failure(result.task, result.summary)
        display.notice(f"[session] {totals.describe()}")
    _driving.clear()


@contextlib.asynccontextmanager
async def _shown_session(
    settings: Settings,
    workdir: Path,
    credentials: Credentials | None,
    display_mode: DisplayMode,
    *,
    opening: Sequence[str] = (),
    kept: bool = True,
    name: str | None = None,
) -> AsyncIterator[tuple[Session, Display, SessionTotals]]:
    """A session opened with its display (and what this process adds to its totals, as
    ``run`` counts them) subscribed; typed ``/approve`` lines answered on a terminal."""
    from ..records.totals import SessionTotals
    from ..session.api import open_session
    from ..views.display import make_display

    totals = SessionTotals()
    display = make_display(display_mode, totals)
    for line in opening:
        display.notice(line)
    try:
        # totals first, so the live view's footer sees each request counted
        async with open_session(
            settings,
            workdir=workdir,
            credentials=credentials,
            session=name,
            subscribers=[totals, display],
            on_warning=_warn_on(display),
        ) as session:
            if kept:
                _driving[:] = [session.id]
            async with _typed_answers(session, display, display_mode):
                yield session, display, totals
    finally:
        display.stop()


def _printer(display: Display) -> Callable[[RunAnswer], None]:
    """Each answer on stdout as it comes; the summary after a rule, or a notice why none."""

    def printed(answer: RunAnswer) -> None:
        if answer.summary:
            _print_answer(f"\n---\n\n{answer.turn.text}")
            return
        _print_answer(answer.turn.text)
        if answer.turn.stop == "refusal":
            display.notice(
                "[session] no summary turn: the model refused the task (the reason is in the "
                "answer above)"
            )

    return printed


def _raise_failure(*turns: TurnResult | None) -> None:
    """A turn that failed ends the command with its error."""
    for turn in turns:
        if turn is not None and turn.error is not None:
            raise turn.error


@contextlib.asynccontextmanager
async def _typed_answers(
    session: Session, display: Display, display_mode: DisplayMode
) -> AsyncIterator[None]:
    """On a terminal with the live view, ``/approve N`` and ``/deny N`` typed while the run
    goes on answer its agents' questions (the view shows them, and says so)."""
    from .answers import answering_typed_lines, terminal_input
    from .chat import TypedLines

    if display_mode != "live" or not terminal_input():
        yield
        return
    typed = TypedLines(sys.stdin.fileno())
    async with answering_typed_lines(session, lambda: typed.read(""), display.notice):
        yield


def _warn_on(display: Display) -> Callable[[str], None]:
    """The start-up's warnings, as the display's notices."""
    return lambda warning: display.notice(f"orchmode: warning: {warning}")


def _print_answer(text: str) -> None:
    """One answer on stdout: Markdown drawn on a terminal, exactly as written into a pipe."""
    from ..views.markdown import print_answer

    print_answer(text)


def _display_mode(args: argparse.Namespace) -> DisplayMode:
    from ..views.display import choose_mode

    return choose_mode(json_lines=args.json_lines, plain=args.plain, stream=sys.stderr)


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import run_chat

    settings = settings_of(args)
    mode = _display_mode(args)
    asyncio.run(run_chat(settings, workdir_of(settings), None, display_mode=mode))
    return 0


_FIXTURE = {
    "README.md": "# tally\n\nCounts words in text files.\n",
    "tally.py": (
        "import sys\n\n\ndef count_words(path):\n    return len(open(path).read().split(' '))\n\n\n"
        "if __name__ == '__main__':\n    print(count_words(sys.argv[1]))\n"
    ),
}


def _make_fixture() -> Path:
    """The throw-away directory the test mode works in."""
    root = Path(tempfile.mkdtemp(prefix="orchmode-test-"))
    for name, text in _FIXTURE.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def cmd_demo(args: argparse.Namespace) -> int:
    """``orchmode run`` against the scripted server: the one use of it outside tests."""
    from ..model.providers import Credentials
    from ..testing.scenario import OrchestrationScenario
    from ..testing.server import ScriptedServer
    from ..views.report import render_report
    from .stored import latest_history
    from .stored import print_budget as _print_budget

    settings = settings_of(args)
    banner = (
        "[demo] the model here is orchmode's scripted test server, not Claude: its answers "
        "are canned, no API key is used and nothing is billed"
    )
    scenario = OrchestrationScenario(
        subtasks=[f"Demo subtask {i}: look over the files" for i in range(1, args.subtasks + 1)],
        scout_command="ls -l",
        worker_command="wc -l *.py",
        verifier_command="grep -c def *.py",
        delay=0.3,
    )
    key = "demo-key"
    server = ScriptedServer(scenario, api_key=key)
    fixture = _make_fixture()
    try:
        with server.in_thread():
            demo = settings.model_copy(
                update={"base_url": server.url, "workdir": fixture, "provider": "anthropic"}
            )
            task = "Review this little project"
            mode = _display_mode(args)
            run = _run(
                demo, task, fixture, Credentials(key), kept=False, display_mode=mode,
                opening=[banner],
            )  # fmt: skip
            asyncio.run(run)
            # The same task again, in a new session on the same store: the journal answers.
            print("\n[demo] the same task again: every subagent's result is in the journal")
            again = _run(demo, task, fixture, Credentials(key), kept=False, display_mode=mode)
            asyncio.run(again)
        print("\n[demo] the budget ledger of that last session (orchmode budget):")
        _print_budget(demo, fixture)
        history = latest_history(demo, fixture)

        report = Path(tempfile.gettempdir()) / f"orchmode-demo-{history.id}.html"
        report.write_text(render_report(history), encoding="utf-8")
        print(f"\n[demo] its report (orchmode report), to open in a browser: {report}")
    finally:
        shutil.rmtree(fixture, ignore_errors=True)
    return 0
