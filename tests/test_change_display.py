"""What became of each worker's change to its copy of the tree, wherever a run is shown.

The events go the way a run sends them (see ``test_context_display``): emitted on an
EventBus to the plain progress, the JSON lines, the live view and the recorder, which writes
them into a real SQLite store; the history, ``orchmode show`` and the HTML report then read
them back from that store.
"""

from __future__ import annotations

import io
import json
from html import escape
from pathlib import Path
from typing import Any

import pytest

from orchmode.core.events import (
    ChangeSettled,
    Event,
    FanoutDone,
    FanoutStarted,
    ModelRequestDone,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)
from orchmode.records.codec import event_row, parse_row
from orchmode.records.history import read_session
from orchmode.records.totals import SessionTotals
from orchmode.store import EventRow
from orchmode.views.display import PlainDisplay
from orchmode.views.live import LiveView
from orchmode.views.progress import StderrProgress, change_text
from orchmode.views.report import render_report
from orchmode.views.transcript import plain, transcript
from recorded_runs import orchmode
from test_context_display import SESSION, emit, section
from test_live import Clock, header_of, render, rows_of
from test_report import PAYLOAD, Dom, assert_self_contained

USAGE = TokenUsage(100, 20, 800, 50)
RESULTS = f".orchmode/results/{SESSION}"
PATCH_2 = f"{RESULTS}/patch-222222222222.patch"
PATCH_3 = f"{RESULTS}/patch-333333333333.patch"
PATCH_4 = f"{RESULTS}/patch-444444444444.patch"
PATCH_1 = f"{RESULTS}/patch-111111111111.patch"
EVIL = "<script>x</script>.py"

MERGED = ChangeSettled(
    1, 1, "merged", "2 files (+10 −2): src/a.py (+8 −2), b.py (+2 −0)", 10, 2, "", PATCH_1
)
CONFLICT = ChangeSettled(
    1, 2, "conflict", "1 file (+3 −1): a.py (+3 −1)", 3, 1, "a.py", PATCH_2
)  # fmt: skip
REFUTED = ChangeSettled(
    1, 3, "not merged", "1 file (+1 −0): notes.md (+1 −0)", 1, 0, "refuted", PATCH_3
)
REFUSED = ChangeSettled(
    1, 4, "refused", "1 file (+0 −0): .git/config", 0, 0, "it writes under .git", PATCH_4
)
CHANGES = [MERGED, CONFLICT, REFUTED, REFUSED]
VERDICTS = ["confirmed", "confirmed", "refuted", "confirmed"]


def a_turn_that_changed_the_tree() -> list[Event]:
    """One fan-out of four isolated workers, each verified, then each change settled."""
    events: list[Event] = [
        TurnStarted("fix the module", ("enter",)),
        ModelRequestDone("main", "m1", "tool_use", USAGE, 1.0, cost=0.01),
        FanoutStarted(1, subtasks=4, not_run=0),
    ]
    for i in range(1, 5):
        events.append(SubagentStarted(1, i, "worker", f"Fix item {i}", f"Fix item {i}"))
    for i in range(1, 5):
        events.append(SubagentDone(1, i, "worker", "finished", 3, USAGE, 2.0, cost=0.02))
    for i, verdict in enumerate(VERDICTS, start=1):
        events.append(SubagentStarted(1, i, "verifier", "Verify", "Verify"))
        events.append(
            SubagentDone(1, i, "verifier", "finished", 1, USAGE, 1.0, verdict=verdict, cost=0.01)
        )
    events.append(FanoutDone(1, 3.0))
    events.extend(CHANGES)  # settled after the call's agents, in subtask order
    events.append(TurnDone("end_turn", 2))
    return events


# --- plain lines and JSON -----------------------------------------------------------------

EXPECTED_PLAIN = [
    f"[workflow 1] change 1.1 merged: 2 files (+10 −2) — patch kept at {PATCH_1}",
    f"[workflow 1] change 1.2 conflict in a.py: 1 file (+3 −1) — patch kept at {PATCH_2}",
    f"[workflow 1] change 1.3 not merged (refuted): 1 file (+1 −0) — patch kept at {PATCH_3}",
    "[workflow 1] change 1.4 refused (it writes under .git): 1 file (+0 −0) — patch kept at "
    f"{PATCH_4}",
]


async def test_plain_lines_say_what_became_of_each_change(tmp_path: Path) -> None:
    out = await emit(tmp_path, a_turn_that_changed_the_tree())
    lines = out.plain.splitlines()
    assert lines[-5] == "[workflow 1] done in 3.0 s", lines
    assert lines[-4:] == EXPECTED_PLAIN, lines


def test_a_change_is_one_line_whatever_its_files_and_reasons_hold() -> None:
    stream = io.StringIO()
    display = PlainDisplay(stream)
    display(ChangeSettled(2, 1, "conflict", "1 file (+1 −1): odd\nname.py (+1 −1)", 1, 1,
                          "odd\nname.py"))  # fmt: skip
    display(ChangeSettled(2, 2, "kept", "1 file (+4 −0): new.py (+4 −0)", 4, 0, "merge = none",
                          "p.patch"))  # fmt: skip
    display(ChangeSettled(2, 3, "merged", "an unreadable patch", 0, 0))
    display(ChangeSettled(2, 4, "conflict", "1 file (+1 −0): x (+1 −0)", 1, 0))
    assert stream.getvalue().splitlines() == [
        "[workflow 2] change 2.1 conflict in odd name.py: 1 file (+1 −1)",
        "[workflow 2] change 2.2 kept (merge = none): 1 file (+4 −0) — patch kept at p.patch",
        "[workflow 2] change 2.3 merged: an unreadable patch",
        "[workflow 2] change 2.4 conflict in the tree: 1 file (+1 −0)",
    ]
    # the whole text names the files too
    assert change_text(MERGED) == (
        f"merged: 2 files (+10 −2): src/a.py (+8 −2), b.py (+2 −0) — patch kept at {PATCH_1}"
    )
    assert StderrProgress.describe(CONFLICT) == EXPECTED_PLAIN[1]


async def test_json_lines_carry_each_change_whole(tmp_path: Path) -> None:
    out = await emit(tmp_path, a_turn_that_changed_the_tree())
    changes = [r for r in out.json if r["kind"] == "ChangeSettled"]
    assert changes[1] == {
        "kind": "ChangeSettled",
        "call": 1,
        "index": 2,
        "fate": "conflict",
        "files": "1 file (+3 −1): a.py (+3 −1)",
        "added": 3,
        "removed": 1,
        "detail": "a.py",
        "path": PATCH_2,
        "left_out": "",
    }
    assert [r["fate"] for r in changes] == ["merged", "conflict", "not merged", "refused"]


# --- the history read back from the store -------------------------------------------------


async def test_the_history_gives_each_worker_its_change(tmp_path: Path) -> None:
    events = a_turn_that_changed_the_tree()
    out = await emit(tmp_path, events)
    # the rows as stored hold the events exactly
    assert [parse_row(row) for row in out.rows] == events
    history = out.history()
    assert history.skipped == 0
    (fanout,) = history.turns[0].fanouts
    workers = [a for a in fanout.agents if a.role == "worker"]
    assert [w.change.event if w.change else None for w in workers] == CHANGES
    assert [w.change.what if w.change else "" for w in workers] == [
        "merged", "conflict in a.py", "not merged (refuted)", "refused (it writes under .git)",
    ]  # fmt: skip
    assert all(a.change is None for a in fanout.agents if a.role == "verifier")
    # they are the workers the call started, not new ones
    assert len(fanout.agents) == 8 and all(w.state == "done" for w in workers)


def test_an_older_record_without_changes_reads_as_before() -> None:
    events: list[Event] = [
        TurnStarted("go", ()),
        FanoutStarted(1, 1, 0),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0),
        TurnDone("end_turn", 1),
    ]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    assert history.agents[0].change is None
    assert "change" not in plain(transcript(history))
    assert 'class="change"' not in render_report(history)


def test_a_change_with_only_its_required_fields_still_loads() -> None:
    row = EventRow(1, 1000.0, "ChangeSettled", json.dumps({"call": 1, "index": 2, "fate": "x"}))
    assert parse_row(row) == ChangeSettled(1, 2, "x", "", 0, 0)


@pytest.mark.parametrize(
    "data",
    [
        {"index": 1, "fate": "merged"},
        {"call": 1, "fate": "merged"},
        {"call": 1, "index": 1},
        {"call": "1", "index": 1, "fate": "merged"},
        {"call": 1, "index": 1, "fate": "merged", "added": "10"},
        {"call": 1, "index": 1, "fate": "merged", "removed": True},
        {"call": 1, "index": 1, "fate": "merged", "files": ["a.py"]},
        {"call": 1, "index": 1, "fate": "merged", "path": 7},
        {"call": 1, "index": 1, "fate": "merged", "detail": {"a": 1}},
    ],
)
def test_a_malformed_change_row_is_skipped_and_the_rest_still_read(data: dict[str, Any]) -> None:
    rows = [
        EventRow(1, 1000.0, "TurnStarted", json.dumps({"text": "go", "notices": []})),
        EventRow(2, 1001.0, "ChangeSettled", json.dumps(data)),
        event_row(3, MERGED),
    ]
    history = read_session(rows)
    assert history.skipped == 1
    (worker,) = history.agents
    assert worker.change is not None and worker.change.event == MERGED


# --- `orchmode show` ----------------------------------------------------------------------


async def test_show_gives_each_worker_its_change_and_patch(tmp_path: Path) -> None:
    await emit(tmp_path, a_turn_that_changed_the_tree())
    shown = orchmode("show", SESSION, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    expected = [
        ("merged: 2 files (+10 −2): src/a.py (+8 −2), b.py (+2 −0)", PATCH_1),
        ("conflict in a.py: 1 file (+3 −1): a.py (+3 −1)", PATCH_2),
        ("not merged (refuted): 1 file (+1 −0): notes.md (+1 −0)", PATCH_3),
        ("refused (it writes under .git): 1 file (+0 −0): .git/config", PATCH_4),
    ]
    for index, (change, patch) in enumerate(expected, start=1):
        worker = section(out, f"    worker 1.{index} · ", "      patch ")
        assert worker[0].startswith(f"    worker 1.{index} · Fix item {index} · done · ")
        assert worker[-2:] == [f"      change {change}", f"      patch {patch}"], worker
    # the verifiers have no change of their own
    verifier = section(out, "    verifier 1.1 · ", "    worker 1.2 · ")
    assert not any("change" in line for line in verifier)


def test_show_reads_a_change_without_a_patch_and_a_fate_it_does_not_know() -> None:
    events: list[Event] = [
        TurnStarted("go", ()),
        FanoutStarted(1, 2, 0),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0),
        ChangeSettled(1, 1, "kept", "1 file (+1 −0): a\nb.py (+1 −0)", 1, 0, "merge = none"),
        ChangeSettled(1, 2, "rebased", "", 0, 0),  # a newer orchmode's, with no such worker yet
    ]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    text = plain(transcript(history))
    assert "      change kept (merge = none): 1 file (+1 −0): a b.py (+1 −0)" in text.splitlines()
    assert "      change rebased" in text.splitlines()
    assert "patch" not in text


# --- the HTML report ----------------------------------------------------------------------


async def test_the_report_shows_each_worker_s_change(tmp_path: Path) -> None:
    await emit(tmp_path, a_turn_that_changed_the_tree())
    made = orchmode("report", SESSION, "-o", "-", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    html = made.stdout
    assert_self_contained(html)
    dom = Dom(html)
    changes = dom.find("p", class_="change")
    assert [(c["data-fate"], c["data-added"], c["data-removed"]) for c in changes] == [
        ("merged", "10", "2"), ("conflict", "3", "1"), ("not merged", "1", "0"),
        ("refused", "0", "0"),
    ]  # fmt: skip
    expected = [
        ("merged", "+10 −2", MERGED.files, PATCH_1),
        ("conflict in a.py", "+3 −1", CONFLICT.files, PATCH_2),
        ("not merged (refuted)", "+1 −0", REFUTED.files, PATCH_3),
        ("refused (it writes under .git)", "+0 −0", REFUSED.files, PATCH_4),
    ]
    for index, (fate, lines, files, patch) in enumerate(expected, start=1):
        (details,) = dom.find("details", data_agent=f"worker 1.{index}")
        text = dom.text[details["id"]]
        assert f"change{fate} {lines} {files}patch kept at {patch}" in text, text
        # and in its summary line, so a reader sees it without opening the details
        assert f"{lines} {CHANGES[index - 1].fate} " in text.split("status", 1)[0], text
    for index in range(1, 5):
        (details,) = dom.find("details", data_agent=f"verifier 1.{index}")
        assert "patch kept" not in dom.text[details["id"]]
    assert [c["class"] for c in dom.find("code") if c.get("class") == "patch-path"] == [
        "patch-path"
    ] * 4
    badges = {v["class"] for v in dom.find("span") if v.get("class", "").startswith("badge ch")}
    assert badges == {
        "badge change-merged", "badge change-conflict", "badge change-not-merged",
        "badge change-refused",
    }  # fmt: skip


def test_a_change_in_the_report_is_escaped() -> None:
    events: list[Event] = [
        TurnStarted("go", ()),
        FanoutStarted(1, 2, 0),
        SubagentStarted(1, 1, "worker", "t", "p"),
        SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0),
        SubagentStarted(1, 2, "worker", "t", "p"),
        SubagentDone(1, 2, "worker", "finished", 1, USAGE, 1.0),
        ChangeSettled(1, 1, "conflict", f"1 file (+1 −1): {EVIL} (+1 −1)", 1, 1, EVIL, EVIL),
        ChangeSettled(1, 2, PAYLOAD, PAYLOAD, 2, 0, PAYLOAD, PAYLOAD),
        TurnDone("end_turn", 1),
    ]
    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    html = render_report(history)
    dom = Dom(html)
    assert len(dom.find("script")) == 1 and dom.find("img") == []
    for _, attrs in dom.elements:
        assert not [name for name in attrs if name.startswith("on")], attrs
    assert EVIL not in html and PAYLOAD not in html
    # the file name in the files and as the conflict, and the patch path
    assert html.count(escape(EVIL)) >= 3
    # a fate, its badges, the files, why, and the path (as text and as an attribute)
    assert html.count(escape(PAYLOAD)) >= 5
    (first, second) = dom.find("p", class_="change")
    assert first["data-fate"] == "conflict" and second["data-fate"] == PAYLOAD
    (details,) = dom.find("details", data_agent="worker 1.1")
    text = dom.text[details["id"]]
    assert f"conflict in {EVIL}" in text and f"patch kept at {EVIL}" in text
    assert_self_contained(html)


# --- the live view ------------------------------------------------------------------------


async def test_the_live_view_shows_each_worker_s_change(tmp_path: Path) -> None:
    events = a_turn_that_changed_the_tree()
    settled = events.index(MERGED)
    out = await emit(tmp_path, events[:settled])
    text = render(out.live)
    assert "change" not in header_of(text)  # nothing settled yet: the table as before
    view = out.live
    for event in events[settled:-1]:
        view(event)
    text = render(view)
    header = header_of(text)
    assert header[-2:] == ["verdict", "change"], header
    rows = rows_of(text)
    cells = {key: [c.strip() for c in line.strip()[1:-1].split("│")] for key, line in rows.items()}
    column = header.index("change")
    assert [cells[i, "worker"][column] for i in range(1, 5)] == [
        "+10 −2 merged", "+3 −1 conflict", "+1 −0 not merged (refuted)", "+0 −0 refused",
    ]  # fmt: skip
    assert [cells[i, "verifier"][column] for i in range(1, 5)] == [""] * 4
    view(TurnStarted("next", ()))  # a new turn starts with a clean view
    assert "merged" not in render(view)


def test_a_live_view_without_changes_has_no_change_column() -> None:
    view = LiveView(SessionTotals(), clock=Clock())
    view(TurnStarted("go", ()))
    view(FanoutStarted(1, subtasks=1, not_run=0))
    view(SubagentDone(1, 1, "worker", "finished", 1, USAGE, 1.0))
    text = render(view)
    assert header_of(text)[-1] == "verdict" and "change" not in text
