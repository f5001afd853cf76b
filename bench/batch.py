"""The same fan-out interactive and batched: what batch mode costs, and how long it waits.

A 200-subtask fan-out (each subtask a worker, then its verifier, each running one bash
command and reporting) is run twice in one process against the scripted server (in a
thread, a fresh one for each run so neither finds the other's prompt cache): once
interactively, once with every subagent batched (``--batch subagents``)
while the server takes ``--delay`` seconds over each batch. It prints:

- the batched run's dollars against the interactive run's, by the budget ledger (the
  target is ≤ 0.52; the main agent, never batched, pays full price in both), and the
  subagents' dollars alone;
- whether every subagent's result is the same in both runs;
- the batched fan-out's wall time against its floor, the batch delay times the turns
  along the longest chain (worker turns, then verifier turns): each turn waits on one
  batch (the target is ≤ 1.10).

    .venv/bin/python bench/batch.py
    .venv/bin/python bench/batch.py --subtasks 50 --delay 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from orchmode import Credentials, Settings, open_session
from orchmode.core.events import Event, FanoutDone, ModelRequestDone, TokenUsage
from orchmode.testing import BatchSettings, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario

KEY = "bench-key"


@dataclass
class Run:
    """One run of the fan-out, as the ledger and the events saw it."""

    dollars: float
    fanout_seconds: float
    #: Each subagent's recorded result, by role and prompt.
    results: dict[tuple[str, str], str]
    #: Model requests of each agent ("worker 1.7"), main agent left out.
    turns: Counter[str]
    #: Tokens of the subagents' requests.
    subagent_usage: TokenUsage
    #: Dollars of the subagents' requests (the main agent is never batched).
    subagent_dollars: float
    batched_requests: int


async def one_run(url: str, workdir: Path, subtasks: int, batch: str) -> Run:
    settings = Settings(
        base_url=url,
        workdir=workdir,
        max_retries=0,
        max_concurrent=subtasks,
        max_subtasks=subtasks,
        max_subagents=2 * subtasks + 10,
        batch=batch,  # type: ignore[arg-type]
        batch_window=0.2,
        batch_poll=0.2,
    )
    turns: Counter[str] = Counter()
    fanout: list[float] = []
    usage, batched, dollars = TokenUsage(), 0, 0.0

    def seen(event: Event) -> None:
        nonlocal usage, batched, dollars
        if isinstance(event, FanoutDone):
            fanout.append(event.duration)
        elif isinstance(event, ModelRequestDone) and event.agent != "main":
            turns[event.agent] += 1
            usage += event.usage
            batched += event.batched
            dollars += event.cost

    async with open_session(settings, credentials=Credentials(KEY)) as session:
        session.subscribe(seen)
        result = await session.turn("fan out")
        assert result.ok, result.error
        spent = (await session.budget()).ledger.cost
    results = recorded_results(workdir)
    return Run(spent, fanout[0], results, turns, usage, dollars, batched)


def recorded_results(workdir: Path) -> dict[tuple[str, str], str]:
    db = sqlite3.connect(workdir / ".orchmode" / "journal.db")
    try:
        rows = db.execute("SELECT role, prompt, result FROM results").fetchall()
    finally:
        db.close()
    return {
        (role, prompt): json.dumps(json.loads(result), sort_keys=True)
        for role, prompt, result in rows
    }


def longest_chain(turns: Counter[str]) -> int:
    """Turns along the longest chain: a subtask's worker turns, then its verifier's."""
    chains: Counter[str] = Counter()
    for agent, count in turns.items():
        chains[agent.split()[-1]] += count
    return max(chains.values())


async def main(subtasks: int, delay: float) -> None:
    runs, servers = {}, {}
    with tempfile.TemporaryDirectory() as root:
        for batch in ("off", "subagents"):
            # a server each: the second run must not find the first one's prompt cache
            scenario = OrchestrationScenario(
                subtasks=subtasks,
                scout_command=None,
                worker_command="true",
                verifier_command="true",
            )
            server = servers[batch] = ScriptedServer(
                scenario, api_key=KEY, batches=BatchSettings(delay=delay)
            )
            server.start_in_thread()
            workdir = Path(root) / batch
            workdir.mkdir()
            started = time.monotonic()
            try:
                runs[batch] = await one_run(server.url, workdir, subtasks, batch)
            finally:
                server.stop_thread()
            print(f"{batch:>9}: {time.monotonic() - started:6.1f} s in all")
    batched = servers["subagents"]
    print_batches(batched)
    report(runs["off"], runs["subagents"], delay, max(batched.batches.submissions.values()))


def print_batches(server: ScriptedServer) -> None:
    """Each batch: when it was created after the first, its size, how long it ran."""
    batches = server.batches.all()
    first = batches[0].created_at
    for batch in batches:
        ran = (batch.ended_at - batch.created_at).total_seconds() if batch.ended_at else 0.0
        since = (batch.created_at - first).total_seconds()
        print(f"batch at {since:6.1f} s: {len(batch.items):4} requests, ended after {ran:.1f} s")


def report(at_once: Run, batched: Run, delay: float, most_submitted: int) -> None:
    chain = longest_chain(batched.turns)
    floor = chain * delay
    print(
        f"subagent requests: {sum(at_once.turns.values())} at once, "
        f"{batched.batched_requests} batched (each custom_id sent {most_submitted}x at most)"
    )
    print(
        f"dollars (ledger): interactive ${at_once.dollars:.4f}, batched ${batched.dollars:.4f}"
        f" -> ratio {batched.dollars / at_once.dollars:.3f} (target <= 0.52)"
    )
    alone = batched.subagent_dollars / at_once.subagent_dollars
    print(
        f"subagents' dollars alone: ${at_once.subagent_dollars:.4f} and "
        f"${batched.subagent_dollars:.4f} -> {alone:.3f}"
    )
    same = at_once.results == batched.results
    print(f"results: {len(batched.results)} recorded, the same in both runs: {same}")
    print(
        f"batched fan-out: {batched.fanout_seconds:.1f} s against {chain} turns x {delay:g} s"
        f" = {floor:.1f} s -> ratio {batched.fanout_seconds / floor:.3f} (target <= 1.10)"
    )
    for name, run in (("interactive", at_once), ("batched", batched)):
        u = run.subagent_usage
        print(
            f"{name} subagents' tokens: {u.input_tokens:,} input, {u.cache_write_tokens:,} "
            f"cache writes ({u.cache_write_1h_tokens:,} kept 1 h), "
            f"{u.cache_read_tokens:,} cache reads, {u.output_tokens:,} output"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=200)
    parser.add_argument(
        "--delay", type=float, default=10.0, help="seconds the server takes over each batch"
    )
    args = parser.parse_args()
    asyncio.run(main(args.subtasks, args.delay))
