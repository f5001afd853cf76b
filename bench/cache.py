"""How much of its input a session reads from the prompt cache, against the most it could.

A 5-turn session: the first turn in orchestration mode (scout, one Workflow call of 50
subtasks, each with a worker that runs a command and a verifier, then a synthesis), four
more turns with the mode off. The scripted server bills every request as the API does
and also works out what it *could* have served from cache had every block boundary been a
breakpoint (the longest prefix any earlier request shared). Printed, for the main loop
and for the subagents: tokens read from cache over that ideal (target >= 0.8), and the
plain share of input read from cache.

    .venv/bin/python bench/cache.py [--subtasks 50] [--turns 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from orchmode.core.events import EventBus
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import LoggedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario

TURNS = (
    "Review this repository for bugs.",
    "Which of those matters most?",
    "How would you fix it?",
    "What test would catch it?",
    "Summarise the plan in three lines.",
)


async def session(url: str, workdir: Path, turns: int) -> None:
    settings = Settings(base_url=url, workdir=workdir, max_retries=0)
    events = EventBus()
    store = SQLiteStore.open(workdir / "store.db")
    credentials = Credentials(api_key="test-key")
    try:
        async with open_conversation(settings, credentials, events=events, store=store) as agent:
            for n in range(turns):
                agent.set_mode(n == 0)
                result = await agent.turn(TURNS[n % len(TURNS)])
                if result.error is not None:
                    raise result.error
    finally:
        await store.close()


def share(entries: list[LoggedRequest]) -> tuple[int, int, int]:
    """Tokens read from cache, the most that could have been, and all input tokens."""
    usages = [e.usage for e in entries if e.usage is not None and e.outcome == "ok"]
    return (
        sum(u.cache_read_input_tokens for u in usages),
        sum(u.ideal_read_tokens for u in usages),
        sum(u.total_input_tokens for u in usages),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=50)
    parser.add_argument("--turns", type=int, default=5)
    args = parser.parse_args()
    scenario = OrchestrationScenario(
        subtasks=args.subtasks, worker_command="ls", verifier_command="ls"
    )
    server = ScriptedServer(scenario, api_key="test-key")
    with server.in_thread(), tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "notes.txt").write_text("a file for the agents to find\n")
        asyncio.run(session(server.url, Path(tmp), args.turns))
        log = server.log
    main_calls = [e for e in log if any(t["name"] == "Workflow" for t in e.body["tools"])]
    subagents = [e for e in log if e not in main_calls]
    print(f"{args.turns} turns, one fan-out of {args.subtasks} subtasks; {len(log)} requests")
    for name, entries in (("main loop", main_calls), ("subagents", subagents), ("all", log)):
        read, ideal, total = share(entries)
        print(
            f"{name:9}  read from cache {read:>8,} of {ideal:>8,} it could have been: "
            f"{read / ideal if ideal else 1:.3f} (target >= 0.8); "
            f"{read / total if total else 0:.1%} of {total:,} input tokens"
        )


if __name__ == "__main__":
    main()
