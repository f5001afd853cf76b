"""Sandboxes started ahead: agents find their shell up, never share one, and none outlive
the fan-out."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import StartServer, conversation_for, gateway_for, settings_for, store_for
from orchmode.core.agents import AgentDefinition
from orchmode.core.events import EventBus
from orchmode.core.results import Status
from orchmode.executors import Job
from orchmode.executors.host import AgentHost, ShellFactory
from orchmode.executors.local import LocalExecutor
from orchmode.executors.pool import Pace, Ready, SandboxPool
from orchmode.shell.bash import BashSession
from orchmode.shell.bwrap import probe
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, report, role_of

needs_sandbox = pytest.mark.skipif(
    not probe().ok, reason=f"bubblewrap cannot run here: {probe().problem}"
)

#: Run by every worker and verifier: a shell that an agent before it used has the mark in
#: its private /tmp (a tmpfs per sandboxed shell), and says so.
MARK = (
    "if [ -e /tmp/orchmode-used ]; then echo SHELL-REUSED; "
    "else : > /tmp/orchmode-used; echo SHELL-FRESH; fi"
)


def bash_outputs(server: ScriptedServer) -> list[str]:
    """What each subagent's bash command printed, as its next request carried it."""
    outputs = []
    for entry in server.log:
        if role_of(entry.body) == "main":
            continue
        for message in entry.body["messages"]:
            content = message["content"]
            if message["role"] != "user" or not isinstance(content, list):
                continue
            for block in content:
                if block.get("type") == "tool_result":
                    outputs.append(str(block["content"]))
    return outputs


async def fan_out(
    server: ScriptedServer, tmp_path: Path, **overrides: Any
) -> tuple[AgentHost, int, list[str]]:
    """One orchestrated turn; the host, its shells still idle after the turn, and the
    output of every bash command the shells ran."""
    settings = settings_for(server, tmp_path, **overrides)
    store = SQLiteStore.open(tmp_path / "store.db")
    session = await conversation_for(settings, store=store)
    try:
        await session.turn("check them all")
        assert isinstance(session.executor, LocalExecutor)
        host = session.executor.host
        idle_after = host.pool.idle
    finally:
        await session.close()
        await store.close()
    return host, idle_after, bash_outputs(server)


def processes_mentioning(path: Path) -> list[int]:
    """Live processes whose command line names ``path`` (a sandbox binds the workdir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmdline:
            found.append(int(entry.name))
    return found


@needs_sandbox
@pytest.mark.parametrize("isolation", ["shared", "worktree"])
async def test_later_agents_get_a_started_sandbox_that_no_agent_used_before(
    serve: StartServer, tmp_path: Path, isolation: str
) -> None:
    scenario = OrchestrationScenario(
        subtasks=16,
        scout_command=None,
        worker_command=MARK,
        verifier_command=MARK,
        delay=0.05,
        report_bytes=6000,  # reports the size a real model writes
        verifier_report_bytes=2500,
    )
    window = 200_000
    server = await serve(scenario, context_window=window)
    host, idle_after, outputs = await fan_out(
        server, tmp_path, max_concurrent=3, isolation=isolation, context_window=window
    )
    assert all(e.status == 200 for e in server.log), {e.outcome for e in server.log}

    assert len(outputs) == 32  # 16 workers and 16 verifiers, one command each
    assert all("SHELL-FRESH" in out for out in outputs), outputs
    assert not any("SHELL-REUSED" in out for out in outputs)
    # Agents after the first wave were handed shells started ahead of them ...
    assert host.pool.hits >= 4, (host.pool.hits, host.pool.misses)
    # ... and whatever the pool still held when the fan-out ended was closed then.
    assert idle_after == 0
    assert processes_mentioning(tmp_path) == []
    runs = tmp_path / ".orchmode" / "trees" / "runs"
    assert not runs.exists() or [p for p in runs.rglob("*") if p.is_dir()] == []


async def test_a_shell_that_died_while_it_waited_is_not_handed_out(tmp_path: Path) -> None:
    closed: list[BashSession] = []

    async def discard(ready: Ready) -> None:
        closed.append(ready.shell)
        await ready.shell.close()

    pool = SandboxPool(width=4, gate=asyncio.Semaphore(2), discard=discard)
    pool.refill("shell", lambda: Ready(BashSession(tmp_path)))
    await pool.wait_for_starts()
    assert pool.idle == 2  # the first target, before any pace is known

    first = pool._ready["shell"][0].shell
    assert first.pid is not None
    os.killpg(first.pid, signal.SIGKILL)
    async with asyncio.timeout(10):
        while first.running:  # the child watcher notices the exit
            await asyncio.sleep(0.01)

    taken = pool.take("shell")
    assert taken is not None and taken.shell is not first and taken.shell.running
    result = await taken.shell.run("echo ok")
    assert result.output.strip() == "ok"
    assert pool.take("shell") is None
    await pool.wait_for_starts()
    assert closed == [first]
    assert (pool.hits, pool.misses) == (1, 1)
    await taken.shell.close()
    await pool.drain()


async def test_drain_closes_the_shells_that_no_agent_took(tmp_path: Path) -> None:
    async def discard(ready: Ready) -> None:
        await ready.shell.close()

    pool = SandboxPool(width=3, gate=asyncio.Semaphore(1), discard=discard)
    pool.refill("shell", lambda: Ready(BashSession(tmp_path)))
    pids = []
    await pool.wait_for_starts()
    for queue in pool._ready.values():
        pids += [ready.shell.pid for ready in queue]
    assert len(pids) == 2 and all(pids)
    await pool.drain()
    assert pool.idle == 0
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    pool.refill("shell", lambda: Ready(BashSession(tmp_path)))  # usable again afterwards
    await pool.wait_for_starts()
    assert pool.idle == 2
    await pool.drain()


@given(
    width=st.integers(1, 1000),
    gap=st.floats(0, 10, allow_nan=False),
    spawn=st.floats(0, 10, allow_nan=False),
    more=st.floats(0, 5, allow_nan=False),
)
def test_the_pool_holds_more_the_faster_agents_start_and_the_slower_shells_get_made(
    width: int, gap: float, spawn: float, more: float
) -> None:
    def target(gap: float, spawn: float) -> int:
        pool = SandboxPool(width, asyncio.Semaphore(1), discard=None)  # type: ignore[arg-type]
        pool.arrivals, pool.spawns = Pace(gap), Pace(spawn)
        return pool.target()

    held = target(gap, spawn)
    assert 1 <= held <= width
    assert target(gap, spawn + more) >= held
    assert target(gap + more, spawn) <= held


def test_a_pace_follows_what_it_observes() -> None:
    pace = Pace()
    pace.observe(1.0)
    assert pace.mean == 1.0
    for _ in range(60):
        pace.observe(0.1)
    assert pace.mean is not None and abs(pace.mean - 0.1) < 1e-3
    pace.observe(-5)  # a clock that stepped back counts as no time
    assert pace.mean is not None and 0 <= pace.mean < 0.1


async def test_the_first_waves_burst_does_not_size_the_pool(tmp_path: Path) -> None:
    now = [0.0]
    pool = SandboxPool(
        width=200, gate=asyncio.Semaphore(2), discard=lambda ready: ready.shell.close()
    )
    pool.clock = lambda: now[0]
    for _ in range(200):  # the first wave: all at once, before the pool made anything
        now[0] += 0.0001
        assert pool.take("shell") is None
    assert pool.arrivals.mean is None and pool.target() == 2
    pool.refill("shell", lambda: Ready(BashSession(tmp_path)))
    await pool.wait_for_starts()
    assert pool.idle == 2 and pool.spawns.mean is not None
    taken = []
    for _ in range(2):  # later agents, 50 ms apart: now they set the pace
        now[0] += 0.05
        ready = pool.take("shell")
        assert ready is not None
        taken.append(ready.shell)
    assert pool.arrivals.mean is not None and pool.arrivals.mean >= 0.05
    for shell in taken:
        await shell.close()
    await pool.drain()


@needs_sandbox
@pytest.mark.parametrize(("tools", "bash"), [(("WebSearch",), False), (("Bash",), True)])
async def test_an_agent_whose_role_has_no_bash_starts_no_shell(
    serve: StartServer, tmp_path: Path, tools: tuple[str, ...], bash: bool
) -> None:
    """A sandbox costs a shell's start-up (bubblewrap, its namespaces, the proxy's listener):
    an agent that cannot run bash is not given a started one, nor one from the pool."""
    work = tmp_path / "work"
    work.mkdir()
    seen: list[BashSession] = []

    def respond(request: ScriptedRequest) -> Reply:
        seen.extend(factory.made)  # the agent's shell, held while it runs
        if request.index == 0 and "bash" in request.tool_names:
            return Reply.tool_use("bash", {"command": "true"})
        return report("done", [])

    server = await serve(respond)
    settings = settings_for(server, work)
    factory = ShellFactory.build(settings, work, ())
    host = AgentHost(settings, gateway_for(settings), store_for(tmp_path), factory)
    role = AgentDefinition("role", "", tools, None, None, None, "", work / "role.md")
    job = Job("k1", "me", "s1", "worker", "worker 1.1", "do it", agent=role)
    try:
        result = await host.run(job, EventBus())
        await host.finish_housekeeping()
        assert result.status is Status.FINISHED
        # with bash: its own shell, and the pool's refills for the agents after it
        assert (sum(shell.starts for shell in set(seen)) > 0) is bash
        assert (host.pool.hits, host.pool.misses) == (0, int(bash))
    finally:
        factory.abandon_all()
