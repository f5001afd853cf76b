"""A tree of agents against a flat fan-out: the same 125 leaves, started by the main agent
at once, and by 5 workers that each start 5 that each start 5 (``max_depth`` 3).

Every leaf runs one bash command that writes a file of its own, then reports; every agent
is verified by its own level. The tree adds 30 planning workers and their verifiers, and a
level of waiting per depth; the ratio that matters is the nested makespan over the flat
one *beyond* that extra work, so both are printed: the plain ratio, and the ratio divided
by the two runs' request counts' ratio (the extra levels' requests taken out).

    .venv/bin/python bench/nesting.py [--delay 0.05] [--max-concurrent 10]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from orchmode.core.events import EventBus
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario

SHARED = {"isolation": "shared"}


def leaf_command(subtask: str) -> str | None:
    """A leaf appends to its own file; a worker that fans out runs nothing itself."""
    if "fan out" in subtask:
        return None
    name = subtask.split(" (plan", 1)[0].split()[-1]
    return f"echo written >> leaf-{name}"


def scenario(nested: bool, delay: float) -> OrchestrationScenario:
    if nested:
        subtasks = [f"Part {i}: fan out into 5x5" for i in range(1, 6)]
    else:
        subtasks = [
            f"Part {i}.{j}.{k} (plan 0)"
            for i in range(1, 6)
            for j in range(1, 6)
            for k in range(1, 6)
        ]
    return OrchestrationScenario(
        subtasks=subtasks,
        worker_command=leaf_command,
        workflow_input=SHARED,
        nested_input=SHARED,
        delay=delay,
    )


async def turn(url: str, workdir: Path, max_concurrent: int) -> float:
    """One orchestrated turn's wall time."""
    settings = Settings(
        base_url=url, workdir=workdir, max_retries=0, max_depth=3, max_concurrent=max_concurrent
    )
    store = SQLiteStore.open(workdir / "store.db")
    credentials = Credentials(api_key="test-key")
    try:
        async with open_conversation(
            settings, credentials, events=EventBus(), store=store
        ) as agent:
            started = time.monotonic()
            result = await agent.turn("Write the leaves.")
            took = time.monotonic() - started
            if result.error is not None:
                raise result.error
    finally:
        await store.close()
    leaves = len(list(workdir.glob("leaf-*")))
    assert leaves == 125, f"{leaves} leaves written, not 125"
    return took


def measure(nested: bool, delay: float, max_concurrent: int) -> tuple[float, int]:
    """The makespan of one run and the model requests it made."""
    server = ScriptedServer(scenario(nested, delay), api_key="test-key")
    with server.in_thread(), tempfile.TemporaryDirectory() as tmp:
        took = asyncio.run(turn(server.url, Path(tmp), max_concurrent))
        return took, sum(1 for e in server.log if e.path == "/v1/messages")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--max-concurrent", type=int, default=10)
    args = parser.parse_args()
    flat, flat_requests = measure(False, args.delay, args.max_concurrent)
    nested, nested_requests = measure(True, args.delay, args.max_concurrent)
    extra = nested_requests / flat_requests
    print(f"125 leaves, {args.max_concurrent} in flight, {args.delay * 1000:.0f} ms a request")
    print(f"flat      {flat:6.2f} s  {flat_requests} requests")
    print(f"depth 3   {nested:6.2f} s  {nested_requests} requests")
    print(f"nested / flat makespan: {nested / flat:.2f}")
    print(f"beyond the extra levels' requests (x{extra:.2f}): {nested / flat / extra:.2f}")


if __name__ == "__main__":
    main()
