"""Tests for orchmode.shell: persistent bash sessions driven by real processes."""

from __future__ import annotations

import asyncio
import os
import shlex
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.shell.bash import BashSession, ShellResult
from orchmode.shell.output import _OutputCollector

# ---------------------------------------------------------------------------- helpers


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name, or None if the PID is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _is_dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper that is not us (it no longer runs)."""
    fields = _proc_stat(pid)
    return fields is None or fields[0] in ("Z", "X")


async def _wait_dead(pid: int, deadline: float = 5.0) -> bool:
    """Poll /proc until ``pid`` is dead or ``deadline`` seconds have passed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while loop.time() < end:
        if _is_dead(pid):
            return True
        await asyncio.sleep(0.02)
    return _is_dead(pid)


async def _wait_file(path: Path, deadline: float = 5.0) -> str:
    """Poll until ``path`` has content (written by a command running in the background)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while loop.time() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


@pytest.fixture
async def session(tmp_path: Path) -> AsyncIterator[BashSession]:
    work = tmp_path / "work"
    work.mkdir()
    sess = BashSession(work, timeout=10)
    try:
        yield sess
    finally:
        await sess.close()


# ------------------------------------------------------------- 1. lazy start, process


async def test_shell_starts_lazily_in_its_own_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_root = tmp_path / "tmproot"
    tmp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_root))
    sess = BashSession(tmp_path)
    assert sess.pid is None
    assert list(tmp_root.iterdir()) == []  # nothing until the first command

    result = await sess.run("echo hi")
    assert result.output == "hi"
    pid = sess.pid
    assert pid is not None
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:3] == [b"--noprofile", b"--norc"]
    assert os.path.isabs(cmdline[0]) and os.path.basename(cmdline[0]) == b"bash"  # not looked up
    fields = _proc_stat(pid)
    assert fields is not None
    assert int(fields[2]) == pid  # process group leader
    assert int(fields[3]) == pid  # session leader
    # The command file lives in a private dir outside cwd.
    (private,) = list(tmp_root.iterdir())
    assert private.name.startswith("orchmode-shell-")
    assert not list(tmp_path.glob("*.sh"))
    await sess.close()
    assert list(tmp_root.iterdir()) == []


async def test_unused_session_closes_without_starting_anything(tmp_path: Path) -> None:
    sess = BashSession(tmp_path)
    await sess.close()
    await sess.close()
    assert sess.pid is None


async def test_argv_prefix_wraps_bash(tmp_path: Path) -> None:
    async with BashSession(tmp_path, argv_prefix=["env", "ORCHMODE_PREFIXED=yes"]) as sess:
        result = await sess.run("echo $ORCHMODE_PREFIXED")
    assert result.output == "yes"


async def test_env_replaces_the_environment(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "ORCHMODE_ONLY": "42"}
    async with BashSession(tmp_path, env=env) as sess:
        result = await sess.run("echo $ORCHMODE_ONLY; echo ${HOME:-nohome}")
    assert result.output == "42\nnohome"


async def test_unstartable_shell_is_an_error_result(tmp_path: Path) -> None:
    async with BashSession(tmp_path / "missing") as sess:
        result = await sess.run("echo hi")
    assert result.is_error
    assert "could not start the shell" in result.output
    async with BashSession(tmp_path, argv_prefix=["/nonexistent/wrapper"]) as sess:
        result = await sess.run("echo hi")
    assert result.is_error
    assert "could not start the shell" in result.output


def test_constructor_rejects_nonsense_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        BashSession(tmp_path, timeout=0)
    with pytest.raises(ValueError):
        BashSession(tmp_path, output_limit=0)


# ------------------------------------------------------------------- 2. persistence


async def test_cwd_env_variables_and_functions_persist(
    session: BashSession, tmp_path: Path
) -> None:
    sub = tmp_path / "work" / "sub"
    sub.mkdir()
    assert not (await session.run("cd sub")).is_error
    assert not (await session.run("export GREETING=hello; plain=world")).is_error
    assert not (await session.run('shout() { echo "$1!"; }')).is_error
    result = await session.run('pwd; echo "$GREETING $plain"; shout hey; bash -c "echo $GREETING"')
    assert result.output.splitlines() == [str(sub), "hello world", "hey!", "hello"]


async def test_stderr_is_merged_and_multiline_commands_work(session: BashSession) -> None:
    result = await session.run("echo out\necho err >&2\ncat <<'EOF'\nheredoc line\nEOF")
    assert result.output == "out\nerr\nheredoc line"


async def test_syntax_error_keeps_the_shell(session: BashSession) -> None:
    await session.run("keep=1")
    pid = session.pid
    result = await session.run("if then")
    assert result.is_error
    assert result.exit_code == 2
    assert "syntax error" in result.output
    after = await session.run("echo $keep")
    assert after.output == "1"
    assert session.pid == pid


async def test_xtrace_does_not_confuse_the_end_marker(session: BashSession) -> None:
    result = await session.run("set -x; echo traced")
    assert not result.is_error
    assert "traced" in result.output
    assert (await session.run("set +x; echo after")).output.endswith("after")
    assert (await session.run("echo clean")).output == "clean"


@pytest.mark.timeout(20)
async def test_redirecting_the_shells_own_output_does_not_break_the_session(
    session: BashSession,
) -> None:
    hidden = await session.run("exec >/dev/null 2>&1; echo hidden")
    assert not hidden.timed_out
    assert hidden.output == "(no output)"
    closed = await session.run("exec 1>&- 2>&-; echo gone")
    assert not closed.timed_out
    assert (await session.run("echo visible; echo err >&2")).output == "visible\nerr"


async def test_odd_unicode_in_the_command_does_not_crash(session: BashSession) -> None:
    result = await session.run("echo 'a\ud800b é 日本'")
    assert not result.is_error
    assert result.output.startswith("a")
    assert result.output.endswith("é 日本")


# ------------------------------------------------------------------- 3. stdin


@pytest.mark.timeout(20)
async def test_stdin_is_dev_null(session: BashSession) -> None:
    assert (await session.run("cat")).output == "(no output)"
    assert (await session.run("read x; echo rc=$?")).output == "rc=1"
    result = await session.run("python3 -c 'input()'")
    assert result.exit_code == 1
    assert "EOFError" in result.output
    assert not result.timed_out


# -------------------------------------------------------------------- 4. timeout


@pytest.mark.timeout(30)
async def test_timeout_kills_the_whole_group_and_resets(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    async with BashSession(tmp_path, timeout=0.5) as sess:
        await sess.run("cd /; export STALE=1")
        shell_pid = sess.pid
        assert shell_pid is not None
        result = await sess.run(f"sleep 1000 & echo $! > {pidfile}; echo started; sleep 5")
        assert result.timed_out
        assert result.is_error
        assert result.exit_code is None
        assert result.output.startswith("(timed out after 0.5 s; the shell was restarted")
        assert "started" in result.output
        assert 0.5 <= result.duration < 4
        bg_pid = int(pidfile.read_text())
        assert await _wait_dead(bg_pid)
        assert await _wait_dead(shell_pid)

        after = await sess.run("pwd; echo ${STALE:-unset}")
        assert after.output == f"{tmp_path}\nunset"
        assert not after.is_error
        assert sess.pid != shell_pid


@pytest.mark.timeout(30)
async def test_timeout_also_kills_children_that_left_the_process_group(
    tmp_path: Path,
) -> None:
    # `timeout` puts itself in a new process group; it is still in the shell's session.
    pidfile = tmp_path / "bg.pid"
    async with BashSession(tmp_path, timeout=0.5) as sess:
        result = await sess.run(f"timeout 1000 sleep 1000 & echo $! > {pidfile}; sleep 5")
        assert result.timed_out
        assert await _wait_dead(int(pidfile.read_text()))


@pytest.mark.timeout(30)
async def test_output_flood_until_timeout_stays_bounded(tmp_path: Path) -> None:
    async with BashSession(tmp_path, timeout=1, output_limit=100) as sess:
        result = await sess.run("yes")
        assert result.timed_out
        assert "[output truncated: 100 of " in result.output
        assert len(result.output) < 400
        assert (await sess.run("echo alive")).output == "alive"


# --------------------------------------------------------------- 5. shell exits


@pytest.mark.timeout(30)
async def test_exit_reports_code_and_next_call_gets_fresh_shell(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    async with BashSession(tmp_path, timeout=10) as sess:
        await sess.run("cd /; x=1")
        result = await sess.run(f"echo bye; sleep 1000 & echo $! > {pidfile}; exit 3")
        assert result.exit_code == 3
        assert result.is_error
        assert not result.timed_out
        assert result.output.startswith("(exit code 3)\n")
        assert "fresh shell" in result.output
        assert result.output.endswith("bye")
        assert result.duration < 5  # the orphaned sleep did not keep us waiting
        assert await _wait_dead(int(pidfile.read_text()))
        after = await sess.run("pwd; echo ${x:-unset}")
        assert after.output == f"{tmp_path}\nunset"


async def test_exit_zero_is_not_an_error_but_is_reported(session: BashSession) -> None:
    result = await session.run("exit")
    assert result.exit_code == 0
    assert not result.is_error
    assert "fresh shell" in result.output
    assert (await session.run("echo back")).output == "back"


async def test_shell_killed_by_signal(session: BashSession) -> None:
    result = await session.run("kill -9 $$")
    assert result.is_error
    assert result.exit_code == 137
    assert "SIGKILL" in result.output
    assert (await session.run("echo back")).output == "back"


async def test_shell_dying_between_commands_is_noticed(session: BashSession) -> None:
    await session.run("true")
    pid = session.pid
    assert pid is not None
    os.kill(pid, 9)
    assert await _wait_dead(pid)
    result = await session.run("echo fresh")
    assert "previous shell had exited" in result.output
    assert result.output.endswith("fresh")
    assert not result.is_error


async def test_a_shell_killed_before_the_loop_hears_of_it_is_noticed(
    session: BashSession,
) -> None:
    """The next command comes before the event loop has polled the dead shell's pipes: the
    kernel's word is taken, not the loop's, so the command runs in a fresh shell."""
    await session.run("true")
    pid = session.pid
    assert pid is not None
    os.kill(pid, 9)
    deadline = time.monotonic() + 5
    while not _is_dead(pid):  # without yielding to the loop, on purpose
        assert time.monotonic() < deadline
    result = await session.run("echo fresh")
    assert "previous shell had exited" in result.output, result.output
    assert result.output.endswith("fresh")


# -------------------------------------------------------------------- 6. output


async def test_output_formatting(tmp_path: Path) -> None:
    async with BashSession(tmp_path, output_limit=10) as sess:
        assert (await sess.run("true")).output == "(no output)"
        assert (await sess.run("printf '  \\n\\n'")).output == "(no output)"
        assert (await sess.run("printf 'no newline'")).output == "no newline"
        assert (await sess.run("printf '\\n\\n  padded  \\n\\n'")).output == "padded"
        assert (await sess.run("printf '0123456789'")).output == "0123456789"
        result = await sess.run("seq 1 100")
        expected = "\n".join(str(n) for n in range(1, 101))
        assert result.output == (
            f"{expected[:10]}\n… [output truncated: 10 of {len(expected)} characters shown]"
        )
        assert not result.is_error


async def test_binary_output_is_replaced_not_fatal(tmp_path: Path) -> None:
    async with BashSession(tmp_path, output_limit=500) as sess:
        result = await sess.run("head -c 100000 /dev/urandom")
        assert not result.is_error
        assert len(result.output) < 700
        invalid = await sess.run(r"printf 'a\xff\xfeb'")
        assert invalid.output == "a\ufffd\ufffdb"


async def test_large_output_count_is_exact(tmp_path: Path) -> None:
    async with BashSession(tmp_path, output_limit=50) as sess:
        result = await sess.run("seq 1 200000")
    expected = "\n".join(str(n) for n in range(1, 200001))
    assert result.output == (
        f"{expected[:50]}\n… [output truncated: 50 of {len(expected)} characters shown]"
    )


def test_collector_finds_marker_split_across_chunks() -> None:
    marker = b"\nabcdef0123456789 "
    stream = "héllo wörld\n".encode() + marker + b"7\nafter"
    for size in (1, 2, 3, 5, len(marker) - 1, len(marker), 64):
        collector = _OutputCollector(marker, limit=100)
        done = False
        for i in range(0, len(stream), size):
            done = collector.feed(stream[i : i + size])
        assert done
        assert collector.status == 7
        assert collector.leftover == b"after"
        assert collector.render() == "héllo wörld"


def test_collector_ignores_marker_lookalikes() -> None:
    marker = b"\nNONCE "
    collector = _OutputCollector(marker, limit=100)
    assert not collector.feed(b"x\nNONCE notdigits\n")
    assert not collector.feed(b"\nNONCE " + b"9" * 40 + b"\n")
    assert collector.feed(b"\nNONCE 0\n")
    assert collector.status == 0
    assert collector.render() == "x\nNONCE notdigits\n\nNONCE " + "9" * 40


def test_collector_memory_stays_bounded_on_a_flood() -> None:
    marker = b"\n0123456789abcdef0123456789abcdef "
    collector = _OutputCollector(marker, limit=1000)
    chunk = b"y\n" * 32768
    for _ in range(800):  # ~52 MB
        assert not collector.feed(chunk)
        assert collector.held_chars <= 1000
        assert collector.held_bytes < len(marker)
    assert not collector.feed(marker[:5])
    assert collector.feed(marker[5:] + b"0\n")
    total = len(chunk) * 800 - 1  # the final newline is trailing whitespace
    assert collector.render().endswith(f"[output truncated: 1000 of {total} characters shown]")


def test_collector_leading_whitespace_does_not_use_the_budget() -> None:
    marker = b"\nM "
    collector = _OutputCollector(marker, limit=5)
    collector.feed(b" \n" * 100000 + "\u3000\u3000".encode() + b"abc")
    assert collector.feed(b"\nM 0\n")
    assert collector.render() == "abc"


# ---------------------------------------------------------------------- 7. exit codes


async def test_exit_code_prefix(session: BashSession) -> None:
    ok = await session.run("echo fine")
    assert ok == ShellResult(ok.output, False, 0, False, ok.duration)
    assert ok.output == "fine"
    bad = await session.run("echo oops; false")
    assert bad.is_error
    assert bad.exit_code == 1
    assert bad.output == "(exit code 1)\noops"
    quiet = await session.run("(exit 42)")
    assert quiet.output == "(exit code 42)\n(no output)"


# ------------------------------------------------------------ 8. input validation


@pytest.mark.parametrize("command", [None, "", "   \n\t"])
async def test_empty_command_is_an_error_and_starts_nothing(
    tmp_path: Path, command: str | None
) -> None:
    sess = BashSession(tmp_path)
    result = await sess.run(command)
    assert result.is_error
    assert result.exit_code is None
    assert "command is required" in result.output
    assert sess.pid is None
    await sess.close()


@pytest.mark.parametrize(
    ("tool_input", "fragment"),
    [
        ({}, "no 'command'"),
        ("ls", "must be a JSON object"),
        (None, "must be a JSON object"),
        (["ls"], "must be a JSON object"),
        ({"command": 5}, "'command' must be a string"),
        ({"command": None}, "no 'command'"),
        ({"command": ""}, "command is required"),
        ({"restart": False}, "no 'command'"),
        ({"restart": "yes"}, "'restart' must be true or false"),
        ({"command": "ls", "restart": True}, "not both"),
    ],
)
async def test_handle_rejects_malformed_input(
    tmp_path: Path, tool_input: object, fragment: str
) -> None:
    sess = BashSession(tmp_path)
    result = await sess.handle(tool_input)
    assert result.is_error
    assert fragment in result.output
    assert sess.pid is None
    await sess.close()


async def test_handle_runs_and_restarts(session: BashSession, tmp_path: Path) -> None:
    ran = await session.handle({"command": "cd / && x=1 && pwd", "restart": False})
    assert ran.output == "/"
    old_pid = session.pid
    assert old_pid is not None
    restarted = await session.handle({"restart": True})
    assert restarted.output == "shell restarted"
    assert not restarted.is_error
    assert await _wait_dead(old_pid)
    after = await session.handle({"command": "pwd; echo ${x:-unset}"})
    assert after.output == f"{tmp_path / 'work'}\nunset"


# --------------------------------------------------------------- 9. concurrency


async def test_calls_on_one_session_run_in_order(session: BashSession) -> None:
    first, second = await asyncio.gather(
        session.run("x=1; sleep 0.2; echo first"),
        session.run("echo second ${x:-unset}"),
    )
    assert first.output == "first"
    assert second.output == "second 1"


@pytest.mark.timeout(60)
async def test_twenty_sessions_in_parallel(tmp_path: Path) -> None:
    dirs = []
    for i in range(20):
        d = tmp_path / f"d{i}"
        d.mkdir()
        dirs.append(d)
    sessions = [BashSession(tmp_path, timeout=30) for _ in range(20)]
    try:
        await asyncio.gather(*(s.run(f"cd d{i}; n={i}") for i, s in enumerate(sessions)))
        results = await asyncio.gather(*(s.run('pwd; echo "$n"') for s in sessions))
        assert [r.output for r in results] == [f"{d}\n{i}" for i, d in enumerate(dirs)]
        assert len({s.pid for s in sessions}) == 20
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


@pytest.mark.timeout(30)
async def test_event_loop_is_not_blocked_while_a_command_runs(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    async with BashSession(tmp_path, timeout=10) as waiter, BashSession(tmp_path) as other:
        # The first command can only finish once the second session has run.
        slow = asyncio.create_task(
            waiter.run(f"while [ ! -e {flag} ]; do sleep 0.01; done; echo released")
        )
        assert (await other.run(f"touch {flag}; echo touched")).output == "touched"
        result = await slow
        assert result.output == "released"
        assert not result.timed_out


# --------------------------------------------------------------------- 10. close


@pytest.mark.timeout(30)
async def test_close_kills_background_children_and_session_is_reusable(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "bg.pid"
    sess = BashSession(tmp_path)
    await sess.run(f"sleep 1000 & echo $! > {pidfile}")
    shell_pid = sess.pid
    assert shell_pid is not None
    bg_pid = int(pidfile.read_text())
    assert not _is_dead(bg_pid)
    await sess.close()
    assert await _wait_dead(bg_pid)
    assert await _wait_dead(shell_pid)
    assert sess.pid is None
    await sess.close()  # idempotent
    again = await sess.run("echo again")
    assert again.output == "again"
    await sess.close()


@pytest.mark.timeout(30)
async def test_close_during_a_command_ends_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "fg.pid"
    sess = BashSession(tmp_path, timeout=60)
    task = asyncio.create_task(sess.run(f"sleep 1000 & echo $! > {pidfile}; wait"))
    bg_pid = int(await _wait_file(pidfile))
    await sess.close()
    result = await task
    assert result.is_error
    assert not result.timed_out
    assert await _wait_dead(bg_pid)


@pytest.mark.timeout(30)
async def test_cancelled_run_kills_the_shell(tmp_path: Path) -> None:
    pidfile = tmp_path / "fg.pid"
    async with BashSession(tmp_path, timeout=60) as sess:
        task = asyncio.create_task(sess.run(f"sleep 1000 & echo $! > {pidfile}; wait"))
        bg_pid = int(await _wait_file(pidfile))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _wait_dead(bg_pid)
        assert (await sess.run("echo next")).output == "next"


# ---------------------------------------------------------------------- property


_LIMIT = 40
_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    max_size=4 * _LIMIT,
)


@settings(max_examples=40, deadline=None)
@given(s=_text)
def test_printf_round_trips_any_text(s: str) -> None:
    async def go() -> ShellResult:
        async with BashSession(tempfile.gettempdir(), output_limit=_LIMIT) as sess:
            return await sess.run("printf '%s' " + shlex.quote(s))

    result = asyncio.run(go())
    assert not result.is_error
    expected = s.strip()
    if not expected:
        assert result.output == "(no output)"
    elif len(expected) <= _LIMIT:
        assert result.output == expected
    else:
        assert result.output == (
            f"{expected[:_LIMIT]}\n… [output truncated: {_LIMIT} of {len(expected)} "
            "characters shown]"
        )


async def test_a_start_that_comes_after_close_starts_nothing(tmp_path: Path) -> None:
    shell = BashSession(tmp_path)
    await shell.close()
    await shell.start()  # a prewarm that lost the race with the end of its agent
    assert shell.pid is None
