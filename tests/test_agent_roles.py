"""Agent definitions at work: a subtask that names a role runs with that role's model, prompt
and tools, over real HTTP against the scripted server, through ``open_session`` as a user's
program (and the command line) opens it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchmode
from conftest import API_KEY, StartServer, settings_for
from orchmode.core.pricing import model_id
from orchmode.core.prompts import SUBAGENT_SYSTEM
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from recorded_runs import base_env
from test_mcp import stdio
from test_script import result_value
from test_workflow import workflow_result

REVIEWER = """\
---
name: security-reviewer
description: Looks for injection bugs in database code.
tools: Read, Grep
model: haiku
---
Check every SQL query for injection, and name the line.
"""

SUMMARISER = """\
---
name: summariser
description: Sums up what others found.
tools:
  - mcp__docs__*
effort: low
---
Write three sentences at most.
"""

WRITER = """\
---
name: test-writer
description: Writes a missing test.
tools: Bash, Edit
verify: false
---
Write the test first, then run it.
"""


def define(work: Path, *files: str) -> None:
    """The definitions in the working directory's ``.claude/agents/``."""
    agents = work / ".claude" / "agents"
    agents.mkdir(parents=True, exist_ok=True)
    for text in files:
        name = text.split("name: ", 1)[1].split("\n", 1)[0]
        (agents / f"{name}.md").write_text(text)


async def run_turn(
    server: ScriptedServer, work: Path, warnings: list[str] | None = None, **overrides: Any
) -> None:
    """One orchestrated turn in ``work``, opened as a user's program would."""
    settings = settings_for(server, work, **overrides)
    async with orchmode.open_session(
        settings,
        workdir=work,
        credentials=orchmode.Credentials(api_key=API_KEY),
        on_warning=(warnings if warnings is not None else []).append,
    ) as session:
        await session.turn("review it")


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    if isinstance(system, list):
        return "".join(str(block.get("text", "")) for block in system)
    return str(system)


def first_requests(server: ScriptedServer, role: str) -> dict[str, dict[str, Any]]:
    """The first request of each agent of ``role``, by its prompt."""
    return {
        e.body["messages"][0]["content"]: e.body
        for e in server.log
        if role_of(e.body) == role and len(e.body["messages"]) == 1
    }


def tool_names(body: dict[str, Any]) -> set[str]:
    return {str(t["name"]) for t in body["tools"]}


def workflow_description(body: dict[str, Any]) -> str:
    return next(str(t["description"]) for t in body["tools"] if t["name"] == "Workflow")


async def test_workers_naming_a_role_run_with_its_model_prompt_and_tools(
    serve: StartServer, work: Path
) -> None:
    define(work, REVIEWER, SUMMARISER)
    server = await serve(
        OrchestrationScenario(
            subtasks=[
                "look over the code",
                {"prompt": "review the queries", "agent": "security-reviewer"},
                {"prompt": "sum it up", "agent": "summariser"},
            ]
        )
    )
    await run_turn(server, work)
    workers = first_requests(server, "worker")
    assert set(workers) == {"look over the code", "review the queries", "sum it up"}

    plain = workers["look over the code"]
    assert plain["model"] == "claude-opus-5-5"
    assert system_text(plain) == SUBAGENT_SYSTEM
    # a plain worker may fan out once more (max_depth 2); a role must list Workflow to
    assert tool_names(plain) == {"Workflow", "bash", "report_findings"}

    reviewer = workers["review the queries"]
    assert reviewer["model"] == model_id("haiku") != "claude-opus-5-5"
    assert system_text(reviewer).startswith(SUBAGENT_SYSTEM)  # added to, never replaced
    assert "`security-reviewer`" in system_text(reviewer)
    assert "Check every SQL query for injection, and name the line." in system_text(reviewer)
    assert tool_names(reviewer) == {"bash", "report_findings"}  # Read, Grep: bash that reads

    summariser = workers["sum it up"]
    assert summariser["model"] == "claude-opus-5-5"  # no model key: the worker's own
    assert summariser["output_config"]["effort"] == "low"
    assert "Write three sentences at most." in system_text(summariser)
    assert tool_names(summariser) == {"report_findings"}  # no bash among its tools

    # verifiers are not in the role: their own model, orchmode's prompt
    for body in first_requests(server, "verifier").values():
        assert body["model"] == "claude-opus-5-5"
        assert system_text(body) == SUBAGENT_SYSTEM
    # the main agent's Workflow tool lists the roles, the same in every request
    mains = [e.body for e in server.log if role_of(e.body) == "main"]
    descriptions = {workflow_description(body) for body in mains}
    assert len(descriptions) == 1 and len(mains) >= 3
    (description,) = descriptions
    assert "security-reviewer: Looks for injection bugs in database code." in description
    assert "summariser: Sums up what others found." in description
    assert workflow_result(server).count("[agent ") == 3  # each subtask's result came back


async def test_a_role_whose_bash_only_reads_cannot_write_the_tree(
    serve: StartServer, work: Path
) -> None:
    define(work, REVIEWER)

    def write(subtask: str) -> str:
        name = "reviewer" if "queries" in subtask else "plain"
        return f"echo written > {name}.txt; echo exit=$?"

    for isolation in ("shared", "worktree"):
        server = await serve(
            OrchestrationScenario(
                subtasks=[
                    f"look over the code ({isolation})",
                    {"prompt": f"review the queries ({isolation})", "agent": "security-reviewer"},
                ],
                worker_command=write,
                workflow_input={"isolation": isolation},
            )
        )
        await run_turn(server, work)
        assert (work / "plain.txt").read_text() == "written\n"  # a plain worker writes
        assert not (work / "reviewer.txt").exists()
        seen = [
            e.body["messages"][-1]["content"][0]["content"]
            for e in server.log
            if role_of(e.body) == "worker"
            and e.body["messages"][0]["content"].startswith("review the queries")
            and len(e.body["messages"]) == 3
        ]
        assert seen and "exit=1" in str(seen[0]), seen
        (work / "plain.txt").unlink()


async def test_a_role_with_verify_false_gets_no_verifier(serve: StartServer, work: Path) -> None:
    define(work, WRITER)
    server = await serve(
        OrchestrationScenario(
            subtasks=["look over the code", {"prompt": "add a test", "agent": "test-writer"}],
            workflow_input={"isolation": "shared"},
        )
    )
    await run_turn(server, work)
    verified = [first_user(e.body) for e in server.log if role_of(e.body) == "verifier"]
    assert verified and all("look over the code" in prompt for prompt in verified)
    assert not any("add a test" in prompt for prompt in verified)
    assert set(first_requests(server, "worker")) == {"look over the code", "add a test"}


def first_user(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


async def test_an_unknown_agent_name_lists_the_known_ones_and_runs_nothing(
    serve: StartServer, work: Path
) -> None:
    define(work, REVIEWER, WRITER)
    server = await serve(
        OrchestrationScenario(subtasks=["fine", {"prompt": "x", "agent": "reviewer"}])
    )
    await run_turn(server, work)
    result = workflow_result(server)
    assert result.startswith('error: subtask 2: unknown agent "reviewer"')
    assert "known agents: security-reviewer, test-writer" in result
    assert {role_of(e.body) for e in server.log} == {"main"}


async def test_a_malformed_definition_is_one_warning_and_the_others_still_load(
    serve: StartServer, work: Path
) -> None:
    define(work, REVIEWER)
    broken = work / ".claude" / "agents" / "broken.md"
    broken.write_text("---\nname: broken\ndescription: [never closed\n---\nBody.\n")
    server = await serve(
        OrchestrationScenario(subtasks=[{"prompt": "review", "agent": "security-reviewer"}])
    )
    warnings: list[str] = []
    await run_turn(server, work, warnings)
    assert len(warnings) == 1
    assert warnings[0].startswith(".claude/agents/broken.md line 3: front matter is not valid")
    assert first_requests(server, "worker")["review"]["model"] == model_id("haiku")
    main = next(e.body for e in server.log if role_of(e.body) == "main")
    assert "broken" not in workflow_description(main)


def test_the_command_line_prints_a_bad_definitions_warning(scripted: Any, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    agents = tmp_path / "home" / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "odd.md").write_text("---\nname: Odd One\ndescription: x\n---\n")
    server = scripted(OrchestrationScenario(subtasks=1))
    run = subprocess.run(
        [sys.executable, "-m", "orchmode", "run", "go", "--base-url", server.url],
        cwd=tmp_path / "work",
        env=base_env(HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "orchmode: warning: ~/.claude/agents/odd.md line 2: name 'Odd One'" in run.stderr


async def test_a_changed_definition_misses_the_journal_and_an_unchanged_one_hits(
    serve: StartServer, work: Path
) -> None:
    define(work, REVIEWER)
    subtasks = [{"prompt": "review the queries", "agent": "security-reviewer"}]
    runs = []
    for body in ("same", "same", "changed"):
        if body == "changed":
            define(work, REVIEWER.replace("name the line", "name the file and the line"))
        server = await serve(OrchestrationScenario(subtasks=subtasks))
        await run_turn(server, work)
        runs.append(len(first_requests(server, "worker")))
    assert runs == [1, 0, 1]


async def test_a_script_runs_an_agent_in_a_role_and_verify_honours_verify_false(
    serve: StartServer, work: Path
) -> None:
    define(work, REVIEWER, WRITER)
    script = """
found = agent("review the queries", agent="security-reviewer")
tests = parallel([{"prompt": "add a test", "agent": "test-writer"}, "look around"])
checked = verify("add a test", tests[0])
{"summary": found["summary"], "checked": checked["status"], "why": checked["error"]}
"""
    server = await serve(
        OrchestrationScenario(
            script=script, scout_command=None, workflow_input={"isolation": "shared"}
        )
    )
    await run_turn(server, work)
    value = result_value(workflow_result(server))
    assert value["summary"] == "Finished: review the queries"
    assert value["checked"] == "not_run"
    assert "'test-writer'" in value["why"] and "verify: false" in value["why"]
    workers = first_requests(server, "worker")
    assert workers["review the queries"]["model"] == model_id("haiku")
    assert "Write the test first, then run it." in system_text(workers["add a test"])
    assert system_text(workers["look around"]) == SUBAGENT_SYSTEM
    assert not [e for e in server.log if role_of(e.body) == "verifier"]


async def test_a_cost_cap_needs_a_price_for_a_roles_model(serve: StartServer, work: Path) -> None:
    define(work, REVIEWER.replace("model: haiku", "model: claude-nobody-1"))
    server = await serve(OrchestrationScenario())
    with pytest.raises(orchmode.ConfigError, match="claude-nobody-1, the model of agent"):
        await run_turn(server, work, max_cost=5.0)
    assert server.log == []


CAREFUL = """\
---
name: careful-writer
description: Changes code in a copy of its own.
isolation: worktree
---
Change as little as you can.
"""


async def test_a_roles_isolation_wins_over_the_calls(serve: StartServer, work: Path) -> None:
    define(work, CAREFUL)

    def write(subtask: str) -> str:
        return f"echo done > {'careful' if 'carefully' in subtask else 'plain'}.txt"

    server = await serve(
        OrchestrationScenario(
            subtasks=["change it", {"prompt": "change it carefully", "agent": "careful-writer"}],
            worker_command=write,
            workflow_input={"isolation": "shared"},
        )
    )
    await run_turn(server, work)
    result = workflow_result(server)
    assert "[change 2] merged" in result  # in a copy, its change merged once confirmed
    assert "[change 1]" not in result  # in the working directory itself
    assert (work / "plain.txt").read_text() == (work / "careful.txt").read_text() == "done\n"


NO_MCP = """\
---
name: shell-only
description: Works with bash alone.
tools: Bash
---
Use the shell.
"""

DOCS_ONLY = """\
---
name: docs-reader
description: Looks things up.
tools: mcp__demo__lookup
---
Look it up.
"""


async def test_a_role_gets_the_mcp_tools_its_definition_names_and_no_others(
    serve: StartServer, work: Path
) -> None:
    define(work, NO_MCP, DOCS_ONLY)
    config = work / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"demo": stdio()}}))
    server = await serve(
        OrchestrationScenario(
            subtasks=[
                {"prompt": "shell work", "agent": "shell-only"},
                {"prompt": "docs work", "agent": "docs-reader"},
            ],
            worker_call=lambda subtask: ("mcp__demo__lookup", {"key": subtask}),
            workflow_input={"isolation": "shared"},
        )
    )
    await run_turn(server, work, mcp_config=config)
    workers = first_requests(server, "worker")
    assert tool_names(workers["shell work"]) == {"bash", "report_findings"}
    assert tool_names(workers["docs work"]) == {"report_findings", "mcp__demo__lookup"}
    answers = {
        e.body["messages"][0]["content"]: str(e.body["messages"][2]["content"][0]["content"])
        for e in server.log
        if role_of(e.body) == "worker" and len(e.body["messages"]) == 3
    }
    # the call a role was not given is refused before it reaches the server
    assert answers["shell work"].startswith("error: the role 'shell-only' is not given")
    assert "docs work" in answers["docs work"] and "error" not in answers["docs work"]
