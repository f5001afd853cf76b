"""What the filtering proxy costs: a request's latency, 100 downloads' throughput, a shell's start.

The proxy runs in this process, on its event loop, as in orchmode; the origin server (aiohttp)
and the clients run in processes of their own, as a sandbox's commands do. Each figure is
taken direct and through the proxy in the same run, the two interleaved:

1. **Latency**: one small GET on a new connection (the proxy makes one request per
   connection), a blocking client in its own process; median and p90 both ways, the
   median's extra and the ratio. Target: <= 2 ms median extra.
2. **Throughput**: 100 ``curl`` processes at once, each downloading ``--size`` MB; the wall
   time until all are done, direct and through the proxy, and the ratio.
3. **A sandboxed shell's start-up** until its first command answers, and the whole
   machine's CPU for each shell (from /proc/stat, the kernel's own threads included, from
   its start to its close): without the listener step (the same sandbox, no proxy), with
   perl's step (the socket made inside, copied out with pidfd_getfd) and with Python's
   (``python3 -I -S``, the socket sent out over the socket pair), interleaved.

    .venv/bin/python bench/proxy.py [--requests 400] [--size 1] [--shells 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchmode.core.domains import DomainRules, Pattern
from orchmode.core.settings import Settings
from orchmode.shell.bash import BashSession
from orchmode.shell.proxy import Proxy
from orchmode.shell.sandbox import Sandbox
from support.machine import machine_cpu

NAME = "origin.bench"


def serve(size_mb: int) -> None:
    """The origin (run in a process of its own): ``/`` a few bytes, ``/big`` ``size_mb`` MB."""
    from aiohttp import web

    body = os.urandom(1024 * 1024) * size_mb

    async def small(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=body)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/", small)
        app.router.add_get("/big", big)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def client(origin: int, proxy: int, requests: int) -> None:
    """Small GETs, direct and through the proxy by turns (run in a process of its own);
    prints the two lists of seconds as JSON."""
    direct_request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    proxied_request = (
        f"GET http://{NAME}:{origin}/ HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n"
    ).encode()

    def once(port: int, request: bytes) -> float:
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            answer = b""
            while data := sock.recv(65536):
                answer += data
        elapsed = time.perf_counter() - started
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok"), answer[:200]
        return elapsed

    direct: list[float] = []
    proxied: list[float] = []
    for _ in range(20):  # warm both paths
        once(origin, direct_request)
        once(proxy, proxied_request)
    for _ in range(requests):
        direct.append(once(origin, direct_request))
        proxied.append(once(proxy, proxied_request))
    print(json.dumps({"direct": direct, "proxied": proxied}))


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.2f} ms"


async def downloads(origin: int, proxy: int | None, count: int) -> float:
    """``count`` curl processes at once fetching /big; seconds until all are done."""
    url = f"http://{NAME if proxy else '127.0.0.1'}:{origin}/big"
    via = ["-x", f"http://127.0.0.1:{proxy}"] if proxy else ["--noproxy", "*"]
    started = time.perf_counter()
    procs = [
        await asyncio.create_subprocess_exec(
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            *via,
            url,
            stdout=subprocess.PIPE,
        )
        for _ in range(count)
    ]
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    elapsed = time.perf_counter() - started
    sizes = {int(out) for out, _ in outs}
    assert len(sizes) == 1 and sizes.pop() > 0, sizes
    return elapsed


async def shell_start(
    sandbox: Sandbox, work: Path, python_step: bool = False
) -> tuple[float, float]:
    """One shell's start-up until ``true`` answers, and the machine's CPU seconds from its
    start to its close; ``python_step``: the listener made by Python's step."""
    if sandbox.proxy is not None:
        sandbox.proxy.copies_listeners = not python_step
    cpu, started = machine_cpu(), time.perf_counter()
    shell = BashSession(work, sandbox=sandbox.for_shell())
    result = await shell.run("true")
    elapsed = time.perf_counter() - started
    assert not result.is_error, result.output
    await shell.close()
    return elapsed, machine_cpu() - cpu


async def main(args: argparse.Namespace) -> None:
    origin_proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", str(args.size), stdout=subprocess.PIPE
    )
    assert origin_proc.stdout is not None
    origin = int(await origin_proc.stdout.readline())
    rules = DomainRules([Pattern(NAME, "bench")], [], [])
    proxy = Proxy(rules.decide, rules.address, {NAME: "127.0.0.1"})
    server = await proxy.listen("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        print(f"1. latency of a small GET on a new connection ({args.requests} each way)")
        client_proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            str(origin),
            str(port),
            str(args.requests),
            stdout=subprocess.PIPE,
        )
        out, _ = await client_proc.communicate()
        times = json.loads(out)
        direct, proxied = times["direct"], times["proxied"]
        md, mp = statistics.median(direct), statistics.median(proxied)
        print(f"   direct   median {ms(md)}   p90 {ms(p90(direct))}")
        print(f"   proxied  median {ms(mp)}   p90 {ms(p90(proxied))}")
        print(f"   extra    median {ms(mp - md)}   ratio {mp / md:.2f}x   (target <= 2 ms)")

        print(f"2. {args.downloads} concurrent downloads of {args.size} MB (curl processes)")
        rounds: dict[str, list[float]] = {"direct": [], "proxied": []}
        for _ in range(args.rounds):
            rounds["direct"].append(await downloads(origin, None, args.downloads))
            rounds["proxied"].append(await downloads(origin, port, args.downloads))
        total = args.downloads * args.size
        for way, values in rounds.items():
            best = statistics.median(values)
            print(f"   {way:8} {best:6.3f} s  {total / best:8.1f} MB/s")
        ratio = statistics.median(rounds["proxied"]) / statistics.median(rounds["direct"])
        print(f"   ratio    {ratio:.2f}x")
    finally:
        server.close()
        proxy.close()
        origin_proc.kill()
        await origin_proc.wait()

    print(f"3. a sandboxed shell's start-up until its first command ({args.shells} each)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with_proxy = Sandbox.from_settings(Settings(), work)
        assert with_proxy is not None and with_proxy.proxy is not None
        without = Sandbox(with_proxy.policy, None)
        ways = {"without the listener step": (without, False), "perl's step": (with_proxy, False)}
        ways["Python's step"] = (with_proxy, True)
        starts: dict[str, list[float]] = {way: [] for way in ways}
        cpus: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(3):
            for sandbox, python_step in ways.values():
                await shell_start(sandbox, work, python_step)
        order = list(ways)
        for round_ in range(args.shells):
            # each way first in turn: what one shell's teardown leaves the next is shared
            for way in order[round_ % 3 :] + order[: round_ % 3]:
                sandbox, python_step = ways[way]
                elapsed, cpu = await shell_start(sandbox, work, python_step)
                starts[way].append(elapsed)
                cpus[way].append(cpu)
        with_proxy.proxy.close()
    bare = statistics.median(starts["without the listener step"])
    bare_cpu = statistics.mean(cpus["without the listener step"])
    for way in ways:
        median, cpu = statistics.median(starts[way]), statistics.mean(cpus[way])
        print(
            f"   {way:26} median {ms(median)}   p90 {ms(p90(starts[way]))}   extra "
            f"{ms(median - bare)}   machine CPU {ms(cpu)} a shell (extra {ms(cpu - bare_cpu)})"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--requests", type=int, default=400)
        parser.add_argument("--downloads", type=int, default=100)
        parser.add_argument("--size", type=int, default=1, help="MB per download")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--shells", type=int, default=30)
        asyncio.run(main(parser.parse_args()))
