"""``python -m orchmode.testing``: run the scripted API server in the foreground.

Lets a subprocess (``orchmode`` itself, a benchmark, a person with curl) talk to a
scripted model. Prints ``listening on http://HOST:PORT`` once bound, then serves until
SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import inspect
import signal
import sys
from collections.abc import Sequence
from typing import cast

from .faults import FaultSchedule
from .replies import Answer, Reply, Responder, ScriptedRequest
from .server import ScriptedServer

DEFAULT_RESPONDER = "orchmode.testing.scenario:demo_responder"


def fallback_responder(request: ScriptedRequest) -> Reply:
    """Used when the scenario module is absent: a short answer to anything."""
    return Reply.text(f"Scripted reply #{request.index}.")


def load_responder(spec: str, *, optional: bool = False) -> Responder:
    """Import ``module:attr``; with ``optional``, a missing module means the fallback."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--responder must look like module:attr, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if optional and (module_name == missing or module_name.startswith(missing + ".")):
            return fallback_responder
        raise
    responder = getattr(module, attr, None)
    if responder is None:
        if optional:
            return fallback_responder
        raise SystemExit(f"{module_name} has no attribute {attr!r}")
    if not callable(responder):
        raise SystemExit(f"{spec} is not callable")
    return cast(Responder, responder)


def with_latency(responder: Responder, latency: float) -> Responder:
    """Add ``latency`` seconds to every reply or fault, on top of its own delay."""

    async def delayed(request: ScriptedRequest) -> Answer:
        answer = responder(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return dataclasses.replace(answer, delay=answer.delay + latency)

    return delayed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m orchmode.testing", description="Scripted Anthropic Messages API server."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument(
        "--api-key", default="test-key", help="key clients must send; '' accepts any key"
    )
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to each reply")
    parser.add_argument(
        "--max-in-flight", type=int, default=None, help="simulated concurrency limit (429 above)"
    )
    parser.add_argument(
        "--fault-rate",
        type=float,
        default=0.0,
        help="share of requests failed once each, in every way the API fails (0 to 1)",
    )
    parser.add_argument("--fault-seed", default="", help="picks which requests fail")
    parser.add_argument(
        "--responder", default=None, help=f"module:attr (default {DEFAULT_RESPONDER})"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGINT/SIGTERM."""
    if args.responder is None:
        responder = load_responder(DEFAULT_RESPONDER, optional=True)
    else:
        responder = load_responder(args.responder)
    if args.fault_rate > 0:
        responder = FaultSchedule(responder, rate=args.fault_rate, seed=args.fault_seed)
    if args.latency > 0:
        responder = with_latency(responder, args.latency)
    server = ScriptedServer(
        responder,
        api_key=args.api_key or None,
        max_in_flight=args.max_in_flight,
        host=args.host,
        port=args.port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(f"listening on {server.url}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
