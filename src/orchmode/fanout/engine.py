"""The fan-out engine: the path every agent of a Workflow call takes, whatever its form.

A flat fan-out (:mod:`.workflow`) and an orchestration script (:mod:`.script`) both start
their agents through :meth:`FanoutEngine.run_subagent`: journal lookup, claim, budget
reservation, a priority slot, then an executor. So the journal, claims, budget and slots
treat the two forms alike, and neither form imports the other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..core.agents import AgentDefinition
from ..core.background import Background
from ..core.events import (
    BudgetStatus,
    EventBus,
    ResultCondensed,
    Role,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
)
from ..core.prompts import (
    SUBAGENT_TOOLS,
    change_note,
    quote_result,
    subagent_system,
    verify_prompt,
    workflow_tool,
)
from ..core.results import AgentResult, Status
from ..core.schemas import typed_tools
from ..core.settings import Settings
from ..core.wire import JsonSchema, ToolSchema
from ..executors import Executor, Job, TreeJob, WorkerLost
from ..executors.local import HERE, LocalExecutor
from ..executors.nesting import NESTING
from ..executors.parking import PARKING
from ..model.allowance import AgentLimits, agent_limits, allowance_for, running
from ..model.budget import SessionBudget
from ..model.context import Window
from ..model.gateway import ModelChoice, ModelGateway
from ..store import BudgetState, Store, content_key
from ..store.claims import Claim, holder_name
from ..store.result_files import ResultFiles
from ..tools.mcptools import with_mcp_tools
from ..trees.patches import describe_change
from ..trees.trees import Trees
from .agent_record import agent_record
from .condense import SubtaskEntry, fit_result, full_text
from .nesting import LEVEL, child_tree, nested_key, nesting_for, offers_nesting
from .plans import Subtask, title, verdict_of
from .slots import VERIFIER_PRIORITY, PrioritySlots, Relay

if TYPE_CHECKING:
    from ..tools.mcptools import McpHub

#: Times a subagent is run again after its node was lost, before it counts as failed.
RERUNS = 3
SKIPPED = Status.SKIPPED
#: A worker ending so is not sent to a verifier: failed, not run, or refused by the model
#: (nothing to verify; its slot says why).
_NOT_VERIFIED = (Status.FAILED, SKIPPED, Status.REFUSAL)

log = logging.getLogger("orchmode")


@dataclass(frozen=True)
class _Outcome:
    result: AgentResult
    duration: float
    node: str
    from_journal: bool = False


@dataclass
class FanoutEngine:
    """Runs the agents of one session's Workflow calls.

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
    #: The agent definitions subtasks may name, read once for the session.
    roles: Mapping[str, AgentDefinition] = field(default_factory=dict)
    #: Workflow calls so far, nested ones included: a call's number in events and lines.
    calls: int = 0
    #: Each top-level call's place among the main agent's calls, by call number: what the
    #: merge ledger names it by, as a resume runs fewer nested calls and numbers shift.
    top_calls: dict[int, int] = field(default_factory=dict, repr=False)
    _tools: dict[Role, list[ToolSchema]] = field(default_factory=dict, repr=False)
    _slots: PrioritySlots | None = field(default=None, repr=False)
    _housekeeping: Background = field(default_factory=Background, repr=False)

    def number_call(self) -> int:
        """The next call's number (a top-level call's place is noted too)."""
        self.calls += 1
        if not LEVEL.get().nested:
            self.top_calls[self.calls] = len(self.top_calls) + 1
        return self.calls

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
        roles: tuple[Role, ...] = ("worker", "verifier", "resolver")
        for role in roles:
            if role not in self._tools:
                self._tools[role] = await with_mcp_tools(SUBAGENT_TOOLS, self.mcp, role)

    def key_of(self, role: Role, task: Subtask, isolation: str = "shared") -> str:
        """The journal's content address of an agent: everything that determines its result,
        its tools included (a tool of an MCP server among them, and report_findings with
        the subtask's schema, so a changed schema is not served an old result), and its
        role's definition (so a changed definition is not served one either)."""
        agent = task.agent
        choice = ModelChoice.of(self.settings, role, agent)
        tools = self._tools.get(role, SUBAGENT_TOOLS)
        if offers_nesting(self, role):  # a worker that may fan out is offered Workflow
            tools = [workflow_tool(self.roles), *tools]
        return nested_key(
            content_key(
                role=role,
                model=choice.model,
                effort=choice.effort,
                system=subagent_system(agent),
                tools=typed_tools(
                    agent.offered(tools) if agent is not None else tools, task.schema
                ),
                prompt=task.prompt,
                isolation=isolation,
                agent=agent.digest if agent is not None else None,
            )
        )

    def report_path(self, role: Role, result: AgentResult) -> str:
        """Where the agent that gave ``result`` has its full result: "" with no results dir,
        and for a result no agent gave (a verifier's "not verified" has no file)."""
        if self.results is None or not result.key:
            return ""
        return str(self.results.agent_path(role, result.key))

    def verify_prompt(self, task: Subtask, worker: AgentResult) -> str:
        """The verifier's prompt for the worker given ``task``: its result quoted within its
        budget (its ``data`` with it), its change named when it made one, and the schema
        the data had to follow."""
        limit = self.window.quote_tokens * 3
        path = self.report_path("worker", worker) or None
        change = worker.change
        note = ""
        if change is not None and not change.empty:
            note = change_note(describe_change(change), change.digest[:12], change.base)
        if change is not None and change.left_out:
            note += (
                "\nLeft out of the change as too big for a patch (not part of what is "
                f"judged, though you may see it in the copy): {', '.join(change.left_out)}"
            )
        if task.schema is not None:
            note += data_note(task.schema)
        return verify_prompt(task.prompt, quote_result(worker.text, limit, path), note)

    async def tree_for(self, isolation: str, *, ahead: bool = False) -> TreeJob | None:
        """The copy a call's workers start from: a snapshot of the tree now; None when the
        agents share the working directory (``shared``, or a read-only sandbox, where no
        agent can change it).

        ``ahead``: where agents run in this process, the snapshot is taken while the
        workers' first model requests are in flight (none of them needs the tree before
        its first reply): the job says so, and the caller awaits :meth:`TreeJob.with_snapshot`.
        """
        if isolation != "worktree" or self.trees is None or self.settings.sandbox == "read-only":
            return None
        if LEVEL.get().nested:  # a nested call's workers start from their parent's copy
            return await child_tree(LEVEL.get())
        if ahead and isinstance(self.executor, LocalExecutor):
            taking = asyncio.ensure_future(self._take_snapshot())
            taking.add_done_callback(lambda t: t.cancelled() or t.exception())
            return TreeJob("", pending=taking)
        return await self._take_snapshot()

    async def _take_snapshot(self) -> TreeJob:
        assert self.trees is not None
        snapshot = await self.trees.snapshots.snapshot()
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

    async def finish_housekeeping(self) -> None:
        """Wait for the agents' housekeeping: results recorded, claims let go, use counted.

        A nested call waits for its own agents' only: the session's goes on around it, and
        the top-level call waits for the rest."""
        own = LEVEL.get().housekeeping
        if own is not None:
            for failure in await own.wait():
                log.warning("housekeeping after a nested fan-out failed: %s", failure)
            return
        for failure in await self._housekeeping.wait():
            log.warning("housekeeping after the fan-out failed: %s", failure)
        await self.executor.finish_housekeeping()
        await self.budget.flush()

    async def run(self, tool_input: object, tokens: int | None = None) -> tuple[str, bool]:
        """One Workflow call: the tool result and whether it is an error (see
        :class:`~.workflow.Workflow`, which runs it; a nested call comes back here)."""
        raise NotImplementedError

    def budget_status(self, budget: BudgetState) -> str:
        """The one-line budget status that ends every Workflow tool result; the display too."""
        left = max(0, self.settings.max_subagents - budget.subagents)
        line = f"{self.budget.describe(budget)} in this session; {left} subagents left"
        self.events.emit(BudgetStatus(line, left))
        return f"[budget: {line}]"

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
        schema: JsonSchema | None = None,
        agent: AgentDefinition | None = None,
        limits: AgentLimits | None = None,
    ) -> AgentResult:
        """One subagent through the store; any failure becomes an error result in its slot.

        Every agent takes this path, a flat fan-out's or a script's: journal lookup,
        claim, budget reservation, slot, executor. Its housekeeping finishes in the
        background, so whoever calls it must :meth:`finish_housekeeping` before reporting. ``relay``
        may hold a slot handed on by the previous agent of the chain; ``hand_on`` is where
        this agent queues for the next one's before it lets its own slot go. ``schema``: the
        report's data must follow it (a typed result). ``agent``: the role it runs in.
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
                call,
                index,
                role,
                prompt,
                priority,
                relay=relay,
                hand_on=hand_on,
                tree=tree,
                schema=schema,
                agent=agent,
                limits=limits,
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
        schema: JsonSchema | None = None,
        agent: AgentDefinition | None = None,
        limits: AgentLimits | None = None,
    ) -> AgentResult:
        isolation = "worktree" if tree is not None else "shared"
        key = self.key_of(role, Subtask(prompt, schema, agent), isolation)
        taken = await self._claim(key, relay.drop)
        if isinstance(taken, AgentResult):  # recorded, perhaps by another agent just now
            self._journal_hit(call, index, role, prompt, key, taken)
            return replace(taken, key=key)
        job = Job(
            key,
            taken.holder,
            self.budget.session,
            role,
            f"{role} {call}.{index}",
            prompt,
            tree,
            schema=schema,
            agent=agent,
            limits=agent_limits(self.settings, limits),
        )
        # Ours until the executor places the job; from then on the executor renews it.
        taken.keep()
        try:
            outcome = await self._run_in_slot(call, index, job, taken, priority, relay, hand_on)
        except BaseException:  # cancelled or broken: let the next run take it at once
            self._background(taken.release())
            raise
        finally:
            taken.hand_over()
        if outcome is None:
            result = AgentResult(self._refusal(), SKIPPED, key=key)
            self._done(call, index, role, prompt, key, result, 0.0)
            return result
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
            model=ModelChoice.of(self.settings, role, agent).model,
        )
        return replace(outcome.result, key=key)

    def _refusal(self) -> str:
        limit = self.settings.max_subagents
        return f"[orchmode: not run — the session's budget of {limit} subagents is used up]"

    async def _claim(
        self, key: str, on_wait: Callable[[], None] | None = None
    ) -> Claim | AgentResult:
        """The recorded result, or the claim to run it; waits while another holds it (a
        slot handed on is given back by ``on_wait`` first: others can use it meanwhile)."""
        fresh = self.settings.fresh
        recorded = None if fresh else await self.store.lookup(key)
        if recorded is not None:
            return recorded
        # Only a claim this process renews may be taken over when this process is gone.
        holder = holder_name(renewed_here=isinstance(self.executor, LocalExecutor))
        lease = self.settings.claim_lease
        return await Claim.or_result(
            self.store, key, holder, lease, look_again=not fresh, on_wait=on_wait
        )

    async def _run_in_slot(
        self,
        call: int,
        index: int,
        job: Job,
        claim: Claim,
        priority: int,
        relay: Relay,
        hand_on: Relay | None,
    ) -> _Outcome | None:
        """Run ``job`` once it has a slot; None if the budget refused it (claim let go)."""
        async with self.slots.slot(priority, relay) as tenure:
            # Reserved only once it has a slot: an agent still queued when the process
            # is killed has spent nothing, and a resume must not find it counted.
            if not await self.budget.reserve_subagent():
                self._background(claim.release())
                return None
            # What the agent starts here may park it (an approval): its slot goes to
            # the next agent meanwhile, and the time parked is not the agent's.
            parking = PARKING.set(tenure)
            # A worker that may fan out does so through this; it waits parked meanwhile.
            nesting = NESTING.set(nesting_for(self, call, index, job))
            try:
                with running(allowance_for(job.limits, job.name)):
                    outcome = await self._run_job(call, index, job, claim)
            finally:
                NESTING.reset(nesting)
                PARKING.reset(parking)
            outcome = replace(outcome, duration=max(0.0, outcome.duration - tenure.parked_seconds))
            if hand_on is not None and outcome.result.status not in _NOT_VERIFIED:
                hand_on.queue_next(VERIFIER_PRIORITY)
            return outcome

    async def _run_job(self, call: int, index: int, job: Job, claim: Claim) -> _Outcome:
        """Run ``job`` on the executor; if its node is lost, run it again where one is left.

        A lost node's claim is left to lapse (the node may be cut off yet still working),
        so the rerun first waits for the lease, or for the result if the node records it.
        Holding the slot while waiting keeps the fan-out's order of work.
        """
        attempt = 1
        node = HERE
        role, prompt = job.role, job.prompt
        current = claim  # ours until the executor places the job

        def placed(where: str) -> None:
            nonlocal node
            node = where
            current.hand_over()
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
                taken = await self._claim(job.key)
                if isinstance(taken, AgentResult):  # the lost node finished it after all
                    return _Outcome(taken, time.monotonic() - started, node, from_journal=True)
                current = taken
                current.keep()
                job = replace(job, holder=current.holder)
                continue
            except BaseException:
                if current is not claim:  # a rerun's claim; the caller lets go the first
                    self._background(current.release())
                raise
            return _Outcome(result, time.monotonic() - started, node)

    def _background(self, work: Coroutine[Any, Any, object]) -> None:
        """Housekeeping off the critical path; finish_housekeeping() waits for all of it."""
        (LEVEL.get().housekeeping or self._housekeeping).start(work)

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
        model: str | None = None,
    ) -> None:
        verdict = verdict_of(result.text) if role == "verifier" and result.finished else None
        report_path = self._save(role, prompt, key, result, verdict)
        # A journal hit asked the model nothing: it used no tokens and cost nothing now.
        usage = TokenUsage() if from_journal else result.usage
        price = self.settings.price(
            model or self.settings.model_for(role), batched=self.settings.batched(role)
        )
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
        results = self.results
        record = agent_record(
            role, prompt, result, verdict, lambda patch: results.write_patch(key, patch)
        )
        # Written on a worker thread (a temp file, a write, a rename: kernel time), off the
        # chain's path; finish_housekeeping() waits for it, so the file is there when the
        # call returns.
        self._background(asyncio.to_thread(self.results.write_agent, role, key, record))
        return str(self.results.agent_path(role, key))


def data_note(schema: JsonSchema) -> str:
    """What the verifier is told of a typed result: the schema its ``data`` had to follow."""
    text = json.dumps(schema, ensure_ascii=False, sort_keys=True)
    return (
        "\n\nIts report carries `data`, its typed result, which had to follow this JSON "
        f"Schema:\n<schema>\n{text}\n</schema>\nCheck the values in the data against what "
        "you find, as you check its claims: a wrong value counts as refuted."
    )
