"""The command line: ``orchmode run`` and friends; every failure is one line, never a traceback.

Heavy modules (the SDK, the agent loops) are imported inside the commands, so ``--help``
stays quick.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import typing
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from .. import __version__
from ..core.errors import ConfigError, OrchmodeError
from ..core.settings import Settings, env_var, flag, flag_names, load_settings
from ..views.escape import visible
from .failures import unless_the_store_fails

if typing.TYPE_CHECKING:
    from ..model.providers import Credentials
    from ..records.history import SessionHistory
    from ..records.totals import SessionTotals
    from ..session.api import Session, TurnResult
    from ..views.display import Display, DisplayMode

log = logging.getLogger("orchmode")
T = TypeVar("T")


def _say(text: str, stream: typing.TextIO | None = None) -> None:
    """One line for the user (stdout unless told): whatever it quotes — a session's name, a
    model's words in an error — its control characters are shown, never obeyed."""
    print(visible(text), file=stream or sys.stdout)


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line in orchmode's voice."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, visible(f"orchmode: {message} — see `{self.prog} --help`") + "\n")


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "settings (flags > ORCHMODE_* variables > ./orchmode.toml, as far as trusted > "
        "~/.config/orchmode/config.toml)"
    )
    for name in flag_names():
        field = Settings.model_fields[name]
        help_text = f"{field.description} [{env_var(name)}; default: {field.default}]"
        if field.annotation is bool:
            group.add_argument(
                flag(name), dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
            continue
        choices = typing.get_args(field.annotation)
        if choices and all(isinstance(c, str) for c in choices):
            group.add_argument(flag(name), dest=name, choices=choices, help=help_text)
        else:
            group.add_argument(flag(name), dest=name, metavar=name.upper(), help=help_text)
    group.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="settings file, taken in full since you named it (default: ./orchmode.toml, "
        "whose settings that need trust count only once `orchmode trust` recorded it)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="orchmode",
        description="Run Claude as an orchestrator of parallel, verified subagents.",
    )
    parser.add_argument("--version", action="version", version=f"orchmode {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    run = commands.add_parser(
        "run",
        help="one orchestrated turn on a task, then a brief summary turn",
        description=(
            "Run TASK with orchestration mode on (scout, fan out, verify, synthesise), then "
            "switch the mode off and ask for a brief summary. Both answers go to stdout, "
            "progress to stderr. Needs ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN)."
        ),
    )
    run.add_argument("task", nargs="?", help="what to do (default: review this directory)")
    run.add_argument(
        "--resume",
        action="store_true",
        help="if a run on the same task in this directory was interrupted, continue it "
        "(as `orchmode resume` does) instead of starting over",
    )
    run.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _add_display_flags(run)
    _add_setting_flags(run)
    resume = commands.add_parser(
        "resume",
        help="continue an interrupted session from the step where it stopped",
        description=(
            "Continue SESSION (default: the latest interrupted session that ran in this "
            "directory) from its last recorded step, without asking the model for a new "
            "plan: a Workflow call that was cut off runs again from its recorded input "
            "(finished agents come from the journal), a bash command that was cut off is "
            "reported as such, not run again. A session started by `orchmode run` then "
            "finishes the run: its stdout is what the uninterrupted run would have printed."
        ),
    )
    resume.add_argument("session_id", nargs="?", metavar="SESSION", help="the session to resume")
    resume.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _add_display_flags(resume)
    _add_setting_flags(resume)
    budget = commands.add_parser(
        "budget",
        help="what a session has launched and spent, and what is left",
        description=(
            "Print a session's budget ledger from the store: subagents launched against "
            "--max-subagents, and tokens used. Defaults to the most recent session."
        ),
    )
    budget.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _add_setting_flags(budget)
    _add_history_commands(commands)
    chat = commands.add_parser(
        "chat",
        help="talk with the agent: slash commands, Ctrl-C cancels a turn",
        description=(
            "An interactive session: type a message per turn; /mode on|off, /status, "
            "/budget, /cost, /approve N, /deny N, /exit. Ctrl-C cancels the running turn "
            "(finished subagents stay in the journal), a second Ctrl-C leaves. --session NAME "
            "resumes a recorded session, its mode included. Reads plain lines when stdin is "
            "not a terminal."
        ),
    )
    chat.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _add_display_flags(chat)
    _add_setting_flags(chat)
    demo = commands.add_parser(
        "demo",
        help="watch an orchestrated run against a scripted model (no API key, no cost)",
        description=(
            "A demonstration: orchmode's scripted test server stands in for Claude, in a "
            "throwaway directory, so the scouting, fan-out, verification and synthesis can be "
            "watched without an API key. Nothing it prints comes from a real model."
        ),
    )
    demo.add_argument(
        "--subtasks", type=_positive, default=6, help="how many subtasks to fan out (default 6)"
    )
    demo.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _add_display_flags(demo)
    _add_setting_flags(demo)
    _add_trust_command(commands)
    _add_approval_commands(commands)
    return parser


def _add_approval_commands(commands: Any) -> None:
    """``approvals``, ``approve`` and ``deny``: answer agents' questions from any terminal."""
    listing = commands.add_parser(
        "approvals",
        help="the approvals waiting for an answer: id, session, agent, what and why",
        description=(
            "List the approvals waiting for your answer in the store (every session's, or "
            "--session's), oldest first: an agent that reached an `ask` rule waits parked "
            "until `orchmode approve ID` or `orchmode deny ID` answers it."
        ),
    )
    listing.add_argument(
        "--json", dest="json_lines", action="store_true", help="one JSON object per approval"
    )
    listing.add_argument("--all", action="store_true", help="answered ones too, with their answers")
    approve = commands.add_parser(
        "approve",
        help="say yes to a waiting approval; --always: and to the same again here",
        description=(
            "Approve approval ID (see `orchmode approvals`): the agent waiting for it goes "
            "on. --always also records its rule in your own configuration for the directory "
            "it was asked in, so the next run there does not ask."
        ),
    )
    approve.add_argument("id", type=_approval_id, metavar="ID", help="the approval's number")
    approve.add_argument(
        "--always", action="store_true", help="remember the rule for that directory"
    )
    deny = commands.add_parser(
        "deny",
        help="say no to a waiting approval",
        description="Deny approval ID (see `orchmode approvals`): the agent is told no, "
        "with --reason if given, and goes on without it.",
    )
    deny.add_argument("id", type=_approval_id, metavar="ID", help="the approval's number")
    deny.add_argument("--reason", default="", metavar="TEXT", help="told to the agent")
    for command in (listing, approve, deny):
        command.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
        _add_setting_flags(command)


def _approval_id(text: str) -> int:
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"an approval's ID is its number, as `orchmode approvals` lists it, not {text!r}"
        ) from None


def _add_trust_command(commands: Any) -> None:
    trust = commands.add_parser(
        "trust",
        help="take a directory's own settings in full (orchmode.toml, .claude/ settings)",
        description=(
            "Record DIR (default: this directory) as trusted, with the SHA-256 of each of its "
            "settings files, in your own configuration (trusted.toml). Until then, the "
            "settings of its orchmode.toml that could weaken the sandbox, run a program, "
            "send the conversation or a key elsewhere, or spend more are ignored, one line "
            "naming them. A change to any of the files recorded, or a new one, asks again."
        ),
    )
    trust.add_argument("directory", nargs="?", type=Path, metavar="DIR", help="the directory")
    action = trust.add_mutually_exclusive_group()
    action.add_argument(
        "--list", action="store_true", help="the trusted directories, and whether each still is"
    )
    action.add_argument(
        "--revoke", action="store_true", help="no longer trust DIR (default: this directory)"
    )
    trust.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)


def _add_display_flags(parser: argparse.ArgumentParser) -> None:
    """How progress is shown: presentation only, so flags here and not settings."""
    group = parser.add_argument_group("progress on stderr (default: live view on a terminal)")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument(
        "--json", dest="json_lines", action="store_true",
        help="one JSON object per event per line on stderr (answers stay on stdout)",
    )  # fmt: skip
    choice.add_argument(
        "--plain", action="store_true", help="plain progress lines, even on a terminal"
    )


def _display_mode(args: argparse.Namespace) -> DisplayMode:
    from ..views.display import choose_mode

    return choose_mode(json_lines=args.json_lines, plain=args.plain, stream=sys.stderr)


def _add_history_commands(commands: Any) -> None:
    """``runs``, ``show`` and ``report``: read-only views of what the store recorded."""
    runs = commands.add_parser(
        "runs",
        help="the sessions recorded here, newest first, turn by turn",
        description=(
            "List the sessions in the store, newest first: each turn with when it started, "
            "its task, how many subagents it ran, what it cost and how it ended."
        ),
    )
    runs.add_argument(
        "-n", "--limit", type=_positive, default=20, metavar="N",
        help="show the N most recent sessions (default: 20)",
    )  # fmt: skip
    show = commands.add_parser(
        "show",
        help="a session's transcript: turns, commands, agents' findings and verdicts",
        description="Print a recorded session: user turns, mode notices, commands, fan-outs, "
        "every subagent's findings and verdict, and totals.",
    )
    report = commands.add_parser(
        "report",
        help="write a session as one self-contained HTML file",
        description="Write a recorded session as an HTML file that works offline: a timeline "
        "of every worker and verifier, findings by severity, per-agent details, totals.",
    )
    report.add_argument(
        "-o", "--output", type=Path, metavar="FILE",
        help="where to write it, - for stdout (default: orchmode-RUN.html here)",
    )  # fmt: skip
    for command in (show, report):
        command.add_argument(
            "run", nargs="?", metavar="RUN", help="session id (default: the most recent)"
        )
    for command in (runs, show, report):
        command.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
        _add_setting_flags(command)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _settings(args: argparse.Namespace) -> Settings:
    """The settings of this command; a project's settings that need trust and were ignored
    are said in one line on stderr."""
    flags = {name: getattr(args, name, None) for name in flag_names()}
    return load_settings(
        flags, env=os.environ, cwd=Path.cwd(), config_file=args.config, warn=_settings_warning
    )


def _settings_warning(line: str) -> None:
    _say(f"orchmode: {line}", sys.stderr)


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
    from ..model.providers import Credentials
    from ..records.totals import SessionTotals
    from ..session.api import open_session
    from ..views.display import make_display

    totals = SessionTotals()
    display = make_display(display_mode, totals)
    for line in opening:
        display.notice(line)
    credentials = credentials or Credentials.from_env(os.environ, settings.provider)
    _check_price(settings)
    # totals first, so the live view's footer sees each request counted
    async with open_session(
        settings,
        workdir=workdir,
        credentials=credentials,
        subscribers=[totals, display],
        on_warning=_warn_on(display),
    ) as session:
        if kept:
            _driving[:] = [session.id]
        try:
            async with _typed_answers(session, display, display_mode):
                await _run_turns(session, display, task, totals, kept=kept)
        finally:
            display.stop()


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


async def _run_turns(
    session: Session, display: Display, task: str, totals: SessionTotals, *, kept: bool
) -> None:
    """``run``'s two turns: the task with the mode on, then its summary with the mode off."""
    conversation = session.conversation
    if session.resumed:
        display.notice(f"[session] resuming {session.id}")
    conversation.meta = {"command": "run", "task": task, "phase": 1}
    session.set_mode(True)
    first = await unless_the_store_fails(session, session.turn(task))
    if first.error is not None:
        raise first.error
    _print_answer(first.text)
    await _summary_turn(session, display, first)
    conversation.meta["phase"] = "done"
    await conversation.save()
    display.notice(f"[session] {totals.describe()}")
    if kept:
        display.notice(
            f"[session] recorded as {session.id}; continue it with --session {session.id}"
        )


async def _summary_turn(session: Session, display: Display, first: TurnResult) -> None:
    """`run`'s second turn, the mode off: a brief summary of the first answer — none when the
    model refused the task, for the refused answer was dropped and a summary of it has
    nothing to stand on."""
    from ..core.prompts import SUMMARY_TASK

    if first.stop == "refusal":
        display.notice(
            "[session] no summary turn: the model refused the task (the reason is in the "
            "answer above)"
        )
        return
    session.conversation.meta["phase"] = 2
    session.set_mode(False)
    second = await unless_the_store_fails(session, session.turn(SUMMARY_TASK))
    if second.error is not None:
        raise second.error
    _print_answer(f"\n---\n\n{second.text}")


def _check_price(settings: Settings) -> None:
    """A cost cap needs the model's price: said in the command line's terms, before a start."""
    if settings.max_cost is not None and (model := settings.unpriced()) is not None:
        raise ConfigError(
            f"--max-cost needs a price for {model} — add it under "
            f'[prices."{model}"] in ~/.config/orchmode/config.toml'
        )


def _warn_on(display: Display) -> Callable[[str], None]:
    """The start-up's warnings, as the display's notices."""
    return lambda warning: display.notice(f"orchmode: warning: {warning}")


#: The session the command was driving when it was interrupted, for the line naming how to
#: resume it.
_driving: list[str] = []


def _print_answer(text: str) -> None:
    """One answer on stdout: Markdown drawn on a terminal, exactly as written into a pipe."""
    from ..views.markdown import print_answer

    print_answer(text)


def _print_run_answers(first: str, second: str) -> None:
    _print_answer(first)
    _print_answer(f"\n---\n\n{second}")


async def _resume(
    settings: Settings,
    workdir: Path,
    wanted: str | None,
    *,
    display_mode: DisplayMode = "plain",
    credentials: Credentials | None = None,
) -> None:
    """``orchmode resume``: the interrupted session, continued from its last step."""
    from ..model.providers import Credentials
    from ..records.totals import SessionTotals
    from ..session.api import open_session
    from ..session.resume import CannotResume, choose, interrupted
    from ..store import open_store
    from ..views.display import make_display

    store = await open_store(settings.store_url(workdir))
    try:
        found = await choose(store, workdir, wanted)
    finally:
        await store.close()
    credentials = credentials or Credentials.from_env(os.environ, settings.provider)
    _check_price(settings)
    totals = SessionTotals()  # what this process adds, as `run` counts it
    display = make_display(display_mode, totals)
    async with open_session(
        settings,
        workdir=workdir,
        credentials=credentials,
        session=found.id,
        subscribers=[totals, display],
        on_warning=_warn_on(display),
    ) as session:
        _driving[:] = [session.id]
        conversation = session.conversation
        try:
            if await interrupted(conversation.store, found.id) is None:  # looked at again, held
                raise CannotResume(
                    f"session {found.id!r} was finished by another orchmode process meanwhile "
                    f"— `orchmode show {found.id}` prints it"
                )
            display.notice(f"[session] resuming {session.id} from its last recorded step")
            meta = conversation.meta
            result = await unless_the_store_fails(session, session.resume_turn())
            if result.error is not None:
                raise result.error
            if meta.get("command") == "run" and meta.get("phase") == 2:
                _print_run_answers(conversation.answer_of_turn(1) or "", result.text)
            elif meta.get("command") == "run":
                _print_answer(result.text)
                await _summary_turn(session, display, result)
            else:
                _print_answer(result.text)
            if meta.get("command") == "run":
                meta["phase"] = "done"
                await conversation.save()
            display.notice(f"[session] {totals.describe()}")
        finally:
            display.stop()
    _driving.clear()


def cmd_resume(args: argparse.Namespace) -> int:
    settings = _settings(args)
    workdir = _workdir(settings)
    if not workdir.is_dir():
        raise ConfigError(f"the working directory {workdir} does not exist")
    asyncio.run(_resume(settings, workdir, args.session_id, display_mode=_display_mode(args)))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..core.prompts import DEFAULT_TASK

    settings = _settings(args)
    fixture = _make_fixture() if settings.test_mode else None
    try:
        workdir = (fixture or settings.workdir or Path.cwd()).resolve()
        if not workdir.is_dir():
            raise ConfigError(f"the working directory {workdir} does not exist")
        task = args.task or DEFAULT_TASK
        if fixture is None and not settings.session:
            earlier = asyncio.run(_interrupted_run(settings, workdir, task))
            if earlier is not None and args.resume:
                asyncio.run(_resume(settings, workdir, earlier, display_mode=_display_mode(args)))
                return 0
            if earlier is not None:
                _say(
                    f"orchmode: session {earlier} was interrupted on this same task — "
                    f"`orchmode resume {earlier}` (or `orchmode run --resume`) continues it "
                    "where it stopped; starting a new session",
                    sys.stderr,
                )
        asyncio.run(_run(settings, task, workdir, display_mode=_display_mode(args)))
    finally:
        if fixture is not None:
            shutil.rmtree(fixture, ignore_errors=True)
    return 0


async def _interrupted_run(settings: Settings, workdir: Path, task: str) -> str | None:
    """An interrupted run on ``task`` in this directory's store, if there is one."""
    from ..session.resume import latest_interrupted
    from ..store import open_store

    url = settings.store_url(workdir)
    if url.startswith("sqlite://") and not Path(url.removeprefix("sqlite://")).exists():
        return None  # nothing recorded here yet, and no store made just to look
    try:
        store = await open_store(url)
    except OrchmodeError as exc:  # only a notice: the run itself says what is wrong
        log.debug("could not look for interrupted runs: %s", exc)
        return None
    try:
        found = await latest_interrupted(store, workdir, task)
    finally:
        await store.close()
    return found.id if found is not None else None


async def _budget(settings: Settings, workdir: Path) -> None:
    from ..records.totals import session_totals
    from ..store import open_store

    store = await open_store(settings.store_url(workdir))
    try:
        session = settings.session or await store.latest_session()
        if session is None:
            raise OrchmodeError(
                f"no sessions are recorded in {store.location} — run `orchmode run` first"
            )
        if await store.load_session(session) is None:
            raise OrchmodeError(f"no session named {session!r} is recorded in {store.location}")
        state = await store.budget(session)
        totals = session_totals(await store.events(session))
    finally:
        await store.close()
    cap = settings.max_subagents
    _say(f"session    {session}")
    _say(f"subagents  {state.subagents} launched of {cap} ({max(0, cap - state.subagents)} left)")
    token_cap = settings.max_session_tokens
    tokens = f"{state.tokens:,} used" + (f" of {token_cap:,}" if token_cap else "")
    _say(f"tokens     {tokens}")
    cost_cap = settings.max_cost
    cost = f"${state.cost:.2f} spent" + (f" of ${cost_cap:.2f}" if cost_cap else "")
    _say(f"cost       {cost}")
    _say(f"requests   {totals.all.requests:,} to the model")
    if models := totals.describe_models():
        _say(f"models     {models}")
    _say(f"cache      {totals.describe_cache()}")


def cmd_budget(args: argparse.Namespace) -> int:
    settings = _settings(args)
    asyncio.run(_budget(settings, (settings.workdir or Path.cwd()).resolve()))
    return 0


async def _histories(
    settings: Settings, workdir: Path, run: str | None, *, limit: int | None = None
) -> tuple[str, int, list[SessionHistory]]:
    """Where the store is, how many sessions it holds, and the histories asked for.

    With ``limit`` that many of the newest sessions; without it the one named RUN (or by
    --session), else the newest, which must exist. A SQLite store that does not exist is
    not created just to be looked at.
    """
    from ..records.history import read_session
    from ..store import open_store

    url = settings.store_url(workdir)
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else None
    wanted = run or settings.session
    histories: list[SessionHistory] = []
    if path and not Path(path).exists():
        location, total = path, 0
    else:
        store = await open_store(url)
        try:
            sessions = await store.sessions()
            if limit is not None:
                chosen = sessions[:limit]
            elif wanted is not None:
                chosen = [info for info in sessions if info.id == wanted]
            else:
                chosen = sessions[:1]
            for info in chosen:
                # the saved conversation holds the answers; a listing does not show them
                record = None if limit is not None else await store.load_session(info.id)
                histories.append(
                    read_session(
                        await store.events(info.id),
                        session=info.id,
                        workdir=info.workdir,
                        state=record.state if record else None,
                    )
                )
        finally:
            await store.close()
        location, total = store.location, len(sessions)
    if limit is None and not histories:
        if wanted is not None:
            raise OrchmodeError(
                f"no session named {wanted!r} is recorded in {location} — "
                "`orchmode runs` lists them"
            )
        raise OrchmodeError(f"no sessions are recorded in {location} — run `orchmode run` first")
    return location, total, histories


def _workdir(settings: Settings) -> Path:
    return (settings.workdir or Path.cwd()).resolve()


def cmd_demo(args: argparse.Namespace) -> int:
    """``orchmode run`` against the scripted server: the one use of it outside tests."""
    from ..model.providers import Credentials
    from ..testing.scenario import OrchestrationScenario
    from ..testing.server import ScriptedServer

    settings = _settings(args)
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
        asyncio.run(_budget(demo, fixture))
        _, _, (history,) = asyncio.run(_histories(demo, fixture, None))
        from ..views.report import render_report

        report = Path(tempfile.gettempdir()) / f"orchmode-demo-{history.id}.html"
        report.write_text(render_report(history), encoding="utf-8")
        print(f"\n[demo] its report (orchmode report), to open in a browser: {report}")
    finally:
        shutil.rmtree(fixture, ignore_errors=True)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from ..model.providers import Credentials
    from .chat import run_chat

    settings = _settings(args)
    workdir = _workdir(settings)
    if not workdir.is_dir():
        raise ConfigError(f"the working directory {workdir} does not exist")
    credentials = Credentials.from_env(os.environ, settings.provider)
    _check_price(settings)
    asyncio.run(run_chat(settings, workdir, credentials, display_mode=_display_mode(args)))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from ..views.run_table import RUN_COLUMNS, print_table, run_rows

    settings = _settings(args)
    location, count, histories = asyncio.run(
        _histories(settings, _workdir(settings), None, limit=args.limit)
    )
    if not histories:
        _say(f"no runs are recorded in {location} yet — start one with `orchmode run`")
        return 0
    print_table(RUN_COLUMNS, run_rows(histories), sys.stdout)
    cut_off = [h.id for h in histories if h.turns and h.turns[-1].status == "interrupted"]
    if cut_off:
        _say(
            f"(interrupted: {', '.join(cut_off)} — `orchmode resume SESSION` continues one "
            "from its last recorded step)"
        )
    if count > len(histories):
        _say(f"({len(histories)} most recent of {count} sessions; -n {count} shows them all)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..views.transcript import print_lines, transcript

    settings = _settings(args)
    _, _, (history,) = asyncio.run(_histories(settings, _workdir(settings), args.run))
    print_lines(transcript(history), sys.stdout)
    if history.turns and history.turns[-1].status == "interrupted":
        pending = asyncio.run(_pending(settings, _workdir(settings), history.id))
        if pending:
            _say(f"in progress when it stopped: {', '.join(pending)}")
    return 0


async def _pending(settings: Settings, workdir: Path, session: str) -> list[str]:
    """What the session's last checkpointed step left running (its tool calls)."""
    from ..session.resume import pending_calls
    from ..store import open_store

    store = await open_store(settings.store_url(workdir))
    try:
        return pending_calls(await store.load_messages(session))
    finally:
        await store.close()


def cmd_report(args: argparse.Namespace) -> int:
    import re

    from ..views.report import render_report

    settings = _settings(args)
    _, _, (history,) = asyncio.run(_histories(settings, _workdir(settings), args.run))
    page = render_report(history)
    if str(args.output) == "-":
        sys.stdout.write(page)
        return 0
    safe_id = re.sub(r"[^A-Za-z0-9._-]", "_", history.id)
    output: Path = args.output or Path(f"orchmode-{safe_id}.html")
    partial = output.with_name(f".{output.name}.partial")
    try:
        partial.write_text(page, encoding="utf-8")
        partial.replace(output)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise OrchmodeError(
            f"cannot write the report to {output}: {exc.strerror or exc} — pass -o with a "
            "writable path"
        ) from None
    _say(str(output))
    return 0


def cmd_trust(args: argparse.Namespace) -> int:
    """``orchmode trust``: record, list or revoke the directories whose settings are taken."""
    from ..core import trust
    from ..core.settings import named_files, needs_trust, project_settings, user_config_dir

    config_dir = user_config_dir(os.environ)
    record_file = trust.trust_file(config_dir)
    if args.list:
        if args.directory is not None:
            raise ConfigError("--list takes no directory — `orchmode trust --list`")
        records = trust.read_records(config_dir)
        if not records:
            _say(f"no directory is trusted (none recorded in {record_file})")
            return 0
        for path, record in sorted(records.items()):
            _say(f"{path}  (trusted {record.trusted_at}): {_trust_state(path, config_dir)}")
        return 0
    directory = trust.real_directory(args.directory or Path.cwd())
    if args.revoke:
        if trust.revoke(config_dir, directory):
            _say(f"no longer trusted: {directory} (removed from {record_file})")
        else:
            _say(f"{directory} was not trusted; nothing to revoke")
        return 0
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory — name the one whose settings to trust")
    values = project_settings(directory)
    named = named_files(values)
    record = trust.trust(config_dir, directory, named.values())
    _say(f"trusted {directory}, recorded in {record_file}:")
    if not record.files:
        _say("  no settings files yet; one added later makes it untrusted again")
    protected = [name for name in values if needs_trust(name)]
    naming = {trust.file_key(directory, path): setting for setting, path in named.items()}
    width = max((len(name) for name in record.files), default=0)
    for name, digest in record.files.items():
        note = ""
        if name == "orchmode.toml" and protected:
            note = f"  sets {', '.join(protected)}"
        elif name in naming:
            note = f"  named by orchmode.toml's {naming[name]}"
        _say(f"  {name:<{width}}  {digest[:19]}…{note}")
    _say(
        "A change to any of these files, or a new settings file, makes the directory "
        "untrusted again until you run `orchmode trust` once more."
    )
    return 0


def _trust_state(path: str, config_dir: Path) -> str:
    """``trusted``, or why a recorded directory is no longer."""
    from ..core.settings import project_settings, project_verdict
    from ..core.wording import listed

    directory = Path(path)
    if not directory.is_dir():
        return "gone (the directory no longer exists)"
    try:
        found = project_verdict(directory, project_settings(directory), config_dir)
    except ConfigError as exc:
        return f"cannot be checked: {exc}"
    if found.trusted:
        return "trusted"
    return f"changed since ({listed(list(found.changed))}): not trusted until trusted again"


APPROVAL_COLUMNS = ("ID", "SESSION", "AGENT", "KIND", "WHAT", "WHY", "AGE")


def cmd_approvals(args: argparse.Namespace) -> int:
    """``orchmode approvals``: the waiting approvals, as a table or JSON lines."""
    import json
    import time

    from ..session.api import approvals

    settings = _settings(args)
    found = asyncio.run(
        approvals(settings, workdir=_workdir(settings), session=settings.session,
                  pending=not args.all)
    )  # fmt: skip
    now = time.time()
    if args.json_lines:
        for approval in found:
            request = approval.request
            record = {
                "id": approval.id, "session": request.session, "agent": request.agent,
                "kind": request.kind, "what": request.what, "why": request.why,
                "rule": request.rule, "workdir": request.workdir, "status": approval.status,
                "created_at": approval.created_at, "age": round(now - approval.created_at, 1),
                "answered_at": approval.answered_at, "always": approval.always,
                "reason": approval.reason,
            }  # fmt: skip
            print(json.dumps(record, ensure_ascii=False))
        return 0
    if not found:
        _say("no approval is waiting for an answer" if not args.all else "no approval asked")
        return 0
    columns = (*APPROVAL_COLUMNS, "STATUS") if args.all else APPROVAL_COLUMNS
    rows = [
        (
            str(a.id), a.request.session, a.request.agent, a.request.kind, a.request.what,
            a.request.why, _age(now - a.created_at), *([a.status] if args.all else []),
        )
        for a in found
    ]  # fmt: skip
    _print_approvals(columns, rows, sys.stdout)
    if not args.all:
        _say("answer with `orchmode approve ID [--always]` or `orchmode deny ID [--reason TEXT]`")
    return 0


def _age(seconds: float) -> str:
    """How long ago, in the largest whole unit: ``42 s``, ``5 min``, ``3 h``, ``2 d``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def _print_approvals(
    columns: Sequence[str], rows: Sequence[Sequence[str]], stream: typing.TextIO
) -> None:
    """A Rich table on a terminal (WHAT and WHY give way when narrow); plain columns
    elsewhere; every cell's control characters shown, never obeyed."""
    from ..views.run_table import format_columns

    rows = [tuple(visible(cell) for cell in row) for row in rows]
    if not stream.isatty():
        print(format_columns(columns, rows, frozenset({"ID"})), file=stream)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in columns:
        table.add_column(
            name,
            justify="right" if name == "ID" else "left",
            no_wrap=name not in ("WHAT", "WHY"),
            overflow="fold",
        )
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text, never markup
    Console(file=stream, highlight=False).print(table)


def cmd_approve(args: argparse.Namespace) -> int:
    from ..session.api import approve
    from .answers import doing

    settings = _settings(args)
    answered = asyncio.run(approve(args.id, args.always, settings=settings,
                                   workdir=_workdir(settings)))  # fmt: skip
    request = answered.request
    _say(
        f"approved {answered.id}: {request.agent} (session {request.session}) may "
        f"{doing(request.kind)} {request.what}"
    )
    if answered.always:
        _say(f"remembered for {request.workdir}: {request.rule} is allowed there from now on")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    from ..session.api import deny
    from .answers import doing

    settings = _settings(args)
    answered = asyncio.run(deny(args.id, args.reason, settings=settings,
                                workdir=_workdir(settings)))  # fmt: skip
    request = answered.request
    _say(
        f"denied {answered.id}: {request.agent} (session {request.session}) may not "
        f"{doing(request.kind)} {request.what}"
    )
    return 0


def _configure_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_VisibleFormatter("orchmode: %(levelname)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG if debug else logging.WARNING)
    log.propagate = False
    # psycopg's pool says each failed reconnection itself; orchmode says an outage once.
    pool = logging.getLogger("psycopg")
    pool.addHandler(handler if debug else logging.NullHandler())
    pool.propagate = False
    if not debug:
        logging.getLogger("asyncio").addFilter(_reaped_elsewhere)
        # The same shells, seen from Python 3.11's pidfd child watcher as the loop closes
        # before their exit was read: killed, and reaped when orchmode exits.
        warnings.filterwarnings(
            "ignore", "A loop is being detached from a child watcher", RuntimeWarning
        )


class _VisibleFormatter(logging.Formatter):
    """Log lines with their control characters shown: a warning may quote an agent's words."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def _reaped_elsewhere(record: logging.LogRecord) -> bool:
    """Leave out asyncio's "exit status already read" of a shell abandoned as a run stops:
    its Popen, dropped unwaited, was reaped by the subprocess module's own clean-up, and
    the shell was dead either way."""
    return "exit status already read" not in record.getMessage()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.debug)
    handlers: dict[str, Any] = {
        "run": cmd_run,
        "budget": cmd_budget,
        "runs": cmd_runs,
        "show": cmd_show,
        "report": cmd_report,
        "demo": cmd_demo,
        "chat": cmd_chat,
        "resume": cmd_resume,
        "trust": cmd_trust,
        "approvals": cmd_approvals,
        "approve": cmd_approve,
        "deny": cmd_deny,
    }
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = handlers[args.command](args)
        return code
    except OrchmodeError as exc:
        if args.debug:
            raise
        _say(f"orchmode: {exc}", sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if _driving:
            _say(
                f"orchmode: interrupted — session {_driving[0]} is recorded up to its last "
                f"step; continue it with `orchmode resume {_driving[0]}`",
                sys.stderr,
            )
        else:
            print(
                "orchmode: interrupted — finished results are kept in the journal",
                file=sys.stderr,
            )
        return 130
