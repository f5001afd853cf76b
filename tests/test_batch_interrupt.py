"""A batched run interrupted and resumed: Ctrl-C cancels its batches, a resume keeps its mode."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchmode.core.settings import Settings
from orchmode.session.run_record import RunRecord
from orchmode.testing import BatchSettings, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env, orchmode

pytestmark = pytest.mark.timeout(180)

LEASE = ("--claim-lease", "2")
SYNTHESIS = "Synthesis: 4 agents reported; 4 results were confirmed."
#: Batches gathered and looked at quickly, so a test waits on the server's delay only.
QUICK = ("--batch-window", "0.05", "--batch-poll", "0.05")


def run_args(server: ScriptedServer, *extra: str) -> list[str]:
    return [sys.executable, "-m", "orchmode", "run", "review this", "--base-url", server.url,
            "--plain", *LEASE, *QUICK, *extra]  # fmt: skip


def wait_for_a_batch(server: ScriptedServer, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not server.batches.all():
        assert process.poll() is None, "the run ended before it sent a batch"
        assert time.monotonic() < deadline, "the run never sent a batch"
        time.sleep(0.01)  # polling the server another thread runs


def resumed(server: ScriptedServer, cwd: Path, *extra: str) -> str:
    """``orchmode resume`` once the server answers batches at once; its stdout."""
    server.batches.settings = BatchSettings(delay=0.05)
    for batch in server.batches.all():
        server.batches.finish(batch.id)
    done = orchmode("resume", "--base-url", server.url, "--plain", *QUICK, *extra, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ctrl_c_cancels_the_batches_in_flight_and_a_resume_asks_only_those_again(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=4), batches=BatchSettings(delay=60))
    process = subprocess.Popen(
        run_args(server, "--batch"), cwd=tmp_path, env=base_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_a_batch(server, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "orchmode resume" in stderr
    (held,) = server.batches.all()
    assert held.status == "ended" and held.cancel_initiated_at is not None
    canceled = {item.custom_id for item in held.items}
    assert {(item.result or {}).get("type") for item in held.items} == {"canceled"}

    assert SYNTHESIS in resumed(server, tmp_path)
    # the canceled requests asked again under their next attempt's ids, nothing twice
    assert max(server.batches.submissions.values()) == 1
    asked_again = {cid.rsplit("-", 1)[0] + "-1" for cid in canceled}
    assert asked_again <= server.batches.submissions.keys()


def test_a_resume_keeps_the_runs_batch_mode_unless_it_says_otherwise(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    kept, told = tmp_path / "kept", tmp_path / "told"
    for where, extra in ((kept, ()), (told, ("--batch", "off"))):
        where.mkdir()
        server = scripted(OrchestrationScenario(subtasks=4), batches=BatchSettings(delay=60))
        process = subprocess.Popen(
            run_args(server, "--batch"), cwd=where, env=base_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        wait_for_a_batch(server, process)
        process.kill()
        process.wait()
        since = len(server.log)
        assert SYNTHESIS in resumed(server, where, *extra)
        asked_at_once = {role_of(e.body) for e in server.log[since:] if e.path == "/v1/messages"}
        if extra:
            assert "worker" in asked_at_once
        else:
            assert asked_at_once <= {"main"}
            assert max(server.batches.submissions.values()) == 1


def test_a_run_record_keeps_the_batch_mode_and_reads_older_records_as_off() -> None:
    assert RunRecord.read({"command": "run", "task": "t", "phase": 1}) == RunRecord(task="t")
    assert RunRecord.read({"task": "t", "batch": "someday"}) == RunRecord(task="t")
    record = RunRecord(task="t", batch="verifiers")
    assert RunRecord.read(record.saved()) == record
    assert record.settings_for_resume(Settings()).batch == "verifiers"
    assert record.settings_for_resume(Settings(batch="off")).batch == "off"
    assert record.settings_for_resume(Settings(batch="subagents")).batch == "subagents"
