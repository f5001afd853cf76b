"""The web console at scale: a 1,000-agent run's page first paint, and the live stream at
200 events a second.

A real run of 500 subtasks (500 workers and their 500 verifiers) against the scripted
server is recorded first; `orchmode serve` then serves its store, and Chromium (Playwright)
loads the run's page: the figure is its first contentful paint (target ≤ 2 s). Then events
are written to the store of another session at a steady rate, as a run in another process
would write them: the lag from each write to the SSE client that hears of it (median, 95th
percentile, worst; target ≤ 1 s), and from the last write to the browser's page holding it.

    .venv/bin/python bench/console.py                    # 1,000 agents, 200 events/s for 5 s
    .venv/bin/python bench/console.py --agents 200 --rate 200 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
from playwright.async_api import Page, async_playwright

from orchmode.store import EventRow, open_store
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario

API_KEY = "bench-key"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update",
]  # fmt: skip


def record_run(workdir: Path, agents: int, env: dict[str, str]) -> str:
    """A real run of ``agents`` agents (half workers, half verifiers); its session id."""
    subtasks = agents // 2
    scenario = OrchestrationScenario(
        subtasks=subtasks, scout_command=None, worker_command=None, verifier_command=None
    )
    server = ScriptedServer(scenario, api_key=API_KEY)
    server.start_in_thread()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "orchmode", "run", f"review {subtasks} items",
             "--base-url", server.url, "--sandbox", "off", "--max-concurrent", "50",
             "--max-subtasks", str(subtasks), "--max-subagents", str(agents + 10)],
            cwd=workdir, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        server.stop_thread()
    found = re.search(r"recorded as (\S+);", done.stderr)
    if done.returncode != 0 or not found:
        raise SystemExit(f"the run failed: {done.stderr[-2000:]}")
    return found[1]


def start_console(workdir: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", "serve", "--port", "0"],
        cwd=workdir, env=env, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stdout is not None
    return process, process.stdout.readline().strip()


async def first_paint(page: Page, url: str) -> tuple[float, int]:
    """Seconds from navigation to the first contentful paint, and the agents shown."""
    await page.goto(url)
    await page.wait_for_selector("body[data-ready=yes]")
    paint = await page.evaluate(
        "() => performance.getEntriesByName('first-contentful-paint')[0].startTime"
    )
    return paint / 1000, await page.locator("#agents details.agent").count()


async def stream_lag(
    page: Page, base: str, store_url: str, rate: float, seconds: float
) -> tuple[list[float], float]:
    """Write events at ``rate`` a second; each write's lag to the SSE client, and the lag
    from the last write to the page holding it."""
    session, count = "bench-stream", int(rate * seconds)
    store = await open_store(store_url)
    written: dict[int, float] = {}
    heard: dict[int, float] = {}
    await store.append_events(session, [EventRow(1, time.time(), "bench", "{}")])
    written[1] = time.monotonic()
    await page.goto(f"{base}/runs/{session}")
    await page.wait_for_selector("body[data-live=yes]")

    async def listen(client: httpx2.AsyncClient) -> None:
        told = 2
        async with client.stream("GET", f"/runs/{session}/events", params={"since": 2}) as got:
            async for line in got.aiter_lines():
                if line.startswith("data: "):
                    now, upto = time.monotonic(), int(line[6:])
                    for seq in range(told, upto):
                        heard[seq] = now
                    told = upto
                    if told > count:
                        return

    async with httpx2.AsyncClient(base_url=base, timeout=60, cookies=await _cookies(page)) as c:
        listening = asyncio.create_task(listen(c))
        start = time.monotonic()
        for seq in range(2, count + 1):
            await asyncio.sleep(max(0.0, start + (seq - 2) / rate - time.monotonic()))
            await store.append_events(session, [EventRow(seq, time.time(), "bench", "{}")])
            written[seq] = time.monotonic()
        await asyncio.wait_for(listening, 30)
        await page.wait_for_function(
            "n => Number(document.getElementById('run-body').dataset.seq) > n", arg=count
        )
        page_lag = time.monotonic() - written[count]
    await store.close()
    return [heard[seq] - written[seq] for seq in range(2, count + 1)], page_lag


async def _cookies(page: Page) -> dict[str, str]:
    return {c["name"]: c["value"] for c in await page.context.cookies()}


async def measure(args: argparse.Namespace) -> None:
    from orchmode.core.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        env = {
            "PATH": "/usr/bin:/bin", "HOME": tmp, "ANTHROPIC_API_KEY": API_KEY,
            "XDG_CONFIG_HOME": str(workdir / "config"),
        }  # fmt: skip
        began = time.monotonic()
        session = record_run(workdir, args.agents, env)
        print(f"recorded a run of {args.agents} agents in {time.monotonic() - began:.1f} s")
        console, url = start_console(workdir, env)
        base = url.split("/?", 1)[0]
        try:
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
                )
                page = await browser.new_page()
                await page.goto(url)
                paint, shown = await first_paint(page, f"{base}/runs/{session}")
                print(
                    f"  first paint of the run's page: {paint:.3f} s for {shown} agents "
                    f"(target <= 2 s): ratio {paint / 2:.3f}"
                )
                store_url = Settings().store_url(workdir)
                lags, page_lag = await stream_lag(page, base, store_url, args.rate, args.seconds)
                await browser.close()
        finally:
            console.terminate()
            console.wait()
    lags.sort()
    p95 = lags[int(0.95 * (len(lags) - 1))]
    print(
        f"  live stream, {args.rate:g} events/s for {args.seconds:g} s ({len(lags)} events): "
        f"write to SSE client median {statistics.median(lags) * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms, worst {lags[-1] * 1000:.0f} ms (target <= 1 s): "
        f"ratio {lags[-1]:.3f}"
    )
    print(f"  last write to the browser's page holding it: {page_lag * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="events a second")
    parser.add_argument("--seconds", type=float, default=5.0)
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
