"""What a worker's git patch changes, and whether it may be applied to the user's tree.

A worker's change comes back as the text of ``git diff --binary --full-index -M <base>``,
possibly from the journal or a remote node, so it is parsed as untrusted input: every line
must be where git would put it, or :class:`PatchError` says which line is wrong. Being
stricter than ``git apply`` is deliberate — a patch this module reads differently from
``git apply`` (a hidden header, a second file after garbage, a name that means something
else) could slip a write past :func:`refusals`, while one it rejects is simply not applied.
"""

from __future__ import annotations

import base64
import re
import unicodedata
import zlib
from dataclasses import dataclass, field
from typing import Literal

from ..core.results import Change
from ..core.secrets import SecretFiles

Kind = Literal["added", "deleted", "modified", "renamed", "copied"]

_S_IFMT = 0o170000
_S_IFLNK = 0o120000
_S_IFGITLINK = 0o160000

_MODE = r"[0-7]{6}"
_HUNK = re.compile(r"@@ -(\d{1,10})(?:,(\d{1,10}))? \+(\d{1,10})(?:,(\d{1,10}))? @@(?: .*)?")
_INDEX = re.compile(rf"index [0-9a-f]{{4,64}}\.\.[0-9a-f]{{4,64}}(?: ({_MODE}))?")
_MODE_LINE = re.compile(rf"(old mode|new mode|deleted file mode|new file mode) ({_MODE})")
_SIMILARITY = re.compile(r"(similarity|dissimilarity) index \d{1,3}%")
_NAME_LINE = re.compile(r"(rename from|rename to|copy from|copy to) (.*)")
_BINARY_BLOCK = re.compile(r"(literal|delta) (\d{1,20})")
_BASE85 = frozenset(
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
)
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
#: Code points HFS+ ignores in names, so ``.g\u200cit`` is ``.git`` on a Mac (git's list).
_HFS_IGNORED = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
_SEPARATORS = re.compile(r"[/\\]")
_DRIVE = re.compile(r"[A-Za-z]:")


class PatchError(ValueError):
    """The patch text is not what ``git diff`` writes."""


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
            return f"{_show(self.old_path)} → {_show(self.path)}"
        return _show(self.path)


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
    reader = _Reader(lines)
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


class _Reader:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.i = 0

    def done(self) -> bool:
        return self.i >= len(self.lines)

    def peek(self) -> str | None:
        return None if self.done() else self.lines[self.i]

    def error(self, what: str, line: int | None = None) -> PatchError:
        n = self.i if line is None else line
        if n >= len(self.lines):
            return PatchError(f"{what} (at the end of the patch)")
        text = self.lines[n]
        shown = text if len(text) <= 60 else text[:57] + "..."
        return PatchError(f"line {n + 1}: {what}: {shown!r}")


@dataclass
class _Headers:
    """The extended header lines of one file, each seen at most once."""

    seen: set[str] = field(default_factory=set)
    modes: dict[str, str] = field(default_factory=dict)
    index_mode: str | None = None
    names: dict[str, str] = field(default_factory=dict)


def _parse_file(reader: _Reader) -> FileChange:
    start = reader.i
    first = reader.peek() or ""
    if not first.startswith("diff --git "):
        raise reader.error("expected a 'diff --git' line")
    git_line = _git_line_names(first[len("diff --git ") :], reader)
    reader.i += 1

    headers = _Headers()
    while (line := reader.peek()) is not None and not line.startswith(
        ("diff --git ", "--- ", "@@ ", "Binary files ", "GIT binary patch")
    ):
        _header(headers, line, reader)
        reader.i += 1

    minus: str | None = None
    plus: str | None = None
    has_minus = False
    if (line := reader.peek()) is not None and line.startswith("--- "):
        has_minus = True
        minus = _dash_name(line[4:], "a/", reader)
        reader.i += 1
        line = reader.peek()
        if line is None or not line.startswith("+++ "):
            raise reader.error("expected '+++' after '---'")
        plus = _dash_name(line[4:], "b/", reader)
        reader.i += 1

    added_file = "new file mode" in headers.modes
    deleted_file = "deleted file mode" in headers.modes
    old_name, new_name, kind = _names(headers, git_line, has_minus, minus, plus, reader, start)
    if added_file or deleted_file:
        kind = "added" if added_file else "deleted"
    old_mode, new_mode = _modes(headers, reader, start)
    symlink = new_mode is not None and _file_type(new_mode) == _S_IFLNK

    added = removed = 0
    binary = False
    target: str | None = None
    line = reader.peek()
    if has_minus:
        if line is None or not line.startswith("@@ "):
            raise reader.error("expected a hunk after '+++'")
        hunks = 0
        while (line := reader.peek()) is not None and line.startswith("@@ "):
            hunk = _parse_hunk(reader, collect=symlink)
            added += hunk.added
            removed += hunk.removed
            hunks += 1
            target = hunk.whole_new if hunks == 1 else None
    elif line is not None and line == "GIT binary patch":
        _skip_binary(reader)
        binary = True
    elif line is not None and line.startswith("Binary files "):
        if not line.endswith(" differ"):
            raise reader.error("expected 'Binary files … differ'")
        reader.i += 1
        binary = True
    elif line is not None and line.startswith("@@ "):
        raise reader.error("hunk without '---' and '+++' lines")
    elif line is not None and not line.startswith("diff --git "):
        raise reader.error("unexpected line")
    if (has_minus or binary) and new_mode is None and not deleted_file:
        raise reader.error("changed contents but no mode given", start)
    if kind == "modified" and not (has_minus or binary or old_mode != new_mode):
        raise reader.error("a file header that changes nothing", start)
    if (line := reader.peek()) is not None and not line.startswith("diff --git "):
        raise reader.error("unexpected line after the file's changes")

    path = old_name if deleted_file else new_name
    assert path is not None  # _names guarantees it
    return FileChange(
        path=path,
        old_path=old_name if kind in ("renamed", "copied") else None,
        kind=kind,
        added=added,
        removed=removed,
        binary=binary,
        old_mode=old_mode,
        new_mode=new_mode,
        symlink_target=target if symlink else None,
    )


def _header(headers: _Headers, line: str, reader: _Reader) -> None:
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
        headers.names[key] = _plain_name(m[2], reader)
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
    reader: _Reader,
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
            name = _same_name(git_line, reader, start)
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


def _agree(candidates: list[str | None], reader: _Reader, start: int) -> str | None:
    given = {c for c in candidates if c is not None}
    if len(given) > 1:
        raise reader.error("headers name different files", start)
    return given.pop() if given else None


def _modes(headers: _Headers, reader: _Reader, start: int) -> tuple[str | None, str | None]:
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


def _file_type(mode: str) -> int | None:
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


def _parse_hunk(reader: _Reader, *, collect: bool) -> _Hunk:
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


def _skip_binary(reader: _Reader) -> None:
    """Check ``GIT binary patch`` and its one or two ``literal``/``delta`` blocks."""
    reader.i += 1
    blocks = 0
    while blocks < 2 and (m := _BINARY_BLOCK.fullmatch(reader.peek() or "")):
        start = reader.i
        reader.i += 1
        data = bytearray()
        while (line := reader.peek()) is not None and line != "":
            size = _base85_size(line)
            if size is None:
                raise reader.error("not a line of binary patch data")
            try:
                data += base64.b85decode(line[1:])[:size]
            except ValueError:
                raise reader.error("not a line of binary patch data") from None
            reader.i += 1
        if line is None or not data:
            raise reader.error("truncated binary patch")
        if not _inflates_to(bytes(data), int(m[2])):
            raise reader.error("binary patch data that does not match its size", start)
        reader.i += 1
        blocks += 1
    if blocks == 0:
        raise reader.error("expected 'literal' or 'delta' after 'GIT binary patch'")


def _inflates_to(data: bytes, size: int) -> bool:
    """Whether ``data`` is one zlib stream of exactly ``size`` bytes (as git apply checks)."""
    inflater = zlib.decompressobj()
    total = 0
    try:
        while True:
            total += len(inflater.decompress(data, 1 << 20))
            data = inflater.unconsumed_tail
            if total > size or inflater.eof or not data:
                break
        total += len(inflater.flush())
    except zlib.error:
        return False
    return inflater.eof and total == size


def _base85_size(line: str) -> int | None:
    """The bytes a line of git's base85 data holds, or None if it is not such a line."""
    size = line[:1]
    if "A" <= size <= "Z":
        count = ord(size) - ord("A") + 1
    elif "a" <= size <= "z":
        count = ord(size) - ord("a") + 27
    else:
        return None
    if len(line) - 1 != 5 * ((count + 3) // 4) or not all(c in _BASE85 for c in line[1:]):
        return None
    return count


# --------------------------------------------------------------------------- names


def _git_line_names(rest: str, reader: _Reader) -> tuple[str, str] | str:
    """Both names of ``diff --git``, or the raw text when neither is quoted (ambiguous)."""
    if rest.startswith('"'):
        first, end = _unquote(rest, 0, reader)
        if rest[end : end + 1] != " ":
            raise reader.error("expected a space between the names")
        second = rest[end + 1 :]
        if second.startswith('"'):
            last, end = _unquote(second, 0, reader)
            if end != len(second):
                raise reader.error("text after the quoted name")
        else:
            last = _plain_name(second, reader)
        return _strip(first, "a/", reader), _strip(last, "b/", reader)
    if '"' in rest:
        at = rest.index('"')
        if rest[at - 1 : at] != " ":
            raise reader.error("a quote inside an unquoted name")
        last, end = _unquote(rest, at, reader)
        if end != len(rest):
            raise reader.error("text after the quoted name")
        first = _plain_name(rest[: at - 1], reader)
        return _strip(first, "a/", reader), _strip(last, "b/", reader)
    _plain_name(rest, reader)
    if not rest.startswith("a/") or " b/" not in rest:
        raise reader.error("expected 'diff --git a/… b/…'")
    return rest


def _same_name(rest: str, reader: _Reader, start: int) -> str:
    """The name in ``a/NAME b/NAME``: with no other header, git names a file only this way."""
    size = (len(rest) - 5) // 2
    name = rest[2 : 2 + size]
    if size > 0 and rest == f"a/{name} b/{name}":
        return name
    raise reader.error("cannot tell the file's name from the 'diff --git' line", start)


def _dash_name(text: str, prefix: str, reader: _Reader) -> str | None:
    """The name on a ``---``/``+++`` line, ``None`` for ``/dev/null``.

    git ends the line with a tab when the name has a space in it.
    """
    if text == "/dev/null":
        return None
    if text.endswith("\t"):
        text = text[:-1]
    if text.startswith('"'):
        name, end = _unquote(text, 0, reader)
        if end != len(text):
            raise reader.error("text after the quoted name")
    else:
        name = _plain_name(text, reader)
    return _strip(name, prefix, reader)


def _strip(name: str, prefix: str, reader: _Reader) -> str:
    if not name.startswith(prefix):
        raise reader.error(f"expected a name starting with {prefix!r}")
    return name[len(prefix) :]


def _plain_name(text: str, reader: _Reader) -> str:
    """An unquoted name, or a quoted one if ``text`` starts with a quote."""
    if text.startswith('"'):
        name, end = _unquote(text, 0, reader)
        if end != len(text):
            raise reader.error("text after the quoted name")
        return name
    # git quotes every name holding these, and git apply would cut a name at \r, \v or \f.
    if any(c < " " or c in '\x7f"\\' for c in text):
        raise reader.error("an unquoted name with characters git always quotes")
    return text


def _unquote(text: str, at: int, reader: _Reader) -> tuple[str, int]:
    """Decode the C-style quoted name starting at ``text[at]``; return it and the end index."""
    out = bytearray()
    i = at + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return out.decode("utf-8", "surrogateescape"), i + 1
        if c != "\\":
            try:
                out += c.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raise reader.error("a name that is not text") from None
            i += 1
            continue
        e = text[i + 1 : i + 2]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", text[i + 1 : i + 4]):
            out.append(int(text[i + 1 : i + 4], 8))
            i += 4
        else:
            raise reader.error("a bad escape in a quoted name")
    raise reader.error("a quoted name without its closing quote")


# --------------------------------------------------------------------------- refusals


def refusals(summary: PatchSummary, secret: SecretFiles | None = None) -> list[str]:
    """Why the patch must not be applied to the user's tree, one reason per offending file.

    Empty when it may be applied. Names are compared as case-insensitive Windows and macOS
    file systems would, since the user's tree may live on one. A file ``secret`` matches
    (``secret_files``) is never written, moved or deleted by an agent either.
    """
    reasons: list[str] = []
    for change in summary.files:
        reason = _refusal(change)
        if reason is None and secret:
            reason = _secret_refusal(change, secret)
        if reason is not None:
            reasons.append(reason)
    return reasons


def _secret_refusal(change: FileChange, secret: SecretFiles) -> str | None:
    for path in (change.path, change.old_path):
        if path is not None and secret.matches(path.replace("\\", "/")):
            return f"`{_show(path)}`: writes a secret file (secret_files)"
    return None


def _refusal(change: FileChange) -> str | None:
    for path in (change.path, change.old_path):
        if path is not None and (why := _path_refusal(path)) is not None:
            return f"`{_show(path)}`: {why}"
    shown = f"`{_show(change.path)}`"
    kind = _file_type(change.new_mode) if change.new_mode is not None else None
    if kind == _S_IFGITLINK:
        return f"{shown}: {'adds' if change.kind == 'added' else 'changes'} a submodule"
    if kind == _S_IFLNK:
        why = _link_refusal(change.path, change.symlink_target)
        if why is not None:
            return f"{shown}: {why}"
    return None


def _path_refusal(path: str) -> str | None:
    if path == "" or "\0" in path or "\n" in path or _is_absolute(path):
        return "leaves the tree"
    parts = _components(path)
    if parts is None:
        return "leaves the tree"
    if not parts:
        return "leaves the tree"  # names the tree's root itself
    if any(_is_dotgit(part) for part in parts):
        return "writes inside .git"
    if _fold(parts[0]) == ".orchmode":
        return "writes orchmode's own state"
    if len(parts) == 1 and _fold(parts[0]) == "orchmode.toml":
        return "changes orchmode's settings"
    return None


def _link_refusal(path: str, target: str | None) -> str | None:
    if target is None:
        return "is a symbolic link whose target the patch does not show"
    if _is_absolute(target):
        return "is a symbolic link that points outside the tree"
    where = _components(path) or []
    resolved = where[:-1]  # the link's own directory
    for part in _SEPARATORS.split(target):
        if _is_dotgit(part):
            return "is a symbolic link that points into .git"
        if _is_dotdot(part):
            if not resolved:
                return "is a symbolic link that points outside the tree"
            resolved.pop()
        elif not _is_dot(part):
            resolved.append(part)
    if resolved and _fold(resolved[0]) == ".orchmode":
        return "is a symbolic link that points into orchmode's own state"
    return None


def _components(path: str) -> list[str] | None:
    """The path's components without ``.`` and empty ones; ``None`` when one climbs (``..``)."""
    parts = _SEPARATORS.split(path)  # a backslash separates on Windows
    if any(_is_dotdot(part) for part in parts):
        return None
    return [part for part in parts if not _is_dot(part)]


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "\\")) or _DRIVE.match(path) is not None


def _is_dot(part: str) -> bool:
    """``""``, ``.``, and ``. `` (which Windows reads as ``.``)."""
    return set(part) <= {".", " "} and part.count(".") <= 1


def _is_dotdot(part: str) -> bool:
    """``..`` and the names Windows also reads as it (``.. ``, ``...``)."""
    return set(part) <= {".", " "} and part.count(".") >= 2


def _fold(part: str) -> str:
    """A name as a case-insensitive Windows or macOS file system compares it."""
    part = part.translate(_HFS_IGNORED).split(":", 1)[0]  # ``.git::$INDEX_ALLOCATION``
    return part.rstrip(" .").casefold()


def _is_dotgit(part: str) -> bool:
    folded = _fold(part)
    return folded in (".git", "git~1")  # git~1: the NTFS short name of .git


def _show(text: str) -> str:
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
