"""Untrusted text made safe for a terminal: every control character shown, none obeyed.

What a model writes, what a command prints, a file's name and an MCP server's error are all
untrusted. Written to a terminal as they are, ``ESC]52;c;…BEL`` sets the user's clipboard,
``ESC]0;…BEL`` the window's title, ``ESC[2J`` clears the screen (hiding what came before), a
``\\r`` writes over the start of its line, and a right-to-left override (``U+202E``) makes a
line read other than it is ("Trojan Source"). :func:`visible` is the one function every
terminal output passes such text through: each of those characters becomes the escape
Python's ``repr`` writes for it (``\\x1b``, ``\\x9b``, ``\\r``, ``\\u202e``), so a reader sees
that it was there, and the terminal obeys none of it.

Kept as they are: newlines and tabs (a terminal only moves the cursor forward for them) and
every printable character of any script. Shown: the rest of C0, DEL, C1 (``U+0080``–``U+009F``,
the 8-bit CSI ``U+009B`` among them), the bidirectional embeddings, overrides and isolates
(``U+202A``–``U+202E``, ``U+2066``–``U+2069``), and lone surrogates (a file name that was not
UTF-8), which could not even be written to a UTF-8 stream.

It lives in the views because only they write to terminals; the JSON lines get
:func:`json_visible` instead, which keeps the data exact (a parser reads back the very
characters) while the bytes on the stream obey nothing either.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypeVar

#: The characters a terminal may act on, or that reorder what it shows.
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_PATTERN = re.compile(f"[{_UNSAFE}]")

#: JSON already writes U+0000–U+001F as ``\u00XX``: what is left of the unsafe characters.
_JSON_PATTERN = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _shown(found: re.Match[str]) -> str:
    return repr(found[0])[1:-1]  # '\x1b', '\r', '\x9b', '\u202e', '\udcff'


def visible(text: str) -> str:
    """``text`` with every control character a terminal would obey written out as its escape.

    Text with nothing to escape — nearly all of it — comes back as the same object, found by
    one scan of a compiled pattern.
    """
    return _PATTERN.sub(_shown, text)


def _json_escape(found: re.Match[str]) -> str:
    return f"\\u{ord(found[0]):04x}"


def json_visible(line: str) -> str:
    """A line of JSON (``json.dumps`` with ``ensure_ascii=False``) with the unsafe characters
    JSON leaves raw (DEL, C1, bidi controls, lone surrogates) written as ``\\uXXXX``: the same
    data to a parser, nothing a terminal acts on."""
    return _JSON_PATTERN.sub(_json_escape, line)


E = TypeVar("E")


def visible_event(event: E) -> E:
    """A dataclass event with :func:`visible` applied to its text fields; the event itself
    when none needs it (the usual case: no copy is made)."""
    if not dataclasses.is_dataclass(event) or isinstance(event, type):
        return event
    changes: dict[str, object] = {}
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        if isinstance(value, str):
            shown = visible(value)
            if shown is not value:
                changes[item.name] = shown
    return dataclasses.replace(event, **changes) if changes else event
