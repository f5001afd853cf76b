"""`orchmode run` end to end: a real process, real HTTP, the scripted server as the model."""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env, kill_run_when, orchmode, worker_prompts


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("orchmode: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.slow
def test_run_fans_out_twenty_subtasks_and_prints_both_answers(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=20, delay=0.01))
    result = orchmode("run", "review this", "--base-url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Synthesis: 20 agents reported; 20 results were confirmed." in result.stdout
    assert "In brief:" in result.stdout
    assert (
        "[main] $ ls" in result.stderr and "[workflow 1] fanning out 20 subtasks" in result.stderr
    )
    roles = [role_of(e.body) for e in server.log]
    assert roles.count("verifier") == 20
    synthesis = [e.body for e in server.log if role_of(e.body) == "main"][2]
    tool_result = synthesis["messages"][-1]["content"][0]["content"]
    headers = re.findall(r"^\[(agent|verify) (\d+)", tool_result, flags=re.M)
    assert headers == [(kind, str(i)) for i in range(1, 21) for kind in ("agent", "verify")]
    assert tool_result.count('"summary": "confirmed') == 20
    assert 1 <= server.max_in_flight_seen <= 10
    assert (tmp_path / ".orchmode" / "journal.db").is_file()


def test_every_main_request_extends_the_previous_one_and_asks_for_caching(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=3))
    assert orchmode("run", "go", "--base-url", server.url, cwd=tmp_path).returncode == 0
    main = [e.body for e in server.log if role_of(e.body) == "main"]
    assert len(main) == 4  # scout, workflow, synthesis; then the summary turn
    for previous, current in itertools.pairwise(main):
        assert current["messages"][: len(previous["messages"])] == previous["messages"]
        assert current["system"] == previous["system"] and current["tools"] == previous["tools"]
    # Each asks the API's cache diagnostics about the one before, which saw no divergence.
    entries = [e for e in server.log if role_of(e.body) == "main"]
    assert entries[0].body["diagnostics"] == {"previous_message_id": None}
    for previous_entry, entry in itertools.pairwise(entries):
        assert entry.body["diagnostics"] == {"previous_message_id": previous_entry.message_id}
    for body in (e.body for e in server.log):
        assert body["cache_control"] == {"type": "ephemeral"}
        assert body["output_config"] == {"effort": "xhigh"}
        assert (body["model"], body["max_tokens"]) == ("claude-opus-5-5", 64000)


@pytest.mark.slow
def test_a_killed_run_recomputes_no_finished_worker(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=40, worker_command=None, delay=0.1))
    journal = tmp_path / ".orchmode" / "journal.db"
    # A short lease: the rerun takes over the killed run's claims without a long wait.
    lease = ["--claim-lease", "2"]
    ready = lambda: len(worker_prompts(journal)) >= 20  # noqa: E731
    kill_run_when(ready, "go", "--base-url", server.url, *lease, cwd=tmp_path)
    finished = set(worker_prompts(journal))
    assert 20 <= len(finished) < 40
    before = len(server.log)
    result = orchmode("run", "go", "--base-url", server.url, *lease, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rerun = {
        e.body["messages"][0]["content"] for e in server.log[before:] if role_of(e.body) == "worker"
    }
    assert rerun and not (rerun & finished)
    assert rerun | finished == {f"Check item {i}" for i in range(1, 41)}
    assert "Synthesis: 40 agents reported; 40 results were confirmed." in result.stdout
    db = sqlite3.connect(journal)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()


def test_test_mode_uses_small_limits_in_a_throwaway_directory(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=4, scout_command=None))
    result = orchmode("run", "go", "--test-mode", "--base-url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []
    roles = [role_of(e.body) for e in server.log]
    assert roles.count("worker") == 2 and roles.count("verifier") == 2
    assert (
        "2 were not run" in str(server.log[-1].body)
        or "stopped after 1 model calls" in result.stdout
    )
    assert "stopped after 1 model calls" in result.stdout


def test_a_missing_api_key_is_one_line(tmp_path: Path) -> None:
    env = base_env()
    del env["ANTHROPIC_API_KEY"]
    assert_one_line_error(orchmode("run", "x", cwd=tmp_path, env=env), "ANTHROPIC_API_KEY")


def test_a_rejected_key_is_one_line(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario())
    env = base_env(ANTHROPIC_API_KEY="sk-wrong-secret")
    result = orchmode("run", "x", "--base-url", server.url, cwd=tmp_path, env=env)
    assert_one_line_error(result, "rejected the credentials")
    assert "sk-wrong-secret" not in result.stderr + result.stdout


def test_an_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = orchmode(
        "run", "x", "--base-url", f"http://127.0.0.1:{port}", "--max-retries", "0", cwd=tmp_path
    )
    assert_one_line_error(result, "cannot reach", f"127.0.0.1:{port}")


def test_the_base_url_can_come_from_the_environment(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=1))
    result = orchmode("run", "x", cwd=tmp_path, env=base_env(ANTHROPIC_BASE_URL=server.url))
    assert result.returncode == 0, result.stderr
    assert len(server.log) > 0


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["run", "--max-concurrent", "lots"], {}, "--max-concurrent"),
        (["run", "--no-such-flag"], {}, "unrecognized arguments"),
        (["run"], {"ORCHMODE_EFFORT": "extreme"}, "ORCHMODE_EFFORT"),
        (["frobnicate"], {}, "invalid choice"),
    ],
)
def test_bad_flags_and_settings_are_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], needle: str
) -> None:
    assert_one_line_error(orchmode(*args, cwd=tmp_path, env=base_env(**env)), needle)


def test_a_corrupt_journal_is_one_line(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario())
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 1000)
    result = orchmode("run", "x", "--base-url", server.url, "--journal", str(bad), cwd=tmp_path)
    assert_one_line_error(result, "bad.db")
    assert len(server.log) == 0


@pytest.mark.slow
def test_the_api_key_never_reaches_a_command_or_the_journal(scripted: Any, tmp_path: Path) -> None:
    scenario = OrchestrationScenario(subtasks=2, scout_command="env", worker_command="env")
    server = scripted(scenario, api_key=None)  # accept any key: the run must reach the commands
    secret = "sk-ant-very-secret-value"
    env = base_env(ANTHROPIC_API_KEY=secret, MY_SERVICE_TOKEN="tok-also-secret", FAVOURITE="blue")
    result = orchmode("run", "x", "--base-url", server.url, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    sent = "".join(str(e.body) for e in server.log)
    assert "FAVOURITE=blue" in sent  # the commands really ran `env`
    assert secret not in sent and "tok-also-secret" not in sent
    assert secret.encode() not in (tmp_path / ".orchmode" / "journal.db").read_bytes()


def worker_conversations(server: ScriptedServer) -> list[str]:
    """The subtask of every worker conversation the server saw begin."""
    return [
        e.body["messages"][0]["content"]
        for e in server.log
        if role_of(e.body) == "worker" and len(e.body["messages"]) == 1
    ]


@pytest.mark.slow
def test_two_runs_started_together_run_each_subtask_once(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=40, delay=0.05))
    args = [sys.executable, "-m", "orchmode", "run", "go", "--base-url", server.url]
    runs = [
        subprocess.Popen(args, cwd=tmp_path, env=base_env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outputs = [run.communicate(timeout=120) for run in runs]
    for run, (stdout, stderr) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, stderr
        assert "Synthesis: 40 agents reported; 40 results were confirmed." in stdout
    started = worker_conversations(server)
    assert sorted(started) == sorted(f"Check item {i}" for i in range(1, 41))


def test_a_subagent_cap_skips_what_does_not_fit_and_says_so(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=40, worker_command=None))
    result = orchmode("run", "go", "--base-url", server.url, "--max-subagents", "30", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    launched = [e for e in server.log if role_of(e.body) != "main" and len(e.body["messages"]) == 1]
    assert len(launched) == 30
    synthesis = [e.body for e in server.log if role_of(e.body) == "main"][2]
    tool_result = synthesis["messages"][-1]["content"][0]["content"]
    assert "the session's budget is used up (30 of 30 subagents launched" in tool_result
    assert "were not run" in tool_result and "--max-subagents" in tool_result
    last_line = tool_result.rstrip().splitlines()[-1]
    assert last_line.startswith("[budget: 30 of 30 subagents launched; ")
    assert last_line.endswith(" spent in this session; 0 subagents left]")
    assert tool_result.count("[orchmode: not run") >= 10


def recorded(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(tmp_path / ".orchmode" / "journal.db")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.mark.slow
def test_a_run_is_recorded_and_can_be_resumed_by_name(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=2))
    first = orchmode("run", "first task", "--base-url", server.url, "--session", "s1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "continue it with --session s1" in first.stderr
    kinds = [row[0] for row in recorded(tmp_path, "SELECT kind FROM events WHERE session = 's1'")]
    assert kinds[0] == "TurnStarted" and kinds[-1] == "TurnDone"
    for kind in (
        "ModelRequestDone",
        "BashDone",
        "FanoutStarted",
        "SubagentStarted",
        "SubagentDone",
    ):
        assert kind in kinds
    done = [
        json.loads(row[0])
        for row in recorded(tmp_path, "SELECT data FROM events WHERE kind = 'SubagentDone'")
    ]
    assert {d["verdict"] for d in done if d["role"] == "verifier"} == {"confirmed"}
    assert all(d["result"] for d in done)
    started = recorded(tmp_path, "SELECT data FROM events WHERE kind = 'SubagentStarted'")
    assert any(json.loads(row[0])["prompt"] == "Check item 1" for row in started)
    seqs = [row[0] for row in recorded(tmp_path, "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))

    before = len(server.log)
    second = orchmode(
        "run", "second task", "--base-url", server.url, "--session", "s1", cwd=tmp_path
    )
    assert second.returncode == 0, second.stderr
    assert "resuming s1" in second.stderr
    resumed_request = server.log[before].body["messages"]
    assert resumed_request[0] == {"role": "user", "content": "first task"}
    # `run` switches the mode on for its first turn; the session had left it off, so the
    # model is told again, directly after the new user turn.
    assert resumed_request[-2] == {"role": "user", "content": "second task"}
    assert resumed_request[-1]["role"] == "system" and "ON" in resumed_request[-1]["content"]
    first_run_main = [e.body for e in server.log[:before] if role_of(e.body) == "main"]
    assert resumed_request[: len(first_run_main[-1]["messages"])] == first_run_main[-1]["messages"]


@pytest.mark.slow
def test_budget_prints_what_the_latest_session_launched(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=3))
    run = orchmode("run", "go", "--base-url", server.url, cwd=tmp_path)
    assert run.returncode == 0
    answered = [e for e in server.log if e.outcome == "ok" and e.usage is not None]
    read = sum(e.usage.cache_read_input_tokens for e in answered if e.usage)
    total = sum(e.usage.total_input_tokens for e in answered if e.usage)
    share = f"{read / total:.0%} read from cache"
    assert f"[session] {len(answered)} model requests · {total:,} input tokens ({share})" in (
        run.stderr
    )
    assert re.search(r"worker 1: finished after \d+ turns \(.*tokens.*\$0\.\d{3}\)", run.stderr)
    result = orchmode("budget", "--max-subagents", "50", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "subagents  6 launched of 50 (44 left)" in result.stdout
    tokens = int(result.stdout.split("tokens", 1)[1].split()[0].replace(",", ""))
    assert tokens > 0
    assert f"requests   {len(answered)} to the model" in result.stdout
    assert f"cache      {read / total:.0%} of input read from cache (main " in result.stdout
    missing = orchmode("budget", "--session", "nope", cwd=tmp_path)
    assert_one_line_error(missing, "no session named 'nope'")


def test_budget_without_any_session_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(orchmode("budget", cwd=tmp_path), "no sessions are recorded")


@pytest.mark.slow
def test_a_soak_with_a_fifth_of_requests_failing_delivers_everything(
    scripted: Any, tmp_path: Path
) -> None:
    """200 subtasks; one request in five fails on its first try, in every way the API fails."""
    from orchmode.testing import FaultSchedule

    scenario = OrchestrationScenario(subtasks=200, worker_command=None, scout_command=None)
    respond = FaultSchedule(scenario, rate=0.2)
    server = scripted(respond)
    result = orchmode(
        "run", "go", "--base-url", server.url, "--max-concurrent", "20", cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "Synthesis: 200 agents reported; 200 results were confirmed." in result.stdout
    assert len(respond.injected) >= 60 and len(set(respond.injected)) == 5


@pytest.mark.slow
def test_demo_runs_without_a_key_and_says_the_model_is_scripted(tmp_path: Path) -> None:
    env = {k: v for k, v in base_env().items() if k != "ANTHROPIC_API_KEY"}
    result = orchmode("demo", "--subtasks", "3", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith("[demo] the model here is orchmode's scripted test server")
    assert "Synthesis: 3 agents reported; 3 results were confirmed." in result.stdout
    assert "continue it with" not in result.stderr  # its records went with the directory
    assert not (tmp_path / ".orchmode").exists()  # nothing left where it was started
    # the second pass is served by the journal; then the ledger, then the report
    assert "worker 3: result taken from the journal" in result.stderr
    assert "subagents  0 launched of 500 (500 left)" in result.stdout
    report = Path(result.stdout.rsplit("to open in a browser: ", 1)[1].strip())
    try:
        assert report.read_text().count('class="bar role-worker state-journal"') == 3
    finally:
        report.unlink()


def _options_in_help(command: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    from orchmode.cli.commands import main

    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    return re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", text, re.M)


@pytest.mark.parametrize(
    "command", ["budget", "show", "runs", "report", "approvals", "approve", "deny"]
)
def test_a_command_that_reads_the_store_lists_only_the_options_it_uses(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    options = _options_in_help(command, capsys)
    assert "--workdir" in options and "--config" in options
    assert not {"--sandbox", "--worker-effort", "--model", "--max-concurrent"} & set(options)
    assert len(options) <= 12, options


def test_a_command_that_starts_a_session_takes_every_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchmode.core.settings import flag, flag_names

    for command in ("run", "resume", "chat"):
        options = set(_options_in_help(command, capsys))
        assert {flag(name) for name in flag_names()} <= options, command
