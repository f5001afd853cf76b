"""A budget per agent and per subtree, over real HTTP: agents stop with what they have, in time.

The scripted workers here given a subtask that says "dig" never report: they run one more
command on every turn, so only a budget (or their turns) ends them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.events import EventBus, SubagentDone, SubagentStarted, TokenUsage
from orchmode.core.pricing import default_prices
from orchmode.core.results import Status
from orchmode.model.allowance import MIN_OUTPUT, AgentLimits, Allowance, running
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of
from test_script import result_value, workflow_block

PRICE = default_prices()["claude-opus-5-5"]


class Digging:
    """The scenario's model, except that a worker told to dig calls bash on every turn."""

    def __init__(self, subtasks: list[Any], delay: float = 0.0, script: str | None = None) -> None:
        self.scenario = OrchestrationScenario(
            subtasks=subtasks, scout_command=None, worker_command=None, script=script
        )
        self.delay = delay
        #: The output a digging reply takes (0: as long as its text).
        self.output = 0

    def __call__(self, request: ScriptedRequest) -> Reply:
        asked = request.body["max_tokens"]
        if role_of(request.body) == "worker" and self.output and asked < self.output:
            # given less output than its reply needs, it stops there, as the API's model would
            return Reply.text("Half a thought", stop_reason="max_tokens", output_tokens=asked)
        asked_to = first_user_text(request)
        if role_of(request.body) == "worker" and "dig" in asked_to and "fan out" not in asked_to:
            turn = sum(1 for m in request.messages if m.get("role") == "assistant")
            return Reply.tool_use(
                "bash",
                {"command": f"seq 1 {200 + turn}"},
                preamble=f"Digging deeper, turn {turn}.",
                delay=self.delay,
            )
        return self.scenario(request)


def tokens_of(usage: TokenUsage) -> int:
    return usage.total_input + usage.output_tokens


def billed(server: ScriptedServer, role: str, asked: str = "") -> list[TokenUsage]:
    """What each of ``role``'s requests was billed, in the order they came (only those of
    agents whose first message has ``asked`` in it)."""
    return [
        u
        for e in server.log
        if role_of(e.body) == role
        and asked in str(e.body["messages"][0]["content"])
        and (u := e.billed) is not None
    ]


async def run_turn(
    server: ScriptedServer, tmp_path: Path, **overrides: Any
) -> tuple[str, list[Any]]:
    """One user turn; the tool result's text and every event."""
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    settings = settings_for(server, tmp_path, **overrides)
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    try:
        result = await session.turn("go")
    finally:
        await session.close()
    return result.text, seen


def done(seen: list[Any], role: str) -> list[SubagentDone]:
    return [e for e in seen if isinstance(e, SubagentDone) and e.role == role]


def workflow_result(server: ScriptedServer) -> str:
    """The Workflow tool result the main agent was sent."""
    for entry in server.log:
        if role_of(entry.body) != "main":
            continue
        for message in entry.body["messages"]:
            content = message.get("content")
            if message["role"] == "user" and isinstance(content, list):
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        return str(block["content"])
    return ""


async def test_a_subtask_given_20000_tokens_stops_within_one_request_of_them(
    serve: StartServer, tmp_path: Path
) -> None:
    subtasks = [{"prompt": "dig as deep as you can", "budget": {"tokens": 20_000}}, "check b"]
    server = await serve(Digging(subtasks))
    _text, seen = await run_turn(server, tmp_path, subagent_turns=100)
    worker = next(e for e in done(seen, "worker") if e.index == 1)
    assert worker.status == Status.BUDGET.value
    assert worker.result.startswith("[orchmode: stopped: its budget of 20,000 tokens was spent (")
    assert "Digging deeper" in worker.result  # what it had, kept
    digging = billed(server, "worker", "dig")
    assert len(digging) == worker.turns
    used = tokens_of(worker.usage)
    assert used == sum(tokens_of(u) for u in digging) <= 20_000
    # stopped only when the next request could not fit: within one request of the cap
    assert 20_000 - used < max(tokens_of(u) for u in digging) + MIN_OUTPUT
    # the other subtask had no budget and finished; the partial one was still verified
    assert {e.index: e.status for e in done(seen, "worker")}[2] == "finished"
    assert {e.index for e in done(seen, "verifier")} == {1, 2}
    assert "its budget of 20,000 tokens was spent" in workflow_result(server)


async def test_a_reply_cut_short_by_the_budget_stops_the_agent_as_its_budget_did(
    serve: StartServer, tmp_path: Path
) -> None:
    digging = Digging([{"prompt": "dig", "budget": {"tokens": 20_000}}])
    digging.output = 30_000  # more than the budget leaves: its first reply is cut short
    server = await serve(digging)
    _text, seen = await run_turn(server, tmp_path, verify=False)
    (worker,) = done(seen, "worker")
    assert (worker.status, worker.turns) == (Status.BUDGET.value, 1)
    assert "had room for only part of its last reply" in worker.result
    (request,) = [e for e in server.log if role_of(e.body) == "worker"]
    assert MIN_OUTPUT <= request.body["max_tokens"] < 20_000
    assert tokens_of(worker.usage) <= 20_000


async def test_a_subtask_budget_of_turns_overrides_the_agents_turns(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(Digging([{"prompt": "dig", "budget": {"turns": 2}}]))
    _text, seen = await run_turn(server, tmp_path, verify=False)
    (worker,) = done(seen, "worker")
    assert (worker.status, worker.turns) == (Status.TURN_LIMIT.value, 2)
    assert "used its 2 model turns" in worker.result


async def test_a_script_gives_an_agent_a_budget_in_its_subtask_object(
    serve: StartServer, tmp_path: Path
) -> None:
    script = (
        'r = agent({"prompt": "dig here", "budget": {"tokens": 9000}})\n[r["status"], r["error"]]'
    )
    server = await serve(Digging([], script=script))
    await run_turn(server, tmp_path, verify=False)
    status, error = result_value(str(workflow_block(server)["content"]))
    assert status == "budget"
    assert error.startswith("[orchmode: stopped: its budget of 9,000 tokens was spent (")


async def test_a_scripts_parallel_gives_each_agent_the_budget_it_names(
    serve: StartServer, tmp_path: Path
) -> None:
    script = (
        'rs = parallel(["dig a", "dig b"], budget={"tokens": 9000})\n[r[\'status\'] for r in rs]'
    )
    server = await serve(Digging([], script=script))
    _text, seen = await run_turn(server, tmp_path, verify=False)
    assert result_value(str(workflow_block(server)["content"])) == ["budget", "budget"]
    assert all(tokens_of(e.usage) <= 9000 for e in done(seen, "worker"))


async def test_a_scripts_bad_budget_is_an_exception_in_the_script(
    serve: StartServer, tmp_path: Path
) -> None:
    script = 'agent("dig", budget={"tokens": -5})'
    server = await serve(Digging([], script=script))
    await run_turn(server, tmp_path, verify=False)
    text = str(workflow_block(server)["content"])
    assert '"budget" tokens must be a whole number above 0, not -5' in text
    assert not [e for e in server.log if role_of(e.body) == "worker"]


async def test_a_subtree_given_half_a_dollar_never_passes_it_with_50_agents_in_flight(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(Digging([f"dig into part {i}" for i in range(50)], delay=0.05))
    subtree = Allowance(AgentLimits(usd=0.5), name="the run")
    with running(subtree):
        _text, seen = await run_turn(
            server, tmp_path, verify=False, max_concurrent=50, max_tokens=1000
        )
    assert len([e for e in seen if isinstance(e, SubagentStarted)]) == 50
    # every request of the run, the main agent's and all 50 workers', was paid from it
    paid = sum(PRICE.cost(u) for u in billed(server, "main") + billed(server, "worker"))
    assert subtree.spent_usd == pytest.approx(paid) and 0.4 < paid <= 0.5
    assert (subtree.reserved_usd, subtree.in_flight) == (0.0, 0)
    stopped = [e for e in done(seen, "worker") if e.status == Status.BUDGET.value]
    assert len(stopped) == 50
    assert all("the budget of its subtree (under the run) of $0.50" in e.result for e in stopped)
    # the agents were in flight together: many worker requests were on the wire at once
    workers = [e for e in server.log if role_of(e.body) == "worker"]
    spans = [(e.started, e.finished or e.started) for e in workers]
    most = max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans)
    assert most >= 10


async def test_a_worker_given_half_a_dollar_never_passes_it_with_its_50_children_in_flight(
    serve: StartServer, tmp_path: Path
) -> None:
    """A real nested fan-out: the worker's budget pays for its children's requests too."""
    root = "dig under part 1"
    subtasks = [{"prompt": f"{root}: fan out into 50", "budget": {"usd": 0.5}}]
    server = await serve(Digging(subtasks, delay=0.05))
    _text, seen = await run_turn(
        server, tmp_path, verify=False, max_concurrent=50, max_tokens=1000, max_depth=2
    )
    children = [e for e in done(seen, "worker") if e.call == 2]
    assert len(children) == 50
    paid = sum(PRICE.cost(u) for u in billed(server, "worker", root))
    assert 0.4 < paid <= 0.5  # the parent's requests and all 50 children's
    stopped = [e for e in children if e.status == Status.BUDGET.value]
    assert len(stopped) == 50
    assert all("(under worker 1.1) of $0.50" in e.result for e in stopped), stopped[0].result
    # the children were in flight together
    dug = [
        e
        for e in server.log
        if role_of(e.body) == "worker" and e.body["messages"][0]["content"].startswith(f"{root}.")
    ]
    spans = [(e.started, e.finished or e.started) for e in dug]
    assert max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans) >= 10


async def test_the_session_ledger_still_caps_agents_given_a_larger_budget(
    serve: StartServer, tmp_path: Path
) -> None:
    subtasks = [{"prompt": f"dig {i}", "budget": {"usd": 5}} for i in range(4)]
    server = await serve(Digging(subtasks))
    store = store_for(tmp_path)
    settings = settings_for(server, tmp_path, max_tokens=2000, max_cost=0.06, verify=False)
    session = await conversation_for(settings, store=store)
    try:
        await session.turn("go")
        state = await store.budget(session.session_id)
    finally:
        await session.close()
    assert 0 < state.cost <= 0.06
