"""An agent cannot fill the disk, and a file too big for a patch costs nothing but itself.

Real workers (the scripted model, the real sandbox, real overlays and git) write real files
past ``agent_write_mb``, past ``change_file_max_mb`` and down to ``min_free_disk_mb``; the
kernel's ``RLIMIT_FSIZE`` and the write watch stop them, and the rest of the run goes on.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import StartServer
from orchmode.core.results import AgentResult, Change, Status
from orchmode.core.settings import Settings
from orchmode.executors.host import ShellFactory
from orchmode.fanout.changes import left_out_note
from orchmode.shell.bash import BashSession
from orchmode.shell.bwrap import probe
from orchmode.shell.policy import SandboxPolicy
from orchmode.shell.sandbox import Sandbox
from orchmode.store.schema import result_of, result_row
from orchmode.testing.replies import Reply, ScriptedRequest
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of, tool_call
from orchmode.trees.limits import MB, DiskLimits, WriteWatch, left_out_of, written_size
from orchmode.views.progress import change_text
from support.store_faults import FaultUnavailable, tmpfs
from test_isolation import command_of, editing, nothing_left, repo, run, tool_result_text
from test_script import started

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _bubblewrap_works() -> None:
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)


def worker_line(result: str, index: int) -> str:
    """The part of the Workflow result that is subtask ``index``'s worker's."""
    found = re.search(rf"(?ms)^\[agent {index}: .*?(?=^\[verify|^\[change|\Z)", result)
    assert found is not None, result
    return found.group(0)


def change_line(result: str, index: int) -> str:
    found = re.search(rf"(?m)^\[change {index}\].*$", result)
    assert found is not None, result
    return found.group(0)


def written_mb(text: str) -> float:
    found = re.search(r"it wrote ([\d.]+) MB in its workspace", text)
    assert found is not None, text
    return float(found.group(1))


# ------------------------------------------------------------------------ the write cap


def tool_outputs(server: object) -> list[str]:
    """Every tool result the scripted model was sent, in order."""
    return [
        str(block.get("content"))
        for e in server.log  # type: ignore[attr-defined]
        for m in e.body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    ]


@pytest.mark.parametrize("workspaces", ["auto", "copy"])
async def test_one_file_past_agent_write_mb_is_cut_at_it_and_the_worker_still_reports(
    serve: StartServer, tmp_path: Path, workspaces: str
) -> None:
    """The kernel stops the file at the cap ("File size limit exceeded"): the agent is
    told, is not past the cap, and reports; the file, over change_file_max_mb, is left out
    of its change and named with its size and the limit."""
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        "Fill $ head -c 200M /dev/zero > big.bin; echo status=$?; stat -c %s big.bin",
        "Note $ echo ok > ok.txt",
    ]
    server = await serve(editing(subtasks))
    settled, _ = await run(
        server, tmp_path, workdir, agent_write_mb=64, change_file_max_mb=8, workspaces=workspaces
    )
    result = tool_result_text(server)
    assert [(e.index, e.fate) for e in settled] == [(1, "no change"), (2, "merged")], result
    assert "big.bin (64.0 MB, over change_file_max_mb = 8)" in settled[0].left_out
    assert "stopped this agent" not in result
    assert '"summary": "Finished: Fill' in worker_line(result, 1)
    line = change_line(result, 1)
    assert line.startswith("[change 1] no change; left out of the change as too big")
    assert "big.bin (64.0 MB, over change_file_max_mb = 8)" in line
    assert (workdir / "ok.txt").read_text() == "ok\n"
    assert not (workdir / "big.bin").exists()
    seen = next(o for o in tool_outputs(server) if "status=" in o)
    assert "status=153" in seen and str(64 * MiB) in seen, seen
    nothing_left(workdir)


@pytest.mark.parametrize("workspaces", ["auto", "copy"])
async def test_a_worker_past_agent_write_mb_is_stopped_told_and_its_report_says_so(
    serve: StartServer, tmp_path: Path, workspaces: str
) -> None:
    """Past the cap its shell is stopped; it is told it may only report, and does: its
    report opens with why it was stopped, and its change (below the limits) is verified
    and merged as any; the others' changes are merged."""
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        "Fill $ echo fixed > fixed.txt; head -c 200M /dev/zero > big.bin; echo more",
        "Note $ echo ok > ok.txt",
    ]
    server = await serve(editing(subtasks))
    settled, _ = await run(
        server, tmp_path, workdir, agent_write_mb=64, change_file_max_mb=8, workspaces=workspaces
    )
    result = tool_result_text(server)
    assert [(e.index, e.fate) for e in settled] == [(1, "merged"), (2, "merged")], result
    why = "orchmode stopped this agent: it wrote 64.0 MB in its workspace, past agent_write_mb (64)"
    assert f'"summary": "[{why}] Finished: Fill' in worker_line(result, 1)
    told = next(o for o in tool_outputs(server) if "more" in o)
    assert why in told and "call report_findings now" in told
    assert "big.bin (64.0 MB, over change_file_max_mb = 8)" in change_line(result, 1)
    verifier = next(p for p in started(server, "verifier") if "Fill" in p)
    assert why in verifier  # the verifier judges the change knowing it was cut short
    assert (workdir / "fixed.txt").read_text() == "fixed\n"
    assert (workdir / "ok.txt").read_text() == "ok\n"
    assert not (workdir / "big.bin").exists()
    nothing_left(workdir)


@dataclass
class Stubborn(OrchestrationScenario):
    """Workers whose subtask says ``STUBBORN`` run a second command, and a third, instead
    of reporting once they are told they were stopped."""

    def worker(self, request: ScriptedRequest) -> Reply:
        subtask = first_user_text(request)
        steps = sum(1 for m in request.messages if m.get("role") == "assistant")
        if "STUBBORN" in subtask and 0 < steps < 3:
            return tool_call("bash", {"command": f"echo again > again{steps}.txt"})
        return super().worker(request)


async def test_a_stopped_worker_that_does_not_report_ends_failed_and_its_change_is_not_merged(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        "Fill STUBBORN $ echo fixed > fixed.txt; head -c 100M /dev/zero > big.bin",
        "Note $ echo ok > ok.txt",
    ]
    server = await serve(Stubborn(subtasks=subtasks, scout_command=None, worker_command=command_of))
    settled, _ = await run(server, tmp_path, workdir, agent_write_mb=64, change_file_max_mb=8)
    result = tool_result_text(server)
    worker = worker_line(result, 1)
    assert worker.splitlines()[1] == (
        "[orchmode stopped this agent: it wrote 64.0 MB in its workspace, past agent_write_mb "
        "(64). It was stopped before it called report_findings]"
    )
    assert [(e.index, e.fate) for e in settled] == [(1, "not merged"), (2, "merged")]
    line = change_line(result, 1)
    assert "not merged (the agent did not finish): 1 file (+1 −0): fixed.txt" in line
    assert "its patch is kept at" in line and "big.bin (64.0 MB" in line
    patch = Path(settled[0].path).read_text()
    assert "fixed.txt" in patch and "again" not in patch  # its later command never ran
    # told once; its next call ended the run: no third request
    requests = [e for e in server.log if "STUBBORN" in str(e.body["messages"][0]["content"])]
    assert len([e for e in requests if role_of(e.body) == "worker"]) == 2
    assert not (workdir / "fixed.txt").exists() and (workdir / "ok.txt").exists()
    nothing_left(workdir)


def test_the_files_left_out_of_a_change_are_kept_with_it_in_the_journal() -> None:
    change = Change("abc", "patch", ("big.bin (3.0 GB, over change_file_max_mb = 100)",))
    row = result_row("k", "worker", "p", AgentResult("r", Status.FINISHED, change=change), 0.0)
    back = result_of(("r", 1, 0, 0, 0, 0, row[-1]))
    assert back.change is not None and back.change.left_out == change.left_out
    plain = result_row(
        "k", "worker", "p", AgentResult("r", Status.FINISHED, change=Change("a", "")), 0
    )
    assert "left_out" not in str(plain[-1])


async def test_many_small_files_adding_up_past_agent_write_mb_trip_the_watch_mid_command(
    serve: StartServer, tmp_path: Path
) -> None:
    """Each file is far below every per-file limit; together they pass the cap, and the
    watch stops the command while it runs, near the cap (not after 400 MB)."""
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        "Fill $ for i in $(seq 1 400); do head -c 1M /dev/zero > f$i.bin; done; echo finished",
        "Note $ echo ok > ok.txt",
    ]
    server = await serve(editing(subtasks))
    settled, _ = await run(server, tmp_path, workdir, agent_write_mb=64)
    result = tool_result_text(server)
    worker = worker_line(result, 1)
    assert "orchmode stopped this agent" in worker and "past agent_write_mb (64)" in worker
    assert 64 < written_mb(worker) < 200, worker
    told = next(o for o in tool_outputs(server) if "stopped this agent" in o)
    assert "the command was stopped" in told and "finished" not in told, told
    assert (workdir / "ok.txt").read_text() == "ok\n"
    assert [(e.index, e.fate) for e in settled] == [(1, "merged"), (2, "merged")]
    assert 64 <= len(list(workdir.glob("f*.bin"))) < 200
    nothing_left(workdir)


# ---------------------------------------------------------------- a file too big for a patch


@pytest.mark.parametrize("workspaces", ["auto", "copy"])
async def test_a_file_over_change_file_max_mb_is_left_out_named_and_the_report_kept(
    serve: StartServer, tmp_path: Path, workspaces: str
) -> None:
    """Below the write cap, above the per-file limit: the worker finishes and is verified,
    its report is kept, the rest of its change merged; a tracked file it blew up keeps its
    old content; the files left out are named with their sizes and the limit."""
    workdir = repo(tmp_path / "work", {"README": "x\n", "data.bin": "small\n"})
    subtasks = [
        "Build $ echo fix > fix.txt && head -c 20M /dev/urandom > new.bin && "
        "head -c 12M /dev/urandom > data.bin && ln -s fix.txt link",
    ]
    server = await serve(editing(subtasks))
    settled, _ = await run(
        server, tmp_path, workdir, agent_write_mb=64, change_file_max_mb=8, workspaces=workspaces
    )
    assert [e.fate for e in settled] == ["merged"]
    result = tool_result_text(server)
    worker = worker_line(result, 1)
    assert "error" not in worker.lower() and "stopped" not in worker, worker
    line = change_line(result, 1)
    assert "new.bin (20.0 MB, over change_file_max_mb = 8)" in line, line
    assert "data.bin (12.0 MB, over change_file_max_mb = 8)" in line, line
    assert "left out of the change as too big for a patch" in line
    # the user is told too: the event the live view, the plain lines and `show` read
    assert "new.bin (20.0 MB, over change_file_max_mb = 8)" in settled[0].left_out
    assert "left out as too big for a patch: " in change_text(settled[0])
    (verifier,) = started(server, "verifier")
    assert "Left out of the change as too big for a patch" in verifier
    assert "new.bin (20.0 MB, over change_file_max_mb = 8)" in verifier
    assert (workdir / "fix.txt").read_text() == "fix\n"
    assert os.readlink(workdir / "link") == "fix.txt"
    assert (workdir / "data.bin").read_text() == "small\n"
    assert not (workdir / "new.bin").exists()
    nothing_left(workdir)


async def test_a_change_of_only_a_file_too_big_says_so_and_costs_nothing_else(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = ["Dump $ head -c 10M /dev/zero > dump.bin", "Note $ echo ok > ok.txt"]
    server = await serve(editing(subtasks))
    settled, _ = await run(server, tmp_path, workdir, change_file_max_mb=4)
    result = tool_result_text(server)
    assert "[change 1] no change; left out of the change as too big for a patch" in result
    assert "dump.bin (10.0 MB, over change_file_max_mb = 4)" in change_line(result, 1)
    assert [(e.index, e.fate) for e in settled] == [(1, "no change"), (2, "merged")]
    assert "dump.bin (10.0 MB, over change_file_max_mb = 4)" in settled[0].left_out
    assert settled[1].left_out == ""
    assert (workdir / "ok.txt").exists() and not (workdir / "dump.bin").exists()


@given(
    st.dictionaries(st.text(min_size=1, max_size=8), st.integers(0, 40 * MB), max_size=30),
    st.integers(1, 8),
)
def test_left_out_files_are_exactly_those_too_big_alone_then_the_largest_past_the_total(
    sizes: dict[str, int], limit_mb: int
) -> None:
    limits = DiskLimits(change_file=limit_mb * MB)
    out = left_out_of(sizes, limits)
    kept = {p: s for p, s in sizes.items() if p not in out}
    assert all(size <= limits.change_file for size in kept.values())
    assert all(sizes[p] > limits.change_file for p in out if "in all" not in out[p])
    assert sum(kept.values()) <= limits.change_total
    # nothing is left out for the total that a kept file is larger than
    for_total = [sizes[p] for p in out if "in all" in out[p]]
    if for_total:
        assert max(kept.values(), default=0) <= min(for_total)
        assert sum(kept.values()) + min(for_total) > limits.change_total
    for path, why in out.items():
        assert why.startswith(path) or "\\" in why  # named (control characters escaped)


def test_a_left_out_note_is_kept_with_the_change_but_does_not_change_its_identity() -> None:
    change = Change("abc", "", ("big.bin (3.0 GB, over change_file_max_mb = 100)",))
    assert change == Change("abc", "") and change.digest == Change("abc", "").digest
    assert left_out_note(change).endswith("big.bin (3.0 GB, over change_file_max_mb = 100)")
    assert left_out_note(Change("abc", "")) == ""


# ---------------------------------------------------------------------- the free-disk floor


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A repository whose `.orchmode/` (the journal, the store and every workspace) is a
    96 MB tmpfs."""
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    try:
        mounted = tmpfs(workdir / ".orchmode", 96 * MiB)
        mounted.__enter__()
    except FaultUnavailable as exc:
        pytest.skip(f"cannot mount a small disk here: {exc}")
    try:
        yield workdir
    finally:
        mounted.__exit__(None, None, None)


async def test_a_worker_filling_the_disk_is_stopped_at_min_free_disk_mb(
    serve: StartServer, tmp_path: Path, small_disk: Path
) -> None:
    workdir = small_disk
    # about 100 MB a second, as a build writes: the watch looks every 50 ms near the floor
    subtasks = ["Fill $ for i in $(seq 1 90); do head -c 1M /dev/zero > f$i.bin; sleep 0.01; done"]
    server = await serve(editing(subtasks))
    await run(server, tmp_path, workdir, min_free_disk_mb=40, agent_write_mb=1024)
    worker = worker_line(tool_result_text(server), 1)
    found = re.search(
        r"orchmode stopped this agent: the disk holding its workspace has ([\d.]+) MB free, "
        r"below min_free_disk_mb \(40\)",
        worker,
    )
    assert found is not None, worker
    assert 20 < float(found.group(1)) < 40, worker
    # it reported, and what it wrote before the floor was verified and merged as any change
    assert 20 < len(list(workdir.glob("f*.bin"))) < 90
    nothing_left(workdir)


async def test_below_the_floor_no_writing_agent_runs_a_command_and_the_main_agent_is_told(
    serve: StartServer, tmp_path: Path, small_disk: Path
) -> None:
    workdir = small_disk
    subtasks = ["Note $ echo ok > ok.txt"]
    server = await serve(editing(subtasks))
    _, session = await run(server, tmp_path, workdir, min_free_disk_mb=200)
    worker = worker_line(tool_result_text(server), 1)
    assert "the disk holding its workspace has" in worker and "min_free_disk_mb (200)" in worker
    assert not (workdir / "ok.txt").exists()
    # the main agent's shell (in the working directory, on the big disk) still works; on
    # a disk below the floor it would not run a command
    main = session.make_shell()
    try:
        done = await main.run("echo hello")
    finally:
        await main.close()
    assert done.output.strip() == "hello"
    settings = Settings(workdir=workdir, min_free_disk_mb=200)
    factory = ShellFactory.build(settings, workdir / ".orchmode", ())
    refused = factory()
    try:
        done = await refused.run("echo hello > there.txt")
    finally:
        await refused.close()
    assert done.is_error and "the command was not run" in done.output
    assert "below min_free_disk_mb (200)" in done.output
    assert not (workdir / ".orchmode" / "there.txt").exists()


async def test_in_shared_isolation_a_worker_below_the_floor_is_stopped_before_it_writes(
    serve: StartServer, tmp_path: Path
) -> None:
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    free = os.statvfs(workdir).f_bavail * os.statvfs(workdir).f_frsize
    floor = free // MiB + 1024  # a gigabyte more than this disk has free
    server = await serve(editing(["Note $ echo ok > ok.txt"]))
    await run(server, tmp_path, workdir, isolation="shared", min_free_disk_mb=floor)
    worker = worker_line(tool_result_text(server), 1)
    assert (
        "[orchmode stopped this agent: the disk holding the working directory has" in worker
        and f"below min_free_disk_mb ({floor})" in worker
    ), worker
    assert not (workdir / "ok.txt").exists()


async def test_a_command_running_when_the_disk_passes_the_floor_is_stopped(
    tmp_path: Path, small_disk: Path
) -> None:
    """The main agent's shell: its command is stopped as the disk fills, and says why."""
    place = small_disk / ".orchmode" / "scratch"
    place.mkdir()
    settings = Settings(workdir=place, min_free_disk_mb=40)
    shell = ShellFactory.build(settings, place, ())()
    try:
        started = time.monotonic()
        done = await shell.run(
            "for i in $(seq 1 90); do head -c 1M /dev/zero > f$i; sleep 0.02; done; echo all"
        )
        after = await shell.run("echo next")
    finally:
        await shell.close()
    assert "below min_free_disk_mb (40)" in done.output and "all" not in done.output
    assert time.monotonic() - started < 30
    assert "below min_free_disk_mb (40)" in after.output  # still below: not run
    assert written_size(place) < 90 * MiB
    free = os.statvfs(place)
    assert free.f_bavail * free.f_frsize > 8 * MiB  # the disk was never filled


# ----------------------------------------------------------------- the kernel's file cap


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_limits_script_sets_rlimit_fsize_to_agent_write_mb_in_sh_and_in_bash(
    shell: str, tmp_path: Path
) -> None:
    policy = SandboxPolicy("workspace-write", tmp_path, file_mb=3)
    script = policy.limits_script(cgroup_pids=True, cgroup_memory=True)
    shown = subprocess.run(
        [shell, "-c", script, "x", "cat", "/proc/self/limits"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    fsize = next(line for line in shown.splitlines() if line.startswith("Max file size"))
    assert fsize.split()[3:5] == [str(3 * MiB), str(3 * MiB)], fsize
    core = next(line for line in shown.splitlines() if line.startswith("Max core file size"))
    assert core.split()[4:6] == ["0", "0"], core


async def test_in_the_sandbox_no_process_writes_a_file_past_agent_write_mb(
    tmp_path: Path,
) -> None:
    settings = Settings(workdir=tmp_path, agent_write_mb=4)
    shell = BashSession(tmp_path, sandbox=Sandbox.from_settings(settings, tmp_path).for_shell())  # type: ignore[union-attr]
    try:
        cut = await shell.run("head -c 10M /dev/zero > a.bin")
        python = await shell.run(
            "python3 -c \"open('b.bin', 'wb').write(bytes(10 << 20))\"; echo rc=$?"
        )
    finally:
        await shell.close()
    assert cut.exit_code == 153 and "agent_write_mb" in cut.output, cut.output
    assert "File too large" in python.output and "rc=1" in python.output
    assert (tmp_path / "a.bin").stat().st_size == 4 * MiB
    assert (tmp_path / "b.bin").stat().st_size <= 4 * MiB


# --------------------------------------------------------------------------- the watch


async def test_the_watch_stops_once_and_keeps_its_reason(tmp_path: Path) -> None:
    stopped: list[str] = []
    sizes = iter([10 * MB, 70 * MB, 90 * MB])
    watch = WriteWatch(
        DiskLimits(write=64 * MB, floor=0), tmp_path, lambda: next(sizes), stopped.append
    )
    assert await watch.check() is None
    reason = await watch.check()
    assert reason == (
        "orchmode stopped this agent: it wrote 70.0 MB in its workspace, past agent_write_mb (64)"
    )
    assert await watch.check() == reason and stopped == [reason]


# ------------------------------------------------------------------------- the real size


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_two_workers_writing_3_gb_each_neither_fill_the_disk_nor_lose_their_reports(
    serve: StartServer, tmp_path: Path
) -> None:
    """The issue's case, with the default limits: each 3 GB file stops at 2 GB (the cap,
    which it does not pass), each worker reports, neither file is hashed or diffed, and a
    third worker's change merges."""
    free = os.statvfs(tmp_path)
    if free.f_bavail * free.f_frsize < 10 * 1024 * MiB:
        pytest.skip("needs 10 GB of free disk")
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        f"Write {i} $ head -c 3G /dev/zero > big{i}.bin; stat -c size=%s big{i}.bin" for i in (1, 2)
    ]
    subtasks.append("Note $ echo ok > ok.txt")
    server = await serve(editing(subtasks))
    started_at = time.monotonic()
    settled, _ = await run(server, tmp_path, workdir)
    took = time.monotonic() - started_at
    result = tool_result_text(server)
    fates = [(e.index, e.fate) for e in settled]
    assert fates == [(1, "no change"), (2, "no change"), (3, "merged")], result
    for i in (1, 2):
        assert f'"summary": "Finished: Write {i}' in worker_line(result, i)
        line = change_line(result, i)
        assert f"big{i}.bin (2.0 GB, over change_file_max_mb = 100)" in line, line
        assert not (workdir / f"big{i}.bin").exists()
    sizes = [o for o in tool_outputs(server) if "size=" in o and "[budget:" not in o]
    assert len(sizes) == 2 and all(f"size={2048 * MiB}" in o for o in sizes), sizes
    assert (workdir / "ok.txt").read_text() == "ok\n"
    assert "Out of memory" not in result and "diff-tree failed" not in result
    nothing_left(workdir)
    print(f"two workers writing 3 GB each: {took:.1f} s")
