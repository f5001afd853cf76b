"""A collection of 157 agent definitions in the shapes Claude Code users keep: every one loads
(some read line by line, with a warning each), and a subtask naming any of them runs as it,
over real HTTP against the scripted server."""

from __future__ import annotations

from pathlib import Path

from agent_collection import SIZE, CollectionFile, collection, sample, write_collection
from conftest import StartServer
from orchmode.core.agents import load_definitions
from orchmode.core.pricing import model_id
from orchmode.core.prompts import SUBAGENT_SYSTEM
from orchmode.testing.scenario import OrchestrationScenario, role_of
from test_agent_roles import first_requests, run_turn, system_text, workflow_description
from test_workflow import workflow_result

LINE_BY_LINE = "so it was read line by line"


def agents_of(work: Path) -> Path:
    return work / ".claude" / "agents"


def expected_model(item: CollectionFile) -> str | None:
    return None if item.model in (None, "inherit") else model_id(item.model)


def test_every_definition_of_the_collection_loads_as_written(tmp_path: Path) -> None:
    files = write_collection(agents_of(tmp_path))
    definitions, warnings = load_definitions(tmp_path, home=tmp_path / "nobody")
    assert len(files) == SIZE == 157
    assert sorted(definitions) == sorted(item.name for item in files)  # 157 loaded, 0 refused
    for item in files:
        definition = definitions[item.name]
        assert definition.description == item.description, item.filename
        assert definition.tools == item.tools, item.filename
        assert definition.model == expected_model(item), item.filename
        assert definition.instructions == item.instructions, item.filename
    forgiven = [warning for warning in warnings if LINE_BY_LINE in warning]
    # warnings come in the order the files are read: sorted by file name
    refused_by_yaml = sorted(
        (item for item in files if item.yaml_refuses), key=lambda item: item.filename
    )
    assert len(forgiven) == len(refused_by_yaml) == 12
    for item, warning in zip(refused_by_yaml, forgiven, strict=True):
        assert warning.startswith(f".claude/agents/{item.filename} line ")
        assert "front matter is not valid YAML: " in warning and "\n" not in warning
    # what the rest say is about WebSearch and WebFetch, which are another part's business
    others = [warning for warning in warnings if LINE_BY_LINE not in warning]
    assert all("WebSearch" in warning or "WebFetch" in warning for warning in others), others
    assert not any("dotnet" in warning or "powershell" in warning for warning in warnings)


def test_the_collection_has_the_shapes_real_ones_have() -> None:
    files = collection()
    shapes = set().union(*(item.shapes for item in files))
    assert {
        "triggers on",
        "indented example",
        "kept block",
        "folded block",
        "dotted name",
    } <= shapes
    assert {"mcp tools", "tools as a yaml list", "byte-order mark", "windows line ends"} <= shapes
    web = [item for item in files if "web tools" in item.shapes]
    assert len(web) == 30 and round(100 * len(web) / len(files)) == 19


async def test_a_subtask_naming_any_shape_of_definition_runs_as_that_role(
    serve: StartServer, work: Path
) -> None:
    files = write_collection(agents_of(work))
    chosen = sample(files)
    assert len(chosen) >= 10
    assert {shape for item in chosen for shape in item.shapes} == set().union(
        *(item.shapes for item in files)
    )
    subtasks = [{"prompt": f"look at it as {item.name}", "agent": item.name} for item in chosen]
    server = await serve(OrchestrationScenario(subtasks=subtasks))
    warnings: list[str] = []
    await run_turn(server, work, warnings)
    assert sum(LINE_BY_LINE in warning for warning in warnings) == 12

    workers = first_requests(server, "worker")
    assert len(workers) == len(chosen)
    for item in chosen:
        body = workers[f"look at it as {item.name}"]
        system = system_text(body)
        assert system.startswith(SUBAGENT_SYSTEM), item.name
        assert f"`{item.name}`" in system and item.instructions in system, item.name
        assert body["model"] == (expected_model(item) or "claude-opus-5-5"), item.name
    assert workflow_result(server).count("[agent ") == len(chosen)
    main = next(e.body for e in server.log if role_of(e.body) == "main")
    listed = workflow_description(main)
    assert all(f"{item.name}: {item.description}" in listed for item in files)
