"""Run records: every event is recorded and read back by its one declaration in core/events.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from orchmode.core import events
from orchmode.core.events import (
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BashStarted,
    BatchEnded,
    BatchSent,
    BatchWaiting,
    BudgetStatus,
    ChangeSettled,
    ContextCompacted,
    FanoutDone,
    FanoutStarted,
    McpCallDone,
    McpCallStarted,
    McpServerFailed,
    ModelRefused,
    ModelRequestDone,
    ModelRequestFailed,
    ModelRequestRetried,
    NetworkConnection,
    ResultCondensed,
    ScriptDone,
    ScriptStarted,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnResumed,
    TurnStarted,
    WorkspacesChosen,
)
from orchmode.records.codec import UnreadableRecord, event_row, parse_row, read_event
from orchmode.records.history import read_session
from orchmode.records.recorder import EventRecorder
from orchmode.store import EventRow, Store
from orchmode.store.sqlite import SQLiteStore
from recorded_runs import base_env

EVENT_CLASSES = typing.get_args(events.Event)
SRC = Path(__file__).resolve().parents[1] / "src"


@given(st.one_of(*(st.from_type(cls) for cls in EVENT_CLASSES)))
def test_an_event_row_holds_the_event_as_asdict_gives_it(event: events.Event) -> None:
    row = event_row(7, event)
    expected = json.dumps(dataclasses.asdict(event), ensure_ascii=False, default=str)
    assert row.seq == 7 and row.kind == type(event).__name__
    assert json.loads(row.data) == json.loads(expected)


def test_every_event_class_is_covered() -> None:
    assert len(EVENT_CLASSES) >= 15
    assert all(dataclasses.is_dataclass(cls) for cls in EVENT_CLASSES)


def test_the_public_list_of_events_is_the_declared_union() -> None:
    import orchmode

    assert events.EVENTS == EVENT_CLASSES
    assert {"Event", "TokenUsage", *(cls.__name__ for cls in EVENT_CLASSES)} <= set(
        orchmode.__all__
    )


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(item) for item in value)
    return True


@given(st.one_of(*(st.from_type(cls) for cls in EVENT_CLASSES)))
def test_every_event_reads_back_equal_to_the_one_recorded(event: events.Event) -> None:
    assume(_finite(dataclasses.asdict(event)))  # a NaN is written, but never read as a number
    row = event_row(1, event)
    assert read_event(row.kind, row.data) == event
    assert parse_row(row) == event


USAGE = TokenUsage(10, 5, 80, 5)

#: One event of every kind, and its row as orchmode wrote it before events were read back by
#: their declaration (``json.dumps`` with its spaces): such runs must read back the same.
EARLIER_ROWS: list[tuple[events.Event, str]] = [
    (
        TurnStarted("Review the parser", ("enter",)),
        '{"text": "Review the parser", "notices": ["enter"]}',
    ),
    (
        ModelRequestDone("main", "msg_1", "tool_use", USAGE, 1.5, 0.25, "messages_changed", 1200),
        '{"agent": "main", "message_id": "msg_1", "stop_reason": "tool_use", "usage": '
        '{"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 80, '
        '"cache_write_tokens": 5}, "duration": 1.5, "cost": 0.25, "cache_miss": '
        '"messages_changed", "cache_missed_tokens": 1200}',
    ),
    (BashStarted("worker 1.1", "pytest -q"), '{"agent": "worker 1.1", "command": "pytest -q"}'),
    (
        BashDone("worker 1.1", "pytest -q", None, True, 30.0, "workspace-write"),
        '{"agent": "worker 1.1", "command": "pytest -q", "exit_code": null, "timed_out": true, '
        '"duration": 30.0, "sandbox": "workspace-write"}',
    ),
    (
        McpCallStarted("main", "github", "search"),
        '{"agent": "main", "server": "github", "tool": "search"}',
    ),
    (
        McpCallDone("main", "github", "search", 0.4, False, "rate limited"),
        '{"agent": "main", "server": "github", "tool": "search", "duration": 0.4, "ok": false, '
        '"error": "rate limited"}',
    ),
    (
        McpServerFailed("github", "did not start"),
        '{"server": "github", "message": "did not start"}',
    ),
    (FanoutStarted(1, 3, 1), '{"call": 1, "subtasks": 3, "not_run": 1}'),
    (
        SubagentStarted(1, 1, "worker", "Check the parser", "Check it for bugs", "127.0.0.2"),
        '{"call": 1, "index": 1, "role": "worker", "title": "Check the parser", "prompt": '
        '"Check it for bugs", "node": "127.0.0.2"}',
    ),
    (
        SubagentDone(
            1,
            1,
            "verifier",
            "finished",
            2,
            USAGE,
            3.5,
            False,
            "refuted",
            '{"summary": "é"}',
            0.5,
            "127.0.0.3",
            "/r/1.md",
        ),
        '{"call": 1, "index": 1, "role": "verifier", "status": "finished", "turns": 2, "usage": '
        '{"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 80, '
        '"cache_write_tokens": 5}, "duration": 3.5, "from_journal": false, "verdict": "refuted", '
        '"result": "{\\"summary\\": \\"é\\"}", "cost": 0.5, "node": "127.0.0.3", '
        '"report_path": "/r/1.md"}',
    ),
    (
        ContextCompacted("worker 1.1", "stubbed", 90000, 40000, "14 tool results", True),
        '{"agent": "worker 1.1", "how": "stubbed", "tokens_before": 90000, "tokens_after": '
        '40000, "detail": "14 tool results", "refused": true}',
    ),
    (
        ResultCondensed(1, 30000, 8000, 8000, "31 low findings not shown", "/r/result.md"),
        '{"call": 1, "tokens_full": 30000, "tokens_shown": 8000, "budget": 8000, "omitted": '
        '"31 low findings not shown", "path": "/r/result.md"}',
    ),
    (
        ChangeSettled(1, 1, "conflict", "1 file (+1 −0): a.py (+1 −0)", 1, 0, "a.py", "/r/1.patch"),
        '{"call": 1, "index": 1, "fate": "conflict", "files": "1 file (+1 −0): a.py (+1 −0)", '
        '"added": 1, "removed": 0, "detail": "a.py", "path": "/r/1.patch"}',
    ),
    (
        WorkspacesChosen(False, "overlayfs refused"),
        '{"overlays": false, "reason": "overlayfs refused"}',
    ),
    (BatchSent("msgbatch_01", 6), '{"batch_id": "msgbatch_01", "requests": 6}'),
    (
        BatchWaiting("worker 1.2", "msgbatch_01"),
        '{"agent": "worker 1.2", "batch_id": "msgbatch_01"}',
    ),
    (
        BatchEnded("msgbatch_01", 5, 0, 1, 0, 42.0),
        '{"batch_id": "msgbatch_01", "succeeded": 5, "errored": 0, "expired": 1, '
        '"canceled": 0, "duration": 42.0}',
    ),
    (FanoutDone(1, 12.5), '{"call": 1, "duration": 12.5}'),
    (ScriptStarted(2, 14), '{"call": 2, "lines": 14}'),
    (
        ScriptDone(2, 3.0, 4, "NameError: x"),
        '{"call": 2, "duration": 3.0, "agents": 4, "error": "NameError: x"}',
    ),
    (
        BudgetStatus("budget: 10 of 50 subagents left", 10),
        '{"line": "budget: 10 of 50 subagents left", "subagents_left": 10}',
    ),
    (TurnDone("end_turn", 4), '{"stop": "end_turn", "model_calls": 4}'),
    (TurnResumed(2), '{"number": 2}'),
    (
        ModelRequestRetried("worker 1.2", "overloaded", 2.5, 1, "the API is overloaded (529)"),
        '{"agent": "worker 1.2", "reason": "overloaded", "wait": 2.5, "attempt": 1, '
        '"detail": "the API is overloaded (529)"}',
    ),
    (
        ModelRefused("worker 1.2", "cyber", "This request was refused due to policy."),
        '{"agent": "worker 1.2", "category": "cyber", '
        '"explanation": "This request was refused due to policy."}',
    ),
    (
        NetworkConnection("worker 1.1", "pypi.org", 443, "allowed", "@python", 512, 40960, 0.3),
        '{"agent": "worker 1.1", "domain": "pypi.org", "port": 443, "decision": "allowed", '
        '"rule": "@python", "bytes_sent": 512, "bytes_received": 40960, "duration": 0.3}',
    ),
    (
        ApprovalRequested(3, "worker 1.2", "domain", "evil.example:443", "network_ask"),
        '{"id": 3, "agent": "worker 1.2", "kind": "domain", "what": "evil.example:443", '
        '"why": "network_ask"}',
    ),
    (
        ApprovalAnswered(3, "worker 1.2", "denied", False, "not needed"),
        '{"id": 3, "agent": "worker 1.2", "answer": "denied", "always": false, '
        '"reason": "not needed"}',
    ),
    (
        ModelRequestFailed("main", "claude-opus-5-5", "AuthError", "rejected", 0.5),
        '{"agent": "main", "model": "claude-opus-5-5", "error_type": "AuthError", '
        '"message": "rejected", "duration": 0.5}',
    ),
]


def test_rows_written_before_the_schema_read_back_the_same() -> None:
    assert {type(event) for event, _ in EARLIER_ROWS} == set(EVENT_CLASSES)
    for seq, (event, data) in enumerate(EARLIER_ROWS):
        row = EventRow(seq, 1000.0 + seq, type(event).__name__, data)
        assert parse_row(row) == event
        # every field the earlier row held is written the same way today (a field added
        # since is written too, with the value the earlier row reads back as)
        earlier, written = json.loads(data), json.loads(event_row(seq, event).data)
        assert held(written, earlier) == earlier


def held(written: Any, earlier: Any) -> Any:
    """Of ``written``, the fields ``earlier`` has, at every depth (``TokenUsage`` gains
    fields too)."""
    if isinstance(earlier, dict) and isinstance(written, dict):
        return {name: held(written.get(name), value) for name, value in earlier.items()}
    return written


async def test_every_kind_of_event_goes_through_the_store_and_back(store: Store) -> None:
    recorder = await EventRecorder.start(store, "s")
    for event, _ in EARLIER_ROWS:
        recorder(event)
    await recorder.flush()
    rows = await store.events("s")
    assert [parse_row(row) for row in rows] == [event for event, _ in EARLIER_ROWS]
    history = read_session(rows, session="s")
    assert history.skipped == 0  # the MCP events too: they were once counted unreadable
    assert history.totals.all.requests == 1


class EventWritesCounted(SQLiteStore):
    """A SQLite store that counts the writes of events it is asked for."""

    writes = 0

    async def append_events(self, session: str, events: typing.Sequence[EventRow]) -> None:
        self.writes += 1
        await super().append_events(session, events)


async def test_events_emitted_over_many_loop_turns_are_written_together(tmp_path: Path) -> None:
    store = EventWritesCounted.open(tmp_path / "store.db")
    try:
        recorder = await EventRecorder.start(store, "s")
        emitted = [BashStarted(f"worker 1.{n}", "true") for n in range(50)]
        for event in emitted:
            recorder(event)
            await asyncio.sleep(0)  # the loop turns between events, as in a fan-out
        await recorder.flush()
        assert [parse_row(row) for row in await store.events("s")] == emitted
        assert store.writes <= 2  # one per event's turn of the loop would be 50
    finally:
        await store.close()


def test_a_value_of_no_json_type_is_recorded_as_its_text_as_before() -> None:
    odd = object()
    assert json.loads(event_row(1, BashStarted(Path("/w"), "ls")).data)["agent"] == "/w"
    assert json.loads(event_row(1, BashStarted(odd, "ls")).data)["agent"] == str(odd)  # type: ignore[arg-type]


def test_a_field_a_record_leaves_out_reads_as_its_declared_value() -> None:
    assert read_event("BashDone", '{"agent": "main", "command": "ls"}') == BashDone(
        "main", "ls", None, False, 0.0, ""
    )
    done = '{"call": 1, "index": 2, "role": "worker", "status": "finished"}'
    assert read_event("SubagentDone", done) == SubagentDone(
        1, 2, "worker", "finished", 0, TokenUsage(), 0.0
    )
    usage = '{"agent": "main", "usage": {"output_tokens": 3}}'
    assert read_event("ModelRequestDone", usage) == ModelRequestDone(
        "main", "", None, TokenUsage(output_tokens=3), 0.0
    )


@pytest.mark.parametrize(
    ("kind", "data", "named"),
    [
        ("SubagentDone", '{"call": 1, "index": 1, "role": "worker"}', "status"),
        ("SubagentDone", '{"call": "1", "index": 1, "role": "worker", "status": "x"}', "call"),
        ("SubagentDone", '{"call": true, "index": 1, "role": "worker", "status": "x"}', "call"),
        ("SubagentStarted", '{"call": 1, "index": 1, "role": "boss"}', "role"),
        ("ModelRequestDone", '{"agent": "main", "usage": {"input_tokens": "9"}}', "usage.input"),
        ("ModelRequestDone", '{"agent": "main"}', "usage"),
        ("BashDone", '{"agent": "main", "command": "ls", "duration": NaN}', "duration"),
        ("TurnStarted", '{"text": "x", "notices": "enter"}', "notices"),
        ("WorkspacesChosen", '{"overlays": null}', "overlays"),
        ("SubagentDone", "null", "the record"),
        ("SomethingNew", '{"call": 1}', "SomethingNew"),
    ],
)
def test_a_record_that_breaks_its_declaration_names_the_event_and_the_field(
    kind: str, data: str, named: str
) -> None:
    with pytest.raises(UnreadableRecord) as caught:
        read_event(kind, data)
    assert kind in str(caught.value) and named in str(caught.value)
    assert parse_row(EventRow(1, 1.0, kind, data)) is None  # a reader skips it and goes on


#: Records a SubagentDone with the field that was added, in a fresh process, then reads it back.
ADDED_FIELD_RUN = """
import asyncio, dataclasses, json, sys
from orchmode.core.events import SubagentDone, TokenUsage
from orchmode.records.codec import parse_row
from orchmode.records.history import read_session
from orchmode.records.recorder import EventRecorder
from orchmode.store import open_store

async def main():
    store = await open_store(sys.argv[1])
    try:
        event = SubagentDone(1, 1, "worker", "finished", 2, TokenUsage(1, 2), 1.0, attempt=3)
        recorder = await EventRecorder.start(store, "s")
        recorder(event)
        await recorder.flush()
        (row,) = await store.events("s")
        assert parse_row(row) == event, (row, parse_row(row))
        data = json.loads(row.data)
        assert data.pop("attempt") == 3  # and a record from before the field reads its default:
        assert parse_row(dataclasses.replace(row, data=json.dumps(data))).attempt == 0
        print(parse_row(row).attempt, read_session([row]).skipped)
    finally:
        await store.close()

asyncio.run(main())
"""


def test_a_field_added_to_an_event_is_recorded_and_read_back_with_no_other_edit(
    store_url: str, tmp_path: Path
) -> None:
    copy = tmp_path / "src"
    shutil.copytree(
        SRC / "orchmode", copy / "orchmode", ignore=shutil.ignore_patterns("__pycache__")
    )
    declaration = copy / "orchmode" / "core" / "events.py"
    last = '    report_path: str = ""\n'  # SubagentDone's last field
    assert declaration.read_text().count(last) == 1
    declaration.write_text(declaration.read_text().replace(last, last + "    attempt: int = 0\n"))
    env = {**base_env(), "PYTHONPATH": str(copy)}
    result = subprocess.run(
        [sys.executable, "-c", ADDED_FIELD_RUN, store_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "0"]
