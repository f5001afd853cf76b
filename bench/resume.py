"""What being resumable costs a run, and how soon `orchmode resume` is back at work.

A run checkpoints its main conversation at every step (``Store.record_messages``: the
assistant's reply, then the tool results), so that a killed run resumes where it stopped.
The checkpoint is awaited before the run moves on. Three parts, each printed as figures
(nothing here gates CI):

1. **Checkpoint cost per step**, per store: onto a session with 200 recorded messages
   (``--prior``; assistant messages of about 2 KB of JSON alternating with tool-results
   messages of about 6 KB), ``--appends`` times append one assistant message at index 200
   and one tool-results message at 201, timing each checkpoint, and truncate back to 200
   untimed. Median, p95 and max ms of each kind (target <= 5 ms per checkpoint on SQLite),
   and two rarer operations: a compaction's rewrite of all 200 messages and the load a
   resume does. Each checkpoint is durable when it returns: SQLite in a temporary file
   (WAL, ``synchronous=FULL``), PostgreSQL on a throw-away local server
   (``postgres_server`` of ``tests/support/postgres.py``, fsync on), skipped with the reason
   printed when it cannot be started.
2. **Its share of a real turn**: one orchestrated turn in this process (``Conversation``, the
   scripted server in a thread, the store in a temporary directory) of 200 subtasks, 0.2 s
   per model request, 50 in flight, with the store's ``record_messages`` wrapped to time
   every checkpoint the session makes: their number, total time, the turn's wall time and
   the share (target <= 1 %). On each store.
3. **From `orchmode resume` to its first new model request, 1,000 results recorded**:
   ``orchmode run`` (a real process, SQLite journal, ``--claim-lease 2``, 100 in flight) of
   a main agent that fans out 1,000 subtasks, its verifiers' replies held back
   ``--verifier-delay`` seconds, is SIGKILLed once its journal holds 1,000 results (the
   fan-out half done); then ``orchmode resume`` starts, and the time from starting that
   process to the first new ``/v1/messages`` request the server receives is printed
   (``time.monotonic()``, one clock for every process on Linux; the resume has a server
   of its own, sharing the scripted model, so that a request the killed run had sent is
   never counted as the resume's), next to the start-up of ``orchmode --help`` measured
   the same way (and of ``python -c "import anthropic"``). Of it, the wait for the killed
   run's claims to lapse (the session's, then its agents'). Where the rest goes comes from
   a ``sitecustomize`` put on the resumed process's path (:data:`HOOK`) that only appends
   timestamps of a few calls to a list, written out at exit: the store's open, events,
   claim, lookup and reserve, the parse of the session's events, the restore, the
   Workflow's start, journal hits served, and a request's way through the gateway and the
   SDK to aiohttp. The resume must exit 0 without asking for a new plan (one Workflow
   call in all) and without running a recorded worker again.

    .venv/bin/python bench/resume.py [--parts 1,2,3] [--backends sqlite,postgres]
        [--appends 500] [--prior 200] [--results 1000] [--verifier-delay 2] [--no-hook]
        [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from orchmode.core.events import EventBus
from orchmode.core.prompts import VERIFY_MARKER
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.store import Store, open_store
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of

BACKENDS = ("sqlite", "postgres")
PARTS = (1, 2, 3)
API_KEY = "test-key"
SESSION = "bench-session"
ASSISTANT_BYTES = 2_000
TOOL_RESULTS_BYTES = 6_000
#: Targets: one SQLite checkpoint, in seconds; a turn's checkpoints against the turn.
SQLITE_TARGET = 0.005
TURN_SHARE_TARGET = 0.01
#: How many times the rare operations (a full rewrite, a load) are timed.
RARE_REPEATS = 30
#: Part 2: the turn.
TURN_SUBTASKS = 200
TURN_DELAY = 0.2
TURN_CONCURRENT = 50
#: Seconds the turn may take before the benchmark gives up on it.
TURN_DEADLINE = 300.0
#: Part 3: the killed run and its resume.
LEASE = 2.0
RESUME_CONCURRENT = 100
RESUME_SUBTASKS = 1000
RESUME_MAX_SUBAGENTS = 3000
#: Seconds the killed run may take to record its results, and the resume to finish.
KILL_DEADLINE = 180.0
RESUME_DEADLINE = 300.0
#: How many times ``orchmode --help`` is timed for the start-up baseline (the median).
HELP_REPEATS = 5

VOCABULARY = (
    "the handler retries request timeout cache parser returns null when config is missing "
    "path lock file writes buffer before flush thread pool leaks connection on error branch "
    "test covers only happy case migration drops index query scans whole table log line "
    "exposes token header validation skips empty field loop exits early counter overflows"
)
WORDS = VOCABULARY.split()


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def load() -> str:
    """The 1-minute load average against the cores: how busy the machine was."""
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------- 1. checkpoint cost per step


def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def assistant_message(rng: random.Random, n: int) -> str:
    """An assistant reply of about 2 KB: some reasoning text and a fan-out tool call."""
    prompts: list[str] = []
    message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": sentence(rng, 20, 40)},
            {
                "type": "tool_use",
                "id": f"toolu_{n:06d}",
                "name": "Workflow",
                "input": {"subtasks": prompts},
            },
        ],
    }
    while len(json.dumps(message)) < ASSISTANT_BYTES:
        prompts.append(sentence(rng, 10, 25))
    return json.dumps(message)


def tool_results_message(rng: random.Random, n: int) -> str:
    """A tool-results message of about 6 KB: the fan-out's findings, summarised."""
    findings: list[dict[str, str]] = []
    message = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n:06d}", "content": findings}],
    }
    while len(json.dumps(message)) < TOOL_RESULTS_BYTES:
        findings.append(
            {
                "claim": sentence(rng, 8, 18),
                "evidence": f"src/module_{rng.randint(1, 99)}.py:{rng.randint(1, 900)}",
                "severity": rng.choice(["high", "medium", "low", "info"]),
            }
        )
    return json.dumps(message)


def conversation(rng: random.Random, count: int) -> list[str]:
    """``count`` messages, assistant replies and tool results taking turns."""
    return [
        assistant_message(rng, n) if n % 2 == 0 else tool_results_message(rng, n)
        for n in range(count)
    ]


@dataclass
class StepCost:
    name: str
    assistant: list[float]
    tool_results: list[float]
    rewrite: list[float]
    load: list[float]


async def step_cost(name: str, store: Store, prior: int, appends: int, seed: int) -> StepCost:
    """Time appends onto a ``prior``-message conversation, then the rarer operations."""
    rng = random.Random(seed)
    head = conversation(rng, prior)
    replies = [assistant_message(rng, prior + 2 * i) for i in range(appends)]
    results = [tool_results_message(rng, prior + 2 * i + 1) for i in range(appends)]
    await store.record_messages(SESSION, 0, head)
    assistant: list[float] = []
    tool_results: list[float] = []
    for reply, result in zip(replies, results, strict=True):
        before = time.perf_counter()
        await store.record_messages(SESSION, prior, [reply])
        middle = time.perf_counter()
        await store.record_messages(SESSION, prior + 1, [result])
        after = time.perf_counter()
        assistant.append(middle - before)
        tool_results.append(after - middle)
        await store.record_messages(SESSION, prior, [])  # back to ``prior``, untimed
    rewrite: list[float] = []
    load: list[float] = []
    for _ in range(RARE_REPEATS):
        before = time.perf_counter()
        await store.record_messages(SESSION, 0, head)
        rewrite.append(time.perf_counter() - before)
        before = time.perf_counter()
        loaded = await store.load_messages(SESSION)
        load.append(time.perf_counter() - before)
        if loaded != head:
            raise SystemExit(f"{name}: the conversation did not come back as recorded")
    return StepCost(name, assistant, tool_results, rewrite, load)


def report_step_cost(cost: StepCost, prior: int) -> None:
    print(f"  {cost.name}:")
    for label, values, size in (
        ("assistant message", cost.assistant, ASSISTANT_BYTES),
        ("tool-results message", cost.tool_results, TOOL_RESULTS_BYTES),
    ):
        print(
            f"    append one {label} (~{size // 1000} KB) onto {prior}: median "
            f"{ms(statistics.median(values))}, p95 {ms(percentile(values, 95))}, "
            f"max {ms(max(values))}  ({len(values)} checkpoints)"
        )
    worst = percentile(cost.assistant + cost.tool_results, 95)
    if cost.name == "sqlite":
        verdict = "met" if worst <= SQLITE_TARGET else "MISSED"
        print(f"    p95 per checkpoint {ms(worst)}: target <= {ms(SQLITE_TARGET)} {verdict}")
    else:
        print(f"    p95 per checkpoint {ms(worst)}")
    print(
        f"    rare: rewrite all {prior} messages median {ms(statistics.median(cost.rewrite))}; "
        f"load them median {ms(statistics.median(cost.load))}  ({RARE_REPEATS} each)"
    )


async def step_cost_on(url: str, name: str, prior: int, appends: int, seed: int) -> StepCost:
    store = await open_store(url)
    try:
        return await step_cost(name, store, prior, appends, seed)
    finally:
        await store.close()


# ------------------------------------------------------------- 2. the share of a real turn


@dataclass
class CheckpointTimer:
    """Wraps a store's ``record_messages``: the time and size of every checkpoint; and, on
    the side, its ``save_session`` (the whole state, at a turn's start and end)."""

    store: Store
    times: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    saves: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._record = self.store.record_messages
        self._save = self.store.save_session
        self.store.record_messages = self.record_messages  # type: ignore[method-assign]
        self.store.save_session = self.save_session  # type: ignore[method-assign]

    async def record_messages(self, session: str, start: int, messages: Sequence[str]) -> None:
        before = time.perf_counter()
        try:
            await self._record(session, start, messages)
        finally:
            self.times.append(time.perf_counter() - before)
            self.sizes.append(sum(len(m.encode("utf-8")) for m in messages))

    async def save_session(self, session: str, workdir: str, state: str) -> None:
        before = time.perf_counter()
        try:
            await self._save(session, workdir, state)
        finally:
            self.saves.append((time.perf_counter() - before, len(state.encode("utf-8"))))


@dataclass
class TurnShare:
    name: str
    wall: float
    times: list[float]
    sizes: list[int]
    saves: list[tuple[float, int]]
    requests: int
    stop: str


async def real_turn(name: str, store: Store, url: str, workdir: Path) -> TurnShare:
    """One orchestrated turn of ``TURN_SUBTASKS`` subtasks, every checkpoint timed."""
    timer = CheckpointTimer(store)
    settings = Settings(
        base_url=url,
        workdir=workdir,
        max_retries=0,
        max_concurrent=TURN_CONCURRENT,
        max_subtasks=TURN_SUBTASKS,
        max_subagents=2 * TURN_SUBTASKS + 10,
    )
    events = EventBus()
    credentials = Credentials(api_key=API_KEY)
    async with open_conversation(settings, credentials, events=events, store=timer) as session:
        started = time.perf_counter()
        result = await asyncio.wait_for(
            session.turn("Review this repository for bugs."), TURN_DEADLINE
        )
        wall = time.perf_counter() - started
        gateway = session.gateway
    if result.error is not None:
        raise SystemExit(f"{name}: the turn failed: {result.error}")
    return TurnShare(
        name, wall, timer.times, timer.sizes, timer.saves, gateway.requests, result.stop
    )


def turn_share_on(name: str, url: str | None) -> TurnShare:
    """The turn against a fresh scripted server; ``url`` None: SQLite in a temporary dir."""
    scenario = OrchestrationScenario(subtasks=TURN_SUBTASKS, delay=TURN_DELAY, worker_command=None)
    server = ScriptedServer(scenario, api_key=API_KEY)
    with server.in_thread(), tempfile.TemporaryDirectory(prefix="orchmode-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "notes.txt").write_text("a file for the scout to find\n")

        async def run() -> TurnShare:
            store = await open_store(url or f"sqlite://{workdir / 'store.db'}")
            try:
                return await real_turn(name, store, server.url, workdir)
            finally:
                await store.close()

        return asyncio.run(run())


def report_turn_share(share: TurnShare) -> None:
    total = sum(share.times)
    verdict = "met" if total / share.wall <= TURN_SHARE_TARGET else "MISSED"
    largest = max(range(len(share.sizes)), key=share.sizes.__getitem__)
    print(
        f"  {share.name}: {len(share.times)} checkpoints, {ms(total)} in all; turn wall time "
        f"{share.wall:.3f} s ({share.requests} model requests, stop {share.stop}): share "
        f"{total / share.wall:.4%}  (target <= {TURN_SHARE_TARGET:.0%}) {verdict}"
    )
    each = ", ".join(
        f"{size / 1000:.1f} KB {t * 1000:.2f} ms"
        for size, t in zip(share.sizes, share.times, strict=True)
    )
    print(
        f"    each checkpoint (bytes written, time): {each}; the largest "
        f"({share.sizes[largest] / 1000:.0f} KB) {ms(share.times[largest])}"
    )
    saves = ", ".join(f"{size / 1000:.1f} KB {t * 1000:.2f} ms" for t, size in share.saves)
    print(
        f"    besides: {len(share.saves)} saves of the whole session state (not checkpoints): "
        f"{saves}"
    )


# ---------------------------------------------------------------- 3. resume to first request


#: Put on the resumed process's path as ``sitecustomize``: it timestamps a few store and
#: session calls (``time.monotonic()``) and writes them as JSON to $BENCH_RESUME_MARKS at
#: exit. It imports nothing of orchmode itself: the modules are patched as they load.
HOOK = """
import atexit, functools, importlib.abc, importlib.util, json, os, sys, time

_path = os.environ.get("BENCH_RESUME_MARKS")
_marks = []


def _outcome(name, result):
    if name == "events":
        return len(result)
    if name in ("lookup", "claim"):
        return bool(result)
    return None


def _timed(name, fn):
    @functools.wraps(fn)
    async def timed(self, *args, **kwargs):
        started = time.monotonic()
        result = await fn(self, *args, **kwargs)
        what = str(args[0])[:80] if args else ""
        _marks.append([name, started, time.monotonic(), what, _outcome(name, result)])
        return result
    return timed


def _timed_sync(name, fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        started = time.monotonic()
        result = fn(*args, **kwargs)
        _marks.append([name, started, time.monotonic(), "", None])
        return result
    return timed


def _entered(name, fn, what=lambda args, kwargs: ""):
    @functools.wraps(fn)
    async def entered(self, *args, **kwargs):
        _marks.append([name, time.monotonic(), None, what(args, kwargs), None])
        return await fn(self, *args, **kwargs)
    return entered


def _store(module):
    cls = module.SQLiteStore
    for name in ("events", "claim", "lookup", "holder", "release", "reserve"):
        if hasattr(cls, name):
            setattr(cls, name, _timed(name, getattr(cls, name)))
    cls.open = classmethod(_timed_sync("open", cls.open.__func__))


def _history(module):
    module.read_session = _timed_sync("read_session", module.read_session)


def _agent(module):
    module.Conversation.restore = _timed("restore", module.Conversation.restore)
    module.Conversation.resume_turn = _entered("resume_turn", module.Conversation.resume_turn)


def _local(module):
    module.LocalExecutor.start = _timed("executor_start", module.LocalExecutor.start)


def _engine(module):
    engine = module.FanoutEngine
    engine._journal_hit = _timed_sync("journal_hit", engine._journal_hit)


def _model(module):
    gateway = module.ModelGateway
    agent = lambda args, kwargs: str(kwargs.get("agent", ""))
    gateway.complete = _entered("complete", gateway.complete, agent)
    gateway._stream = _entered("stream", gateway._stream)


def _transport(module):
    transport = module.AiohttpTransport
    path = lambda args, kwargs: str(args[0].url.path) if args else ""
    transport.handle_async_request = _entered("http", transport.handle_async_request, path)


_patches = {
    "orchmode.store.sqlite": _store,
    "orchmode.records.history": _history,
    "orchmode.session.agent": _agent,
    "orchmode.executors.local": _local,
    "orchmode.fanout.engine": _engine,
    "orchmode.model.gateway": _model,
    "anthropic._vendor.httpx_aiohttp.transport": _transport,
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        patch = _patches.pop(name, None)
        if patch is None:
            return None
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            try:
                patch(module)
            except Exception as exc:  # renamed since: that mark is missing, nothing else
                _marks.append(["unpatched", time.monotonic(), None, f"{name}: {exc}", None])

        spec.loader.exec_module = exec_module
        return spec


def _write():
    with open(_path, "w") as out:
        json.dump(_marks, out)


if _path:
    sys.meta_path.insert(0, _Finder())
    atexit.register(_write)
"""


@dataclass
class SlowVerifiers:
    """The scenario, with every verifier's reply held back ``delay`` seconds, counting the
    Workflow calls the main agent makes (a resume must not make another)."""

    scenario: OrchestrationScenario
    delay: float
    workflow_calls: int = 0
    roles: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: ScriptedRequest) -> Reply:
        reply = self.scenario(request)
        if role_of(request.body) == "main":
            role = "main"
        elif first_user_text(request).startswith(VERIFY_MARKER):
            role = "verifier"
            reply.delay = max(reply.delay, self.delay)
        else:
            role = "worker"
        with self._lock:
            self.roles[role] += 1
            self.workflow_calls += sum(
                1 for b in reply.content if b.get("type") == "tool_use" and b["name"] == "Workflow"
            )
        return reply


def child_env(**extra: str) -> dict[str, str]:
    """This environment without any credential or orchmode setting; the scripted key."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "ORCHMODE_", "ORCH_"))
    }
    env["ANTHROPIC_API_KEY"] = API_KEY
    env.update(extra)
    return env


def read_only(journal: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)


def recorded_results(journal: Path) -> Counter[str]:
    """Results recorded in a SQLite journal by role, read-only (none before it exists)."""
    if not journal.exists():
        return Counter()
    try:
        db = read_only(journal)
        try:
            rows = db.execute("SELECT role, COUNT(*) FROM results GROUP BY role").fetchall()
        finally:
            db.close()
    except sqlite3.OperationalError:  # not created yet
        return Counter()
    return Counter({str(role): int(n) for role, n in rows})


def claims(journal: Path) -> list[tuple[str, str, float]]:
    db = read_only(journal)
    try:
        rows = db.execute("SELECT key, holder, expires_at FROM claims").fetchall()
    finally:
        db.close()
    return [(str(k), str(h), float(e)) for k, h, e in rows]


@contextmanager
def timestamped_lines(stream: TextIO) -> Iterator[list[tuple[float, str]]]:
    """Read ``stream`` on a thread; each line with the ``time.monotonic()`` it arrived."""
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in stream:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield lines
    finally:
        reader.join(timeout=10)


def startup(*args: str, repeats: int = HELP_REPEATS) -> list[float]:
    """``python ARGS`` from starting the process to its exit, measured as the resume is."""
    times = []
    for _ in range(repeats):
        started = time.monotonic()
        subprocess.run(
            [sys.executable, *args],
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=60,
        )
        times.append(time.monotonic() - started)
    return times


@dataclass
class KilledRun:
    """What ``orchmode run`` left when it was killed."""

    after: float
    results: Counter[str]
    #: when its first and its last result were recorded, seconds after its start
    first_result: float
    last_result: float
    #: (key, holder, expires_at on ``time.monotonic()``) of every claim it left
    claims: list[tuple[str, str, float]]
    #: the prompts of the workers it recorded
    workers: set[str]


@dataclass
class Resumed:
    """The resume: when it started, what it sent and printed, and the hook's marks."""

    t0: float
    finished: float
    code: int
    stdout: str
    lines: list[tuple[float, str]]
    #: the server's log entries of its /v1/messages requests
    requests: list[Any]
    #: [name, started, ended or None, what, outcome] from the hook
    marks: list[list[Any]]
    results: Counter[str]


def kill_when_recorded(
    flags: Sequence[str], workdir: Path, journal: Path, results: int, stderr: Path
) -> KilledRun:
    """Start ``orchmode run`` and SIGKILL it once its journal holds ``results`` results."""
    started = time.monotonic()
    with open(stderr, "w") as errors:
        run = subprocess.Popen(
            [sys.executable, "-m", "orchmode", "run", "review this", *flags],
            cwd=workdir,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
        )
        try:
            while sum(recorded_results(journal).values()) < results:
                if run.poll() is not None:
                    raise SystemExit(
                        f"the run ended (exit {run.returncode}) before it could be killed:\n"
                        + stderr.read_text()[-2000:]
                    )
                if time.monotonic() - started > KILL_DEADLINE:
                    raise SystemExit("the run never recorded enough results")
                time.sleep(0.02)  # polling the journal another process writes
            run.send_signal(signal.SIGKILL)
            killed = time.monotonic()
        finally:
            run.kill()
            run.wait()
    offset = time.time() - time.monotonic()
    left = [(key, holder, expires - offset) for key, holder, expires in claims(journal)]
    db = read_only(journal)
    try:
        low, high = db.execute("SELECT MIN(recorded_at), MAX(recorded_at) FROM results").fetchone()
        workers = {r[0] for r in db.execute("SELECT prompt FROM results WHERE role = 'worker'")}
    finally:
        db.close()
    since = started + offset
    return KilledRun(
        killed - started, recorded_results(journal), low - since, high - since, left, workers
    )


def resume(
    flags: Sequence[str], workdir: Path, root: Path, server: ScriptedServer, *, hook: bool
) -> Resumed:
    """``orchmode resume``, instrumented by the hook (unless not ``hook``), its stderr
    lines timestamped."""
    marks = root / "marks.json"
    env = child_env()
    if hook:
        where = root / "hook"
        where.mkdir()
        (where / "sitecustomize.py").write_text(HOOK)
        path = os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH")) if p)
        env = child_env(PYTHONPATH=path, BENCH_RESUME_MARKS=str(marks))
    t0 = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", "resume", *flags],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    with timestamped_lines(process.stdout) as out, timestamped_lines(process.stderr) as lines:
        try:
            process.wait(timeout=RESUME_DEADLINE)
        except subprocess.TimeoutExpired:
            raise SystemExit("the resume did not finish in time") from None
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        finished = time.monotonic()
    stdout = "\n".join(line for _, line in out)
    requests = [e for e in server.log if e.path == "/v1/messages"]
    recorded = json.loads(marks.read_text()) if marks.exists() else []
    results = recorded_results(workdir / ".orchmode" / "journal.db")
    return Resumed(t0, finished, process.returncode, stdout, lines, requests, recorded, results)


def resume_part(results: int, verifier_delay: float, *, hook: bool = True) -> None:
    """Kill a run mid-fan-out, resume it, report. The run and the resume talk to two
    servers that share one scripted model: a request the killed run had sent is never
    taken for the resume's (the server logs a request once it has read all of it)."""
    responder = SlowVerifiers(
        OrchestrationScenario(subtasks=RESUME_SUBTASKS, scout_command=None, worker_command=None),
        verifier_delay,
    )
    killed_server = ScriptedServer(responder, api_key=API_KEY)
    resume_server = ScriptedServer(responder, api_key=API_KEY)
    with ExitStack() as stack:
        stack.enter_context(killed_server.in_thread())
        stack.enter_context(resume_server.in_thread())
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orchmode-bench-")))
        settings = [
            "--sandbox", "off", "--claim-lease", f"{LEASE:g}",
            "--max-concurrent", str(RESUME_CONCURRENT), "--max-subtasks", str(RESUME_SUBTASKS),
            "--max-subagents", str(RESUME_MAX_SUBAGENTS),
        ]  # fmt: skip
        workdir = root / "work"
        workdir.mkdir()
        journal = workdir / ".orchmode" / "journal.db"
        flags = ["--base-url", killed_server.url, *settings]
        killed = kill_when_recorded(flags, workdir, journal, results, root / "run.stderr")
        flags = ["--base-url", resume_server.url, *settings]
        resumed = resume(flags, workdir, root, resume_server, hook=hook)
    report_resume(killed, resumed, responder.workflow_calls)


def report_resume(killed: KilledRun, resumed: Resumed, workflow_calls: int) -> None:
    total = 2 * RESUME_SUBTASKS
    at_kill = killed.results
    session_left = [c for c in killed.claims if c[0].startswith("session:")]
    agents_left = [c for c in killed.claims if not c[0].startswith("session:")]
    print(
        f"  the run: killed {killed.after:.1f} s after its start, {sum(at_kill.values())} of "
        f"{total} results recorded ({at_kill['worker']} workers, {at_kill['verifier']} "
        f"verifiers; the first at +{killed.first_result:.1f} s, the last at "
        f"+{killed.last_result:.1f} s); it left {len(agents_left)} subagent claims and "
        f"{len(session_left)} session claim"
    )
    if sum(at_kill.values()) >= total:
        print("  WARNING: the fan-out had finished before the kill")
    if not resumed.requests:
        raise SystemExit(f"the resume (exit {resumed.code}) sent no model request")
    t0 = resumed.t0
    first = min(resumed.requests, key=lambda e: e.started)
    to_first = first.started - t0
    helps = startup("-m", "orchmode", "--help")
    sdk = startup("-c", "import anthropic")
    baseline = statistics.median(helps)
    print(
        f"  orchmode resume -> first new /v1/messages request: {to_first:.3f} s "
        f"(a {role_of(first.body)}'s); the resume took {resumed.finished - t0:.1f} s in all, "
        f"exit {resumed.code}"
    )
    print(
        f"  baseline `orchmode --help`, start to exit: median {baseline:.3f} s "
        f"({', '.join(f'{h:.3f}' for h in helps)}): the first request came "
        f"{to_first / baseline:.1f}x as late; `python -c 'import anthropic'`: median "
        f"{statistics.median(sdk):.3f} s"
    )

    marks = resumed.marks

    def at(t: float) -> str:
        return f"{t - t0:+.3f} s"

    def calls(name: str, *, before: float | None = None) -> list[list[Any]]:
        found = [m for m in marks if m[0] == name]
        return found if before is None else [m for m in found if m[1] < before]

    def spent(found: list[list[Any]]) -> str:
        return f"{sum(m[2] - m[1] for m in found) * 1000:.1f} ms"

    tries = calls("claim")
    session_tries = [m for m in tries if str(m[3]).startswith("session:")]
    agent_tries = [m for m in tries if not str(m[3]).startswith("session:")]
    session_won = next((m for m in session_tries if m[4]), None)
    session_wait = session_won[2] - session_tries[0][1] if session_won else 0.0
    early = [m for m in agent_tries if m[1] < first.started]
    agent_won = next((m for m in early if m[4]), None)
    agent_wait = agent_won[2] - early[0][1] if early and agent_won else 0.0
    if marks:
        print(
            f"  of which waiting for the killed run's claims to lapse: "
            f"{session_wait + agent_wait:.3f} s (the session claim {session_wait:.3f} s, "
            f"{len(session_tries)} tries; subagent claims {agent_wait:.3f} s, "
            f"{sum(1 for m in early if not m[4])} of {len(early)} tries before the first "
            "request refused)"
        )
    else:
        print("  (no timestamps from the hook: the claim waits and the breakdown are not known)")
    for m in calls("unpatched"):
        print(f"  (the hook could not time {m[3]})")
    steps: list[tuple[float, str]] = []

    def step(found: list[list[Any]], text: str, *, end: bool = False) -> None:
        if found:
            steps.append((found[0][2] if end else found[0][1], text))

    opens, events, parses = calls("open"), calls("events"), calls("read_session")
    step(opens, f"the store opens: start-up and imports done ({len(opens)} opens, {spent(opens)})")
    if events:
        step(events, f"reads the session's {events[0][4]} events ({spent(events[:1])})")
    step(parses, f"... parses them: interrupted ({spent(parses[:1])})", end=True)
    step(calls("executor_start"), "the executor starts")
    if session_tries:
        held = f"held {at(session_won[2])}" if session_won else "never held"
        left = (
            f"; the killed run's lapsed {at(min(c[2] for c in session_left))}"
            if session_left
            else ""
        )
        step(session_tries, f"the session claim tried ({held}{left})")
    if len(events) > 1:
        steps.append(
            (events[1][1], f"looks again, holding it: events and parse ({spent(events[1:2])} + "
             f"{spent(parses[1:2])})")
        )  # fmt: skip
    restores = calls("restore")
    step(restores, f"restores the conversation from its checkpoints ({spent(restores)})")
    resuming = [[0, t, t] for t, line in resumed.lines if "[session] resuming" in line]
    step(resuming, "stderr: '[session] resuming ...'")
    turns = calls("resume_turn")
    step(turns, "the Workflow call runs again from its recorded input")
    lookups = calls("lookup", before=first.started)
    hits = calls("journal_hit", before=first.started)
    step(
        lookups,
        f"first journal lookup; before the first request {len(lookups)} lookups "
        f"({sum(1 for m in lookups if m[4])} hits, {spent(lookups)}) and {len(hits)} hits "
        f"served ({spent(hits)}: their events and progress lines)",
    )
    if early:
        lapsed = (
            f"; the killed run's lapsed {at(min(c[2] for c in agents_left))} to "
            f"{at(max(c[2] for c in agents_left))}"
            if agents_left
            else ""
        )
        step(early, f"first subagent claim; {len(early)} before the first request "
             f"({spent(early)}){lapsed}")  # fmt: skip
    reserves = calls("reserve", before=first.started)
    step(reserves, f"first budget reservation ({len(reserves)} before the first request)")
    completes = calls("complete")
    step(completes, f"first model request begun ({completes[0][3] if completes else ''})")
    step(calls("stream"), "... past the budget and the rate limit, into the SDK")
    handed = [m for m in calls("http") if m[3].endswith("/messages")]
    step(handed, "... the SDK hands it to aiohttp")
    for n in (10, RESUME_CONCURRENT):
        if n <= len(handed):
            steps.append((handed[n - 1][1], f"the SDK hands the {n}th request to aiohttp"))
    steps.append((first.started, "... the server has it"))
    arrivals = sorted(e.started for e in resumed.requests)
    wave = [n for n in (10, RESUME_CONCURRENT) if n <= len(arrivals)]
    for n in wave:
        steps.append((arrivals[n - 1], f"the server has the first {n} requests"))
    print("  where it went (from starting the process; sorted):")
    for t, text in sorted(steps, key=lambda s: s[0]):
        print(f"    {at(t)}  {text}")

    roles = Counter(role_of(e.body) for e in resumed.requests)
    again = {
        first_user_text(ScriptedRequest(index=0, body=e.body, headers={}))
        for e in resumed.requests
        if role_of(e.body) == "worker"
    } & killed.workers
    print(
        f"  the resume's requests: {len(resumed.requests)} ({roles['worker']} workers, "
        f"{roles['verifier']} verifiers, {roles['main']} main); workers not recorded at the "
        f"kill {RESUME_SUBTASKS - at_kill['worker']}; recorded workers run again: "
        f"{len(again)}; results now {sum(resumed.results.values())} of {total}"
    )
    synthesis = next((ln for ln in resumed.stdout.splitlines() if ln.startswith("Synthesis")), "")
    print(f"  its answer: {synthesis or '(no synthesis line)'}")
    verdict = "ok" if workflow_calls == 1 else "WRONG: the resume asked for a new plan"
    print(
        f"  Workflow calls by the main agent, run and resume together: {workflow_calls} {verdict}"
    )
    if resumed.code != 0:
        tail = "\n".join(line for _, line in resumed.lines[-15:])
        print(f"  WARNING: the resume exited {resumed.code}; its stderr ended:\n{tail}")


# ------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="1,2,3", help="which parts to run")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="for parts 1 and 2")
    parser.add_argument(
        "--appends", type=int, default=500, help="part 1: timed appends of each kind"
    )
    parser.add_argument("--prior", type=int, default=200, help="part 1: messages already recorded")
    parser.add_argument("--results", type=int, default=1000, help="part 3: results at the kill")
    parser.add_argument(
        "--verifier-delay", type=float, default=2.0, help="part 3: seconds a verifier's reply waits"
    )
    parser.add_argument(
        "--no-hook", action="store_true", help="part 3: resume uninstrumented (no breakdown)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        parts = {int(p) for p in args.parts.split(",") if p.strip()}
    except ValueError:
        parser.error("--parts is a comma-separated list of 1, 2 and 3")
    if parts - set(PARTS):
        parser.error("--parts is a comma-separated list of 1, 2 and 3")
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(chosen) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    if args.prior < 0 or args.appends < 1 or args.results < 1:
        parser.error("--prior must be >= 0, --appends and --results >= 1")
    if args.results >= 2 * RESUME_SUBTASKS:
        parser.error(f"--results must be below {2 * RESUME_SUBTASKS}: the kill is mid-fan-out")

    with ExitStack() as stack:
        urls: dict[str, str | None] = {}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orchmode-bench-")))
        if "sqlite" in chosen:
            urls["sqlite"] = f"sqlite://{tmp / 'checkpoint.db'}"
        if "postgres" in chosen and parts & {1, 2}:
            from support.postgres import postgres_server

            try:
                urls["postgres"] = stack.enter_context(postgres_server())
            except Exception as exc:
                print(f"postgres: skipped — the PostgreSQL server could not be started: "
                      f"{first_line(exc)}")  # fmt: skip

        if 1 in parts:
            sample = conversation(random.Random(args.seed), 2)
            print(
                f"1. checkpoint cost per step: {args.appends} appends of each kind onto "
                f"{args.prior} recorded messages; assistant message {len(sample[0])} bytes, "
                f"tool results {len(sample[1])} bytes ({load()})"
            )
            for name, url in urls.items():
                began = time.perf_counter()
                assert url is not None
                cost = asyncio.run(step_cost_on(url, name, args.prior, args.appends, args.seed))
                report_step_cost(cost, args.prior)
                print(f"    ({name} took {time.perf_counter() - began:.1f} s)", flush=True)

        if 2 in parts:
            print(
                f"2. the checkpoints' share of a real turn: {TURN_SUBTASKS} subtasks, "
                f"{TURN_DELAY:g} s per model request, {TURN_CONCURRENT} in flight ({load()})"
            )
            for name, url in urls.items():
                if name == "postgres":
                    from support.postgres import reset_database

                    assert url is not None
                    reset_database(url)
                share = turn_share_on(name, url if name == "postgres" else None)
                report_turn_share(share)
                sys.stdout.flush()

    if 3 in parts:
        print(
            f"3. orchmode resume after a kill -9 with {args.results} results recorded: "
            f"{RESUME_SUBTASKS} subtasks, {RESUME_CONCURRENT} in flight, verifiers' replies "
            f"{args.verifier_delay:g} s, --claim-lease {LEASE:g}, SQLite journal ({load()})"
        )
        resume_part(args.results, args.verifier_delay, hook=not args.no_hook)


if __name__ == "__main__":
    main()
