"""`orchmode resume`: real processes killed at the worst moments, real HTTP, a model that
plans differently every time it is asked — so nothing may rely on asking again."""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchmode.session.agent import CUT_OFF_NOTE
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import (
    OrchestrationScenario,
    mode_is_on,
    role_of,
    text,
    tool_call,
    turn_messages,
)
from recorded_runs import base_env, kill_run_when, orchmode, worker_prompts

#: A short lease, so a killed run's claims lapse quickly for the resume.
LEASE = ("--claim-lease", "2")


@dataclass
class Replanning(OrchestrationScenario):
    """A main agent that samples a new plan on every request, as a real model does.

    The subtasks of a Workflow call carry the number of the request that asked for them,
    so a rerun that asked for the plan again would run other subtasks, and show it.
    """

    plans: int = 0
    #: seconds the synthesis reply waits (to kill a run while it is in flight)
    synthesis_delay: float = 0.0

    def main(self, request: ScriptedRequest) -> Reply:
        messages = request.messages
        if not mode_is_on(messages):
            return text(self.summary)
        step = sum(1 for m in turn_messages(messages) if m.get("role") == "assistant")
        if step == 0 and self.scout_command is not None:
            return tool_call("bash", {"command": self.scout_command}, say="Scouting first.")
        if step <= 1:
            self.plans += 1
            subtasks = [f"Check item {i} (plan {request.index})" for i in range(1, 9)]
            return tool_call("Workflow", {"subtasks": subtasks}, say="Fanning out.")
        reply = super().main(request)
        reply.delay = max(reply.delay, self.synthesis_delay)
        return reply


def uninterrupted(scripted: Callable[..., ScriptedServer], tmp_path: Path, **kw: Any) -> str:
    """What the same run prints when nothing stops it."""
    server = scripted(Replanning(**kw))
    where = tmp_path / "uninterrupted"
    where.mkdir()
    result = orchmode("run", "review this", "--base-url", server.url, cwd=where)
    assert result.returncode == 0, result.stderr
    return result.stdout


def launched_but_unrecorded(journal: Path) -> int:
    """Subagents the ledger counts less the results recorded, read in one transaction."""
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        db.execute("BEGIN")
        (counted,) = db.execute("SELECT COALESCE(SUM(subagents), 0) FROM budgets").fetchone()
        (recorded,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        db.close()
    return int(counted) - int(recorded)


def session_of(tmp_path: Path) -> str:
    db = sqlite3.connect(tmp_path / ".orchmode" / "journal.db")
    try:
        (found,) = db.execute("SELECT id FROM sessions").fetchone()
    finally:
        db.close()
    return str(found)


def resumed_requests(server: ScriptedServer, since: int) -> list[dict[str, Any]]:
    return [e.body for e in server.log[since:] if e.path == "/v1/messages"]


def ctrl_c_during_fanout(server: ScriptedServer, tmp_path: Path, env: dict[str, str]) -> str:
    """``orchmode run`` on ``server``, sent SIGINT once two workers' results are recorded;
    what it printed on stderr, once it has exited with 130."""
    journal = tmp_path / ".orchmode" / "journal.db"
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", "run", "review this", "--base-url", server.url,
         "--max-concurrent", "2", *LEASE],
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(worker_prompts(journal)) < 2:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)  # polling the journal another process writes
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    return stderr


def kill_during_fanout(
    scripted: Callable[..., ScriptedServer],
    tmp_path: Path,
    scenario: Replanning,
    workers: int,
    *flags: str,
) -> ScriptedServer:
    """``orchmode run`` of ``scenario``, SIGKILLed once ``workers`` results are recorded."""
    server = scripted(scenario)
    journal = tmp_path / ".orchmode" / "journal.db"
    args = ("review this", "--base-url", server.url, "--max-concurrent", "2", *flags)
    kill_run_when(lambda: len(worker_prompts(journal)) >= workers, *args, cwd=tmp_path)
    return server


@pytest.mark.slow
def test_a_run_killed_during_the_fanout_resumes_without_a_new_plan(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    expected = uninterrupted(scripted, tmp_path, delay=0.02)
    scenario = Replanning(delay=0.02)
    server = kill_during_fanout(scripted, tmp_path, scenario, 3, *LEASE)
    finished = set(worker_prompts(tmp_path / ".orchmode" / "journal.db"))
    assert 3 <= len(finished) < 8 and scenario.plans == 1
    since = len(server.log)
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    assert scenario.plans == 1  # nobody asked for the plan again
    asked = [b["messages"][0]["content"] for b in resumed_requests(server, since)]
    assert not finished & set(asked)  # no finished worker was run again
    assert "[session] resuming" in result.stderr


@pytest.mark.slow
def test_a_run_killed_during_its_scouting_command_is_told_it_was_cut_off(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scout = "touch scouting && sleep 60"
    expected = uninterrupted(scripted, tmp_path, scout_command="true")
    scenario = Replanning(scout_command=scout)
    server = scripted(scenario)
    args = ("review this", "--base-url", server.url, *LEASE)
    kill_run_when(lambda: (tmp_path / "scouting").exists(), *args, cwd=tmp_path)
    (tmp_path / "scouting").unlink()
    since = len(server.log)
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    first = resumed_requests(server, since)[0]
    assert first["messages"][-1]["content"][0]["content"] == CUT_OFF_NOTE
    assert not (tmp_path / "scouting").exists()  # the command was not run again


def kill_during_synthesis(server: ScriptedServer, tmp_path: Path) -> None:
    """``orchmode run`` on ``server``, SIGKILLed while its synthesis request is in flight."""

    def synthesis_in_flight() -> bool:
        return any(
            e.outcome == "pending" and "[agent 1:" in str(e.body.get("messages", [])[-1:])
            for e in server.log
        )

    kill_run_when(
        synthesis_in_flight, "review this", "--base-url", server.url, *LEASE, cwd=tmp_path
    )


@pytest.mark.slow
def test_a_run_killed_before_its_synthesis_resends_only_that_request(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    expected = uninterrupted(scripted, tmp_path)
    scenario = Replanning(synthesis_delay=60)
    server = scripted(scenario)
    kill_during_synthesis(server, tmp_path)
    scenario.synthesis_delay = 0
    since = len(server.log)
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    roles = [role_of(b) for b in resumed_requests(server, since)]
    assert roles == ["main", "main"]  # the synthesis again, then the summary turn


@pytest.mark.slow
def test_ctrl_c_during_the_fanout_exits_130_and_names_the_resume_command(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    expected = uninterrupted(scripted, tmp_path, delay=0.05)
    scenario = Replanning(delay=0.05)
    server = scripted(scenario)
    stderr = ctrl_c_during_fanout(server, tmp_path, base_env())
    session = session_of(tmp_path)
    assert f"`orchmode resume {session}`" in stderr.strip().splitlines()[-1], stderr
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    assert scenario.plans == 1


@pytest.mark.slow
def test_run_says_an_interrupted_run_on_the_same_task_can_be_resumed(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = Replanning(delay=0.02)
    server = kill_during_fanout(scripted, tmp_path, scenario, 2, *LEASE)
    session = session_of(tmp_path)
    shown = orchmode("show", cwd=tmp_path)
    assert "in progress when it stopped: Workflow (8 subtasks)" in shown.stdout
    assert f"`orchmode resume {session}`" in shown.stdout
    again = orchmode("run", "review this", "--base-url", server.url, "--resume", *LEASE,
                     cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"[session] resuming {session}" in again.stderr
    assert scenario.plans == 1
    other = orchmode("run", "another task", "--base-url", server.url, "--test-mode", cwd=tmp_path)
    assert "was interrupted" not in other.stderr


@pytest.mark.slow
@pytest.mark.faults
def test_two_resumes_of_one_session_at_once_one_wins(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = Replanning(delay=1.0)  # the winner holds the session past the loser's wait
    server = kill_during_fanout(scripted, tmp_path, scenario, 2, *LEASE)
    command = [sys.executable, "-m", "orchmode", "resume", "--base-url", server.url, *LEASE]
    both = [
        subprocess.Popen(command, cwd=tmp_path, env=base_env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outcomes = [(p.wait(timeout=120), p.communicate()) for p in both]
    codes = sorted(code for code, _ in outcomes)
    assert codes[0] == 0 and codes[1] != 0, outcomes
    loser = next(err for code, (_, err) in outcomes if code != 0)
    assert loser.strip().startswith("orchmode: ") and len(loser.strip().splitlines()) == 1
    assert "in use by another orchmode process" in loser


@pytest.mark.slow
def test_what_cannot_be_resumed_is_one_line_and_changes_nothing(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(Replanning())
    done = orchmode("run", "review this", "--base-url", server.url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    session = session_of(tmp_path)

    def refused(*args: str, cwd: Path = tmp_path) -> str:
        result = orchmode("resume", *args, "--base-url", server.url, cwd=cwd)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("orchmode: "), result.stderr
        return lines[0]

    assert "no interrupted session ran in" in refused()
    assert "was not interrupted" in refused(session)
    assert "there is no session 'nope'" in refused("nope")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    journal = str(tmp_path / ".orchmode" / "journal.db")
    assert f"ran in {tmp_path}" in refused(session, "--journal", journal, cwd=elsewhere)
    db = sqlite3.connect(journal)
    try:
        db.execute("UPDATE sessions SET state = '{not json' WHERE id = ?", (session,))
        db.execute("DELETE FROM events WHERE kind = 'TurnDone' AND session = ?", (session,))
        db.commit()
        before = db.execute("SELECT COUNT(*) FROM events").fetchone()
    finally:
        db.close()
    assert "cannot be resumed" in refused(session)
    db = sqlite3.connect(journal)
    try:
        assert db.execute("SELECT COUNT(*) FROM events").fetchone() == before
    finally:
        db.close()


def test_a_run_killed_during_the_fanout_resumes_on_postgresql(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, postgres_clean_url: str
) -> None:
    scenario = Replanning(delay=0.02)
    server = scripted(scenario)
    store = ("--store", postgres_clean_url)
    args = ("review this", "--base-url", server.url, "--max-concurrent", "2", *LEASE, *store)

    def workers_recorded() -> int:
        return sum(1 for e in server.log if e.outcome == "ok" and role_of(e.body) == "worker")

    kill_run_when(lambda: workers_recorded() >= 3, *args, cwd=tmp_path)
    since = len(server.log)
    result = orchmode("resume", "--base-url", server.url, *LEASE, *store, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Synthesis: 8 agents reported; 8 results were confirmed." in result.stdout
    assert scenario.plans == 1
    assert re.search(r"^In brief:", result.stdout, flags=re.M)
    assert resumed_requests(server, since)


@pytest.mark.slow
def test_chat_offers_to_finish_an_interrupted_turn(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = Replanning(delay=0.02)
    server = kill_during_fanout(scripted, tmp_path, scenario, 3, *LEASE)
    session = session_of(tmp_path)
    chat = subprocess.run(
        [sys.executable, "-m", "orchmode", "chat", "--session", session, "--base-url",
         server.url, *LEASE],
        cwd=tmp_path, env=base_env(), input="/resume\n/resume\n/exit\n",
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    assert "its last turn was interrupted; /resume finishes it" in chat.stderr
    assert "Synthesis: 8 agents reported; 8 results were confirmed." in chat.stdout
    assert "there is no interrupted turn to finish" in chat.stdout
    assert scenario.plans == 1


@pytest.mark.slow
def test_a_resume_takes_over_the_claims_of_a_killed_run_on_this_host_at_once(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = Replanning(delay=0.05)
    # the default lease (30 s): waiting it out would be the slow way
    server = kill_during_fanout(scripted, tmp_path, scenario, 2)
    result = orchmode("resume", "--base-url", server.url, "--debug", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Synthesis: 8 agents reported; 8 results were confirmed." in result.stdout
    taken = re.findall(r"taking over a claim from (\S+), a process that is gone", result.stderr)
    assert taken  # the session's claim and the running agents' claims
    assert scenario.plans == 1


@dataclass
class ReplanningScript(Replanning):
    """The same model, planning with a script: each request writes another program."""

    def main(self, request: ScriptedRequest) -> Reply:
        step = sum(1 for m in turn_messages(request.messages) if m.get("role") == "assistant")
        if mode_is_on(request.messages) and step == 1:
            self.plans += 1
            script = (
                f'found = parallel(["Check item " + str(i) + " (plan {request.index})" '
                "for i in range(1, 9)])\n"
                'checked = [verify("Check item " + str(i + 1), r) for i, r in enumerate(found)]\n'
                '{"agents": len(found), "confirmed": '
                'sum(1 for c in checked if c.get("verdict") == "confirmed")}'
            )
            return tool_call("Workflow", {"script": script}, say="Running a script.")
        return super().main(request)


@pytest.mark.slow
def test_a_script_killed_half_way_runs_again_from_its_start_with_journal_hits(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = ReplanningScript(delay=0.02)
    server = kill_during_fanout(scripted, tmp_path, scenario, 3, *LEASE)
    finished = set(worker_prompts(tmp_path / ".orchmode" / "journal.db"))
    since = len(server.log)
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert scenario.plans == 1
    asked = [b["messages"][0]["content"] for b in resumed_requests(server, since)]
    assert not finished & set(asked)
    synthesis = next(
        b for b in resumed_requests(server, since)
        if role_of(b) == "main" and '"confirmed": 8' in str(b["messages"][-1])
    )  # fmt: skip
    assert '"agents": 8' in str(synthesis["messages"][-1])


@pytest.mark.slow
def test_agents_queued_when_a_run_was_killed_are_not_counted_against_its_budget(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    # 16 agents finish the run; the two in flight at the kill are launched again on resume.
    # A finished agent's result is written after it gives its slot back, so the run is
    # killed at a moment when no such write is pending: at most two agents counted and
    # unrecorded. Counting queued agents too would leave no such moment while three to
    # five of the eight workers are recorded (the whole wave would be counted at once).
    budget = ("--max-subagents", "18")
    expected = uninterrupted(scripted, tmp_path, delay=0.05)
    scenario = Replanning(delay=0.05)
    server = scripted(scenario)
    journal = tmp_path / ".orchmode" / "journal.db"

    def two_at_most_counted_and_unrecorded() -> bool:
        workers = len(worker_prompts(journal))
        return 3 <= workers <= 5 and launched_but_unrecorded(journal) <= 2

    args = ("review this", "--base-url", server.url, "--max-concurrent", "2", *LEASE, *budget)
    kill_run_when(two_at_most_counted_and_unrecorded, *args, cwd=tmp_path)
    result = orchmode("resume", "--base-url", server.url, *LEASE, *budget, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    ledger = orchmode("budget", cwd=tmp_path)
    launched = re.search(r"subagents\s+(\d+) launched", ledger.stdout)
    assert launched is not None and 16 <= int(launched[1]) <= 18, ledger.stdout


@pytest.mark.slow
def test_a_resumed_run_whose_synthesis_is_refused_asks_for_no_summary_turn(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = Replanning(synthesis_delay=60)
    server = scripted(scenario)
    kill_during_synthesis(server, tmp_path)
    refused = Reply([{"type": "text", "text": "I will not go on with this."}], "refusal")
    scenario.main = lambda request: refused  # type: ignore[method-assign]
    since = len(server.log)
    result = orchmode("resume", "--base-url", server.url, *LEASE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no summary turn: the model refused the task" in result.stderr
    # the refused synthesis only: a summary of an answer that was dropped is never asked for
    assert [role_of(b) for b in resumed_requests(server, since)] == ["main"]
