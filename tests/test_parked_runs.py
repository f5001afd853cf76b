"""Approvals that block no one else: real `orchmode run` processes, real stores, real answers
from a second process, a run killed while an approval is pending and then resumed."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from recorded_runs import base_env, item_number, orchmode, spawn_on_a_terminal, worker_prompts

#: The one command of the fan-out that a rule asks about.
ASKED = "echo deploy {n}"
ASK_RULE = "Bash(echo deploy:*)"
LEASE = ("--claim-lease", "2")


def commands_asking_for(asking: int) -> Callable[[str], str]:
    """Every worker echoes its item; worker ``asking`` runs the command the rule asks about."""

    def command(prompt: str) -> str:
        n = item_number(prompt)
        return ASKED.format(n=n) if n == asking else f"echo item {n}"

    return command


def pending(cwd: Path) -> list[dict[str, Any]]:
    """The approvals `orchmode approvals --json` lists, from another process."""
    result = orchmode("approvals", "--json", cwd=cwd, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen[str]) -> None:
    """Poll ``condition`` (it reads what another process writes) until it holds."""
    deadline = time.monotonic() + 90
    while not condition():
        if process.poll() is not None:
            _out, err = process.communicate()
            raise AssertionError(f"the run ended before {what}: {err[-3000:]}")
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)  # polling files and a store another process writes


def start_run(server: ScriptedServer, cwd: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchmode", "run", "review this", "--base-url", server.url,
         "--sandbox", "off", "--permissions-ask", ASK_RULE, *LEASE, *flags],
        cwd=cwd, env=base_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@contextmanager
def stopped_at_the_end(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``process``, killed on the way out if it is still running (a failed assertion)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def recorded_workers(cwd: Path) -> set[int]:
    return {item_number(p) for p in worker_prompts(cwd / ".orchmode" / "journal.db")}


@pytest.mark.slow
def test_an_approval_answered_from_another_process_parks_only_the_agent_that_asked(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """20 workers on ONE slot: worker 7 asks, and the other 19 (and their verifiers) all
    finish while it waits — possible only if its slot went to them. Then an `orchmode
    approve` from another process lets it go on, and the run ends with its result."""
    scenario = OrchestrationScenario(subtasks=20, worker_command=commands_asking_for(7))
    server = scripted(scenario)
    with stopped_at_the_end(start_run(server, tmp_path, "--max-concurrent", "1")) as run:
        wait_for(lambda: bool(pending(tmp_path)), "an approval was asked for", run)
        (asked,) = pending(tmp_path)
        assert asked["what"] == ASKED.format(n=7) and asked["agent"].endswith(".7")
        everyone_else = set(range(1, 21)) - {7}
        wait_for(lambda: recorded_workers(tmp_path) >= everyone_else, "the others finished", run)
        assert 7 not in recorded_workers(tmp_path)  # still parked
        answer = orchmode("approve", str(asked["id"]), cwd=tmp_path, timeout=60)
        assert answer.returncode == 0, answer.stderr
        _out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-3000:]
    assert recorded_workers(tmp_path) == set(range(1, 21))
    assert not pending(tmp_path)
    # worker 7 ran the command it was allowed, and was shown its output
    assert "deploy 7" in tool_results(server)


def tool_results(server: ScriptedServer) -> str:
    """Every tool result the model was sent, one per line."""
    texts: list[str] = []
    for entry in server.log:
        if entry.path != "/v1/messages":
            continue
        for message in entry.body.get("messages", []):
            content = message.get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    inner = block.get("content")
                    texts.append(json.dumps(inner) if not isinstance(inner, str) else inner)
    return "\n".join(texts)


@pytest.mark.slow
def test_a_denied_command_is_refused_with_the_reason_and_the_run_goes_on(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(subtasks=3, worker_command=commands_asking_for(2))
    server = scripted(scenario)
    with stopped_at_the_end(start_run(server, tmp_path, "--max-concurrent", "2")) as run:
        wait_for(lambda: bool(pending(tmp_path)), "an approval was asked for", run)
        (asked,) = pending(tmp_path)
        answer = orchmode(
            "deny", str(asked["id"]), "--reason", "not on a Friday", cwd=tmp_path, timeout=60
        )
        assert answer.returncode == 0, answer.stderr
        _out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-3000:]
    results = tool_results(server)
    assert "not on a Friday" in results and "was not run" in results


@pytest.mark.slow
def test_unattended_runs_deny_at_once(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(subtasks=2, worker_command=commands_asking_for(1))
    server = scripted(scenario)
    started = time.monotonic()
    result = orchmode(
        "run", "review this", "--base-url", server.url, "--sandbox", "off",
        "--permissions-ask", ASK_RULE, "--approvals", "deny", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60
    results = tool_results(server)
    assert "was not run" in results and "--approvals deny" in results


@pytest.mark.slow
def test_a_run_killed_while_an_approval_is_pending_finds_its_answer_on_resume(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """kill -9 while worker 2 waits; the user approves from another terminal meanwhile; the
    resumed run does not ask again, runs the command, and ends."""
    scenario = OrchestrationScenario(subtasks=3, worker_command=commands_asking_for(2))
    server = scripted(scenario)
    with stopped_at_the_end(start_run(server, tmp_path, "--max-concurrent", "3")) as run:
        wait_for(lambda: bool(pending(tmp_path)), "an approval was asked for", run)
        run.kill()  # SIGKILL: nothing of orchmode's runs on the way out
    (asked,) = pending(tmp_path)  # the question outlived the process
    answer = orchmode("approve", str(asked["id"]), cwd=tmp_path, timeout=60)
    assert answer.returncode == 0, answer.stderr
    resumed = orchmode(
        "resume", "--base-url", server.url, "--sandbox", "off",
        "--permissions-ask", ASK_RULE, "--approvals", "deny", *LEASE, cwd=tmp_path,
    )  # fmt: skip
    # --approvals deny would refuse any new question at once: the command ran, so the
    # answer given while no process was running was found
    assert resumed.returncode == 0, resumed.stderr
    assert recorded_workers(tmp_path) == {1, 2, 3}
    results = tool_results(server)
    assert "was not run" not in results and "deploy 2" in results, results


@pytest.fixture
def www(tmp_path: Path) -> Iterator[int]:
    """A plain HTTP server on the host's loopback: what a sandboxed curl asks to reach."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the host\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_a_connection_to_an_ask_domain_waits_held_until_approved_always(
    scripted: Callable[..., ScriptedServer], tmp_path: Path, www: int
) -> None:
    """In the real sandbox, worker 2's curl reaches a name `network_ask` names: the proxy
    holds the connection while the question waits; `orchmode approve --always` lets it
    through, and the next run in the directory does not ask again."""
    work = tmp_path / "work"
    work.mkdir()
    env = base_env(XDG_CONFIG_HOME=str(tmp_path / "config"))
    fetch = f"curl -sS --max-time 120 http://files.test:{www}/hello.txt"

    def command(prompt: str) -> str:
        return fetch if item_number(prompt) == 2 else "true"

    server = scripted(OrchestrationScenario(subtasks=3, worker_command=command))
    flags = ("--network-ask", "files.test", "--network-resolve", "files.test=127.0.0.1")
    argv = [sys.executable, "-m", "orchmode", "run", "review this", "--base-url", server.url,
            *flags, *LEASE]  # fmt: skip

    def asked() -> list[dict[str, Any]]:
        listed = subprocess.run(
            [sys.executable, "-m", "orchmode", "approvals", "--json"],
            cwd=work, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        return [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]

    started = subprocess.Popen(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    with stopped_at_the_end(started) as run:
        wait_for(lambda: bool(asked()), "the connection asked", run)
        (question,) = asked()
        assert question["kind"] == "domain" and question["what"] == f"files.test:{www}"
        answer = subprocess.run(
            [sys.executable, "-m", "orchmode", "approve", str(question["id"]), "--always"],
            cwd=work, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        _out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    assert "hello from the host" in tool_results(server)  # held, then let through

    again = scripted(OrchestrationScenario(subtasks=3, worker_command=command))
    second = subprocess.run(
        [*argv[:4], "review it again", "--base-url", again.url, *flags, *LEASE],
        cwd=work, env=env, capture_output=True, text=True, timeout=180,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "hello from the host" in tool_results(again)
    every = subprocess.run(
        [sys.executable, "-m", "orchmode", "approvals", "--json", "--all"],
        cwd=work, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert len([line for line in every.stdout.splitlines() if line.strip()]) == 1


@pytest.mark.slow
def test_the_live_view_shows_the_question_and_takes_the_answer_typed_on_its_terminal(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """`orchmode run` on a terminal: the live view shows worker 2's question with how to
    answer it; `/approve N` typed there lets it go on, and the run ends."""
    import pexpect

    scenario = OrchestrationScenario(subtasks=3, worker_command=commands_asking_for(2))
    server = scripted(scenario)
    child = spawn_on_a_terminal(
        "run", "review this", "--base-url", server.url, "--sandbox", "off",
        "--permissions-ask", ASK_RULE, cwd=tmp_path, width=160,
    )  # fmt: skip
    try:
        child.expect(r"/approve (\d+)", timeout=90)
        number = child.match.group(1)
        child.sendline(f"/approve {number}")
        child.expect(f"approved {number}", timeout=60)
        child.expect(pexpect.EOF, timeout=120)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert "deploy 2" in tool_results(server)
