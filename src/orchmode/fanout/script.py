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
sleeps return at once, and there is nothing else to read. (``budget()`` is the one
exception: it reports the live ledger.)
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
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
    OSPolicy,
    ResourceLimits,
)

from ..core.agents import AgentDefinition
from ..core.errors import OrchmodeError
from ..core.events import ResultCondensed, Role, ScriptDone, ScriptStarted
from ..core.prompts import verify_prompt
from ..core.results import AgentResult, Status
from ..executors import TreeJob
from ..model.context import CHARS_PER_TOKEN, estimate_tokens
from ..trees.patches import describe_change
from .condense import fit_value
from .engine import FanoutEngine, data_note
from .plans import Subtask, isolation_for, isolation_of, subtask_object, verdict_of
from .slots import VERIFIER_PRIORITY, WORKER_PRIORITY

#: Modules a script may import: pure computation inside the sandbox, nothing that reaches out.
ALLOWED_MODULES = frozenset(
    {
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "decimal",
        "functools",
        "itertools",
        "json",
        "math",
        "random",
        "re",
        "typing",
    }
)
#: Host calls a script may make in all (each log line is one): a guard against a chatty loop.
HOST_CALL_LIMIT = 10_000
#: Characters of a script's value shown at most, whatever its token budget; a larger one is
#: condensed, and saved whole.
RESULT_LIMIT = 100_000
#: Tokens of a script's result kept for its budget line and notes, besides value and log.
VALUE_MARGIN = 200
#: What the sandbox's clock always says, so a rerun sees the same time.
FROZEN_CLOCK = datetime(2000, 1, 1, tzinfo=UTC)
#: Seconds the pool waits past a script's compute limit before it kills a stuck worker.
WORKER_GRACE = 10.0
NO_ACCESS = "Workflow scripts have no file, network, environment or OS access"
#: The host functions by name, with their parameters (``log`` takes any number of values).
PARAMETERS: dict[str, tuple[str, ...]] = {
    "agent": ("prompt", "isolation"),
    "parallel": ("prompts", "isolation"),
    "verify": ("prompt", "result"),
    "budget": (),
}
#: Parameters taken by keyword only, after the positional ones: a schema or an agent's name
#: passed by position, as in a script written before they existed, is still a TypeError.
KEYWORD_ONLY: dict[str, tuple[str, ...]] = {
    "agent": ("agent", "schema"),
    "parallel": ("agent", "schema"),
}
#: Parameters that may be left out, and what they are then.
DEFAULTS: dict[str, dict[str, object]] = {
    "agent": {"agent": None, "schema": None, "isolation": None},
    "parallel": {"agent": None, "schema": None, "isolation": None},
}


class ScriptError(Exception):
    """Why a script stopped, worded for the model, with the line it stopped at when known."""

    def __init__(self, message: str, line: int | None = None, trace: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.trace = trace


class AgentLimit(RuntimeError):
    """Raised inside the script when it asks for more agents than ``script_max_agents``."""


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


def check_imports(source: str) -> ScriptError | None:
    """The first import of a module outside :data:`ALLOWED_MODULES`, as an error.

    Monty has ``os``, ``pathlib`` and friends built in and would import them quietly (their
    calls are refused at run time anyway); refusing the import up front, wherever it is in
    the program, gives the model one clear message. Source that Python cannot parse is left
    to Monty, which reports the syntax error with its line.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ALLOWED_MODULES:
                return ScriptError(
                    f"the script may not import {name!r} — {NO_ACCESS}; it may import only "
                    f"{', '.join(sorted(ALLOWED_MODULES))}",
                    node.lineno,
                )
    return None


def script_seed(source: str) -> int:
    """The seed of the script's ``random``: the same program draws the same numbers."""
    return int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")


def plain(value: object) -> Any:
    """``value`` as JSON-ready data: sandbox tuples, sets, bytes and objects included."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    attributes = getattr(value, "attributes", None)  # a sandbox object, as a MontyClassProxy
    if isinstance(attributes, dict):
        return plain(attributes)
    return repr(value)


def agent_answer(result: AgentResult) -> dict[str, Any]:
    """What ``agent()`` returns: the report as a dict, or an error dict."""
    if not result.finished:
        return {"error": result.text, "status": result.status.value}
    try:
        decoded = json.loads(result.text)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        return decoded
    return {"summary": result.text, "findings": []}  # it answered in text, not a report


@dataclass
class ScriptLog:
    """The lines the model sees under the result: ``log()`` calls and ``print()`` output."""

    limit: int
    lines: list[str] = field(default_factory=list)
    dropped: int = 0
    _size: int = 0
    _partial: str = ""

    def add(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            room = self.limit - self._size
            if room <= 0:
                self.dropped += 1
                continue
            if len(line) > room:  # the line that fills the log is cut, not lost
                line = line[:room] + "…"
            self.lines.append(line)
            self._size += len(line) + 1

    def printed(self, _stream: str, text: str) -> None:
        """The sandbox's ``print()``, which arrives in pieces: whole lines go to the log."""
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self.add(line)

    def render(self) -> str:
        if self._partial:
            self.add(self._partial)
            self._partial = ""
        if not self.lines and not self.dropped:
            return ""
        more = f"\n[orchmode: {self.dropped} more log lines were dropped]" if self.dropped else ""
        return "[log]\n" + "\n".join(self.lines) + more


def _host_function(name: str) -> Callable[..., None]:
    """A stand-in the sandbox can hold when it names a host function without calling it."""

    def stand_in(*_args: object, **_kwargs: object) -> None:  # never called: calls suspend
        raise AssertionError("host functions are answered by the script runner")

    stand_in.__name__ = stand_in.__qualname__ = name
    return stand_in


STAND_INS = {name: _host_function(name) for name in (*PARAMETERS, "log")}


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
        events.emit(ScriptStarted(self.call, len(self.source.splitlines())))
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
        limits: ResourceLimits = {
            "max_feed_duration_secs": s.script_cpu_seconds,
            "max_memory": s.script_memory_mb * 1024 * 1024,
            "max_recursion_depth": s.script_recursion_limit,
            "max_suspensions": HOST_CALL_LIMIT,
        }
        policy: OSPolicy = {
            "random_start": {"seed": script_seed(self.source)},
            "datetime": FROZEN_CLOCK,
            "timezone": "utc",
            "sleep": "zero",
            "process_time": "zero",
        }
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
                    answer: ExternalResult = {"exception": _refusal(snapshot)}
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
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
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
            values = _bind(name, PARAMETERS[name], args, kwargs, KEYWORD_ONLY.get(name, ()))
            if name == "agent":
                subtask = _typed("agent()", values[0], values[2], values[3], self.engine.roles)
                where = self._isolation("agent", values[1])
                return {"return_value": await self._agent(subtask, where)}
            if name == "parallel":
                # its defaults, checked once
                _typed("parallel()", "-", values[2], values[3], self.engine.roles)
                where = self._isolation("parallel", values[1])
                return {
                    "return_value": await self._parallel(values[0], where, values[2], values[3])
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

    async def _agent(self, subtask: Subtask, where: str) -> dict[str, Any]:
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
    ) -> list[dict[str, Any]]:
        if not isinstance(prompts, list | tuple):
            raise TypeError(f"parallel() takes a list of prompts, not {type(prompts).__name__}")
        subtasks = [
            _typed(f"parallel() prompt {n}", p, agent, schema, self.engine.roles)
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
    ) -> dict[str, Any]:
        """agent()'s value; an isolated worker's is remembered, and names its change, so
        that verify() can check the change and the merge at the end can find it."""
        answer = agent_answer(result)
        self.asked[subtask.prompt] = subtask
        if tree is None:
            return answer
        key = self.engine.key_of("worker", subtask, "worktree")
        self.workers.append(_Isolated(index, key, result, tree, subtask))
        change = result.change
        if change is not None and not change.empty:
            answer["change"] = {"agent": index, "files": describe_change(change)}
        return answer

    async def _verify(self, prompt: object, result: object) -> dict[str, Any]:
        subtask = _prompt("verify", prompt)
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
            prompt_text = self.engine.verify_prompt(checked, worker.result, "worktree")
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
        done = [(w.index, w.key, w.subtask.prompt, w.result, w.verdict) for w in self.workers]
        return await self.engine.merge_verdicts(self.call, self.workers[0].tree, done)

    async def _budget(self) -> dict[str, Any]:
        s = self.engine.settings
        state = await self.engine.store.budget(self.engine.budget.session)
        answer: dict[str, Any] = {
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

    def _line_at(self, filename: str, offset: int) -> int | None:
        """The 1-based line of a UTF-8 byte offset into the program."""
        if not filename.startswith("<python-input"):
            return self.last_line  # inside eval() or the like: keep the last known line
        return self.source.encode()[:offset].count(b"\n") + 1

    def _failure(self, what: str, exc: MontySyntaxError | MontyRuntimeError) -> ScriptError:
        """A Monty error, with its line (the innermost frame) and a short trace."""
        display = exc.display("msg" if isinstance(exc, MontySyntaxError) else "type-msg")
        lines = [frame.line for frame in exc.traceback()]
        if "cannot suspend in this synchronous context" in display:
            display += (
                " — a host function cannot be handed to map(), sorted() and the like; call it "
                "in a loop or a comprehension, or use parallel()"
            )
        if "suspension limit" in display:
            display += (
                f" — a script may make at most {HOST_CALL_LIMIT} host calls (agent, parallel, "
                "verify, budget and log calls all count)"
            )
        if not lines:
            # Monty stops a time limit from outside the running code, so there is no frame.
            cpu = self.engine.settings.script_cpu_seconds
            if "time limit" in display:
                display += (
                    f" — the script used up its {cpu:g} s of computing (script_cpu_seconds), "
                    "time waiting on agents not counted; is there a loop that never ends?"
                )
            return ScriptError(f"{what}: {display}", None, self._last_call_note())
        trace = ""
        if len(lines) > 1:
            shown = [str(n) for n in lines[:3]]
            if len(lines) > 6:
                shown.append(f"… {len(lines) - 6} more …")
            shown += [str(n) for n in lines[max(3, len(lines) - 3) :]]
            trace = f"(called through lines {' → '.join(shown)})"
        return ScriptError(f"{what}: {display}", lines[-1], trace)

    def _last_call_note(self) -> str:
        if self.last_line is None:
            return "(no line number: it had made no host call yet)"
        return (
            f"(no line number: Monty reports none for this; the last host call was at "
            f"line {self.last_line})"
        )

    def _fit(self, value: str, log_text: str) -> str:
        """The value within what is left of the result's budget once the log is in."""
        engine = self.engine
        budget = self.tokens or engine.window.result_tokens
        room = max(budget - estimate_tokens(log_text) - VALUE_MARGIN, budget // 4)
        room = min(room, RESULT_LIMIT // CHARS_PER_TOKEN)
        if estimate_tokens(value) <= room:
            return value
        saved = None
        if engine.results is not None:
            saved = engine.results.write_text("script", self.source, value)
        fitted, note = fit_value(value, room, saved)
        engine.events.emit(
            ResultCondensed(
                self.call,
                estimate_tokens(value),
                estimate_tokens(fitted) + estimate_tokens(note),
                budget,
                note.removeprefix("[orchmode: ").removesuffix("]"),
                saved or "",
            )
        )
        return f"{fitted}\n{note}"

    def _source_line(self, line: int) -> str:
        lines = self.source.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    async def _tool_result(
        self,
        output: object,
        error: ScriptError | None,
        changes: list[str] = (),  # type: ignore[assignment]
    ) -> str:
        sections: list[str] = []
        log_text = self.log.render()
        if error is None:
            sections.append(self._fit(_render(output), log_text))
        else:
            head = error.message
            if error.line is not None:
                head = f"{head} (line {error.line})"
                code = self._source_line(error.line)
                if code:
                    head += f"\n    {error.line} | {code}"
            if error.trace:
                head += f"\n{error.trace}"
            sections.append(f"error: {head}")
        if log_text:
            sections.append(log_text)
        if error is not None and self.agents:
            sections.append(
                f"[orchmode: the script had asked for {_agents(self.agents)} before it stopped; "
                "the finished ones are in the journal, so a corrected script that asks the same "
                "prompts gets their results back without running them again]"
            )
        state = await self.engine.store.budget(self.engine.budget.session)
        if self.skipped:
            sections.append(
                f"[orchmode: the session's budget is used up "
                f"({self.engine.budget.describe(state)}): {_agents(self.skipped)} of this "
                "script were not run and came back as errors with status 'skipped'. Rerunning "
                "them needs more budget: narrow the work to what matters most, or ask the user "
                "to raise --max-subagents, --max-session-tokens or --max-cost.]"
            )
        lines = [line for line in changes if not line.endswith("] no change")]
        if lines:
            sections.append("\n".join(lines))
        sections.append(self.engine.budget_status(state))
        return "\n\n".join(sections)


def _render(output: object) -> str:
    """The return value as JSON text, whole (:meth:`ScriptRun._fit` holds it to its budget)."""
    text = json.dumps(plain(output), ensure_ascii=False)
    if output is None:
        text += (
            "\n\n[orchmode: the script returned nothing — its result is the value of its last "
            "line when that line is an expression, e.g. `results`]"
        )
    return text


def _agents(count: int) -> str:
    return f"{count} agent" if count == 1 else f"{count} agents"


def _bind(
    name: str,
    parameters: tuple[str, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    keyword_only: tuple[str, ...] = (),
) -> list[Any]:
    """Arguments in parameter order, the keyword-only ones last, raising the TypeError
    Python would for a bad call."""
    if len(args) > len(parameters):
        raise TypeError(
            f"{name}() takes {len(parameters)} arguments ({len(args)} given): "
            f"{name}({', '.join(parameters)})"
        )
    values = {**DEFAULTS.get(name, {}), **dict(zip(parameters, args, strict=False))}
    given = set(parameters[: len(args)])
    for key, value in kwargs.items():
        if key not in (*parameters, *keyword_only) or key in given:
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
        values[key] = value
    missing = [p for p in (*parameters, *keyword_only) if p not in values]
    if missing:
        raise TypeError(f"{name}() is missing its argument {missing[0]!r}")
    return [values[p] for p in (*parameters, *keyword_only)]


@dataclass
class _Isolated:
    """A script's worker that ran in a copy of the tree."""

    index: int
    key: str
    result: AgentResult
    tree: TreeJob
    #: What it was asked: its prompt, its result's schema, its role.
    subtask: Subtask
    verdict: str | None = None


def _prompt(function: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{function}() takes prompts as strings, not {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{function}() was given an empty prompt")
    return value.strip()


def _typed(
    function: str,
    value: object,
    agent: object,
    schema: object,
    roles: Mapping[str, AgentDefinition],
) -> Subtask:
    """A subtask from a string or a ``{"prompt", "agent", "schema"}`` object; ``agent``
    and ``schema`` are the call's own, which an object's keys override."""
    if isinstance(value, dict):
        item = {"agent": agent, "schema": schema, **plain(value)}
        taken = subtask_object({k: v for k, v in item.items() if v is not None}, roles)
        if isinstance(taken, str):
            raise ValueError(f"{function}: {taken}")
        return taken
    if not isinstance(value, str):
        raise TypeError(
            f"{function} takes a prompt as a string or a {{prompt, schema}} object, "
            f"not {type(value).__name__}"
        )
    if not value.strip():
        raise ValueError(f"{function} was given an empty prompt")
    prompt = value.strip()
    taken = subtask_object({"prompt": prompt, "agent": agent, "schema": plain(schema)}, roles)
    if isinstance(taken, str):
        raise ValueError(f"{function}: {taken}")
    return taken


def _refusal(snapshot: AsyncFunctionSnapshot) -> Exception:
    """The exception an OS call gets inside the sandbox: all of them are refused."""
    if snapshot.function_name == "import":
        module = snapshot.args[0] if snapshot.args else "?"
        return ImportError(f"no module named {module!r} can be imported: {NO_ACCESS}")
    return PermissionError(f"{snapshot.function_name} is not allowed: {NO_ACCESS}")
