"""A script's tool result: its value held to its budget, its log, its error worded for the model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..core.events import ResultCondensed
from ..model.context import CHARS_PER_TOKEN, estimate_tokens
from .condense import fit_value
from .engine import FanoutEngine
from .script_calls import plain
from .script_sandbox import ScriptError

#: Characters of a script's value shown at most, whatever its token budget; a larger one is
#: condensed, and saved whole.
RESULT_LIMIT = 100_000
#: Tokens of a script's result kept for its budget line and notes, besides value and log.
VALUE_MARGIN = 200


@dataclass
class ScriptLog:
    """The lines the model sees under the result: ``log()`` calls and ``print()`` output."""

    limit: int
    lines: list[str] = field(default_factory=list)
    dropped: int = 0
    _size: int = 0
    _partial: str = ""

    def add(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            room = self.limit - self._size
            if room <= 0:
                self.dropped += 1
                continue
            if len(line) > room:  # the line that fills the log is cut, not lost
                line = line[:room] + "…"
            self.lines.append(line)
            self._size += len(line) + 1

    def printed(self, _stream: str, text: str) -> None:
        """The sandbox's ``print()``, which arrives in pieces: whole lines go to the log."""
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.add(line)

    def render(self) -> str:
        if self._partial:
            self.add(self._partial)
            self._partial = ""
        if not self.lines and not self.dropped:
            return ""
        more = f"\n[orchmode: {self.dropped} more log lines were dropped]" if self.dropped else ""
        return "[log]\n" + "\n".join(self.lines) + more


def render_output(output: object) -> str:
    """The return value as JSON text, whole (:func:`fit_output` holds it to its budget)."""
    text = json.dumps(plain(output), ensure_ascii=False)
    if output is None:
        text += (
            "\n\n[orchmode: the script returned nothing — its result is the value of its last "
            "line when that line is an expression, e.g. `results`]"
        )
    return text


def agents_phrase(count: int) -> str:
    return f"{count} agent" if count == 1 else f"{count} agents"


def fit_output(
    engine: FanoutEngine, call: int, source: str, value: str, log_text: str, tokens: int = 0
) -> str:
    """The value within what is left of the result's budget (``tokens``, or the window's
    share for one result) once the log is in; a larger one is condensed and saved whole."""
    budget = tokens or engine.window.result_tokens
    room = max(budget - estimate_tokens(log_text) - VALUE_MARGIN, budget // 4)
    room = min(room, RESULT_LIMIT // CHARS_PER_TOKEN)
    if estimate_tokens(value) <= room:
        return value
    saved = None
    if engine.results is not None:
        saved = engine.results.write_text("script", source, value)
    fitted, note = fit_value(value, room, saved)
    engine.events.emit(
        ResultCondensed(
            call,
            estimate_tokens(value),
            estimate_tokens(fitted) + estimate_tokens(note),
            budget,
            note.removeprefix("[orchmode: ").removesuffix("]"),
            saved or "",
        )
    )
    return f"{fitted}\n{note}"


def error_text(error: ScriptError, source: str) -> str:
    """The error's message with the line it stopped at, that line's code and the trace."""
    head = error.message
    if error.line is not None:
        head = f"{head} (line {error.line})"
        code = _source_line(source, error.line)
        if code:
            head += f"\n    {error.line} | {code}"
    if error.trace:
        head += f"\n{error.trace}"
    return f"error: {head}"


def _source_line(source: str, line: int) -> str:
    lines = source.splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""
