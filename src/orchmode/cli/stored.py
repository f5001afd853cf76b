"""The commands that read or answer what the store holds: ``budget``, ``runs``, ``show``,
``report``, ``approvals``, ``approve`` and ``deny``.

None starts a session, and none makes a store just to look into it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import typing
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import OrchmodeError
from ..core.settings import Settings
from ..views.escape import visible
from .common import say, settings_of, workdir_of

if typing.TYPE_CHECKING:
    from ..records.history import SessionHistory
    from ..store import Approval


def cmd_budget(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    print_budget(settings, workdir_of(settings))
    return 0


def print_budget(settings: Settings, workdir: Path) -> None:
    """``orchmode budget``'s lines: the ledger of ``--session`` (or the latest session)."""
    from ..session.stored import budget

    for line in asyncio.run(budget(settings, workdir=workdir)).lines():
        say(line)


def latest_history(settings: Settings, workdir: Path) -> SessionHistory:
    """The newest session recorded, read back from its events."""
    _, _, (history,) = asyncio.run(_histories(settings, workdir, None))
    return history


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


def cmd_runs(args: argparse.Namespace) -> int:
    from ..views.run_table import RUN_COLUMNS, print_table, run_rows

    settings = settings_of(args)
    location, count, histories = asyncio.run(
        _histories(settings, workdir_of(settings), None, limit=args.limit)
    )
    if not histories:
        say(f"no runs are recorded in {location} yet — start one with `orchmode run`")
        return 0
    print_table(RUN_COLUMNS, run_rows(histories), sys.stdout)
    cut_off = [h.id for h in histories if h.turns and h.turns[-1].status == "interrupted"]
    if cut_off:
        say(
            f"(interrupted: {', '.join(cut_off)} — `orchmode resume SESSION` continues one "
            "from its last recorded step)"
        )
    if count > len(histories):
        say(f"({len(histories)} most recent of {count} sessions; -n {count} shows them all)")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..views.transcript import print_lines, transcript

    settings = settings_of(args)
    _, _, (history,) = asyncio.run(_histories(settings, workdir_of(settings), args.run))
    print_lines(transcript(history), sys.stdout)
    if history.turns and history.turns[-1].status == "interrupted":
        pending = asyncio.run(_pending(settings, workdir_of(settings), history.id))
        if pending:
            say(f"in progress when it stopped: {', '.join(pending)}")
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

    settings = settings_of(args)
    _, _, (history,) = asyncio.run(_histories(settings, workdir_of(settings), args.run))
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
    say(str(output))
    return 0


APPROVAL_COLUMNS = ("ID", "SESSION", "AGENT", "KIND", "WHAT", "WHY", "AGE")


def cmd_approvals(args: argparse.Namespace) -> int:
    """``orchmode approvals``: the waiting approvals, as a table or JSON lines."""
    import json
    import time

    from ..session.stored import approvals

    settings = settings_of(args)
    found = asyncio.run(
        approvals(settings, workdir=workdir_of(settings), session=settings.session,
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
        say("no approval is waiting for an answer" if not args.all else "no approval asked")
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
        say("answer with `orchmode approve ID [--always]` or `orchmode deny ID [--reason TEXT]`")
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
    from ..session.stored import approve

    settings = settings_of(args)
    answered = asyncio.run(approve(args.id, args.always, settings=settings,
                                   workdir=workdir_of(settings)))  # fmt: skip
    _say_answered(answered, "approved", "may")
    if answered.always:
        request = answered.request
        say(f"remembered for {request.workdir}: {request.rule} is allowed there from now on")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    from ..session.stored import deny

    settings = settings_of(args)
    answered = asyncio.run(deny(args.id, args.reason, settings=settings,
                                workdir=workdir_of(settings)))  # fmt: skip
    _say_answered(answered, "denied", "may not")
    return 0


def _say_answered(answered: Approval, verb: str, may: str) -> None:
    """``approved 3: worker-2 (session S) may run curl …``, as ``approve`` and ``deny`` say it."""
    from .answers import doing

    request = answered.request
    say(
        f"{verb} {answered.id}: {request.agent} (session {request.session}) {may} "
        f"{doing(request.kind)} {request.what}"
    )
