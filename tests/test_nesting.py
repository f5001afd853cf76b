"""Workers that fan out again, over real HTTP: a tree completes, verified at every level,
without deadlock on ``max_concurrent``, and stops at ``max_depth`` with a clear answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nested_runs import IN_COPIES, journal_rows, leaf_file, tree_scenario, tree_size, written_ledger
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import role_of
from recorded_runs import orchmode


def run_tree(
    scripted: Callable[..., ScriptedServer],
    tmp_path: Path,
    top: int,
    shape: str,
    *flags: str,
    **scenario: Any,
) -> ScriptedServer:
    server = scripted(tree_scenario(top, shape, **scenario))
    result = orchmode("run", "review this", "--base-url", server.url, *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return server


def leaves(tmp_path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in tmp_path.glob("leaf-*")}


@pytest.mark.slow
def test_a_tree_three_deep_of_five_per_level_completes_verified_at_every_level(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    run_tree(scripted, tmp_path, 5, "5x5", "--max-depth", "3")
    journal = tmp_path / ".orchmode" / "journal.db"
    workers = journal_rows(journal, "worker")
    assert len(workers) == len(set(workers)) == tree_size(5, "5x5") == 155
    assert len(journal_rows(journal, "verifier")) == 155  # each level verified its own
    written = leaves(tmp_path)
    assert len(written) == 125 and set(written.values()) == {"written\n"}
    expected = {leaf_file(p) for p in workers if "fan out" not in p}
    assert set(written) == expected


@pytest.mark.slow
def test_a_tree_on_two_slots_does_not_deadlock(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """Every parent waits parked: its slot goes to its children, so two slots carry 39."""
    run_tree(scripted, tmp_path, 3, "3x3", "--max-depth", "3", "--max-concurrent", "2")
    assert len(journal_rows(tmp_path / ".orchmode" / "journal.db", "worker")) == 39
    assert len(leaves(tmp_path)) == 27


def refusals(body: dict[str, Any]) -> list[str]:
    """The error results a request's conversation carries."""
    return [
        block["content"]
        for message in body["messages"][1:]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("is_error")
    ]


def tool_names(body: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in body["tools"]]


def test_a_worker_past_max_depth_is_told_so_and_does_the_work_itself(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(tree_scenario(2, "2x2", fan_out_regardless=True))
    result = orchmode("run", "review this", "--base-url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    workers = [e.body for e in server.log if role_of(e.body) == "worker"]
    deep = [b for b in workers if "Workflow" not in tool_names(b)]
    refused = [text for body in deep for text in refusals(body)]
    assert len(refused) == 4  # the second level's four workers, each once
    assert all("max_depth" in text and "2 levels deep" in text for text in refused)
    assert len(journal_rows(tmp_path / ".orchmode" / "journal.db", "worker")) == 2 + 4


def test_max_depth_one_offers_workers_what_it_always_did(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(tree_scenario(2, "2", fan_out_regardless=True))
    flags = ("--max-depth", "1")
    result = orchmode("run", "review this", "--base-url", server.url, *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    subagents = [e.body for e in server.log if role_of(e.body) != "main"]
    assert {tuple(tool_names(b)) for b in subagents} == {("bash", "report_findings")}
    refused = [text for body in subagents for text in refusals(body)]
    assert len(refused) == 2
    assert all("no tool named 'Workflow'" in t and "1 level deep" in t for t in refused)
    assert "[workflow 2]" not in result.stderr


def test_the_same_subtask_under_two_parents_is_two_results(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    def same_children(subtask: str) -> tuple[str, dict[str, Any]] | None:
        if "fan out" not in subtask:
            return None
        return "Workflow", {"subtasks": ["The same leaf"], "isolation": "shared"}

    server = scripted(tree_scenario(2, "1", worker_call=same_children))
    result = orchmode("run", "review this", "--base-url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    asked = [
        e.body for e in server.log if role_of(e.body) == "worker" and len(e.body["messages"]) == 1
    ]
    assert sum(1 for b in asked if b["messages"][0]["content"] == "The same leaf") == 2
    workers = journal_rows(tmp_path / ".orchmode" / "journal.db", "worker")
    assert workers.count("The same leaf") == 2


def test_a_worker_may_fan_out_with_a_script_whose_agents_are_its_children(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    source = 'results = parallel(["Leaf A of " + "x", "Leaf B of x"])\nlen(results)'

    def script_call(subtask: str) -> tuple[str, dict[str, Any]] | None:
        if "fan out" not in subtask:
            return None
        return "Workflow", {"script": source, "isolation": "shared"}

    server = scripted(tree_scenario(1, "1", worker_call=script_call))
    result = orchmode("run", "review this", "--base-url", server.url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    workers = journal_rows(tmp_path / ".orchmode" / "journal.db", "worker")
    assert sorted(workers) == ["Leaf A of x", "Leaf B of x", "Part 1: fan out into 1"]
    # the script's call is drawn under the worker that ran it
    assert "[worker 1.1 › workflow 2] running a script of 2 lines" in result.stderr
    planner = [
        e.body
        for e in server.log
        if role_of(e.body) == "worker"
        and e.body["messages"][0]["content"] == "Part 1: fan out into 1"
        and len(e.body["messages"]) == 3
    ]
    (answer,) = [block["content"] for block in planner[0]["messages"][2]["content"]]
    assert answer.startswith("2")  # the script's value: its two children's results


def nested_results(server: ScriptedServer) -> list[str]:
    """The Workflow results given to workers (not to the main agent)."""
    return [
        block["content"]
        for e in server.log
        if role_of(e.body) == "worker"
        for message in e.body["messages"][1:]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result" and "[change " in str(block.get("content"))
    ]


@pytest.mark.slow
def test_in_copies_each_leaf_reaches_the_working_directory_once_through_its_parents(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    """A child's change is merged into its parent's workspace, where the parent's verifier
    judges it with the parent's; only the top level writes the working directory."""
    server = run_tree(scripted, tmp_path, 3, "3x3", "--max-depth", "3", **IN_COPIES)
    written = leaves(tmp_path)
    assert len(written) == 27 and set(written.values()) == {"written\n"}
    journal = tmp_path / ".orchmode" / "journal.db"
    assert sorted(written_ledger(journal)) == [f"change {i} of call 1 written" for i in (1, 2, 3)]
    # 3 parents at depth 1 and 9 at depth 2 were each told their 3 children's were merged
    told = nested_results(server)
    assert len(told) == 12
    assert all(text.count("merged: ") == 3 for text in told), told
    # the verifier of worker 1.2 (at depth 2) was shown its three leaves in its change
    verifying = [
        e.body["messages"][0]["content"]
        for e in server.log
        if role_of(e.body) == "verifier" and len(e.body["messages"]) == 1
    ]
    (check,) = [p for p in verifying if "Part 1.2 (plan" in p and "fan out into 3" in p]
    assert all(f"leaf-1.2.{i}" in check for i in (1, 2, 3))
