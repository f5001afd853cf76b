"""What a model per role saves: one 20-subtask fan-out, every agent on one model, against
the same fan-out with its workers on a model half the price.

The scripted server answers both runs alike (each worker runs a command and hands in a
report of ``--report-bytes``; each verifier confirms it), so the only difference is the
model each request names. Dollars come from the price table, per request, as orchmode
records them; the scripted server's own usage log, priced the same way, is printed beside
them as a check. Printed: the dollars of each run, the split by model, and their ratio.

    .venv/bin/python bench/roles.py [--subtasks 20] [--report-bytes 6000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from orchmode.core.events import EventBus
from orchmode.core.pricing import default_prices
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.records.totals import SessionTotals
from orchmode.session.agent import open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario

STRONG = "claude-opus-5-5"
HALF = "claude-sonnet-5-5"  # half the strong model's price on every kind of token


async def fan_out(url: str, workdir: Path, **roles: Any) -> SessionTotals:
    """One orchestrated turn; what it used, as recorded."""
    settings = Settings(base_url=url, workdir=workdir, max_retries=0, model=STRONG, **roles)
    events = EventBus()
    totals = SessionTotals()
    events.subscribe(totals)
    store = SQLiteStore.open(workdir / "store.db")
    credentials = Credentials(api_key="test-key")
    try:
        async with open_conversation(settings, credentials, events=events, store=store) as agent:
            result = await agent.turn("Review this repository for bugs.")
            if result.error is not None:
                raise result.error
    finally:
        await store.close()
    return totals


def served_cost(server: ScriptedServer, since: int) -> float:
    """The dollars of the server's own log from entry ``since`` on, by the price table."""
    prices = default_prices()
    total = 0.0
    for entry in server.log[since:]:
        if entry.outcome == "ok" and entry.billed is not None:
            total += prices[entry.body["model"]].cost(entry.billed)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=20)
    parser.add_argument("--report-bytes", type=int, default=6000)
    args = parser.parse_args()
    scenario = OrchestrationScenario(
        subtasks=args.subtasks, worker_command="ls", report_bytes=args.report_bytes
    )
    server = ScriptedServer(scenario, api_key="test-key")
    runs: list[tuple[str, SessionTotals, float]] = []
    with server.in_thread():
        for label, roles in (
            (f"every agent on {STRONG}", {}),
            (f"workers on {HALF}", {"worker_model": HALF}),
        ):
            with tempfile.TemporaryDirectory() as tmp:
                (Path(tmp) / "notes.txt").write_text("a file for the agents to find\n")
                since = len(server.log)
                totals = asyncio.run(fan_out(server.url, Path(tmp), **roles))
                runs.append((label, totals, served_cost(server, since)))
    print(f"one fan-out of {args.subtasks} subtasks, {args.report_bytes:,}-byte reports")
    for label, totals, served in runs:
        split = totals.describe_models() or "one model"
        print(
            f"{label:32} ${totals.all.cost:.4f} in {totals.all.requests} requests "
            f"(the server's log, priced: ${served:.4f}); {split}"
        )
    one, mixed = runs[0][1].all.cost, runs[1][1].all.cost
    print(f"ratio, workers on {HALF} / every agent on {STRONG}: {mixed / one:.3f}")


if __name__ == "__main__":
    main()
