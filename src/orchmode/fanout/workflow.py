"""The Workflow tool: read the call, fan out its subtasks, verify each result, format it.

A call carries either a flat list of ``subtasks`` (run here) or a ``script``, an
orchestration program run by :mod:`.script`; both start every agent through the engine
(:meth:`.FanoutEngine.run_subagent`), so the journal, claims, budget and slots treat them
alike.

Each subtask is a chain — its worker, then a verifier that tries to refute the worker's
result — and every chain runs as its own coroutine, so a result's verification starts the
moment that result exists. Verifiers take free slots before queued workers, so finished
pairs reach the journal early. The tool result keeps the spec's order regardless.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from ..core.errors import OrchmodeError
from ..core.events import FanoutDone, FanoutStarted
from ..core.results import AgentResult, Status
from ..executors import TreeJob
from ..store import BudgetState
from .condense import AgentEntry, SubtaskEntry
from .engine import SKIPPED, FanoutEngine
from .merging import merge_workers
from .nesting import LEVEL, too_deep
from .plans import (
    BAD_ISOLATION,
    Plan,
    Subtask,
    isolation_for,
    isolation_of,
    plan_subtasks,
    title,
    workflow_form,
)
from .slots import VERIFIER_PRIORITY, WORKER_PRIORITY, Relay


class Workflow(FanoutEngine):
    """The session's Workflow tool: the engine, plus the flat fan-out and the call's result."""

    async def run(self, tool_input: object, tokens: int | None = None) -> tuple[str, bool]:
        """The tool result text and whether it is an error.

        ``tokens`` is the most the result may take (default: the window's share for one
        result); a larger one is condensed, and the whole of it saved to a file.
        """
        if tokens is None:
            tokens = self.window.result_tokens
        deep = too_deep(self)
        if deep is not None:
            return deep, True
        form = workflow_form(tool_input)
        isolation = isolation_of(tool_input, self.settings.isolation)
        if isolation is None:
            return BAD_ISOLATION, True
        if LEVEL.get().tree is not None:  # under a worker in a copy: never the user's tree
            isolation = "worktree"
        await self._list_tools()
        if form == "script" and isinstance(tool_input, dict):
            from .script import run_script  # the sandbox is loaded only when a script comes

            return await run_script(
                self, self.number_call(), tool_input["script"], tokens, isolation
            )
        if form != "subtasks":
            return form, True
        plan = plan_subtasks(tool_input, self.settings.max_subtasks, self.roles)
        if isinstance(plan, str):
            return plan, True
        return await self._fan_out(plan, isolation, tokens, tool_input)

    async def _fan_out(
        self, plan: Plan, isolation: str, tokens: int, tool_input: object
    ) -> tuple[str, bool]:
        """Run a flat plan's chains side by side, merge their changes, and write the result."""
        subtasks = [
            Subtask(prompt, plan.schema_of(n), plan.agent_of(n), plan.budget_of(n))
            for n, prompt in enumerate(plan.subtasks)
        ]
        wanted = [isolation_for(isolation, subtask.agent) for subtask in subtasks]
        try:
            tree = await self.tree_for("worktree" if "worktree" in wanted else "shared", ahead=True)
        except OrchmodeError as exc:
            return _no_copies(exc), True
        trees = [tree if where == "worktree" else None for where in wanted]
        call = self.number_call()
        started = time.monotonic()
        level = LEVEL.get()
        self.events.emit(
            FanoutStarted(call, len(subtasks), plan.not_run, level.parent, level.depth)
        )
        chains = [
            asyncio.create_task(self._chain(call, i, subtask, own))
            for i, (subtask, own) in enumerate(zip(subtasks, trees, strict=True), start=1)
        ]
        try:
            if tree is not None:
                tree = await tree.with_snapshot()  # taken while the first requests are in flight
            pairs = await asyncio.gather(*chains)
        except OrchmodeError as exc:  # the snapshot could not be taken: nothing is kept
            return _no_copies(exc, started=True), True
        finally:
            for chain in chains:
                chain.cancel()
            await asyncio.gather(*chains, return_exceptions=True)
            await self.finish_housekeeping()
        self.events.emit(FanoutDone(call, time.monotonic() - started))
        changes = await self._changes(call, tree, trees, subtasks, pairs)
        budget = await self.store.budget(self.budget.session)  # resolvers counted too
        head = [plan.note] if plan.note else []
        skipped = [i for i, (worker, _) in enumerate(pairs, start=1) if worker.status is SKIPPED]
        unverified = [
            i
            for i, (worker, verifier) in enumerate(pairs, start=1)
            if verifier is not None and verifier.status is SKIPPED and worker.status is not SKIPPED
        ]
        if skipped or unverified:
            head.append(self._budget_note(skipped, unverified, budget))
        entries = self._entries(subtasks, pairs, changes)
        tail = [self.budget_status(budget)]
        return self.fit(call, head, entries, tail, tokens, tool_input), False

    async def _changes(
        self,
        call: int,
        tree: TreeJob | None,
        trees: list[TreeJob | None],
        subtasks: list[Subtask],
        pairs: list[tuple[AgentResult, AgentResult | None]],
    ) -> list[str]:
        """Each subtask's line about its merged change ("" for one in the shared tree)."""
        changes = [""] * len(pairs)
        if tree is None:
            return changes
        isolated = [i for i, own in enumerate(trees, start=1) if own is not None]
        lines = await merge_workers(
            self,
            call,
            tree,
            [(i, subtasks[i - 1].prompt, *pairs[i - 1]) for i in isolated],
        )
        for i, line in zip(isolated, lines, strict=True):
            changes[i - 1] = line
        return changes

    def _entries(
        self,
        subtasks: list[Subtask],
        pairs: list[tuple[AgentResult, AgentResult | None]],
        changes: list[str],
    ) -> list[SubtaskEntry]:
        """Each subtask's part of the tool result: its worker's, its verifier's, its change."""
        return [
            SubtaskEntry(
                title(s.prompt),
                AgentEntry(worker.text, self.report_path("worker", worker)),
                None
                if verifier is None
                else AgentEntry(verifier.text, self.report_path("verifier", verifier)),
                change,
            )
            for s, (worker, verifier), change in zip(subtasks, pairs, changes, strict=True)
        ]

    def _budget_note(self, skipped: list[int], unverified: list[int], budget: BudgetState) -> str:
        parts = []
        if skipped:
            parts.append(f"subtasks {_numbers(skipped)} were not run")
        if unverified:
            parts.append(f"the results of subtasks {_numbers(unverified)} were not verified")
        return (
            f"[orchmode: the session's budget is used up ({self.budget.describe(budget)}): "
            f"{' and '.join(parts)}. Rerunning them needs more budget: narrow the work to "
            "what matters most, or ask the user to raise --max-subagents, "
            "--max-session-tokens or --max-cost.]"
        )

    async def _chain(
        self, call: int, index: int, subtask: Subtask, tree: TreeJob | None = None
    ) -> tuple[AgentResult, AgentResult | None]:
        agent = subtask.agent
        verified = self.settings.verify and (agent is None or agent.verify)
        relay = Relay(self.slots) if verified else None
        if tree is not None:
            tree = tree.for_subtask(call, index)
            if agent is not None and agent.shell == "read":
                tree = replace(tree, writable=False)  # its bash only reads the tree
        try:
            worker = await self.run_subagent(
                call,
                index,
                "worker",
                subtask.prompt,
                WORKER_PRIORITY,
                hand_on=relay,
                tree=tree,
                schema=subtask.schema,
                agent=agent,
                limits=subtask.budget,
            )
            if relay is None:
                return worker, None
            if worker.status is Status.FAILED:
                return worker, AgentResult(
                    "[orchmode: not verified, because the agent failed]", Status.FAILED
                )
            if worker.status is SKIPPED:
                return worker, AgentResult(
                    "[orchmode: not verified, because it was not run]", SKIPPED
                )
            if worker.status is Status.REFUSAL:
                return worker, AgentResult(
                    "[orchmode: not verified, because the model refused the subtask: "
                    "there is nothing to verify]",
                    Status.REFUSAL,
                )
            if tree is not None:
                tree = await tree.with_snapshot()
            if self.trees is not None and worker.change is not None and not worker.change.empty:
                self.trees.merges.merge_ahead(worker.change)  # merged ahead, while it is verified
            prompt = self.verify_prompt(subtask, worker)
            verifier = await self.run_subagent(
                call,
                index,
                "verifier",
                prompt,
                VERIFIER_PRIORITY,
                relay=relay,
                tree=self.verifier_tree(tree, worker),
            )
            return worker, verifier
        finally:
            if relay is not None:
                relay.drop()


def _no_copies(exc: Exception, *, started: bool = False) -> str:
    ran = "the agents were stopped and nothing was kept" if started else "nothing ran"
    return (
        f"error: the agents' copies of the tree could not be made ({exc}); {ran}. Call "
        'Workflow again with "isolation": "shared" to let the agents write the working '
        "directory directly."
    )


def _numbers(indexes: list[int]) -> str:
    """``1–3, 7`` for [1, 2, 3, 7]."""
    runs: list[str] = []
    start = prev = indexes[0]
    for i in [*indexes[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(str(start) if start == prev else f"{start}–{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(runs)
