"""Bytes between a sandboxed client and the server it reached: tunnels, forwarded requests.

Every copy is bounded: a chunk at a time, waiting for the writer to drain. HTTP is framed by
``h11`` on both sides; a CONNECT tunnel or a SOCKS5 stream is copied as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import h11

from .connections import Connection

#: How much of a relay is read at once; with the writer's drain, what a connection holds.
CHUNK = 64 * 1024
#: The longest request or response head accepted.
HEAD_LIMIT = 64 * 1024

# Hop-by-hop headers: they concern the proxy's own connections, never the next one.
_HOP = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)


def authority(text: str, default: int | None) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) as a CONNECT target names it."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":")
        if not host:
            host, port_text = port_text, ""
    if not port_text:
        if default is None:
            raise ValueError(text)
        return host, default
    return host, int(port_text)


async def next_event(
    conn: h11.Connection, reader: asyncio.StreamReader, record: Connection, *, sent: bool
) -> Any:
    """The next h11 event, reading more from ``reader`` while it needs data."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await reader.read(CHUNK)
        if sent:
            record.sent += len(data)
        conn.receive_data(data)


async def answer(writer: asyncio.StreamWriter, conn: Connection, status: int, line: str) -> None:
    """A one-line plain-text answer, and the connection closed.

    The line is the reason phrase too (in ASCII): a client that answers a refused CONNECT
    shows the status line only (pip: ``Tunnel connection failed: 403 orchmode: …``)."""
    if not line.startswith("orchmode:"):
        line = f"orchmode: {line}"
    body = (line + "\n").encode("utf-8", "replace")
    reason = line.replace("—", "-").encode("ascii", "replace").decode("ascii")
    reason = "".join(c if c.isprintable() else "?" for c in reason)
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(head + body)
        conn.received += len(head) + len(body)
        await writer.drain()


async def socks_reply(writer: asyncio.StreamWriter, conn: Connection, code: int) -> None:
    reply = bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0])
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(reply)
        conn.received += len(reply)
        await writer.drain()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    count: Callable[[int], None],
) -> None:
    """Copy until EOF, a chunk at a time, waiting for the writer to drain (the bound)."""
    while data := await reader.read(CHUNK):
        writer.write(data)
        count(len(data))
        await writer.drain()
    if writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


async def tunnel(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    conn: Connection,
) -> None:
    """Both directions of a tunnel, until both have ended (or one has failed)."""

    def sent(n: int) -> None:
        conn.sent += n

    def received(n: int) -> None:
        conn.received += n

    up = asyncio.ensure_future(_pump(reader, up_writer, sent))
    down = asyncio.ensure_future(_pump(up_reader, writer, received))
    try:
        done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)


async def forward(
    request: h11.Request,
    client: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    conn: Connection,
) -> None:
    """One plain HTTP request to its server, in origin form, and its response back; both
    bodies streamed through h11, which frames them. Then both connections close."""
    parts = urlsplit(request.target.decode("latin-1"))
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = [(n, v) for n, v in request.headers if n.lower() not in _HOP]
    if not any(n.lower() == b"host" for n, _ in headers):
        headers.insert(0, (b"host", parts.netloc.encode("latin-1")))
    headers.append((b"connection", b"close"))
    server = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)
    up_writer.write(
        server.send(h11.Request(method=request.method, target=path.encode(), headers=headers))
    )
    sending = asyncio.ensure_future(_upload(client, reader, server, up_writer, conn))
    try:
        await _download(server, up_reader, client, writer, conn)
    finally:
        sending.cancel()
        with contextlib.suppress(BaseException):
            await sending


async def _upload(
    client: h11.Connection,
    reader: asyncio.StreamReader,
    server: h11.Connection,
    up_writer: asyncio.StreamWriter,
    conn: Connection,
) -> None:
    """The client's request body on to the server, as h11 frames it for each side."""
    while True:
        event = await next_event(client, reader, conn, sent=True)
        if isinstance(event, h11.Data):
            up_writer.write(server.send(h11.Data(data=event.data)))
            await up_writer.drain()
        elif isinstance(event, h11.EndOfMessage):
            up_writer.write(server.send(h11.EndOfMessage()))
            await up_writer.drain()
            return
        else:
            return  # the client went away mid-body: the server's response is moot


async def _download(
    server: h11.Connection,
    up_reader: asyncio.StreamReader,
    client: h11.Connection,
    writer: asyncio.StreamWriter,
    conn: Connection,
) -> None:
    """The server's response back to the client, hop-by-hop headers left out."""
    while True:
        try:
            event = await next_event(server, up_reader, conn, sent=False)
        except h11.RemoteProtocolError as exc:
            if client.our_state is h11.SEND_RESPONSE:
                await answer(writer, conn, 502, f"the server's answer was unreadable ({exc})")
            return
        if isinstance(event, h11.InformationalResponse):
            if event.status_code != 101:
                send_event(writer, conn, client, event)
        elif isinstance(event, h11.Response):
            kept = [(n, v) for n, v in event.headers if n.lower() not in _HOP]
            kept.append((b"connection", b"close"))
            send_event(
                writer,
                conn,
                client,
                h11.Response(status_code=event.status_code, headers=kept, reason=event.reason),
            )
        elif isinstance(event, h11.Data):
            send_event(writer, conn, client, h11.Data(data=event.data))
            await writer.drain()
        elif isinstance(event, h11.EndOfMessage):
            send_event(writer, conn, client, h11.EndOfMessage())
            await writer.drain()
            return
        else:  # closed before the response ended: the client sees it cut short
            return


def send_event(
    writer: asyncio.StreamWriter, conn: Connection, client: h11.Connection, event: Any
) -> None:
    data = client.send(event)
    if data:
        writer.write(data)
        conn.received += len(data)
