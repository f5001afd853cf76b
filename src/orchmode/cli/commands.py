"""The command line's entry: every failure one line (tracebacks only with ``--debug``).

Each command lives with its kind (:mod:`.running` drives sessions, :mod:`.stored` reads
the store, :mod:`.trust`); heavy modules (the SDK, the agent loops) are imported inside
the commands, so ``--help`` stays quick.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable, Sequence

from ..core.errors import OrchmodeError
from ..views.escape import visible
from . import running, serve, stored, trust
from .common import say
from .parser import build_parser

log = logging.getLogger("orchmode")

#: Each command's handler, by its name.
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": running.cmd_run,
    "resume": running.cmd_resume,
    "chat": running.cmd_chat,
    "demo": running.cmd_demo,
    "budget": stored.cmd_budget,
    "runs": stored.cmd_runs,
    "show": stored.cmd_show,
    "report": stored.cmd_report,
    "approvals": stored.cmd_approvals,
    "approve": stored.cmd_approve,
    "deny": stored.cmd_deny,
    "trust": trust.cmd_trust,
    "serve": serve.cmd_serve,
}


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
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = HANDLERS[args.command](args)
        return code
    except OrchmodeError as exc:
        if args.debug:
            raise
        say(f"orchmode: {exc}", sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        if running._driving:
            say(
                f"orchmode: interrupted — session {running._driving[0]} is recorded up to its last "
                f"step; continue it with `orchmode resume {running._driving[0]}`",
                sys.stderr,
            )
        else:
            print(
                "orchmode: interrupted — finished results are kept in the journal",
                file=sys.stderr,
            )
        return 130
