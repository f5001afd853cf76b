"""The command line's grammar: each command with the options it uses, and no others.

A command that starts a session takes every setting as a flag; one that only reads or
answers what the store holds takes the settings that find the store (and, for ``budget``,
the caps it is read against), so its ``--help`` is about what it does.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..core.settings import Settings, env_var, flag, flag_names, meaning
from ..views.escape import visible

#: The settings of a command that reads or answers what the store holds: where the store
#: is, and which session.
STORE_SETTINGS = ("workdir", "store", "journal", "session")
#: ``orchmode budget`` reads the ledger against the caps.
BUDGET_SETTINGS = (*STORE_SETTINGS, "max_subagents", "max_session_tokens", "max_cost")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line in orchmode's voice."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, visible(f"orchmode: {message} — see `{self.prog} --help`") + "\n")


def add_setting_flags(parser: argparse.ArgumentParser, only: Iterable[str] | None = None) -> None:
    """A flag for each setting (``only`` those named, if given), and ``--config``."""
    names = flag_names() if only is None else [n for n in flag_names() if n in set(only)]
    group = parser.add_argument_group(
        "settings (flags > ORCHMODE_* variables > ./orchmode.toml, as far as trusted > "
        "~/.config/orchmode/config.toml)"
    )
    for name in names:
        field = Settings.model_fields[name]
        help_text = f"{meaning(name)} [{env_var(name)}; default: {field.default}]"
        if field.annotation is bool:
            group.add_argument(
                flag(name), dest=name, action=argparse.BooleanOptionalAction, help=help_text
            )
            continue
        choices = typing.get_args(field.annotation)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "bare" in extra:
            group.add_argument(
                flag(name), dest=name, choices=choices, nargs="?", const=extra["bare"],
                help=help_text,
            )  # fmt: skip
        elif choices and all(isinstance(c, str) for c in choices):
            group.add_argument(flag(name), dest=name, choices=choices, help=help_text)
        else:
            group.add_argument(flag(name), dest=name, metavar=name.upper(), help=help_text)
    parser.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
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
    _add_session_commands(commands)
    _add_budget_command(commands)
    _add_history_commands(commands)
    _add_trust_command(commands)
    _add_approval_commands(commands)
    _add_serve_command(commands)
    return parser


def _add_session_commands(commands: Any) -> None:
    """``run``, ``resume``, ``chat`` and ``demo``: they start a session, so every setting."""
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
    _add_display_flags(run)
    add_setting_flags(run)
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
    _add_display_flags(resume)
    add_setting_flags(resume)
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
    _add_display_flags(chat)
    add_setting_flags(chat)
    _add_demo_command(commands)


def _add_demo_command(commands: Any) -> None:
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
    _add_display_flags(demo)
    add_setting_flags(demo)


def _add_budget_command(commands: Any) -> None:
    budget = commands.add_parser(
        "budget",
        help="what a session has launched and spent, and what is left",
        description=(
            "Print a session's budget ledger from the store: subagents launched against "
            "--max-subagents, and tokens used. Defaults to the most recent session."
        ),
    )
    add_setting_flags(budget, BUDGET_SETTINGS)


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
    add_setting_flags(runs, STORE_SETTINGS[:3])
    for command in (show, report):
        add_setting_flags(command, STORE_SETTINGS)


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
        add_setting_flags(command, STORE_SETTINGS)


def _add_serve_command(commands: Any) -> None:
    """``serve``: the web console of the store."""
    serve = commands.add_parser(
        "serve",
        help="the web console: every run of the store, live; approvals; start and stop",
        description=(
            "Serve the web console of the store on this machine and print its URL, with the "
            "access token every page needs, as the first line of output."
        ),
    )
    serve.add_argument("--port", type=int, default=8780, help="port (0: a free one; default: 8780)")
    serve.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)"
    )
    add_setting_flags(serve, ("workdir", "store", "journal"))


def _approval_id(text: str) -> int:
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"an approval's ID is its number, as `orchmode approvals` lists it, not {text!r}"
        ) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value
