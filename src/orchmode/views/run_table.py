"""The ``orchmode runs`` table: one row per turn, as Rich columns on a terminal or plain text.

It reads only the finished history model, so it is apart from reading rows and from the
transcript of a single session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from ..records.history import SessionHistory
from .escape import visible
from .formatting import clip, money, when
from .transcript import _STATE_STYLES

RUN_COLUMNS = ("RUN", "WHEN", "TURN", "TASK", "AGENTS", "COST", "STATUS")
#: columns whose values are numbers, aligned right
RUN_NUMERIC = frozenset({"TURN", "AGENTS", "COST"})


def run_rows(histories: Sequence[SessionHistory], task_width: int = 60) -> list[tuple[str, ...]]:
    """One row per turn, sessions newest first, a session's turns in the order they ran."""
    rows: list[tuple[str, ...]] = []
    for history in histories:
        if not history.turns:
            rows.append(
                (history.id, when(history.first_at), "", "(no turns recorded)", "0",
                 money(history.totals.all.cost), "interrupted")
            )  # fmt: skip
            continue
        for turn in history.turns:
            rows.append(
                (
                    history.id if turn.number == 1 else "",
                    when(turn.started_at),
                    str(turn.number),
                    clip(turn.task, task_width),
                    str(len(turn.agents)),
                    money(turn.cost),
                    turn.status_text,
                )
            )
    return rows


def format_columns(
    header: Sequence[str], rows: Sequence[Sequence[str]], numeric: frozenset[str] = RUN_NUMERIC
) -> str:
    """Plain aligned columns, two spaces apart, no trailing blanks: for pipes and tests."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.rjust(width) if name in numeric else cell.ljust(width)
            for name, cell, width in zip(header, row, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], stream: IO[str]) -> None:
    """A Rich table on a terminal (only TASK gives way when narrow); plain columns elsewhere.
    Either way with the cells' control characters escaped: a task may quote anything."""
    rows = [tuple(visible(cell) for cell in row) for row in rows]
    if not stream.isatty():
        print(format_columns(header, rows), file=stream)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream, highlight=False)
    table = Table(box=None, header_style="bold", pad_edge=False)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    task = header.index("TASK") if "TASK" in header else -1
    fixed = sum(w for i, w in enumerate(widths) if i != task) + 2 * (len(header) - 1)
    for i, name in enumerate(header):
        width = max(12, min(widths[i], console.width - fixed)) if i == task else widths[i]
        table.add_column(
            name,
            justify="right" if name in RUN_NUMERIC else "left",
            no_wrap=True,
            overflow="ellipsis",
            width=width,
        )
    for row in rows:
        # Text, never markup: a task is the user's words and may contain [brackets].
        status = _STATE_STYLES.get(row[-1].split(" ", 1)[0], "")
        table.add_row(*(Text(cell) for cell in row[:-1]), Text(row[-1], style=status))
    console.print(table)
