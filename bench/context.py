"""Results that fit: wide fan-outs of real-sized reports, and a long chat, in a 200k window.

Part 1 runs one orchestrated turn (scout, one Workflow call, synthesis) for 50, 150 and
400 subtasks whose workers report 2, 6 and 12 KB each, against a scripted server that
holds a 200,000-token window and refuses what passes it. Printed per run: the largest
main request over the window (target <= 0.9), the Workflow result over its budget, and
the share of the high and medium findings that reached the model inline.

Part 2 runs a 20-turn chat, each turn a 10-subtask fan-out of 6 KB reports, three ways:
with the API's context editing (the server takes the beta), with orchmode's own
compaction (the server refuses the beta), and a baseline with no window at all. Printed:
the share of the main loop's input read from the prompt cache, against the baseline's
over the turns that still fit the window (target >= 0.8 of it).

    .venv/bin/python bench/context.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from orchmode.core.events import ContextCompacted, EventBus, ResultCondensed, SubagentDone
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import LoggedRequest, Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, tool_call, turn_messages

WINDOW = 200_000
KEY = "test-key"


def is_main(entry: LoggedRequest) -> bool:
    return entry.path == "/v1/messages" and any(
        t.get("name") == "Workflow" for t in entry.body.get("tools") or []
    )


def prompt_size(entry: LoggedRequest) -> int:
    usage = entry.usage
    assert usage is not None
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


async def run_turns(
    url: str, workdir: Path, turns: list[str], seen: list[Any], **settings: Any
) -> None:
    config = Settings(base_url=url, workdir=workdir, max_retries=0, **settings)
    events = EventBus()
    events.subscribe(seen.append)
    store = SQLiteStore.open(workdir / "store.db")
    credentials = Credentials(api_key=KEY)
    try:
        async with open_conversation(config, credentials, events=events, store=store) as session:
            for text in turns:
                result = await session.turn(text)
                if result.error is not None:
                    raise result.error
    finally:
        await store.close()


def inline_share(seen: list[Any], tool_result: str) -> tuple[int, int]:
    """High and medium findings shown inline, and how many the workers reported."""
    total = 0
    for event in seen:
        if isinstance(event, SubagentDone) and event.role == "worker":
            findings = json.loads(event.result).get("findings", [])
            total += sum(1 for f in findings if f["severity"] in ("high", "medium"))
    condensed = tool_result.count("- [high] ") + tool_result.count("- [medium] ")
    whole = tool_result.count('"severity": "high"') + tool_result.count('"severity": "medium"')
    return condensed + whole, total


def fanout(subtasks: int, report_kb: int) -> str:
    scenario = OrchestrationScenario(
        subtasks=subtasks, report_bytes=report_kb * 1000, worker_command=None
    )
    server = ScriptedServer(scenario, api_key=KEY, context_window=WINDOW)
    seen: list[Any] = []
    started = time.monotonic()
    with server.in_thread(), tempfile.TemporaryDirectory() as tmp:
        asyncio.run(
            run_turns(
                server.url,
                Path(tmp),
                ["Review this repository thoroughly."],
                seen,
                max_subtasks=subtasks,
                max_concurrent=50,
            )
        )
        log = server.log
    refused = [e for e in log if "prompt is too long" in e.outcome]
    mains = [e for e in log if is_main(e) and e.status == 200]
    largest = max(prompt_size(e) for e in mains)
    synthesis = mains[-1].body["messages"][-1]["content"][0]["content"]
    condensed = next((e for e in seen if isinstance(e, ResultCondensed)), None)
    if condensed is not None:
        over = condensed.tokens_shown / condensed.budget
        note = f"condensed {condensed.tokens_full:>7,} -> {condensed.tokens_shown:>6,}"
    else:
        over = float("nan")
        note = "whole: under its budget"
    shown, total = inline_share(seen, synthesis)
    return (
        f"{subtasks:>4} x {report_kb:>2} KB  largest main request / window "
        f"{largest / WINDOW:.3f}  result / budget {over:.3f} ({note})  "
        f"high+medium inline {shown / total if total else 1:.2f} ({shown}/{total})  "
        f"refused as too long {len(refused)}  ({time.monotonic() - started:.0f} s)"
    )


class ChatTurns(OrchestrationScenario):
    """Every turn fans out ten subtasks of its own, then answers."""

    def main(self, request: ScriptedRequest) -> Reply:
        step = sum(1 for m in turn_messages(request.messages) if m.get("role") == "assistant")
        turn = next(
            m["content"]
            for m in reversed(request.messages)
            if m["role"] == "user" and isinstance(m["content"], str)
        )
        if step == 0:
            subtasks = [f"{turn}: check area {i}" for i in range(1, 11)]
            return tool_call("Workflow", {"subtasks": subtasks})
        return Reply.text(f"Answer to {turn}.")


def chat(turns: int, **server_options: Any) -> tuple[list[LoggedRequest], list[Any]]:
    scenario = ChatTurns(report_bytes=6000, worker_command=None)
    server = ScriptedServer(scenario, api_key=KEY, **server_options)
    seen: list[Any] = []
    settings: dict[str, Any] = {"max_concurrent": 40}
    if server_options.get("context_window") is None:
        settings["context_window"] = 10_000_000  # the baseline never compacts
        settings["context_management"] = "harness"
    with server.in_thread(), tempfile.TemporaryDirectory() as tmp:
        texts = [f"Question {n}" for n in range(1, turns + 1)]
        asyncio.run(run_turns(server.url, Path(tmp), texts, seen, **settings))
        return server.log, seen


def cache_share(entries: list[LoggedRequest]) -> float:
    usages = [e.usage for e in entries if e.usage is not None]
    read = sum(u.cache_read_input_tokens for u in usages)
    total = sum(u.total_input_tokens for u in usages)
    return read / total if total else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one size per part, to try it")
    args = parser.parse_args()
    counts = (50,) if args.quick else (50, 150, 400)
    sizes = (6,) if args.quick else (2, 6, 12)
    turns = 8 if args.quick else 20
    print(f"Part 1: one fan-out under a {WINDOW:,}-token window (targets: request <= 0.9)")
    for subtasks in counts:
        for report_kb in sizes:
            print(fanout(subtasks, report_kb), flush=True)

    print(f"\nPart 2: a {turns}-turn chat of 10-subtask fan-outs (6 KB reports)")
    base_log, _ = chat(turns)
    base_main = [e for e in base_log if is_main(e) and e.status == 200]
    fitting = []
    for entry in base_main:
        if prompt_size(entry) > WINDOW:
            break
        fitting.append(entry)
    baseline = cache_share(fitting)
    print(
        f"baseline, no window: {len(base_main)} main requests, {len(fitting)} fit the window; "
        f"cache share over those {baseline:.3f}"
    )
    for name, options in (
        ("the API's context editing", {"context_window": WINDOW}),
        ("orchmode's own compaction", {"context_window": WINDOW, "context_management": False}),
    ):
        log, seen = chat(turns, **options)
        mains = [e for e in log if is_main(e) and e.status == 200]
        share = cache_share(mains)
        compactions = [e.how for e in seen if isinstance(e, ContextCompacted) and e.agent == "main"]
        refused = [e.outcome for e in log if "prompt is too long" in e.outcome]
        largest = max(prompt_size(e) for e in mains)
        print(
            f"{name}: cache share {share:.3f} = {share / baseline:.2f} of the baseline "
            f"(target >= 0.8); largest request / window {largest / WINDOW:.3f}; "
            f"compactions {len(compactions)} ({', '.join(sorted(set(compactions))) or 'none'}); "
            f"refused as too long {len(refused)}"
        )


if __name__ == "__main__":
    main()
