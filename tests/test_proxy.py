"""The filtering proxy itself, on a host port: real origin servers (aiohttp), real clients
(aiohttp's, curl, raw sockets), the rules deciding. What the sandbox adds (the listener made
inside it, the proxy variables, pip, git) is tests/test_network.py."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from orchmode.core.domains import DomainRules, Pattern
from orchmode.core.events import Event, NetworkConnection
from orchmode.core.permissions import Verdict
from orchmode.shell.proxy import Proxy, Seat

MB = 1024 * 1024
BIG = bytes(range(256)) * (MB // 256)


async def big(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    response.content_length = len(BIG)
    await response.prepare(request)
    for at in range(0, len(BIG), 64 * 1024):
        await response.write(BIG[at : at + 64 * 1024])
    return response


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


async def hello(request: web.Request) -> web.Response:
    return web.Response(text=f"hello from {request.host}")


@dataclass
class Setup:
    proxy: Proxy
    url: str
    port: int
    origin: int
    events: list[Event] = field(default_factory=list)
    #: Set at each event.
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self.arrived.set()

    def connections(self) -> list[NetworkConnection]:
        return [e for e in self.events if isinstance(e, NetworkConnection)]


@pytest.fixture
async def origin() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_post("/echo", echo)
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield port
    await runner.cleanup()


async def start(
    origin: int,
    allow: tuple[str, ...] = ("origin.test", "*.wild.test", "nothing.invalid"),
    ask: tuple[str, ...] = ("asked.test",),
    seat: Seat | None = None,
) -> tuple[Setup, asyncio.Server]:
    rules = DomainRules(
        [Pattern(p, "network_allow") for p in allow],
        [Pattern(p, "network_ask") for p in ask],
        [],
    )
    resolve = {"origin.test": "127.0.0.1", "a.wild.test": "127.0.0.1", "asked.test": "127.0.0.1"}
    proxy = Proxy(rules.decide, rules.address, resolve)
    server = await proxy.listen("127.0.0.1", 0, seat)
    port = server.sockets[0].getsockname()[1]
    found = Setup(proxy, f"http://127.0.0.1:{port}", port, origin)
    proxy.emit = found.emit
    return found, server


@pytest.fixture
async def setup(origin: int) -> AsyncIterator[Setup]:
    found, server = await start(origin)
    yield found
    server.close()
    found.proxy.close()


async def get(setup: Setup, url: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, proxy=setup.url) as response,
    ):
        return response.status, await response.read()


async def exchange(port: int, data: bytes, *, read: bool = True) -> bytes:
    """``data`` sent raw to the proxy; what comes back until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if not read:
        writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def settled(setup: Setup, count: int) -> list[NetworkConnection]:
    """The events once ``count`` connections have ended (the proxy records them as they
    close, just after the client has its answer)."""
    async with asyncio.timeout(10):
        while len(setup.connections()) < count:
            setup.arrived.clear()
            await setup.arrived.wait()
    return setup.connections()


# ---------------------------------------------------------------------------- allowed


async def test_a_named_host_is_reached_by_name_and_its_connection_is_one_event(
    setup: Setup,
) -> None:
    status, body = await get(setup, f"http://origin.test:{setup.origin}/")
    assert (status, body) == (200, f"hello from origin.test:{setup.origin}".encode())
    (event,) = await settled(setup, 1)
    assert (event.agent, event.domain, event.port, event.decision) == (
        "main",
        "origin.test",
        setup.origin,
        "allowed",
    )
    assert event.rule == "origin.test (network_allow)"
    assert event.bytes_sent > 30 and event.bytes_received > len(body)
    assert 0 < event.duration < 10


async def test_a_request_body_is_streamed_to_the_server(setup: Setup) -> None:
    payload = BIG[: 300 * 1024]

    async def chunks() -> AsyncIterator[bytes]:
        for at in range(0, len(payload), 10_000):
            yield payload[at : at + 10_000]

    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://origin.test:{setup.origin}/echo", data=chunks(), proxy=setup.url
        ) as response,
    ):
        assert await response.read() == payload
    (event,) = await settled(setup, 1)
    assert event.bytes_sent > len(payload) and event.bytes_received > len(payload)


async def test_connect_tunnels_bytes_it_does_not_look_into(setup: Setup) -> None:
    request = b"GET / HTTP/1.1\r\nHost: origin.test\r\nConnection: close\r\n\r\n"
    head = f"CONNECT origin.test:{setup.origin} HTTP/1.1\r\nHost: origin.test\r\n\r\n".encode()
    # the tunnelled request sent in the same packet as CONNECT: not lost
    answer = await exchange(setup.port, head + request)
    assert answer.startswith(b"HTTP/1.1 200 ")
    tunnelled = answer.split(b"\r\n\r\n", 1)[1]
    assert tunnelled.startswith(b"HTTP/1.1 200 OK")
    assert tunnelled.endswith(b"hello from origin.test")
    (event,) = await settled(setup, 1)
    assert (event.domain, event.decision) == ("origin.test", "allowed")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_socks5_with_the_name_resolved_by_the_proxy(setup: Setup) -> None:
    curl = await asyncio.create_subprocess_exec(
        "curl",
        "-sS",
        "--socks5-hostname",
        f"127.0.0.1:{setup.port}",
        f"http://origin.test:{setup.origin}/",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await curl.communicate()
    assert (curl.returncode, out) == (0, b"hello from origin.test:%d" % setup.origin), err
    (event,) = await settled(setup, 1)
    assert (event.domain, event.decision) == ("origin.test", "allowed")


async def socks(port: int, address: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    writer.write(b"\x05\x01\x00" + address)
    reply = await asyncio.wait_for(reader.readexactly(10), 10)
    writer.close()
    return reply


async def test_socks5_refuses_unnamed_addresses_of_every_kind_with_reply_2(setup: Setup) -> None:
    port = setup.origin.to_bytes(2, "big")
    v4 = b"\x01" + bytes([127, 0, 0, 1]) + port
    v6 = b"\x04" + bytes(15) + b"\x01" + port
    name = b"\x03\x0aother.test" + port
    for address in (v4, v6, name):
        reply = await socks(setup.port, address)
        assert reply[:2] == b"\x05\x02"
    events = await settled(setup, 3)
    assert [e.domain for e in events] == ["127.0.0.1", "::1", "other.test"]
    assert {e.decision for e in events} == {"denied"}


# ---------------------------------------------------------------------------- refused


async def test_a_name_no_rule_names_gets_a_403_naming_network_allow(setup: Setup) -> None:
    status, body = await get(setup, f"http://other.test:{setup.origin}/")
    assert status == 403
    assert body == (
        b"orchmode: other.test is not allowed here (no rule names it) "
        b"\xe2\x80\x94 add it to network_allow\n"
    )
    (event,) = await settled(setup, 1)
    assert (event.domain, event.decision, event.rule) == ("other.test", "denied", "")


async def test_an_ip_literal_and_the_hosts_loopback_are_refused(setup: Setup) -> None:
    status, body = await get(setup, f"http://127.0.0.1:{setup.origin}/")
    assert status == 403
    assert b"127.0.0.1 is not allowed here" in body and b"network_allow" in body
    # a name a wildcard allows, resolving to the host's loopback
    status, body = await get(setup, f"http://a.wild.test:{setup.origin}/")
    assert status == 403
    assert body.startswith(b"orchmode: a.wild.test resolves to 127.0.0.1, a loopback address")
    assert b"add a.wild.test to network_allow" in body
    events = await settled(setup, 2)
    assert [e.decision for e in events] == ["denied", "denied"]


async def test_a_name_that_does_not_resolve_gets_a_502_quickly(setup: Setup) -> None:
    started = time.monotonic()
    status, body = await get(setup, "http://nothing.invalid/")
    assert status == 502
    assert body.startswith(b"orchmode: nothing.invalid does not resolve")
    assert b"network_resolve" in body
    assert time.monotonic() - started < 5
    (event,) = await settled(setup, 1)
    assert event.decision == "failed"


async def test_a_refused_connection_gets_a_502(setup: Setup, origin: int) -> None:
    # the port of a server that was stopped: nothing listens there
    spare = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = spare.sockets[0].getsockname()[1]
    spare.close()
    await spare.wait_closed()
    status, body = await get(setup, f"http://origin.test:{port}/")
    assert status == 502
    assert body.startswith(f"orchmode: origin.test:{port} could not be reached".encode())


# ---------------------------------------------------------------------------- ask


async def test_an_ask_holds_the_connection_until_approved(origin: int) -> None:
    asked: list[tuple[str, int, Verdict]] = []
    answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    waiting = asyncio.Event()

    async def ask(host: str, port: int, verdict: Verdict) -> bool:
        asked.append((host, port, verdict))
        waiting.set()
        return await answer

    seat = Seat(agent="worker-3", ask=ask)
    found, server = await start(origin, seat=seat)
    try:
        request = asyncio.ensure_future(get(found, f"http://asked.test:{origin}/"))
        await asyncio.wait_for(waiting.wait(), 10)
        assert not request.done()  # held, not answered
        assert asked[0][0:2] == ("asked.test", origin)
        assert asked[0][2].rule == "asked.test"
        answer.set_result(True)
        assert await request == (200, f"hello from asked.test:{origin}".encode())
        (event,) = await settled(found, 1)
        assert (event.agent, event.decision) == ("worker-3", "approved")
    finally:
        server.close()
        found.proxy.close()


async def test_an_ask_denied_or_with_nobody_to_ask_gets_the_403(origin: int) -> None:
    async def no(host: str, port: int, verdict: Verdict) -> bool:
        return False

    for seat, words in ((Seat(ask=no), b"was not approved"), (Seat(), b"nobody is there")):
        found, server = await start(origin, seat=seat)
        try:
            status, body = await get(found, f"http://asked.test:{origin}/")
            assert status == 403 and words in body, body
            assert b"the rule `asked.test` in network_ask" in body
            (event,) = await settled(found, 1)
            assert event.decision == "denied"
        finally:
            server.close()
            found.proxy.close()


# ---------------------------------------------------------------------------- malformed


async def test_malformed_requests_get_a_clean_error_and_the_proxy_keeps_serving(
    setup: Setup,
) -> None:
    garbage = await exchange(setup.port, b"\x16\x03\x01\x00\xa5garbage\r\n\r\n")
    assert garbage.startswith(b"HTTP/1.1 400 ")
    assert b"orchmode: the request could not be read" in garbage
    # half a request, then the client's end closed: answered all the same, nothing hangs
    half = await exchange(setup.port, b"GET http://origin.test/ HTT", read=False)
    assert half.startswith(b"HTTP/1.1 400 ") and b"closed" in half
    long = b"GET http://origin.test/ HTTP/1.1\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n"
    assert (await exchange(setup.port, long)).startswith(b"HTTP/1.1 400 ")
    direct = await exchange(setup.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert direct.startswith(b"HTTP/1.1 400 ") and b"HTTP_PROXY" in direct
    # still serving
    status, _ = await get(setup, f"http://origin.test:{setup.origin}/")
    assert status == 200
    assert [e.decision for e in await settled(setup, 1)] == ["allowed"]


async def test_a_client_that_never_finishes_its_request_is_answered_in_time(origin: int) -> None:
    found, server = await start(origin)
    found.proxy.head_timeout = 0.3
    try:
        answer = await exchange(found.port, b"GET http://origin.test/ HTTP/1.1\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ") and b"did not arrive in time" in answer
    finally:
        server.close()
        found.proxy.close()


# ---------------------------------------------------------------------------- load


async def test_a_hundred_concurrent_downloads_of_a_megabyte_all_complete(setup: Setup) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> bytes:
            url = f"http://origin.test:{setup.origin}/big"
            async with session.get(url, proxy=setup.url) as response:
                assert response.status == 200
                return await response.read()

        bodies = await asyncio.gather(*(one() for _ in range(100)))
    assert all(body == BIG for body in bodies)
    events = await settled(setup, 100)
    assert all(e.decision == "allowed" and e.bytes_received > MB for e in events)


@pytest.mark.parametrize("kind", ["udp", "tcp-not-listening", "listening"])
async def test_only_a_listening_tcp_socket_handed_in_is_served(kind: str) -> None:
    """What a listener step hands out is checked: any other descriptor is closed, and
    the shell goes without a network rather than the proxy serving something else."""
    rules = DomainRules([Pattern("x.test", "test")], [], [])
    proxy = Proxy(rules.decide, rules.address)
    ours, theirs = socket.socketpair()
    if kind == "udp":
        handed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    else:
        handed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        handed.bind(("127.0.0.1", 0))
        if kind == "listening":
            handed.listen()
    attachment = proxy.adopt(ours, Seat())
    socket.send_fds(theirs, [b"L"], [handed.fileno()])
    async with asyncio.timeout(5):
        while attachment.channel is not None:  # the channel is closed once it arrived
            await asyncio.sleep(0.01)
        if kind == "listening":
            while attachment.server is None:
                await asyncio.sleep(0.01)
    assert (attachment.server is not None) is (kind == "listening")
    attachment.close()
    proxy.close()
    handed.close()
    theirs.close()
