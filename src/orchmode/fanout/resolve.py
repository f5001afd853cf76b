"""Conflicts resolved by an agent: a resolver edits the conflict away, a verifier checks it.

A change to be merged that conflicts with the tree as merged so far (the changes merged
before it, and the user's edits since the call began) is given to a **resolver**: a
subagent in a fresh workspace on that tree, with the change merged in and git's conflict
markers where the two disagree. Its first message gives the subtask as it was given, the
worker's report, what the change conflicts with, and every conflicted hunk. Its result is
verified again, by a verifier that knows both intents; only a confirmed resolution is
merged. Resolvers go through the one path every agent takes (journal, claim, budget, slot,
executor), so a resumed run finds a finished resolution in the journal.

Each change written into the working directory is recorded too (:func:`record_written`),
before the next write begins: a resumed call takes it as merged instead of merging it
again onto a tree that later changes have written over.

Once confirmed, the resolution is recorded in the journal as a change to the tree as merged
so far, before it is written: a run killed at any point after that merges that same
resolution when resumed (a three-way merge, so a resolution already written is not
written twice) instead of resolving again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from ..core.events import Role
from ..core.prompts import (
    SUBAGENT_SYSTEM,
    resolve_prompt,
    verify_resolution_prompt,
)
from ..core.results import AgentResult, Change, Status, summary_of
from ..core.settings import Settings
from ..store import Store, content_key
from ..trees.conflicts import Conflict
from ..trees.patches import describe_change
from ..trees.trees import Trees
from .changes import Candidate, Resolution
from .plans import verdict_of
from .slots import VERIFIER_PRIORITY, WORKER_PRIORITY

if TYPE_CHECKING:
    from ..executors import TreeJob


class Engine(Protocol):
    """What resolving needs of the fan-out engine: the one path agents take, and the store."""

    settings: Settings

    @property
    def trees(self) -> Trees | None: ...

    @property
    def store(self) -> Store: ...

    async def run_subagent(
        self,
        call: int,
        index: int,
        role: Role,
        prompt: str,
        priority: int,
        *,
        tree: TreeJob | None = None,
    ) -> AgentResult: ...


def resolution_key(engine: Engine, candidate: Candidate) -> str:
    """Where a confirmed resolution of ``candidate``'s change is recorded in the journal."""
    assert candidate.change is not None
    return content_key(
        role="resolver",
        model=engine.settings.model_for("resolver"),
        effort=engine.settings.effort_for("resolver"),
        system=SUBAGENT_SYSTEM,
        tools=[],
        prompt=f"resolution of {candidate.key} {candidate.change.digest}",
        isolation="worktree",
    )


async def recorded_resolution(engine: Engine, candidate: Candidate) -> Resolution | None:
    """A resolution confirmed by an earlier run (killed before it finished merging)."""
    recorded = await engine.store.lookup(resolution_key(engine, candidate))
    if recorded is None or recorded.change is None:
        return None
    return Resolution(recorded.change, before=recorded.text)


def written_key(engine: Engine, session: str, call: int, candidate: Candidate) -> str:
    """Where the journal says ``candidate``'s change was written into the working directory
    by this session's call ``call`` (another session, or call, writes it afresh)."""
    assert candidate.change is not None
    return content_key(
        role="resolver",
        model="",
        effort="",
        system="",
        tools=[],
        prompt=f"written: session {session} call {call} {candidate.key} {candidate.change.digest}",
        isolation="worktree",
    )


async def written_before(
    engine: Engine, session: str, call: int, candidate: Candidate
) -> str | None:
    """What ``candidate``'s change was resolved against ("" for none) when an earlier run of
    this call wrote it into the working directory; None when none did."""
    recorded = await engine.store.lookup(written_key(engine, session, call, candidate))
    return recorded.text if recorded is not None else None


async def record_written(
    engine: Engine, session: str, call: int, candidate: Candidate, before: str
) -> None:
    """Record that ``candidate``'s change is written (before the next write begins)."""
    await engine.store.record(
        written_key(engine, session, call, candidate),
        "resolver",
        f"change {candidate.index} of call {call} written",
        AgentResult(before, Status.FINISHED),
    )


async def resolve(
    engine: Engine,
    call: int,
    candidate: Candidate,
    conflict: Conflict,
    before: str,
    tree: TreeJob,
) -> Resolution:
    """Run the resolver and its verifier; the confirmed resolution, recorded, or why not."""
    trees = engine.trees
    change = candidate.change
    assert trees is not None and change is not None
    messages = "\n".join(conflict.messages)
    prompt = resolve_prompt(candidate.subtask, candidate.summary, before, messages, conflict.hunks)
    workspace = replace(tree, base=change.base, patch=conflict.patch, writable=True, chain="")
    index = candidate.index
    resolver = await engine.run_subagent(
        call, index, "resolver", prompt, WORKER_PRIORITY, tree=workspace.for_subtask(call, index)
    )
    failed = _failure(resolver)
    if failed:
        return Resolution(None, failed, before)
    assert resolver.change is not None
    resolved = await _resolved_tree(trees, conflict, resolver.change)
    if resolved is None:
        return Resolution(None, "the resolver's change does not apply to the conflict", before)
    left = await trees.conflicts.markers_left(resolved, conflict)
    if left:
        return Resolution(None, f"conflict markers are left in {', '.join(left)}", before)
    if engine.settings.verify:
        check, view = await _check(trees, candidate, conflict, before, tree, resolver, resolved)
        why = await _verify(engine, call, index, check, view)
        if why:
            return Resolution(None, why, before)
    resolution = Change(conflict.ours, await trees.store.diff(conflict.ours, resolved))
    # Recorded before it is written: a run killed from here on merges this very resolution.
    await engine.store.record(
        resolution_key(engine, candidate),
        "resolver",
        f"resolution of change {index} of call {call}",
        AgentResult(before, Status.FINISHED, change=resolution),
    )
    return Resolution(resolution, before=before)


async def _resolved_tree(trees: Trees, conflict: Conflict, ours: Change) -> str | None:
    """The tree the resolver's change makes of the conflict's, or None if it does not apply."""
    if ours.empty:
        return conflict.tree
    # Known already when the resolver ran here (read from its layer); else applied.
    known = ours.base == conflict.commit
    resolved = await trees.merges.merge_ahead(ours) if known else None
    if resolved is None:
        resolved = await trees.store.tree_with(conflict.tree, ours.patch)
    return resolved


async def _check(
    trees: Trees,
    candidate: Candidate,
    conflict: Conflict,
    before: str,
    tree: TreeJob,
    resolver: AgentResult,
    resolved: str,
) -> tuple[str, TreeJob]:
    """The verifier's prompt, and its read-only view of the change as resolved."""
    change = candidate.change
    assert change is not None
    whole = Change(change.base, await trees.store.diff(change.base, resolved))
    check = verify_resolution_prompt(
        candidate.subtask,
        candidate.summary,
        before,
        conflict.hunks,
        resolver.text,
        describe_change(Change(conflict.ours, await trees.store.diff(conflict.ours, resolved))),
    )
    return check, replace(tree, base=whole.base, patch=whole.patch, writable=False, chain="")


async def _verify(engine: Engine, call: int, index: int, check: str, view: TreeJob) -> str:
    """Run a verifier on the resolution; why it is not confirmed ("" when it is)."""
    verifier = await engine.run_subagent(
        call, index, "verifier", check, VERIFIER_PRIORITY, tree=view
    )
    verdict = verdict_of(verifier.text) if verifier.finished else None
    if verdict == "confirmed":
        return ""
    why = f"its resolution was {verdict or 'not verified'}"
    if verifier.finished:
        why += f": {_first_line(verifier.text)}"
    return why


def _failure(resolver: AgentResult) -> str:
    if resolver.status is Status.SKIPPED:
        return "no resolver was run: the session's budget is used up"
    if not resolver.finished:
        return f"the resolver did not finish ({resolver.status.value})"
    if resolver.change is None:
        return "the resolver did not work in a copy of the tree"
    return ""


def _first_line(text: str) -> str:
    """A verifier's summary, in short."""
    summary = summary_of(text).strip()
    return summary.splitlines()[0][:200] if summary else ""
