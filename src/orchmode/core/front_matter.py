"""Front matter that YAML refuses, read line by line as people write agent definitions.

Claude Code users keep definitions whose one-line ``description`` holds ``Triggers on: 'x'``
or an ``<example>`` block with ``user:`` lines: text a person reads as one value and YAML
reads as a nested mapping, and refuses. This reader takes the top-level ``key: value``
lines the way their author meant them:

- a value is taken as written; quotes are stripped only when one pair wraps all of it;
- the lines after a key that start no other key continue its value (joined with a space,
  a blank line between them kept as a line break), and ``|`` / ``>`` start a block kept /
  folded as YAML keeps and folds it;
- ``- item`` lines under a key with no value make a list, as does ``[a, b]`` on the line;
- lines starting with ``#`` outside a block are comments;
- an unquoted ``true``/``false`` is a boolean and an empty value (or ``null``, ``~``) is
  None, so the keys read the same as they would from YAML.

What it cannot read the way it was meant is a :class:`LineError`: a line before the first
``key: value`` line, a tab as indentation, a ``[`` list left open, a ``{`` mapping. Pure:
text in, values out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: A top-level key and what follows its colon (a colon needs a blank or the line's end after it).
KEY_LINE = re.compile(r"(?P<key>[A-Za-z_][\w.-]*)[ \t]*:(?:[ \t]+(?P<value>.*?))?[ \t]*")
#: The markers of a block value: kept (``|``) or folded (``>``), with optional chomping.
BLOCK_MARKERS = frozenset({"|", "|-", "|+", ">", ">-", ">+"})
#: A comma that separates items of a ``[a, b]`` list, not one inside ``Bash(a, b)``.
ITEM_SEPARATOR = re.compile(r",(?![^(]*\))")
TRUE_WORDS = frozenset({"true", "True", "TRUE"})
FALSE_WORDS = frozenset({"false", "False", "FALSE"})
NULL_WORDS = frozenset({"", "~", "null", "Null", "NULL"})

#: What a key holds once read: text, a boolean, a list of texts, or None.
Value = str | bool | list[str] | None


class LineError(ValueError):
    """A line the reader cannot take as its author meant it: the 1-based line and why."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(f"line {line}: {what}")
        self.line = line
        self.what = what


@dataclass
class _Entry:
    """One key as it is being read: its first line's value and the lines that follow it."""

    key: str
    line: int
    value: str
    rest: list[tuple[int, str]] = field(default_factory=list)


def read_front_matter(text: str) -> tuple[dict[str, Value], dict[str, int]]:
    """Each top-level key's value, and the 1-based line of each key (within ``text``).

    A key written twice keeps its last value and its first line, as the YAML reader does.
    """
    values: dict[str, Value] = {}
    lines: dict[str, int] = {}
    for entry in _entries(text):
        values[entry.key] = _value(entry)
        lines.setdefault(entry.key, entry.line)
    return values, lines


def _entries(text: str) -> list[_Entry]:
    """The front matter cut into keys, each with the lines that belong to it."""
    entries: list[_Entry] = []
    for number, line in enumerate(text.split("\n"), start=1):
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        if "\t" in indent and line.strip():
            raise LineError(number, "a tab indents this line (indent with spaces)")
        if not indent and line.startswith("#"):
            continue
        found = None if indent else KEY_LINE.fullmatch(line)
        if found is not None:
            entries.append(_Entry(found["key"], number, found["value"] or ""))
        elif entries:  # indented, a list item, or words that go on from the line above
            entries[-1].rest.append((number, line))
        elif line.strip():
            raise LineError(number, "there is no 'key: value' line above this one")
    return entries


def _value(entry: _Entry) -> Value:
    """One key's value from its own line and the lines under it."""
    first = entry.value
    if first in BLOCK_MARKERS:
        return _block(first, [line for _, line in entry.rest])
    rest = [(number, line) for number, line in entry.rest if not _is_comment(line)]
    if first.startswith("{"):
        raise LineError(entry.line, "a '{' mapping cannot be read line by line")
    filled = [line.strip() for _, line in rest if line.strip()]
    if first.startswith("["):
        if filled or not first.endswith("]"):
            raise LineError(entry.line, "the list opened with '[' is not closed on its line")
        items = (item.strip() for item in ITEM_SEPARATOR.split(first[1:-1]))
        return [_unquoted(item) for item in items if item]
    if not first and filled and (filled[0] == "-" or filled[0].startswith("- ")):
        return _items(rest)
    return _scalar(first, [line for _, line in rest])


def _is_comment(line: str) -> bool:
    return line.lstrip().startswith("#")


def _items(lines: list[tuple[int, str]]) -> list[str]:
    """``- item`` lines as a list (the first filled line is one); a line that is no item
    continues the item above it."""
    items: list[str] = []
    for _, line in lines:
        stripped = line.strip()
        if stripped == "-" or stripped.startswith("- "):
            items.append(stripped[1:].strip())
        elif stripped:
            items[-1] = f"{items[-1]} {stripped}"
    return [_unquoted(item) for item in items if item]


def _scalar(first: str, lines: list[str]) -> Value:
    """A one-line value and its continuation lines: words joined, a blank line a line break."""
    if not any(line.strip() for line in lines):
        return _typed(first)
    text = first
    gap = False
    for line in lines:
        stripped = line.strip()
        if not stripped:
            gap = True
            continue
        joint = "\n" if gap else " "
        text = f"{text}{joint}{stripped}" if text else stripped
        gap = False
    return _unquoted(text)


def _block(marker: str, lines: list[str]) -> str:
    """A ``|`` or ``>`` block: its lines less their common indent, kept or folded."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    indents = [len(line) - len(line.lstrip(" ")) for line in lines if line.strip()]
    margin = min(indents, default=0)
    body = [line[margin:] for line in lines]
    text = "\n".join(body) if marker.startswith("|") else _folded(body)
    return text if marker.endswith("-") or not text else text + "\n"


def _folded(lines: list[str]) -> str:
    """Lines folded as YAML folds ``>``: a single line break is a space, a blank line a break;
    more-indented lines are kept as they are."""
    text = ""
    for line in lines:
        if not text:
            text = line
        elif not line.strip():
            text += "\n"
        elif line.startswith(" ") or text.endswith("\n"):
            text += ("" if text.endswith("\n") else "\n") + line
        else:
            text += " " + line
    return text


def _typed(text: str) -> Value:
    """An unquoted one-line value: a boolean, None, or the text (quotes wrapping it stripped)."""
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    if text in NULL_WORDS:
        return None
    return _unquoted(text)


def _unquoted(text: str) -> str:
    """The text without the quotes around it, when one pair of quotes wraps all of it."""
    if len(text) < 2 or text[0] != text[-1] or text[0] not in "'\"":
        return text
    inner = text[1:-1]
    if text[0] == "'":
        return text if "'" in inner.replace("''", "") else inner.replace("''", "'")
    return text if '"' in re.sub(r"\\.", "", inner) else re.sub(r'\\(["\\])', r"\1", inner)
