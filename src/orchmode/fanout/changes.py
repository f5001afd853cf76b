"""What becomes of the workers' changes when a Workflow call ends: merged in order, or kept.

Every change is saved as a patch file beside the agents' reports (the main agent reads it
from its sandbox). Then, in subtask order, each change the ``merge`` policy lets through is
merged into the working directory by :meth:`.Merges.merge_all` — whole, or not at all. A
change that conflicts with those merged before it (or with the user's edits) goes, under
``resolve = "agent"``, to a resolver (:mod:`.resolve`), one after another in subtask order,
each on the tree as merged so far; a confirmed resolution is merged like any change. The
tool result says per subtask what became of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..core.errors import OrchmodeError
from ..core.events import ChangeSettled, EventBus
from ..core.results import Change
from ..core.settings import MergePolicy
from ..store.result_files import ResultFiles
from ..trees.conflicts import Conflict
from ..trees.merges import Merge
from ..trees.patches import PatchSummary, describe_summary, summary_of
from ..trees.trees import Trees


@dataclass(frozen=True)
class Candidate:
    """One subtask's worker, as the merge step needs it."""

    index: int
    key: str
    change: Change | None
    finished: bool
    #: The verifier's verdict; None when there was no verification.
    verdict: str | None
    #: The subtask as it was given, and the worker's report: what a resolver is told.
    subtask: str = ""
    summary: str = ""


@dataclass(frozen=True)
class Resolution:
    """A resolver's outcome: a change to the tree as merged so far, or why there is none."""

    change: Change | None
    why: str = ""
    #: What the change conflicted with, e.g. "change 1" or "your edits".
    before: str = ""


#: Looks for a resolution an earlier run confirmed (a resumed run merges that one).
Recorded = Callable[[Candidate], Awaitable[Resolution | None]]
#: Resolves a candidate's conflict: the resolver, its verifier, the record of the outcome.
Resolve = Callable[[Candidate, Conflict, str], Awaitable[Resolution]]


#: Looks for a change an earlier run of this call wrote into the working directory: what a
#: resolver resolved it against ("" when it merged cleanly), or None when it was not written.
Written = Callable[[Candidate], Awaitable[str | None]]
#: Records that a change was written (with what its conflict was resolved against).
RecordWritten = Callable[[Candidate, str], Awaitable[None]]


@dataclass(frozen=True)
class Ledger:
    """What this call's earlier runs wrote into the working directory. A change written
    is recorded before the next write begins, so a resumed call merges none of them
    again: a three-way merge of a change already there is only a no-op while nothing
    written after it touched the same lines (a changelog each change appends to)."""

    written: Written
    record: RecordWritten


@dataclass(frozen=True)
class Resolver:
    """How conflicts are resolved in one call (None of it: they are kept as patches)."""

    recorded: Recorded
    resolve: Resolve


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


@dataclass
class _Outcome:
    """What became of one candidate's change, as its line and event say."""

    merge: Merge | None = None
    #: Set when a resolver took part: what the change conflicted with, and, when the
    #: resolution was not merged, why.
    resolved_with: str = ""
    unresolved: str = ""


async def merge_changes(
    trees: Trees,
    results: ResultFiles | None,
    policy: MergePolicy,
    call: int,
    candidates: Sequence[Candidate],
    events: EventBus,
    resolver: Resolver | None = None,
    ledger: Ledger | None = None,
) -> list[str]:
    """Merge what may be merged, in order, resolving conflicts when a resolver is given;
    one ``[change i] …`` line per subtask. With a ``ledger``, the changes an earlier run
    of this call wrote are taken as merged, and each one written now is recorded."""
    held = [hold_back(policy, c) for c in candidates]
    eligible = [
        c
        for c, reason in zip(candidates, held, strict=True)
        if c.change is not None and not c.change.empty and reason is None
    ]
    outcomes = {c.index: _Outcome() for c in eligible}
    written = await _written_before(ledger, eligible, outcomes)
    chosen = [c for c in eligible if c.index not in written]
    # A resolution confirmed by an earlier run of this call stands in for its change.
    earlier: dict[int, Resolution] = {}
    if resolver is not None:
        for candidate in chosen:
            found = await resolver.recorded(candidate)
            if found is not None:
                earlier[candidate.index] = found
    to_merge = [
        earlier[c.index].change if c.index in earlier else c.change for c in chosen
    ]  # fmt: skip
    if to_merge:
        await _merge_chosen(trees, chosen, to_merge, earlier, outcomes, ledger)
    if resolver is not None:
        merged = [
            (c.index, c.change)
            for c in eligible
            if c.index in written and c.change is not None
        ]  # fmt: skip
        merged += [
            (c.index, m)
            for c, m in zip(chosen, to_merge, strict=True)
            if m is not None and _merged(outcomes[c.index])
        ]
        merged.sort(key=lambda pair: pair[0])
        for candidate in chosen:
            outcome = outcomes[candidate.index]
            if _content_conflict(outcome) and candidate.index not in earlier:
                resolution = await _resolve(trees, resolver, candidate, outcome, merged, ledger)
                if resolution is not None:
                    merged.append((candidate.index, resolution))
    return _lines(results, policy, call, candidates, held, outcomes, events)


async def _written_before(
    ledger: Ledger | None, eligible: Sequence[Candidate], outcomes: dict[int, _Outcome]
) -> dict[int, str]:
    """The candidates an earlier run of this call wrote (taken as merged), and what each
    one's conflict was resolved against."""
    written: dict[int, str] = {}
    if ledger is None:
        return written
    for candidate in eligible:
        before = await ledger.written(candidate)
        if before is not None:
            written[candidate.index] = before
            outcomes[candidate.index].merge = Merge("merged")
            outcomes[candidate.index].resolved_with = before
    return written


async def _merge_chosen(
    trees: Trees,
    chosen: Sequence[Candidate],
    to_merge: Sequence[Change | None],
    earlier: dict[int, Resolution],
    outcomes: dict[int, _Outcome],
    ledger: Ledger | None,
) -> None:
    """Merge the chosen changes in one write, and record each one merged."""
    async with _merging(trees):
        merges = await _merge_all(trees, [m for m in to_merge if m is not None])
        for candidate, merge in zip(chosen, merges, strict=True):
            outcomes[candidate.index].merge = merge
            if candidate.index in earlier:
                outcomes[candidate.index].resolved_with = earlier[candidate.index].before
            if ledger is not None and merge.fate == "merged":
                await ledger.record(candidate, outcomes[candidate.index].resolved_with)


def _lines(
    results: ResultFiles | None,
    policy: MergePolicy,
    call: int,
    candidates: Sequence[Candidate],
    held: Sequence[str | None],
    outcomes: dict[int, _Outcome],
    events: EventBus,
) -> list[str]:
    """One line per subtask saying what became of its change (and its event)."""
    lines = []
    for candidate, reason in zip(candidates, held, strict=True):
        change = candidate.change
        if change is None or change.empty:
            lines.append(f"[change {candidate.index}] no change{left_out_note(change)}")
            if change is not None and change.left_out:  # the user is told, not only the model
                left_out = ", ".join(change.left_out)
                events.emit(
                    ChangeSettled(call, candidate.index, "no change", "", 0, 0, "", "", left_out)
                )
            continue
        settled = outcomes.get(candidate.index) if reason is None else None
        line = _settle(results, policy, call, candidate, change, reason, settled, events)
        lines.append(line + left_out_note(change))
    return lines


def left_out_note(change: Change | None) -> str:
    """What a change's line adds for the files left out of it as too big for a patch
    (they stay in the agent's workspace only): "" when none was."""
    if change is None or not change.left_out:
        return ""
    return (
        f"; left out of the change as too big for a patch (not merged, not kept): "
        f"{', '.join(change.left_out)}"
    )


async def _merge_all(trees: Trees, changes: list[Change]) -> list[Merge]:
    try:
        return await trees.merges.merge_all(changes)
    except OrchmodeError as exc:  # git itself failed: every change is kept
        return [Merge("conflict", (f"merging failed: {exc}",)) for _ in changes]


def _merged(outcome: _Outcome) -> bool:
    return outcome.merge is not None and outcome.merge.fate == "merged"


def _content_conflict(outcome: _Outcome) -> bool:
    """A conflict git found between two contents: one an agent can edit away."""
    merge = outcome.merge
    return (
        merge is not None
        and merge.fate == "conflict"
        and not any(d.startswith("merging failed") for d in merge.detail)
    )


async def _resolve(
    trees: Trees,
    resolver: Resolver,
    candidate: Candidate,
    outcome: _Outcome,
    merged: Sequence[tuple[int, Change]],
    ledger: Ledger | None = None,
) -> Change | None:
    """Give ``candidate``'s conflict to a resolver; merge its resolution if confirmed (and
    return it)."""
    change = candidate.change
    assert change is not None
    try:
        async with _merging(trees):
            conflict = await trees.conflicts.conflict_of(change, f"change-{candidate.index}")
            if conflict is None:
                return None  # not a conflict of contents (its snapshot is gone, a file moved)
            touching = [(i, m) for i, m in merged if _touches(m, conflict.files)]
            edited = await trees.conflicts.edited_besides(
                change.base, conflict.files, [m for _, m in touching], conflict.ours
            )
    except OrchmodeError as exc:
        outcome.unresolved = f"its conflict could not be worked out ({exc})"
        return None
    before = conflicting_with([i for i, _ in touching], edited=edited)
    resolution = await resolver.resolve(candidate, conflict, before)
    outcome.resolved_with = before
    if resolution.change is None:
        outcome.unresolved = resolution.why
        return None
    async with _merging(trees):
        (merge,) = await _merge_all(trees, [resolution.change])
        if ledger is not None and merge.fate == "merged":
            await ledger.record(candidate, before)
    if merge.fate != "merged":
        why = "; ".join(merge.detail) or merge.fate
        outcome.unresolved = f"its confirmed resolution no longer merged: {why}"
        return None
    outcome.merge = merge
    return resolution.change


def _touches(change: Change, files: Sequence[str]) -> bool:
    summary = summary_of(change)
    wanted = set(files)
    return isinstance(summary, PatchSummary) and any(
        f.path in wanted or f.old_path in wanted for f in summary.files
    )


def conflicting_with(numbers: Sequence[int], *, edited: bool) -> str:
    """Whose changes a conflict is with: "change 1", "changes 1 and 3", the user's edits,
    or both."""
    mine = "your edits made since the call began"
    if not numbers:
        return mine
    named = (
        f"change {numbers[0]}"
        if len(numbers) == 1
        else f"changes {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"
    )
    return f"{named} and {mine}" if edited else named


def _settle(
    results: ResultFiles | None,
    policy: MergePolicy,
    call: int,
    candidate: Candidate,
    change: Change,
    reason: str | None,
    outcome: _Outcome | None,
    events: EventBus,
) -> str:
    """The subtask's line (its change kept as a file), and its event."""
    i = candidate.index
    files = describe_summary(summary_of(change))
    path = results.write_patch(candidate.key, change.patch) if results is not None else ""
    kept = f"; its patch is kept at {path}" if path else ""
    merge = outcome.merge if outcome is not None else None
    if outcome is None or merge is None:
        fate, detail = ("kept" if policy == "none" else "not merged"), reason or ""
        how = " — apply it yourself with git apply" if path and policy == "none" else ""
        line = f"[change {i}] not merged ({detail}): {files}{kept}{how}"
    else:
        fate, detail = merge.fate, "; ".join(merge.detail)
        if merge.fate == "merged" and outcome.resolved_with:
            detail = f"after resolving a conflict with {outcome.resolved_with}"
            line = f"[change {i}] merged {detail}: {files}"
        elif merge.fate == "merged":
            line = f"[change {i}] merged: {files}"
        elif merge.fate == "no change":
            line = f"[change {i}] no change"
        elif merge.fate == "conflict":
            where = f" in {detail}" if detail else ""
            tried = ""
            if outcome.unresolved:
                tried = f"; a resolver tried, but {outcome.unresolved}"
                detail = f"{detail} ({outcome.unresolved})" if detail else outcome.unresolved
            line = (
                f"[change {i}] conflict{where} (kept as {path or 'no file'}): not applied, "
                f"nothing of it written ({files}){tried} — read it, and apply what still "
                "holds with git apply"
            )
        else:
            line = f"[change {i}] refused ({detail}): {files}{kept}"
    events.emit(change_settled(call, i, fate, change, detail, path))
    return line


def change_settled(
    call: int, index: int, fate: str, change: Change, detail: str, path: str
) -> ChangeSettled:
    """The event saying what became of subtask ``index``'s ``change`` (kept at ``path``)."""
    summary = summary_of(change)
    added = summary.added if isinstance(summary, PatchSummary) else 0
    removed = summary.removed if isinstance(summary, PatchSummary) else 0
    files, left_out = describe_summary(summary), ", ".join(change.left_out)
    return ChangeSettled(call, index, fate, files, added, removed, detail, path, left_out)


@contextlib.asynccontextmanager
async def _merging(trees: Trees) -> AsyncIterator[None]:
    """One merge into a working directory at a time, across processes too."""
    await trees.open()
    fd = os.open(trees.store.home / "merge.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        # A write a killed process left half done is finished before anything reads the
        # directory: what follows sees each change there whole, or not at all.
        await trees.checkout.finish_interrupted_write()
        yield
    finally:
        os.close(fd)  # closing lets the lock go
