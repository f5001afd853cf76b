"""Orchestration scripts through a whole session: host functions, limits, errors, replay."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.events import EventBus, ScriptDone, ScriptStarted, SubagentDone, SubagentStarted
from orchmode.core.prompts import WORKFLOW_DESCRIPTION
from orchmode.session.agent import TurnResult
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, first_user_text, role_of
from recorded_runs import kill_run_when, orchmode, worker_prompts


def started(server: ScriptedServer, role: str, since: int = 0) -> list[str]:
    """The first prompt of every ``role`` conversation the server saw begin."""
    return [
        str(e.body["messages"][0]["content"])
        for e in server.log[since:]
        if role_of(e.body) == role and len(e.body["messages"]) == 1
    ]


def workflow_block(server: ScriptedServer) -> dict[str, Any]:
    """The tool_result block the Workflow call gave the main agent."""
    main = [e for e in server.log if role_of(e.body) == "main"]
    block: dict[str, Any] = main[-1].body["messages"][-1]["content"][0]
    assert block["type"] == "tool_result"
    return block


def result_value(text: str) -> Any:
    """The script's return value: the JSON that opens a successful tool result."""
    return json.loads(text.split("\n\n[", 1)[0])


def scenario(script: str, **kwargs: Any) -> OrchestrationScenario:
    kwargs.setdefault("worker_command", None)
    kwargs.setdefault("scout_command", None)
    return OrchestrationScenario(script=script, **kwargs)


async def run_session(
    server: ScriptedServer, tmp_path: Path, events: EventBus | None = None, **overrides: Any
) -> TurnResult:
    settings = settings_for(server, tmp_path, **overrides)
    events = events or EventBus()
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    try:
        return await session.turn("review it")
    finally:
        await session.close()


LOOP_BRANCH_REDUCE = """
areas = ["parser", "cache", "cli"]
results = parallel(["Check area " + a for a in areas])
kept = []
for area, r in zip(areas, results):
    if area == "cache":
        v = verify("Check area " + area, r)
        kept.append({"area": area, "verdict": v["verdict"]})
    else:
        kept.append({"area": area, "summary": r["summary"]})
log("checked", len(results), "areas")
print("printed too")
total = sum(len(r["findings"]) for r in results)
{"kept": kept, "findings": total}
"""


async def test_a_script_with_a_loop_a_branch_and_a_reduce_returns_its_value(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(scenario(LOOP_BRANCH_REDUCE))
    turn = await run_session(server, tmp_path)
    assert turn.stop == "end_turn"
    block = workflow_block(server)
    assert not block.get("is_error")
    text = block["content"]
    assert result_value(text) == {
        "kept": [
            {"area": "parser", "summary": "Finished: Check area parser"},
            {"area": "cache", "verdict": "confirmed"},
            {"area": "cli", "summary": "Finished: Check area cli"},
        ],
        "findings": 3,
    }
    assert "[log]\nchecked 3 areas\nprinted too" in text
    assert text.splitlines()[-1].startswith("[budget: 4 of 500 subagents launched; ")
    assert sorted(started(server, "worker")) == [
        "Check area cache",
        "Check area cli",
        "Check area parser",
    ]
    verifiers = started(server, "verifier")
    assert len(verifiers) == 1 and "<subtask>\nCheck area cache\n</subtask>" in verifiers[0]


def description_example(heading: str) -> str:
    """An example script from the Workflow tool's description, as the model reads it."""
    part = WORKFLOW_DESCRIPTION.split(heading, 1)[1].split("\n\n", 1)[0]
    lines = part.splitlines()[1:]
    return "\n".join(line.removeprefix("    ") for line in lines)


@pytest.mark.parametrize(
    ("heading", "keys", "workers", "verifiers"),
    [
        ("Completeness critic as a script:", {"reviews", "missed"}, 4, 0),
        ("Multiphase sequencing as a script", {"plan", "change", "review"}, 3, 1),
    ],
    ids=["critic", "multiphase"],
)
async def test_the_examples_in_the_tool_description_run(
    serve: StartServer,
    tmp_path: Path,
    heading: str,
    keys: set[str],
    workers: int,
    verifiers: int,
) -> None:
    server = await serve(scenario(description_example(heading)))
    await run_session(server, tmp_path)
    block = workflow_block(server)
    assert not block.get("is_error"), block["content"]
    assert set(result_value(block["content"])) == keys
    assert len(started(server, "worker")) == workers
    assert len(started(server, "verifier")) == verifiers


@pytest.mark.parametrize(
    ("script", "overrides", "needles"),
    [
        ("x = 1\ny = (x,\nz = 3\n", {}, ["syntax error: Expected `,`", "(line 3)"]),
        (
            "def look(d):\n    return d['missing']\n\nlook({})\n",
            {},
            ["KeyError", "(line 2)", "2 | return d['missing']", "lines 4 → 2"],
        ),
        (
            "n = 0\nwhile True:\n    n += 1\n",
            {"script_cpu_seconds": 0.5},
            ["TimeoutError", "0.5 s of computing", "no line number"],
        ),
        (
            "x = 'a'\nwhile True:\n    x = x + x\n",
            {"script_memory_mb": 16},
            ["MemoryError", "(line 3)"],
        ),
        (
            "def down(n):\n    return down(n + 1)\n\ndown(0)\n",
            {"script_recursion_limit": 50},
            ["RecursionError", "(line 2)"],
        ),
        ("secret = open('/etc/passwd').read()\n", {}, ["PermissionError", "(line 1)", "no file"]),
        ("log('hi')\nimport os\nos.getenv('HOME')\n", {}, ["may not import 'os'", "(line 2)"]),
        ("m = __import__('os')\n", {}, ["NameError", "(line 1)"]),
        ("import socket\n", {}, ["may not import 'socket'", "(line 1)"]),
        ("r = agent('x', 'y', 'z')\n", {}, ["TypeError", "agent() takes 2 arguments", "(line 1)"]),
        ("r = await agent('x')\n", {}, ["TypeError", "without await", "(line 1)"]),
    ],
    ids=[
        "syntax",
        "exception",
        "infinite-loop",
        "memory-bomb",
        "recursion",
        "open",
        "import-os",
        "dunder-import",
        "import-socket",
        "bad-call",
        "await",
    ],
)
async def test_a_bad_script_is_an_error_result_and_the_session_goes_on(
    serve: StartServer,
    tmp_path: Path,
    script: str,
    overrides: dict[str, Any],
    needles: list[str],
) -> None:
    server = await serve(scenario(script))
    turn = await run_session(server, tmp_path, **overrides)
    block = workflow_block(server)
    assert block.get("is_error") is True
    text = block["content"]
    assert text.startswith("error: ")
    for needle in needles:
        assert needle in text, text
    assert text.splitlines()[-1].startswith("[budget: ")
    # The model got the error and went on to answer; no agent was ever started.
    assert turn.stop == "end_turn" and turn.text.startswith("Synthesis:")
    assert started(server, "worker") == []


async def test_parallel_keeps_to_the_session_concurrency_limit(
    serve: StartServer, tmp_path: Path
) -> None:
    script = "rs = parallel(['Check item %d' % i for i in range(12)])\n[r['summary'] for r in rs]\n"
    server = await serve(scenario(script, delay=0.05))
    await run_session(server, tmp_path, max_concurrent=3)
    assert server.max_in_flight_seen == 3
    value = result_value(workflow_block(server)["content"])
    assert value == [f"Finished: Check item {i}" for i in range(12)]  # in order


async def test_a_script_cannot_start_more_agents_than_its_limit(
    serve: StartServer, tmp_path: Path
) -> None:
    script = (
        "first = parallel(['a', 'b'])\n"
        "third = agent('c')\n"
        "try:\n"
        "    parallel(['d', 'e'])\n"
        "except RuntimeError as exc:\n"
        "    log('refused: ' + str(exc))\n"
        "fourth = agent('f')\n"
    )
    server = await serve(scenario(script))
    await run_session(server, tmp_path, script_max_agents=3)
    block = workflow_block(server)
    assert block.get("is_error") is True
    text = block["content"]
    assert "limit of 3 agents" in text and "(line 7)" in text
    assert "refused: parallel() of 2 prompts would take this script past" in text
    assert sorted(started(server, "worker")) == ["a", "b", "c"]


async def test_a_used_up_session_budget_comes_back_as_skipped_errors(
    serve: StartServer, tmp_path: Path
) -> None:
    script = "rs = parallel(['a', 'b', 'c', 'd'])\n[sorted(r) for r in rs] + [budget()]\n"
    server = await serve(scenario(script))
    await run_session(server, tmp_path, max_subagents=2)
    text = workflow_block(server)["content"]
    value = result_value(text)
    assert (
        sorted(map(tuple, value[:4])) == [("error", "status")] * 2 + [("findings", "summary")] * 2
    )
    assert value[4]["subagents_left"] == 0 and value[4]["script_agents_started"] == 4
    assert "2 agents of this script were not run" in text
    assert len(started(server, "worker")) == 2


async def test_both_forms_or_neither_is_an_error_result(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(scenario("1"))
    settings = settings_for(server, tmp_path)
    session = await conversation_for(settings, store=store_for(tmp_path))
    try:
        both = await session.workflow.run({"subtasks": ["a"], "script": "agent('a')"})
        neither = await session.workflow.run({})
        empty = await session.workflow.run({"script": "   "})
        fine = await session.workflow.run({"subtasks": None, "script": "6 * 7"})
    finally:
        await session.close()
    assert both[1] and "not both" in both[0]
    assert neither[1] and "exactly one of" in neither[0]
    assert empty[1] and "non-empty string" in empty[0]
    assert not fine[1] and fine[0].startswith("42\n\n[budget: 0 of 500")
    assert len(server.log) == 0


REPLAYED = """
import random
firsts = parallel(["Check item %d" % i for i in range(3)])
token = random.randint(1, 10**9)
follow = [agent("Follow up %d on: %s" % (token, r["summary"])) for r in firsts]
{"token": token, "follow": [f["summary"] for f in follow]}
"""


async def test_a_rerun_serves_every_agent_from_the_journal_with_the_same_random_draws(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(scenario(REPLAYED))
    await run_session(server, tmp_path)
    first = result_value(workflow_block(server)["content"])
    assert len(started(server, "worker")) == 6
    before = len(server.log)
    await run_session(server, tmp_path)
    assert {role_of(e.body) for e in server.log[before:]} == {"main"}
    assert result_value(workflow_block(server)["content"]) == first


async def test_script_agents_tell_their_story_in_events(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(scenario(LOOP_BRANCH_REDUCE))
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    await run_session(server, tmp_path, events=events)
    assert [type(e) for e in seen if isinstance(e, ScriptStarted | ScriptDone)] == [
        ScriptStarted,
        ScriptDone,
    ]
    done = [e for e in seen if isinstance(e, SubagentDone)]
    assert sorted((e.role, e.index) for e in done) == [
        ("verifier", 4),
        ("worker", 1),
        ("worker", 2),
        ("worker", 3),
    ]
    assert next(e.verdict for e in done if e.role == "verifier") == "confirmed"
    assert len([e for e in seen if isinstance(e, SubagentStarted)]) == 4
    end = next(e for e in seen if isinstance(e, ScriptDone))
    assert end.agents == 4 and end.error is None


async def test_the_wall_time_limit_stops_a_script_waiting_on_its_agents(
    serve: StartServer, tmp_path: Path
) -> None:
    slow = scenario("done = agent('quick')\nslow = agent('slow one')\n")

    def respond(request: ScriptedRequest) -> Any:
        reply = slow(request)
        if first_user_text(request) == "slow one":
            reply.delay = 5.0
        return reply

    server = await serve(respond)
    started_at = time.monotonic()
    await run_session(server, tmp_path, script_timeout=1.0)
    assert time.monotonic() - started_at < 4.0
    text = workflow_block(server)["content"]
    assert "wall-clock" in text and "(line 2)" in text
    assert "asked for 2 agents before it stopped" in text


# --------------------------------------------------------------- a real process, killed

KILLED = """
import random
firsts = parallel(["Check item %d" % i for i in range(1, 11)])
follow = []
for r in firsts:
    follow.append(agent("Follow up %d on: %s" % (random.randint(1, 10**6), r["summary"])))
{"firsts": len(firsts), "follow": len([f for f in follow if "error" not in f])}
"""


@pytest.mark.slow
def test_a_script_killed_mid_run_recomputes_no_finished_agent(tmp_path: Path) -> None:
    server = ScriptedServer(
        OrchestrationScenario(script=KILLED, worker_command=None, delay=0.1), api_key="test-key"
    )
    with server.in_thread():
        journal = tmp_path / ".orchmode" / "journal.db"
        lease = ["--claim-lease", "2"]
        ready = lambda: len(worker_prompts(journal)) >= 14  # noqa: E731 (ten firsts, four more)
        kill_run_when(ready, "go", "--base-url", server.url, *lease, cwd=tmp_path)
        finished = set(worker_prompts(journal))
        assert 14 <= len(finished) < 20
        before = len(server.log)
        result = orchmode("run", "go", "--base-url", server.url, *lease, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        rerun = set(started(server, "worker", since=before))
        assert rerun and not (rerun & finished)
        everything = rerun | finished
        assert len(everything) == 20
        assert sum(p.startswith("Follow up ") for p in everything) == 10
        main = [e.body for e in server.log[before:] if role_of(e.body) == "main"]
        tool_result = main[2]["messages"][-1]["content"][0]["content"]  # scout, call, answer
        assert result_value(tool_result) == {"firsts": 10, "follow": 10}
        assert re.search(r"\[workflow 1\] script done in [\d.]+ s, 20 agents", result.stderr)


class RefusingWorkers(OrchestrationScenario):
    """Workers whose model refuses their subtask."""

    def worker(self, request: ScriptedRequest) -> Reply:
        return Reply([{"type": "text", "text": "I cannot help with that."}], "refusal")


async def test_verify_of_a_refused_agent_says_it_was_refused_and_starts_no_verifier(
    serve: StartServer, tmp_path: Path
) -> None:
    source = 'r = agent("Check area parser")\nverify("Check area parser", r)'
    server = await serve(RefusingWorkers(script=source, worker_command=None, scout_command=None))
    await run_session(server, tmp_path)
    value = result_value(workflow_block(server)["content"])
    assert value == {
        "error": "[orchmode: not verified, because the model refused the subtask: there is "
        "nothing to verify]",
        "status": "not_run",
    }
    assert started(server, "verifier") == []
