"""Fan-out and verification through a whole session: order, limits, failures, the journal."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.events import EventBus, SubagentDone
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import MIXED, Fault, Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of


def slowed(scenario: OrchestrationScenario, subtask: str, delay: float) -> Any:
    """The scenario, with the worker of one subtask answering after ``delay`` seconds."""

    def respond(request: ScriptedRequest) -> Reply:
        reply = scenario(request)
        if first_user_text(request) == subtask:
            reply.delay = delay
        return reply

    return respond


def workflow_result(server: ScriptedServer) -> str:
    main = [e for e in server.log if role_of(e.body) == "main"]
    last = main[-1].body["messages"]
    results = [m for m in last if m["role"] == "user" and isinstance(m["content"], list)]
    return str(results[-1]["content"][0]["content"])


async def run_session(
    server: ScriptedServer, tmp_path: Path, **overrides: Any
) -> tuple[str, EventBus]:
    settings = settings_for(server, tmp_path, **overrides)
    events = EventBus()
    store = SQLiteStore.open(tmp_path / "store.db")
    session = await conversation_for(settings, events=events, store=store)
    try:
        result = await session.turn("review it")
    finally:
        await session.close()
        await store.close()
    return result.text, events


async def test_twenty_subtasks_give_twenty_results_and_verdicts_in_order(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=20, delay=0.02))
    text, _ = await run_session(server, tmp_path)
    assert text == "Synthesis: 20 agents reported; 20 results were confirmed."
    result = workflow_result(server)
    headers = re.findall(r"^\[(agent|verify) (\d+)(?::[^\]]*)?\]$", result, flags=re.M)
    expected = [(kind, str(i)) for i in range(1, 21) for kind in ("agent", "verify")]
    assert headers == expected
    assert "[agent 7: Check item 7]\n" in result
    assert 2 <= server.max_in_flight_seen <= 10
    assert all(e.status == 200 for e in server.log)


async def test_in_flight_subagents_never_exceed_the_limit(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=12, delay=0.02))
    await run_session(server, tmp_path, max_concurrent=3)
    assert server.max_in_flight_seen == 3


@pytest.mark.parametrize("fault", MIXED, ids=["529", "429", "500", "dropped", "sse-error", "empty"])
async def test_a_fault_on_every_subagent_still_delivers_every_result(
    serve: StartServer, tmp_path: Path, fault: Fault
) -> None:
    """Each subagent's first request fails once; the fan-out finishes as if nothing happened."""
    scenario = OrchestrationScenario(subtasks=8, worker_command=None)
    failed: set[str] = set()

    def respond(request: ScriptedRequest) -> Reply | Fault:
        agent = first_user_text(request)
        if len(request.messages) == 1 and agent not in failed:
            failed.add(agent)
            return fault
        return scenario(request)

    server = await serve(respond)
    text, _ = await run_session(server, tmp_path, max_retries=2)
    assert text == "Synthesis: 8 agents reported; 8 results were confirmed."
    assert len(failed) == 16  # 8 workers and 8 verifiers, each refused once
    assert f"fault:{fault.kind}" in {e.outcome for e in server.log}
    assert "error:" not in workflow_result(server)


async def test_a_failing_subagent_is_an_error_string_in_its_slot(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(subtasks=3)

    def respond(request: ScriptedRequest) -> Reply | Fault:
        if first_user_text(request) == "Check item 2":
            return Fault("server_error")
        return scenario(request)

    server = await serve(respond)
    text, _ = await run_session(server, tmp_path)
    result = workflow_result(server)
    slot = result.split("[agent 2: Check item 2]\n", 1)[1].split("\n\n", 1)[0]
    assert slot.startswith("error: the subagent failed:") and "500" in slot
    assert "[verify 2]\n[orchmode: not verified, because the agent failed]" in result
    assert result.count('"summary": "confirmed') == 2
    assert text.startswith("Synthesis: 3 agents")


async def test_a_second_run_takes_every_result_from_the_journal(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=5))
    await run_session(server, tmp_path)
    first_count = len(server.log)
    await run_session(server, tmp_path)
    second = server.log[first_count:]
    assert {role_of(e.body) for e in second} == {"main"}
    assert workflow_result(server).count('"summary": "confirmed') == 5


async def test_fresh_ignores_recorded_results(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(OrchestrationScenario(subtasks=2, worker_command=None))
    await run_session(server, tmp_path)
    first_count = len(server.log)
    await run_session(server, tmp_path, fresh=True)
    roles = [role_of(e.body) for e in server.log[first_count:]]
    assert roles.count("worker") == 2 and roles.count("verifier") == 2


async def test_unfinished_results_are_retried_on_the_next_run(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(subtasks=2, worker_command=None)
    cut = {"done": False}

    def respond(request: ScriptedRequest) -> Reply | Fault:
        if first_user_text(request) == "Check item 1" and not cut["done"]:
            cut["done"] = True
            return Reply.text("I was cut o", stop_reason="max_tokens")
        return scenario(request)

    server = await serve(respond)
    await run_session(server, tmp_path)
    first_count = len(server.log)
    await run_session(server, tmp_path)
    rerun = [
        first_user_text_of(e.body) for e in server.log[first_count:] if role_of(e.body) == "worker"
    ]
    assert rerun == ["Check item 1"]


def first_user_text_of(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


async def test_verification_starts_before_the_first_wave_is_over(
    serve: StartServer, tmp_path: Path
) -> None:
    """No barrier: item 1's verifier runs while item 2's slow worker is still working."""
    scenario = OrchestrationScenario(subtasks=2, worker_command=None)
    server = await serve(slowed(scenario, "Check item 2", 0.5))
    await run_session(server, tmp_path)
    slow_worker = next(e for e in server.log if first_user_text_of(e.body) == "Check item 2")
    verifier_1 = next(
        e
        for e in server.log
        if role_of(e.body) == "verifier" and "Check item 1" in first_user_text_of(e.body)
    )
    assert slow_worker.finished is not None
    assert verifier_1.started < slow_worker.finished


async def test_events_tell_the_story_of_the_fan_out(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(OrchestrationScenario(subtasks=3))
    settings = settings_for(server, tmp_path)
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    await session.turn("go")
    await session.close()
    done = [e for e in seen if isinstance(e, SubagentDone)]
    assert sorted((e.role, e.index) for e in done) == sorted(
        [("worker", i) for i in (1, 2, 3)] + [("verifier", i) for i in (1, 2, 3)]
    )
    assert {e.verdict for e in done if e.role == "verifier"} == {"confirmed"}


async def test_verification_can_be_switched_off(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(OrchestrationScenario(subtasks=2))
    await run_session(server, tmp_path, verify=False)
    assert "[verify" not in workflow_result(server)
    assert "verifier" not in {role_of(e.body) for e in server.log}


async def test_identical_subtasks_in_one_wave_run_once(serve: StartServer, tmp_path: Path) -> None:
    scenario = OrchestrationScenario(
        subtasks=["Check item 1", "Check item 1", "Check item 2"], worker_command=None
    )
    server = await serve(scenario)
    await run_session(server, tmp_path)
    workers = [first_user_text_of(e.body) for e in server.log if role_of(e.body) == "worker"]
    assert sorted(workers) == ["Check item 1", "Check item 2"]
    result = workflow_result(server)
    assert result.count("[agent ") == 3 and result.count('"summary": "confirmed') == 3


async def test_a_heartbeat_keeps_a_long_subtask_claimed(serve: StartServer, tmp_path: Path) -> None:
    """Two sessions on one store; the worker outlives its lease many times over, yet runs once."""
    scenario = OrchestrationScenario(subtasks=["Check item 1"], worker_command=None)
    server = await serve(slowed(scenario, "Check item 1", 1.0))
    import asyncio

    await asyncio.gather(
        run_session(server, tmp_path, claim_lease=0.2),
        run_session(server, tmp_path, claim_lease=0.2),
    )
    workers = [first_user_text_of(e.body) for e in server.log if role_of(e.body) == "worker"]
    assert workers == ["Check item 1"]


async def test_every_subagent_request_shares_one_byte_stable_prefix(
    serve: StartServer, tmp_path: Path
) -> None:
    """Tools and system prompt identical to the byte across the wave, so caches hit across it."""
    import json

    server = await serve(OrchestrationScenario(subtasks=6))
    await run_session(server, tmp_path)
    prefixes = {
        json.dumps([e.body["tools"], e.body["system"]], sort_keys=False)
        for e in server.log
        if role_of(e.body) != "main"
    }
    assert len(prefixes) == 1


async def test_every_subagent_after_the_first_reads_the_shared_prefix_from_the_cache(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=6, worker_command=None))
    await run_session(server, tmp_path, max_concurrent=1)
    firsts = [e for e in server.log if role_of(e.body) != "main" and len(e.body["messages"]) == 1]
    assert len(firsts) == 12
    reads = [e.usage.cache_read_input_tokens for e in firsts if e.usage is not None]
    assert len(reads) == 12 and reads[0] == 0 and all(r > 0 for r in reads[1:])


async def test_subagent_costs_and_the_main_agent_add_up_to_the_session(
    serve: StartServer, tmp_path: Path
) -> None:
    from orchmode.core.events import ModelRequestDone
    from orchmode.core.pricing import default_prices

    server = await serve(OrchestrationScenario(subtasks=5))
    seen: list[Any] = []
    settings = settings_for(server, tmp_path)
    events = EventBus()
    events.subscribe(seen.append)
    store = SQLiteStore.open(tmp_path / "store.db")
    session = await conversation_for(settings, events=events, store=store)
    await session.turn("review it")
    await session.close()
    await store.close()
    done = [e for e in seen if isinstance(e, SubagentDone)]
    main = [e for e in seen if isinstance(e, ModelRequestDone) and e.agent == "main"]
    price = default_prices()["claude-opus-5-5"]
    assert len(done) == 10 and all(d.cost == pytest.approx(price.cost(d.usage)) for d in done)
    assert all(d.cost > 0 for d in done)
    total = sum(d.cost for d in done) + sum(m.cost for m in main)
    gateway = session.gateway
    assert total == pytest.approx(gateway.cost) and gateway.cost > 0


async def test_a_worker_hands_its_slot_to_its_own_verifier(
    serve: StartServer, tmp_path: Path
) -> None:
    """One slot, three chains: each chain finishes before the next worker starts."""
    server = await serve(OrchestrationScenario(subtasks=3))
    await run_session(server, tmp_path, max_concurrent=1)
    order = []
    for entry in server.log:
        if role_of(entry.body) != "main" and len(entry.body["messages"]) == 1:
            text = entry.body["messages"][0]["content"]
            item = re.search(r"Check item (\d)", text)
            assert item is not None
            order.append(f"{role_of(entry.body)} {item.group(1)}")
    assert order == [f"{role} {i}" for i in (1, 2, 3) for role in ("worker", "verifier")]
