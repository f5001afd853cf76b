"""Output modes: the Rich live view fed by a real session's events, and `run --json`/`--plain`."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from conftest import StartServer, conversation_for, settings_for, store_for
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
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BashStarted,
    Event,
    EventBus,
    FanoutStarted,
    NetworkConnection,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)
from orchmode.core.settings import Settings
from orchmode.records.totals import SessionTotals
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views.display import JsonDisplay, PlainDisplay
from orchmode.views.live import DONE, JOURNAL, SKIPPED, LiveView
from test_cli import orchmode


def refute_two(prompt: str) -> str:
    return "refuted" if "<subtask>\nCheck item 2\n" in prompt else "confirmed"


async def record_turn(settings: Settings, tmp_path: Path, *views: Any) -> list[Event]:
    """One real orchestrated turn against the scripted server; its events, in order."""
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    for view in views:
        events.subscribe(view)
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    try:
        session.set_mode(True)
        result = await session.turn("review this")
        assert result.ok, result.text
    finally:
        await session.close()
    return seen


class Clock:
    """Time that moves only when told: elapsed columns are then exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


#: The role column's words: a resolution's verifier is told from its subtask's verifier.
ROLES = r"verifier \(resolution\)|worker|verifier|resolver"


def rows_of(text: str) -> dict[tuple[int, str], str]:
    """The agent rows of a rendered table: (number, role as shown) -> the whole line."""
    rows = {}
    for line in text.splitlines():
        match = re.match(rf"^\S?\s*(\d+)\s+\S?\s*(.+?)\s+\S?\s*({ROLES})(?!\w| \()", line)
        if match:
            rows[(int(match.group(1)), match.group(3))] = line
    return rows


def render(view: LiveView) -> str:
    console = Console(file=io.StringIO(), width=160, force_terminal=True, color_system=None)
    console.print(view.renderable())
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output


async def test_the_live_view_draws_every_agent_of_a_real_run(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=4, verdict=refute_two))
    # Seven subagents for four chains: exactly one agent is skipped by the budget.
    settings = settings_for(server, tmp_path, max_subagents=7)
    totals = SessionTotals()
    events = await record_turn(settings, tmp_path, totals)
    assert isinstance(events[0], TurnStarted) and isinstance(events[-1], TurnDone)

    clock = Clock()
    view = LiveView(totals, clock=clock)  # no console: state and rendering only
    for event in events:
        view(event)
    clock.now += 5
    text = render(view)

    rows = rows_of(text)
    done = [e for e in events if isinstance(e, SubagentDone)]
    assert set(rows) == {(e.index, e.role) for e in done}
    skipped = [e for e in done if e.status == "skipped"]
    assert len(skipped) == 1 and len(rows) in (7, 8)  # a skipped worker has no verifier
    for event in done:
        line = rows[(event.index, event.role)]
        assert (SKIPPED if event.status == "skipped" else DONE) in line, line
        assert f"Check item {event.index}" in line
        if event.role == "verifier" and event.status == "finished":
            expected = "refuted" if event.index == 2 else "confirmed"
            assert line.rstrip().rstrip("│").rstrip().endswith(expected), line
            assert f"{event.duration:.1f} s" in line
        if event.status == "finished":
            tokens = event.usage.total_input + event.usage.output_tokens
            assert f"{tokens:,}" in line and f"${event.cost:.3f}" in line
    finished = sum(e.status != "skipped" and e.role == "worker" for e in done)
    assert f"workers {finished + (skipped[0].role == 'worker')}/4" in text
    bash = [e for e in events if isinstance(e, BashDone)]
    assert len(
        re.findall(r"\[(?:main|worker \d\.\d)\]\s+\$ \w+\s+\d+\.\d s\s+exit 0", text)
    ) == len(bash)

    total = totals.all
    assert total.requests == sum(1 for e in events if type(e).__name__ == "ModelRequestDone")
    tokens = total.usage.total_input + total.usage.output_tokens
    footer = (
        f"session · {total.requests} requests · {tokens:,} tokens · "
        f"{total.usage.cache_hit:.0%} cache hit · ${total.cost:.2f} · 5.0 s"
    )
    assert footer in text and total.cost > 0
    assert "budget: 7 of 7 subagents launched" in " ".join(text.split())  # what is left


async def test_a_rerun_shows_journal_hits_and_the_live_region_is_drawn(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3))
    settings = settings_for(server, tmp_path)
    await record_turn(settings, tmp_path)
    stream = io.StringIO()
    console = Console(file=stream, width=160, force_terminal=True, color_system=None)
    totals = SessionTotals()
    view = LiveView(totals, console)
    await record_turn(settings, tmp_path, totals, view)
    assert view._live is None  # TurnDone stopped it
    rows = rows_of(render(view))
    assert len(rows) == 6 and all(JOURNAL in line for line in rows.values())
    # The final frame was written to the terminal stream when the turn ended.
    drawn = stream.getvalue()
    assert "Workflow 1 (fan-out) · workers 3/3 · verifiers 3/3" in drawn
    assert "journal hit" in drawn and "session · " in drawn


@pytest.mark.slow
def test_run_json_puts_one_event_per_line_on_stderr(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=2))
    result = orchmode("run", "go", "--json", "--base-url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "In brief:" in result.stdout and "{" not in result.stdout.splitlines()[0]
    records = [json.loads(line) for line in result.stderr.splitlines()]
    kinds = {r["kind"] for r in records}
    expected = {
        "TurnStarted", "TurnDone", "ModelRequestDone", "BashStarted", "BashDone", "BudgetStatus",
        "FanoutStarted", "FanoutDone", "SubagentStarted", "SubagentDone", "Notice",
        "WorkspacesChosen",
    }  # fmt: skip
    assert kinds == expected
    verdicts = [r["verdict"] for r in records if r["kind"] == "SubagentDone"]
    assert verdicts.count("confirmed") == 2
    request = next(r for r in records if r["kind"] == "ModelRequestDone")
    assert request["usage"]["input_tokens"] >= 0 and "cost" in request
    assert [r["kind"] for r in records].count("TurnStarted") == 2
    (chosen,) = [r for r in records if r["kind"] == "WorkspacesChosen"]
    assert chosen["overlays"] is True and chosen["reason"] == ""


@pytest.mark.slow
def test_run_plain_and_piped_stderr_give_the_plain_lines(scripted: Any, tmp_path: Path) -> None:
    server = scripted(OrchestrationScenario(subtasks=2))
    for extra in (["--plain"], []):
        result = orchmode("run", "go", *extra, "--base-url", server.url, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "[workflow 1] fanning out 2 subtasks" in result.stderr
        assert "[main] $ ls" in result.stderr and "[session] " in result.stderr
        assert "{" not in result.stderr


def test_json_and_plain_are_exclusive(tmp_path: Path) -> None:
    result = orchmode("run", "x", "--json", "--plain", cwd=tmp_path)
    assert result.returncode == 2 and "not allowed with" in result.stderr


@pytest.mark.slow
def test_demo_json_starts_with_the_banner_as_a_notice(tmp_path: Path) -> None:
    result = orchmode("demo", "--subtasks", "2", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = json.loads(result.stderr.splitlines()[0])
    assert first["kind"] == "Notice" and first["text"].startswith("[demo] the model here")


def test_a_running_agent_shows_the_command_it_is_running_now() -> None:
    view = LiveView(SessionTotals(), clock=Clock())
    view(TurnStarted("go", ()))
    view(FanoutStarted(call=1, subtasks=2, not_run=0))
    view(SubagentStarted(1, 1, "worker", "Check item 1", "Check item 1"))
    view(BashStarted("worker 1.1", "pytest -q tests/test_parser.py"))
    line = rows_of(render(view))[(1, "worker")]
    assert "$ pytest -q tests/test_parser.py" in line and "running" in line
    view(BashDone("worker 1.1", "pytest -q tests/test_parser.py", 0, False, 1.5, "off"))
    assert "$ pytest" not in rows_of(render(view))[(1, "worker")]


def header_of(text: str) -> list[str]:
    """The column names of the rendered agent table."""
    line = next(line for line in text.splitlines() if "subtask" in line and "role" in line)
    return [cell.strip() for cell in line.strip("│┃ ").replace("┃", "│").split("│")]


def fan_out_on(*nodes: tuple[str, str]) -> LiveView:
    """A live view of one fan-out: worker i starts on nodes[i][0] and ends on nodes[i][1]."""
    view = LiveView(SessionTotals(), clock=Clock())
    view(TurnStarted("go", ()))
    view(FanoutStarted(call=1, subtasks=len(nodes), not_run=0))
    usage = TokenUsage(10, 5, 0, 0)
    for index, (started, done) in enumerate(nodes, 1):
        view(SubagentStarted(1, index, "worker", f"Check item {index}", "p", node=started))
        view(SubagentDone(1, index, "worker", "finished", 1, usage, 2.0, node=done))
    return view


def test_agents_on_ray_nodes_show_their_node_in_a_node_column() -> None:
    # worker 3's first node was lost: it was started again on, and finished on, another
    view = fan_out_on(("127.0.0.2", "127.0.0.2"), ("127.0.0.3", "127.0.0.3"),
                      ("127.0.0.2", "127.0.0.3"))  # fmt: skip
    text = render(view)
    header = header_of(text)
    assert header[:5] == ["#", "subtask", "role", "node", "state"], header
    rows = rows_of(text)
    assert len(rows) == 3
    for index, node in [(1, "127.0.0.2"), (2, "127.0.0.3"), (3, "127.0.0.3")]:
        cells = [c.strip() for c in rows[(index, "worker")].strip("│ ").split("│")]
        assert cells[header.index("node")] == node, cells
        assert cells[header.index("state")] == DONE, cells


def test_a_node_shows_while_the_agent_runs_and_a_local_run_has_no_node_column() -> None:
    local = render(fan_out_on(("", ""), ("", "")))
    assert "node" not in header_of(local) and "node" not in local
    assert header_of(local)[:4] == ["#", "subtask", "role", "state"]
    view = LiveView(SessionTotals(), clock=Clock())
    view(FanoutStarted(call=1, subtasks=2, not_run=0))
    view(SubagentStarted(1, 1, "worker", "Check item 1", "p", node="127.0.0.2"))
    text = render(view)
    assert "node" in header_of(text)
    assert "127.0.0.2" in rows_of(text)[(1, "worker")]
    assert "127.0.0.2" not in rows_of(text)[(2, "worker")]  # still queued: no node yet


def test_plain_lines_say_which_node_an_agent_ran_on() -> None:
    stream = io.StringIO()
    display = PlainDisplay(stream)
    usage = TokenUsage(10, 5, 0, 0)
    display(SubagentStarted(1, 1, "worker", "Check item 1", "p", node="127.0.0.2"))
    display(SubagentDone(1, 1, "worker", "finished", 2, usage, 1.0, node="127.0.0.2"))
    display(SubagentDone(1, 2, "worker", "finished", 2, usage, 1.0))
    display(SubagentDone(1, 1, "verifier", "finished", 1, usage, 1.0, verdict="confirmed",
                         node="127.0.0.3"))  # fmt: skip
    first, local, verify = stream.getvalue().splitlines()
    assert first.startswith("[workflow 1] worker 1: finished after 2 turns (")
    assert first.endswith(") on 127.0.0.2")
    assert local.startswith("[workflow 1] worker 2: ") and local.endswith(")")
    assert "on 127" not in local
    assert verify.startswith("[workflow 1] verify 1: confirmed (")
    assert verify.endswith(") on 127.0.0.3")


# --- the network proxy's connections and the approvals ------------------------------------


async def test_a_parked_agent_shows_its_question_and_how_to_answer_it_until_answered(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    events, _ = await networked_turn(server, tmp_path, sandbox="off")
    clock = Clock()
    stream = io.StringIO()
    console = Console(file=stream, width=160, force_terminal=True, color_system=None)
    view = LiveView(SessionTotals(), console, clock=clock)
    asked = answered = ""
    for event in events:
        view(event)
        if isinstance(event, ApprovalRequested):
            clock.now += 42  # the agent waits while the user decides
            asked = render(view)
        elif isinstance(event, ApprovalAnswered):
            answered = render(view)
    flat = " ".join(asked.split())
    box = asked[asked.index("╭─ waiting for approval") : asked.index("╰")].splitlines()[1:]
    box = [line.strip("│ ") for line in box]
    assert box == [
        f"worker 1.2 · approval {APPROVAL_ID} · waiting 42 s",
        f"domain {ASKED} ({ASK_WHY})",
        f"answer: /approve {APPROVAL_ID} or /deny {APPROVAL_ID} · from another terminal: "
        f"orchmode approve {APPROVAL_ID}",
    ]
    assert f"/approve {APPROVAL_ID}" in flat and f"orchmode approve {APPROVAL_ID}" in flat
    assert f"waiting for approval {APPROVAL_ID}" in rows_of(asked)[(2, "worker")]
    assert "waiting for approval" not in rows_of(asked)[(1, "worker")]
    assert "waiting for approval" not in answered and "/approve" not in answered
    # once answered, the answer stays above the live region
    said = " ".join(stream.getvalue().split())
    assert f"approval {APPROVAL_ID} · worker 1.2: approved after 42.0 s (remembered" in said


async def test_allowed_connections_are_counted_per_agent_and_each_refused_domain_listed_once(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    events, _ = await networked_turn(server, tmp_path, sandbox="off")
    view = LiveView(SessionTotals(), clock=Clock())
    for event in events:
        view(event)
    text = render(view)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "[worker 1.1] 32 allowed to 2 domains · 5.2 MB in, 29.4 kB out · 3 denied" in lines
    assert "[worker 1.2] 1 approved to 1 domain · 5.0 kB in, 300 B out" in lines
    refused = [line for line in lines if REFUSED in line]
    assert refused == [f"[worker 1.1] denied {REFUSED}:443 ({DENY_RULE}) ×3"]
    assert INDEX not in text and FILES not in text  # allowed ones are counted, not listed


async def test_plain_lines_say_each_refusal_once_and_the_question_with_its_answer(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    stream = io.StringIO()
    await networked_turn(server, tmp_path, PlainDisplay(stream), sandbox="off")
    lines = stream.getvalue().splitlines()
    assert [line for line in lines if REFUSED in line] == [
        f"[worker 1.1] network: denied {REFUSED}:443 ({DENY_RULE})"
    ]
    assert not [line for line in lines if INDEX in line or FILES in line]
    asking = [line for line in lines if "approval" in line]
    assert asking == [
        f"[worker 1.2] waiting for approval {APPROVAL_ID}: domain {ASKED} ({ASK_WHY}) — "
        f"answer: /approve {APPROVAL_ID} or /deny {APPROVAL_ID} · from another terminal: "
        f"orchmode approve {APPROVAL_ID}",
        f"[worker 1.2] approval {APPROVAL_ID} approved (remembered for this directory): "
        "the user said so",
    ]
    assert lines.index(asking[0]) < lines.index(asking[1])


async def test_json_lines_carry_every_connection_and_approval_event(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    stream = io.StringIO()
    await networked_turn(server, tmp_path, JsonDisplay(stream), sandbox="off")
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds.count("NetworkConnection") == 36
    (asked,) = [r for r in records if r["kind"] == "ApprovalRequested"]
    (answer,) = [r for r in records if r["kind"] == "ApprovalAnswered"]
    assert asked["what"] == ASKED and asked["why"] == ASK_WHY and asked["id"] == APPROVAL_ID
    assert asked["kind_"] == "domain"  # the event's own field, not lost under the record's kind
    assert answer["answer"] == "approved" and answer["always"] is True
    denied = [r for r in records if r.get("decision") == "denied"]
    assert {(r["domain"], r["port"], r["rule"]) for r in denied} == {(REFUSED, 443, DENY_RULE)}
    assert kinds.index("ApprovalRequested") < kinds.index("ApprovalAnswered")


def test_connections_let_through_do_not_each_redraw_the_live_region() -> None:
    """A pip install in each of many agents makes thousands of connections: each moves only
    a count, drawn with the region's next timed redraw; a refusal is drawn at once."""
    stream = io.StringIO()
    console = Console(file=stream, width=160, force_terminal=True, color_system=None)
    view = LiveView(SessionTotals(), console)
    view(TurnStarted("go", ()))
    try:
        for n in range(1000):
            view(NetworkConnection("main", INDEX, 443, "allowed", "", 1, n, 0.0))
        drawn = stream.getvalue().count("session · ")
        assert drawn < 100, drawn  # the timed redraws only (four a second), not 1000
        view(NetworkConnection("main", REFUSED, 443, "denied", DENY_RULE, 0, 0, 0.0))
        assert stream.getvalue().count("session · ") > drawn  # drawn at once
        assert f"denied {REFUSED}:443" in stream.getvalue().rsplit("network", 1)[1]
    finally:
        view.stop()
