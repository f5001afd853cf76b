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

from .events import ChangeSettled, EventBus
from .patches import PatchSummary
from .results import ResultFiles
from .settings import MergePolicy
from .trees import Change, Trees


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
    lines: list[str] = []
    async with _merging(trees):
        for candidate in candidates:
            lines.append(await _settle(trees, results, policy, call, candidate, events))
    return lines


async def _settle(
    trees: Trees,
    results: ResultFiles | None,
    policy: MergePolicy,
    call: int,
    candidate: Candidate,
    events: EventBus,
) -> str:
    i = candidate.index
    change = candidate.change
    if change is None or change.empty:
        return f"[change {i}] no change"
    summary = change.summary()
    files = summary.describe() if isinstance(summary, PatchSummary) else "an unreadable patch"
    added = summary.added if isinstance(summary, PatchSummary) else 0
    removed = summary.removed if isinstance(summary, PatchSummary) else 0
    path = results.write_patch(candidate.key, change.patch) if results is not None else ""
    kept = f"; its patch is kept at {path}" if path else ""
    reason = hold_back(policy, candidate)
    if reason is not None:
        fate, detail = ("kept" if policy == "none" else "not merged"), reason
        how = " — apply it yourself with git apply" if path and policy == "none" else ""
        line = f"[change {i}] not merged ({reason}): {files}{kept}{how}"
    else:
        merge = await trees.merge(change)
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
