"""Journal writes and reads on each store backend, against a naive whole-file JSON journal.

Every finished subagent result is recorded in the store before the fan-out moves on, so a
journal write is paid once per result, and its cost must not grow with the journal: the
10,000th write should cost what the 1st did. For each backend this benchmark

- records N results (default 10,000) one after another, awaiting each ``record`` (what
  the journal costs per result), timing every write;
- then looks up N randomly chosen recorded keys, timing every read;
- for the two real stores, records N results again into a fresh store from 10 writers at
  once (``asyncio.gather`` over 10 coroutines of N/10 writes each), as the fan-out does.

Results are realistic: a report_findings JSON of 1–2 KB, a prompt of about 300 characters,
distinct SHA-256 content keys. The backends:

- ``sqlite``: the SQLite store (WAL, ``synchronous=FULL``) in a file in a temporary directory;
- ``postgres``: the PostgreSQL store against a throw-away local server
  (``postgres_server`` of ``tests/support/postgres.py``, fsync on); skipped, with the reason
  printed, when the server cannot be started;
- ``json``: the baseline defined here, :class:`JsonFileJournal` — a dict loaded from one JSON
  file, the whole file re-serialised and rewritten on every record. Its writes grow with
  the journal (N writes cost O(N²)), which is the point; its reads come from the dict in
  memory, so it wins on reads. At 10,000 writes it runs for many minutes (progress goes to
  stderr); ``--baseline-writes`` makes it shorter.

Printed per backend: total write and read time, writes/s, mean/p50/p99 write latency, the
cost of the last 1,000 writes over the first 1,000 (target <= 1.3: flat), and each store's
speed-up over the baseline (per operation, so it stays meaningful when the baseline does
fewer writes — which understates the speed-up, as the baseline's cost grows with size).

    .venv/bin/python bench/journal.py [--writes 10000] [--baseline-writes N]
        [--backends sqlite,postgres,json] [--writers 10] [--no-fsync] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchmode.core.events import Role, TokenUsage
from orchmode.core.results import AgentResult, Status
from orchmode.store import content_key, open_store

BACKENDS = ("sqlite", "postgres", "json")
#: Size of the windows compared for flatness: the last this-many writes over the first.
WINDOW = 1000
FLAT_TARGET = 1.3
#: Seconds between progress lines on stderr during a long write phase.
PROGRESS_EVERY = 30.0

#: Words the synthetic prompts and reports are made of.
VOCABULARY = (
    "the handler retries request timeout cache parser returns null when config is missing "
    "path lock file writes buffer before flush thread pool leaks connection on error branch "
    "test covers only happy case migration drops index query scans whole table log line "
    "exposes token header validation skips empty field loop exits early counter overflows "
    "after restart signal handler races with shutdown hook default value differs from docs"
)
WORDS = VOCABULARY.split()


class Journal(Protocol):
    """What this benchmark drives: the journal half of :class:`orchmode.store.Store`."""

    location: str

    async def record(self, key: str, role: Role, prompt: str, result: AgentResult) -> None: ...

    async def lookup(self, key: str) -> AgentResult | None: ...

    async def close(self) -> None: ...


class JsonFileJournal:
    """The naive journal: one JSON file holding a dict of every result, rewritten per record.

    Each ``record`` re-serialises the whole dict, writes it to a temporary file and renames
    it over the journal (``os.replace``), so a crash leaves the old or the new file, never a
    torn one. Reads come from the dict loaded at open. The API mirrors the store's (async
    ``record``/``lookup``) so the same driver measures it; the I/O is done inline, as a
    naive implementation would.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.location = str(path)
        # fsync by default, for fairness: the SQLite store runs synchronous=FULL, so its
        # record returns only once the result is on disk. Matching that takes an fsync of the
        # new file before the rename and of the directory after it (to make the rename
        # itself durable). --no-fsync drops both, leaving the page cache to write it later.
        self.fsync = fsync
        self._tmp = path.with_name(path.name + ".tmp")
        try:
            self._entries: dict[str, dict[str, Any]] = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            self._entries = {}

    async def record(self, key: str, role: Role, prompt: str, result: AgentResult) -> None:
        if not result.finished:
            return
        u = result.usage
        self._entries[key] = {
            "role": role,
            "prompt": prompt,
            "result": result.text,
            "turns": result.turns,
            "usage": [u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens],
            "recorded_at": time.time(),
        }
        data = json.dumps(self._entries, ensure_ascii=False).encode("utf-8")
        with open(self._tmp, "wb") as file:
            file.write(data)
            if self.fsync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(self._tmp, self.path)
        if self.fsync:
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    async def lookup(self, key: str) -> AgentResult | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        return AgentResult(
            entry["result"], Status.FINISHED, entry["turns"], TokenUsage(*entry["usage"])
        )

    async def close(self) -> None:
        pass


@dataclass(frozen=True)
class Item:
    key: str
    prompt: str
    result: AgentResult


def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "."


def make_items(count: int, seed: int) -> list[Item]:
    """``count`` distinct results: a ~300-character prompt and a 1–2 KB report each."""
    rng = random.Random(seed)
    items = []
    for n in range(count):
        prompt = f"Check item {n} of the audit: "
        while len(prompt) < 300:
            prompt += sentence(rng, 6, 14) + " "
        prompt = prompt[:300]
        target = rng.randint(1000, 1700)
        report: dict[str, Any] = {"summary": sentence(rng, 15, 30), "findings": []}
        while len(json.dumps(report, ensure_ascii=False)) < target:
            report["findings"].append(
                {
                    "claim": sentence(rng, 8, 18),
                    "evidence": f"src/module_{rng.randint(1, 99)}.py:{rng.randint(1, 900)}: "
                    + sentence(rng, 15, 30),
                    "severity": rng.choice(["high", "medium", "low", "info"]),
                }
            )
        text = json.dumps(report, ensure_ascii=False)
        usage = TokenUsage(
            rng.randint(2_000, 40_000),
            rng.randint(200, 4_000),
            rng.randint(0, 30_000),
            rng.randint(0, 5_000),
        )
        key = content_key(
            role="worker",
            model="claude-opus-5-5",
            effort="high",
            system="You are a worker subagent.",
            tools=[],
            prompt=prompt,
        )
        items.append(
            Item(key, prompt, AgentResult(text, Status.FINISHED, rng.randint(2, 8), usage))
        )
    return items


@dataclass
class Run:
    name: str
    writes: list[float]
    write_total: float
    reads: list[float]
    read_total: float
    misses: int
    concurrent_total: float | None = None
    concurrent_writes: int = 0
    concurrent_misses: int = 0


async def write_all(
    journal: Journal, items: Sequence[Item], label: str
) -> tuple[list[float], float]:
    """Record the items one after another; each write's latency and the total."""
    latencies: list[float] = []
    started = last_report = time.perf_counter()
    for n, item in enumerate(items, start=1):
        before = time.perf_counter()
        await journal.record(item.key, "worker", item.prompt, item.result)
        after = time.perf_counter()
        latencies.append(after - before)
        if after - last_report >= PROGRESS_EVERY:
            last_report = after
            recent = latencies[-100:]
            print(
                f"  [{label}] {n}/{len(items)} writes after {after - started:.0f} s, "
                f"now {sum(recent) / len(recent) * 1000:.1f} ms per write",
                file=sys.stderr,
                flush=True,
            )
    return latencies, time.perf_counter() - started


async def read_all(
    journal: Journal, items: Sequence[Item], count: int, rng: random.Random
) -> tuple[list[float], float, int]:
    """Look up ``count`` random recorded keys; latencies, total, and how many missed."""
    chosen = [rng.choice(items) for _ in range(count)]
    latencies: list[float] = []
    misses = 0
    started = time.perf_counter()
    for item in chosen:
        before = time.perf_counter()
        found = await journal.lookup(item.key)
        latencies.append(time.perf_counter() - before)
        if found is None or found.text != item.result.text:
            misses += 1
    return latencies, time.perf_counter() - started, misses


async def write_concurrently(
    journal: Journal, items: Sequence[Item], writers: int
) -> tuple[float, int]:
    """Record the items from ``writers`` coroutines at once; the wall time and the misses."""
    shares = [items[n::writers] for n in range(writers)]

    async def writer(share: Sequence[Item]) -> None:
        for item in share:
            await journal.record(item.key, "worker", item.prompt, item.result)

    started = time.perf_counter()
    await asyncio.gather(*(writer(share) for share in shares))
    elapsed = time.perf_counter() - started
    misses = sum([await journal.lookup(item.key) is None for item in items])
    return elapsed, misses


async def measure(
    name: str,
    open_journal: Callable[[], Awaitable[Journal]],
    items: Sequence[Item],
    reads: int,
    seed: int,
    *,
    concurrent: Callable[[], Awaitable[Journal]] | None = None,
    writers: int = 10,
) -> Run:
    """Sequential writes then random reads on one journal; then, optionally, a concurrent
    write phase on a fresh one (``concurrent`` opens it)."""
    journal: Journal = await open_journal()
    try:
        writes, write_total = await write_all(journal, items, name)
        read_lat, read_total, misses = await read_all(journal, items, reads, random.Random(seed))
    finally:
        await journal.close()
    run = Run(name, writes, write_total, read_lat, read_total, misses)
    if concurrent is not None:
        fresh: Journal = await concurrent()
        try:
            run.concurrent_total, run.concurrent_misses = await write_concurrently(
                fresh, items, writers
            )
            run.concurrent_writes = len(items)
        finally:
            await fresh.close()
    return run


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def report(run: Run, writers: int) -> None:
    n = len(run.writes)
    window = min(WINDOW, n // 2)
    print(f"{run.name}:")
    print(
        f"  {n} writes in {run.write_total:.3f} s ({n / run.write_total:,.0f} writes/s); "
        f"latency mean {ms(run.write_total / n)}, p50 {ms(percentile(run.writes, 50))}, "
        f"p99 {ms(percentile(run.writes, 99))}"
    )
    if window:
        first, last = sum(run.writes[:window]), sum(run.writes[-window:])
        print(
            f"  last {window} writes over the first {window}: {ms(last)} / {ms(first)} = "
            f"{last / first:.3f}  (target <= {FLAT_TARGET}: flat)"
        )
    r = len(run.reads)
    print(
        f"  {r} reads in {run.read_total:.3f} s ({r / run.read_total:,.0f} reads/s); "
        f"latency mean {ms(run.read_total / r)}, p50 {ms(percentile(run.reads, 50))}, "
        f"p99 {ms(percentile(run.reads, 99))}"
    )
    if run.misses:
        print(f"  WARNING: {run.misses} of {r} lookups missed or returned the wrong result")
    if run.concurrent_total is not None:
        c = run.concurrent_writes
        sequential_rate = n / run.write_total
        rate = c / run.concurrent_total
        print(
            f"  {c} writes from {writers} concurrent writers in {run.concurrent_total:.3f} s "
            f"({rate:,.0f} writes/s, {rate / sequential_rate:.2f}x the sequential rate)"
        )
        if run.concurrent_misses:
            print(f"  WARNING: {run.concurrent_misses} of {c} concurrent writes were not found")


def speedups(runs: Sequence[Run]) -> None:
    baseline = next((run for run in runs if run.name == "json"), None)
    stores = [run for run in runs if run.name != "json"]
    if baseline is None or not stores:
        return
    base_write = baseline.write_total / len(baseline.writes)
    base_read = baseline.read_total / len(baseline.reads)
    print(
        f"speed-up over the JSON baseline ({len(baseline.writes)} writes; per operation, "
        "above 1 = faster):"
    )
    for run in stores:
        write = run.write_total / len(run.writes)
        read = run.read_total / len(run.reads)
        print(f"  {run.name}: writes {base_write / write:,.1f}x, reads {base_read / read:.3f}x")
    if any(len(run.writes) != len(baseline.writes) for run in stores):
        print(
            "  (the baseline did a different number of writes; its cost per write grows with "
            "the journal, so the write speed-up at equal sizes differs)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=10_000)
    parser.add_argument(
        "--baseline-writes", type=int, default=None, help="writes for the JSON baseline"
    )
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--writers", type=int, default=10, help="writers in the concurrent mode")
    parser.add_argument(
        "--no-fsync", action="store_true", help="the JSON baseline skips its fsyncs"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(chosen) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    baseline_writes = args.writes if args.baseline_writes is None else args.baseline_writes

    items = make_items(max(args.writes, baseline_writes), args.seed)
    sizes = [len(item.result.text.encode("utf-8")) for item in items]
    prompts = [len(item.prompt) for item in items]
    print(
        f"writes {args.writes} (baseline {baseline_writes}), reads = writes, "
        f"concurrent writers {args.writers}"
    )
    print(
        f"results {min(sizes)}–{max(sizes)} bytes (mean {sum(sizes) / len(sizes):.0f}), "
        f"prompts {sum(prompts) / len(prompts):.0f} chars, keys sha256 hex"
    )
    print(f"JSON baseline fsync: {'off (--no-fsync)' if args.no_fsync else 'on'}")

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="orchmode-bench-") as tmp:
        root = Path(tmp)
        for backend in chosen:
            started = time.perf_counter()
            run: Run | None
            if backend == "sqlite":
                run = asyncio.run(sqlite_run(root, items[: args.writes], args.seed, args.writers))
            elif backend == "postgres":
                run = postgres_run(items[: args.writes], args.seed, args.writers)
            else:
                fsync = not args.no_fsync
                run = asyncio.run(json_run(root, items[:baseline_writes], args.seed, fsync))
            if run is None:
                continue
            runs.append(run)
            report(run, args.writers)
            print(f"  ({backend} took {time.perf_counter() - started:.1f} s in all)", flush=True)
    speedups(runs)


async def sqlite_run(root: Path, items: Sequence[Item], seed: int, writers: int) -> Run:
    async def sequential() -> Journal:
        return await open_store(f"sqlite://{root / 'journal.db'}")

    async def concurrent() -> Journal:
        return await open_store(f"sqlite://{root / 'concurrent.db'}")

    return await measure(
        "sqlite", sequential, items, len(items), seed, concurrent=concurrent, writers=writers
    )


async def json_run(root: Path, items: Sequence[Item], seed: int, fsync: bool) -> Run:
    async def baseline() -> Journal:
        return JsonFileJournal(root / "journal.json", fsync=fsync)

    return await measure("json", baseline, items, len(items), seed)


def postgres_run(items: Sequence[Item], seed: int, writers: int) -> Run | None:
    """The PostgreSQL measurement, or ``None`` (with the reason printed) if it cannot start."""
    from support.postgres import postgres_server, reset_database

    with ExitStack() as stack:
        try:
            dsn: str = stack.enter_context(postgres_server())
        except Exception as exc:
            text = str(exc).strip()
            reason = text.splitlines()[0] if text else type(exc).__name__
            print(f"postgres: skipped — the PostgreSQL server could not be started: {reason}")
            return None

        async def sequential() -> Journal:
            return await open_store(dsn)

        async def concurrent() -> Journal:
            reset_database(dsn)  # a fresh, empty journal for the concurrent phase
            return await open_store(dsn)

        return asyncio.run(
            measure(
                "postgres",
                sequential,
                items,
                len(items),
                seed,
                concurrent=concurrent,
                writers=writers,
            )
        )


if __name__ == "__main__":
    main()
