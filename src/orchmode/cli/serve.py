"""``orchmode serve``: the web console on this machine, reached by the URL it prints."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import socket
import sys

from ..core.errors import OrchmodeError
from .common import say, settings_of, workdir_of

LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..console.app import Console, create_app
    except ImportError as exc:
        raise OrchmodeError(
            f"the web console needs the web extra ({exc.name} is missing): "
            "pip install 'orchmode[web]'"
        ) from None

    settings = settings_of(args)
    console = Console(settings, workdir_of(settings))
    if not is_loopback(args.host):
        say(
            f"orchmode: serving on {args.host}, reachable from other machines: only the "
            "token keeps them out, and it travels unencrypted",
            sys.stderr,
        )
    listener = _listen(args.host, args.port)
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(
        create_app(console), log_level="warning", access_log=False, lifespan="on",
        timeout_graceful_shutdown=1,
    )  # fmt: skip
    server = uvicorn.Server(config)
    # Ctrl-C asks the server to stop, even before it is up (it takes the signal over while
    # it runs); never a KeyboardInterrupt in the middle of starting. Its runs go on.
    signal.signal(signal.SIGINT, lambda *_: setattr(server, "should_exit", True))
    print(console.access.url(f"http://{shown}:{port}"), flush=True)
    asyncio.run(server.serve(sockets=[listener]))
    return 0


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port, whose number is read back)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise OrchmodeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    listener.listen(128)
    listener.set_inheritable(False)
    return listener
