"""Compactions, condensed Workflow results and saved result files, wherever a run is shown.

The events go the way a run sends them: emitted on an EventBus to the plain progress, the
JSON lines, the live view and the recorder, which writes them into a real SQLite store. The
history, ``orchmode show`` and the HTML report then read them back from that store.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmode.core.events import (
    BashDone,
    ContextCompacted,
    Event,
    EventBus,
    FanoutDone,
    FanoutStarted,
    ModelRequestDone,
    ResultCondensed,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)
from orchmode.records.codec import event_row, parse_row
from orchmode.records.history import SessionHistory, read_session
from orchmode.records.recorder import EventRecorder
from orchmode.records.steps import Command
from orchmode.records.totals import SessionTotals
from orchmode.store import EventRow
from orchmode.store.sqlite import SQLiteStore
from orchmode.views.display import JsonDisplay, PlainDisplay
from orchmode.views.live import LiveView
from orchmode.views.report import render_report
from orchmode.views.transcript import plain, transcript
from recorded_runs import orchmode
from test_live import Clock, render, rows_of
from test_report import PAYLOAD, Dom, assert_self_contained

SESSION = "ctx"
USAGE = TokenUsage(100, 20, 800, 50)
RESULTS = ".orchmode/results/ctx"
WORKER_FILE = f"{RESULTS}/worker-0123456789ab.json"
OTHER_FILE = f"{RESULTS}/worker-ba9876543210.json"
WORKFLOW_FILE = f"{RESULTS}/workflow-aaaabbbbcccc.txt"


def finding(claim: str) -> str:
    return json.dumps(
        {"summary": "looked", "findings": [{"claim": claim, "evidence": "", "severity": "low"}]}
    )


def bash(agent: str, command: str) -> BashDone:
    return BashDone(agent, command, 0, False, 0.5, "off")


def done(index: int, claim: str, path: str) -> SubagentDone:
    """Worker ``index`` finishing with one finding, its full result saved at ``path``."""
    result = finding(claim)
    return SubagentDone(1, index, "worker", "finished", 3, USAGE, 2.0, result=result,
                        cost=0.02, report_path=path)  # fmt: skip


CONDENSED = ResultCondensed(
    1, 161_000, 49_800, 50_000, "31 low and 12 info findings not shown", WORKFLOW_FILE
)
REFUSED = ContextCompacted(
    "worker 1.2", "stubbed", 205_000, 150_000, "3 tool results, 40,000 tokens", refused=True
)


def a_turn_that_ran_out_of_room() -> list[Event]:
    """One turn in which both agents and the main agent had to be made smaller."""
    return [
        TurnStarted("audit the module", ("enter",)),
        ModelRequestDone("main", "m1", "tool_use", USAGE, 1.0, cost=0.01),
        ContextCompacted("main", "stubbed", 212_400, 96_100, "14 tool results, 61,200 tokens"),
        bash("main", "ls"),
        FanoutStarted(1, subtasks=2, not_run=0),
        SubagentStarted(1, 1, "worker", "Check item 1", "Check item 1"),
        SubagentStarted(1, 2, "worker", "Check item 2", "Check item 2"),
        bash("worker 1.1", "pytest -q"),
        ContextCompacted("worker 1.1", "api", 180_000, 120_000),
        bash("worker 1.1", "grep -rn TODO"),
        REFUSED,
        done(1, "item 1 leaks", WORKER_FILE),
        done(2, "item 2 races", OTHER_FILE),
        FanoutDone(1, 3.0),
        CONDENSED,
        ContextCompacted("main", "dropped", 230_000, 190_000, "the rest of a 60,000-token result"),
        TurnDone("end_turn", 3),
    ]


EXPECTED_PLAIN = [
    "[context] main: 212,400 → 96,100 tokens — stubbed 14 tool results, 61,200 tokens "
    "(saved copies under .orchmode/results/)",
    "[main] $ ls  (0.5 s, exit 0)",
    "[workflow 1] fanning out 2 subtasks",
    "[worker 1.1] $ pytest -q  (0.5 s, exit 0)",
    "[context] worker 1.1: 180,000 → 120,000 tokens — "
    "the API's context editing cleared old tool results",
    "[worker 1.1] $ grep -rn TODO  (0.5 s, exit 0)",
    "[context] worker 1.2: 205,000 → 150,000 tokens — stubbed 3 tool results, 40,000 tokens "
    "(saved copies under .orchmode/results/); "
    "the API refused the request as too long, and it is being retried",
]
EXPECTED_PLAIN_END = [
    "[workflow 1] done in 3.0 s",
    "[workflow 1] result condensed to 49,800 of 161,000 tokens (budget 50,000): "
    f"31 low and 12 info findings not shown; full result: {WORKFLOW_FILE}",
    "[context] main: 230,000 → 190,000 tokens — nothing more could be stubbed, so the part of "
    "the turn that could not fit was let go (the rest of a 60,000-token result)",
]


class Outputs:
    """What every display made of a run's events, and the store the recorder wrote them to."""

    def __init__(self, rows: list[EventRow], plain: str, json_lines: str, live: LiveView) -> None:
        self.rows = rows
        self.plain = plain
        self.json = [json.loads(line) for line in json_lines.splitlines()]
        self.live = live

    def history(self) -> SessionHistory:
        return read_session(self.rows, session=SESSION)


async def emit(workdir: Path, events: Sequence[Event]) -> Outputs:
    """Send ``events`` on a bus to every display and the recorder; the rows it stored."""
    store = SQLiteStore.open(workdir / ".orchmode" / "journal.db")  # where `orchmode show` looks
    try:
        bus = EventBus()
        plain_out, json_out = io.StringIO(), io.StringIO()
        totals = SessionTotals()
        live = LiveView(totals, clock=Clock())  # no console: its state, drawn by render()
        recorder = await EventRecorder.start(store, SESSION)
        for subscriber in (totals, PlainDisplay(plain_out), JsonDisplay(json_out), live, recorder):
            bus.subscribe(subscriber)
        for event in events:
            bus.emit(event)
        await recorder.flush()
        rows = await store.events(SESSION)
    finally:
        await store.close()
    assert [row.kind for row in rows] == [type(event).__name__ for event in events]
    return Outputs(rows, plain_out.getvalue(), json_out.getvalue(), live)


# --- plain lines and JSON -----------------------------------------------------------------


async def test_plain_lines_say_what_each_compaction_and_condensed_result_did(
    tmp_path: Path,
) -> None:
    out = await emit(tmp_path, a_turn_that_ran_out_of_room())
    lines = out.plain.splitlines()
    start = lines.index(EXPECTED_PLAIN[0])
    assert lines[start : start + len(EXPECTED_PLAIN)] == EXPECTED_PLAIN, lines
    assert lines[-len(EXPECTED_PLAIN_END) :] == EXPECTED_PLAIN_END, lines


def test_a_compaction_with_no_detail_and_an_unknown_kind_still_reads() -> None:
    stream = io.StringIO()
    display = PlainDisplay(stream)
    display(ContextCompacted("main", "stubbed", 1_000, 900))
    display(ContextCompacted("verifier 2.1", "summarised", 5_000, 1_000, "by a model"))
    display(ResultCondensed(2, 70_000, 50_000, 50_000, "", ""))
    assert stream.getvalue().splitlines() == [
        "[context] main: 1,000 → 900 tokens — stubbed old tool results "
        "(saved copies under .orchmode/results/)",
        "[context] verifier 2.1: 5,000 → 1,000 tokens — summarised: by a model",
        "[workflow 2] result condensed to 50,000 of 70,000 tokens (budget 50,000)",
    ]


async def test_json_lines_carry_the_new_events_whole(tmp_path: Path) -> None:
    events = a_turn_that_ran_out_of_room()
    out = await emit(tmp_path, events)
    assert [record["kind"] for record in out.json] == [type(e).__name__ for e in events]
    compactions = [r for r in out.json if r["kind"] == "ContextCompacted"]
    assert [(r["agent"], r["how"], r["refused"]) for r in compactions] == [
        ("main", "stubbed", False),
        ("worker 1.1", "api", False),
        ("worker 1.2", "stubbed", True),
        ("main", "dropped", False),
    ]
    assert compactions[0] == {
        "kind": "ContextCompacted",
        "agent": "main",
        "how": "stubbed",
        "tokens_before": 212_400,
        "tokens_after": 96_100,
        "detail": "14 tool results, 61,200 tokens",
        "refused": False,
    }
    (condensed,) = [r for r in out.json if r["kind"] == "ResultCondensed"]
    assert condensed == {
        "kind": "ResultCondensed",
        "call": 1,
        "tokens_full": 161_000,
        "tokens_shown": 49_800,
        "budget": 50_000,
        "omitted": "31 low and 12 info findings not shown",
        "path": WORKFLOW_FILE,
    }
    paths = [r["report_path"] for r in out.json if r["kind"] == "SubagentDone"]
    assert paths == [WORKER_FILE, OTHER_FILE]


# --- the history read back from the store -------------------------------------------------


async def test_the_history_keeps_each_compaction_where_it_happened(tmp_path: Path) -> None:
    out = await emit(tmp_path, a_turn_that_ran_out_of_room())
    history = out.history()
    assert history.skipped == 0
    (turn,) = history.turns
    assert [(c.agent, c.event.how) for c in turn.compactions] == [
        ("main", "stubbed"), ("worker 1.1", "api"), ("worker 1.2", "stubbed"), ("main", "dropped"),
    ]  # fmt: skip
    # the main agent's compactions are steps of the turn, in order with its commands
    assert [type(s).__name__ for s in turn.steps] == ["Compaction", "Command", "Fanout",
                                                      "Compaction"]  # fmt: skip
    (fanout,) = turn.fanouts
    assert [c.agent for c in fanout.compactions] == ["worker 1.1", "worker 1.2"]
    first, second = fanout.agents
    steps = [s.command if isinstance(s, Command) else s.event.how for s in first.activity]
    assert steps == ["pytest -q", "api", "grep -rn TODO"]
    assert [c.command for c in first.commands] == ["pytest -q", "grep -rn TODO"]
    assert [c.event.refused for c in second.compactions] == [True]
    assert (first.report_path, second.report_path) == (WORKER_FILE, OTHER_FILE)
    assert fanout.condensed is not None and turn.condensed == [fanout.condensed]
    assert fanout.condensed.event == CONDENSED
    # the rows as stored hold the events exactly
    events = [parse_row(row) for row in out.rows]
    assert events == a_turn_that_ran_out_of_room()


def test_an_old_record_without_a_report_path_still_loads() -> None:
    old = {"call": 1, "index": 1, "role": "worker", "status": "finished", "turns": 1}
    rows = [
        EventRow(1, 1000.0, "TurnStarted", json.dumps({"text": "go", "notices": []})),
        EventRow(2, 1001.0, "SubagentDone", json.dumps(old)),
    ]
    done = parse_row(rows[1])
    assert isinstance(done, SubagentDone) and done.report_path == ""
    history = read_session(rows)
    assert history.skipped == 0 and [a.report_path for a in history.agents] == [""]
    assert "full result" not in plain(transcript(history))
    assert "full result" not in render_report(history)


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        ("ContextCompacted", {"how": "stubbed", "tokens_before": 1, "tokens_after": 1}),
        ("ContextCompacted", {"agent": "main", "tokens_before": 1, "tokens_after": 1}),
        ("ContextCompacted", {"agent": "main", "how": "api", "tokens_before": "9"}),
        ("ContextCompacted", {"agent": "main", "how": "api", "refused": "yes"}),
        ("ContextCompacted", {"agent": ["main"], "how": "api"}),
        ("ResultCondensed", {"tokens_full": 1, "tokens_shown": 1, "budget": 1}),
        ("ResultCondensed", {"call": "1", "path": "p"}),
        ("ResultCondensed", {"call": 1, "omitted": 3}),
        ("SubagentDone", {"call": 1, "index": 1, "role": "worker", "status": "finished",
                          "report_path": 7}),
    ],
)  # fmt: skip
def test_a_malformed_new_row_is_skipped_and_the_rest_still_read(
    kind: str, data: dict[str, Any]
) -> None:
    rows = [
        EventRow(1, 1000.0, "TurnStarted", json.dumps({"text": "go", "notices": []})),
        EventRow(2, 1001.0, kind, json.dumps(data)),
        EventRow(3, 1002.0, "ContextCompacted", json.dumps({"agent": "main", "how": "api"})),
    ]
    history = read_session(rows)
    assert history.skipped == 1
    assert [c.event for c in history.turns[0].compactions] == [
        ContextCompacted("main", "api", 0, 0)
    ]


KINDS = ["TurnStarted", "FanoutStarted", "SubagentDone", "ContextCompacted", "ResultCondensed"]
FIELDS = st.sampled_from(
    ["agent", "how", "tokens_before", "tokens_after", "detail", "refused", "call", "index",
     "role", "status", "tokens_full", "tokens_shown", "budget", "omitted", "path", "report_path",
     "text", "notices"]
)  # fmt: skip
VALUES = (
    st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    | st.sampled_from(["main", "worker 1.1", "worker", "stubbed", "api", "dropped"])
    | st.lists(st.text(max_size=3), max_size=2)
)  # fmt: skip


@given(st.lists(st.tuples(st.sampled_from(KINDS), st.dictionaries(FIELDS, VALUES)), max_size=20))
def test_no_sequence_of_new_rows_crashes_the_reader(rows: list[tuple[str, Any]]) -> None:
    stored = [EventRow(i, 1000.0 + i, kind, json.dumps(d)) for i, (kind, d) in enumerate(rows)]
    history = read_session(stored)
    plain(transcript(history))
    render_report(history)


# --- `orchmode show` ----------------------------------------------------------------------


def section(text: str, first: str, last: str) -> list[str]:
    """The lines from the one starting with ``first`` to the one starting with ``last``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith(last))
    return lines[start : end + 1]


async def test_show_lists_each_compaction_condensed_result_and_result_file_in_place(
    tmp_path: Path,
) -> None:
    await emit(tmp_path, a_turn_that_ran_out_of_room())
    shown = orchmode("show", SESSION, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    lines = section(out, "  user ", "  context main: 230,000")
    body = [line for line in lines if not line.startswith(("  user", "  mode"))]
    assert body[0] == (
        "  context main: 212,400 → 96,100 tokens — stubbed 14 tool results, 61,200 tokens "
        "(saved copies under .orchmode/results/)"
    )
    assert re.fullmatch(r"  \$ ls  exit 0 · 0\.5 s", body[1]), body[1]
    assert body[2].startswith("  workflow 1: 2 subtasks · 3.0 s")
    worker = section(out, "    worker 1.1 · ", "      full result ")
    assert worker[1:3] == [
        "      $ pytest -q  exit 0 · 0.5 s",
        "      context 180,000 → 120,000 tokens — the API's context editing cleared old tool "
        "results",
    ]
    assert worker[3] == "      $ grep -rn TODO  exit 0 · 0.5 s"
    assert worker[-1] == f"      full result {WORKER_FILE}"
    other = section(out, "    worker 1.2 · ", "      full result ")
    assert other[1].startswith("      context 205,000 → 150,000 tokens — stubbed 3 tool results")
    assert other[1].endswith("the API refused the request as too long, and it is being retried")
    assert other[-1] == f"      full result {OTHER_FILE}"
    # the condensed result comes after the call's agents, before the main agent goes on
    tail = section(out, "    result condensed", "  context main: 230,000")
    assert tail == [
        "    result condensed to 49,800 of 161,000 tokens (budget 50,000): 31 low and "
        f"12 info findings not shown; full result: {WORKFLOW_FILE}",
        "  context main: 230,000 → 190,000 tokens — nothing more could be stubbed, so the part "
        "of the turn that could not fit was let go (the rest of a 60,000-token result)",
    ]


# --- the HTML report ----------------------------------------------------------------------


async def test_the_report_shows_compactions_in_their_turn_and_each_agent_s_file(
    tmp_path: Path,
) -> None:
    await emit(tmp_path, a_turn_that_ran_out_of_room())
    made = orchmode("report", SESSION, "-o", "-", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = made.stdout
    assert_self_contained(html)
    dom = Dom(html)
    turn_html = html[html.index('<article class="turn"') : html.index("</article>")]
    items = Dom(turn_html).find("li", class_="compaction")
    assert [(i["data-agent"], i["data-how"], i["data-refused"]) for i in items] == [
        ("main", "stubbed", "no"),
        ("worker 1.1", "api", "no"),
        ("worker 1.2", "stubbed", "yes"),
        ("main", "dropped", "no"),
    ]
    assert (items[0]["data-tokens-before"], items[0]["data-tokens-after"]) == ("212400", "96100")
    # in order: the main agent's first compaction, its command, the call with its agents'
    # compactions and its condensed result, then the main agent's last compaction
    order = [
        turn_html.index(needle)
        for needle in (
            "212,400 → 96,100",
            "<code>ls</code>",
            "workflow 1: 2 subtasks",
            "180,000 → 120,000",
            "205,000 → 150,000",
            'class="condensed"',
            "230,000 → 190,000",
        )
    ]
    assert order == sorted(order)
    # a subagent's compaction links to its details
    links = Dom(turn_html).find("a")
    assert [a["href"] for a in links] == ["#agent-t1-1-1-worker", "#agent-t1-1-2-worker"]
    (condensed,) = dom.find("p", class_="condensed")
    assert (condensed["data-call"], condensed["data-tokens-shown"]) == ("1", "49800")
    condensed_text = re.search(r'<p class="condensed".*?</p>', html, flags=re.S)
    assert condensed_text is not None
    assert f"full result: {WORKFLOW_FILE}" in condensed_text[0]
    assert "31 low and 12 info findings not shown" in condensed_text[0]
    for name, path, compactions in [("worker 1.1", WORKER_FILE, 1), ("worker 1.2", OTHER_FILE, 1)]:
        (details,) = dom.find("details", data_agent=name)
        text = dom.text[details["id"]]
        assert f"full result{path}" in text, text
        assert f"compactions{compactions}" in text
        assert text.count("→") == compactions
        named = "context" + name.replace(" ", "") + ":"
        assert named not in text.replace(" ", "")  # not named again under itself


def test_compactions_and_paths_in_the_report_are_escaped() -> None:
    events: list[Event] = [
        TurnStarted("go", ()),
        ContextCompacted("main", PAYLOAD, 10, 5, PAYLOAD, refused=True),
        FanoutStarted(1, 1, 0),
        SubagentStarted(1, 1, "worker", "t", "p"),
        ContextCompacted("worker 1.1", "stubbed", 10, 5, PAYLOAD),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0, report_path=PAYLOAD),
        ResultCondensed(1, 10, 5, 5, PAYLOAD, PAYLOAD),
        ContextCompacted(PAYLOAD, "api", 10, 5),
        TurnDone("end_turn", 1),
    ]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    assert len(history.turns[0].compactions) == 3 and history.agents[0].report_path == PAYLOAD
    html = render_report(history)
    dom = Dom(html)
    assert len(dom.find("script")) == 1 and dom.find("img") == []
    for _, attrs in dom.elements:
        assert not [name for name in attrs if name.startswith("on")], attrs
    assert PAYLOAD not in html
    # a kind, two details (one twice: in its turn and its agent), a file, what was left out,
    # where the result is, and an agent name (as text and as an attribute)
    assert html.count(escape(PAYLOAD)) >= 9
    assert_self_contained(html)


# --- the live view ------------------------------------------------------------------------


async def test_the_live_view_shows_the_latest_compaction_and_a_condensed_result(
    tmp_path: Path,
) -> None:
    events = a_turn_that_ran_out_of_room()
    # stop before the last compaction and TurnDone: the view as the turn goes on
    upto = len(events) - 2
    out = await emit(tmp_path, events[:upto])
    text = render(out.live)
    lines = [line.rstrip() for line in text.splitlines()]
    # the agent table is drawn as before
    assert set(rows_of(text)) == {(1, "worker"), (2, "worker")}
    bottom = max(i for i, line in enumerate(lines) if line.startswith("└"))
    assert lines[-1].startswith("session · 1 requests · ")
    # right under the call's table, then the latest compaction, then the session footer
    below = " ".join(lines[bottom + 1 : -1])  # long lines wrap at the terminal's width
    condensed = (
        "result condensed to 49,800 of 161,000 tokens (budget 50,000): 31 low and 12 info "
        f"findings not shown; full result: {WORKFLOW_FILE}"
    )
    context = (
        "context (2 earlier this turn) · worker 1.2: 205,000 → 150,000 tokens — stubbed 3 tool "
        "results, 40,000 tokens (saved copies under .orchmode/results/); the API refused the "
        "request as too long, and it is being retried"
    )
    assert below == f"{condensed} {context}", below

    view = out.live
    view(events[-2])  # the main agent's last compaction replaces the one shown
    lines = render(view).splitlines()
    (latest,) = [line for line in lines if line.startswith("context")]
    assert latest.startswith("context (3 earlier this turn) · main: 230,000 → 190,000 tokens")
    view(TurnStarted("next", ()))  # a new turn starts with a clean view
    fresh = render(view)
    assert "context" not in fresh and "condensed" not in fresh


def test_a_live_view_without_compactions_draws_as_before() -> None:
    view = LiveView(SessionTotals(), clock=Clock())
    view(TurnStarted("go", ()))
    view(FanoutStarted(1, subtasks=1, not_run=0))
    view(SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0, report_path=WORKER_FILE))
    lines = render(view).rstrip().splitlines()
    assert lines[-1].startswith("session · ") and lines[-2].startswith("└")
    assert "context" not in render(view) and "condensed" not in render(view)
