"""The main loop: stop reasons, notices, failures — and the history always stays valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.errors import AuthError
from orchmode.core.events import EventBus, TurnDone
from orchmode.core.mode import Notice
from orchmode.core.prompts import NOTICES
from orchmode.session.agent import Conversation as Session
from orchmode.testing import Fault, Reply, ScriptedRequest, ScriptedServer


def scripted(*replies: Reply | Fault) -> Any:
    def respond(request: ScriptedRequest) -> Reply | Fault:
        return replies[request.index]

    return respond


async def session_for(server: ScriptedServer, tmp_path: Path, **overrides: Any) -> Session:
    settings = settings_for(server, tmp_path, **overrides)
    return await conversation_for(settings, store=store_for(tmp_path))


def assert_all_accepted(server: ScriptedServer) -> None:
    assert [(e.status, e.outcome) for e in server.log] == [(200, "ok")] * len(server.log)


async def test_the_first_turn_carries_enter_directly_after_the_user_message(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("hi"))
    session = await session_for(server, tmp_path)
    result = await session.turn("hello")
    assert (result.text, result.stop) == ("hi", "end_turn")
    assert server.log[0].body["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "system", "content": NOTICES[Notice.ENTER]},
    ]
    session.set_mode(False)
    await session.turn("bye")
    assert server.log[1].body["messages"][-2:] == [
        {"role": "user", "content": "bye"},
        {"role": "system", "content": NOTICES[Notice.EXIT]},
    ]
    assert_all_accepted(server)


async def test_an_empty_reply_then_another_turn_is_accepted(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(scripted(Reply([]), Reply.text("second")))
    session = await session_for(server, tmp_path)
    first = await session.turn("one")
    assert first.stop == "empty" and "empty reply" in first.text
    second = await session.turn("two")
    assert second.text == "second"
    assert_all_accepted(server)
    assert all(m["content"] for m in server.log[1].body["messages"])


async def test_a_truncated_reply_is_dropped_from_the_history(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(scripted(Reply.text("cut of", stop_reason="max_tokens"), Reply.text("ok")))
    session = await session_for(server, tmp_path)
    first = await session.turn("one")
    assert (
        first.stop == "max_tokens"
        and first.text.startswith("cut of")
        and "max_tokens" in first.text
    )
    await session.turn("two")
    sent = server.log[1].body["messages"]
    assert not any(m["role"] == "assistant" for m in sent)
    assert_all_accepted(server)


@pytest.mark.parametrize("stop", ["refusal", "model_context_window_exceeded"])
async def test_refused_or_overflowing_replies_are_dropped(
    serve: StartServer, tmp_path: Path, stop: str
) -> None:
    server = await serve(scripted(Reply.text("no", stop_reason=stop), Reply.text("ok")))
    session = await session_for(server, tmp_path)
    first = await session.turn("one")
    assert first.stop == stop
    await session.turn("two")
    assert not any(m["role"] == "assistant" for m in server.log[1].body["messages"])
    assert_all_accepted(server)


async def test_pause_turn_continues_and_joins_the_text(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(
        scripted(Reply.text("part one", stop_reason="pause_turn"), Reply.text("part two"))
    )
    session = await session_for(server, tmp_path)
    result = await session.turn("go")
    assert result.text == "part one\n\npart two" and result.model_calls == 2
    assert server.log[1].body["messages"][-1]["role"] == "assistant"
    assert_all_accepted(server)


async def test_tool_calls_run_and_all_results_go_back_in_one_message(
    serve: StartServer, tmp_path: Path
) -> None:
    two_calls = Reply(
        [
            {"type": "tool_use", "name": "bash", "input": {"command": "echo one"}},
            {"type": "tool_use", "name": "bash", "input": {"command": "sh -c 'exit 3'"}},
            {"type": "tool_use", "name": "Nope", "input": {}},
        ]
    )
    server = await serve(scripted(two_calls, Reply.text("done")))
    session = await session_for(server, tmp_path)
    result = await session.turn("go")
    assert result.text == "done"
    results = server.log[1].body["messages"][-1]["content"]
    assert [r["content"] for r in results][:2] == ["one", "(exit code 3)\n(no output)"]
    assert [r.get("is_error", False) for r in results] == [False, True, True]
    await session.close()


async def test_the_turn_limit_is_reported(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(
        lambda r: Reply.tool_use("bash", {"command": "true"}) if r.index < 3 else Reply.text("fine")
    )
    session = await session_for(server, tmp_path, main_turns=3)
    result = await session.turn("loop forever")
    assert result.stop == "turn_limit" and "3 model calls" in result.text
    assert len(server.log) == 3
    assert (await session.turn("next")).text == "fine"
    assert_all_accepted(server)
    await session.close()


async def test_a_failed_request_ends_the_turn_and_the_next_turn_works(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(
        scripted(
            Reply.tool_use("bash", {"command": "true"}), Fault("server_error"), Reply.text("back")
        )
    )
    session = await session_for(server, tmp_path)
    first = await session.turn("one")
    assert first.stop == "error" and first.error is not None and "500" in first.text
    second = await session.turn("two")
    assert second.text == "back"
    assert server.log[2].status == 200
    await session.close()


async def test_a_bad_key_raises_auth_error(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(lambda r: Reply.text("never"))
    settings = settings_for(server, tmp_path)
    events = EventBus()
    seen: list[object] = []
    events.subscribe(seen.append)
    session = await conversation_for(
        settings, events=events, store=store_for(tmp_path), api_key="wrong"
    )
    with pytest.raises(AuthError, match="rejected the credentials"):
        await session.turn("hi")
    assert seen[-1] == TurnDone("error", 0)  # recorded as failed, not left open


async def test_a_bad_workflow_call_is_an_error_result(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(scripted(Reply.tool_use("Workflow", {"subtasks": []}), Reply.text("ok")))
    session = await session_for(server, tmp_path)
    await session.turn("go")
    result = server.log[1].body["messages"][-1]["content"][0]
    assert result["is_error"] is True and "no usable subtasks" in result["content"]
    await session.close()


async def test_notices_fold_into_the_user_turn_for_endpoints_without_system_messages(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("hi"), system_messages=False)
    refused = await session_for(server, tmp_path / "a")
    result = await refused.turn("hello")
    assert result.error is not None and "400" in str(result.error)  # the plain way fails
    session = await session_for(server, tmp_path / "b", notice_delivery="user-text")
    assert (await session.turn("hello")).text == "hi"
    session.set_mode(False)
    assert (await session.turn("bye")).text == "hi"
    first, second = (e.body["messages"] for e in server.log[-2:])
    assert all(m["role"] in ("user", "assistant") for m in first + second)
    assert first[0]["content"].startswith("hello\n\n[orchmode notice: from the harness")
    assert NOTICES[Notice.ENTER] in first[0]["content"]
    assert NOTICES[Notice.EXIT] in second[-1]["content"]
    assert second[-1]["content"].startswith("bye\n\n[orchmode notice")
