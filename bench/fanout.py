"""Fan-out makespan against its lower bound, CPU per request and peak memory.

Every model request is answered by the scripted server (in its own process) after a set
latency. Each subtask is a chain — a worker (bash, then report_findings) and then its
verifier (the same) — so the ideal fan-out packs the chains onto the slots:

    lower bound = max(longest chain, total chain time / slots)

where a chain's time is its number of model requests times the latency. Harness overhead
(HTTP, streaming, shells, the journal) is what pushes the ratio above 1. A second bound
uses the server's own measured time for each request, which separates the harness's
overhead from the test server's; a bare SDK loop sending the same requests is the simple
baseline. The suite runs 10, 200 and 1,000 subagents in flight, each in a fresh process.
CPU is counted per process and for the whole machine (/proc/stat), the only count that
sees a sandbox's own processes; a small untimed fan-out warms the process up first.

    .venv/bin/python bench/fanout.py                  # the suite
    .venv/bin/python bench/fanout.py --subtasks 200 --concurrent 10 --latency 0.05
    .venv/bin/python bench/fanout.py --isolation shared     # every worker in one tree only
    .venv/bin/python bench/fanout.py --isolation shared --sandbox off   # the core alone
    .venv/bin/python bench/fanout.py --traces               # CPU per request, traces off vs on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchmode.core.events import Event, EventBus, FanoutDone, ModelRequestDone
from orchmode.core.settings import Settings
from orchmode.executors.local import LocalExecutor
from orchmode.model.gateway import ModelGateway
from orchmode.model.providers import Credentials
from orchmode.records.recorder import EventRecorder
from orchmode.session.agent import open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.telemetry.tracing import start_tracing
from orchmode.testing.scenario import OrchestrationScenario
from support.machine import machine_cpu

#: What the server process answers with (imported there as ``fanout:responder``).
responder = OrchestrationScenario(
    verifier_command=None if os.environ.get("BENCH_NOBASH") else "true",
    subtasks=int(os.environ.get("BENCH_SUBTASKS", "200")),
    scout_command=None,
    worker_command=None if os.environ.get("BENCH_NOBASH") else "true",
)


def children_cpu() -> float:
    """CPU seconds of this process's reaped children: the shells, sandboxes and git."""
    times = os.times()
    return times.children_user + times.children_system


def process_cpu(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(
    subtasks: int,
    latency: float,
    *extra: str,
    responder: str = "fanout:responder",
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """The scripted server in its own process, answering with ``responder`` (this module's
    above, unless another benchmark names its own), ``env`` added to its environment."""
    env = {
        **os.environ,
        "BENCH_SUBTASKS": str(subtasks),
        "PYTHONPATH": str(Path(__file__).parent),
        **(env or {}),
    }
    command = [sys.executable, "-m", "orchmode.testing", "--latency", str(latency)]
    process = subprocess.Popen(
        [*command, "--responder", responder, *extra],
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


@dataclass
class FanoutTally:
    """From the events: each fan-out's duration, and each chain's model requests."""

    durations: list[float] = field(default_factory=list)
    per_chain: Counter[str] = field(default_factory=Counter)

    def __call__(self, event: Event) -> None:
        if isinstance(event, FanoutDone):
            self.durations.append(event.duration)
        elif isinstance(event, ModelRequestDone) and event.agent != "main":
            # "worker 1.7" and "verifier 1.7" are chain "1.7"
            self.per_chain[event.agent.split()[-1]] += 1


async def measure(
    url: str,
    concurrent: int,
    workdir: Path,
    subtasks: int = 200,
    isolation: str = "worktree",
    traces_to: str | None = None,
    sandbox: str = "workspace-write",
) -> tuple[float, Counter[str], int, tuple[int, int]]:
    settings = Settings(
        base_url=url,
        max_concurrent=concurrent,
        max_retries=0,
        workdir=workdir,
        max_subtasks=max(subtasks, 1),
        max_subagents=2 * subtasks + 10,
        isolation=isolation,  # type: ignore[arg-type]
        sandbox=sandbox,  # type: ignore[arg-type]
        otlp_endpoint=traces_to,
    )
    events = EventBus()
    tally = FanoutTally()
    events.subscribe(tally)
    traces = start_tracing(settings) if traces_to else None  # as open_session does
    timed = TimedSubscriber(traces) if traces is not None else None
    if timed is not None:
        events.subscribe(timed)
    try:
        gateway, pooled = await one_turn(settings, events, workdir)
    finally:
        if traces is not None and timed is not None:
            traces.provider.force_flush()  # every span exported: its cost is counted too
            TRACES_CPU.append(timed.cpu + exporter_cpu())
            traces.close()
    return tally.durations[0], tally.per_chain, gateway.requests, pooled


#: CPU seconds the traces took in the last traced run: making spans, and exporting them.
TRACES_CPU: list[float] = []


@dataclass
class TimedSubscriber:
    """The tracer, with the CPU time of this thread spent in it counted."""

    inner: Callable[[Event], None]
    cpu: float = 0.0

    def __call__(self, event: Event) -> None:
        started = time.thread_time()
        self.inner(event)
        self.cpu += time.thread_time() - started


def exporter_cpu() -> float:
    """CPU seconds of the OpenTelemetry SDK's export threads so far, from /proc."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.native_id is not None and "Otel" in thread.name:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            values = fields.rsplit(")", 1)[1].split()
            total += (int(values[11]) + int(values[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def one_turn(
    settings: Settings, events: EventBus, workdir: Path
) -> tuple[ModelGateway, tuple[int, int]]:
    """One orchestrated user turn ("fan out") against the scripted server, its events
    recorded; its gateway, and how many agents were handed a started shell (of all)."""
    store = SQLiteStore.open(workdir / "store.db")
    credentials = Credentials(api_key="test-key")
    try:
        async with open_conversation(settings, credentials, events=events, store=store) as session:
            # Every event recorded in the store, as `orchmode run` does.
            recorder = await EventRecorder.start(store, session.session_id)
            events.subscribe(recorder)
            try:
                await session.turn("fan out")
            finally:
                await recorder.flush()
    finally:
        await store.close()
    executor = session.executor
    pool = executor.host.pool if isinstance(executor, LocalExecutor) else None
    return session.gateway, (pool.hits, pool.hits + pool.misses) if pool else (0, 0)


async def bare_sdk_fanout(
    url: str, concurrent: int, chains: list[list[dict[str, object]]]
) -> tuple[float, float]:
    """The same requests sent by a bare SDK loop: no tools run, no journal, no verification.

    The simple baseline: what any Python harness on the SDK pays for the same traffic. Each
    chain's request bodies are sent again as orchmode sent them (system prompt, tools and
    the conversation so far), one chain to a slot, each response streamed to its end. Its
    makespan, and its CPU per request in milliseconds.
    """
    import anthropic

    from orchmode.model.request_form import CONTEXT_BETA

    client = anthropic.AsyncAnthropic(
        base_url=url,
        api_key="test-key",
        max_retries=0,
        http_client=anthropic.DefaultAioHttpClient(),
    )
    slots = asyncio.Semaphore(concurrent)

    async def send(body: dict[str, object]) -> None:
        params: dict[str, Any] = {k: v for k, v in body.items() if k != "stream"}
        if "context_management" in params:
            create: Any = client.beta.messages.create(**params, betas=[CONTEXT_BETA], stream=True)
        else:
            create = client.messages.create(**params, stream=True)
        stream = await create
        async with stream:
            async for _event in stream:
                pass

    async def chain(bodies: list[dict[str, object]]) -> None:
        async with slots:
            for body in bodies:
                await send(body)

    started, cpu = time.monotonic(), time.process_time()
    await asyncio.gather(*(chain(bodies) for bodies in chains))
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    await client.close()
    return elapsed, cpu / max(sum(len(c) for c in chains), 1) * 1000


def chain_bodies(url: str) -> list[list[dict[str, object]]]:
    """Each subtask's requests, as sent (worker, then verifier), from the server's log."""
    import urllib.request

    from orchmode.testing.server import LOG_PATH

    with urllib.request.urlopen(url + LOG_PATH + "?bodies=1") as response:
        entries = json.load(response)
    chains: dict[str, list[dict[str, object]]] = {}
    for entry in entries:
        found = re.search(r"Check item \d+", entry["first_user_text"] or "")
        if found and entry["path"].startswith("/v1/messages") and entry["status"] == 200:
            chains.setdefault(found.group(0), []).append(entry["body"])
    return list(chains.values())


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


#: The runs of the default suite: (subtasks, in flight, seconds per model request, target),
#: each under both isolations. 200 x 10 at 50 ms is where the harness's own cost shows
#: most (on a 2-core machine, it is that machine's CPU that is measured); 400 x 200 at 1 s
#: is a wide fan-out at a short real reply's pace; 1,000 in flight is for peak memory.
SUITE = ((200, 10, 0.05, 1.10), (400, 200, 1.0, 1.15), (1000, 1000, 2.0, None))


def start_sink() -> tuple[subprocess.Popen[str], str]:
    """An OTLP/HTTP endpoint in its own process that takes every export and keeps nothing:
    what traces cost the harness, not what a backend costs."""
    code = (
        "import http.server, sys\n"
        "class Sink(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        self.rfile.read(int(self.headers.get('content-length', 0)))\n"
        "        self.send_response(200)\n"
        "        self.send_header('content-type', 'application/x-protobuf')\n"
        "        self.send_header('content-length', '0')\n"
        "        self.end_headers()\n"
        "    def log_message(self, *args):\n"
        "        pass\n"
        "server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Sink)\n"
        "print(f'http://127.0.0.1:{server.server_address[1]}', flush=True)\n"
        "server.serve_forever()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


def run_one(
    subtasks: int,
    concurrent: int,
    latency: float,
    bare: bool,
    isolation: str = "worktree",
    traced: bool = False,
    sandbox: str = "workspace-write",
    profile: str | None = None,
    warm: bool = True,
) -> dict[str, float]:
    """One fan-out, measured: makespan, bounds, CPU, memory (in this process); with
    ``profile``, the fan-out under cProfile, its statistics written there. ``warm`` runs
    a small fan-out first (see :func:`warm_up`)."""
    sink, sink_url = start_sink() if traced else (None, None)
    if warm:
        warm_up(concurrent, latency, isolation, sandbox)
    server, url = start_server(subtasks, latency)
    server_cpu_at_start = process_cpu(server.pid)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cpu_before, children_before = time.process_time(), children_cpu()
            machine_before = machine_cpu()
            run = measure(url, concurrent, Path(tmp), subtasks, isolation, sink_url, sandbox)
            makespan, per_chain, requests, pooled = profiled(run, profile)
            cpu = time.process_time() - cpu_before
            children = children_cpu() - children_before
            machine = machine_cpu() - machine_before
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        measured = server_chain_times(url)
        server_cpu = process_cpu(server.pid) - server_cpu_at_start
        chains = list(per_chain.values())
        replayed = chain_bodies(url) if bare else []
        server_cpu_before_bare, machine_before_bare = process_cpu(server.pid), machine_cpu()
        bare_time, bare_cpu = (
            asyncio.run(bare_sdk_fanout(url, concurrent, replayed)) if bare else (0.0, 0.0)
        )
        bare_server_cpu = process_cpu(server.pid) - server_cpu_before_bare
        bare_machine = machine_cpu() - machine_before_bare
    finally:
        server.terminate()
        server.wait()
        if sink is not None:
            sink.terminate()
            sink.wait()
    times = [n * latency for n in chains]
    bound = max(max(times), sum(times) / concurrent)
    served = max(max(measured), sum(measured) / concurrent)
    return {
        "subtasks": subtasks,
        "concurrent": concurrent,
        "latency": latency,
        "requests": requests,
        "per_chain": max(chains),
        "makespan": makespan,
        "bound": bound,
        "served_bound": served,
        "isolation": isolation,
        "sandbox": sandbox,
        "traced": traced,
        "pooled": pooled[0],
        "agents": pooled[1],
        "bare": bare_time,
        "bare_cpu_ms": bare_cpu,
        "bare_server_cpu_ms": bare_server_cpu / max(sum(len(c) for c in replayed), 1) * 1000,
        "machine_cpu_ms": machine / requests * 1000,
        "bare_machine_cpu_ms": bare_machine / max(sum(len(c) for c in replayed), 1) * 1000,
        "children_cpu_ms": children / requests * 1000,
        "peak_mb": peak_mb,
        "cpu_ms": cpu / requests * 1000,
        "traces_cpu_ms": (TRACES_CPU[-1] if traced and TRACES_CPU else 0.0) / requests * 1000,
        "server_cpu_ms": server_cpu / requests * 1000,
    }


def warm_up(concurrent: int, latency: float, isolation: str, sandbox: str) -> None:
    """A small fan-out on its own server, untimed, before anything is measured.

    What a process pays once — importing the modules a turn needs, the SDK building a
    validator for each of its event types on first sight — is not a price per request. The
    bare loop runs after orchmode in this process, so without this only orchmode would pay
    it; with it, both sides are measured as a session's later fan-outs are (``--cold``
    measures the first one instead)."""
    server, url = start_server(WARM_UP_SUBTASKS, latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(
                measure(url, concurrent, Path(tmp), WARM_UP_SUBTASKS, isolation, None, sandbox)
            )
    finally:
        server.terminate()
        server.wait()


#: Subtasks in the untimed fan-out before the measured one.
WARM_UP_SUBTASKS = 4


def profiled(
    run: Coroutine[None, None, tuple[float, Counter[str], int, tuple[int, int]]],
    profile: str | None,
) -> tuple[float, Counter[str], int, tuple[int, int]]:
    """``run`` to its end, under cProfile when ``profile`` names a file for its statistics."""
    if profile is None:
        return asyncio.run(run)
    import cProfile

    profiler = cProfile.Profile()
    try:
        return profiler.runcall(asyncio.run, run)
    finally:
        profiler.dump_stats(profile)


def report(r: dict[str, float], target: float | None) -> None:
    print(
        f"\n{r['subtasks']:g} subtasks, {r['concurrent']:g} in flight, "
        f"{r['latency'] * 1000:g} ms per model request ({r['requests']:g} requests), "
        f"isolation {r['isolation']}, sandbox {r['sandbox']}"
    )
    goal = f"  (target <= {target:.2f})" if target else ""
    print(
        f"  makespan {r['makespan']:.3f} s, lower bound {r['bound']:.3f} s: "
        f"ratio {r['makespan'] / r['bound']:.3f}{goal}"
    )
    print(
        f"  bound from the server's measured request times {r['served_bound']:.3f} s "
        f"(its own overhead {r['served_bound'] / r['bound'] - 1:+.1%}); "
        f"ratio to it {r['makespan'] / r['served_bound']:.3f}"
    )
    if r["bare"]:
        print(
            f"  a bare SDK loop sending the same requests: {r['bare']:.3f} s "
            f"(ratio {r['bare'] / r['bound']:.3f}); "
            f"orchmode over it {r['makespan'] / r['bare']:.3f}"
        )
    if r["bare"]:
        mine = r["cpu_ms"] + r["children_cpu_ms"]
        served = mine + r["server_cpu_ms"]
        bare_served = r["bare_cpu_ms"] + r["bare_server_cpu_ms"]
        # Issue 37's targets: 1.10 at 10 in flight, 1.3 at 100 (where two cores saturate).
        makespan_goal = 1.3 if r["concurrent"] >= 100 else 1.10
        print(
            f"  against the bare SDK loop, in the same run: makespan "
            f"{r['makespan'] / r['bare']:.3f}x (target <= {makespan_goal:.2f}); CPU per "
            f"request, the process and its children, {mine:.2f} ms against "
            f"{r['bare_cpu_ms']:.2f} ms "
            f"({mine / r['bare_cpu_ms']:.2f}x); with the scripted server's on both sides, "
            f"{served:.2f} ms against {bare_served:.2f} ms ({served / bare_served:.2f}x, "
            f"target <= 1.5)"
        )
    if r["bare"]:
        print(
            f"  the whole machine's CPU per request (every process, and the kernel's "
            f"threads): {r['machine_cpu_ms']:.2f} ms against {r['bare_machine_cpu_ms']:.2f} "
            f"ms ({r['machine_cpu_ms'] / r['bare_machine_cpu_ms']:.2f}x)"
        )
    else:
        print(
            f"  the whole machine's CPU per request (every process, and the kernel's "
            f"threads): {r['machine_cpu_ms']:.2f} ms"
        )
    print(f"  peak memory of the harness (RSS) {r['peak_mb']:.0f} MB")
    if r["agents"]:
        print(
            f"  agents handed a shell started ahead: {r['pooled']:g} of the {r['agents']:g} "
            f"that could take one (the rest started their own while their first request "
            f"was in flight)"
        )
    bare = f", the bare SDK loop {r['bare_cpu_ms']:.2f} ms" if r["bare"] else ""
    print(
        f"  CPU per model request: harness {r['cpu_ms']:.2f} ms{bare}; "
        f"its shells, sandboxes and git {r['children_cpu_ms']:.2f} ms; "
        f"scripted server {r['server_cpu_ms']:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, help="one run of this many (default: the suite)")
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--no-bare", action="store_true", help="skip the bare SDK baseline")
    parser.add_argument(
        "--isolation",
        choices=("worktree", "shared", "both"),
        default="both",
        help="where the workers work: each in a copy of the tree (orchmode's default), all "
        "in one, or the suite under each (the default)",
    )
    parser.add_argument(
        "--traces",
        action="store_true",
        help="the same fan-out with OpenTelemetry traces off and on (exported over OTLP/HTTP "
        "to a sink that keeps nothing): CPU per model request of each, and the difference",
    )
    parser.add_argument(
        "--sandbox",
        choices=("workspace-write", "off"),
        default="workspace-write",
        help="where bash runs: in bubblewrap (orchmode's default) or unsandboxed, to measure "
        "the core alone",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="with --subtasks: run the fan-out under cProfile and write its statistics to "
        "FILE (read them with `python -m pstats FILE`)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="measure the process's first fan-out, its one-off costs (imports, the SDK's "
        "validators) in orchmode's figures; by default a small untimed fan-out runs first",
    )
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    isolations = ("worktree", "shared") if args.isolation == "both" else (args.isolation,)
    if args.traces:
        compare_traces(args, isolations[0])
        return
    if args.subtasks is not None:
        for isolation in isolations:
            result = run_one(
                args.subtasks,
                args.concurrent,
                args.latency,
                not args.no_bare,
                isolation,
                args.traced,
                args.sandbox,
                args.profile,
                not args.cold,
            )
            if args.json:
                print(json.dumps(result))
            else:
                report(result, None)
        return
    for subtasks, concurrent, latency, target in SUITE:
        for isolation in isolations:
            # Each run in its own process, so that peak memory is that run's alone.
            command = [sys.executable, __file__, "--json", "--subtasks", str(subtasks)]
            command += ["--concurrent", str(concurrent), "--latency", str(latency)]
            command += ["--isolation", isolation]
            if args.no_bare or target is None:
                command.append("--no-bare")
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            report(json.loads(output.strip().splitlines()[-1]), target)
    print("\ntarget for 1,000 in flight: peak memory < 300 MB")


def compare_traces(args: argparse.Namespace, isolation: str) -> None:
    """Traces off and on, five times each, alternating (each run in its own process, so
    that one's warm caches do not flatter the other): CPU per model request of each, best
    of five. Spans cost only in the harness's process, so that is the figure compared. Runs
    vary by several per cent on a 2-core machine, so the tracer's own CPU (spans made, in
    the event loop's thread; spans exported, in the SDK's thread) is measured too."""
    subtasks = args.subtasks or 200
    latency = args.latency if args.subtasks else 0.05
    own: dict[bool, list[float]] = {False: [], True: []}
    spent: list[float] = []
    for traced in (False, True) * 5:
        command = [sys.executable, __file__, "--json", "--no-bare", "--subtasks", str(subtasks)]
        command += ["--concurrent", str(args.concurrent), "--latency", str(latency)]
        command += ["--isolation", isolation, *(["--traced"] if traced else [])]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(output.strip().splitlines()[-1])
        own[traced].append(result["cpu_ms"])
        if traced:
            spent.append(result["traces_cpu_ms"])
    off, on = min(own[False]), min(own[True])
    tracer = sorted(spent)[len(spent) // 2]
    print(
        f"{subtasks} subtasks, {args.concurrent} in flight, {latency * 1000:g} ms per model "
        f"request, isolation {isolation}: CPU per model request of the harness process, best "
        f"of 5, traces off {off:.2f} ms, on {on:.2f} ms ({on / off - 1:+.1%}); the tracer's own "
        f"CPU (median of 5) {tracer:.3f} ms per request, {tracer / off:+.1%} of the untraced "
        f"harness's (target <= +10%)"
    )


if __name__ == "__main__":
    main()
