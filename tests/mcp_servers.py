"""Real MCP servers for the tests, written with the official SDK.

``python tests/mcp_servers.py`` serves over stdio; :func:`http_server` serves the same tools
over streamable HTTP from a thread. ``MCP_TEST_START`` makes a stdio server misbehave as it
starts: ``hang`` (never answers), ``fail`` (says why on stderr and exits).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

#: A PNG's first bytes: enough for a content block that is not text.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def value_of(key: str, size: int = 0) -> str:
    """What ``lookup`` answers: derived from the key, so a test can check it arrived whole."""
    line = f"value of {key}: {hashlib.sha256(key.encode()).hexdigest()}"
    if size <= len(line):
        return line
    body = (line + "\n") * (size // (len(line) + 1) + 1)
    return body[:size]


def build(name: str = "demo") -> MCPServer:
    app = MCPServer(name)

    @app.tool()
    def lookup(key: str, size: int = 0) -> str:
        """Look a key up in the project's index (size: pad the answer to this many characters)."""
        return value_of(key, size)

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=True))
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @app.tool()
    def whoami() -> str:
        """Say which token this server was given."""
        return "my token is " + os.environ.get("DEMO_TOKEN", "(none)")

    @app.tool()
    def whereami() -> str:
        """Which process serves this call, and which process started it."""
        return f"served by pid {os.getpid()} for parent {os.getppid()}"

    @app.tool()
    def picture() -> Image:
        """A one-pixel picture."""
        return Image(data=PNG, format="png")

    @app.tool()
    def broken() -> str:
        """Always fails."""
        raise ToolError("the index is corrupt (token " + os.environ.get("DEMO_TOKEN", "") + ")")

    @app.tool()
    async def hang() -> str:
        """Never answers."""
        await asyncio.sleep(3600)
        return "late"

    @app.tool()
    def crash() -> str:
        """Kills this server."""
        os._exit(7)

    @app.tool(annotations=ToolAnnotations(destructiveHint=True))
    def delete_everything() -> str:
        """A tool a cautious user denies."""
        return "deleted"

    return app


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def http_server(
    name: str = "web", token: str | None = None, traceparents: list[str] | None = None
) -> Iterator[str]:
    """The same tools over streamable HTTP on a loopback port; yields the endpoint's URL.

    ``token``: requests without ``Authorization: Bearer <token>`` get a 401.
    ``traceparents``: each request's ``traceparent`` header is added to it.
    """
    import uvicorn

    app = build(name).streamable_http_app()

    async def served(scope, receive, send):  # type: ignore[no-untyped-def]
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and traceparents is not None and b"traceparent" in headers:
            traceparents.append(headers[b"traceparent"].decode())
        if (
            scope["type"] == "http"
            and token is not None
            and headers.get(b"authorization") != f"Bearer {token}".encode()
        ):
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(served, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the HTTP MCP server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(10)


if __name__ == "__main__":
    start = os.environ.get("MCP_TEST_START", "")
    if start == "hang":
        time.sleep(3600)
    if start == "fail":
        print("demo server: cannot open the index at /nonexistent", file=sys.stderr, flush=True)
        sys.exit(2)
    build(sys.argv[1] if len(sys.argv) > 1 else "demo").run()
