"""How well the adaptive limit uses a rate-limited API, and that nothing fails because of it.

The scripted server (in its own process) accepts at most 20 requests in flight and answers
429 with ``retry-after`` above that; orchmode is configured with a ceiling of 100 and given
400 subtasks (each request answered after 50 ms). Printed: the average number of requests
the server was serving during the fan-out, over 20 (target >= 0.9), and the number of
failed subagents (target 0).

    .venv/bin/python bench/ratelimit.py [--subtasks 400] [--ceiling 100] [--server-limit 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import urllib.request
from pathlib import Path

from fanout import one_turn, start_server
from orchmode.events import Event, EventBus, SubagentDone
from orchmode.settings import Settings
from orchmode.testing.server import LOG_PATH


async def run(url: str, ceiling: int, workdir: Path) -> tuple[int, int]:
    settings = Settings(base_url=url, max_concurrent=ceiling, workdir=workdir)
    events = EventBus()
    failed: list[SubagentDone] = []

    def record(event: Event) -> None:
        if isinstance(event, SubagentDone) and event.status != "finished":
            failed.append(event)

    events.subscribe(record)
    gateway = await one_turn(settings, events, workdir)
    return len(failed), gateway.limit.peak


def average_in_flight(url: str) -> tuple[float, int, int]:
    """Time-weighted requests being served while the fan-out ran, from the server's log."""
    with urllib.request.urlopen(url + LOG_PATH) as response:
        entries = json.load(response)
    served = [e for e in entries if e["outcome"] == "ok" and e["finished"] is not None]
    refused = sum(1 for e in entries if e["outcome"] == "rate_limited")
    main_calls = [e for e in served if e["first_user_text"] == "fan out"]
    start = main_calls[0]["finished"]  # the Workflow call came back: the fan-out begins
    end = main_calls[-1]["started"]  # the synthesis request: it is over
    busy = sum(
        max(0.0, min(e["finished"], end) - max(e["started"], start))
        for e in served
        if e["first_user_text"] != "fan out"
    )
    return busy / (end - start), refused, len(served)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=400)
    parser.add_argument("--ceiling", type=int, default=100)
    parser.add_argument("--server-limit", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    server, url = start_server(
        args.subtasks, args.latency, "--max-in-flight", str(args.server_limit)
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            failed, peak = asyncio.run(run(url, args.ceiling, Path(tmp)))
        average, refused, served = average_in_flight(url)
    finally:
        server.terminate()
        server.wait()
    print(
        f"subtasks {args.subtasks}, ceiling {args.ceiling}, server limit {args.server_limit}, "
        f"latency {args.latency * 1000:g} ms"
    )
    print(f"requests served {served}, refused with 429 {refused}; most in flight {peak}")
    print(
        f"average in flight over the server's limit: {average / args.server_limit:.3f}  "
        "(target >= 0.9)"
    )
    print(f"failed subagents: {failed}  (target 0)")


if __name__ == "__main__":
    main()
