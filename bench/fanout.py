"""Fan-out makespan against its lower bound, and peak memory.

200 subtasks, 10 in flight, every model request answered by the scripted server (in its
own process) after 50 ms. Each subtask is a chain — a worker (bash, then report_findings)
and then its verifier — so the ideal fan-out packs the chains onto 10 slots:

    lower bound = max(longest chain, total chain time / slots)

where a chain's time is its number of model requests times the server latency. Harness
overhead (HTTP, streaming, shells, the journal) is what pushes the ratio above 1.

A second bound uses the server's own measured time for each request (its latency plus
its own processing), which separates the harness's overhead from the test server's.

    .venv/bin/python bench/fanout.py [--subtasks 200] [--concurrent 10] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from orchmode.agent import Session
from orchmode.events import Event, EventBus, FanoutDone, ModelRequestDone
from orchmode.model import Credentials, ModelGateway
from orchmode.settings import Settings
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing.scenario import OrchestrationScenario

#: What the server process answers with (imported there as ``fanout:responder``).
responder = OrchestrationScenario(
    verifier_command=None if os.environ.get("BENCH_NOBASH") else "true",
    subtasks=int(os.environ.get("BENCH_SUBTASKS", "200")),
    scout_command=None,
    worker_command=None if os.environ.get("BENCH_NOBASH") else "true",
)


def process_cpu(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(subtasks: int, latency: float, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """The scripted server in its own process, answering with ``responder`` above."""
    env = {**os.environ, "BENCH_SUBTASKS": str(subtasks), "PYTHONPATH": str(Path(__file__).parent)}
    command = [sys.executable, "-m", "orchmode.testing", "--latency", str(latency)]
    process = subprocess.Popen(
        [*command, "--responder", "fanout:responder", *extra],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"http://\S+", line)
    if not match:
        process.kill()
        raise SystemExit(f"the scripted server did not start: {line!r}")
    return process, match.group(0)


async def measure(url: str, concurrent: int, workdir: Path) -> tuple[float, Counter[str], int]:
    settings = Settings(base_url=url, max_concurrent=concurrent, max_retries=0, workdir=workdir)
    events = EventBus()
    fanout_time: list[float] = []
    per_chain: Counter[str] = Counter()

    def record(event: Event) -> None:
        if isinstance(event, FanoutDone):
            fanout_time.append(event.duration)
        elif isinstance(event, ModelRequestDone) and event.agent != "main":
            per_chain[event.agent.split()[-1]] += 1  # "worker 1.7" and "verifier 1.7" -> "1.7"

    events.subscribe(record)
    gateway = await one_turn(settings, events, workdir)
    return fanout_time[0], per_chain, gateway.requests


async def one_turn(settings: Settings, events: EventBus, workdir: Path) -> ModelGateway:
    """One orchestrated user turn ("fan out") against the scripted server; its gateway."""
    store = SQLiteStore.open(workdir / "store.db")
    gateway = ModelGateway(settings, Credentials(api_key="test-key"), events)
    session = Session(settings, gateway, workdir=workdir, store=store, events=events)
    try:
        await session.turn("fan out")
    finally:
        await session.close()
        await gateway.close()
        await store.close()
    return gateway


async def bare_sdk_fanout(url: str, concurrent: int, chains: list[int]) -> float:
    """The same requests sent by a bare SDK loop: no tools run, no journal, no verification.

    The simple baseline: what any Python harness on the SDK pays for the same traffic.
    """
    import anthropic

    from orchmode.prompts import SUBAGENT_TOOLS

    client = anthropic.AsyncAnthropic(
        base_url=url,
        api_key="test-key",
        max_retries=0,
        http_client=anthropic.DefaultAioHttpClient(),
    )
    slots = asyncio.Semaphore(concurrent)

    async def chain(n: int, requests: int) -> None:
        async with slots:
            for _ in range(requests):
                stream = await client.messages.create(
                    model="claude-opus-5-5",
                    max_tokens=64000,
                    messages=[{"role": "user", "content": f"Check item {n}"}],
                    tools=SUBAGENT_TOOLS,  # type: ignore[arg-type]
                    stream=True,
                )
                async with stream:
                    async for _event in stream:
                        pass

    started = time.monotonic()
    await asyncio.gather(*(chain(n, r) for n, r in enumerate(chains)))
    elapsed = time.monotonic() - started
    await client.close()
    return elapsed


def server_chain_times(url: str) -> list[float]:
    """Each chain's time as the server measured its requests, grouped by subtask."""
    import json
    import urllib.request

    from orchmode.testing.server import LOG_PATH

    with urllib.request.urlopen(url + LOG_PATH) as response:
        entries = json.load(response)
    chains: Counter[str] = Counter()
    for entry in entries:
        text = entry["first_user_text"] or ""
        found = re.search(r"Check item \d+", text)
        if found and entry["finished"] is not None:
            chains[found.group(0)] += entry["finished"] - entry["started"]
    return list(chains.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    server, url = start_server(args.subtasks, args.latency)
    server_cpu_at_start = process_cpu(server.pid)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cpu_before = time.process_time()
            makespan, per_chain, requests = asyncio.run(measure(url, args.concurrent, Path(tmp)))
            cpu = time.process_time() - cpu_before
        measured = server_chain_times(url)
        server_cpu = process_cpu(server.pid) - server_cpu_at_start
        bare = asyncio.run(bare_sdk_fanout(url, args.concurrent, list(per_chain.values())))
    finally:
        server.terminate()
        server.wait()
    chains = [n * args.latency for n in per_chain.values()]
    bound = max(max(chains), sum(chains) / args.concurrent)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"subtasks {args.subtasks}, concurrent {args.concurrent}, "
        f"latency {args.latency * 1000:g} ms"
    )
    print(f"model requests per chain: {sorted(Counter(per_chain.values()).items())}")
    print(f"fan-out makespan {makespan:.3f} s, lower bound {bound:.3f} s")
    print(f"ratio to lower bound: {makespan / bound:.3f}  (target <= 1.10)")
    served = max(max(measured), sum(measured) / args.concurrent)
    print(
        f"lower bound from the server's measured request times {served:.3f} s "
        f"(its own overhead {served / bound - 1:+.1%}); ratio to it: {makespan / served:.3f}"
    )
    print(
        f"the same requests from a bare SDK loop: {bare:.3f} s (ratio {bare / bound:.3f}); "
        f"orchmode over the bare SDK: {makespan / bare:.3f}"
    )
    print(f"peak memory (RSS of the harness): {peak_mb:.0f} MB")
    print(f"harness CPU per model request: {cpu / requests * 1000:.2f} ms")
    print(f"scripted server CPU per model request: {server_cpu / requests * 1000:.2f} ms")


if __name__ == "__main__":
    main()
