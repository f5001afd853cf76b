"""The Workflow tool: normalise subtasks, fan out, verify each result, format the tool result.

A call carries either a flat list of ``subtasks`` (run here) or a ``script``, an
orchestration program run by :mod:`.script`; both start every agent through
:meth:`Workflow.run_subagent`, so the journal, claims, budget and slots treat them alike.

Each subtask is a chain — its worker, then a verifier that tries to refute the worker's
result — and every chain runs as its own coroutine, so a result's verification starts the
moment that result exists. Verifiers take free slots before queued workers, so finished
pairs reach the journal early. The tool result keeps the spec's order regardless.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .budget import SessionBudget
from .changes import Candidate, settle_changes
from .condense import AgentEntry, SubtaskEntry, fit_result, full_text
from .context import Window
from .errors import OrchmodeError
from .events import (
    BudgetStatus,
    EventBus,
    FanoutDone,
    FanoutStarted,
    ResultCondensed,
    Role,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
)
from .executors import Executor, Job, TreeJob, WorkerLost
from .executors.host import claim_or_take_over, holder_name, keep_claim
from .executors.local import HERE, LocalExecutor
from .mcptools import with_mcp_tools
from .model import ModelGateway
from .prompts import SUBAGENT_SYSTEM, SUBAGENT_TOOLS, change_note, quote_result, verify_prompt
from .results import ResultFiles
from .settings import Settings
from .store import BudgetState, Store, content_key
from .subagent import AgentResult, Status
from .trees import Trees

if TYPE_CHECKING:
    from .mcptools import McpHub


def normalise_subtasks(raw: object) -> list[str]:
    """Subtask prompts from whatever shape the model sent, as non-empty trimmed strings.

    Accepts a list, a JSON-encoded list in one string, a newline-separated string or a
    single string. A list item that is not a string is kept as its JSON text rather than
    silently dropped.
    """
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
            if isinstance(decoded, list):
                return normalise_subtasks(decoded)
        return [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(raw, list | tuple):
        items = (
            item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
            for item in raw
            if item is not None
        )
        return [item.strip() for item in items if item.strip()]
    return []


@dataclass(frozen=True)
class Plan:
    subtasks: list[str]
    not_run: int

    @property
    def note(self) -> str:
        if not self.not_run:
            return ""
        first = len(self.subtasks) + 1
        last = len(self.subtasks) + self.not_run
        return (
            f"[orchmode: {len(self.subtasks) + self.not_run} subtasks were given but at most "
            f"{len(self.subtasks)} run per call; {self.not_run} were not run (numbers "
            f"{first}–{last}). Call Workflow again with them to run them.]"
        )


#: The two forms of a Workflow call; exactly one of them is given.
FORMS = ("subtasks", "script")


def workflow_form(tool_input: object) -> str:
    """``subtasks`` or ``script``, or an error message when not exactly one of them is given.

    A key whose value is null counts as absent: models sometimes send the unused one so.
    """
    if not isinstance(tool_input, dict):
        return "subtasks"  # plan_subtasks words the error
    given = [form for form in FORMS if tool_input.get(form) is not None]
    if len(given) == 1:
        return given[0]
    if given:
        return (
            "error: give Workflow either subtasks or a script, not both — "
            '{"subtasks": ["...", "..."]} for independent agents, {"script": "..."} for a '
            "program that sequences them"
        )
    return (
        'error: Workflow needs exactly one of {"subtasks": ["first subtask prompt", ...]} '
        'or {"script": "a short Python program"}'
    )


def isolation_of(tool_input: object, default: str) -> str | None:
    """The call's ``isolation`` (``worktree`` or ``shared``), ``default`` when not given,
    or None when it is given but is neither."""
    value = tool_input.get("isolation") if isinstance(tool_input, dict) else None
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lower() in ("worktree", "shared"):
        return value.strip().lower()
    return None


BAD_ISOLATION = (
    'error: "isolation" must be "worktree" (each agent in its own copy of the tree) or '
    '"shared" (all agents in the one working directory)'
)


def plan_subtasks(tool_input: object, cap: int) -> Plan | str:
    """The subtasks to run, or an error message when there are none."""
    if not isinstance(tool_input, dict) or "subtasks" not in tool_input:
        return 'error: Workflow needs {"subtasks": ["first subtask prompt", ...]}'
    subtasks = normalise_subtasks(tool_input["subtasks"])
    if not subtasks:
        return (
            "error: no usable subtasks — pass a non-empty list of subtask prompts as "
            '{"subtasks": ["...", "..."]}'
        )
    return Plan(subtasks[:cap], max(0, len(subtasks) - cap))


def title(subtask: str, width: int = 120) -> str:
    line = subtask.strip().splitlines()[0] if subtask.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def verdict_of(result_text: str) -> str:
    """``confirmed``, ``refuted`` or ``unclear``, read from a verifier's result."""
    summary = result_text
    try:
        decoded = json.loads(result_text)
        if isinstance(decoded, dict) and isinstance(decoded.get("summary"), str):
            summary = decoded["summary"]
    except ValueError:
        pass
    head = summary.strip().lower()
    for verdict in ("confirmed", "refuted"):
        if head.startswith(verdict):
            return verdict
    return "unclear"


class PrioritySlots:
    """A counting semaphore that wakes lower ``priority`` numbers first, FIFO within one."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @asynccontextmanager
    async def slot(self, priority: int, relay: Relay | None = None) -> AsyncIterator[None]:
        """Hold a slot: the one ``relay`` has waiting, if it has one, else a new one."""
        ticket = relay.take() if relay is not None else None
        if ticket is None:
            await self._acquire(priority)
        else:
            try:
                await ticket
            except asyncio.CancelledError:
                if ticket.done() and not ticket.cancelled():
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def queue(self, priority: int) -> asyncio.Future[None]:
        """Join the queue now and wait later: the future is done once a slot is ours."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._free > 0 and not self._waiters:
            self._free -= 1
            future.set_result(None)
        else:
            heapq.heappush(self._waiters, (priority, next(self._order), future))
        return future

    def drop(self, ticket: asyncio.Future[None]) -> None:
        """Give up a place taken with :meth:`queue`, or the slot it was already given."""
        if ticket.done():
            if not ticket.cancelled():
                self._release()
        else:
            ticket.cancel()  # _release skips it

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # we were handed a slot at the moment we were cancelled
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
                return
        self._free += 1


class Relay:
    """Hands a chain's slot from its worker straight to its verifier.

    The worker queues for the verifier's slot just before it gives its own back, so the
    slot it frees goes to a verifier (its own, or one that was waiting longer) and never to
    a worker that queued meanwhile: each chain finishes as soon as it can, which is what
    keeps the fan-out's makespan near its bound. If the verifier does not run after all
    (journal hit, claim held elsewhere, no budget), the place is dropped at once.
    """

    def __init__(self, slots: PrioritySlots) -> None:
        self._slots = slots
        self._ticket: asyncio.Future[None] | None = None

    def queue_next(self, priority: int) -> None:
        if self._ticket is None:
            self._ticket = self._slots.queue(priority)

    def take(self) -> asyncio.Future[None] | None:
        ticket, self._ticket = self._ticket, None
        return ticket

    def drop(self) -> None:
        ticket = self.take()
        if ticket is not None:
            self._slots.drop(ticket)


WORKER_PRIORITY = 1
VERIFIER_PRIORITY = 0
#: Times a subagent is run again after its node was lost, before it counts as failed.
RERUNS = 3
SKIPPED = Status.SKIPPED
#: How often an agent waiting on another's claim looks for the result: first, at most.
CLAIM_POLL_FIRST = 0.05
CLAIM_POLL_MAX = 1.0

log = logging.getLogger("orchmode")


@dataclass(frozen=True)
class _Outcome:
    result: AgentResult
    duration: float
    node: str
    from_journal: bool = False


@dataclass
class Workflow:
    """Runs Workflow tool calls for one session.

    Every subagent goes through the store: a recorded result is served without a model
    call; otherwise the subagent's content key is claimed (so the same subtask never runs
    twice at once, in this process or any other sharing the store), one subagent is
    reserved in the session's budget ledger, and only then does it wait for a slot.
    """

    settings: Settings
    gateway: ModelGateway
    budget: SessionBudget
    events: EventBus
    executor: Executor
    #: Where every agent's full result is written; None writes nothing (no session dir).
    results: ResultFiles | None = None
    #: The working tree's private store, for ``worktree`` isolation; None: shared only.
    trees: Trees | None = None
    #: The user's MCP servers: their tools are part of what a subagent is given.
    mcp: McpHub | None = None
    calls: int = 0
    _tools: dict[Role, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    _slots: PrioritySlots | None = field(default=None, repr=False)
    _housekeeping: set[asyncio.Task[None]] = field(default_factory=set, repr=False)

    @property
    def slots(self) -> PrioritySlots:
        if self._slots is None:
            self._slots = PrioritySlots(self.settings.max_concurrent)
        return self._slots

    @property
    def store(self) -> Store:
        return self.budget.store

    @property
    def window(self) -> Window:
        return Window.from_settings(self.settings)

    async def run(self, tool_input: object, tokens: int | None = None) -> tuple[str, bool]:
        """The tool result text and whether it is an error.

        ``tokens`` is the most the result may take (default: the window's share for one
        result); a larger one is condensed, and the whole of it saved to a file.
        """
        if tokens is None:
            tokens = self.window.result_tokens
        form = workflow_form(tool_input)
        isolation = isolation_of(tool_input, self.settings.isolation)
        if isolation is None:
            return BAD_ISOLATION, True
        await self._list_tools()
        if form == "script" and isinstance(tool_input, dict):
            from .script import run_script  # the sandbox is loaded only when a script comes

            self.calls += 1
            return await run_script(self, self.calls, tool_input["script"], tokens, isolation)
        if form != "subtasks":
            return form, True
        plan = plan_subtasks(tool_input, self.settings.max_subtasks)
        if isinstance(plan, str):
            return plan, True
        try:
            tree = await self.tree_for(isolation)
        except OrchmodeError as exc:
            return _no_copies(exc), True
        self.calls += 1
        call = self.calls
        started = time.monotonic()
        self.events.emit(FanoutStarted(call, len(plan.subtasks), plan.not_run))
        chains = [
            asyncio.create_task(self._chain(call, i, subtask, tree))
            for i, subtask in enumerate(plan.subtasks, start=1)
        ]
        try:
            pairs = await asyncio.gather(*chains)
        finally:
            for chain in chains:
                chain.cancel()
            await asyncio.gather(*chains, return_exceptions=True)
            await self.settle()
        self.events.emit(FanoutDone(call, time.monotonic() - started))
        head = [plan.note] if plan.note else []
        budget = await self.store.budget(self.budget.session)
        skipped = [i for i, (worker, _) in enumerate(pairs, start=1) if worker.status is SKIPPED]
        unverified = [
            i
            for i, (worker, verifier) in enumerate(pairs, start=1)
            if verifier is not None and verifier.status is SKIPPED and worker.status is not SKIPPED
        ]
        if skipped or unverified:
            head.append(self._budget_note(skipped, unverified, budget))
        isolated = "worktree" if tree is not None else "shared"
        changes = [""] * len(pairs)
        if tree is not None:
            changes = await self.settle_changes(
                call,
                [
                    (i, self.key_of("worker", subtask, isolated), worker, verifier)
                    for i, (subtask, (worker, verifier)) in enumerate(
                        zip(plan.subtasks, pairs, strict=True), start=1
                    )
                ],
            )
        entries = [
            SubtaskEntry(
                title(subtask),
                AgentEntry(worker.text, self.report_path("worker", subtask, isolated)),
                None
                if verifier is None
                else AgentEntry(
                    verifier.text,
                    self.report_path(
                        "verifier", self.verify_prompt(subtask, worker, isolated), isolated
                    ),
                ),
                change,
            )
            for subtask, (worker, verifier), change in zip(
                plan.subtasks, pairs, changes, strict=True
            )
        ]
        tail = [self.budget_status(budget)]
        return self.fit(call, head, entries, tail, tokens, tool_input), False

    def fit(
        self,
        call: int,
        head: list[str],
        entries: list[SubtaskEntry],
        tail: list[str],
        tokens: int,
        tool_input: object,
    ) -> str:
        """The result within ``tokens``; its whole text saved, and its condensing announced."""
        saved = ""
        directory = ""
        if self.results is not None:
            identity = json.dumps(tool_input, sort_keys=True, ensure_ascii=False, default=str)
            whole = full_text(head, entries, tail)
            saved = self.results.write_text("workflow", identity, whole) or ""
            directory = str(self.results.directory)
        fitted = fit_result(
            head, entries, tail, tokens, saved_at=saved or "(not saved)", directory=directory
        )
        if fitted.condensed:
            self.events.emit(
                ResultCondensed(
                    call, fitted.tokens_full, fitted.tokens_shown, tokens, fitted.omitted, saved
                )
            )
        return fitted.text

    async def _list_tools(self) -> None:
        """Learn the subagents' tools before any key is made: MCP tools are part of them."""
        roles: tuple[Role, ...] = ("worker", "verifier")
        for role in roles:
            if role not in self._tools:
                self._tools[role] = await with_mcp_tools(SUBAGENT_TOOLS, self.mcp, role)

    def key_of(self, role: Role, prompt: str, isolation: str = "shared") -> str:
        """The journal's content address of an agent: everything that determines its result,
        its tools included (a tool of an MCP server among them)."""
        return content_key(
            role=role,
            model=self.settings.model,
            effort=self.settings.effort,
            system=SUBAGENT_SYSTEM,
            tools=self._tools.get(role, SUBAGENT_TOOLS),
            prompt=prompt,
            isolation=isolation,
        )

    def report_path(self, role: Role, prompt: str, isolation: str = "shared") -> str:
        """Where the agent with ``prompt`` has its full result, or "" with no results dir."""
        if self.results is None:
            return ""
        return str(self.results.agent_path(role, self.key_of(role, prompt, isolation)))

    def verify_prompt(self, subtask: str, worker: AgentResult, isolation: str = "shared") -> str:
        """The verifier's prompt, quoting the worker's result within its budget, and naming
        the worker's change when it made one."""
        limit = self.window.quote_tokens * 3
        path = self.report_path("worker", subtask, isolation) or None
        change = worker.change
        note = ""
        if change is not None and not change.empty:
            note = change_note(change.describe(), change.digest[:12], change.base)
        return verify_prompt(subtask, quote_result(worker.text, limit, path), note)

    async def tree_for(self, isolation: str) -> TreeJob | None:
        """The copy a call's workers start from: a snapshot of the tree now; None when the
        agents share the working directory (``shared``, or a read-only sandbox, where no
        agent can change it)."""
        if isolation != "worktree" or self.trees is None or self.settings.sandbox == "read-only":
            return None
        snapshot = await self.trees.snapshot()
        bundle = await self.executor.share_tree(self.trees, snapshot.commit)
        return TreeJob(snapshot.commit, ignored=snapshot.ignored, bundle=bundle)

    def verifier_tree(self, tree: TreeJob | None, worker: AgentResult) -> TreeJob | None:
        """A verifier's copy: its worker's, read-only, with the worker's change applied."""
        if tree is None:
            return None
        change = worker.change
        if change is None:
            return replace(tree, writable=False)
        return replace(tree, base=change.base, patch=change.patch, writable=False)

    async def settle_changes(
        self, call: int, done: list[tuple[int, str, AgentResult, AgentResult | None]]
    ) -> list[str]:
        """Merge the workers' changes in order (see :mod:`.changes`); a line per subtask."""
        return await self.settle_verdicts(
            call,
            [
                (
                    index,
                    key,
                    worker,
                    verdict_of(verifier.text)
                    if verifier is not None and verifier.finished
                    else None,
                )
                for index, key, worker, verifier in done
            ],
        )

    async def settle_verdicts(
        self, call: int, done: list[tuple[int, str, AgentResult, str | None]]
    ) -> list[str]:
        """The same, given each worker's verdict (None: not verified)."""
        if self.trees is None:
            return []
        candidates = [
            Candidate(index, key, worker.change, worker.finished, verdict)
            for index, key, worker, verdict in done
        ]
        try:
            return await settle_changes(
                self.trees, self.results, self.settings.merge, call, candidates, self.events
            )
        except OrchmodeError as exc:
            log.warning("merging the workers' changes failed: %s", exc)
            return [
                f"[change {c.index}] not merged: merging failed ({exc})"
                if c.change is not None and not c.change.empty
                else f"[change {c.index}] no change"
                for c in candidates
            ]

    async def settle(self) -> None:
        """Wait for the agents' housekeeping: results recorded, claims let go, use counted."""
        for failure in await asyncio.gather(*self._housekeeping, return_exceptions=True):
            if isinstance(failure, Exception):
                log.warning("housekeeping after the fan-out failed: %s", failure)
        await self.executor.settle()
        await self.budget.flush()

    def budget_status(self, budget: BudgetState) -> str:
        """The one-line budget status that ends every Workflow tool result; the display too."""
        left = max(0, self.settings.max_subagents - budget.subagents)
        line = f"{self.budget.describe(budget)} in this session; {left} subagents left"
        self.events.emit(BudgetStatus(line, left))
        return f"[budget: {line}]"

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
        self, call: int, index: int, subtask: str, tree: TreeJob | None = None
    ) -> tuple[AgentResult, AgentResult | None]:
        relay = Relay(self.slots) if self.settings.verify else None
        if tree is not None:
            tree = tree.for_subtask(call, index)
        try:
            worker = await self.run_subagent(
                call, index, "worker", subtask, WORKER_PRIORITY, hand_on=relay, tree=tree
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
            isolation = "worktree" if tree is not None else "shared"
            if self.trees is not None and worker.change is not None and not worker.change.empty:
                self.trees.prepare(worker.change)  # its merge, ahead, while it is verified
            prompt = self.verify_prompt(subtask, worker, isolation)
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

    async def run_subagent(
        self,
        call: int,
        index: int,
        role: Role,
        prompt: str,
        priority: int,
        *,
        relay: Relay | None = None,
        hand_on: Relay | None = None,
        tree: TreeJob | None = None,
    ) -> AgentResult:
        """One subagent through the store; any failure becomes an error result in its slot.

        The one path every agent takes, a flat fan-out's or a script's: journal lookup,
        claim, budget reservation, slot, executor. Its housekeeping finishes in the
        background, so whoever calls it must :meth:`settle` before reporting. ``relay``
        may hold a slot handed on by the previous agent of the chain; ``hand_on`` is where
        this agent queues for the next one's before it lets its own slot go.
        """
        own: Relay | None = None
        if relay is None:
            # Join the queue for a slot now, in the order the agents were asked for, so they
            # start in that order whatever order their lookups and claims come back in. A
            # place this agent does not use (a journal hit, another's claim) is given back.
            own = relay = Relay(self.slots)
            own.queue_next(priority)
        try:
            return await self._run_subagent(
                call, index, role, prompt, priority, relay=relay, hand_on=hand_on, tree=tree
            )
        finally:
            if own is not None:
                own.drop()

    async def _run_subagent(
        self,
        call: int,
        index: int,
        role: Role,
        prompt: str,
        priority: int,
        *,
        relay: Relay,
        hand_on: Relay | None,
        tree: TreeJob | None,
    ) -> AgentResult:
        key = self.key_of(role, prompt, "worktree" if tree is not None else "shared")
        if not self.settings.fresh:
            recorded = await self.store.lookup(key)
            if recorded is not None:
                self._journal_hit(call, index, role, prompt, key, recorded)
                return recorded
        holder = self._new_holder()
        recorded = await self._claim_or_wait(key, holder, relay)
        if recorded is not None:  # another agent, here or elsewhere, just finished it
            self._journal_hit(call, index, role, prompt, key, recorded)
            return recorded
        # Ours until the executor places the job; from then on the executor renews it.
        heartbeat = asyncio.create_task(
            keep_claim(self.store, key, holder, self.settings.claim_lease)
        )
        try:
            job = Job(
                key, holder, self.budget.session, role, f"{role} {call}.{index}", prompt, tree
            )
            async with self.slots.slot(priority, relay):
                # Reserved only once it has a slot: an agent still queued when the process
                # is killed has spent nothing, and a resume must not find it counted.
                if not await self.budget.reserve_subagent():
                    self._background(self.store.release(key, holder))
                    result = AgentResult(
                        f"[orchmode: not run — the session's budget of "
                        f"{self.settings.max_subagents} subagents is used up]",
                        SKIPPED,
                    )
                    self._done(call, index, role, prompt, key, result, 0.0)
                    return result
                outcome = await self._run_job(call, index, job, heartbeat)
                if hand_on is not None and outcome.result.status not in (Status.FAILED, SKIPPED):
                    hand_on.queue_next(VERIFIER_PRIORITY)
        except BaseException:  # cancelled or broken: let the next run take it at once
            self._background(self.store.release(key, holder))
            raise
        finally:
            heartbeat.cancel()
        self._done(
            call,
            index,
            role,
            prompt,
            key,
            outcome.result,
            outcome.duration,
            from_journal=outcome.from_journal,
            node=outcome.node,
        )
        return outcome.result

    async def _run_job(
        self, call: int, index: int, job: Job, heartbeat: asyncio.Task[None]
    ) -> _Outcome:
        """Run ``job`` on the executor; if its node is lost, run it again where one is left.

        A lost node's claim is left to lapse (the node may be cut off yet still working),
        so the rerun first waits for the lease, or for the result if the node records it.
        Holding the slot while waiting keeps the fan-out's order of work.
        """
        attempt = 1
        node = HERE
        role, prompt = job.role, job.prompt
        renewing = heartbeat  # ours until the executor places the job

        def placed(where: str) -> None:
            nonlocal node
            node = where
            renewing.cancel()
            self.events.emit(SubagentStarted(call, index, role, title(prompt), prompt, where))

        while True:
            started = time.monotonic()
            try:
                result = await self.executor.run(job, self.events, placed)
            except WorkerLost as exc:
                if attempt >= RERUNS:
                    return _Outcome(
                        AgentResult(
                            f"error: the subagent failed: its node was lost {attempt} times "
                            f"(last: {exc})",
                            Status.FAILED,
                        ),
                        time.monotonic() - started,
                        node,
                    )
                log.warning("%s: %s; running it again on another node", job.name, exc)
                attempt += 1
                job = replace(job, holder=self._new_holder())
                recorded = await self._claim_or_wait(job.key, job.holder)
                if recorded is not None:  # the lost node finished it after all
                    return _Outcome(recorded, time.monotonic() - started, node, from_journal=True)
                renewing = asyncio.create_task(
                    keep_claim(self.store, job.key, job.holder, self.settings.claim_lease)
                )
                continue
            except BaseException:
                if renewing is not heartbeat:  # a rerun's claim; the caller lets go the first
                    renewing.cancel()
                    self._background(self.store.release(job.key, job.holder))
                raise
            return _Outcome(result, time.monotonic() - started, node)

    def _new_holder(self) -> str:
        # Only a claim this process renews may be taken over when this process is gone.
        return holder_name(renewed_here=isinstance(self.executor, LocalExecutor))

    async def _claim_or_wait(
        self, key: str, holder: str, relay: Relay | None = None
    ) -> AgentResult | None:
        """Claim ``key`` (returns None), or wait until its holder records a result.

        Polls the store: that works across processes and machines alike. A holder that
        died stops renewing, its lease lapses, and the claim comes to us. A slot handed on
        in ``relay`` is given back before waiting: others can use it meanwhile.
        """
        pause = CLAIM_POLL_FIRST
        lease = self.settings.claim_lease
        while not await claim_or_take_over(self.store, key, holder, lease):
            if relay is not None:
                relay.drop()
            await asyncio.sleep(pause)
            pause = min(pause * 2, CLAIM_POLL_MAX)
            recorded = await self.store.lookup(key)
            if recorded is not None:
                return recorded
        # Its last holder may have recorded it and let go between our first look and our
        # claim: holders record before releasing, so one more look settles it.
        recorded = None if self.settings.fresh else await self.store.lookup(key)
        if recorded is not None:
            await self.store.release(key, holder)
        return recorded

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Housekeeping off the critical path; settle() waits for all of it."""
        task = asyncio.create_task(work)
        self._housekeeping.add(task)
        task.add_done_callback(self._housekeeping.discard)

    def _journal_hit(
        self, call: int, index: int, role: Role, prompt: str, key: str, recorded: AgentResult
    ) -> None:
        """A result served from the journal: its records say what it was, as a run's do."""
        self.events.emit(SubagentStarted(call, index, role, title(prompt), prompt))
        self._done(call, index, role, prompt, key, recorded, 0.0, from_journal=True)

    def _done(
        self,
        call: int,
        index: int,
        role: Role,
        prompt: str,
        key: str,
        result: AgentResult,
        duration: float,
        *,
        from_journal: bool = False,
        node: str = HERE,
    ) -> None:
        verdict = verdict_of(result.text) if role == "verifier" and result.finished else None
        report_path = self._save(role, prompt, key, result, verdict)
        # A journal hit asked the model nothing: it used no tokens and cost nothing now.
        usage = TokenUsage() if from_journal else result.usage
        price = self.settings.price()
        self.events.emit(
            SubagentDone(
                call,
                index,
                role,
                result.status.value,
                result.turns,
                usage,
                duration,
                from_journal=from_journal,
                verdict=verdict,
                result=result.text,
                cost=price.cost(usage) if price else 0.0,
                node=node,
                report_path=report_path,
            )
        )

    def _save(
        self, role: Role, prompt: str, key: str, result: AgentResult, verdict: str | None
    ) -> str:
        """Write the agent's full result to its file; the path ("" when nothing is kept)."""
        if self.results is None:
            return ""
        try:
            report: object = json.loads(result.text)
        except ValueError:
            report = None
        record: dict[str, object] = {
            "role": role,
            "prompt": prompt,
            "status": result.status.value,
            "turns": result.turns,
            "verdict": verdict,
            "report": report if isinstance(report, dict) else None,
            "text": result.text,
        }
        change = result.change
        if change is not None and not change.empty:
            record["change"] = {
                "base": change.base,
                "files": change.describe(),
                "patch": self.results.write_patch(key, change.patch),
            }
        # Written on a worker thread (a temp file, a write, a rename: kernel time), off the
        # chain's path; settle() waits for it, so the file is there when the call returns.
        self._background(self._write_record(role, key, record))
        return str(self.results.agent_path(role, key))

    async def _write_record(self, role: Role, key: str, record: dict[str, object]) -> None:
        assert self.results is not None
        await asyncio.to_thread(self.results.write_agent, role, key, record)


def _no_copies(exc: Exception) -> str:
    return (
        f"error: the agents' copies of the tree could not be made ({exc}); nothing ran. Call "
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
