"""A generated block in a documentation page, kept between two marker comments.

``scripts/layout.py`` (the architecture page's layout table) and
``scripts/settings_table.py`` (the configuration page's settings table) share this: each
makes its block from the code, then prints it, writes it into its page (``--write``) or
exits 1, saying what differs, when the page's copy is stale (``--check``).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def between(text: str, begin: str, end: str, page: Path) -> tuple[int, int]:
    """Where the block sits in ``text``: just after ``begin``, up to ``end``."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{page} lacks the markers {begin!r} … {end!r}")
    return start + len(begin), stop


def main(description: str, page: Path, begin: str, end: str, made: str, maker: str) -> int:
    """The command line of a generator: print, ``--write`` or ``--check`` the block."""
    parser = argparse.ArgumentParser(description=description)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"update {page.name} in place")
    group.add_argument("--check", action="store_true", help=f"exit 1 if {page.name} is stale")
    parser.add_argument("--page", type=Path, default=page, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not (args.write or args.check):
        print(made)
        return 0
    target: Path = args.page
    text = target.read_text(encoding="utf-8")
    start, stop = between(text, begin, end, target)
    current = text[start:stop].strip("\n")
    shown = target.relative_to(ROOT) if target.is_relative_to(ROOT) else target
    if args.check:
        if current == made:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(), made.splitlines(), str(shown), maker, lineterm=""
        )
        print(f"{shown} is stale; run {maker} --write", file=sys.stderr)
        print("\n".join(diff), file=sys.stderr)
        return 1
    target.write_text(text[:start] + "\n" + made + "\n" + text[stop:], encoding="utf-8")
    return 0
