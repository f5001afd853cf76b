"""The words for what an event says, shared by the live lines, ``show`` and the report.

The read model of a run (:mod:`.history`) describes its compactions, condensed results,
settled changes and fan-outs with these, and the live views say the same things the same
way, so the wording lives here, below both.
"""

from __future__ import annotations

from ..core.events import ChangeSettled, ContextCompacted, ResultCondensed
from ..store.result_files import RESULTS_DIR

#: How an agent's end reads where its status alone would mislead: a budget stop is no failure.
STATUS_WORDS = {"budget": "stopped by its budget"}


def status_words(status: str) -> str:
    """An agent's status as a reader sees it: ``stopped by its budget``, else as recorded."""
    return STATUS_WORDS.get(status, status)


def seconds(value: float) -> str:
    """A duration as a reader sees it: ``4.2 s``, ``3 min 07 s``, ``1 h 02 min``."""
    if value < 60:
        return f"{value:.1f} s"
    minutes, rest = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def compaction_text(event: ContextCompacted) -> str:
    """What a compaction did, in words: one wording for the progress lines, show and the report.

    It says why the conversation shrank, so a reader who sees an agent forget a tool result
    knows where its saved copy is, or that it is gone.
    """
    sizes = f"{event.tokens_before:,} → {event.tokens_after:,} tokens"
    detail = event.detail or "old tool results"
    match event.how:
        case "stubbed":
            what = f"stubbed {detail} (saved copies under {RESULTS_DIR}/)"
        case "api":
            what = "the API's context editing cleared old tool results"
            what += f" ({event.detail})" if event.detail else ""
        case "dropped":
            what = "nothing more could be stubbed, so the part of the turn that could not fit "
            what += "was let go" + (f" ({event.detail})" if event.detail else "")
        case how:  # a kind this orchmode does not know: say what the record says
            what = how + (f": {event.detail}" if event.detail else "")
    refused = "; the API refused the request as too long, and it is being retried"
    return f"{sizes} — {what}{refused if event.refused else ''}"


def condensed_text(event: ResultCondensed) -> str:
    """How much of a Workflow result the model saw, what it missed, and where the rest is."""
    line = (
        f"result condensed to {event.tokens_shown:,} of {event.tokens_full:,} tokens "
        f"(budget {event.budget:,})"
    )
    if event.omitted:
        line += f": {event.omitted}"
    if event.path:
        line += f"; full result: {event.path}"
    return line


def change_fate(event: ChangeSettled) -> str:
    """A worker's change's fate, and why: ``conflict in a.py``, ``not merged (refuted)``,
    ``merged after resolving a conflict with change 1``."""
    if event.fate == "merged":
        return "merged" + (f" {event.detail}" if event.detail else "")
    if event.fate == "conflict":
        return f"conflict in {event.detail or 'the tree'}"
    return event.fate + (f" ({event.detail})" if event.detail else "")
