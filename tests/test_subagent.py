"""The subagent loop, for every way a response can end, through the real SDK and a strict server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import StartServer, gateway_for, settings_for
from orchmode.core.events import EventBus
from orchmode.core.prompts import SUBAGENT_SYSTEM, SUBAGENT_TOOLS
from orchmode.core.results import Status
from orchmode.executors.subagent import Subagent
from orchmode.shell.bash import BashSession
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import report

FINDING = {"claim": "c", "evidence": "e", "severity": "low"}


def scripted(*replies: Reply) -> Any:
    """Answer the n-th request with the n-th reply."""

    def respond(request: ScriptedRequest) -> Reply:
        return replies[request.index]

    return respond


async def run(server: ScriptedServer, tmp_path: Path, max_turns: int = 5) -> Any:
    settings = settings_for(server, tmp_path)
    gateway = gateway_for(settings)
    async with BashSession(tmp_path) as shell:
        agent = Subagent(
            gateway, shell, EventBus(), "worker 1.1", SUBAGENT_SYSTEM, SUBAGENT_TOOLS, max_turns
        )
        result = await agent.run("Count the files.")
    await gateway.close()
    return result


async def test_bash_then_report_returns_the_report_as_json(
    serve: StartServer, tmp_path: Path
) -> None:
    (tmp_path / "a.txt").write_text("x")
    server = await serve(
        scripted(Reply.tool_use("bash", {"command": "ls"}), report("one file", [FINDING]))
    )
    result = await run(server, tmp_path)
    assert result.status is Status.FINISHED and result.turns == 2
    assert json.loads(result.text) == {"summary": "one file", "findings": [FINDING]}
    second = server.log[1].body["messages"]
    assert second[-1]["content"][0]["content"] == "a.txt"
    assert server.log[0].body["output_config"] == {"effort": "xhigh"}
    assert server.log[0].body["cache_control"] == {"type": "ephemeral"}


async def test_pause_turn_continues_with_the_paused_content(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(
        scripted(Reply.text("thinking aloud", stop_reason="pause_turn"), report("done", []))
    )
    result = await run(server, tmp_path)
    assert result.status is Status.FINISHED
    assert server.log[1].body["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "thinking aloud"}],
    }


async def test_an_empty_paused_reply_is_not_sent_back(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(scripted(Reply([], stop_reason="pause_turn"), report("done", [])))
    result = await run(server, tmp_path)
    assert result.status is Status.FINISHED
    assert [e.status for e in server.log] == [200, 200]


async def test_max_tokens_returns_the_text_with_a_warning(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(scripted(Reply.text("half an ans", stop_reason="max_tokens")))
    result = await run(server, tmp_path)
    assert result.status is Status.MAX_TOKENS
    assert result.text.startswith("half an ans") and "max_tokens" in result.text


async def test_refusal_and_context_overflow_are_not_finished(
    serve: StartServer, tmp_path: Path
) -> None:
    for stop, status in [
        ("refusal", Status.REFUSAL),
        ("model_context_window_exceeded", Status.CONTEXT_EXCEEDED),
    ]:
        server = await serve(scripted(Reply.text("no", stop_reason=stop)))
        result = await run(server, tmp_path)
        assert result.status is status and not result.finished
        assert stop in result.text


async def test_an_empty_reply_is_an_unfinished_result(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(scripted(Reply([])))
    result = await run(server, tmp_path)
    assert result.status is Status.EMPTY and "without a report" in result.text


async def test_plain_text_end_turn_is_the_result(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(scripted(Reply.text("all good")))
    result = await run(server, tmp_path)
    assert (result.status, result.text) == (Status.FINISHED, "all good")


async def test_the_turn_limit_is_reported(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(lambda r: Reply.tool_use("bash", {"command": "echo again"}))
    result = await run(server, tmp_path, max_turns=3)
    assert result.status is Status.TURN_LIMIT and "3 model turns" in result.text
    assert len(server.log) == 3


async def test_a_malformed_report_gets_an_error_result_and_a_second_chance(
    serve: StartServer, tmp_path: Path
) -> None:
    bad = Reply.tool_use("report_findings", {"summary": "s", "findings": [{"claim": "c"}]})
    server = await serve(scripted(bad, report("fixed", [FINDING])))
    result = await run(server, tmp_path)
    assert result.status is Status.FINISHED and json.loads(result.text)["summary"] == "fixed"
    error = server.log[1].body["messages"][-1]["content"][0]
    assert error["is_error"] is True and "findings.0.evidence" in error["content"]


async def test_an_unknown_tool_gets_an_error_result(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(
        scripted(Reply.tool_use("Workflow", {"subtasks": ["x"]}), report("ok", []))
    )
    result = await run(server, tmp_path)
    assert result.status is Status.FINISHED
    error = server.log[1].body["messages"][-1]["content"][0]
    assert error["is_error"] is True and "no tool named 'Workflow'" in error["content"]


async def test_bash_and_report_in_one_reply_run_in_order(
    serve: StartServer, tmp_path: Path
) -> None:
    both = Reply(
        [
            {"type": "tool_use", "name": "bash", "input": {"command": "touch made-by-agent"}},
            {
                "type": "tool_use",
                "name": "report_findings",
                "input": {"summary": "s", "findings": []},
            },
        ]
    )
    server = await serve(scripted(both))
    result = await run(server, tmp_path)
    assert result.status is Status.FINISHED and (tmp_path / "made-by-agent").exists()
    assert len(server.log) == 1
