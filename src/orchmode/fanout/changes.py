"""What becomes of the workers' changes when a Workflow call ends: merged in order, or kept.

Every change is saved as a patch file beside the agents' reports (the main agent reads it
from its sandbox). Then, in subtask order, each change the ``merge`` policy lets through is
merged into the working directory by :meth:`.Trees.merge` — whole, or not at all — and the
tool result says per subtask what became of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ..core.errors import OrchmodeError
from ..core.events import ChangeSettled, EventBus
from ..core.results import Change
from ..core.settings import MergePolicy
from ..store.result_files import ResultFiles
from ..trees.copies import Merge, Trees
from ..trees.patches import PatchSummary, describe_summary, summary_of


@dataclass(frozen=True)
class Candidate:
    """One subtask's worker, as the merge step needs it."""

    index: int
    key: str
    change: Change | None
    finished: bool
    #: The verifier's verdict; None when there was no verification.
    verdict: str | None


def hold_back(policy: MergePolicy, candidate: Candidate) -> str | None:
    """Why ``candidate``'s change is not merged, or None when it is to be merged."""
    if not candidate.finished:
        return "the agent did not finish"
    if policy == "none":
        return "merge = none"
    if policy == "all" or candidate.verdict == "confirmed":
        return None
    if candidate.verdict == "refuted":
        return "refuted"
    if candidate.verdict is None:
        return "not verified"
    return "its verdict was unclear"


async def settle_changes(
    trees: Trees,
    results: ResultFiles | None,
    policy: MergePolicy,
    call: int,
    candidates: Sequence[Candidate],
    events: EventBus,
) -> list[str]:
    """Merge what may be merged, in order; one ``[change i] …`` line per subtask."""
    held = [hold_back(policy, c) for c in candidates]
    to_merge = [
        c.change
        for c, reason in zip(candidates, held, strict=True)
        if c.change is not None and not c.change.empty and reason is None
    ]
    merges: list[Merge] = []
    if to_merge:
        async with _merging(trees):
            try:
                merges = await trees.merge_all(to_merge)
            except OrchmodeError as exc:  # git itself failed: every change is kept
                merges = [Merge("conflict", (f"merging failed: {exc}",)) for _ in to_merge]
    outcomes = iter(merges)
    lines = []
    for candidate, reason in zip(candidates, held, strict=True):
        change = candidate.change
        if change is None or change.empty:
            lines.append(f"[change {candidate.index}] no change")
            continue
        merge = next(outcomes) if reason is None else None
        lines.append(_settle(results, policy, call, candidate, change, reason, merge, events))
    return lines


def _settle(
    results: ResultFiles | None,
    policy: MergePolicy,
    call: int,
    candidate: Candidate,
    change: Change,
    reason: str | None,
    merge: Merge | None,
    events: EventBus,
) -> str:
    """The subtask's line (its change kept as a file), and its event."""
    i = candidate.index
    summary = summary_of(change)
    files = describe_summary(summary)
    added = summary.added if isinstance(summary, PatchSummary) else 0
    removed = summary.removed if isinstance(summary, PatchSummary) else 0
    path = results.write_patch(candidate.key, change.patch) if results is not None else ""
    kept = f"; its patch is kept at {path}" if path else ""
    if merge is None:
        fate, detail = ("kept" if policy == "none" else "not merged"), reason or ""
        how = " — apply it yourself with git apply" if path and policy == "none" else ""
        line = f"[change {i}] not merged ({detail}): {files}{kept}{how}"
    else:
        fate, detail = merge.fate, "; ".join(merge.detail)
        if merge.fate == "merged":
            line = f"[change {i}] merged: {files}"
        elif merge.fate == "no change":
            line = f"[change {i}] no change"
        elif merge.fate == "conflict":
            line = (
                f"[change {i}] conflict in {detail or 'the tree'}: not applied, nothing of it "
                f"written ({files}){kept} — read it, and apply what still holds with "
                "git apply"
            )
        else:
            line = f"[change {i}] refused ({detail}): {files}{kept}"
    events.emit(ChangeSettled(call, i, fate, files, added, removed, detail, path))
    return line


@contextlib.asynccontextmanager
async def _merging(trees: Trees) -> AsyncIterator[None]:
    """One merge into a working directory at a time, across processes too."""
    await trees.open()
    fd = os.open(trees.home / "merge.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing lets the lock go
