"""The Ray executor against the local one: one big fan-out, makespan over its lower bound.

1,000 subtasks, each model request answered by the scripted server (its own process)
after 2 s, 200 subagents in flight; every worker and verifier runs one sandboxed bash
command, so a chain is four requests. The same fan-out runs on the local executor (in a
fresh process, through ``bench/fanout.py``) and on a real two-node Ray cluster started on
this machine (nodes on 127.0.0.2 and 127.0.0.3, the store in a private PostgreSQL):

    lower bound = max(longest chain, total chain time / slots)

Both nodes share this machine's two cores, so the cluster run also pays for Ray's own
processes (GCS, two raylets, their agents): it measures the executor's overhead, not
more hardware. Peak memory is given per node: the peak of its orchmode actors, and what
all of its Ray processes hold at the end.

    .venv/bin/python bench/cluster.py
    .venv/bin/python bench/cluster.py --subtasks 200 --concurrent 50 --latency 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fanout import FanoutTally, process_cpu, server_chain_times, start_server
from orchmode.core.events import EventBus
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import Conversation, open_conversation
from support.postgres import postgres_server
from support.raycluster import LocalCluster, local_ray_cluster, session_members

TARGET = 1.3
_MB = 1024 * 1024


def run_local(subtasks: int, concurrent: int, latency: float) -> dict[str, float]:
    """The local executor's run, in a fresh process so its peak memory is its own."""
    command = [sys.executable, str(Path(__file__).parent / "fanout.py"), "--json", "--no-bare"]
    command += ["--isolation", "worktree"]  # the settings' default, as the cluster run has
    command += ["--subtasks", str(subtasks), "--concurrent", str(concurrent)]
    command += ["--latency", str(latency)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def session_processes(session_id: int) -> dict[int, tuple[int, float]]:
    """Every process of a session (a node's Ray processes): its resident bytes and CPU seconds."""
    found: dict[int, tuple[int, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in session_members(session_id):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue  # it ended while we looked
        cpu = (int(fields[11]) + int(fields[12])) / tick
        rss = [
            int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")
        ]
        found[pid] = (rss[0] if rss else 0, cpu)
    return found


def cpu_since(before: dict[int, tuple[int, float]], after: dict[int, tuple[int, float]]) -> float:
    return sum(cpu - before.get(pid, (0, 0.0))[1] for pid, (_, cpu) in after.items())


async def measure_ray(
    cluster: LocalCluster,
    store_url: str,
    url: str,
    server_pid: int,
    concurrent: int,
    subtasks: int,
) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    settings = Settings(
        base_url=url,
        max_concurrent=concurrent,
        max_retries=0,
        workdir=workdir,
        max_subtasks=subtasks,
        max_subagents=2 * subtasks + 10,
        executor="ray",
        ray_address=cluster.address,
        store=store_url,
    )
    # Ray reads its token from the environment when it is imported.
    from orchmode.executors.ray import RayExecutor

    events = EventBus()
    tally = FanoutTally()
    events.subscribe(tally)
    credentials = Credentials(api_key="test-key")
    executor = RayExecutor(settings, credentials, workdir)
    await executor.start()
    sessions = [node.pid for node in cluster.nodes]
    try:
        async with open_conversation(
            settings, credentials, events=events, executor=executor
        ) as session:
            driver_cpu, server_cpu, nodes = await _measured_turn(
                session, executor, sessions, list(cluster.addresses), server_pid
            )
    finally:
        await executor.close()
    return {
        "makespan": tally.durations[0],
        "chains": list(tally.per_chain.values()),
        "requests": sum(tally.per_chain.values()),
        "nodes": nodes,
        "driver_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "driver_cpu": driver_cpu,
        "server_cpu": server_cpu,
    }


async def _measured_turn(
    session: Conversation,
    executor: Any,
    sessions: list[int],
    addresses: list[str],
    server_pid: int,
) -> tuple[float, float, dict[str, dict[str, float]]]:
    """One fan-out turn; the driver's and the server's CPU, and each node's use."""
    before = [session_processes(s) for s in sessions]
    actors_before = await executor.stats()
    server_before = process_cpu(server_pid)
    driver_before = time.process_time()
    await session.turn("fan out")
    driver_cpu = time.process_time() - driver_before
    server_cpu = process_cpu(server_pid) - server_before
    actors = await executor.stats()
    nodes: dict[str, dict[str, float]] = {}
    for node, stats in sorted(actors.items()):
        index = addresses.index(node.split("#")[0])
        after = session_processes(sessions[index])
        nodes[node] = {
            "actor_peak_mb": max(s.peak_rss for s in stats) / _MB,
            "node_rss_mb": sum(rss for rss, _ in after.values()) / _MB,
            "processes": len(after),
            "actor_cpu": sum(s.cpu for s in stats)
            - sum(s.cpu for s in actors_before.get(node, [])),
            "node_cpu": cpu_since(before[index], after),
        }
    return driver_cpu, server_cpu, nodes


def run_ray(subtasks: int, concurrent: int, latency: float) -> dict[str, object]:
    with local_ray_cluster(nodes=2) as cluster, postgres_server() as store_url:
        os.environ.update(cluster.env)
        server, url = start_server(subtasks, latency)
        try:
            result = asyncio.run(
                measure_ray(cluster, store_url, url, server.pid, concurrent, subtasks)
            )
            result["served"] = server_chain_times(url)
            return result
        finally:
            server.terminate()
            server.wait()


def bound(chains: list[int], latency: float, concurrent: int) -> float:
    times = [n * latency for n in chains]
    return max(max(times), sum(times) / concurrent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=1000)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--no-local", action="store_true", help="skip the local executor's run")
    args = parser.parse_args()
    print(
        f"{args.subtasks} subtasks, {args.concurrent} in flight, "
        f"{args.latency * 1000:g} ms per model request"
    )
    if not args.no_local:
        local = run_local(args.subtasks, args.concurrent, args.latency)
        print(
            f"\nlocal executor: makespan {local['makespan']:.2f} s, lower bound "
            f"{local['bound']:.2f} s: ratio {local['makespan'] / local['bound']:.3f}"
        )
        print(f"  peak memory (the one process, RSS) {local['peak_mb']:.0f} MB")
    ray = run_ray(args.subtasks, args.concurrent, args.latency)
    chains = ray["chains"]
    assert isinstance(chains, list)
    ideal = bound(chains, args.latency, args.concurrent)
    makespan = ray["makespan"]
    assert isinstance(makespan, float)
    print(
        f"\nRay executor, two nodes: makespan {makespan:.2f} s, lower bound {ideal:.2f} s: "
        f"ratio {makespan / ideal:.3f}  (target <= {TARGET})"
    )
    served = ray["served"]
    assert isinstance(served, list)
    served_bound = max(max(served), sum(served) / args.concurrent)
    print(
        f"  bound from the server's measured request times {served_bound:.2f} s; "
        f"ratio to it {makespan / served_bound:.3f}"
    )
    nodes = ray["nodes"]
    assert isinstance(nodes, dict)
    for node, figures in nodes.items():
        print(
            f"  node {node}: orchmode actor peak {figures['actor_peak_mb']:.0f} MB; all "
            f"{figures['processes']:.0f} Ray processes of the node {figures['node_rss_mb']:.0f} MB "
            f"at the end; CPU during the fan-out: actor {figures['actor_cpu']:.1f} s, the "
            f"node's processes in all {figures['node_cpu']:.1f} s"
        )
    print(
        f"  the driver (main agent, this process) peak {ray['driver_peak_mb']:.0f} MB, CPU "
        f"{ray['driver_cpu']:.1f} s; the scripted server CPU {ray['server_cpu']:.1f} s"
    )


if __name__ == "__main__":
    main()
