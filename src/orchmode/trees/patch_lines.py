"""A patch's lines read as git writes them: the cursor, quoted file names, binary blocks.

The cursor's errors name the line they are about; a binary block is checked to inflate to
the size it claims, as ``git apply`` checks it.
"""

from __future__ import annotations

import base64
import re
import zlib

_BINARY_BLOCK = re.compile(r"(literal|delta) (\d{1,20})")
_BASE85 = frozenset(
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
)
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


class PatchError(ValueError):
    """The patch text is not what ``git diff`` writes."""


class PatchReader:
    """A patch's lines and the one being read; its errors name that line."""

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


def skip_binary(reader: PatchReader) -> None:
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


def git_line_names(rest: str, reader: PatchReader) -> tuple[str, str] | str:
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
            last = plain_name(second, reader)
        return _strip(first, "a/", reader), _strip(last, "b/", reader)
    if '"' in rest:
        at = rest.index('"')
        if rest[at - 1 : at] != " ":
            raise reader.error("a quote inside an unquoted name")
        last, end = _unquote(rest, at, reader)
        if end != len(rest):
            raise reader.error("text after the quoted name")
        first = plain_name(rest[: at - 1], reader)
        return _strip(first, "a/", reader), _strip(last, "b/", reader)
    plain_name(rest, reader)
    if not rest.startswith("a/") or " b/" not in rest:
        raise reader.error("expected 'diff --git a/… b/…'")
    return rest


def same_name(rest: str, reader: PatchReader, start: int) -> str:
    """The name in ``a/NAME b/NAME``: with no other header, git names a file only this way."""
    size = (len(rest) - 5) // 2
    name = rest[2 : 2 + size]
    if size > 0 and rest == f"a/{name} b/{name}":
        return name
    raise reader.error("cannot tell the file's name from the 'diff --git' line", start)


def dash_name(text: str, prefix: str, reader: PatchReader) -> str | None:
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
        name = plain_name(text, reader)
    return _strip(name, prefix, reader)


def _strip(name: str, prefix: str, reader: PatchReader) -> str:
    if not name.startswith(prefix):
        raise reader.error(f"expected a name starting with {prefix!r}")
    return name[len(prefix) :]


def plain_name(text: str, reader: PatchReader) -> str:
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


def _unquote(text: str, at: int, reader: PatchReader) -> tuple[str, int]:
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
