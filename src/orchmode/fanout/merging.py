"""Merging a Workflow call's workers' changes, in the order they were asked for.

At the top of a tree the changes go into the working directory, once each, however often
the call is resumed (a ledger in the journal says which were written). The changes of a
nested call's workers go into the live workspace of the worker that made the call, never
into the working directory: that worker's own change then holds them, and the level above
merges it once. Its workspace is new on every run, so no ledger is needed there; and a
conflict there is the parent's to settle (it is told, with the patch's file), not a
resolver's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core.errors import OrchmodeError
from ..core.results import AgentResult
from ..executors import TreeJob
from ..trees.nested import AGENT_WORKSPACE, ChildChange, merge_into_workspace
from .changes import (
    Candidate,
    Ledger,
    Resolver,
    change_settled,
    hold_back,
    left_out_note,
    merge_changes,
)
from .nesting import LEVEL
from .plans import verdict_of
from .resolve import record_written, recorded_resolution, resolve, written_before

if TYPE_CHECKING:
    from .engine import FanoutEngine

log = logging.getLogger("orchmode")


async def merge_workers(
    engine: FanoutEngine,
    call: int,
    tree: TreeJob,
    done: list[tuple[int, str, AgentResult, AgentResult | None]],
) -> list[str]:
    """Merge the workers' changes in order (see :mod:`.changes`); a line per subtask.
    ``done``: each subtask's index, prompt, worker and verifier."""
    return await merge_verdicts(
        engine,
        call,
        tree,
        [
            (
                index,
                subtask,
                worker,
                verdict_of(verifier.text) if verifier is not None and verifier.finished else None,
            )
            for index, subtask, worker, verifier in done
        ],
    )


async def merge_verdicts(
    engine: FanoutEngine,
    call: int,
    tree: TreeJob,
    done: list[tuple[int, str, AgentResult, str | None]],
) -> list[str]:
    """The same, given each worker's verdict (None: not verified). A change is named by
    its worker's journal key."""
    if engine.trees is None:
        return []
    candidates = [
        Candidate(index, worker.key, worker.change, worker.finished, verdict, subtask, worker.text)
        for index, subtask, worker, verdict in done
    ]
    if LEVEL.get().nested:
        return await _merge_into_parent(engine, call, candidates)
    resolver = None
    if engine.settings.resolve == "agent":
        resolver = Resolver(
            lambda candidate: recorded_resolution(engine, candidate),
            lambda candidate, conflict, before: resolve(
                engine, call, candidate, conflict, before, tree
            ),
        )
    session, place = engine.budget.session, engine.top_calls.get(call, call)
    ledger = Ledger(
        lambda candidate: written_before(engine, session, place, candidate),
        lambda candidate, before: record_written(engine, session, place, candidate, before),
    )
    try:
        lines = await merge_changes(
            engine.trees,
            engine.results,
            engine.settings.merge,
            call,
            candidates,
            engine.events,
            resolver,
            ledger,
        )
        await engine.finish_housekeeping()  # the resolvers' results recorded, their shells closed
        return lines
    except OrchmodeError as exc:
        log.warning("merging the workers' changes failed: %s", exc)
        return [
            f"[change {c.index}] not merged: merging failed ({exc})"
            if c.change is not None and not c.change.empty
            else f"[change {c.index}] no change"
            for c in candidates
        ]


async def _merge_into_parent(
    engine: FanoutEngine, call: int, candidates: list[Candidate]
) -> list[str]:
    """A nested call's changes merged into the workspace of the worker that made the call
    (it waits on the call meanwhile); each kept as a patch file too."""
    here = AGENT_WORKSPACE.get()
    policy, results = engine.settings.merge, engine.results
    children = [
        ChildChange(
            c.index,
            c.change,
            hold_back(policy, c),
            results.write_patch(c.key, c.change.patch)
            if results is not None and c.change is not None and not c.change.empty
            else "",
        )
        for c in candidates
    ]

    def settled(child: ChildChange, fate: str, detail: str) -> None:
        if child.change is None or child.change.empty:
            return
        engine.events.emit(
            change_settled(call, child.index, fate, child.change, detail, child.kept)
        )

    if here is None:  # not reached (child_tree makes no copies without it): never write
        lines = [
            f"[change {c.index}] not merged (its parent's workspace is not open here)"
            + (f"; its patch is kept at {c.kept}" if c.kept else "")
            for c in children
        ]
    else:
        workspace = await here.opened()
        lines = await merge_into_workspace(workspace, here.shell, children, settled)
    return [line + left_out_note(c.change) for line, c in zip(lines, candidates, strict=True)]
