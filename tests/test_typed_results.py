"""Typed results end to end: object subtasks with a schema, over real HTTP to the scripted server.

The scripted worker fills ``data`` from the schema it is offered in report_findings, so
these tests see what a model would be given and what orchmode makes of its answer.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.agents import load_definitions
from orchmode.core.events import EventBus, SubagentDone
from orchmode.executors import Job
from orchmode.fanout.plans import Plan, plan_subtasks
from orchmode.model.context import estimate_tokens
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of, schema_instance
from test_result_schemas import SCORES
from test_script import result_value, workflow_block

COUNT = {
    "type": "object",
    "properties": {"count": {"type": "integer", "minimum": 0}, "file": {"type": "string"}},
    "required": ["count", "file"],
    "additionalProperties": False,
}


def requests_of(server: ScriptedServer, role: str) -> list[dict[str, Any]]:
    return [e.body for e in server.log if role_of(e.body) == role]


def started(server: ScriptedServer, role: str) -> list[str]:
    return [
        str(b["messages"][0]["content"])
        for b in requests_of(server, role)
        if len(b["messages"]) == 1
    ]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        b
        for m in body["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]


def typed(prompt: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"prompt": prompt} if schema is None else {"prompt": prompt, "schema": schema}


async def run_session(
    server: ScriptedServer, tmp_path: Path, events: EventBus | None = None, **overrides: Any
) -> str:
    settings = settings_for(server, tmp_path, **overrides)
    session = await conversation_for(settings, events=events, store=store_for(tmp_path))
    try:
        return (await session.turn("review it")).text
    finally:
        await session.close()


def counting(subtask: str, _schema: dict[str, Any]) -> dict[str, Any]:
    """A worker's data: the number its subtask ends with."""
    return {"count": int(subtask.rsplit(" ", 1)[-1]), "file": "src/app.py"}


# ------------------------------------------------------------------------ the flat form


async def test_a_typed_subtask_offers_the_schema_and_its_result_shows_the_data(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=[typed("Count TODOs 4", COUNT)], worker_command=None, worker_data=counting
    )
    server = await serve(scenario)
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    await run_session(server, tmp_path, events)
    worker = requests_of(server, "worker")[0]
    tool = next(t for t in worker["tools"] if t["name"] == "report_findings")
    assert tool["input_schema"]["properties"]["data"] == COUNT
    assert "data" in tool["input_schema"]["required"]
    result = workflow_block(server)["content"]
    assert '"data": {"count": 4, "file": "src/app.py"}' in result
    # The verifier is shown the data and the schema it had to follow.
    verify = started(server, "verifier")[0]
    assert '"count": 4' in verify and json.dumps(COUNT, sort_keys=True) in verify
    # The agent's report file holds the data.
    done = next(e for e in seen if isinstance(e, SubagentDone) and e.role == "worker")
    record = json.loads(Path(done.report_path).read_text())
    assert record["report"]["data"] == {"count": 4, "file": "src/app.py"}


async def test_an_invalid_report_is_sent_back_and_the_second_is_taken(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=[typed("Count TODOs 2", COUNT)], worker_command=None, invalid_reports=1
    )
    server = await serve(scenario)
    await run_session(server, tmp_path)
    last = requests_of(server, "worker")[-1]
    errors = [b for b in tool_results(last) if b.get("is_error")]
    assert len(errors) == 1
    assert "data: 'not what was asked' is not of type 'object'" in errors[0]["content"]
    assert "2 attempts left" in errors[0]["content"]
    result = workflow_block(server)["content"]
    assert '"data": {"count": 0, "file": "x"}' in result
    assert "[verify 1]" in result and "confirmed" in result


async def test_three_invalid_reports_fail_the_subtask_with_a_clear_error(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=[typed("Count TODOs 2", COUNT), "Check item 1"],
        worker_command=None,
        invalid_reports=3,
    )
    server = await serve(scenario)
    await run_session(server, tmp_path)
    result = workflow_block(server)["content"]
    assert "the subagent's report was still invalid after 3 attempts" in result
    assert "data: 'not what was asked' is not of type 'object'" in result
    assert "not verified, because the agent failed" in result
    # The untyped subtask beside it is untouched by the limit.
    assert "Finished: Check item 1" in result
    typed_worker = [b for b in requests_of(server, "worker") if "TODOs" in str(b["messages"][0])]
    assert len(typed_worker) == 3  # no fourth request after the last attempt


async def test_a_schema_the_validator_rejects_is_an_error_and_nothing_runs(
    serve: StartServer, tmp_path: Path
) -> None:
    bad = {"type": "object", "properties": {"n": {"type": "integr"}}}
    scenario = OrchestrationScenario(subtasks=["Check item 1", typed("Count", bad)])
    server = await serve(scenario)
    await run_session(server, tmp_path)
    block = workflow_block(server)
    assert block.get("is_error") is True
    assert block["content"].startswith('error: subtask 2: "schema" is not usable')
    assert "/properties/n/type" in block["content"]
    assert {role_of(e.body) for e in server.log} == {"main"}


async def test_bad_object_subtasks_are_errors_naming_the_subtask(
    serve: StartServer, tmp_path: Path
) -> None:
    for item, words in [
        ({"prompt": "x", "schemas": {}}, 'unknown key "schemas"'),
        ({"prompt": "  "}, '"prompt" is empty'),
        ({"prompt": 3}, '"prompt" is a int, not a string'),
        ({"schema": COUNT}, '"prompt" is missing'),
        ({"prompt": "x", "schema": []}, "the schema must be a JSON object"),
        ({"prompt": "x", "agent": "security-reviewer"}, "this session has no agent definitions"),
        ({"prompt": "x", "agent": {"type": "object"}}, '"agent" is a dict, not a string'),
    ]:
        plan = plan_subtasks({"subtasks": ["fine", item]}, 10)
        assert isinstance(plan, str) and plan.startswith("error: subtask 2: "), plan
        assert words in plan and plan.endswith("nothing was run")
    # Through a session too: nothing runs.
    scenario = OrchestrationScenario(subtasks=[{"prompt": "x", "agent": "security-reviewer"}])
    server = await serve(scenario)
    await run_session(server, tmp_path)
    assert "this session has no agent definitions" in workflow_block(server)["content"]
    assert {role_of(e.body) for e in server.log} == {"main"}


def test_object_subtasks_without_a_schema_plan_as_strings() -> None:
    plain = plan_subtasks({"subtasks": ["a", "b"]}, 10)
    mixed = plan_subtasks({"subtasks": [{"prompt": " a "}, "b", None]}, 10)
    assert isinstance(plain, Plan) and isinstance(mixed, Plan)
    assert mixed.subtasks == plain.subtasks == ["a", "b"]
    assert [mixed.schema_of(i) for i in range(2)] == [None, None]
    capped = plan_subtasks({"subtasks": [typed(f"t{i}", COUNT) for i in range(5)]}, 3)
    assert isinstance(capped, Plan) and capped.not_run == 2 and capped.schema_of(2) == COUNT


async def test_object_subtasks_without_a_schema_hit_the_string_forms_journal(
    serve: StartServer, tmp_path: Path
) -> None:
    first = await serve(OrchestrationScenario(subtasks=["Check item 1", "Check item 2"]))
    await run_session(first, tmp_path)
    assert len(started(first, "worker")) == 2
    again = await serve(
        OrchestrationScenario(subtasks=[{"prompt": "Check item 1"}, {"prompt": "Check item 2"}])
    )
    await run_session(again, tmp_path)
    assert started(again, "worker") == [] and started(again, "verifier") == []
    # The same result; only the last line, the session's budget status, differs.
    assert (
        workflow_block(again)["content"].rsplit("\n\n", 1)[0]
        == workflow_block(first)["content"].rsplit("\n\n", 1)[0]
    )


async def test_a_changed_schema_misses_the_journal(serve: StartServer, tmp_path: Path) -> None:
    first = await serve(
        OrchestrationScenario(subtasks=[typed("Count TODOs 1", COUNT)], worker_command=None)
    )
    await run_session(first, tmp_path)
    same = await serve(
        OrchestrationScenario(subtasks=[typed("Count TODOs 1", COUNT)], worker_command=None)
    )
    await run_session(same, tmp_path)
    assert started(same, "worker") == []  # the same definition is served from the journal
    changed = {**COUNT, "properties": {**COUNT["properties"], "line": {"type": "integer"}}}
    other = await serve(
        OrchestrationScenario(subtasks=[typed("Count TODOs 1", changed)], worker_command=None)
    )
    await run_session(other, tmp_path)
    assert started(other, "worker") == ["Count TODOs 1"]
    assert '"line": 0' in workflow_block(other)["content"]
    # ...and so does the same prompt without a schema.
    untyped = await serve(OrchestrationScenario(subtasks=["Count TODOs 1"], worker_command=None))
    await run_session(untyped, tmp_path)
    assert started(untyped, "worker") == ["Count TODOs 1"]


async def test_condensed_results_keep_the_data_whole(serve: StartServer, tmp_path: Path) -> None:
    scenario = OrchestrationScenario(
        subtasks=[typed(f"Count TODOs {i}", COUNT) for i in range(1, 5)],
        worker_command=None,
        worker_data=counting,
        report_bytes=6000,
    )
    server = await serve(scenario)
    await run_session(server, tmp_path, workflow_result_tokens=3000)
    result = workflow_block(server)["content"]
    assert "condensed to fit" in result
    for i in range(1, 5):
        assert f'data: {{"count": {i}, "file": "src/app.py"}}' in result


def listing(count: int) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """A worker's data: ``count`` places, each of them about 60 bytes of JSON."""

    def data(subtask: str, _schema: dict[str, Any]) -> dict[str, Any]:
        tag = subtask.rsplit(" ", 1)[-1]
        places = [{"name": f"src/module_{tag}/file_{n:04}.py", "score": n} for n in range(count)]
        return {"items": places}

    return data


async def test_several_kilobytes_of_data_are_kept_whole_when_they_fit(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=[typed(f"List places {i}", SCORES) for i in range(1, 4)],
        worker_command=None,
        worker_data=listing(80),  # about 4.5 KB of data each
        report_bytes=8000,
    )
    server = await serve(scenario)
    await run_session(server, tmp_path, workflow_result_tokens=8000)
    result = workflow_block(server)["content"]
    assert "condensed to fit" in result  # the findings gave way...
    for i in range(1, 4):  # ...and every agent's data is there, whole
        whole = json.dumps(listing(80)(f"x {i}", SCORES), ensure_ascii=False, sort_keys=True)
        assert len(whole) > 4000 and f"data: {whole}" in result


async def test_data_larger_than_the_budget_is_cut_and_named_where_it_is_whole(
    serve: StartServer, tmp_path: Path
) -> None:
    scenario = OrchestrationScenario(
        subtasks=[typed(f"List places {i}", SCORES) for i in range(1, 5)],
        worker_command=None,
        worker_data=listing(400),  # about 23 KB of data each, 4 agents, a budget of 3,000
        report_bytes=2000,
    )
    server = await serve(scenario)
    await run_session(server, tmp_path, workflow_result_tokens=3000)
    result = workflow_block(server)["content"]
    budget = int(re.findall(r"its budget of ([\d,]+) tokens", result)[0].replace(",", ""))
    assert estimate_tokens(result) <= budget * 1.05, (estimate_tokens(result), budget)
    cuts = re.findall(r"data cut after [\d,]+ of ([\d,]+) characters to fit the budget; "
                      r"the whole of it is in (\S+\.json)\]", result)  # fmt: skip
    assert len(cuts) == 4
    for size, name in cuts:
        saved = json.loads(next(tmp_path.glob(f".orchmode/results/*/{name}")).read_text())
        data = saved["report"]["data"]
        assert len(data["items"]) == 400
        assert len(json.dumps(data, ensure_ascii=False, sort_keys=True)) == int(
            size.replace(",", "")
        )


# ------------------------------------------------------------------------------ scripts

SUM_SCRIPT = """
schema = {"type": "object", "properties": {"count": {"type": "integer"},
          "file": {"type": "string"}}, "required": ["count", "file"]}
found = parallel(["Count TODOs 2", {"prompt": "Count TODOs 5"}], schema=schema)
one = agent("Count TODOs 7", schema=schema)
plain = agent("Check item 1")
{"total": sum(r["data"]["count"] for r in found) + one["data"]["count"],
 "plain_has_data": "data" in plain}
"""


async def test_a_script_sums_its_agents_typed_data(serve: StartServer, tmp_path: Path) -> None:
    scenario = OrchestrationScenario(
        script=SUM_SCRIPT, scout_command=None, worker_command=None, worker_data=counting
    )
    server = await serve(scenario)
    await run_session(server, tmp_path)
    block = workflow_block(server)
    assert not block.get("is_error"), block["content"]
    value = result_value(block["content"])
    assert value == {"total": 14, "plain_has_data": False}


async def test_a_scripts_verify_shows_the_verifier_a_shared_workers_schema(
    serve: StartServer, tmp_path: Path
) -> None:
    script = """
schema = {"type": "object", "properties": {"count": {"type": "integer"},
          "file": {"type": "string"}}, "required": ["count", "file"]}
found = agent("Count TODOs 3", schema=schema)
plain = agent("Check item 1")
[verify("Count TODOs 3", found)["verdict"], verify("Check item 1", plain)["verdict"]]
"""
    scenario = OrchestrationScenario(
        script=script,
        scout_command=None,
        worker_command=None,
        worker_data=counting,
        workflow_input={"isolation": "shared"},
    )
    server = await serve(scenario)
    await run_session(server, tmp_path)
    assert result_value(workflow_block(server)["content"]) == ["confirmed", "confirmed"]
    typed_check, plain_check = started(server, "verifier")
    assert '"count": 3' in typed_check and "had to follow this JSON Schema" in typed_check
    assert "JSON Schema" not in plain_check


async def test_a_script_given_a_bad_schema_gets_an_exception_and_runs_nothing(
    serve: StartServer, tmp_path: Path
) -> None:
    server, value = await script_raising(serve, tmp_path, 'agent("Count", schema={"type": 7})')
    assert value.startswith('agent(): "schema" is not usable: the schema is invalid at')
    assert {role_of(e.body) for e in server.log} == {"main"}


async def script_raising(
    serve: StartServer, tmp_path: Path, call: str
) -> tuple[ScriptedServer, str]:
    """A script that makes ``call`` and returns the ValueError it raised (or "ran")."""
    script = f"try:\n    {call}\n    got = 'ran'\nexcept ValueError as e:\n    got = str(e)\ngot\n"
    server = await serve(OrchestrationScenario(script=script, scout_command=None))
    await run_session(server, tmp_path)
    return server, result_value(workflow_block(server)["content"])


def test_the_scripted_model_makes_instances_of_simple_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["bug", "style"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "score": {"type": "number", "minimum": 3},
            "ok": {"type": "boolean"},
            "ref": {"$ref": "#/$defs/n"},
        },
        "$defs": {"n": {"type": "integer"}},
    }
    assert schema_instance(schema) == {
        "kind": "bug",
        "tags": ["x", "x"],
        "score": 3,
        "ok": True,
        "ref": 0,
    }


async def test_a_script_naming_an_agent_is_told_none_are_loaded(
    serve: StartServer, tmp_path: Path
) -> None:
    call = 'parallel(["a", {"prompt": "b", "agent": "security-reviewer"}])'
    server, value = await script_raising(serve, tmp_path, call)
    assert value.startswith('parallel() prompt 2: unknown agent "security-reviewer"')
    assert value.endswith('leave out "agent"')
    assert {role_of(e.body) for e in server.log} == {"main"}


def test_a_typed_job_in_a_role_is_plain_data_that_pickles(tmp_path: Path) -> None:
    (tmp_path / "reviewer.md").write_text(
        "---\nname: reviewer\ndescription: Reviews.\ntools: Read, mcp__gh__*\nmodel: haiku\n"
        "---\nBe strict.\n"
    )
    roles, warnings = load_definitions(tmp_path, home=tmp_path, extra=Path("."))
    assert warnings == []
    job = Job(
        "key", "holder", "session", "worker", "worker 1.1", "Count", schema=COUNT,
        agent=roles["reviewer"],
    )  # fmt: skip
    copy = pickle.loads(pickle.dumps(job))  # as a Ray node receives it
    assert copy == job and copy.agent is not None
    assert (copy.agent.shell, copy.agent.digest) == ("read", roles["reviewer"].digest)
