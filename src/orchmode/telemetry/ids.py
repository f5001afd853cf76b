"""A turn's trace and span IDs: derived from the session, so a resumed turn can link back."""

from __future__ import annotations

import hashlib
import random


def turn_ids(session: str, number: int) -> tuple[int, int]:
    """The trace and root span IDs of a session's turn ``number`` as first run: derived, not
    drawn, so that the run that resumes it can link to it without having recorded them."""
    digest = hashlib.sha256(f"orchmode-turn:{session}:{number}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


class TurnIds:
    """The SDK's random IDs, except the next root span's when one is planned (a turn's)."""

    def __init__(self) -> None:
        self.planned: tuple[int, int] | None = None
        self._root_span: int | None = None

    def trace_id(self) -> int:
        if self.planned is not None:
            trace_id, self._root_span = self.planned
            self.planned = None
            return trace_id
        return random.getrandbits(128) or 1

    def span_id(self) -> int:
        if self._root_span is not None:
            span_id, self._root_span = self._root_span, None
            return span_id
        return random.getrandbits(64) or 1
