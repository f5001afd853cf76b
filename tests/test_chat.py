"""`orchmode chat` as a real process with piped stdin, the scripted server as the model."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from orchmode.core.mode import Notice
from orchmode.core.prompts import NOTICES
from orchmode.testing.scenario import OrchestrationScenario, role_of
from test_cli import base_env, orchmode


def chat(tmp_path: Path, url: str, *args: str, script: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "orchmode", "chat", "--base-url", url, *args],
        cwd=tmp_path,
        env=base_env(),
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result


def main_requests(server: Any) -> list[list[dict[str, Any]]]:
    return [e.body["messages"] for e in server.log if role_of(e.body) == "main"]


def test_chat_sends_the_mode_notice_with_the_next_turn_and_answers_commands(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=2))
    script = "/status\nhello\n/mode on\nreview this\n/cost\n/budget\n/frob\n/exit\nnever sent\n"
    result = chat(tmp_path, server.url, "--no-mode", "--session", "c1", script=script)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "[chat] mode off · session c1 · 0 turns"
    requests = main_requests(server)
    # "hello" went out with no notice; the mode is on from the turn after /mode on.
    assert requests[0] == [{"role": "user", "content": "hello"}]
    task = next(r for r in requests if {"role": "user", "content": "review this"} in r)
    at = task.index({"role": "user", "content": "review this"})
    assert task[at + 1] == {"role": "system", "content": NOTICES[Notice.ENTER]}
    assert sum(m.get("role") == "system" for m in task) == 1
    assert not any("never sent" in str(r) for r in requests)
    assert "Synthesis: 2 agents reported; 2 results were confirmed." in result.stdout
    cost = next(line for line in out if line.startswith("[chat] ") and "model requests" in line)
    assert f"[chat] {len(server.log)} model requests · " in cost
    assert any(line.startswith("[chat] 4 of ") and "subagents launched" in line for line in out)
    assert "[chat] unknown command /frob; /help lists them" in out
    assert "[workflow 1] fanning out 2 subtasks" in result.stderr  # plain progress: a pipe
    assert "orchmode chat --session c1" in result.stderr


@pytest.mark.slow
def test_chat_resumes_a_session_with_its_mode(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=1))
    first = chat(tmp_path, server.url, "--no-mode", "--session", "c2", script="/mode on\ngo\n")
    assert first.returncode == 0, first.stderr  # end of input leaves like /exit
    before = len(server.log)
    last = main_requests(server)[-1]
    # --no-mode again: the recorded session's mode (on, announced) wins over the default.
    second = chat(tmp_path, server.url, "--no-mode", "--session", "c2", script="/status\nmore\n")
    assert second.returncode == 0, second.stderr
    assert "[session] resuming c2 (mode on)" in second.stderr
    assert second.stdout.splitlines()[0] == "[chat] mode on · session c2 · 1 turns"
    resumed = next(e.body["messages"] for e in server.log[before:] if role_of(e.body) == "main")
    assert resumed[: len(last)] == last
    assert resumed[-1] == {"role": "user", "content": "more"}  # announced: no second notice


def read_until(stream: IO[str], needle: str, seen: list[str]) -> None:
    """Block on the process's stderr until a line containing ``needle`` arrives."""
    for line in stream:
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} never came; stderr was:\n{''.join(seen)}")


@pytest.mark.slow
def test_ctrl_c_cancels_the_turn_keeps_the_journal_and_a_second_one_leaves(
    scripted: Any, tmp_path: Path
) -> None:
    # One slot and slow replies: the fan-out is mid-way when the Ctrl-C comes.
    server = scripted(OrchestrationScenario(subtasks=6, worker_command=None, delay=0.3))
    args = ["chat", "--base-url", server.url, "--max-concurrent", "1", "--session", "c3"]
    process = subprocess.Popen(
        [sys.executable, "-m", "orchmode", *args],
        cwd=tmp_path,
        env=base_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdin and process.stderr and process.stdout
    seen: list[str] = []
    try:
        process.stdin.write("review this\n")
        process.stdin.flush()
        read_until(process.stderr, "verify 1: confirmed", seen)
        process.send_signal(signal.SIGINT)
        read_until(process.stderr, "[chat] turn cancelled", seen)
        process.stdin.write("/status\nreview this\n")
        process.stdin.flush()
        # The rerun takes the finished agents from the journal, and the model accepts
        # the conversation the cancelled turn left behind.
        read_until(process.stderr, "[workflow 2] worker 1: result taken from the journal", seen)
        read_until(process.stderr, "[workflow 2] done", seen)
        process.send_signal(signal.SIGINT)  # cancels the summary, if any is still running
        process.send_signal(signal.SIGINT)  # and leaves
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, "".join(seen) + stderr
    assert "[chat] mode on · session c3 · 1 turns" in stdout
    assert "Traceback" not in "".join(seen) + stderr
    # Every request was accepted; the one in flight at the Ctrl-C may have been dropped.
    outcomes = {e.outcome for e in server.log}
    assert outcomes <= {"ok", "disconnected", "pending"}, outcomes


def test_chat_needs_a_key(tmp_path: Path) -> None:
    env = base_env()
    del env["ANTHROPIC_API_KEY"]
    result = orchmode("chat", cwd=tmp_path, env=env)
    assert result.returncode != 0 and "ANTHROPIC_API_KEY" in result.stderr


@pytest.mark.slow
def test_chat_in_a_terminal_toggles_the_mode_and_survives_a_ctrl_c(
    scripted: Any, tmp_path: Path
) -> None:
    """The prompt_toolkit path, through a real pseudo-terminal."""
    import pexpect

    server = scripted(OrchestrationScenario(subtasks=4, worker_command=None, delay=0.3))
    args = ["-m", "orchmode", "chat", "--base-url", server.url, "--no-mode", "--plain"]
    args += ["--max-concurrent", "1", "--session", "p1", "--fresh"]  # every fan-out runs
    child = pexpect.spawn(
        sys.executable,
        args,
        cwd=str(tmp_path),
        env=base_env(PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm"),
        encoding="utf-8",
        timeout=60,
    )
    try:
        child.expect_exact("you>")
        child.send("/mode on" + "\r")
        child.expect_exact("you>")
        child.send("review this" + "\r")
        child.expect_exact("Synthesis: 4 agents reported; 4 results were confirmed.")
        child.expect_exact("you>")
        child.send("/mode off" + "\r")
        child.expect_exact("you>")
        child.send("thanks" + "\r")
        child.expect_exact("In brief")
        child.expect_exact("you>")
        child.send("/mode on" + "\r")
        child.expect_exact("you>")
        child.send("check it again, more widely" + "\r")
        child.expect_exact("verify 1: confirmed")
        child.sendintr()  # Ctrl-C in the middle of the fan-out
        child.expect_exact("[chat] turn cancelled")
        child.expect_exact("you>")
        child.send("and once more" + "\r")
        child.expect_exact("Synthesis: 4 agents reported")
        child.expect_exact("you>")
        child.send("/exit" + "\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    requests = main_requests(server)
    turns = {
        text: next(r for r in requests if {"role": "user", "content": text} in r)
        for text in ("review this", "thanks", "and once more")
    }
    for text, notice in (("review this", Notice.ENTER), ("thanks", Notice.EXIT)):
        messages = turns[text]
        at = messages.index({"role": "user", "content": text})
        assert messages[at + 1] == {"role": "system", "content": NOTICES[notice]}
    assert {e.outcome for e in server.log} <= {"ok", "disconnected", "pending"}
