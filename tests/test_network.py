"""Sandboxed commands reach the network only through orchmode's proxy: real sandbox, real
servers on the host, real tools (curl, pip, git) inside, names made to resolve with
``network_resolve`` (the machine's DNS is never asked for them)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import json
import subprocess
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, gateway_for, settings_for, store_for
from orchmode.core.events import Event, EventBus, NetworkConnection
from orchmode.core.results import Status
from orchmode.core.settings import Settings
from orchmode.executors import Job
from orchmode.executors.host import AgentHost, ShellFactory
from orchmode.shell import processes
from orchmode.shell.bash import BashSession
from orchmode.shell.bwrap import probe
from orchmode.shell.policy import SandboxPolicy, system_python
from orchmode.shell.proxy import Proxy
from orchmode.shell.sandbox import Sandbox
from orchmode.testing import Reply, ScriptedRequest
from orchmode.testing.scenario import report

NAMES = ("files.test", "index.test", "git.test")


@pytest.fixture(autouse=True)
def _sandbox_works() -> None:
    """Fail, not skip, without a working sandbox: orchmode refuses to run without one."""
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)
    assert system_python() is not None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def www(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A plain HTTP server on the host's loopback, serving a directory."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the host\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, server.server_address[1]
    server.shutdown()
    server.server_close()


@dataclass
class Shell:
    shell: BashSession
    port: int
    root: Path
    proxy: Proxy
    events: list[Event] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self.arrived.set()

    async def run(self, command: str) -> str:
        result = await self.shell.run(command.replace("PORT", str(self.port)))
        return result.output

    async def connections(self, count: int) -> list[NetworkConnection]:
        """The events once ``count`` connections have ended: the proxy records one as it
        closes, which may be just after the command that made it has finished."""

        def ended() -> list[NetworkConnection]:
            return [e for e in self.events if isinstance(e, NetworkConnection)]

        async with asyncio.timeout(10):
            while len(ended()) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return ended()


@pytest.fixture(params=["perl", "python", "copy-refused"])
async def shell(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    www: tuple[Path, int],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Shell]:
    """A sandboxed shell whose listener is made by perl's step (copied out with
    pidfd_getfd), by Python's, or by perl's where the kernel refuses the copy: an old
    kernel, stood in for by a system call number that has none (ENOSYS), after which the
    step becomes Python's."""
    step = request.param
    if step == "copy-refused":
        monkeypatch.setattr(processes, "PIDFD_GETFD", 100_000)
    root, port = www
    work = tmp_path / "work"
    work.mkdir()
    settings = Settings(
        network_allow=(*NAMES, "nothing.invalid"),
        network_resolve=tuple(f"{name}=127.0.0.1" for name in NAMES),
        bash_timeout=60,
    )
    factory = ShellFactory.build(settings, work, ())
    made = factory()
    assert factory.sandbox is not None and factory.sandbox.proxy is not None
    found = Shell(made, port, root, factory.sandbox.proxy)
    found.proxy.copies_listeners = step != "python"
    made.seat.agent = "worker-1"
    made.seat.emit = found.emit
    try:
        yield found
        # perl's listener was copied out (or, refused, no copy is tried again)
        assert found.proxy.copies_listeners is (step == "perl")
    finally:
        await made.close()
        factory.abandon_all()


async def test_a_host_server_is_reached_by_name_through_the_proxy(shell: Shell) -> None:
    out = await shell.run("curl -sS http://files.test:PORT/hello.txt")
    assert out == "hello from the host"
    (event,) = await shell.connections(1)
    assert (event.agent, event.domain, event.port, event.decision) == (
        "worker-1",
        "files.test",
        shell.port,
        "allowed",
    )
    assert event.bytes_received > len(out)


async def test_the_sandbox_has_no_other_way_out(shell: Shell) -> None:
    # no proxy: the sandbox's own loopback holds nothing but the proxy's listener
    out = await shell.run("curl -sS --noproxy '*' http://127.0.0.1:PORT/hello.txt; echo rc=$?")
    assert "rc=7" in out  # couldn't connect
    # and the shell holds no socket: neither the socket pair's end nor the listener
    out = await shell.run("ls -l /proc/$$/fd /proc/self/fd | grep -c socket: || true")
    assert out.strip() == "0"


async def test_connect_and_socks5_from_inside(shell: Shell) -> None:
    tunnel = await shell.run(
        "curl -sS -p -x http://127.0.0.1:3128 http://files.test:PORT/hello.txt"
    )
    assert tunnel == "hello from the host"
    socks = await shell.run(
        "curl -sS --socks5-hostname 127.0.0.1:3128 http://files.test:PORT/hello.txt"
    )
    assert socks == "hello from the host"
    refused = await shell.run(
        "curl -sS --socks5-hostname 127.0.0.1:3128 http://other.test:PORT/; echo rc=$?"
    )
    assert "rc=97" in refused  # curl: the SOCKS5 server refused (not allowed)
    assert [e.decision for e in await shell.connections(3)] == ["allowed", "allowed", "denied"]


async def test_ip_literals_and_the_hosts_loopback_are_refused_with_the_line(shell: Shell) -> None:
    out = await shell.run("curl -sS --noproxy '' -w ' %{http_code}' http://127.0.0.1:PORT/")
    assert out == (
        "orchmode: 127.0.0.1 is not allowed here (no rule names it) — an address is reached "
        "only when named: add it to network_allow\n 403"
    )
    out = await shell.run("curl -sS -w ' %{http_code}' http://93.184.216.34/")
    assert out.endswith(" 403") and "93.184.216.34 is not allowed here" in out


async def test_a_denied_name_gets_a_403_naming_network_allow(shell: Shell) -> None:
    out = await shell.run("curl -sS -w ' %{http_code}' https://pypi.org/simple/; echo rc=$?")
    # over HTTPS the 403 answers the CONNECT: curl names the code
    assert "CONNECT tunnel failed, response 403" in out
    out = await shell.run("curl -sS -w ' %{http_code}' http://other.test:PORT/")
    assert out == (
        "orchmode: other.test is not allowed here (no rule names it) — add it to "
        "network_allow\n 403"
    )
    assert [(e.domain, e.decision) for e in await shell.connections(2)] == [
        ("pypi.org", "denied"),
        ("other.test", "denied"),
    ]


async def test_a_name_that_does_not_resolve_gets_a_502_quickly(shell: Shell) -> None:
    started = time.monotonic()
    out = await shell.run("curl -sS -w ' %{http_code}' http://nothing.invalid/")
    assert out.startswith("orchmode: nothing.invalid does not resolve") and out.endswith(" 502")
    assert time.monotonic() - started < 5


async def test_a_restarted_shell_has_a_listener_of_its_own_and_a_closed_one_none(
    shell: Shell,
) -> None:
    assert await shell.run("curl -sS http://files.test:PORT/hello.txt") == "hello from the host"
    await shell.shell.restart()
    assert await shell.run("curl -sS http://files.test:PORT/hello.txt") == "hello from the host"
    assert len(await shell.connections(2)) == 2
    assert shell.proxy.listeners == 1  # the first shell's was let go when the second started
    await shell.shell.close()
    assert shell.proxy.listeners == 0


def _wheel(directory: Path) -> Path:
    """A tiny pure-Python wheel, written by hand (a wheel is a zip with a RECORD)."""
    name = "tinypkg-1.0-py3-none-any.whl"
    files = {
        "tinypkg/__init__.py": b"VALUE = 'installed through the proxy'\n",
        "tinypkg-1.0.dist-info/METADATA": (b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"),
        "tinypkg-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("tinypkg-1.0.dist-info/RECORD,,")
    wheel = directory / name
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr("tinypkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


async def test_pip_installs_a_wheel_from_a_local_index_through_the_proxy(shell: Shell) -> None:
    project = shell.root / "simple" / "tinypkg"
    project.mkdir(parents=True)
    wheel = _wheel(project)
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    out = await shell.run(
        "PIP_CONFIG_FILE=/dev/null /usr/bin/python3 -m pip install -q --isolated "
        "--no-cache-dir --disable-pip-version-check --target /tmp/site "
        "--index-url http://index.test:PORT/simple/ --trusted-host index.test tinypkg "
        "&& PYTHONPATH=/tmp/site /usr/bin/python3 -c 'import tinypkg; print(tinypkg.VALUE)'"
    )
    assert out.strip().endswith("installed through the proxy"), out
    events = await shell.connections(1)
    assert {e.domain for e in events} == {"index.test"}
    assert all(e.decision == "allowed" for e in events)


async def test_git_clones_over_http_through_the_proxy(shell: Shell, tmp_path: Path) -> None:
    source = tmp_path / "source"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(source)], check=True)
    (source / "README").write_text("cloned through the proxy\n")
    subprocess.run([*git, "-C", str(source), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(source), "commit", "-qm", "first"], check=True)
    bare = shell.root / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(source), str(bare)], check=True)
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)
    out = await shell.run(
        "git clone -q http://git.test:PORT/repo.git /tmp/clone && cat /tmp/clone/README"
    )
    assert out == "cloned through the proxy", out
    assert {e.domain for e in await shell.connections(1)} == {"git.test"}


def test_the_proxy_is_on_only_in_a_sandbox_without_allow_network(tmp_path: Path) -> None:
    on = Sandbox.from_settings(Settings(), tmp_path)
    assert on is not None and on.proxy is not None
    assert on.policy.proxy_env()["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert on.policy.proxy_env()["all_proxy"] == "socks5h://127.0.0.1:3128"
    assert on.read_only().proxy is on.proxy  # one proxy for every shell of the factory
    assert on.in_copy(tmp_path, writable=True).proxy is on.proxy
    everything = Sandbox.from_settings(Settings(allow_network=True), tmp_path)
    assert everything is not None and everything.proxy is None
    assert everything.policy.proxy_env() == {}
    assert Sandbox.from_settings(Settings(sandbox="off"), tmp_path) is None
    # without a perl or a Python to make the listener, no proxy (and no network), not a
    # broken shell; with either, the proxy
    policy = SandboxPolicy(mode="workspace-write", workdir=tmp_path, python=None, perl=None)
    assert not policy.proxied
    assert SandboxPolicy(mode="workspace-write", workdir=tmp_path, python=None).proxied
    assert SandboxPolicy(mode="workspace-write", workdir=tmp_path, perl=None).proxied


async def test_the_proxy_variables_point_inside_and_exempt_loopback(shell: Shell) -> None:
    out = await shell.run("env | grep -i _proxy= | sort")
    assert out.splitlines() == [
        "ALL_PROXY=socks5h://127.0.0.1:3128",
        "HTTPS_PROXY=http://127.0.0.1:3128",
        "HTTP_PROXY=http://127.0.0.1:3128",
        "NO_PROXY=localhost,127.0.0.1,::1",
        "all_proxy=socks5h://127.0.0.1:3128",
        "http_proxy=http://127.0.0.1:3128",
        "https_proxy=http://127.0.0.1:3128",
        "no_proxy=localhost,127.0.0.1,::1",
    ]


async def test_the_listener_step_leaves_no_signal_ignored(shell: Shell) -> None:
    """The step before the shell may be a Python, which ignores SIGPIPE and SIGXFSZ: the
    shell and what it runs get them back at their defaults, as a shell without the step
    has."""
    ignored = await shell.run("grep SigIgn /proc/self/status")
    assert int(ignored.split()[-1], 16) & (1 << 12 | 1 << 24) == 0  # SIGPIPE 13, SIGXFSZ 25
    piped = await shell.run("yes | head -n 1")
    assert piped.strip() == "y"  # no "Broken pipe" from `yes`


async def test_an_agents_connections_are_events_on_the_bus_under_its_name(
    serve: StartServer, tmp_path: Path, www: tuple[Path, int]
) -> None:
    _, port = www
    work = tmp_path / "work"
    work.mkdir()
    command = f"curl -sS http://files.test:{port}/hello.txt"

    def respond(request: ScriptedRequest) -> Reply:
        if request.index == 0:
            return Reply.tool_use("bash", {"command": command})
        return report("fetched", [])

    server = await serve(respond)
    settings = settings_for(
        server,
        work,
        network_allow=("files.test",),
        network_resolve=("files.test=127.0.0.1",),
    )
    factory = ShellFactory.build(settings, work, ())
    host = AgentHost(settings, gateway_for(settings), store_for(tmp_path), factory)
    bus = EventBus()
    seen: list[NetworkConnection] = []
    arrived = asyncio.Event()

    def collect(event: Event) -> None:
        if isinstance(event, NetworkConnection):
            seen.append(event)
            arrived.set()

    bus.subscribe(collect)
    job = Job("k1", "me", "s1", "worker", "worker 1.1", "fetch the file")
    try:
        result = await host.run(job, bus)
        assert result.status is Status.FINISHED
        # the command's output went back to the model: the file came through the proxy
        assert "hello from the host" in json.dumps(server.log[1].body["messages"][-1])
        await asyncio.wait_for(arrived.wait(), 10)
        (event,) = seen
        assert (event.agent, event.domain, event.decision) == (
            "worker 1.1",
            "files.test",
            "allowed",
        )
    finally:
        await host.finish_housekeeping()
        factory.abandon_all()


@pytest.mark.slow
async def test_twenty_sandboxed_shells_download_at_once_each_under_its_agent(
    tmp_path: Path, www: tuple[Path, int]
) -> None:
    root, port = www
    (root / "big").write_bytes(bytes(range(256)) * 4096)  # 1 MB
    work = tmp_path / "work"
    work.mkdir()
    settings = Settings(network_allow=("files.test",), network_resolve=("files.test=127.0.0.1",))
    factory = ShellFactory.build(settings, work, ())
    shells = [factory() for _ in range(20)]
    events: list[Event] = []
    all_in = asyncio.Event()

    def emit(event: Event) -> None:
        events.append(event)
        if len(events) == 20:
            all_in.set()

    for number, made in enumerate(shells):
        made.seat.agent = f"worker {number}"
        made.seat.emit = emit
    command = f"curl -sS -o /dev/null -w '%{{size_download}}' http://files.test:{port}/big"
    try:
        results = await asyncio.gather(*(made.run(command) for made in shells))
        assert [r.output for r in results] == ["1048576"] * 20
        await asyncio.wait_for(all_in.wait(), 10)
    finally:
        await asyncio.gather(*(made.close() for made in shells))
        factory.abandon_all()
    ended = [e for e in events if isinstance(e, NetworkConnection)]
    assert sorted(e.agent for e in ended) == sorted(f"worker {n}" for n in range(20))
    assert all(e.decision == "allowed" and e.bytes_received > 1048576 for e in ended)


@pytest.mark.parametrize("copied", [True, False], ids=["perl", "python"])
def test_a_listener_step_without_its_channel_warns_and_still_starts_the_shell(
    tmp_path: Path, copied: bool
) -> None:
    """Either step, handed a channel that is not open, says the shell has no network and
    becomes the shell all the same: a broken proxy never costs the agent its shell."""
    policy = SandboxPolicy(mode="workspace-write", workdir=tmp_path)
    step = policy.listener_step(99, copied=copied).command  # descriptor 99 is not open
    assert Path(step[0]).name.startswith("perl" if copied else "python")
    done = subprocess.run([*step, "echo", "the shell ran"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "the shell ran\n")
    assert done.stderr.startswith("orchmode: this shell has no network proxy (")
    assert "commands reach no network; restart the shell" in done.stderr


#: A user's perl settings that would stop a perl started with them from making the listener:
#: a module the sandbox cannot load (local::lib's, say, under the hidden home), and :utf8
#: layers on every handle, on which syswrite dies.
PERL_SETTINGS = {
    "PERL5OPT": "-Mnot::installed::Here",
    "PERL5LIB": "/nowhere/perl5/lib",
    "PERL_UNICODE": "SDA",
    "PERLIO": ":utf8",
}


@pytest.mark.parametrize("copied", [True, False], ids=["perl", "python"])
async def test_the_users_perl_settings_neither_break_the_step_nor_leave_the_shell(
    tmp_path: Path, www: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, copied: bool
) -> None:
    """Perl's step starts without the user's PERL* variables and with no complaint about
    a locale that is not installed; the shell gets them back, as it would without the
    step, and its network works."""
    for name, value in PERL_SETTINGS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "xx_YY.UTF-8")  # installed nowhere
    monkeypatch.delenv("PERL_BADLANG", raising=False)
    root, port = www
    work = tmp_path / "work"
    work.mkdir()
    settings = Settings(
        network_allow=NAMES, network_resolve=("files.test=127.0.0.1",), bash_timeout=60
    )
    factory = ShellFactory.build(settings, work, ())
    made = factory()
    assert factory.sandbox is not None and factory.sandbox.proxy is not None
    found = Shell(made, port, root, factory.sandbox.proxy)
    found.proxy.copies_listeners = copied
    try:
        first = await found.run("env | grep ^PERL | sort")
        fetched = await found.run("curl -sS http://files.test:PORT/hello.txt")
        assert found.proxy.copies_listeners is copied  # perl's listener was copied out
    finally:
        await made.close()
        factory.abandon_all()
    for trouble in ("perl: warning", "orchmode:", "the shell exited", "syswrite", "Can't locate"):
        assert trouble not in first, first
    assert [line for line in first.splitlines() if line.startswith("PERL")] == [
        f"{name}={value}" for name, value in sorted(PERL_SETTINGS.items())
    ]
    assert fetched == "hello from the host"
