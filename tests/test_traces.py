"""Traces: a real run's events become OpenTelemetry spans, here kept in the SDK's in-memory
exporter; the OpenTelemetry SDK is not loaded when tracing is off (the API package is: the
anthropic SDK imports it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import orchmode
from conftest import API_KEY, StartServer, settings_for
from mcp_servers import http_server
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
    ApprovalRequested,
    SubagentStarted,
    TurnDone,
    TurnResumed,
    TurnStarted,
)
from orchmode.core.settings import Settings
from orchmode.telemetry.ids import turn_ids
from orchmode.telemetry.traces import Traces
from orchmode.telemetry.tracing import start_tracing, tracing_wanted
from orchmode.testing import Fault, ScriptedServer
from orchmode.testing.faults import FaultSchedule
from orchmode.testing.scenario import OrchestrationScenario, role_of
from phoenix_fixture import Phoenix
from recorded_runs import base_env
from test_resume import Replanning, ctrl_c_during_fanout


async def traced_run(
    server: ScriptedServer, tmp_path: Path, **overrides: Any
) -> tuple[list[ReadableSpan], str]:
    """One orchestrated turn through ``open_session``, its events made into spans."""
    tmp_path.mkdir(exist_ok=True)
    settings = settings_for(server, tmp_path, **overrides)
    memory = InMemorySpanExporter()
    traces = start_tracing(settings, [API_KEY], processor=SimpleSpanProcessor(memory))
    async with orchmode.open_session(
        settings,
        workdir=tmp_path,
        credentials=orchmode.Credentials(api_key=API_KEY),
        subscribers=[traces],
    ) as session:
        traces.session_id = session.id
        await session.turn("review it")
    traces.close()
    return list(memory.get_finished_spans()), session.id


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, span.name
    return next(s for s in spans if s.context.span_id == span.parent.span_id)


async def test_a_turn_is_one_trace_of_its_agents_requests_and_commands(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=3, worker_command="echo hi"))
    spans, session = await traced_run(server, tmp_path)
    (turn,) = named(spans, "invoke_agent main")
    assert turn.parent is None
    assert {s.context.trace_id for s in spans} == {turn.context.trace_id}
    labelled = [s for s in spans if s.name.startswith("invoke_agent")]
    assert {(s.attributes or {})["session.id"] for s in labelled} == {session}
    (call,) = named(spans, "execute_tool Workflow")
    assert parent_of(call, spans) is turn
    assert call.attributes is not None and call.attributes["orchmode.workflow.subtasks"] == 3

    agents = named(spans, "invoke_agent worker") + named(spans, "invoke_agent verifier")
    assert sorted(s.name for s in agents) == sorted(
        f"invoke_agent {role} 1.{i}" for role in ("worker", "verifier") for i in (1, 2, 3)
    )
    for agent in agents:
        attributes = agent.attributes or {}
        assert parent_of(agent, spans) is call
        assert attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attributes["orchmode.subtask.index"] in (1, 2, 3)
        assert attributes["orchmode.journal_hit"] is False
        assert attributes["orchmode.cost_usd"] > 0
        if attributes["orchmode.role"] == "verifier":
            assert attributes["orchmode.verdict"] == "confirmed"

    # every model request is a chat span in its agent, with the server's own token counts
    chats = named(spans, "chat ")
    assert len(chats) == len(server.log)
    by_id = {(s.attributes or {})["gen_ai.response.id"]: s for s in chats}
    for entry in server.log:
        billed = entry.billed
        assert billed is not None
        chat = by_id[entry.message_id]
        attributes = chat.attributes or {}
        assert attributes["gen_ai.usage.input_tokens"] == billed.total_input
        assert attributes["gen_ai.usage.output_tokens"] == billed.output_tokens
        assert attributes["gen_ai.usage.cache_read.input_tokens"] == billed.cache_read_tokens
        assert attributes["gen_ai.usage.cache_creation.input_tokens"] == billed.cache_write_tokens
        assert attributes["gen_ai.provider.name"] == "anthropic"
        assert attributes["gen_ai.request.model"] == entry.body["model"]
        parent = parent_of(chat, spans)
        assert parent is turn if role_of(entry.body) == "main" else parent in agents
        assert chat.start_time is not None and parent.start_time is not None
        assert parent.start_time <= chat.start_time

    bash = named(spans, "execute_tool bash")
    worker_bash = [s for s in bash if parent_of(s, spans) in agents]
    assert len(worker_bash) == 3
    assert all((s.attributes or {})["orchmode.bash.command"] == "echo hi" for s in worker_bash)
    assert all((s.attributes or {})["orchmode.bash.exit_code"] == 0 for s in worker_bash)


async def test_prompts_and_results_go_in_only_with_trace_content_and_masked(
    serve: StartServer, tmp_path: Path
) -> None:
    secret_prompt = f"check the key {API_KEY}-and-more"
    server = await serve(OrchestrationScenario(subtasks=[secret_prompt]))
    spans, _ = await traced_run(server, tmp_path / "a")
    texts = [str(v) for s in spans for v in (s.attributes or {}).values()]
    assert not any("check the key" in t for t in texts)
    assert not any(
        k in ("orchmode.prompt", "orchmode.result") for s in spans for k in s.attributes or {}
    )

    server = await serve(OrchestrationScenario(subtasks=[secret_prompt]))
    spans, _ = await traced_run(server, tmp_path / "b", trace_content=True)
    (worker,) = named(spans, "invoke_agent worker")
    attributes = worker.attributes or {}
    assert attributes["orchmode.prompt"] == "check the key ***-and-more"
    assert "Finished: check the key ***" in str(attributes["orchmode.result"])
    assert all(API_KEY not in str(v) for s in spans for v in (s.attributes or {}).values())


async def test_retries_are_span_events_and_a_failed_request_an_error_span(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(subtasks=1, scout_command=None)
    faults = {0: Fault("overloaded", retry_after=0.01), 2: Fault("server_error")}
    server = await serve(FaultSchedule(scenario, at=faults))
    spans, _ = await traced_run(server, tmp_path, max_retries=0)
    (turn,) = named(spans, "invoke_agent main")
    first = min(named(spans, "chat "), key=lambda s: s.start_time or 0)
    assert parent_of(first, spans) is turn
    assert [(e.name, (e.attributes or {})["orchmode.retry.reason"]) for e in first.events] == [
        ("orchmode.retry", "overloaded")
    ]
    assert (first.attributes or {})["orchmode.retries"] == 1
    (worker,) = named(spans, "invoke_agent worker")
    (failed,) = [s for s in spans if parent_of_or_none(s, spans) is worker]
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "TransientFailure"
    assert "500" in (failed.status.description or "")
    assert worker.status.status_code is StatusCode.ERROR
    assert (worker.attributes or {})["orchmode.status"] == "failed"


def parent_of_or_none(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next((s for s in spans if s.context.span_id == span.parent.span_id), None)


def test_tracing_is_on_with_an_endpoint_setting_or_variable() -> None:
    assert not tracing_wanted(Settings(), {})
    assert tracing_wanted(Settings(otlp_endpoint="http://127.0.0.1:4318"), {})
    assert tracing_wanted(Settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert tracing_wanted(Settings(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/t"})
    assert not tracing_wanted(Settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": ""})


def test_service_name_is_orchmode_unless_the_variables_name_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory = InMemorySpanExporter()

    def service(environ: dict[str, str]) -> object:
        for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
            monkeypatch.delenv(name, raising=False)
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        traces = start_tracing(Settings(), (), environ, SimpleSpanProcessor(memory))
        name = traces.provider.resource.attributes.get("service.name")
        traces.close()
        return name

    assert service({}) == "orchmode"
    assert service({"OTEL_SERVICE_NAME": "reviews"}) == "reviews"
    assert service({"OTEL_RESOURCE_ATTRIBUTES": "service.name=ci,team=infra"}) == "ci"


def test_without_the_packages_asking_for_traces_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith(('opentelemetry.sdk', 'opentelemetry.exporter')):\n"
        "            raise ImportError('blocked for this test')\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "orchmode", "run", "go", "--otlp-endpoint", "http://127.0.0.1:9"],
        cwd=tmp_path,
        env=base_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0
    assert "pip install 'orchmode[otel]'" in run.stderr
    assert len([line for line in run.stderr.splitlines() if "otel" in line]) == 1


def test_with_tracing_off_the_opentelemetry_sdk_is_not_loaded(
    scripted: Any, tmp_path: Path
) -> None:
    server = scripted(OrchestrationScenario(subtasks=2))
    probe = (
        "import sys, runpy\n"
        "sys.argv = ['orchmode', 'run', 'go', '--base-url', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('orchmode', run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "loaded = sorted(m for m in sys.modules\n"
        "                if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter')))\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
    )
    env = {k: v for k, v in base_env().items() if not k.startswith("OTEL_")}
    run = subprocess.run(
        [sys.executable, "-c", probe, server.url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "LOADED []" in run.stderr
    assert "Synthesis: 2 agents reported; 2 results were confirmed." in run.stdout


def test_a_traces_object_made_by_hand_takes_no_events_it_does_not_know() -> None:
    memory = InMemorySpanExporter()
    traces = start_tracing(Settings(), (), {}, SimpleSpanProcessor(memory))
    assert isinstance(traces, Traces)
    traces(object())  # type: ignore[arg-type]
    traces.close()
    assert memory.get_finished_spans() == ()


def run_traced(server: ScriptedServer, tmp_path: Path, env: dict[str, str], *flags: str) -> str:
    """``orchmode run`` in a process of its own; the session it recorded."""
    tmp_path.mkdir(exist_ok=True)
    run = subprocess.run(
        [sys.executable, "-m", "orchmode", "run", "go", "--base-url", server.url, *flags],
        cwd=tmp_path,
        env=base_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    return run.stderr.split("recorded as ", 1)[1].split(";", 1)[0]


@pytest.mark.parametrize("switch", ["variable", "flag"])
def test_a_run_arrives_in_a_real_trace_backend_as_a_tree(
    scripted: Any, phoenix: Phoenix, tmp_path: Path, switch: str
) -> None:
    server = scripted(OrchestrationScenario(subtasks=3, worker_command="echo hi"))
    project = phoenix.project()
    env = phoenix.exporter_env(project)
    flags: tuple[str, ...] = ()
    if switch == "flag":
        flags = ("--otlp-endpoint", env.pop("OTEL_EXPORTER_OTLP_ENDPOINT"))
    session = run_traced(server, tmp_path, env, *flags)
    requests = len(server.log)

    def complete(spans: list[dict[str, Any]]) -> bool:
        chats = sum(s["name"].startswith("chat ") for s in spans)
        roots = sum(s["parent_id"] is None for s in spans)
        return chats >= requests and roots >= 2

    spans = phoenix.wait_for(project, complete)
    assert complete(spans), [s["name"] for s in spans]
    by_id = {s["context"]["span_id"]: s for s in spans}
    roots = [s for s in spans if s["parent_id"] is None]
    # `orchmode run` is two turns (the orchestrated one, then a summary): a trace each
    assert sorted(s["name"] for s in roots) == ["invoke_agent main"] * 2
    assert len({s["context"]["trace_id"] for s in roots}) == 2
    assert {s["attributes"]["session.id"] for s in spans if "invoke_agent" in s["name"]} == {
        session
    }
    (call,) = [s for s in spans if s["name"] == "execute_tool Workflow"]
    turn = by_id[call["parent_id"]]
    assert turn in roots
    agents = [s for s in spans if s["name"].startswith("invoke_agent ") and s not in roots]
    assert len(agents) == 6 and all(a["parent_id"] == call["context"]["span_id"] for a in agents)
    assert {a["attributes"]["orchmode.role"] for a in agents} == {"worker", "verifier"}
    assert {
        a["attributes"]["orchmode.verdict"] for a in agents if "orchmode.verdict" in a["attributes"]
    } == {"confirmed"}
    # each request: a chat span under its agent, with the tokens the server billed
    chats = {
        s["attributes"]["gen_ai.response.id"]: s for s in spans if s["name"].startswith("chat ")
    }
    for entry in server.log:
        billed = entry.billed
        assert billed is not None
        chat = chats[entry.message_id]
        attributes = chat["attributes"]
        assert attributes["gen_ai.usage.input_tokens"] == billed.total_input
        assert attributes["gen_ai.usage.output_tokens"] == billed.output_tokens
        assert attributes["gen_ai.usage.cache_read.input_tokens"] == billed.cache_read_tokens
        assert attributes["gen_ai.request.model"] == entry.body["model"]
        parent = by_id[chat["parent_id"]]
        assert parent in roots if role_of(entry.body) == "main" else parent in agents
        assert chat["context"]["trace_id"] == parent["context"]["trace_id"]
    commands = [s for s in spans if s["name"] == "execute_tool bash"]
    assert sum(by_id[s["parent_id"]] in agents for s in commands) == 3
    assert {s["attributes"]["orchmode.bash.command"] for s in commands} >= {"echo hi", "ls"}


@pytest.mark.slow
def test_ctrl_c_sends_the_spans_so_far_and_the_resume_is_a_linked_trace(
    scripted: Any, phoenix: Phoenix, tmp_path: Path
) -> None:
    server = scripted(Replanning(delay=0.05))
    spans_to = phoenix.project()
    env = base_env(**phoenix.exporter_env(spans_to))
    stderr = ctrl_c_during_fanout(server, tmp_path, env)
    session = stderr.split("orchmode resume ", 1)[1].split("`", 1)[0]

    def roots(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["parent_id"] is None]

    spans = phoenix.wait_for(spans_to, lambda found: len(roots(found)) >= 1)
    (cut,) = roots(spans)
    assert cut["attributes"]["orchmode.interrupted"] is True
    assert cut["attributes"]["orchmode.turn"] == 1
    trace_id, span_id = turn_ids(session, 1)
    assert cut["context"] == {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"}
    finished = [
        s
        for s in spans
        if s["name"].startswith("invoke_agent worker") and "orchmode.status" in s["attributes"]
    ]
    assert len(finished) >= 2  # what had finished was sent before the process exited

    resumed = subprocess.run(
        [sys.executable, "-m", "orchmode", "resume", "--base-url", server.url,
         "--claim-lease", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    spans = phoenix.wait_for(
        spans_to, lambda found: any(r["attributes"].get("orchmode.resumed") for r in roots(found))
    )
    again = [r for r in roots(spans) if r["attributes"].get("orchmode.resumed")]
    assert len(again) == 1 and again[0]["context"]["trace_id"] != cut["context"]["trace_id"]
    assert again[0]["attributes"]["orchmode.turn"] == 1
    assert {r["attributes"]["session.id"] for r in roots(spans)} == {session}
    # Phoenix keeps no span links, so the link is read from its copy in attributes
    resumes = again[0]["attributes"]
    assert resumes["orchmode.resumes.trace_id"] == cut["context"]["trace_id"]
    assert resumes["orchmode.resumes.span_id"] == cut["context"]["span_id"]


def test_a_resumed_turn_links_to_the_turn_it_resumes_and_close_ends_what_is_open() -> None:
    memory = InMemorySpanExporter()
    first = start_tracing(Settings(), (), {}, SimpleSpanProcessor(memory))
    first.session_id = "20261202-000000-abcdef"
    first(TurnStarted("go", (), 3))
    first(SubagentStarted(1, 1, "worker", "t", "p"))
    first.close()  # as after Ctrl-C: the turn and the agent still open
    turn, agent = sorted(memory.get_finished_spans(), key=lambda s: s.name)
    assert (turn.name, agent.name) == ("invoke_agent main", "invoke_agent worker 1.1")
    assert (turn.attributes or {})["orchmode.interrupted"] is True
    assert (agent.attributes or {})["orchmode.interrupted"] is True
    trace_id, span_id = turn_ids(first.session_id, 3)
    assert (turn.context.trace_id, turn.context.span_id) == (trace_id, span_id)
    assert agent.context.trace_id == trace_id and agent.context.span_id != span_id

    memory = InMemorySpanExporter()  # the first was shut down with its tracer
    second = start_tracing(Settings(), (), {}, SimpleSpanProcessor(memory))
    second.session_id = first.session_id
    second(TurnResumed(3))
    second(TurnDone("end_turn", 1))
    second.close()
    (resumed,) = memory.get_finished_spans()
    assert resumed.context.trace_id != trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in resumed.links] == [
        (trace_id, span_id)
    ]
    assert (resumed.attributes or {})["orchmode.resumed"] is True


def test_an_http_mcp_server_is_sent_the_traceparent_of_the_call(
    scripted: Any, phoenix: Phoenix, tmp_path: Path
) -> None:
    seen: list[str] = []
    spans_to = phoenix.project()
    with http_server("web", traceparents=seen) as url:
        config = tmp_path / "mcp.json"
        config.write_text(json.dumps({"mcpServers": {"web": {"type": "http", "url": url}}}))
        scenario = OrchestrationScenario(
            subtasks=2,
            worker_call=lambda subtask: ("mcp__web__lookup", {"key": subtask}),
            worker_command=None,
        )
        server = scripted(scenario)
        run_traced(server, tmp_path, phoenix.exporter_env(spans_to), "--mcp-config", str(config))
    requests = len(server.log)
    spans = phoenix.wait_for(
        spans_to, lambda found: sum(s["name"].startswith("chat ") for s in found) >= requests
    )
    calls = [s for s in spans if s["name"] == "execute_tool mcp__web__lookup"]
    assert len(calls) == 2
    by_id = {s["context"]["span_id"]: s for s in spans}
    assert {by_id[c["parent_id"]]["name"] for c in calls} == {
        "invoke_agent worker 1.1",
        "invoke_agent worker 1.2",
    }
    expected = {f"00-{c['context']['trace_id']}-{c['context']['span_id']}-01" for c in calls}
    assert expected <= set(seen)  # each call's own request carried its span's context


async def test_connections_are_client_spans_and_an_approval_wait_a_span_in_their_agent(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    memory = InMemorySpanExporter()
    traces = start_tracing(Settings(), [API_KEY], {}, SimpleSpanProcessor(memory))
    await networked_turn(server, tmp_path, traces, sandbox="off")
    traces.close()
    spans = list(memory.get_finished_spans())
    index = named(spans, f"connect {INDEX}")
    assert len(index) == 30 and len(named(spans, f"connect {FILES}")) == 2
    for span in index:
        attributes = span.attributes or {}
        assert parent_of(span, spans).name == "invoke_agent worker 1.1"
        assert attributes["server.address"] == INDEX and attributes["server.port"] == 443
        assert attributes["orchmode.network.decision"] == "allowed"
        assert attributes["orchmode.network.bytes_sent"] == 900
        assert 40_000 <= int(attributes["orchmode.network.bytes_received"]) < 40_030  # type: ignore[arg-type]
        assert span.status.status_code != StatusCode.ERROR
        assert span.end_time is not None and span.start_time is not None
        assert span.end_time - span.start_time == 10_000_000  # its 0.01 s, ending when heard of
    refused = named(spans, f"connect {REFUSED}")
    assert len(refused) == 3
    for span in refused:
        assert span.status.status_code == StatusCode.ERROR
        assert (span.attributes or {})["error.type"] == "NetworkDenied"
        assert (span.attributes or {})["orchmode.network.rule"] == DENY_RULE
    (wait,) = named(spans, "orchmode.approval")
    agent = parent_of(wait, spans)
    assert (
        wait.name == f"orchmode.approval {APPROVAL_ID}" and agent.name == "invoke_agent worker 1.2"
    )
    attributes = wait.attributes or {}
    assert attributes["orchmode.approval.what"] == ASKED
    assert attributes["orchmode.approval.why"] == ASK_WHY
    assert attributes["orchmode.approval.answer"] == "approved"
    assert attributes["orchmode.approval.always"] is True
    assert "orchmode.approval.reason" not in attributes  # the user's words: content only
    assert agent.start_time is not None and agent.end_time is not None
    assert wait.start_time is not None and wait.end_time is not None
    assert agent.start_time <= wait.start_time <= wait.end_time <= agent.end_time
    (approved,) = named(spans, "connect downloads.example")
    assert parent_of(approved, spans) is agent
    assert approved.end_time is not None  # it went through once the answer came
    assert wait.end_time <= approved.end_time


def test_an_approval_still_waiting_when_the_run_stops_ends_as_interrupted() -> None:
    memory = InMemorySpanExporter()
    traces = start_tracing(Settings(trace_content=True), (), {}, SimpleSpanProcessor(memory))
    traces(TurnStarted("go", (), 1))
    traces(ApprovalRequested(4, "main", "command", "npm ci", "Bash(npm ci) (ask)"))
    traces(ApprovalRequested(4, "main", "command", "npm ci", "Bash(npm ci) (ask)"))  # again
    traces.close()
    (wait,) = named(list(memory.get_finished_spans()), "orchmode.approval")
    assert (wait.attributes or {})["orchmode.interrupted"] is True
    assert parent_of(wait, list(memory.get_finished_spans())).name == "invoke_agent main"
