"""Merging a Workflow call's workers' changes, in the order they were asked for.

At the top of a tree the changes go into the working directory; the changes of a nested
call's workers belong in their parent's workspace, which the trees layer provides (until
then they take the top's path: see :func:`~.nesting.child_tree`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core.errors import OrchmodeError
from ..core.results import AgentResult
from ..executors import TreeJob
from .changes import Candidate, Ledger, Resolver, merge_changes
from .plans import verdict_of
from .resolve import record_written, recorded_resolution, resolve, written_before

if TYPE_CHECKING:
    from .engine import FanoutEngine

log = logging.getLogger("orchmode")


async def merge_workers(
    engine: FanoutEngine,
    call: int,
    tree: TreeJob,
    done: list[tuple[int, str, str, AgentResult, AgentResult | None]],
) -> list[str]:
    """Merge the workers' changes in order (see :mod:`.changes`); a line per subtask."""
    return await merge_verdicts(
        engine,
        call,
        tree,
        [
            (
                index,
                key,
                subtask,
                worker,
                verdict_of(verifier.text) if verifier is not None and verifier.finished else None,
            )
            for index, key, subtask, worker, verifier in done
        ],
    )


async def merge_verdicts(
    engine: FanoutEngine,
    call: int,
    tree: TreeJob,
    done: list[tuple[int, str, str, AgentResult, str | None]],
) -> list[str]:
    """The same, given each worker's verdict (None: not verified)."""
    if engine.trees is None:
        return []
    candidates = [
        Candidate(index, key, worker.change, worker.finished, verdict, subtask, worker.text)
        for index, key, subtask, worker, verdict in done
    ]
    resolver = None
    if engine.settings.resolve == "agent":
        resolver = Resolver(
            lambda candidate: recorded_resolution(engine, candidate),
            lambda candidate, conflict, before: resolve(
                engine, call, candidate, conflict, before, tree
            ),
        )
    session = engine.budget.session
    ledger = Ledger(
        lambda candidate: written_before(engine, session, call, candidate),
        lambda candidate, before: record_written(engine, session, call, candidate, before),
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
