"""Run history: turn records from events (pure), and `orchmode runs` / `show` on real runs."""

from __future__ import annotations

import io
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import StartServer
from network_runs import (
    APPROVAL_ID,
    ASK_WHY,
    ASKED,
    DENY_RULE,
    FILES,
    INDEX,
    REFUSED,
    networked_turn,
)
from orchmode.core.events import (
    Event,
    FanoutDone,
    FanoutStarted,
    NetworkConnection,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)
from orchmode.core.results import read_report
from orchmode.records.codec import event_row, parse_row
from orchmode.records.history import answers, read_session
from orchmode.records.network import DECISIONS, NetworkLog
from orchmode.store import EventRow
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views.run_table import RUN_COLUMNS, format_columns, print_table, run_rows
from orchmode.views.transcript import plain, print_lines, transcript
from recorded_runs import (
    FindingsScenario,
    agents_done,
    base_env,
    events,
    orchmode,
    refute_item_two,
    run,
    scripted_server,
    store_path,
    turn_costs,
)

# --- pure: turn records from rows ---------------------------------------------------------


class Rows:
    """Event rows numbered and timed in order, as the recorder writes them."""

    def __init__(self) -> None:
        self.rows: list[EventRow] = []

    def add(self, kind: str, at: float | None = None, /, **data: Any) -> Rows:
        seq = len(self.rows) + 1
        self.rows.append(EventRow(seq, 1000.0 + seq if at is None else at, kind, json.dumps(data)))
        return self

    def raw(self, kind: str, data: str, at: Any = 1.0) -> Rows:
        self.rows.append(EventRow(len(self.rows) + 1, at, kind, data))
        return self


USAGE = {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 80, "cache_write_tokens": 5}


def finding(claim: str, severity: str = "info") -> str:
    return json.dumps(
        {"summary": "s", "findings": [{"claim": claim, "evidence": "e", "severity": severity}]}
    )


def agent(rows: Rows, call: int, index: int, role: str, **done: Any) -> None:
    """A subagent that starts, runs one command and one request, and finishes."""
    rows.add("SubagentStarted", call=call, index=index, role=role, title=f"t{index}", prompt="p")
    rows.add("BashDone", agent=f"{role} {call}.{index}", command="pwd", exit_code=0,
             timed_out=False, duration=0.1, sandbox="off")  # fmt: skip
    rows.add("ModelRequestDone", agent=f"{role} {call}.{index}", usage=USAGE, cost=0.5)
    values = {"status": "finished", "turns": 1, "usage": USAGE, "duration": 1.0}
    values.update(done)
    rows.add("SubagentDone", call=call, index=index, role=role, **values)


def test_turn_status_is_finished_failed_or_interrupted() -> None:
    rows = Rows()
    for text, stop in [("a", "end_turn"), ("b", "turn_limit"), ("c", "error"), ("d", None)]:
        rows.add("TurnStarted", text=f"{text}\nmore", notices=[])
        if stop is not None:
            rows.add("TurnDone", stop=stop, model_calls=1)
    turns = read_session(rows.rows).turns
    assert [t.status for t in turns] == ["finished", "failed", "failed", "interrupted"]
    assert [t.status_text for t in turns][1] == "failed (turn_limit)"
    assert [t.task for t in turns] == ["a", "b", "c", "d"]


def test_agents_are_counted_per_turn_with_journal_hits_and_skips() -> None:
    rows = Rows().add("TurnStarted", text="go", notices=["enter"])
    rows.add("ModelRequestDone", agent="main", usage=USAGE, cost=0.25)
    rows.add("BashDone", agent="main", command="ls", exit_code=0, timed_out=False,
             duration=0.2, sandbox="off")  # fmt: skip
    rows.add("FanoutStarted", call=1, subtasks=3, not_run=0)
    agent(rows, 1, 1, "worker", result=finding("one", "high"))
    agent(rows, 1, 1, "verifier", verdict="refuted", result=finding("nope"))
    # a journal hit and a budget skip never start; they only finish
    rows.add("SubagentDone", call=1, index=2, role="worker", status="finished", turns=1,
             usage=USAGE, duration=0.0, from_journal=True, result=finding("two"))  # fmt: skip
    rows.add("SubagentDone", call=1, index=3, role="worker", status="skipped", turns=0,
             duration=0.0)  # fmt: skip
    rows.add("FanoutDone", call=1, duration=3.0).add("TurnDone", stop="end_turn", model_calls=2)
    # a resumed process numbers its Workflow calls from 1 again
    rows.add("TurnStarted", text="again", notices=["refresh"])
    agent(rows, 1, 1, "worker", status="failed", result="[orchmode: the agent failed]")
    history = read_session(rows.rows, session="s")
    first, second = history.turns
    assert [len(first.agents), len(second.agents)] == [4, 1]
    states = [(a.name, a.state) for a in first.agents]
    assert states == [("worker 1.1", "done"), ("verifier 1.1", "done"),
                      ("worker 1.2", "journal"), ("worker 1.3", "skipped")]  # fmt: skip
    assert second.agents[0].state == "failed" and second.agents[0].report is None
    assert first.cost == pytest.approx(0.25 + 0.5 * 2) and second.cost == pytest.approx(0.5)
    assert [c.command for c in first.agents[0].commands] == ["pwd"]
    assert [type(s).__name__ for s in first.steps] == ["Command", "Fanout"]
    report = first.agents[0].report
    assert report is not None and report.findings[0].severity == "high"
    fanout = first.fanouts[0]
    verifier = fanout.verifier_of(first.agents[0])
    assert verifier is not None and verifier.verdict == "refuted"
    assert history.totals.all.requests == 4 and history.totals.all.cost == pytest.approx(1.75)
    assert len(history.agents) == 5 and history.skipped == 0
    hit = first.agents[2]
    assert hit.started_at == hit.done_at  # no start event: it took no time


def test_a_script_s_verifier_is_paired_with_the_worker_its_prompt_quotes() -> None:
    rows = Rows().add("TurnStarted", text="go", notices=[]).add("ScriptStarted", call=1, lines=4)
    for index, prompt in [(1, "Check the parser"), (2, "Check the cache")]:
        rows.add("SubagentStarted", call=1, index=index, role="worker", title=prompt,
                 prompt=prompt)  # fmt: skip
        rows.add("SubagentDone", call=1, index=index, role="worker", status="finished",
                 result=finding(f"{prompt} is fine"))  # fmt: skip
    quoted = f"Verify: <subtask>Check the cache</subtask> {finding('Check the cache is fine')}"
    rows.add("SubagentStarted", call=1, index=3, role="verifier", prompt=quoted)
    rows.add("SubagentDone", call=1, index=3, role="verifier", status="finished",
             verdict="refuted", result=finding("no"))  # fmt: skip
    rows.add("ScriptDone", call=1, duration=2.0, agents=3, error=None)
    (fanout,) = read_session(rows.rows).turns[0].fanouts
    parser, cache, verifier = fanout.agents
    assert fanout.verifier_of(parser) is None and fanout.verifier_of(cache) is verifier
    assert fanout.describe() == "workflow 1: script of 4 lines, 3 agents · 2.0 s"


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("SubagentDone", "{not json"),
        ("SubagentDone", '["a", "list"]'),
        ("SubagentDone", '{"call": 1, "index": 1, "role": "worker"}'),  # no status
        ("SubagentDone", '{"call": "1", "index": 1, "role": "worker", "status": "finished"}'),
        ("SubagentDone", '{"call": 1, "index": 1, "role": "boss", "status": "finished"}'),
        ("SubagentDone", '{"call": true, "index": 1, "role": "worker", "status": "finished"}'),
        ("SubagentStarted", '{"call": 1, "role": "worker"}'),
        ("SubagentStarted", '{"call": 1, "index": 1, "role": "worker", "node": 3}'),
        ("SubagentDone", '{"call": 1, "index": 1, "role": "worker", "status": "x", "node": []}'),
        ("ModelRequestDone", '{"agent": "main", "usage": "lots", "cost": 1}'),
        ("ModelRequestDone", '{"agent": "main", "usage": {"input_tokens": "9"}, "cost": 1}'),
        ("BashDone", '{"agent": "main"}'),
        ("TurnStarted", '{"text": "x", "notices": "enter"}'),
        ("TurnDone", '{"model_calls": 3}'),
        ("SomethingNew", '{"call": 1}'),
        ("SubagentDone", "null"),
    ],
)
def test_a_malformed_row_is_skipped_and_the_rest_still_read(kind: str, data: str) -> None:
    rows = Rows().add("TurnStarted", text="go", notices=[])
    rows.raw(kind, data, at=1001.5)
    agent(rows, 1, 1, "worker")
    rows.add("TurnDone", stop="end_turn", model_calls=1)
    history = read_session(rows.rows)
    assert history.skipped == 1
    assert [t.status for t in history.turns] == ["finished"]
    assert [a.state for a in history.agents] == ["done"]
    assert history.totals.all.cost == pytest.approx(0.5)
    assert "1 unreadable event rows were left out" in _plain(history)


def test_a_row_with_a_bad_time_is_skipped() -> None:
    rows = Rows().add("TurnStarted", text="go", notices=[]).raw("TurnDone", '{"stop": "x"}', "?")
    history = read_session(rows.rows)
    assert history.skipped == 1 and history.turns[0].status == "interrupted"


def test_events_before_any_turn_count_in_the_totals_only() -> None:
    rows = Rows().add("ModelRequestDone", agent="main", usage=USAGE, cost=2.0)
    history = read_session(rows.rows)
    assert history.turns == [] and history.totals.all.cost == 2.0
    assert run_rows([history])[0][3] == "(no turns recorded)"


KINDS = [
    "TurnStarted", "TurnDone", "ModelRequestDone", "BashDone", "FanoutStarted", "FanoutDone",
    "SubagentStarted", "SubagentDone", "ScriptStarted", "ScriptDone", "X",
]  # fmt: skip
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    ["call", "index", "role", "status", "usage", "text", "notices", "stop", "agent", "command",
     "result", "verdict", "duration", "cost", "from_journal", "exit_code", "subtasks", "lines",
     "node"]
)  # fmt: skip
DATA = st.dictionaries(FIELDS, JSON | st.sampled_from(["worker", "verifier", "worker 1.1"]))


@given(st.lists(st.tuples(st.sampled_from(KINDS), DATA | JSON, st.floats()), max_size=25))
def test_no_sequence_of_rows_crashes_the_reader(rows: list[tuple[str, Any, float]]) -> None:
    events = [EventRow(i, at, kind, json.dumps(data)) for i, (kind, data, at) in enumerate(rows)]
    history = read_session(events, state='{"history": "nope"}')
    _plain(history)
    run_rows([history])
    from orchmode.views.report import render_report

    render_report(history)


def test_a_report_with_junk_findings_keeps_what_it_can() -> None:
    text = json.dumps({"summary": "s", "findings": [1, {"claim": "c", "severity": "HIGH "},
                                                     {"evidence": "no claim"}]})  # fmt: skip
    report = read_report(text)
    assert report is not None and [(f.claim, f.severity) for f in report.findings] == [
        ("c", "high")
    ]
    assert read_report("[orchmode: stopped]") is None and read_report("[1]") is None


def test_answers_pair_with_user_turns_only_when_the_count_matches() -> None:
    history = [
        {"role": "user", "content": "one"},
        {"role": "system", "content": "mode on"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "a", "name": "bash", "input": {"command": "ls"}}
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]},
        {"role": "user", "content": "two"},
    ]
    state = json.dumps({"history": history})
    assert answers(state, 2) == ["first answer", None]
    assert answers(state, 3) == [None, None, None]
    assert answers("not json", 1) == [None]
    # A history that is not one (as restoring it would say) pairs nothing.
    broken = json.dumps({"history": [*history[:2], {"role": "assistant"}, *history[2:]]})
    assert answers(broken, 2) == [None, None]


def test_plain_columns_line_up() -> None:
    table = format_columns(("A", "TURN", "B"), [("x", "1", "long value"), ("yyyy", "12", "z")])
    lines = table.splitlines()
    assert lines == ["A     TURN  B", "x        1  long value", "yyyy    12  z"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_user_text_is_never_read_as_rich_markup() -> None:
    rows = Rows().add("TurnStarted", text="[b]x[/b] [red]", notices=[])
    history = read_session(rows.rows, session="s1")
    for render in (
        lambda out: print_lines(transcript(history), out),
        lambda out: print_table(RUN_COLUMNS, run_rows([history]), out),
    ):
        out = Terminal()
        render(out)
        text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
        assert "[b]x[/b] [red]" in text, text


def recorded(*events: Event) -> list[EventRow]:
    """Events as the recorder writes them (their dataclass fields as JSON), a second apart."""
    return [replace(event_row(seq, event), at=1000.0 + seq) for seq, event in enumerate(events)]


def fanout_on(nodes: dict[tuple[int, str], tuple[str, str]]) -> list[Event]:
    """One turn, one fan-out: per (index, role), the node it started on and the one it ended on."""
    usage = TokenUsage(10, 5, 80, 5)
    events: list[Event] = [TurnStarted("go", ()), FanoutStarted(1, subtasks=2, not_run=0)]
    for (index, role), (started, done) in nodes.items():
        assert role in ("worker", "verifier")
        events.append(SubagentStarted(1, index, role, f"Check item {index}", "p", node=started))
        events.append(SubagentDone(1, index, role, "finished", 2, usage, 1.5, cost=0.25, node=done))
    return [*events, FanoutDone(1, 9.0), TurnDone("end_turn", 3)]


def agent_lines(text: str) -> dict[str, str]:
    """The transcript's head line of each agent, by its name."""
    found = re.findall(r"^    ((?:worker|verifier) \d+\.\d+) · (.*)$", text, flags=re.M)
    return {name: line for name, line in found}


def test_show_names_the_node_each_agent_ran_on() -> None:
    events = fanout_on(
        {
            (1, "worker"): ("127.0.0.2", "127.0.0.2"),
            (1, "verifier"): ("127.0.0.3", "127.0.0.3"),
            # started on a node that was lost, rerun and finished on another: the end wins
            (2, "worker"): ("127.0.0.2", "127.0.0.3"),
        }
    )
    # a budget skip never starts and never runs anywhere
    skip = SubagentDone(1, 3, "worker", "skipped", 0, TokenUsage(), 0.0)
    history = read_session(recorded(*events[:-2], skip, *events[-2:]), session="s")
    nodes = {a.name: a.node for a in history.agents}
    assert nodes == {"worker 1.1": "127.0.0.2", "verifier 1.1": "127.0.0.3",
                     "worker 1.2": "127.0.0.3", "worker 1.3": ""}  # fmt: skip
    lines = agent_lines(_plain(history))
    assert set(lines) == set(nodes)
    for name, node in nodes.items():
        if node:
            assert f" · node {node} · " in lines[name], lines[name]
        else:
            assert "node" not in lines[name], lines[name]
    assert "127.0.0.2" not in lines["worker 1.2"]


def test_a_run_without_nodes_shows_no_node() -> None:
    events = fanout_on({(1, "worker"): ("", ""), (1, "verifier"): ("", "")})
    history = read_session(recorded(*events), session="s")
    assert [a.node for a in history.agents] == ["", ""]
    text = _plain(history)
    assert "node" not in text
    # exactly the line a local run has always had
    lines = agent_lines(text)
    assert lines["worker 1.1"] == "Check item 1 · done · 2 turns · 100 tokens · $0.2500 · 1.5 s"


def test_an_old_record_without_a_node_still_loads() -> None:
    old = {"call": 1, "index": 1, "role": "worker", "title": "t", "prompt": "p"}
    started = parse_row(EventRow(1, 1000.0, "SubagentStarted", json.dumps(old)))
    assert started == SubagentStarted(1, 1, "worker", "t", "p", node="")
    done = {"call": 1, "index": 1, "role": "worker", "status": "finished", "turns": 1}
    ended = parse_row(EventRow(2, 1001.0, "SubagentDone", json.dumps(done)))
    assert isinstance(ended, SubagentDone) and ended.node == ""
    rows = Rows().add("TurnStarted", text="go", notices=[])
    agent(rows, 1, 1, "worker")  # written without a node, as orchmode did before
    assert all("node" not in json.loads(row.data) for row in rows.rows)
    history = read_session(rows.rows)
    assert history.skipped == 0 and [(a.state, a.node) for a in history.agents] == [("done", "")]


def _plain(history: Any) -> str:
    out = io.StringIO()
    print_lines(transcript(history), out)
    return out.getvalue()


# --- the CLI on real runs -----------------------------------------------------------------


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchmode: "), result.stderr
    for needle in needles:
        assert needle in lines[0]


def runs_table(tmp_path: Path) -> list[str]:
    result = orchmode("runs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_runs_lists_a_session_with_its_agents_and_recorded_cost(tmp_path: Path) -> None:
    with scripted_server(FindingsScenario(subtasks=3)) as server:
        session = run(server, tmp_path, "review the code\nsecond line of the task")
    header, first, second, *rest = runs_table(tmp_path)
    assert rest == []
    assert header.split() == ["RUN", "WHEN", "TURN", "TASK", "AGENTS", "COST", "STATUS"]
    costs = turn_costs(tmp_path, session)
    assert len(costs) == 2 and costs[0] > 0
    assert re.fullmatch(
        rf"{session}  [\d-]+ [\d:]+  +1  review the code +6  \${costs[0]:.4f}  finished", first
    ), first
    assert re.search(rf"  2  Now give a brief summary.*  0  \${costs[1]:.4f}  finished$", second)
    assert len({line.index("$") for line in (first, second)}) == 1  # aligned
    assert len(agents_done(tmp_path, session)) == 6


@pytest.mark.slow
def test_show_prints_turns_notices_commands_findings_and_verdicts(tmp_path: Path) -> None:
    scenario = FindingsScenario(subtasks=4, verdict=refute_item_two)
    with scripted_server(scenario) as server:
        session = run(server, tmp_path, "audit the module")
    result = orchmode("show", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(f"session {session} · {tmp_path} · 2 turns")
    assert "  user    audit the module" in out
    assert "  mode    enter: orchestration mode ON" in out
    assert "  mode    exit: orchestration mode OFF" in out
    assert re.search(r"^  \$ ls  exit 0 · \d+\.\d s$", out, flags=re.M)
    assert "workflow 1: 4 subtasks" in out
    for n, severity in [(1, "high"), (2, "medium"), (3, "low"), (4, "info")]:
        assert re.search(rf"^      \[{severity}\] +item {n} has a {severity} issue$", out, re.M)
        assert f"evidence file{n}.py:{n}" in out
        assert re.search(rf"^    worker 1\.{n} · Check item {n} · done · 2 turns", out, re.M)
        verdict = "refuted" if n == 2 else "confirmed"
        assert re.search(rf"^    verifier 1\.{n} · {verdict} · done · 1 turn ", out, re.M)
    assert out.count("      $ pwd  exit 0") == 4
    assert "answer  Synthesis: 4 agents reported; 3 results were confirmed." in out
    requests = sum(1 for _, kind, _ in events(tmp_path, session) if kind == "ModelRequestDone")
    cost = sum(turn_costs(tmp_path, session))
    totals = out.strip().splitlines()[-1]
    assert totals.startswith(f"totals {requests} model requests · ")
    assert f" · ${cost:.4f} · 8 agents · " in totals


@pytest.mark.slow
def test_the_default_run_is_the_latest_of_two_sessions(tmp_path: Path) -> None:
    with scripted_server(FindingsScenario(subtasks=1)) as server:
        older = run(server, tmp_path, "the older task")
        newer = run(server, tmp_path, "the newer task")
    lines = runs_table(tmp_path)
    assert lines[1].startswith(newer) and lines[3].startswith(older)
    latest = orchmode("show", cwd=tmp_path)
    assert f"session {newer}" in latest.stdout and "the newer task" in latest.stdout
    assert "the older task" not in latest.stdout
    named = orchmode("show", older, cwd=tmp_path)
    assert "the older task" in named.stdout and "the newer task" not in named.stdout
    by_flag = orchmode("show", "--session", older, cwd=tmp_path)
    assert by_flag.stdout == named.stdout
    report = orchmode("report", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip() == f"orchmode-{newer}.html"
    assert newer in (tmp_path / f"orchmode-{newer}.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_report_goes_to_stdout_or_fails_in_one_line_when_unwritable(tmp_path: Path) -> None:
    with scripted_server(FindingsScenario(subtasks=1)) as server:
        session = run(server, tmp_path, "a task")
    printed = orchmode("report", "-o", "-", cwd=tmp_path)
    assert printed.returncode == 0 and printed.stdout.startswith("<!DOCTYPE html>")
    assert session in printed.stdout
    missing = tmp_path / "no" / "such" / "dir" / "r.html"
    failed = orchmode("report", "-o", str(missing), cwd=tmp_path)
    assert_one_line_error(failed, "cannot write the report to", str(missing))
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("command", ["show", "report"])
@pytest.mark.slow
def test_an_unknown_run_is_a_one_line_error(tmp_path: Path, command: str) -> None:
    with scripted_server(FindingsScenario(subtasks=1)) as server:
        run(server, tmp_path, "a task")
    result = orchmode(command, "no-such-run", cwd=tmp_path)
    assert_one_line_error(result, "no session named 'no-such-run'", "orchmode runs")
    assert result.stdout == ""


@pytest.mark.slow
def test_an_empty_store_says_so_in_one_line(tmp_path: Path) -> None:
    listed = orchmode("runs", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == ""
    assert listed.stdout.count("\n") == 1 and "no runs are recorded" in listed.stdout
    assert_one_line_error(orchmode("show", cwd=tmp_path), "no sessions are recorded")
    assert_one_line_error(orchmode("report", cwd=tmp_path), "no sessions are recorded")
    assert not store_path(tmp_path).exists()  # looking does not create a store
    # an existing store with no sessions in it says the same
    with scripted_server(FindingsScenario(subtasks=1)) as server:
        run(server, tmp_path, "x", "--session", "keep")
    other = tmp_path / "other"
    other.mkdir()
    listed = orchmode("runs", "--store", f"sqlite://{tmp_path / 'empty.db'}", cwd=other)
    assert listed.returncode == 0 and listed.stdout.count("\n") == 1
    assert "no runs are recorded" in listed.stdout


@pytest.mark.slow
def test_a_killed_run_is_listed_as_interrupted_and_can_be_shown(tmp_path: Path) -> None:
    scenario = FindingsScenario(subtasks=2, delay=0.3, worker_command="sleep 30")
    with scripted_server(scenario) as server:
        args = [sys.executable, "-m", "orchmode", "run", "slow task", "--base-url", server.url,
                "--sandbox", "off", "--session", "killed"]  # fmt: skip
        quiet = subprocess.DEVNULL
        process = subprocess.Popen(
            args, cwd=tmp_path, env=base_env(), stdin=quiet, stdout=quiet, stderr=quiet
        )
        deadline = time.monotonic() + 60
        try:
            while not any(kind == "BashDone" for _, kind, _ in _events_or_none(tmp_path)):
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)  # the workers are inside their `sleep 30`
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    lines = runs_table(tmp_path)
    assert re.search(r"^killed  .*  1  slow task .*interrupted$", lines[1]), lines
    shown = orchmode("show", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    # a turn's start records the session (its workdir and mode), so a resume can take it up
    assert f"session killed · {tmp_path} · 1 turn" in shown.stdout
    assert "continue it from its last recorded step with `orchmode resume killed`" in shown.stdout
    assert "turn 1 · " in shown.stdout and " · interrupted · " in shown.stdout
    assert re.search(r"worker 1\.1 · Check item 1 · interrupted$", shown.stdout, re.M)


def _events_or_none(workdir: Path) -> list[tuple[int, str, Any]]:
    try:
        return events(workdir, "killed")
    except Exception:  # not created yet, or locked for a moment
        return []


# --- network connections and approvals ----------------------------------------------------


def recorded_at(workdir: Path, session: str, kind: str) -> list[float]:
    """The times the store recorded ``kind``'s events at, read behind orchmode's back."""
    db = sqlite3.connect(store_path(workdir))
    try:
        query = "SELECT at FROM events WHERE session = ? AND kind = ? ORDER BY seq"
        return [at for (at,) in db.execute(query, (session, kind))]
    finally:
        db.close()


async def test_show_lists_each_agents_connections_and_every_approval_with_its_answer(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    _, session = await networked_turn(server, tmp_path, sandbox="off")
    result = orchmode("show", session, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    network = [line for line in lines if line.startswith(("network ", "allowed ", "denied ",
                                                          "approved "))]  # fmt: skip
    assert network == [
        "network worker 1.1: 32 allowed to 2 domains · 5.2 MB in, 29.4 kB out · 3 denied",
        f"allowed {INDEX}:443 (preset python-packages) ×30 · 1.2 MB in, 27.0 kB out",
        f"allowed {FILES}:443 (preset python-packages) ×2 · 4.0 MB in, 2.4 kB out",
        f"denied {REFUSED}:443 ({DENY_RULE}) ×3",
        "network worker 1.2: 1 approved to 1 domain · 5.0 kB in, 300 B out",
        f"approved {ASKED} ({ASK_WHY}) · 5.0 kB in, 300 B out",
    ]
    (asked,) = recorded_at(tmp_path, session, "ApprovalRequested")
    (answered,) = recorded_at(tmp_path, session, "ApprovalAnswered")
    waited = f"{answered - asked:.1f} s"
    (approval,) = [line for line in lines if line.startswith("approval ")]
    assert approval == (
        f"approval {APPROVAL_ID} worker 1.2: domain {ASKED} ({ASK_WHY}) · approved after "
        f"{waited} (remembered for this directory): the user said so"
    )
    # in its turn, after the fan-out and before the answer
    fanout = next(i for i, text in enumerate(lines) if "workflow 1:" in text)
    answer = next(i for i, text in enumerate(lines) if text.startswith("answer"))
    assert fanout < lines.index(network[0]) and lines.index(approval) < answer


def test_an_unanswered_approval_of_a_killed_run_reads_as_unanswered() -> None:
    rows = Rows().add("TurnStarted", text="go", notices=[])
    rows.add("ApprovalRequested", 1000.0, id=3, agent="main", kind="command", what="npm ci",
             why="Bash(npm ci) in .claude/settings.json (ask)")  # fmt: skip
    # a second process asked again after a resume: still one approval, asked at first
    rows.add("TurnStarted", text="go on", notices=[])
    rows.add("ApprovalRequested", 2000.0, id=3, agent="main", kind="command", what="npm ci",
             why="Bash(npm ci) in .claude/settings.json (ask)")  # fmt: skip
    rows.add("ApprovalAnswered", 2030.0, id=3, agent="main", answer="timed out")
    first, second = read_session(rows.rows).turns
    (pending,) = first.network.approvals.values()
    assert pending.pending and pending.outcome() == "no answer recorded"
    assert pending.waited() is None and pending.waited(1012.0) == 12.0
    (settled,) = second.network.approvals.values()
    assert (settled.answer, settled.waited(), settled.answered_by) == (
        "timed out", 30.0, "approval_timeout")  # fmt: skip
    text = plain(transcript(read_session(rows.rows)))
    assert "approval 3 main: command npm ci (Bash(npm ci) in .claude/settings.json (ask))" in text
    assert "· no answer recorded" in text and "· timed out after 30.0 s" in text


connections = st.lists(
    st.tuples(
        st.sampled_from(["main", "worker 1.1", "worker 1.2"]),
        st.sampled_from(["a.example", "b.example", "c.example"]),
        st.sampled_from([80, 443]),
        st.sampled_from(["allowed", "denied", "approved", "failed"]),
        st.sampled_from(["", "rule one", "rule two"]),
        st.integers(0, 10**9),
        st.integers(0, 10**9),
    ),
    max_size=40,
)


@given(connections)
def test_connections_are_summed_without_loss_and_each_refused_domain_said_once(
    made: list[tuple[str, str, int, str, str, int, int]],
) -> None:
    log = NetworkLog()
    for at, (agent, domain, port, decision, rule, sent, received) in enumerate(made):
        assert log.follow(NetworkConnection(agent, domain, port, decision, rule, sent, received,
                                            0.1), float(at))  # fmt: skip
    traffic = log.traffic()
    assert sum(t.count(*DECISIONS) for t in traffic) == len(made)
    assert sum(t.bytes_sent for t in traffic) == sum(c[5] for c in made)
    assert sum(t.bytes_received for t in traffic) == sum(c[6] for c in made)
    denials = log.denials()
    refused = {(c[0], c[1]) for c in made if c[3] == "denied"}
    assert [(r.agent, r.domain) for r in denials] == sorted(
        refused, key=lambda key: next(i for i, c in enumerate(made) if (c[0], c[1]) == key
                                      and c[3] == "denied"))  # fmt: skip
    assert sum(r.connections for r in denials) == sum(c[3] == "denied" for c in made)
