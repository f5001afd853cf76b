"""An approval parks only the agent that asked: the others finish as if nobody had asked.

A fan-out of N agents (a worker and its verifier each) runs twice against the scripted
server (in its own process, answering every request after a set latency): once with no
rule asking anything, and once with a rule that makes one worker ask the user. The user
answers only after every other chain has finished, so the asking agent is parked the whole
time. The figure is how long the other N-1 chains take in the second run against the
first (target ≤ 1.05×): if the parked agent kept its slot, they would run on one slot fewer.
The latency is long enough that the fan-out waits on the model, not on this machine's two
cores (at 50 ms the harness's own CPU, not the slots, sets the pace, and hides the effect).

    .venv/bin/python bench/approvals.py                  # 100 agents, 10 at once, 200 ms
    .venv/bin/python bench/approvals.py --subtasks 100 --concurrent 10 --latency 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import fanout  # bench/: the scripted server's process, started as the fan-out benchmark does
from orchmode.core.events import ApprovalRequested, Event, EventBus, SubagentDone
from orchmode.core.permissions import Rules
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import Conversation, open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing.scenario import OrchestrationScenario

#: The chain whose worker asks; every other worker and verifier runs ``true``.
ASKING = int(os.environ.get("BENCH_ASKING", "50"))
ASK_RULE = "Bash(echo deploy:*)"


def _worker_command(prompt: str) -> str:
    found = re.search(r"item (\d+)", prompt)
    return "echo deploy" if found and int(found[1]) == ASKING else "true"


#: What the server process answers with (imported there as ``approvals:responder``).
responder = OrchestrationScenario(
    subtasks=int(os.environ.get("BENCH_SUBTASKS", "100")),
    scout_command=None,
    worker_command=_worker_command,
    verifier_command="true",
)


def start_server(subtasks: int, latency: float) -> tuple[subprocess.Popen[str], str]:
    """The scripted server in its own process, answering with ``responder`` above."""
    return fanout.start_server(
        subtasks, latency, responder="approvals:responder", env={"BENCH_ASKING": str(ASKING)}
    )


class Others:
    """When each chain other than the asking one finished (its last agent done)."""

    def __init__(self, subtasks: int, asking: int) -> None:
        self.waiting = {i for i in range(1, subtasks + 1) if i != asking}
        self.done_at: float | None = None
        self.all_done = asyncio.Event()
        self.asked: list[int] = []
        self._chains: dict[int, int] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, ApprovalRequested):
            self.asked.append(event.id)
        if not isinstance(event, SubagentDone) or event.index == ASKING:
            return
        seen = self._chains.get(event.index, 0) + 1
        self._chains[event.index] = seen
        if seen == 2 and event.index in self.waiting:  # worker, then its verifier
            self.waiting.discard(event.index)
            if not self.waiting:
                self.done_at = time.monotonic()
                self.all_done.set()


async def one_run(url: str, subtasks: int, concurrent: int, asks: bool) -> float:
    """Seconds until every chain but the asking one has finished."""
    with tempfile.TemporaryDirectory(prefix="orchmode-bench-approvals-") as where:
        workdir = Path(where)
        settings = Settings(
            base_url=url,
            max_concurrent=concurrent,
            max_retries=0,
            workdir=workdir,
            max_subtasks=subtasks,
            max_subagents=2 * subtasks + 10,
            isolation="shared",
            sandbox="off",
            permissions_ask=(ASK_RULE,) if asks else (),
        )
        events = EventBus()
        others = Others(subtasks, ASKING)
        events.subscribe(others)
        store = SQLiteStore.open(workdir / "store.db")
        rules, _ = Rules.load(settings, workdir, {"HOME": where})
        credentials = Credentials(api_key="test-key")
        try:
            async with open_conversation(
                settings, credentials, events=events, rules=rules, store=store
            ) as session:
                started = time.monotonic()
                answering = asyncio.create_task(answer_when_done(session, others))
                try:
                    await session.turn("fan out")
                finally:
                    answering.cancel()
        finally:
            await store.close()
        if asks and not others.asked:
            raise SystemExit("the asking worker never asked: the rule did not match")
        assert others.done_at is not None
        return others.done_at - started


async def answer_when_done(session: Conversation, others: Others) -> None:
    """Say yes to every question once the other chains are done."""
    await others.all_done.wait()
    assert session.permits is not None and session.permits.approvals is not None
    for asked in others.asked:
        await session.permits.approvals.answer(asked, True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subtasks", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server, url = start_server(args.subtasks, args.latency)
    try:
        quiet: list[float] = []
        parked: list[float] = []
        for _ in range(args.repeat):  # interleaved, so drift hits both alike
            quiet.append(asyncio.run(one_run(url, args.subtasks, args.concurrent, False)))
            parked.append(asyncio.run(one_run(url, args.subtasks, args.concurrent, True)))
    finally:
        server.kill()
        server.wait()
    print("each run:", [f"{x:.2f}" for x in quiet], [f"{x:.2f}" for x in parked])
    q, p = statistics.median(quiet), statistics.median(parked)
    print(
        f"{args.subtasks} chains, {args.concurrent} at once, {args.latency * 1000:.0f} ms a "
        f"request; the other {args.subtasks - 1} chains finish in:"
    )
    print(f"  nobody asks:             {q:.2f} s (median of {args.repeat})")
    print(f"  one agent parked:        {p:.2f} s")
    print(f"  ratio: {p / q:.3f}x (target <= 1.05x; {1 + 1 / (args.concurrent - 1):.3f}x if the ")
    print("  parked agent kept its slot)")


if __name__ == "__main__":
    main()
