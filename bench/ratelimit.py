"""How well the adaptive limit uses a rate-limited API, and that nothing fails because of it.

The scripted server (in its own process) accepts at most 20 requests in flight and answers
429 with ``retry-after`` above that; orchmode is configured with a ceiling of 100 and given
400 subtasks (each request answered after 200 ms). Printed: the average number of requests
the server was serving during the fan-out, over 20 (target >= 0.925: 18.5 in flight), and
the number of failed subagents (target 0). At 50 ms per request, 20 in flight means 400
requests a second, more than this harness and the scripted server together get through on two
cores: that run measures the machine, not the limit.

    .venv/bin/python bench/ratelimit.py [--subtasks 400] [--ceiling 100] [--server-limit 20]
                                        [--latency 0.2] [--timeline 0.5]
                                        [--isolation shared] [--sandbox off]

``--isolation shared --sandbox off`` takes the workspaces and sandboxed shells out, so that
on a slow machine the figure is the limit's and not the CPU's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from fanout import one_turn, start_server
from orchmode.core.events import Event, EventBus, SubagentDone
from orchmode.core.settings import Settings
from orchmode.testing.server import LOG_PATH


async def run(
    url: str, ceiling: int, subtasks: int, workdir: Path, isolation: str, sandbox: str
) -> tuple[int, int]:
    settings = Settings(
        base_url=url,
        max_concurrent=ceiling,
        workdir=workdir,
        max_subtasks=subtasks,
        max_subagents=2 * subtasks + 10,
        isolation=isolation,  # type: ignore[arg-type]
        sandbox=sandbox,  # type: ignore[arg-type]
    )
    events = EventBus()
    failed: list[SubagentDone] = []

    def record(event: Event) -> None:
        if isinstance(event, SubagentDone) and event.status != "finished":
            failed.append(event)

    events.subscribe(record)
    gateway, _ = await one_turn(settings, events, workdir)
    return len(failed), gateway.limit.peak


def server_log(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + LOG_PATH) as response:
        entries: list[dict[str, Any]] = json.load(response)
    return entries


def timeline(entries: list[dict[str, Any]], step: float) -> str:
    """Requests served (average) and refused in each ``step`` seconds, for a diagnosis."""
    served = [e for e in entries if e["outcome"] == "ok" and e["finished"] is not None]
    start = min(e["started"] for e in entries)
    end = max(e["finished"] or e["started"] for e in entries)
    rows = []
    t = start
    while t < end:
        busy = sum(max(0.0, min(e["finished"], t + step) - max(e["started"], t)) for e in served)
        refused = sum(
            1 for e in entries if e["outcome"] == "rate_limited" and t <= e["started"] < t + step
        )
        rows.append(f"{t - start:6.2f} s  {busy / step:5.1f} served  {refused:3d} refused")
        t += step
    return "\n".join(rows)


def average_in_flight(entries: list[dict[str, Any]]) -> tuple[float, int, int]:
    """Time-weighted requests being served while the fan-out ran, from the server's log."""
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


def phases(entries: list[dict[str, Any]], limit: int) -> str:
    """Where the fan-out's window went against perfect packing at ``limit``: the wait for
    the first subagent request, and the average in flight once the first second is past
    and before the last (the steady state), so that start-up, steady state and tail can be
    told apart."""
    served = [e for e in entries if e["outcome"] == "ok" and e["finished"] is not None]
    main_calls = [e for e in served if e["first_user_text"] == "fan out"]
    start, end = main_calls[0]["finished"], main_calls[-1]["started"]
    subagents = [e for e in served if e["first_user_text"] != "fan out"]
    first = min(e["started"] for e in entries if e["first_user_text"] != "fan out")
    busy = sum(e["finished"] - e["started"] for e in subagents)
    lost = (end - start) - busy / limit
    steady_from, steady_to = first + 1.0, end - 1.0
    steady = sum(
        max(0.0, min(e["finished"], steady_to) - max(e["started"], steady_from)) for e in subagents
    ) / max(1e-9, steady_to - steady_from)
    return (
        f"lost against perfect packing: {lost:.2f} s of {end - start:.2f} s; the first "
        f"subagent request came {first - start:.2f} s after the call; from 1 s after it to "
        f"1 s before the end, {steady:.1f} in flight on average ({steady / limit:.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subtasks", type=int, default=400)
    parser.add_argument("--ceiling", type=int, default=100)
    parser.add_argument("--server-limit", type=int, default=20)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--timeline", type=float, help="print a timeline in steps of this many s")
    parser.add_argument("--isolation", default="worktree", choices=("worktree", "shared"))
    parser.add_argument("--sandbox", default="workspace-write", choices=("workspace-write", "off"))
    args = parser.parse_args()
    server, url = start_server(
        args.subtasks, args.latency, "--max-in-flight", str(args.server_limit)
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            failed, peak = asyncio.run(
                run(url, args.ceiling, args.subtasks, Path(tmp), args.isolation, args.sandbox)
            )
        entries = server_log(url)
        average, refused, served = average_in_flight(entries)
    finally:
        server.terminate()
        server.wait()
    print(
        f"subtasks {args.subtasks}, ceiling {args.ceiling}, server limit {args.server_limit}, "
        f"latency {args.latency * 1000:g} ms, isolation {args.isolation}, sandbox {args.sandbox}"
    )
    print(f"requests served {served}, refused with 429 {refused}; most in flight {peak}")
    print(
        f"average in flight over the server's limit: {average / args.server_limit:.3f}  "
        "(target >= 0.925)"
    )
    print(f"failed subagents: {failed}  (target 0)")
    print(phases(entries, args.server_limit))
    if args.timeline:
        print(timeline(entries, args.timeline))


if __name__ == "__main__":
    main()
