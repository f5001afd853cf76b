"""Batch mode as the views tell it: the batch events, ``show``, ``budget``, the report,
``--plain`` lines and traces, each from a real batched fan-out against the scripted server."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import orchmode
from conftest import API_KEY, StartServer, settings_for
from orchmode.core.events import (
    BatchEnded,
    BatchSent,
    BatchWaiting,
    Event,
    ModelRequestDone,
    TurnStarted,
)
from orchmode.core.settings import Settings
from orchmode.records.codec import event_row, parse_row
from orchmode.records.history import SessionHistory, read_session
from orchmode.records.totals import SessionTotals
from orchmode.session.ledger import budget_report
from orchmode.store.sqlite import SQLiteStore
from orchmode.telemetry.tracing import start_tracing
from orchmode.testing import BatchSettings, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views import progress
from orchmode.views.formatting import money, plural
from orchmode.views.live import LiveView
from orchmode.views.report import render_report
from orchmode.views.transcript import plain, print_lines, transcript
from test_live import render, rows_of

pytestmark = pytest.mark.timeout(120)

PRICES = {"claude-opus-5-5": {"input": 4, "output": 20, "cache_write": 5, "cache_read": 0.2}}


@dataclass
class BatchedRun:
    events: list[Event]
    history: SessionHistory
    settings: Settings
    budget: list[str]


async def batched_run(
    server: ScriptedServer, tmp_path: Path, *subscribers: Any, **overrides: Any
) -> BatchedRun:
    """One orchestrated turn with every subagent batched, read back from its store."""
    settings = settings_for(
        server,
        tmp_path,
        batch="subagents",
        batch_window=0.05,
        batch_poll=0.01,
        prices=PRICES,
        **overrides,
    )
    seen: list[Event] = []
    async with orchmode.open_session(
        settings,
        workdir=tmp_path,
        credentials=orchmode.Credentials(api_key=API_KEY),
        subscribers=[seen.append, *subscribers],
    ) as session:
        await session.turn("review it")
        session_id = session.id
    store = SQLiteStore.open(tmp_path / "journal.db")
    try:
        history = read_session(await store.events(session_id), session=session_id)
        budget = (await budget_report(store, session_id, settings)).lines()
    finally:
        await store.close()
    return BatchedRun(seen, history, settings, budget)


async def test_a_batch_is_said_sent_waited_on_by_each_agent_and_ended(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.05))
    run = await batched_run(server, tmp_path)
    sent = [e for e in run.events if isinstance(e, BatchSent)]
    ended = [e for e in run.events if isinstance(e, BatchEnded)]
    waiting = [e for e in run.events if isinstance(e, BatchWaiting)]
    created = server.batches.all()
    assert sorted(e.batch_id for e in sent) == sorted(b.id for b in created)
    assert sum(e.requests for e in sent) == sum(len(b.items) for b in created)
    assert sorted(e.batch_id for e in ended) == sorted(e.batch_id for e in sent)
    assert all(e.succeeded == e.requests and e.duration > 0 for e in ended)
    batched_agents = {e.agent for e in run.events if isinstance(e, ModelRequestDone) and e.batched}
    assert {e.agent for e in waiting} == batched_agents
    assert "main" not in batched_agents and len(batched_agents) == 6
    assert {e.batch_id for e in waiting} <= {e.batch_id for e in sent}


def dollars_in(line: str) -> list[str]:
    return re.findall(r"\$[0-9.,]+", line)


async def test_show_lists_the_batches_and_marks_each_batched_agent_after_its_cost(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.05))
    run = await batched_run(server, tmp_path)
    shown = plain(transcript(run.history)).splitlines()
    for agent in run.history.agents:
        line = next(x for x in shown if x.strip().startswith(agent.label + " "))
        assert agent.batched == agent.requests > 0
        # the first dollar figure is what it paid; then what batching saved: as much again
        paid = sum(
            e.cost for e in run.events if isinstance(e, ModelRequestDone) and e.agent == agent.name
        )
        assert dollars_in(line) == [money(paid), money(paid)], line
        assert f"batched {agent.batched} of {plural(agent.requests, 'request')}" in line
    (main_request,) = [x for x in shown if "user" in x and "review it" in x]
    assert "batched" not in main_request
    section = shown[shown.index("batches") + 1 :]
    for batch in server.batches.all():
        listed = next(x for x in section if batch.id in x)
        held = plural(len(batch.items), "request")
        assert f"· {held} · ended: {len(batch.items)} succeeded ·" in listed
    waited = [x for x in section if x.strip().startswith("waited on by ")]
    named = {name for x in waited for name in x.split("waited on by ")[1].split(", ")}
    assert named == {agent.name for agent in run.history.agents}


async def test_budget_says_what_was_batched_and_what_it_saved_at_the_interactive_price(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.01))
    run = await batched_run(server, tmp_path)
    done = [e for e in run.events if isinstance(e, ModelRequestDone)]
    batched = [e for e in done if e.batched]
    paid = sum(e.cost for e in batched)
    at_once = 0.0
    for e in batched:
        price = run.settings.price(e.model)
        assert price is not None
        at_once += price.cost(e.usage)
    (line,) = [x for x in run.budget if x.startswith("batched ")]
    assert line == (
        f"batched    {len(batched)} of {len(done)} requests · ${paid:.4f} of the "
        f"${sum(e.cost for e in done):.4f} spent · ${at_once - paid:.4f} saved"
    )
    assert at_once - paid > 0


async def test_plain_output_says_what_waits_on_batches_every_interval_while_anything_does(
    serve: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "WAITING_EVERY", 0.05)  # a minute, in a real run
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.4))
    stream = io.StringIO()
    await batched_run(server, tmp_path, progress.StderrProgress(stream=stream))
    lines = [x for x in stream.getvalue().splitlines() if x.startswith("[batch] ")]
    batches = server.batches.all()
    for batch in batches:
        assert f"[batch] sent {batch.id}: {plural(len(batch.items), 'request')}" in lines
        ended = [x for x in lines if x.startswith(f"[batch] {batch.id} ended after ")]
        assert len(ended) == 1 and ended[0].endswith(f": {len(batch.items)} succeeded")
    waiting = [x for x in lines if " wait on " in x]
    # lines while agents wait, none once every agent has its answer
    assert len(waiting) >= 6  # three waves (two worker turns, the verifiers) of 0.4 s
    pattern = (
        r"\[batch\] [1-3] agents? wait on [1-3] batch(es)? \([1-3] requests?\), "
        r"the oldest sent [0-9.]+ s ago"
    )
    assert all(re.fullmatch(pattern, x) for x in waiting), waiting
    last_end = max(i for i, x in enumerate(lines) if " ended after " in x)
    assert not [x for x in lines[last_end:] if " wait on " in x]


async def test_traces_mark_batched_requests_with_their_batch_and_a_span_for_each_batch(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.05))
    settings = settings_for(server, tmp_path, batch="subagents", batch_window=0.05)
    memory = InMemorySpanExporter()
    traces = start_tracing(settings, [API_KEY], processor=SimpleSpanProcessor(memory))
    run = await batched_run(server, tmp_path, traces)
    traces.close()
    spans = list(memory.get_finished_spans())
    batch_spans = {attr(s, "orchmode.batch.id"): s for s in spans if s.name.startswith("batch ")}
    sent = [e for e in run.events if isinstance(e, BatchSent)]
    assert set(batch_spans) == {e.batch_id for e in sent}
    waited_on_by: dict[object, set[object]] = {}
    for e in sent:
        span = batch_spans[e.batch_id]
        assert attr(span, "orchmode.batch.requests") == e.requests
        assert attr(span, "orchmode.batch.succeeded") == e.requests
        waited_on_by[e.batch_id] = {
            (ev.attributes or {})["gen_ai.agent.name"] for ev in span.events
        }
        assert len(waited_on_by[e.batch_id]) == e.requests
    requests = [(s, parent_name(s, spans)) for s in spans if s.name.startswith("chat ")]
    main = [s for s, parent in requests if parent == "invoke_agent main"]
    assert main and all(attr(s, "orchmode.batched") is False for s in main)
    batched = [(s, parent) for s, parent in requests if parent != "invoke_agent main"]
    assert len(batched) == 9
    for span, parent in batched:
        assert attr(span, "orchmode.batched") is True
        agent = parent.removeprefix("invoke_agent ")
        assert agent in waited_on_by[attr(span, "orchmode.batch.id")]


def attr(span: ReadableSpan, name: str) -> object:
    return (span.attributes or {})[name]


def parent_name(span: ReadableSpan, spans: list[ReadableSpan]) -> str:
    assert span.parent is not None
    return next(s.name for s in spans if s.context.span_id == span.parent.span_id)


async def test_the_live_view_shows_each_batch_and_each_agent_waiting_on_one(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.05))
    run = await batched_run(server, tmp_path)
    now = [100.0]
    view = LiveView(SessionTotals(), clock=lambda: now[0])
    first = next(i for i, e in enumerate(run.events) if isinstance(e, BatchSent))
    waits = [e for e in run.events[first:] if isinstance(e, BatchWaiting)]
    cut = next(i for i, e in enumerate(run.events) if isinstance(e, BatchEnded))
    for event in run.events[:cut]:  # every agent of the first wave waits on its batch
        view.totals(event)
        view(event)
    now[0] += 42
    text = render(view)
    sent = run.events[first]
    assert isinstance(sent, BatchSent)
    row = next(x for x in text.splitlines() if sent.batch_id in x and "requests" in x)
    assert re.search(rf"{sent.requests} requests\s+in progress\s+42\.0 s", row), row
    rows = rows_of(text)
    for wait in waits[: sent.requests]:
        role, number = wait.agent.split()
        line = rows[(int(number.split(".")[1]), role)]
        assert "waiting on batch msgbatch_" in line, line
    for event in run.events[cut:]:
        view.totals(event)
        view(event)
    text = render(view)
    assert "in progress" not in text and "waiting on batch" not in text
    total = view.totals.all
    assert total.batched == 9
    assert f"· {total.batched} batched, ${total.saved:.2f} saved ·" in text


async def test_the_report_has_a_batches_section_and_each_batched_agent_says_what_it_saved(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3), batches=BatchSettings(delay=0.01))
    run = await batched_run(server, tmp_path)
    page = render_report(run.history)
    section = page[page.index('<section id="batches">') :]
    section = section[: section.index("</section>")]
    for batch in server.batches.all():
        n = len(batch.items)
        row = re.search(
            rf'<tr class="batch" data-batch="{batch.id}" data-state="ended">.*?</tr>', section
        )
        assert row is not None
        assert f"<td>{n}</td><td>ended: {n} succeeded</td>" in row[0]
    total = run.history.totals.all
    assert f'data-saved="{total.saved!r}"' in section and total.saved > 0
    assert f"9 of {total.requests} model requests batched" in section
    for agent in run.history.agents:
        facts = f"{agent.batched} of {agent.requests} requests, saved {money(agent.saved)} ("
        assert f"<dt>batched</dt><dd>{facts}" in page


def test_batch_ids_and_agent_names_from_the_api_are_escaped_in_every_view() -> None:
    hostile = "msgbatch_<img src=x>\x1b[31m"
    rows = [
        event_row(1, TurnStarted("review it", ())),
        event_row(2, BatchSent(hostile, 1)),
        event_row(3, BatchWaiting("worker 1.1", hostile)),
        event_row(4, BatchEnded(hostile, 1, 0, 0, 0, 3.0)),
    ]
    history = read_session(rows, session="s")
    page = render_report(history)
    assert "<img" not in page and "\x1b" not in page
    assert "msgbatch_&lt;img src=x&gt;" in page
    shown = io.StringIO()
    print_lines(transcript(history), shown)
    assert "\x1b" not in shown.getvalue() and "msgbatch_<img src=x>\\x1b[31m" in shown.getvalue()
    stream = io.StringIO()
    plain_progress = progress.StderrProgress(stream=stream)
    for row in rows:
        event = parse_row(row)
        assert event is not None
        plain_progress(event)
    assert "\x1b" not in stream.getvalue() and "[batch] sent msgbatch_<img" in stream.getvalue()


def test_a_nodes_batch_events_reach_the_driver_in_a_jobs_stream() -> None:
    """On Ray, a node batches its own agents' turns: who waits goes in that agent's job
    stream, a batch sent or ended in whichever job runs. (No cluster: the actor's routing.)"""
    pytest.importorskip("ray")
    from orchmode.executors.ray import AgentPool, Secret
    from orchmode.model.providers import Credentials

    pool = AgentPool(Settings(), Credentials(api_key=API_KEY), Secret("postgresql://nowhere"))
    streams: dict[str, list[Event]] = {"worker 1.1": [], "worker 1.2": []}
    for name, stream in streams.items():
        pool.routes[name] = stream.append
    waiting = BatchWaiting("worker 1.2", "msgbatch_01")
    for event in (BatchSent("msgbatch_01", 2), waiting, BatchEnded("msgbatch_01", 2, 0, 0, 0, 9.0)):
        pool.events.emit(event)
    assert waiting in streams["worker 1.2"] and waiting not in streams["worker 1.1"]
    said = [e for s in streams.values() for e in s if not isinstance(e, BatchWaiting)]
    assert [type(e) for e in said] == [BatchSent, BatchEnded]
