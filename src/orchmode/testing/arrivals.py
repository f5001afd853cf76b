"""What the scripted server reads of a request as it arrives: body, headers, front door.

Reading never refuses: a body too large or not JSON is noted here and refused later, after
the request is logged and authenticated, in the order the real API checks them.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .providers import Route, route_of
from .replies import LoggedRequest

_REDACTED_HEADERS = frozenset(
    {"x-api-key", "authorization", "proxy-authorization", "x-amz-security-token"}
)


@dataclass(frozen=True)
class Arrival:
    """A request as read: its log entry (headers redacted) and what the checks need."""

    entry: LoggedRequest
    #: The headers as received, names lower-cased (for authentication).
    received: dict[str, str]
    #: The body's bytes; None when it was larger than the server takes.
    raw: bytes | None
    body: Any
    parse_error: str | None
    route: Route | None
    betas: set[str]


async def read_arrival(request: web.Request) -> Arrival:
    received = {k.lower(): v for k, v in request.headers.items()}
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raw = None
    body: Any = None
    parse_error: str | None = None
    try:
        body = json.loads(raw) if raw else None
    except ValueError as exc:
        parse_error = f"There was an error parsing the body of your request: {exc}"
    route = route_of(request.method, request.raw_path)
    entry = LoggedRequest(
        index=-1,
        method=request.method,
        path=request.path,
        body=body if isinstance(body, dict) else {},
        headers={k: ("***" if k in _REDACTED_HEADERS else v) for k, v in received.items()},
        started=time.monotonic(),
        tcp_nodelay=_nodelay(request),
        provider=route.provider if route is not None else "anthropic",
    )
    return Arrival(entry, received, raw, body, parse_error, route, _betas(request))


def _betas(request: web.Request) -> set[str]:
    """The ``anthropic-beta`` names, comma-separated and possibly over several headers."""
    values = request.headers.getall("anthropic-beta", [])
    return {name.strip() for value in values for name in value.split(",") if name.strip()}


def _nodelay(request: web.Request) -> bool | None:
    """Set TCP_NODELAY on the connection and read it back; None if it is not TCP.

    Real API front ends disable Nagle; with it on, a small response can wait ~40 ms for
    the client's delayed ACK, a stall that would hide (or fake) harness costs. asyncio
    and aiohttp set it too, but a benchmark must not depend on that staying true.
    """
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    except OSError:  # the client is already gone
        return None
