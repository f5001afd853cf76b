"""Batch mode through a whole session: which agents are batched, the price paid, the refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import API_KEY, StartServer, conversation_for, settings_for
from orchmode.core.errors import ConfigError, PromptTooLong
from orchmode.core.events import EventBus, ModelRequestDone
from orchmode.core.pricing import ModelPrice, model_id
from orchmode.core.settings import Settings
from orchmode.model.gateway import ModelChoice, session_gateway
from orchmode.model.providers import Credentials
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import BatchFate, BatchSettings, Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of
from test_agent_roles import REVIEWER, define
from test_isolation import editing, nothing_left, repo
from test_isolation import run as run_in
from test_parked_runs import ASK_RULE, commands_asking_for
from test_script import workflow_block
from test_typed_results import COUNT, counting

pytestmark = pytest.mark.timeout(120)

SYNTHESIS = "Synthesis: 6 agents reported; 6 results were confirmed."


async def run(
    server: ScriptedServer, tmp_path: Path, **overrides: Any
) -> tuple[str, list[ModelRequestDone]]:
    settings = settings_for(
        server, tmp_path, batch_window=0.05, batch_poll=0.01, session="s1", **overrides
    )
    events = EventBus()
    done: list[ModelRequestDone] = []
    events.subscribe(lambda e: done.append(e) if isinstance(e, ModelRequestDone) else None)
    store = SQLiteStore.open(tmp_path / "store.db")
    session = await conversation_for(settings, events=events, store=store)
    try:
        result = await session.turn("review it")
    finally:
        await session.close()
        await store.close()
    return result.text, done


def interactive_roles(server: ScriptedServer) -> set[str]:
    return {role_of(e.body) for e in server.log if "messages" in (e.body or {})}


def batched_roles(server: ScriptedServer) -> list[str]:
    return [role_of(item.prompt.body) for b in server.batches.all() for item in b.items]


async def test_with_every_subagent_batched_only_the_main_agent_is_answered_at_once(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=6), batches=BatchSettings(delay=0.05))
    text, done = await run(server, tmp_path, batch="subagents")
    assert text == SYNTHESIS
    assert interactive_roles(server) == {"main"}
    assert sorted(set(batched_roles(server))) == ["verifier", "worker"]
    # every request went into a batch once, none twice
    assert set(server.batches.submissions.values()) == {1}
    assert {e.batched for e in done if e.agent == "main"} == {False}
    assert {e.batched for e in done if e.agent != "main"} == {True}


async def test_with_verifiers_batched_the_workers_are_answered_at_once(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(OrchestrationScenario(subtasks=6), batches=BatchSettings(delay=0.05))
    text, _ = await run(server, tmp_path, batch="verifiers")
    assert text == SYNTHESIS
    assert interactive_roles(server) == {"main", "worker"}
    assert set(batched_roles(server)) == {"verifier"}


async def test_a_batched_request_is_paid_at_half_of_every_rate(
    serve: StartServer, tmp_path: Path
) -> None:
    """Each batched request costs half what its usage costs at once, the hour-long cache
    writes of the shared prefix at half their own (higher) rate; the run as a whole costs
    little more than half the same run answered at once."""
    price = ModelPrice(input=4, output=20, cache_write=5, cache_read=0.2)
    prices = {"claude-opus-5-5": price.model_dump()}
    at_once = await serve(OrchestrationScenario(subtasks=6))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, plain = await run(at_once, tmp_path / "a", prices=prices)
    batched = await serve(OrchestrationScenario(subtasks=6), batches=BatchSettings(delay=0.01))
    _, halved = await run(batched, tmp_path / "b", batch="subagents", prices=prices)
    subagents = [e for e in halved if e.agent != "main"]
    for e in subagents:
        assert e.cost == pytest.approx(price.cost(e.usage) / 2), e.agent
    # the system prompt, shared by each role's agents, is written once to be kept an hour
    assert sum(e.usage.cache_write_1h_tokens for e in subagents) > 0
    assert all(e.usage.cache_write_1h_tokens == 0 for e in plain)
    for e in (e for e in plain if e.agent != "main"):
        assert e.cost == pytest.approx(price.cost(e.usage)), e.agent
    paid = sum(e.cost for e in subagents)
    full = sum(e.cost for e in plain if e.agent != "main")
    assert paid <= 0.6 * full, (paid, full)


@pytest.mark.parametrize("provider", ["bedrock", "vertex"])
async def test_batch_mode_is_refused_in_one_line_where_no_batch_api_serves_it(
    tmp_path: Path, provider: str
) -> None:
    settings = Settings(workdir=tmp_path, provider=provider, batch="subagents")
    with pytest.raises(ConfigError) as refused:
        await conversation_for(settings)
    message = str(refused.value)
    assert "\n" not in message
    assert "--batch subagents needs Anthropic's Message Batches API" in message
    assert f"--provider {provider}" in message


@pytest.mark.parametrize("fate", [BatchFate.errored(), BatchFate.expired(), BatchFate.canceled()])
async def test_failed_batch_results_are_asked_again_and_the_run_completes(
    serve: StartServer, tmp_path: Path, fate: BatchFate
) -> None:
    scenario = OrchestrationScenario(subtasks=6)
    failed: set[str] = set()

    def respond(request: ScriptedRequest) -> Reply | BatchFate:
        agent = first_user_text(request)
        if request.batched and agent not in failed:
            failed.add(agent)
            return fate
        return scenario(request)

    server = await serve(respond, batches=BatchSettings(delay=0.01))
    text, done = await run(server, tmp_path, batch="subagents")
    assert text == SYNTHESIS
    assert len(failed) == 12  # each worker and each verifier failed once
    attempts = sorted(cid.rsplit("-", 1)[1] for cid in server.batches.submissions)
    assert attempts.count("1") == 12
    assert set(server.batches.submissions.values()) == {1}
    assert all(e.batched for e in done if e.agent != "main")


async def test_a_batched_request_the_api_finds_too_long_fails_as_its_400_would(
    serve: StartServer, tmp_path: Path
) -> None:
    """Too long: the same PromptTooLong as interactively, so the agent's loop makes room."""
    server = await serve(OrchestrationScenario(subtasks=1), context_window=2000)
    settings = settings_for(server, tmp_path, batch="subagents", batch_window=0.01)
    store = SQLiteStore.open(tmp_path / "store.db")
    gateway = session_gateway(settings, Credentials(api_key=API_KEY), EventBus(), store, "s1")
    long = [{"role": "user", "content": "word " * 5000}]
    refused: list[BaseException] = []
    try:
        for batched in (False, True):
            choice = ModelChoice(settings.model, settings.effort, batched)
            with pytest.raises(PromptTooLong) as caught:
                await gateway.complete(
                    agent="w", system="s", messages=long, tools=[], choice=choice
                )
            refused.append(caught.value)
    finally:
        await gateway.close()
        await store.close()
    interactive, batched_one = refused
    assert isinstance(batched_one, PromptTooLong) and isinstance(interactive, PromptTooLong)
    assert batched_one.tokens == interactive.tokens is not None
    assert len(server.batches.all()) == 1


async def test_batched_workers_in_workspaces_of_their_own_land_as_they_do_at_once(
    serve: StartServer, tmp_path: Path
) -> None:
    """Isolation in batch mode: each worker's turns come from batches, its bash runs in its
    own workspace between them, and only the verified changes are merged."""
    workdir = repo(tmp_path / "work", {"README": "x\n"})
    subtasks = [
        f"Write part {i}{' REFUTE' if i == 4 else ''} $ echo part{i} > part{i}.txt"
        for i in range(1, 5)
    ]
    server = await serve(editing(subtasks), batches=BatchSettings(delay=0.02))
    settled, _ = await run_in(
        server, tmp_path, workdir, batch="subagents", batch_window=0.05, batch_poll=0.01
    )
    assert [e.fate for e in settled] == ["merged"] * 3 + ["not merged"]
    for i in range(1, 4):
        assert (workdir / f"part{i}.txt").read_text() == f"part{i}\n"
    assert not (workdir / "part4.txt").exists()
    assert interactive_roles(server) == {"main"}
    assert sorted(set(batched_roles(server))) == ["verifier", "worker"]
    nothing_left(workdir)


def batched_bodies(server: ScriptedServer, role: str) -> list[Any]:
    """The first request of each batched agent of ``role``, as the batch held it."""
    return [
        item.prompt.body
        for batch in server.batches.all()
        for item in batch.items
        if item.prompt is not None
        and role_of(item.prompt.body) == role
        and len(item.prompt.body["messages"]) == 1
    ]


async def test_roles_and_typed_results_work_the_same_in_batch_mode(
    serve: StartServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker naming a role runs on that role's model and prompt, and a typed subtask's
    data comes back whole, when their turns come from batches."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    work = tmp_path / "work"
    work.mkdir()
    define(work, REVIEWER)
    subtasks = [
        {"prompt": "review the queries", "agent": "security-reviewer"},
        {"prompt": "Count TODOs 4", "schema": COUNT},
    ]
    scenario = OrchestrationScenario(subtasks=subtasks, worker_command=None, worker_data=counting)
    server = await serve(scenario, batches=BatchSettings(delay=0.01))
    text, done = await run(server, work, batch="subagents")
    assert text == "Synthesis: 2 agents reported; 2 results were confirmed."
    workers = {str(b["messages"][0]["content"]): b for b in batched_bodies(server, "worker")}
    assert workers["review the queries"]["model"] == model_id("haiku")
    assert "`security-reviewer`" in workers["review the queries"]["system"][0]["text"]
    tool = next(t for t in workers["Count TODOs 4"]["tools"] if t["name"] == "report_findings")
    assert tool["input_schema"]["properties"]["data"] == COUNT
    assert '"data": {"count": 4, "file": "src/app.py"}' in workflow_block(server)["content"]
    assert interactive_roles(server) == {"main"}
    assert all(e.batched for e in done if e.agent != "main")


async def test_a_permission_rule_answers_a_batched_workers_command_as_it_does_at_once(
    serve: StartServer, tmp_path: Path
) -> None:
    """The command a rule asks about, answered "no" for an unattended run: the batched
    worker is told so in its next turn's batch, and the run goes on."""
    scenario = OrchestrationScenario(subtasks=2, worker_command=commands_asking_for(1))
    server = await serve(scenario, batches=BatchSettings(delay=0.01))
    text, _ = await run(
        server, tmp_path, batch="subagents", permissions_ask=[ASK_RULE], approvals="deny"
    )
    assert text == "Synthesis: 2 agents reported; 2 results were confirmed."
    sent = json.dumps(
        [i.prompt.body for b in server.batches.all() for i in b.items if i.prompt is not None]
    )
    assert "was not run" in sent and "--approvals deny" in sent
    assert "echo item 2" in sent
