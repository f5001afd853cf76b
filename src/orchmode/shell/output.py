"""The bounded collector of one command's output that also spots the end-of-command marker.

Reading the pipe is byte-level work apart from the shell protocol: holding back what might
be the marker, decoding the rest, and keeping only a head so a flood costs a counter.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable

# The end-of-command line is "\n<nonce> <status>\n"; a status is a few digits at most.
_STATUS_MAX_BYTES = 16


class _OutputCollector:
    """Bounded view of one command's output that also spots the end-of-command marker.

    Bytes are held back only while they might be the start of the marker; everything
    before it is decoded at once, and only the first ``limit`` characters (after leading
    whitespace) are kept, so a flood costs a counter, not memory.
    """

    def __init__(self, marker: bytes, limit: int, margin: int = 0) -> None:
        self._marker = marker
        self._limit = limit
        #: Characters kept past the limit, so that a secret the limit would cut in two is
        #: whole when the output is masked (the longest secret's length).
        self._keep = limit + margin
        self._pending = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._head: list[str] = []
        self._head_len = 0
        self._seen_text = False  # leading whitespace is dropped until the first other char
        self._total = 0  # characters after leading whitespace, kept or not
        self._trailing_ws = 0  # how many of those are (so far) trailing whitespace
        self.finished = False
        self.status: int | None = None
        self.leftover = b""  # bytes after the marker line: output for the next command

    def feed(self, data: bytes) -> bool:
        """Take a chunk of the pipe; True once the marker line has been seen."""
        if self.finished:
            self.leftover += data
            return True
        self._pending += data
        search_from = 0
        while True:
            idx = self._pending.find(self._marker, search_from)
            if idx < 0:
                break
            start = idx + len(self._marker)
            newline = self._pending.find(b"\n", start, start + _STATUS_MAX_BYTES + 1)
            if newline < 0:
                if len(self._pending) - start <= _STATUS_MAX_BYTES:
                    # The status line is incomplete: keep it pending, commit the rest.
                    self._commit(bytes(self._pending[:idx]))
                    del self._pending[:idx]
                    return False
                search_from = idx + 1  # not our line after all
                continue
            digits = bytes(self._pending[start:newline])
            if not digits.isdigit():
                search_from = idx + 1
                continue
            self._commit(bytes(self._pending[:idx]))
            self.status = int(digits)
            self.leftover = bytes(self._pending[newline + 1 :])
            self._pending.clear()
            self.finished = True
            return True
        keep = len(self._marker) - 1  # a suffix that could be the marker's beginning
        if len(self._pending) > keep:
            cut = len(self._pending) - keep
            self._commit(bytes(self._pending[:cut]))
            del self._pending[:cut]
        return False

    def _commit(self, data: bytes, final: bool = False) -> None:
        """Decode output bytes, keeping the head and counting the rest."""
        text = self._decoder.decode(data, final)
        if not self._seen_text:
            text = text.lstrip()
            if not text:
                return
            self._seen_text = True
        self._total += len(text)
        stripped = len(text.rstrip())
        if stripped == 0:
            self._trailing_ws += len(text)
        else:
            self._trailing_ws = len(text) - stripped
        room = self._keep - self._head_len
        if room > 0:
            piece = text[:room]
            self._head.append(piece)
            self._head_len += len(piece)

    def render(self, mask: Callable[[str], str] | None = None) -> str:
        """The stripped, possibly truncated output text (``(no output)`` when empty),
        ``mask``ed before it is cut, so that no part of a secret survives the cut."""
        if not self.finished and self._pending:
            self._commit(bytes(self._pending))
            self._pending.clear()
        self._commit(b"", final=True)
        head = "".join(self._head)
        if mask is not None:
            head = mask(head)
        length = self._total - self._trailing_ws
        if length <= self._limit:
            text = head.rstrip()
            return text if text else "(no output)"
        head = head[: self._limit]
        return f"{head}\n… [output truncated: {len(head)} of {length} characters shown]"

    @property
    def held_bytes(self) -> int:
        """Bytes not yet decoded (for tests that check memory stays bounded)."""
        return len(self._pending)

    @property
    def held_chars(self) -> int:
        """Characters kept for the result (for tests that check memory stays bounded)."""
        return self._head_len
