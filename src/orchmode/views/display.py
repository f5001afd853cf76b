"""How a run shows its progress on stderr: a Rich live view, plain lines, or JSON lines.

Kept apart from :mod:`orchmode.views.live` so choosing a mode, and the plain and JSON outputs,
never import Rich: only the live view pays for it, and ``orchmode --help`` stays quick.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol, TextIO

from ..core.events import Event
from ..core.wire import JsonRecord
from ..records.totals import SessionTotals
from .escape import json_visible, visible
from .progress import StderrProgress

DisplayMode = Literal["live", "plain", "json"]


def choose_mode(*, json_lines: bool, plain: bool, stream: TextIO) -> DisplayMode:
    """The flags decide; without one, a terminal gets the live view and a pipe plain lines."""
    if json_lines:
        return "json"
    if plain:
        return "plain"
    isatty = getattr(stream, "isatty", None)
    return "live" if isatty is not None and isatty() else "plain"


def event_record(event: Event) -> JsonRecord:
    """An event as a JSON-ready dict: its kind, then its fields, nested usage included.

    ``kind`` is always the event's kind; a field of the same name (``ApprovalRequested``'s:
    command, domain or mcp) is written as ``kind_`` rather than lost.
    """
    fields = asdict(event)
    if "kind" in fields:
        fields["kind_"] = fields.pop("kind")
    return {"kind": type(event).__name__, **fields}


@dataclass
class JsonLines:
    """One JSON object per event per line, for programs that watch a run."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)

    def __call__(self, event: Event) -> None:
        self.write(event_record(event))

    def write(self, record: Mapping[str, object]) -> None:
        # JSON writes C0 controls as \u00XX itself; the rest are escaped the same way
        print(json_visible(json.dumps(record, ensure_ascii=False)), file=self.stream, flush=True)


class Display(Protocol):
    """What a run needs from its progress output: events in, notices out, a final stop."""

    def __call__(self, event: Event) -> None: ...

    def notice(self, text: str) -> None:
        """orchmode's own remarks (``[session] resuming …``), in the display's format."""

    def stop(self) -> None:
        """Leave the terminal tidy: called when a turn is cut short and at the end."""


@dataclass
class PlainDisplay:
    stream: TextIO = field(default_factory=lambda: sys.stderr)

    def __post_init__(self) -> None:
        self._progress = StderrProgress(self.stream)

    def __call__(self, event: Event) -> None:
        self._progress(event)

    def notice(self, text: str) -> None:
        print(visible(text), file=self.stream, flush=True)

    def stop(self) -> None:
        pass


@dataclass
class JsonDisplay:
    """Events and notices alike are JSON lines, so every line on stderr parses."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)

    def __post_init__(self) -> None:
        self._lines = JsonLines(self.stream)

    def __call__(self, event: Event) -> None:
        self._lines(event)

    def notice(self, text: str) -> None:
        self._lines.write({"kind": "Notice", "text": text})

    def stop(self) -> None:
        pass


def make_display(mode: DisplayMode, totals: SessionTotals, stream: TextIO | None = None) -> Display:
    """The display for ``mode``, writing to ``stream`` (stderr unless told otherwise)."""
    out = stream or sys.stderr
    if mode == "json":
        return JsonDisplay(out)
    if mode == "live":
        from .live import LiveView  # Rich is imported only here

        return LiveView.on_stream(out, totals)
    return PlainDisplay(out)
