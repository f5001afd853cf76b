"""Orchestration scripts: a short Python program, run in a Monty sandbox, that drives agents.

A flat list of subtasks cannot say "run these, then review what they found, then look again
where the review disagreed". A script can: it is plain Python with loops, branches and
reduce steps, run by pydantic-monty in a separate interpreter process that has no files,
network, environment or host modules. The program reaches the world only through five host
functions, and every agent it starts takes the flat fan-out's own path
(:meth:`.FanoutEngine.run_subagent`: journal, claim, budget, slot), so rerunning a program
after a crash serves its finished agents from the journal and runs only the rest.

That replay asks the same questions only if the program is deterministic, so it is given
nothing that varies: ``random`` is seeded from the program's own text, the clock is frozen,
sleeps return at once, and there is nothing else to read (see
:mod:`orchmode.fanout.script_sandbox`). ``budget()`` is the one exception: it reports the
live ledger.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_monty import (
    AsyncFunctionSnapshot,
    AsyncMonty,
    AsyncMontySession,
    AsyncNameLookupSnapshot,
    ExternalResult,
    ExternalSettledResult,
    MontyComplete,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
)

from ..core.errors import OrchmodeError
from ..core.events import Role, ScriptDone, ScriptStarted
from ..core.prompts import verify_prompt
from ..core.results import AgentResult, Status
from ..core.wire import JsonRecord
from ..executors import TreeJob
from ..trees.patches import describe_change
from .engine import FanoutEngine, data_note
from .merging import merge_verdicts
from .nesting import LEVEL
from .plans import Subtask, isolation_for, isolation_of, verdict_of
from .script_calls import (
    KEYWORD_ONLY,
    PARAMETERS,
    STAND_INS,
    AgentLimit,
    BudgetAnswer,
    agent_answer,
    bind,
    plain,
    prompt_of,
    typed_subtask,
)
from .script_report import ScriptLog, agents_phrase, error_text, fit_output, render_output
from .script_sandbox import (
    WORKER_GRACE,
    ScriptError,
    check_imports,
    monty_failure,
    refusal,
    sandbox_rules,
)
from .slots import VERIFIER_PRIORITY, WORKER_PRIORITY


async def run_script(
    engine: FanoutEngine,
    call: int,
    source: object,
    tokens: int | None = None,
    isolation: str = "shared",
) -> tuple[str, bool]:
    """The tool result of one Workflow call with a script, and whether it is an error.

    ``tokens`` is the most the result may take; a larger value is condensed (see
    :func:`orchmode.fanout.condense.fit_value`) and the whole of it saved to a file.
    """
    if not isinstance(source, str) or not source.strip():
        return 'error: "script" must be a non-empty string holding a Python program', True
    run = ScriptRun(engine, call, source, isolation=isolation)
    if tokens is not None:
        run.tokens = tokens
    return await run.run()


@dataclass
class ScriptRun:
    """One script, from its first line to the tool result."""

    engine: FanoutEngine
    call: int
    source: str
    #: agents asked for so far (journal hits included, so a rerun counts the same)
    agents: int = 0
    #: agents not run because the session's budget was used up
    skipped: int = 0
    log: ScriptLog = field(init=False)
    #: the line of the last host call, to place errors that Monty reports without one
    last_line: int | None = None
    #: the most tokens the tool result may take (0: the window's share for one result)
    tokens: int = 0
    #: where agents change files unless agent()/parallel() say otherwise
    isolation: str = "shared"
    #: the snapshot this script's isolated agents start from, taken at the first of them
    tree: TreeJob | None = None
    #: workers that ran in a copy, in the order they were started: their results, keys
    #: and the verdict verify() gave them (None until then)
    workers: list[_Isolated] = field(default_factory=list)
    #: what each worker prompt was asked with (its schema, its role), for verify()
    asked: dict[str, Subtask] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log = ScriptLog(self.engine.settings.output_limit)

    async def run(self) -> tuple[str, bool]:
        events = self.engine.events
        started = time.monotonic()
        level = LEVEL.get()
        lines = len(self.source.splitlines())
        events.emit(ScriptStarted(self.call, lines, level.parent, level.depth))
        output: object = None
        error: ScriptError | None = None
        try:
            output = await self._execute()
        except ScriptError as exc:
            error = exc
        finally:
            await self.engine.finish_housekeeping()
        changes = await self._merge_changes()
        text = await self._tool_result(output, error, changes)
        first_line = text.splitlines()[0] if error is not None else None
        events.emit(ScriptDone(self.call, time.monotonic() - started, self.agents, first_line))
        return text, error is not None

    # ------------------------------------------------------------------ running

    async def _execute(self) -> object:
        refused = check_imports(self.source)
        if refused is not None:
            raise refused
        limit = self.engine.settings.script_timeout
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                return await self._sandboxed()
        except TimeoutError:
            if not deadline.expired():
                raise ScriptError("the script's sandbox timed out", self.last_line) from None
            raise ScriptError(
                f"the script ran past its {limit:g} s of wall-clock time (script_timeout); "
                "the agents still running were stopped",
                self.last_line,
            ) from None

    async def _sandboxed(self) -> object:
        s = self.engine.settings
        limits, policy = sandbox_rules(s, self.source)
        try:
            async with (
                AsyncMonty(
                    min_processes=1,
                    max_processes=1,
                    request_timeout=s.script_cpu_seconds + WORKER_GRACE,
                ) as pool,
                pool.checkout(script_name="script.py", limits=limits, os_policy=policy) as session,
            ):
                return await self._drive(session)
        except MontySyntaxError as exc:
            raise self._failure("the script has a syntax error", exc) from None
        except MontyRuntimeError as exc:
            raise self._failure("the script failed", exc) from None
        except MontyCrashedError as exc:
            raise ScriptError(
                f"the script's interpreter process died ({exc})", self.last_line
            ) from None
        except MontyError as exc:
            raise ScriptError(f"the script could not run: {exc}", self.last_line) from None
        except OSError as exc:  # no monty binary, no processes left, ...
            raise ScriptError(
                f"the script sandbox could not start ({exc}); scripts need pydantic-monty "
                "and its monty binary — use subtasks meanwhile"
            ) from None

    async def _drive(self, session: AsyncMontySession) -> object:
        """Run the program, answering each suspension: host calls, refused OS calls, names."""
        snapshot = await session.feed_start(self.source, print_callback=self.log.printed)
        while not isinstance(snapshot, MontyComplete):
            self.last_line = self._line_at(snapshot.position.filename, snapshot.position.start)
            if isinstance(snapshot, AsyncFunctionSnapshot):
                if snapshot.is_os_function:
                    answer: ExternalResult = {"exception": refusal(snapshot)}
                elif snapshot.allow_eager_await:  # ``await agent(...)``: refuse before it runs
                    name = snapshot.function_name
                    answer = {
                        "exception": TypeError(
                            f"{name}() returns its result directly: call it without await"
                        )
                    }
                else:
                    answer = await self._host_call(
                        str(snapshot.function_name), snapshot.args, snapshot.kwargs
                    )
                snapshot = await snapshot.resume(answer)
            elif isinstance(snapshot, AsyncNameLookupSnapshot):
                stand_in = STAND_INS.get(snapshot.variable_name)
                if stand_in is None or snapshot.object_id is not None:
                    snapshot = await snapshot.resume()  # NameError inside the sandbox
                else:
                    snapshot = await snapshot.resume(value=stand_in)
            else:  # no host function hands out futures, so nothing can be pending
                failure: ExternalSettledResult = {"exception": RuntimeError("nothing to await")}
                snapshot = await snapshot.resume(
                    {call_id: failure for call_id in snapshot.pending_call_ids}
                )
        return snapshot.output

    async def _host_call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, object]
    ) -> ExternalResult:
        """One host function's answer; a misuse becomes an exception inside the sandbox."""
        try:
            if name == "log":
                if kwargs:
                    raise TypeError("log() takes no keyword arguments")
                self.log.add(" ".join(v if isinstance(v, str) else repr(v) for v in args))
                return {"return_value": None}
            if name not in PARAMETERS:
                raise NameError(f"name {name!r} is not defined")
            values = bind(name, PARAMETERS[name], args, kwargs, KEYWORD_ONLY.get(name, ()))
            if name == "agent":
                subtask = typed_subtask(
                    "agent()", values[0], values[2], values[3], self.engine.roles, values[4]
                )
                where = self._isolation("agent", values[1])
                return {"return_value": await self._agent(subtask, where)}
            if name == "parallel":
                # its defaults, checked once
                _, _, agent, schema, budget = values
                typed_subtask("parallel()", "-", agent, schema, self.engine.roles, budget)
                where = self._isolation("parallel", values[1])
                return {
                    "return_value": await self._parallel(values[0], where, agent, schema, budget)
                }
            if name == "verify":
                return {"return_value": await self._verify(values[0], values[1])}
            return {"return_value": await self._budget()}
        except (TypeError, ValueError, NameError, AgentLimit) as exc:
            return {"exception": exc}
        except OrchmodeError as exc:  # the copies of the tree could not be made
            return {"exception": RuntimeError(str(exc))}

    # ------------------------------------------------------------------ host functions

    def _take(self, count: int, what: str) -> list[int]:
        """Numbers for ``count`` more agents, or :class:`AgentLimit` past the script's cap."""
        cap = self.engine.settings.script_max_agents
        if self.agents + count > cap:
            raise AgentLimit(
                f"{what} would take this script past its limit of {cap} agents "
                f"(script_max_agents; {self.agents} started so far) — return what you have "
                "and run the rest in another Workflow call"
            )
        first = self.agents + 1
        self.agents += count
        return list(range(first, first + count))

    async def _run(
        self, index: int, role: Role, task: Subtask, tree: TreeJob | None = None
    ) -> AgentResult:
        priority = VERIFIER_PRIORITY if role == "verifier" else WORKER_PRIORITY
        result = await self.engine.run_subagent(
            self.call,
            index,
            role,
            task.prompt,
            priority,
            tree=tree,
            schema=task.schema,
            agent=task.agent,
            limits=task.budget,
        )
        if result.status is Status.SKIPPED:
            self.skipped += 1
        return result

    def _isolation(self, function: str, value: object) -> str:
        """Where the agents of a call of ``function`` work unless their roles say otherwise."""
        chosen = isolation_of({"isolation": value}, self.isolation)
        if chosen is None:
            raise ValueError(f'{function}() takes isolation="worktree" or isolation="shared"')
        return chosen

    async def _tree_for(self, index: int, where: str, subtask: Subtask) -> TreeJob | None:
        """The copy worker ``index`` starts from, named for it so that its verifier can be
        shown that copy; None in the shared tree. Its role may choose where it works."""
        agent = subtask.agent
        if isolation_for(where, agent) != "worktree":
            return None
        if self.tree is None:
            self.tree = await self.engine.tree_for("worktree")
        if self.tree is None:
            return None
        tree = self.tree.for_subtask(self.call, index)
        if agent is not None and agent.shell == "read":
            tree = replace(tree, writable=False)  # its bash only reads the tree
        return tree

    async def _agent(self, subtask: Subtask, where: str) -> JsonRecord:
        (index,) = self._take(1, "agent()")
        tree = await self._tree_for(index, where, subtask)
        result = await self._run(index, "worker", subtask, tree)
        return self._answer(index, subtask, result, tree)

    async def _parallel(
        self,
        prompts: object,
        where: str,
        agent: object = None,
        schema: object = None,
        budget: object = None,
    ) -> list[JsonRecord]:
        if not isinstance(prompts, list | tuple):
            raise TypeError(f"parallel() takes a list of prompts, not {type(prompts).__name__}")
        subtasks = [
            typed_subtask(f"parallel() prompt {n}", p, agent, schema, self.engine.roles, budget)
            for n, p in enumerate(prompts, start=1)
        ]
        indexes = self._take(len(subtasks), f"parallel() of {len(subtasks)} prompts")
        trees = [
            await self._tree_for(index, where, subtask)
            for index, subtask in zip(indexes, subtasks, strict=True)
        ]
        runs = [
            asyncio.create_task(self._run(index, "worker", subtask, own))
            for index, subtask, own in zip(indexes, subtasks, trees, strict=True)
        ]
        try:
            results = await asyncio.gather(*runs)
        finally:
            for run in runs:
                run.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
        return [
            self._answer(index, subtask, result, own)
            for index, subtask, result, own in zip(indexes, subtasks, results, trees, strict=True)
        ]

    def _answer(
        self, index: int, subtask: Subtask, result: AgentResult, tree: TreeJob | None
    ) -> JsonRecord:
        """agent()'s value; an isolated worker's is remembered, and names its change, so
        that verify() can check the change and the merge at the end can find it."""
        answer = agent_answer(result)
        self.asked[subtask.prompt] = subtask
        if tree is None:
            return answer
        self.workers.append(_Isolated(index, result, tree, subtask))
        change = result.change
        if change is not None and not change.empty:
            answer["change"] = {"agent": index, "files": describe_change(change)}
        return answer

    async def _verify(self, prompt: object, result: object) -> JsonRecord:
        subtask = prompt_of("verify", prompt)
        if isinstance(result, dict) and "error" in result:
            why = (
                "the model refused the subtask: there is nothing to verify"
                if result.get("status") == Status.REFUSAL.value
                else "the agent failed"
            )
            return {"error": f"[orchmode: not verified, because {why}]", "status": "not_run"}
        if not self.engine.settings.verify:
            return {
                "error": "[orchmode: not verified — verification is switched off in this "
                "session's settings]",
                "status": "not_run",
            }
        asked = self.asked.get(subtask, Subtask(subtask))
        if asked.agent is not None and not asked.agent.verify:
            return {
                "error": f"[orchmode: not verified — the agent {asked.agent.name!r} ran it, "
                "and its definition says verify: false]",
                "status": "not_run",
            }
        worker = self._worker_of(result)
        if worker is not None:
            tree = self.engine.verifier_tree(worker.tree, worker.result)
            checked = replace(worker.subtask, prompt=subtask)  # as verify() names it
            prompt_text = self.engine.verify_prompt(checked, worker.result)
        else:
            text = (
                result if isinstance(result, str) else json.dumps(plain(result), ensure_ascii=False)
            )
            note = data_note(asked.schema) if asked.schema is not None else ""
            tree, prompt_text = None, verify_prompt(subtask, text, note)
        (index,) = self._take(1, "verify()")
        verdict = await self._run(index, "verifier", Subtask(prompt_text), tree)
        answer = agent_answer(verdict)
        if "error" in answer:
            return answer
        if worker is not None:
            worker.verdict = verdict_of(verdict.text)
        return {"verdict": verdict_of(verdict.text), **answer}

    def _worker_of(self, result: object) -> _Isolated | None:
        """The isolated worker whose agent() value ``result`` is, if it is one."""
        if not isinstance(result, dict):
            return None
        change = result.get("change")
        number = change.get("agent") if isinstance(change, dict) else None
        for worker in self.workers:
            if worker.index == number:
                return worker
        return None

    async def _merge_changes(self) -> list[str]:
        """Merge the isolated workers' changes in the order they were started."""
        if not self.workers:
            return []
        done = [(w.index, w.subtask.prompt, w.result, w.verdict) for w in self.workers]
        return await merge_verdicts(self.engine, self.call, self.workers[0].tree, done)

    async def _budget(self) -> BudgetAnswer:
        s = self.engine.settings
        state = await self.engine.store.budget(self.engine.budget.session)
        answer: BudgetAnswer = {
            "subagents_launched": state.subagents,
            "subagents_left": max(0, s.max_subagents - state.subagents),
            "tokens_used": state.tokens,
            "cost_used": round(state.cost, 4),
            "script_agents_started": self.agents,
            "script_agents_left": max(0, s.script_max_agents - self.agents),
        }
        if s.max_session_tokens is not None:
            answer["tokens_left"] = max(0, s.max_session_tokens - state.tokens)
        if s.max_cost is not None:
            answer["cost_left"] = round(max(0.0, s.max_cost - state.cost), 4)
        return answer

    # ------------------------------------------------------------------ reporting

    def _failure(self, what: str, exc: MontySyntaxError | MontyRuntimeError) -> ScriptError:
        return monty_failure(what, exc, self.engine.settings.script_cpu_seconds, self.last_line)

    def _line_at(self, filename: str, offset: int) -> int | None:
        """The 1-based line of a UTF-8 byte offset into the program."""
        if not filename.startswith("<python-input"):
            return self.last_line  # inside eval() or the like: keep the last known line
        return self.source.encode()[:offset].count(b"\n") + 1

    async def _tool_result(
        self,
        output: object,
        error: ScriptError | None,
        changes: list[str] = (),  # type: ignore[assignment]
    ) -> str:
        sections: list[str] = []
        log_text = self.log.render()
        if error is None:
            sections.append(
                fit_output(
                    self.engine,
                    self.call,
                    self.source,
                    render_output(output),
                    log_text,
                    self.tokens,
                )
            )
        else:
            sections.append(error_text(error, self.source))
        if log_text:
            sections.append(log_text)
        if error is not None and self.agents:
            sections.append(
                f"[orchmode: the script had asked for {agents_phrase(self.agents)} before it "
                "stopped; the finished ones are in the journal, so a corrected script that asks "
                "the same prompts gets their results back without running them again]"
            )
        state = await self.engine.store.budget(self.engine.budget.session)
        if self.skipped:
            sections.append(
                f"[orchmode: the session's budget is used up "
                f"({self.engine.budget.describe(state)}): {agents_phrase(self.skipped)} of this "
                "script were not run and came back as errors with status 'skipped'. Rerunning "
                "them needs more budget: narrow the work to what matters most, or ask the user "
                "to raise --max-subagents, --max-session-tokens or --max-cost.]"
            )
        lines = [line for line in changes if not line.endswith("] no change")]
        if lines:
            sections.append("\n".join(lines))
        sections.append(self.engine.budget_status(state))
        return "\n\n".join(sections)


@dataclass
class _Isolated:
    """A script's worker that ran in a copy of the tree."""

    index: int
    result: AgentResult
    tree: TreeJob
    #: What it was asked: its prompt, its result's schema, its role.
    subtask: Subtask
    verdict: str | None = None
