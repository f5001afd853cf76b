"""The filtering proxy sandboxed commands reach the network through: HTTP, CONNECT and SOCKS5.

It runs in orchmode's own process, on the running event loop: no thread, no helper process.
Each sandboxed shell makes a listening socket in its own network namespace before it starts
(see :mod:`orchmode.shell.policy`) and hands it over a socket pair; the proxy accepts on
it from here, so a command's ``curl`` connects to ``127.0.0.1:3128`` inside its sandbox and
lands in this process. The proxy then decides, resolves the name itself (the sandbox has no
DNS), checks the address, connects, and copies bytes both ways with bounded buffers.

HTTP is parsed with ``h11``, on both sides of a plain ``http://`` request (it frames bodies,
chunked or not, and refuses malformed or over-long heads with an exception rather than a
guess); one request per connection, so every request is decided on its own. A CONNECT
tunnel and a SOCKS5 stream are opaque: only the name and port they ask for are checked.

Every connection ends as one :class:`~orchmode.core.events.NetworkConnection` event. A
denied one is answered at once: HTTP 403 with a line naming the rule and the setting to
change, or SOCKS5 reply 2 (not allowed by the rules).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import h11

from ..core.background import Background
from ..core.domains import DomainRules, normalise_host, special_address
from ..core.events import Event, NetworkConnection
from ..core.permissions import Verdict
from ..core.settings import Settings
from .connections import Connection, Seat
from .processes import copy_descriptor
from .relay import (
    CHUNK,
    HEAD_LIMIT,
    answer,
    authority,
    forward,
    next_event,
    send_event,
    socks_reply,
    tunnel,
)

__all__ = ["LISTEN_PORT", "Attachment", "Proxy", "Seat", "parse_resolve"]

log = logging.getLogger("orchmode")

#: The port the proxy listens on inside every sandbox (each has a loopback of its own).
LISTEN_PORT = 3128
Decide = Callable[[str, int], Verdict]
CheckAddress = Callable[[str, str], Verdict]
Emit = Callable[[Event], None]


def parse_resolve(entries: tuple[str, ...] | list[str]) -> tuple[dict[str, str], list[str]]:
    """``network_resolve``'s ``name=address`` entries, and a problem line per bad one."""
    table: dict[str, str] = {}
    problems: list[str] = []
    for entry in entries:
        name, sep, address = entry.partition("=")
        host = normalise_host(name) if sep else None
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]")) if sep else None
        except ValueError:
            ip = None
        if host is None or ip is None:
            problems.append(
                f"orchmode: `{entry}` in network_resolve is not `name=address` — write it as "
                "mirror.example=10.0.0.5"
            )
            continue
        table[host] = str(ip)
    return table, problems


class _Refused(Exception):
    """A connection the proxy will not make: its HTTP status, SOCKS5 reply and line."""

    def __init__(self, status: int, socks: int, line: str, decision: str) -> None:
        super().__init__(line)
        self.status, self.socks, self.line, self.decision = status, socks, line, decision


def _as_listener(fd: int) -> socket.socket | None:
    """``fd`` as a socket, if it is what a listener step hands out (a TCP socket that
    listens); else it is closed, with a warning, and None."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not a socket at all
        os.close(fd)
        sock = None
    try:
        listening = (
            sock is not None
            and sock.family == socket.AF_INET
            and sock.type == socket.SOCK_STREAM
            and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        )
    except OSError:
        listening = False
    if sock is not None and listening:
        return sock
    if sock is not None:
        sock.close()
    log.warning(
        "orchmode: the shell's listener step handed out no listening socket; its "
        "commands reach no network"
    )
    return None


@dataclass(eq=False)
class Attachment:
    """One shell's listener, served by the proxy until :meth:`close`."""

    proxy: Proxy
    seat: Seat
    loop: asyncio.AbstractEventLoop
    channel: socket.socket | None = None
    server: asyncio.Server | None = None
    closed: bool = False

    def close(self) -> None:
        """Stop accepting (the shell is gone); connections under way finish by themselves."""
        self.closed = True
        if self.channel is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(self.channel.fileno())
            self.channel.close()
            self.channel = None
        if self.server is not None:
            self.server.close()
            self.server = None
        self.proxy._attachments.discard(self)


@dataclass
class Proxy:
    """The filtering proxy: ``decide`` (a name and port) and ``address`` (what it resolved
    to) say what goes through; ``resolve`` names fixed addresses, tried before the system's
    resolver; ``emit`` gets the events of shells whose :class:`Seat` names no other."""

    decide: Decide
    address: CheckAddress
    resolve: Mapping[str, str] = field(default_factory=dict)
    emit: Emit | None = None
    connect_timeout: float = 10.0
    #: How long a client has to send its request's head (or its SOCKS5 greeting).
    head_timeout: float = 30.0
    #: Whether a listener can be copied out of a sandbox (see :meth:`adopt`): false once
    #: the kernel refused, and the shells that start after use Python's listener step.
    copies_listeners: bool = True
    _attachments: set[Attachment] = field(default_factory=set, repr=False)
    _tasks: Background = field(default_factory=Background, repr=False)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings, emit: Emit | None = None) -> Proxy:
        """``network_allow``/``ask``/``deny`` decide, ``network_resolve`` names addresses;
        the problems with either are logged as warnings."""
        table, problems = parse_resolve(settings.network_resolve)
        rules = DomainRules.from_settings(settings)
        for problem in [*rules.problems(), *problems]:
            log.warning("%s", problem)
        return cls(rules.decide, rules.address, table, emit)

    # ------------------------------------------------------------------ listeners

    def adopt(self, channel: socket.socket, seat: Seat, shell_pid: int | None = None) -> Attachment:
        """Serve the listener that arrives on ``channel`` (an AF_UNIX socket whose other
        end the sandbox's start holds), for ``seat``. Called on the event loop; nothing
        waits for the listener: connections made before it is served wait in its backlog.

        Python's listener step sends the listener itself. Perl's says which of its
        descriptors holds it, and the listener is copied out of that process (found below
        ``shell_pid``); where the kernel will not, the step is told so and becomes
        Python's, which sends it on the same channel."""
        loop = asyncio.get_running_loop()
        attachment = Attachment(self, seat, loop, channel)
        self._attachments.add(attachment)
        channel.setblocking(False)

        def arrived() -> None:
            try:
                data, fds, _, _ = socket.recv_fds(channel, 16, 4)
            except BlockingIOError:
                return
            except ConnectionResetError:  # the step ended with our answer unread: its
                data, fds = b"", []  # shell was closed, as one that ended before it sent
            except OSError as exc:
                log.warning("orchmode: the proxy's listener did not arrive: %s", exc)
                data, fds = b"", []
            if data.startswith(b"L") and not fds and not attachment.closed:
                copied = self._copy_listener(shell_pid, data)
                with contextlib.suppress(OSError):  # a step gone already has no shell
                    channel.send(b"A" if copied is not None else b"N")
                if copied is None:
                    return  # Python's step sends it on this channel next
                fds = [copied]
            loop.remove_reader(channel.fileno())
            channel.close()
            attachment.channel = None
            for extra in fds[1:]:
                os.close(extra)
            listener = _as_listener(fds[0]) if fds else None
            if listener is None or attachment.closed:
                if listener is not None:
                    listener.close()
                return
            self._background(self._serve(attachment, listener))

        loop.add_reader(channel.fileno(), arrived)
        return attachment

    def _copy_listener(self, shell_pid: int | None, message: bytes) -> int | None:
        """The listener perl's step named in ``message`` ("L<fd>"), copied out of it; None
        where it cannot be (the step then becomes Python's), and where the kernel refused,
        Python's step from now on."""
        try:
            number = int(message[1:].strip())
        except ValueError:
            return None
        if shell_pid is None or number < 0:
            return None
        try:
            return copy_descriptor(shell_pid, number, "perl")
        except OSError as exc:
            if self.copies_listeners:
                self.copies_listeners = False
                log.info(
                    "orchmode: the kernel would not copy the proxy's listener out of a "
                    "sandbox (%s); shells make it with Python from now on",
                    exc,
                )
            return None

    async def _serve(self, attachment: Attachment, listener: socket.socket) -> None:
        listener.setblocking(False)
        server = await asyncio.start_server(
            lambda r, w: self._accepted(r, w, attachment.seat), sock=listener, limit=CHUNK
        )
        if attachment.closed:
            server.close()
        else:
            attachment.server = server

    async def listen(self, host: str, port: int, seat: Seat | None = None) -> asyncio.Server:
        """A listener on the host's own network: for tests and benchmarks, and for an
        unsandboxed client that should be filtered all the same."""
        chosen = seat if seat is not None else Seat()
        return await asyncio.start_server(
            lambda r, w: self._accepted(r, w, chosen), host, port, limit=CHUNK
        )

    @property
    def listeners(self) -> int:
        """How many shells' listeners it serves (or waits for) now."""
        return len(self._attachments)

    def close(self) -> None:
        """Stop every listener and cut every connection (their handlers end as their
        reads fail): the shells are closed."""
        for attachment in list(self._attachments):
            attachment.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._tasks.cancel()

    def _background(self, work: Awaitable[None]) -> None:
        self._tasks.start(work)

    # ------------------------------------------------------------------ connections

    async def _accepted(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seat: Seat
    ) -> None:
        self._writers.add(writer)
        conn = Connection(seat, asyncio.get_running_loop().time())
        try:
            async with asyncio.timeout(self.head_timeout) as head:
                first = await reader.read(1)
                if not first:
                    return
                conn.sent += 1
                if first == b"\x05":
                    await self._socks(reader, writer, conn, head)
                else:
                    await self._http(first, reader, writer, conn, head)
        except TimeoutError:
            await answer(writer, conn, 400, "the request did not arrive in time")
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        except Exception:  # never one connection's bug takes the proxy down
            log.exception("orchmode: the proxy's connection failed")
        finally:
            self._writers.discard(writer)
            writer.close()
            self._record(conn)

    def _record(self, conn: Connection) -> None:
        if not conn.host:
            return  # no destination was named: nothing reached, nothing to say
        event = NetworkConnection(
            agent=conn.seat.agent,
            domain=conn.host,
            port=conn.port,
            decision=conn.decision,
            rule=conn.rule,
            bytes_sent=conn.sent,
            bytes_received=conn.received,
            duration=round(asyncio.get_running_loop().time() - conn.started, 6),
        )
        emit = conn.seat.emit or self.emit
        if emit is None:
            log.debug("%s", event)
            return
        try:
            emit(event)
        except Exception:
            log.exception("orchmode: a network event could not be recorded")

    async def _reach(
        self, host: str, port: int, conn: Connection
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Decide, ask, resolve, check the address and connect; :class:`_Refused` if not."""
        name = normalise_host(host)
        conn.host, conn.port = (name or host[:255]), port
        if name is None or not 0 < port < 65536:
            raise _Refused(400, 1, f"`{host}:{port}` is no name and port", "denied")
        verdict = self.decide(name, port)
        conn.rule = _rule(verdict)
        decision = "allowed"
        if verdict.decision == "ask":
            if not await self._asked(name, port, verdict, conn.seat):
                raise _Refused(403, 2, _not_approved(name, verdict, conn.seat), "denied")
            decision = "approved"
        elif verdict.decision != "allow":
            raise _Refused(403, 2, _not_allowed(name, verdict), "denied")
        addresses = await self._resolved(name, port)
        allowed: list[str] = []
        for address in addresses:
            check = self.address(name, address)
            if check.decision == "allow":
                allowed.append(address)
            elif check.rule:
                conn.rule = _rule(check)
        if not allowed:
            raise _Refused(403, 2, _address_refused(name, addresses[0], conn.rule), "denied")
        conn.decision = "failed"
        problem: OSError | TimeoutError | None = None
        for address in allowed:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    upstream = await asyncio.open_connection(address, port, limit=CHUNK)
            except (OSError, TimeoutError) as exc:
                problem = exc
                continue
            conn.decision = decision
            return upstream
        why = "timed out" if isinstance(problem, TimeoutError) else _reason(problem)
        raise _Refused(
            502, 5, f"orchmode: {name}:{port} could not be reached ({why}) — is it up?", "failed"
        )

    async def _asked(self, host: str, port: int, verdict: Verdict, seat: Seat) -> bool:
        if seat.ask is None:
            return False
        try:
            return bool(await seat.ask(host, port, verdict))
        except Exception:
            log.exception("orchmode: asking about %s failed", host)
            return False

    async def _resolved(self, host: str, port: int) -> list[str]:
        if _is_address(host):
            return [host]
        fixed = self.resolve.get(host)
        if fixed is not None:
            return [fixed]
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else _reason(exc)
            raise _Refused(
                502,
                4,
                f"orchmode: {host} does not resolve ({why}) — check the name, or give its "
                "address in network_resolve",
                "failed",
            ) from None
        found: list[str] = []
        for info in infos:
            address = str(info[4][0])
            if address not in found:
                found.append(address)
        if not found:
            raise _Refused(502, 4, f"orchmode: {host} does not resolve — check the name", "failed")
        return found

    # ------------------------------------------------------------------ HTTP

    async def _http(
        self,
        first: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: Connection,
        head: asyncio.Timeout,
    ) -> None:
        client = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        client.receive_data(first)
        try:
            request = await next_event(client, reader, conn, sent=True)
        except h11.RemoteProtocolError as exc:
            await answer(writer, conn, 400, f"the request could not be read ({exc})")
            return
        if not isinstance(request, h11.Request):
            return  # the client closed before a whole head
        target = request.target.decode("latin-1")
        try:
            if request.method == b"CONNECT":
                host, port = authority(target, None)
            else:
                parts = urlsplit(target)
                if parts.scheme.lower() != "http" or not parts.hostname:
                    await answer(
                        writer,
                        conn,
                        400,
                        "orchmode's proxy takes http:// URLs, and https:// through CONNECT — "
                        "set HTTP_PROXY and HTTPS_PROXY rather than calling it directly",
                    )
                    return
                host, port = parts.hostname, parts.port or 80
        except ValueError:
            await answer(writer, conn, 400, f"`{target[:200]}` is no address to reach")
            return
        head.reschedule(None)  # a wait for an approval is not the client's slowness
        try:
            up_reader, up_writer = await self._reach(host, port, conn)
        except _Refused as refused:
            conn.decision = refused.decision
            await answer(writer, conn, refused.status, refused.line)
            return
        self._writers.add(up_writer)
        try:
            if request.method == b"CONNECT":
                send_event(writer, conn, client, h11.Response(status_code=200, headers=[]))
                early, _ = client.trailing_data
                if early:
                    up_writer.write(early)
                await tunnel(reader, writer, up_reader, up_writer, conn)
            else:
                await forward(request, client, reader, writer, up_reader, up_writer, conn)
        finally:
            self._writers.discard(up_writer)
            up_writer.transport.abort()

    # ------------------------------------------------------------------ SOCKS5

    async def _socks(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: Connection,
        head: asyncio.Timeout,
    ) -> None:
        count = (await reader.readexactly(1))[0]
        methods = await reader.readexactly(count)
        conn.sent += 1 + count
        if 0 not in methods:
            writer.write(b"\x05\xff")  # only "no authentication" is offered
            await writer.drain()
            return
        writer.write(b"\x05\x00")
        version, command, _, kind = await reader.readexactly(4)
        conn.sent += 4
        if kind == 1:
            raw = await reader.readexactly(4)
            host = str(ipaddress.IPv4Address(raw))
        elif kind == 4:
            raw = await reader.readexactly(16)
            host = str(ipaddress.IPv6Address(raw))
        elif kind == 3:
            length = (await reader.readexactly(1))[0]
            raw = await reader.readexactly(length)
            host = raw.decode("ascii", "replace")
            conn.sent += 1
        else:
            await socks_reply(writer, conn, 8)
            return
        port = int.from_bytes(await reader.readexactly(2), "big")
        conn.sent += len(raw) + 2
        if version != 5 or command != 1:  # CONNECT only: no BIND, no UDP
            conn.host, conn.port, conn.decision = host, port, "denied"
            await socks_reply(writer, conn, 7)
            return
        head.reschedule(None)
        try:
            up_reader, up_writer = await self._reach(host, port, conn)
        except _Refused as refused:
            conn.decision = refused.decision
            log.info("%s", refused.line)
            await socks_reply(writer, conn, refused.socks)
            return
        self._writers.add(up_writer)
        try:
            await socks_reply(writer, conn, 0)
            await tunnel(reader, writer, up_reader, up_writer, conn)
        finally:
            self._writers.discard(up_writer)
            up_writer.transport.abort()


# ---------------------------------------------------------------------- helpers


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "no address"
    strerror = getattr(exc, "strerror", None)
    if isinstance(exc, socket.gaierror) or not strerror:
        return str(exc.args[-1] if exc.args else exc).lower()
    return str(strerror).lower()


def _rule(verdict: Verdict) -> str:
    return f"{verdict.rule} ({verdict.source})" if verdict.rule else ""


def _not_allowed(host: str, verdict: Verdict) -> str:
    if verdict.rule:
        fix = f"change {verdict.source}"
    elif _is_address(host):
        fix = "an address is reached only when named: add it to network_allow"
    else:
        fix = "add it to network_allow"
    return f"orchmode: {host} is not allowed here ({verdict.why()}) — {fix}"


def _not_approved(host: str, verdict: Verdict, seat: Seat) -> str:
    if seat.ask is None:
        return (
            f"orchmode: {host} needs approval ({verdict.why()}) and nobody is there to "
            "approve it — add it to network_allow"
        )
    return f"orchmode: {host} was not approved ({verdict.why()}) — add it to network_allow"


def _address_refused(host: str, address: str, rule: str) -> str:
    kind = special_address(address)
    if rule and kind is None:
        return f"orchmode: {host} resolves to {address}, refused by {rule} — change that rule"
    return (
        f"orchmode: {host} resolves to {address}, a {kind or 'refused'} address, reached only "
        f"when the name or the address is named exactly — add {host} to network_allow"
    )
