"""What orchmode's MCP layer costs per tool call, against the SDK's bare client session.

Agents call MCP tools in parallel through one shared session per server, so the layer's
own cost — checking the call, masking secrets in the result, cutting it to
``output_limit``, two events per call — is paid on every call, on the event loop that also
drives the model requests. This benchmark starts the test suite's stdio server
(``tests/mcp_servers.py``, the official SDK's ``MCPServer``) twice and makes the same
calls on each:

- ``bare``: ``ClientSession.call_tool`` straight on the SDK's session — the ideal;
- ``hub``: :meth:`orchmode.tools.mcptools.McpHub.call` with tool_use blocks, as the agents do,
  with a subscriber on its events and a secret to mask in every result.

Both make 40 calls untimed first, then N calls (default 2,000) from C concurrent callers
(default 20), each returning a result of S characters (default 4,000, a report-sized
answer). Each side runs ``--rounds`` times (default 5), alternately, and the best of each
is printed: calls per second for each, the hub's time over the bare session's (target
<= 1.15), and the server's start-up time (a Python server: its imports dominate).

    .venv/bin/python bench/mcp_calls.py [--calls 2000] [--concurrency 20] [--size 4000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from orchmode.core.events import Event, EventBus
from orchmode.tools.mcpconfig import parse
from orchmode.tools.mcptools import McpHub

SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers.py"
SECRET = "bench-secret-0123456789"
#: Calls made and not timed first, on each side: a server's first calls are slower.
WARM_UP = 40


async def _in_parallel(calls: int, concurrency: int, one: Any) -> float:
    """Seconds for ``calls`` awaits of ``one(i)``, ``concurrency`` at a time."""
    queue = iter(range(calls))

    async def caller() -> None:
        for i in queue:
            await one(i)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - started


async def bare(calls: int, concurrency: int, size: int) -> float:
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(SERVER), "bare"])
    with open(os.devnull, "w") as quiet:  # the server logs every call on stderr
        return await _bare_calls(params, quiet, calls, concurrency, size)


async def _bare_calls(params: Any, quiet: Any, calls: int, concurrency: int, size: int) -> float:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import stdio_client

    async with (
        stdio_client(params, errlog=quiet) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        await session.list_tools()

        async def one(i: int) -> None:
            result = await session.call_tool("lookup", {"key": f"k{i}", "size": size})
            assert not result.is_error

        await _in_parallel(WARM_UP, concurrency, one)
        return await _in_parallel(calls, concurrency, one)


async def hub(calls: int, concurrency: int, size: int) -> tuple[float, float]:
    config = parse(
        json.dumps(
            {
                "mcpServers": {
                    "demo": {
                        "command": sys.executable,
                        "args": [str(SERVER), "demo"],
                        "env": {"DEMO_TOKEN": SECRET},
                    }
                }
            }
        ),
        {},
        "bench",
    )
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    mcp = McpHub(config, Path.cwd(), events, timeout=60, output_limit=size + 100)
    started = time.perf_counter()
    await mcp.tools_for("worker")
    startup = time.perf_counter() - started

    async def one(i: int) -> None:
        block = {
            "id": f"t{i}",
            "name": "mcp__demo__lookup",
            "input": {"key": f"k{i}", "size": size},
        }
        result = await mcp.call(block, agent=f"worker 1.{i}", role="worker")
        assert not result.get("is_error"), result

    try:
        await _in_parallel(WARM_UP, concurrency, one)
        took = await _in_parallel(calls, concurrency, one)
    finally:
        await mcp.close()
    assert len(seen) == 2 * (WARM_UP + calls)
    return took, startup


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--size", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ideals: list[float] = []
    ours: list[float] = []
    startups: list[float] = []
    for _ in range(args.rounds):  # alternated, so a busy moment of the machine hits both
        ideals.append(await bare(args.calls, args.concurrency, args.size))
        took, startup = await hub(args.calls, args.concurrency, args.size)
        ours.append(took)
        startups.append(startup)
    ideal, mine = min(ideals), min(ours)
    print(
        f"{args.calls} calls, {args.concurrency} at once, {args.size:,}-character results, "
        f"best of {args.rounds} rounds"
    )
    print(f"  bare SDK session : {ideal:6.2f} s  ({args.calls / ideal:7.1f} calls/s)")
    print(f"  orchmode hub     : {mine:6.2f} s  ({args.calls / mine:7.1f} calls/s)")
    print(f"  hub / bare       : {mine / ideal:6.3f}  (target <= 1.15)")
    print(f"  server start-up  : {min(startups):6.2f} s  (initialize and list tools)")


if __name__ == "__main__":
    asyncio.run(main())
