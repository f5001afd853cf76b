"""What a worker's git patch changes, read as untrusted text.

A worker's change comes back as the text of ``git diff --binary --full-index -M <base>``,
possibly from the journal or a remote node, so it is parsed as untrusted input: every line
must be where git would put it, or :class:`PatchError` says which line is wrong. Being
stricter than ``git apply`` is deliberate — a patch this module reads differently from
``git apply`` (a hidden header, a second file after garbage, a name that means something
else) could slip a write past :func:`.refusals.refusals`, while one it rejects is simply
not applied.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Literal

from ..core.results import Change
from .patch_lines import (
    PatchError,
    PatchReader,
    dash_name,
    git_line_names,
    plain_name,
    same_name,
    skip_binary,
)

Kind = Literal["added", "deleted", "modified", "renamed", "copied"]

_S_IFMT = 0o170000
S_IFLNK = 0o120000

_MODE = r"[0-7]{6}"
_HUNK = re.compile(r"@@ -(\d{1,10})(?:,(\d{1,10}))? \+(\d{1,10})(?:,(\d{1,10}))? @@(?: .*)?")
_INDEX = re.compile(rf"index [0-9a-f]{{4,64}}\.\.[0-9a-f]{{4,64}}(?: ({_MODE}))?")
_MODE_LINE = re.compile(rf"(old mode|new mode|deleted file mode|new file mode) ({_MODE})")
_SIMILARITY = re.compile(r"(similarity|dissimilarity) index \d{1,3}%")
_NAME_LINE = re.compile(r"(rename from|rename to|copy from|copy to) (.*)")


@dataclass(frozen=True)
class FileChange:
    """One file of a patch, as ``git apply`` would change it."""

    path: str
    old_path: str | None
    kind: Kind
    added: int
    removed: int
    binary: bool
    old_mode: str | None
    new_mode: str | None
    symlink_target: str | None

    @property
    def label(self) -> str:
        """The path for a person to read: ``old → new`` for a rename, control codes escaped."""
        if self.old_path is not None:
            return f"{printable(self.old_path)} → {printable(self.path)}"
        return printable(self.path)


@dataclass(frozen=True)
class PatchSummary:
    files: tuple[FileChange, ...] = ()

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)

    def describe(self, limit: int = 8) -> str:
        """One line: ``3 files (+12 −4): src/a.py (+10 −2), b.bin (binary), …``."""
        if not self.files:
            return "no changes"
        count = len(self.files)
        head = f"{count} file{'s' if count != 1 else ''} (+{self.added} −{self.removed})"
        shown = [_describe_file(f) for f in self.files[: max(limit, 0)]]
        if count > len(shown):
            shown.append(f"… and {count - len(shown)} more")
        return f"{head}: {', '.join(shown)}"


def _describe_file(change: FileChange) -> str:
    if change.binary:
        return f"{change.label} (binary)"
    if change.added or change.removed:
        return f"{change.label} (+{change.added} −{change.removed})"
    return change.label


# --------------------------------------------------------------------------- parsing


def summarise(patch: str) -> PatchSummary:
    """Every file ``patch`` changes; ``""`` is the empty patch. Raises :class:`PatchError`."""
    if not isinstance(patch, str):
        raise PatchError(f"a patch is text, not {type(patch).__name__}")
    if patch == "":
        return PatchSummary()
    lines = patch.split("\n")  # not splitlines(): \r, \x0b, \u2028 … are content
    if lines[-1] == "":
        lines.pop()
    reader = PatchReader(lines)
    files: list[FileChange] = []
    while not reader.done():
        files.append(_parse_file(reader))
    return PatchSummary(tuple(files))


def summary_of(change: Change) -> PatchSummary | str:
    """What a worker's change does to the tree, or why its patch cannot be read."""
    try:
        return summarise(change.patch)
    except PatchError as exc:
        return str(exc)


def describe_change(change: Change) -> str:
    """One line: "2 files (+10 −2): a.py (+8 −2), …", or that the patch cannot be read."""
    return describe_summary(summary_of(change))


def describe_summary(summary: PatchSummary | str) -> str:
    """:func:`describe_change` for a summary already read, so a patch is parsed once."""
    if isinstance(summary, PatchSummary):
        return summary.describe()
    return f"an unreadable patch ({summary})"


@dataclass
class _Headers:
    """The extended header lines of one file, each seen at most once."""

    seen: set[str] = field(default_factory=set)
    modes: dict[str, str] = field(default_factory=dict)
    index_mode: str | None = None
    names: dict[str, str] = field(default_factory=dict)


def _parse_file(reader: PatchReader) -> FileChange:
    start = reader.i
    first = reader.peek() or ""
    if not first.startswith("diff --git "):
        raise reader.error("expected a 'diff --git' line")
    git_line = git_line_names(first[len("diff --git ") :], reader)
    reader.i += 1

    headers = _Headers()
    while (line := reader.peek()) is not None and not line.startswith(
        ("diff --git ", "--- ", "@@ ", "Binary files ", "GIT binary patch")
    ):
        _header(headers, line, reader)
        reader.i += 1

    has_minus, minus, plus = _dash_lines(reader)
    added_file = "new file mode" in headers.modes
    deleted_file = "deleted file mode" in headers.modes
    old_name, new_name, kind = _names(headers, git_line, has_minus, minus, plus, reader, start)
    if added_file or deleted_file:
        kind = "added" if added_file else "deleted"
    old_mode, new_mode = _modes(headers, reader, start)
    symlink = new_mode is not None and file_type(new_mode) == S_IFLNK

    body = _parse_body(reader, has_minus=has_minus, symlink=symlink)
    if (has_minus or body.binary) and new_mode is None and not deleted_file:
        raise reader.error("changed contents but no mode given", start)
    if kind == "modified" and not (has_minus or body.binary or old_mode != new_mode):
        raise reader.error("a file header that changes nothing", start)
    if (line := reader.peek()) is not None and not line.startswith("diff --git "):
        raise reader.error("unexpected line after the file's changes")

    path = old_name if deleted_file else new_name
    assert path is not None  # _names guarantees it
    return FileChange(
        path=path,
        old_path=old_name if kind in ("renamed", "copied") else None,
        kind=kind,
        added=body.added,
        removed=body.removed,
        binary=body.binary,
        old_mode=old_mode,
        new_mode=new_mode,
        symlink_target=body.target if symlink else None,
    )


def _dash_lines(reader: PatchReader) -> tuple[bool, str | None, str | None]:
    """Whether the file has ``---``/``+++`` lines, and their names (None: ``/dev/null``)."""
    if (line := reader.peek()) is None or not line.startswith("--- "):
        return False, None, None
    minus = dash_name(line[4:], "a/", reader)
    reader.i += 1
    line = reader.peek()
    if line is None or not line.startswith("+++ "):
        raise reader.error("expected '+++' after '---'")
    plus = dash_name(line[4:], "b/", reader)
    reader.i += 1
    return True, minus, plus


@dataclass(frozen=True)
class _Body:
    """What one file's hunks or binary block change."""

    added: int = 0
    removed: int = 0
    binary: bool = False
    #: A symbolic link's target, when its one hunk shows all of it.
    target: str | None = None


def _parse_body(reader: PatchReader, *, has_minus: bool, symlink: bool) -> _Body:
    """The file's hunks (after ``---``/``+++``), or its binary block, or nothing."""
    line = reader.peek()
    if has_minus:
        if line is None or not line.startswith("@@ "):
            raise reader.error("expected a hunk after '+++'")
        added = removed = hunks = 0
        target: str | None = None
        while (line := reader.peek()) is not None and line.startswith("@@ "):
            hunk = _parse_hunk(reader, collect=symlink)
            added += hunk.added
            removed += hunk.removed
            hunks += 1
            target = hunk.whole_new if hunks == 1 else None
        return _Body(added, removed, False, target)
    if line is not None and line == "GIT binary patch":
        skip_binary(reader)
        return _Body(binary=True)
    if line is not None and line.startswith("Binary files "):
        if not line.endswith(" differ"):
            raise reader.error("expected 'Binary files … differ'")
        reader.i += 1
        return _Body(binary=True)
    if line is not None and line.startswith("@@ "):
        raise reader.error("hunk without '---' and '+++' lines")
    if line is not None and not line.startswith("diff --git "):
        raise reader.error("unexpected line")
    return _Body()


def _header(headers: _Headers, line: str, reader: PatchReader) -> None:
    if m := _MODE_LINE.fullmatch(line):
        key = m[1]
        headers.modes[key] = m[2]
    elif m := _INDEX.fullmatch(line):
        key = "index"
        headers.index_mode = m[1]
    elif m := _SIMILARITY.fullmatch(line):
        key = m[1]
    elif m := _NAME_LINE.fullmatch(line):
        key = m[1]
        headers.names[key] = plain_name(m[2], reader)
    else:
        raise reader.error("not a git diff header")
    if key in headers.seen:
        raise reader.error("header given twice")
    headers.seen.add(key)


def _names(
    headers: _Headers,
    git_line: tuple[str, str] | str,
    has_minus: bool,
    minus: str | None,
    plus: str | None,
    reader: PatchReader,
    start: int,
) -> tuple[str | None, str | None, Kind]:
    """The names before and after, checked against every header that states them."""
    added = "new file mode" in headers.modes
    deleted = "deleted file mode" in headers.modes
    names = headers.names
    renamed = "rename from" in names or "rename to" in names
    copied = "copy from" in names or "copy to" in names
    kind: Kind = "renamed" if renamed else "copied" if copied else "modified"
    verb = {"renamed": "rename", "copied": "copy"}.get(kind, "")
    if renamed and copied:
        raise reader.error("both a rename and a copy", start)
    if (added and deleted) or ((renamed or copied) and (added or deleted)):
        raise reader.error("contradictory file headers", start)
    if verb and not (f"{verb} from" in names and f"{verb} to" in names):
        raise reader.error(f"'{verb} from' without '{verb} to' or the other way", start)
    if has_minus and ((minus is None) != added or (plus is None) != deleted):
        raise reader.error("'/dev/null' does not match the file being added or deleted", start)

    old = _agree([names.get(f"{verb} from"), minus], reader, start)
    new = _agree([names.get(f"{verb} to"), plus], reader, start)
    if old is None and new is None:
        if isinstance(git_line, tuple):
            if git_line[0] != git_line[1]:
                raise reader.error("different names but no rename or copy", start)
            name = git_line[0]
        else:
            name = same_name(git_line, reader, start)
        old = None if added else name
        new = None if deleted else name
    elif kind == "modified" and not (added or deleted) and old != new:
        raise reader.error("different names but no rename or copy", start)
    elif (old is not None and added) or (new is not None and deleted):
        raise reader.error("'/dev/null' does not match the file being added or deleted", start)

    before = old if old is not None else new
    after = new if new is not None else old
    assert before is not None and after is not None
    if isinstance(git_line, tuple):
        consistent = git_line == (before, after)
    else:
        consistent = git_line == f"a/{before} b/{after}"
    if not consistent:
        raise reader.error("the 'diff --git' line names other files than its headers", start)
    return old, new, kind


def _agree(candidates: list[str | None], reader: PatchReader, start: int) -> str | None:
    given = {c for c in candidates if c is not None}
    if len(given) > 1:
        raise reader.error("headers name different files", start)
    return given.pop() if given else None


def _modes(headers: _Headers, reader: PatchReader, start: int) -> tuple[str | None, str | None]:
    modes = headers.modes
    if "new file mode" in modes or "deleted file mode" in modes:
        if "old mode" in modes or "new mode" in modes or headers.index_mode is not None:
            raise reader.error("a mode given twice", start)
        return modes.get("deleted file mode"), modes.get("new file mode")
    if "old mode" in modes or "new mode" in modes:
        if "old mode" not in modes or "new mode" not in modes:
            raise reader.error("'old mode' and 'new mode' come together", start)
        if headers.index_mode is not None:
            raise reader.error("a mode given twice", start)
        return modes["old mode"], modes["new mode"]
    return headers.index_mode, headers.index_mode


def file_type(mode: str) -> int | None:
    try:
        return int(mode, 8) & _S_IFMT
    except ValueError:
        return None


@dataclass(frozen=True)
class _Hunk:
    added: int
    removed: int
    #: The file's whole new text when this hunk shows all of it (what a symlink needs).
    whole_new: str | None


def _parse_hunk(reader: PatchReader, *, collect: bool) -> _Hunk:
    m = _HUNK.fullmatch(reader.peek() or "")
    if m is None:
        raise reader.error("not a hunk header")
    old_left = int(m[2]) if m[2] is not None else 1
    new_left = int(m[4]) if m[4] is not None else 1
    new_start = int(m[3])
    if old_left == 0 and new_left == 0:
        raise reader.error("an empty hunk")
    reader.i += 1
    added = removed = 0
    new_lines: list[str] = []
    new_ends_without_newline = False
    last: str | None = None  # the previous line's kind: ' ', '-', '+' or '\\'

    def marker(line: str) -> None:
        nonlocal new_ends_without_newline
        if last in (None, "\\") or not line.startswith("\\ "):
            raise reader.error("misplaced '\\ No newline at end of file'")
        if last in (" ", "+"):
            new_ends_without_newline = True

    while old_left > 0 or new_left > 0:
        line = reader.peek()
        if line is None:
            raise reader.error("truncated hunk")
        tag = line[:1]
        if tag in (" ", ""):  # "" is an empty context line, which git apply also accepts
            old_left -= 1
            new_left -= 1
        elif tag == "-":
            old_left -= 1
            removed += 1
        elif tag == "+":
            new_left -= 1
            added += 1
        elif tag == "\\":
            marker(line)
        else:
            raise reader.error("not a hunk line")
        if old_left < 0 or new_left < 0:
            raise reader.error("more hunk lines than its header counts")
        if tag in (" ", "", "+"):
            new_ends_without_newline = False
            if collect:
                new_lines.append(line[1:])
        last = " " if tag == "" else tag
        reader.i += 1
    if (line := reader.peek()) is not None and line.startswith("\\"):
        marker(line)
        reader.i += 1
    if not (added or removed):
        raise reader.error("a hunk that changes nothing", reader.i - 1)
    whole = collect and new_start == 1 and new_ends_without_newline
    return _Hunk(added, removed, "\n".join(new_lines) if whole else None)


def printable(text: str) -> str:
    """``text`` on one printable line: control, format and undecodable characters escaped."""
    out: list[str] = []
    for c in text:
        code = ord(c)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif unicodedata.category(c) in ("Cc", "Cf", "Cs", "Cn", "Zl", "Zp"):
            out.append(ascii(c)[1:-1])  # \n, \x00, \u200e …
        else:
            out.append(c)
    return "".join(out)
