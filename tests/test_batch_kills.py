"""A batched run killed with SIGKILL at random moments and resumed: every result once, no
request submitted twice.

Each moment is an observable point of a batched fan-out (requests recorded before their
batch exists, a batch created, one ended, a result in the journal, the synthesis asked
for) and a random offset after it, within the server's batch delay, so kills land while
batches are pending, between recording a batch's requests and creating it, and while
results are being taken. Each killed run is resumed once with ``orchmode resume`` (no
``--batch``: the run's own mode is kept), which must finish it. The server counts every
``custom_id`` it was sent.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchmode.testing import BatchSettings, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env, orchmode
from support.kills import db_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SUBTASKS = 6
SYNTHESIS = f"Synthesis: {SUBTASKS} agents reported; {SUBTASKS} results were confirmed."
#: Seconds the scripted server takes over each batch.
DELAY = 0.8
#: Seconds each reply takes besides.
REPLY_DELAY = 0.1
KILLS = 5
SEED = int(os.environ.get("ORCHMODE_KILL_SEED", "34"))
FLAGS = ("--plain", "--claim-lease", "2", "--batch-window", "0.05", "--batch-poll", "0.05")


@dataclass
class Watch:
    server: ScriptedServer
    journal: Path

    def recorded_unsent(self) -> bool:
        """Requests recorded whose batch has no id yet: between record and create."""
        return bool(db_rows(self.journal, "SELECT 1 FROM batch_requests WHERE batch_id = ''"))

    def batches(self, role: str = "") -> int:
        return sum(
            1
            for batch in self.server.batches.all()
            if not role or any(role_of(i.prompt.body) == role for i in batch.items if i.prompt)
        )

    def ended(self) -> int:
        return sum(1 for batch in self.server.batches.all() if batch.status == "ended")

    def results(self, role: str) -> int:
        return len(db_rows(self.journal, f"SELECT key FROM results WHERE role = '{role}'"))

    def main_requests(self) -> int:
        return sum(1 for e in self.server.log if role_of(e.body) == "main")


#: Points of a batched run, in the order it passes them, each seen from outside.
TRIGGERS: tuple[tuple[str, Callable[[Watch], bool]], ...] = (
    ("requests recorded, batch not yet created", Watch.recorded_unsent),
    ("first batch created", lambda w: w.batches() >= 1),
    ("first batch ended", lambda w: w.ended() >= 1),
    ("second batch created", lambda w: w.batches() >= 2),
    ("a worker's result recorded", lambda w: w.results("worker") >= 1),
    ("first verifier batch", lambda w: w.batches("verifier") >= 1),
    ("a verifier's result recorded", lambda w: w.results("verifier") >= 1),
    ("the workflow's result asked about", lambda w: w.main_requests() >= 3),
)


def choose_moments(seed: int) -> list[tuple[int, float]]:
    """``KILLS`` distinct triggers (by index), each with an offset within a batch's delay."""
    rng = random.Random(seed)
    chosen = rng.sample(range(len(TRIGGERS)), KILLS)
    return [(index, round(rng.uniform(0, DELAY), 3)) for index in sorted(chosen)]


def kill_at(server: ScriptedServer, where: Path, trigger: int, offset: float) -> bool:
    """``orchmode run --batch`` SIGKILLed ``offset`` s after ``trigger`` holds; False if it
    ended first."""
    watch = Watch(server, where / ".orchmode" / "journal.db")
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", "run", "review this", "--base-url", server.url,
         "--batch", *FLAGS],
        cwd=where, env=base_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    try:
        while not TRIGGERS[trigger][1](watch):
            if process.poll() is not None:
                return False
            assert time.monotonic() < deadline, f"never got to {TRIGGERS[trigger][0]!r}"
            time.sleep(0.002)  # polling what another process and thread write
        # the moment itself, a delay after the point (the main agent's last two turns take
        # REPLY_DELAY each: a tenth of it there, so the run is still going)
        time.sleep(offset if trigger < len(TRIGGERS) - 1 else offset / 10)
    finally:
        killed = process.poll() is None
        if killed:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
    return killed


@pytest.mark.parametrize("moment", range(KILLS))
def test_a_batched_run_killed_and_resumed_pays_for_each_request_once(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, moment: int
) -> None:
    trigger, offset = choose_moments(SEED)[moment]
    server = scripted(
        OrchestrationScenario(subtasks=SUBTASKS, delay=REPLY_DELAY),
        batches=BatchSettings(delay=DELAY),
    )
    killed = kill_at(server, tmp_path, trigger, offset)
    assert killed, f"the run ended before {TRIGGERS[trigger][0]} + {offset} s"

    resumed = orchmode("resume", "--base-url", server.url, *FLAGS, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert SYNTHESIS in resumed.stdout
    journal = tmp_path / ".orchmode" / "journal.db"
    recorded = db_rows(journal, "SELECT role, prompt FROM results")
    for role in ("worker", "verifier"):
        prompts = [prompt for r, prompt in recorded if r == role]
        assert len(prompts) == len(set(prompts)) == SUBTASKS, role
    assert max(server.batches.submissions.values()) == 1
    # the resumed run kept batch mode: no subagent was asked at once
    assert {role_of(e.body) for e in server.log if e.path == "/v1/messages"} == {"main"}
