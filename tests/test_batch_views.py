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
)
from orchmode.core.settings import Settings
from orchmode.records.history import SessionHistory, read_session
from orchmode.session.ledger import budget_report
from orchmode.store.sqlite import SQLiteStore
from orchmode.telemetry.tracing import start_tracing
from orchmode.testing import BatchSettings, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.views import progress
from orchmode.views.formatting import money, plural
from orchmode.views.transcript import plain, transcript

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
        f"batched    {len(batched)} of {len(done)} requests · ${paid:.4f} of "
        f"${sum(e.cost for e in done):.4f} paid for them · ${at_once - paid:.4f} saved"
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
