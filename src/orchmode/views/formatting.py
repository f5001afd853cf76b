"""Dollars, durations, local times, counts and clipped lines as a reader sees them.

The history, the transcript, the runs table and the HTML report all write these the same
way, so a cost or a duration reads alike wherever it is shown.
"""

from __future__ import annotations

import time

from ..records.wording import seconds as seconds  # the read model describes durations too
from .escape import visible


def money(dollars: float) -> str:
    """Cents for real spend, more digits below a dollar so small runs do not read $0.00."""
    return f"${dollars:,.2f}" if dollars >= 1 else f"${dollars:.4f}"


def when(at: float | None, form: str = "%Y-%m-%d %H:%M") -> str:
    """Local time; a dash for a time that is missing or that no calendar can show."""
    if at is None:
        return "—"
    try:
        return time.strftime(form, time.localtime(at))
    except (OverflowError, OSError, ValueError):
        return "—"


def clip(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters; its control characters shown
    (a carriage return as ``\\r``, not taken for a space)."""
    line = " ".join(visible(text).split())
    return line if len(line) <= width else line[: width - 1] + "…"


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")
