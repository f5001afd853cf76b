"""The bash sandbox with real bubblewrap: each denial shows in the tool result and not on the host.

The same attacks run with ``--sandbox off`` where that is safe, to show that they would
succeed without the sandbox (so these tests can fail). The fork bomb, the floods and the
limits run sandboxed only.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import conversation_for, store_for
from orchmode.core.settings import SandboxMode, Settings
from orchmode.shell.bash import BashSession, ShellResult
from orchmode.shell.bwrap import probe
from orchmode.shell.environment import command_environment
from orchmode.shell.policy import SandboxPolicy
from orchmode.shell.sandbox import Sandbox
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from recorded_runs import API_KEY, base_env, orchmode

SECRET = "ssh-private-key-" + secrets.token_hex(8)

BY_CGROUP = "cgroup" in probe().limits.get("processes", "")
READ_ONLY_FS = "Read-only file system"


@pytest.fixture(autouse=True)
def _bubblewrap_works() -> None:
    """Fail, not skip, without a working bubblewrap: orchmode refuses to run without one."""
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)


# ---------------------------------------------------------------------------- helpers


@pytest.fixture
def home() -> Iterator[Path]:
    """A home directory with a planted key, outside /tmp: the private /tmp cannot hide it."""
    root = Path(tempfile.mkdtemp(prefix="orchmode-home-", dir="/var/tmp"))
    (root / ".ssh").mkdir()
    (root / ".ssh" / "id_ed25519").write_text(SECRET)
    (root / ".bash_history").write_text(f"export TOKEN={SECRET}\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A path outside the working directory and outside /tmp, on the host's filesystem."""
    path = Path("/var/tmp", f"orchmode-outside-{secrets.token_hex(6)}")
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "notes.txt").write_text("hello from the host\n")
    return path


Shells = Callable[..., BashSession]


@pytest.fixture
async def shells(home: Path) -> AsyncIterator[Shells]:
    """Make bash sessions the way ``Session.make_shell`` does; all closed at the end."""
    made: list[BashSession] = []
    env = {**command_environment(os.environ), "HOME": str(home)}

    def make(
        workdir: Path, mode: SandboxMode = "workspace-write", *, timeout: float = 20, **kw: Any
    ) -> BashSession:
        output_limit = kw.pop("output_limit", 8000)
        settings = Settings(sandbox=mode, **kw)
        sandbox = Sandbox.from_settings(settings, workdir)
        if sandbox is not None:  # with the planted home, not the test runner's
            sandbox = Sandbox(SandboxPolicy.from_settings(settings, workdir, env=env))
        shell = BashSession(
            workdir,
            timeout=timeout,
            output_limit=output_limit,
            env=env,
            sandbox=sandbox.for_shell() if sandbox is not None else None,
        )
        made.append(shell)
        return shell

    yield make
    for shell in made:
        await shell.close()


def _proc_fields(pid: str) -> list[bytes] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return raw[raw.rfind(b")") + 2 :].split()


def in_session(leader: int) -> list[int]:
    """Live host PIDs in the session ``leader`` started (the sandbox and all it runs)."""
    members = []
    for entry in os.listdir("/proc"):
        fields = _proc_fields(entry) if entry.isdigit() else None
        if fields and int(fields[3]) == leader and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def with_argument(marker: str) -> list[int]:
    """Live host PIDs whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline.split(b"\0"):
            found.append(int(entry))
    return found


async def until(predicate: Callable[[], bool], deadline: float = 5.0) -> bool:
    """Poll ``predicate`` (process death has no event to wait on) until true or the deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        if loop.time() > end:
            return False
        await asyncio.sleep(0.02)
    return True


class LoopbackServer:
    """A TCP server on the host's 127.0.0.1 that records whether anything reached it."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> LoopbackServer:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.reached.set()
            writer.close()

        self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def connect_command(self) -> str:
        return f"exec 3<>/dev/tcp/127.0.0.1/{self.port} && echo connected"


async def run(shell: BashSession, command: str) -> ShellResult:
    return await shell.handle({"command": command})


# ---------------------------------------------------- the same attacks, sandbox on or off


@pytest.mark.parametrize("mode", ["workspace-write", "off"])
async def test_writing_outside_the_working_directory(
    shells: Shells, work: Path, outside: Path, mode: SandboxMode
) -> None:
    shell = shells(work, mode)
    result = await run(shell, f"echo pwned > {outside} && echo written")
    if mode == "off":
        assert result.output == "written" and outside.read_text() == "pwned\n"
        return
    assert result.is_error and READ_ONLY_FS in result.output
    assert not outside.exists()
    # /tmp is writable but private: nothing lands in the host's /tmp.
    marker = f"orchmode-private-{secrets.token_hex(6)}"
    result = await run(shell, f"echo x > /tmp/{marker} && cat /tmp/{marker}")
    assert result.output == "x"
    assert not Path("/tmp", marker).exists()


@pytest.mark.parametrize("mode", ["workspace-write", "off"])
async def test_reading_a_key_planted_in_home(
    shells: Shells, work: Path, home: Path, mode: SandboxMode
) -> None:
    shell = shells(work, mode)
    result = await run(shell, "cat ~/.ssh/id_ed25519; cat ~/.bash_history; echo $HOME")
    if mode == "off":
        assert SECRET in result.output
        return
    assert SECRET not in result.output
    assert "No such file or directory" in result.output
    assert result.output.splitlines()[-1] == str(home)  # the same path, now empty
    listing = await run(shell, f"ls -A {home} /root; cat {home}/.ssh/id_ed25519")
    assert SECRET not in listing.output and "No such file or directory" in listing.output


@pytest.mark.parametrize("mode", ["workspace-write", "off"])
async def test_connecting_to_a_loopback_service_of_the_host(
    shells: Shells, work: Path, mode: SandboxMode
) -> None:
    shell = shells(work, mode)
    async with LoopbackServer() as server:
        result = await run(shell, server.connect_command())
        if mode == "off":
            assert result.output == "connected"
            await asyncio.wait_for(server.reached.wait(), 10)
            return
        assert result.is_error and "Connection refused" in result.output
        assert not server.reached.is_set()


# -------------------------------------------------------------------- network denied


async def test_dns_lookup_fails(shells: Shells, work: Path) -> None:
    result = await run(shell := shells(work), "getent hosts example.com || echo lookup failed")
    assert result.output == "lookup failed"
    # Only the namespace's own loopback is there.
    result = await run(shell, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert result.output == "lo"


async def test_connecting_to_a_public_address_fails(shells: Shells, work: Path) -> None:
    result = await run(shells(work), "exec 3<>/dev/tcp/1.1.1.1/443 && echo connected")
    assert result.is_error
    assert "Network is unreachable" in result.output
    assert "connected" not in result.output


async def test_allow_network_lets_the_loopback_connection_through(
    shells: Shells, work: Path
) -> None:
    shell = shells(work, allow_network=True)
    async with LoopbackServer() as server:
        result = await run(shell, server.connect_command())
        assert result.output == "connected"
        await asyncio.wait_for(server.reached.wait(), 10)
    # The filesystem stays sandboxed.
    result = await run(shell, "touch /usr/orchmode-probe")
    assert READ_ONLY_FS in result.output


@pytest.mark.skipif(
    "--disable-userns" not in probe().flags, reason="this bubblewrap cannot disable user namespaces"
)
async def test_the_sandbox_cannot_make_namespaces_of_its_own(shells: Shells, work: Path) -> None:
    result = await run(shells(work), "unshare --user --map-root-user true && echo nested")
    assert result.is_error and "nested" not in result.output


# ----------------------------------------------------------------------- secrets, state


async def test_a_session_shell_has_no_api_key_and_no_home(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``Session.make_shell``, with the orchmode process's own HOME and key."""
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    settings = Settings(base_url="http://127.0.0.1:9", workdir=tmp_path)
    session = await conversation_for(settings, store=store_for(tmp_path))
    try:
        assert session.shell.sandbox_mode == "workspace-write"
        result = await session.shell.run("env; cat ~/.ssh/id_ed25519")
        assert "ANTHROPIC_API_KEY" not in result.output and API_KEY not in result.output
        assert f"HOME={home}" in result.output
        assert SECRET not in result.output and "No such file or directory" in result.output
    finally:
        await session.close()


async def test_orchmode_state_cannot_be_written_or_read(shells: Shells, work: Path) -> None:
    state = work / ".orchmode"
    state.mkdir()
    (state / "journal.db").write_text("the real journal")
    shell = shells(work)
    result = await run(shell, "echo forged > .orchmode/journal.db")
    assert result.is_error and READ_ONLY_FS in result.output
    result = await run(shell, "ls -A .orchmode; rm -rf .orchmode; mv .orchmode elsewhere")
    assert result.is_error
    assert (state / "journal.db").read_text() == "the real journal"
    assert not (work / "elsewhere").exists()
    # Everything else in the working directory is the agent's to change.
    result = await run(shell, "echo changed > notes.txt && mkdir -p build && echo ok")
    assert result.output == "ok" and (work / "notes.txt").read_text() == "changed\n"


async def test_a_missing_state_directory_cannot_be_created_either(
    shells: Shells, work: Path
) -> None:
    shell = shells(work)
    result = await run(shell, "mkdir -p .orchmode/sub && echo x > .orchmode/journal.db")
    assert result.is_error and READ_ONLY_FS in result.output
    assert (work / ".orchmode").is_dir() and list((work / ".orchmode").iterdir()) == []


async def test_the_config_file_cannot_be_rewritten(shells: Shells, work: Path) -> None:
    (work / "orchmode.toml").write_text('sandbox = "workspace-write"\n')
    result = await run(shells(work), "echo 'sandbox = \"off\"' > orchmode.toml")
    assert READ_ONLY_FS in result.output
    assert (work / "orchmode.toml").read_text() == 'sandbox = "workspace-write"\n'


async def test_read_only_mode_refuses_a_write_in_the_working_directory(
    shells: Shells, work: Path
) -> None:
    shell = shells(work, "read-only")
    result = await run(shell, "cat notes.txt; touch made-here")
    assert result.is_error and READ_ONLY_FS in result.output
    assert "hello from the host" in result.output
    assert not (work / "made-here").exists()
    assert (await run(shell, "echo scratch > /tmp/x && cat /tmp/x")).output == "scratch"


async def test_a_working_directory_inside_home_is_writable_but_home_is_not(
    shells: Shells, home: Path
) -> None:
    project = home / "project"
    project.mkdir()
    shell = shells(project)
    result = await run(shell, "touch built && cat ../.ssh/id_ed25519")
    assert "No such file or directory" in result.output and SECRET not in result.output
    assert (project / "built").exists()


# ----------------------------------------------------------------- limits and cleanup


@pytest.mark.timeout(60)
@pytest.mark.slow
async def test_a_fork_bomb_is_contained(shells: Shells, work: Path) -> None:
    limit = 32
    shell = shells(work, timeout=3, sandbox_processes=limit, output_limit=2000)
    await run(shell, "true")
    leader = shell.pid
    assert leader is not None
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(in_session(leader)))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        result = await run(shell, "bomb() { bomb | bomb; }; bomb")
    finally:
        watcher.cancel()
    assert "Resource temporarily unavailable" in result.output
    # Everything the shell ran stayed under the limit (rlimits leave bwrap's outer process
    # out of the count, the cgroup does not).
    assert 0 < peak <= limit + 1
    assert await until(lambda: not in_session(leader))
    assert (await run(shell, "echo alive")).output == "alive"
    assert subprocess.run(["true"], check=False).returncode == 0  # the host can still fork


@pytest.mark.timeout(60)
async def test_a_cpu_hog_is_stopped_at_the_cpu_limit(shells: Shells, work: Path) -> None:
    shell = shells(work, sandbox_cpu_seconds=1, timeout=30)
    result = await run(shell, "sh -c 'while :; do :; done'")
    assert not result.timed_out
    assert result.exit_code == 128 + 24  # SIGXCPU
    assert "CPU time limit exceeded" in result.output
    assert (await run(shell, "echo alive")).output == "alive"


@pytest.mark.timeout(60)
async def test_a_memory_hog_is_stopped_at_the_memory_limit(shells: Shells, work: Path) -> None:
    shell = shells(work, sandbox_memory_mb=64)
    hog = "( x=$(head -c $((300 * 1000 * 1000)) /dev/zero | tr '\\0' x); echo ${#x} )"
    result = await run(shell, hog)
    assert result.is_error
    assert "300000000" not in result.output
    # The cgroup's OOM killer, or a refused allocation under RLIMIT_DATA.
    assert "Killed" in result.output or "cannot allocate" in result.output
    result = await run(shell, "head -c 100000000 /dev/zero > /tmp/fill")
    assert "No space left on device" in result.output  # /tmp is half the memory
    assert (await run(shell, "echo alive")).output == "alive"


async def test_a_yes_flood_is_truncated_and_the_shell_keeps_working(
    shells: Shells, work: Path
) -> None:
    shell = shells(work, output_limit=100)
    result = await run(shell, "yes | head -n 500000")
    assert "[output truncated: 100 of 999999 characters shown]" in result.output
    assert len(result.output) < 400
    assert (await run(shell, "echo alive")).output == "alive"


@pytest.mark.timeout(60)
async def test_a_background_sleep_is_cleaned_up_at_timeout(shells: Shells, work: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**6):06d}"
    shell = shells(work, timeout=1)
    result = await run(shell, f"sleep {marker} & echo started")
    assert result.output == "started"
    assert await until(lambda: len(with_argument(marker)) == 1)  # running, on the host
    result = await run(shell, "sleep 30")
    assert result.timed_out and "the shell was restarted" in result.output
    assert await until(lambda: not with_argument(marker))
    assert (await run(shell, "echo alive")).output == "alive"


async def test_a_command_reading_stdin_returns(shells: Shells, work: Path) -> None:
    shell = shells(work, timeout=10)
    assert (await run(shell, "cat")).output == "(no output)"
    result = await run(shell, "read line; echo rc=$?")
    assert result.output == "rc=1" and not result.timed_out


async def test_nothing_outlives_a_closed_shell(shells: Shells, work: Path) -> None:
    marker = f"1000.{secrets.randbelow(10**6):06d}"
    shell = shells(work)
    await run(shell, f"setsid sleep {marker} > /dev/null 2>&1 < /dev/null &")
    assert await until(lambda: len(with_argument(marker)) == 1)
    await shell.close()  # setsid left the process group; the PID namespace still ends
    assert await until(lambda: not with_argument(marker))


_ORPHAN_MAKER = """
import asyncio, sys
from pathlib import Path
from orchmode.shell.policy import SandboxPolicy
from orchmode.shell.sandbox import Sandbox
from orchmode.shell.bash import BashSession

async def main() -> None:
    work = Path(sys.argv[1])
    mode = sys.argv[2]
    sandbox = Sandbox(SandboxPolicy(mode=mode, workdir=work)) if mode != "off" else None
    shell = BashSession(work, sandbox=sandbox.for_shell() if sandbox else None)
    result = await shell.run("setsid sleep $MARKER > /dev/null 2>&1 < /dev/null & echo ready")
    print(result.output, flush=True)
    await asyncio.Event().wait()  # until killed

asyncio.run(main())
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["workspace-write", "off"])
def test_nothing_outlives_orchmode_when_it_is_killed(work: Path, mode: str) -> None:
    marker = f"1000.{secrets.randbelow(10**6):06d}"
    process = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_MAKER, str(work), mode],
        env={**os.environ, "MARKER": marker},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        assert asyncio.run(until(lambda: len(with_argument(marker)) == 1))
    finally:
        process.kill()  # SIGKILL: no cleanup code of orchmode's runs
        process.wait()
    if mode == "off":  # the orphan lives on
        orphans = with_argument(marker)
        for orphan in orphans:
            os.kill(orphan, 9)
        assert orphans
        return
    assert asyncio.run(until(lambda: not with_argument(marker)))


async def test_started_in_home_the_dot_entries_are_hidden(shells: Shells, home: Path) -> None:
    shell = shells(home)
    result = await run(shell, "cat .ssh/id_ed25519 .bash_history; touch made && echo made")
    assert SECRET not in result.output and result.output.endswith("made")
    assert (home / "made").exists()


@pytest.mark.skipif(not BY_CGROUP, reason="no cgroup can be made here: rlimits are used")
async def test_each_shell_gets_its_own_cgroup_which_is_removed_at_close(
    shells: Shells, work: Path
) -> None:
    shell = shells(work, sandbox_processes=77)
    await run(shell, "true")
    assert shell.pid is not None
    lines = Path(f"/proc/{shell.pid}/cgroup").read_text().splitlines()
    pids_path = next(line.split(":", 2)[2] for line in lines if ":pids:" in line)
    cgroup = Path("/sys/fs/cgroup/pids", pids_path.lstrip("/"))
    assert cgroup.name.startswith("shell-")
    assert (cgroup / "pids.max").read_text().strip() == "77"
    await shell.close()
    assert await until(lambda: not cgroup.exists(), 60.0)  # once its last processes are reaped


# ------------------------------------------------------------ without bubblewrap


async def test_a_missing_bwrap_refuses_to_run_and_off_still_works(
    shells: Shells, work: Path
) -> None:
    missing = "/nonexistent/bwrap"
    shell = shells(work, sandbox_bwrap=missing)
    result = await run(shell, "touch ran-unsandboxed")
    assert result.is_error
    assert "could not start the shell: the bash sandbox is unavailable" in result.output
    assert "apt install bubblewrap" in result.output and "--sandbox off" in result.output
    assert not (work / "ran-unsandboxed").exists()
    off = shells(work, "off", sandbox_bwrap=missing)
    assert (await run(off, "touch ran && echo ran")).output == "ran"
    assert (work / "ran").exists()


def test_a_bwrap_that_cannot_make_namespaces_is_reported(tmp_path: Path) -> None:
    """A stand-in binary that fails the way bubblewrap does when the kernel says no."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    found = probe(str(fake))
    assert found.problem is not None
    assert "No permissions to create new namespace" in found.problem
    assert "--sandbox off" in found.problem
    assert "\n" not in found.problem


# ------------------------------------------------------------------ end to end, CLI


cli_env = base_env  # the CLI tests' environment: no credentials but the test key


def bash_events(workdir: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(workdir / ".orchmode" / "journal.db")
    try:
        rows = db.execute("SELECT data FROM events WHERE kind = 'BashDone'").fetchall()
    finally:
        db.close()
    return [json.loads(row[0]) for row in rows]


@pytest.mark.parametrize("mode", ["workspace-write", "read-only", "off"])
@pytest.mark.slow
def test_run_records_the_sandbox_of_every_command(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, home: Path, mode: str
) -> None:
    scenario = OrchestrationScenario(subtasks=1, scout_command="cat ~/.ssh/id_ed25519")
    server = scripted(scenario)
    env = cli_env(HOME=str(home))
    result = orchmode(
        "run", "go", "--base-url", server.url, "--sandbox", mode, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    events = bash_events(tmp_path)
    assert {e["agent"] for e in events} >= {"main", "worker 1.1"}
    assert {e["sandbox"] for e in events} == {mode}
    sent = "".join(str(e.body) for e in server.log)
    warning = "orchmode: warning: the sandbox is off (--sandbox off)"
    if mode == "off":
        assert warning in result.stderr
        assert SECRET in sent  # unsandboxed, the planted key reaches the model
    else:
        assert warning not in result.stderr
        assert SECRET not in sent


@pytest.mark.slow
def test_run_without_bubblewrap_refuses_in_one_line_before_any_request(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=1))
    args = ["run", "go", "--base-url", server.url, "--sandbox-bwrap", "/nonexistent/bwrap"]
    result = orchmode(*args, cwd=tmp_path, env=cli_env())
    assert result.returncode == 8
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orchmode: the bash sandbox is unavailable: bubblewrap was not")
    assert "apt install bubblewrap" in lines[0] and "--sandbox off" in lines[0]
    assert server.log == []
    off = orchmode(*args, "--sandbox", "off", cwd=tmp_path, env=cli_env())
    assert off.returncode == 0, off.stderr
    assert "orchmode: warning: the sandbox is off" in off.stderr
    assert len(server.log) > 0


_TWO_LOOPS = """
import asyncio, sys
from pathlib import Path
from orchmode.shell.bash import BashSession

async def shell() -> None:
    async with BashSession(Path(sys.argv[1])) as session:
        assert "hi" in (await session.run("echo hi")).output

async def spawn() -> int:
    process = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
    return await process.wait()

asyncio.run(shell())
asyncio.run(shell())  # a second run of orchmode's, on its own loop
own = asyncio.new_event_loop()  # a library's loop, never made current (as Playwright's is)
print(own.run_until_complete(spawn()), asyncio.run(spawn()))
"""


def test_the_child_watcher_orchmode_sets_serves_every_loop_of_the_process(work: Path) -> None:
    """The watcher is the whole process's: after orchmode's shells, another library's loop
    still spawns and reaps (CI: Playwright's failed with "get_child_watcher() is not
    activated" after orchmode's tests had run in the same process)."""
    done = subprocess.run(
        [sys.executable, "-c", _TWO_LOOPS, str(work)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "3"]
