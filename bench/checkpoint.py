"""The cost of one conversation checkpoint on each store backend, against a turn's wall time.

A run checkpoints its main conversation at every step (``Store.record_messages``: the
assistant's reply, then the tool results), so an interrupted run resumes where it stopped.
The checkpoint is awaited before the run moves on, so its cost is paid on every step and
must stay a small share of the step. For each backend this benchmark

- records a 200-message conversation (``--prior``) in one session: assistant messages of
  about 2 KB JSON alternating with tool-results messages of about 6 KB;
- then ``--appends`` times (default 500): appends one assistant message at index 200 and
  one tool-results message at 201, timing each checkpoint, and truncates back to 200
  untimed, so every timed append lands on a 200-message conversation;
- times a few rarer operations too: a compaction that rewrites all 200 messages from
  index 0, and loading the 200 messages back (what a resume reads).

Each checkpoint is durable when it returns, as the store promises: SQLite in a temporary
file (WAL, ``synchronous=FULL``: an fsync per checkpoint); PostgreSQL on a throw-away local
server (:func:`orchmode.testing.postgres.postgres_server`, fsync on), skipped with the
reason printed when it cannot be started.

Printed per backend: median and p95 ms per checkpoint of each kind, and the share of a
200-subtask turn (``--turn``, 60 s) that a turn's two checkpoints take — target <= 1 % —
and, for SQLite, the target of <= 5 ms per checkpoint. Figures only; nothing here gates CI.

    .venv/bin/python bench/checkpoint.py [--appends 500] [--prior 200]
        [--backends sqlite,postgres] [--turn 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from orchmode.store import Store, open_store

BACKENDS = ("sqlite", "postgres")
SESSION = "bench-session"
ASSISTANT_BYTES = 2_000
TOOL_RESULTS_BYTES = 6_000
#: Targets: a turn's checkpoints against the turn; one SQLite checkpoint, in seconds.
TURN_SHARE_TARGET = 0.01
SQLITE_TARGET = 0.005
#: How many times the rare operations (a full rewrite, a load) are timed.
RARE_REPEATS = 30

VOCABULARY = (
    "the handler retries request timeout cache parser returns null when config is missing "
    "path lock file writes buffer before flush thread pool leaks connection on error branch "
    "test covers only happy case migration drops index query scans whole table log line "
    "exposes token header validation skips empty field loop exits early counter overflows"
)
WORDS = VOCABULARY.split()


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
                "name": "spawn_subtasks",
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
class Run:
    name: str
    assistant: list[float]
    tool_results: list[float]
    rewrite: list[float]
    load: list[float]


async def measure(name: str, store: Store, prior: int, appends: int, seed: int) -> Run:
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
    return Run(name, assistant, tool_results, rewrite, load)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def report(run: Run, prior: int, turn: float) -> None:
    print(f"{run.name}:")
    for label, values, size in (
        ("assistant message", run.assistant, ASSISTANT_BYTES),
        ("tool-results message", run.tool_results, TOOL_RESULTS_BYTES),
    ):
        print(
            f"  append one {label} (~{size // 1000} KB) onto {prior}: median "
            f"{ms(statistics.median(values))}, p95 {ms(percentile(values, 95))}, "
            f"max {ms(max(values))}  ({len(values)} checkpoints)"
        )
    both = [a + t for a, t in zip(run.assistant, run.tool_results, strict=True)]
    for label, cost in (
        ("median", statistics.median(both)),
        ("p95", percentile(both, 95)),
    ):
        print(
            f"  a turn's two checkpoints ({label}) {ms(cost)} = {cost / turn:.4%} of a "
            f"{turn:g} s 200-subtask turn  (target <= {TURN_SHARE_TARGET:.0%})"
        )
    if run.name == "sqlite":
        worst = percentile(run.assistant + run.tool_results, 95)
        verdict = "met" if worst <= SQLITE_TARGET else "MISSED"
        print(f"  p95 per checkpoint {ms(worst)}: target <= {ms(SQLITE_TARGET)} {verdict}")
    print(
        f"  rare: rewrite all {prior} messages median {ms(statistics.median(run.rewrite))}; "
        f"load them median {ms(statistics.median(run.load))}  ({RARE_REPEATS} each)"
    )


async def sqlite_run(root: Path, prior: int, appends: int, seed: int) -> Run:
    store = await open_store(f"sqlite://{root / 'checkpoint.db'}")
    try:
        return await measure("sqlite", store, prior, appends, seed)
    finally:
        await store.close()


def postgres_run(prior: int, appends: int, seed: int) -> Run | None:
    """The PostgreSQL measurement, or ``None`` (with the reason printed) if it cannot start."""
    from orchmode.testing.postgres import postgres_server

    with ExitStack() as stack:
        try:
            dsn: str = stack.enter_context(postgres_server())
        except Exception as exc:
            text = str(exc).strip()
            reason = text.splitlines()[0] if text else type(exc).__name__
            print(f"postgres: skipped — the PostgreSQL server could not be started: {reason}")
            return None

        async def run() -> Run:
            store = await open_store(dsn)
            try:
                return await measure("postgres", store, prior, appends, seed)
            finally:
                await store.close()

        return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=500, help="timed appends of each kind")
    parser.add_argument("--prior", type=int, default=200, help="messages already recorded")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--turn", type=float, default=60.0, help="a turn's wall time, seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(chosen) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    if args.prior < 0 or args.appends < 1:
        parser.error("--prior must be >= 0 and --appends >= 1")

    sample = conversation(random.Random(args.seed), 2)
    print(
        f"{args.appends} appends of each kind onto {args.prior} recorded messages; "
        f"assistant message {len(sample[0])} bytes, tool results {len(sample[1])} bytes"
    )
    with tempfile.TemporaryDirectory(prefix="orchmode-bench-") as tmp:
        for backend in chosen:
            started = time.perf_counter()
            run: Run | None
            if backend == "sqlite":
                run = asyncio.run(sqlite_run(Path(tmp), args.prior, args.appends, args.seed))
            else:
                run = postgres_run(args.prior, args.appends, args.seed)
            if run is None:
                continue
            report(run, args.prior, args.turn)
            print(f"  ({backend} took {time.perf_counter() - started:.1f} s in all)", flush=True)


if __name__ == "__main__":
    main()
