"""The one agent loop: its stop-reason table, its tool dispatch, and the roles that share them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import API_KEY, StartServer, gateway_for, settings_for
from orchmode.core.events import ContextCompacted, EventBus, TokenUsage
from orchmode.core.prompts import SUBAGENT_SYSTEM, SUBAGENT_TOOLS
from orchmode.core.results import Status
from orchmode.core.wire import Block, Message
from orchmode.executors.subagent import Subagent
from orchmode.loop import STOPS, AgentLoop, Ending, Finish, Room, Step, Toolbox, rule_for
from orchmode.loop.toolbox import NOT_RUN
from orchmode.model.context import Meter, Window
from orchmode.model.providers import Credentials
from orchmode.model.reply import ModelReply
from orchmode.session.agent import open_conversation
from orchmode.shell.bash import BashSession
from orchmode.testing import Reply, ScriptedRequest
from orchmode.testing.scenario import report
from orchmode.tools.calls import tool_result

DROPPED = {"max_tokens", "refusal", "model_context_window_exceeded"}
STOP_REASONS = st.one_of(st.none(), st.sampled_from(sorted(STOPS)), st.text(max_size=20))


# --------------------------------------------------------------------------- the stop table


def test_every_stop_reason_the_api_documents_has_its_rule() -> None:
    """Read from the SDK's own declarations, beta and not: a new stop reason fails here."""
    from typing import get_args

    from anthropic.types import StopReason
    from anthropic.types.beta import BetaStopReason

    assert set(STOPS) == {*get_args(StopReason), *get_args(BetaStopReason)}
    assert set(STOPS) > DROPPED


@given(stop=STOP_REASONS, has_tool_calls=st.booleans())
def test_the_stop_table_goes_on_only_for_tool_calls_and_pauses(
    stop: str | None, has_tool_calls: bool
) -> None:
    rule = rule_for(stop, has_tool_calls)
    assert (rule.step is Step.TOOLS) == (stop == "tool_use" and has_tool_calls)
    assert (rule.step is Step.CONTINUE) == (stop in ("pause_turn", "compaction"))
    # A truncated or refused reply is never kept, and is the only kind not kept.
    assert rule.kept == (stop not in DROPPED)
    assert (rule.status is Status.FINISHED) == rule.kept
    assert bool(rule.note) == (not rule.kept)
    # Only a reply that says the window was exceeded is worth a compaction and a retry.
    assert rule.compact_first == (stop == "model_context_window_exceeded")


def test_an_unknown_or_missing_stop_reason_ends_the_turn_like_end_turn() -> None:
    for stop in (None, "", "something_new"):
        assert rule_for(stop, True) == STOPS["end_turn"]


# --------------------------------------------------------------------------- tool dispatch


class Boom(Exception):
    pass


def toolbox() -> Toolbox:
    async def echo(tool_use: Block, gathered: Sequence[Block]) -> Block:
        return tool_result(tool_use["id"], f"{tool_use['name']} after {len(gathered)}")

    async def finish(tool_use: Block, _gathered: Sequence[Block]) -> Finish:
        return Finish(f"finished by {tool_use['id']}")

    async def boom(tool_use: Block, _gathered: Sequence[Block]) -> Block:
        raise Boom

    schemas = [{"name": n} for n in ("echo", "finish", "boom")]
    return Toolbox(schemas, {"echo": echo, "finish": finish}, {"bo": boom})


@given(names=st.lists(st.sampled_from(["echo", "finish", "boom", "nope"]), max_size=8))
def test_every_call_of_a_round_gets_one_result_in_order_whatever_happens(
    names: list[str],
) -> None:
    calls = [
        {"type": "tool_use", "id": f"t{i}", "name": n, "input": {}} for i, n in enumerate(names)
    ]
    results: list[Block] = []
    finish = None
    try:
        finish = asyncio.run(toolbox().run(calls, results))
    except Boom:
        assert "boom" in names
    assert [r["tool_use_id"] for r in results] == [c["id"] for c in calls]
    ended = next((i for i, n in enumerate(names) if n in ("finish", "boom")), len(names))
    for i, (name, result) in enumerate(zip(names, results, strict=True)):
        if i < ended:
            assert result.get("is_error", False) == (name == "nope")
            expected = f"echo after {i}" if name == "echo" else "no tool named 'nope'"
            assert expected in result["content"]
        elif i > ended:
            assert result["content"] == NOT_RUN and result["is_error"]
    if ended < len(names) and names[ended] == "finish":
        assert finish == Finish(f"finished by t{ended}")
    else:
        assert finish is None


# --------------------------------------------------------------------------- the roles share it


async def run_subagent(server: Any, tmp_path: Path, window: Window | None = None) -> Any:
    settings = settings_for(server, tmp_path, output_limit=200_000)
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    gateway = gateway_for(settings, events)
    async with BashSession(tmp_path, output_limit=200_000) as shell:
        agent = Subagent(
            gateway, shell, events, "worker 1.1", SUBAGENT_SYSTEM, SUBAGENT_TOOLS, 5, window=window
        )
        result = await agent.run("Read the big file.")
    await gateway.close()
    return result, seen


@pytest.mark.parametrize("stop", sorted(DROPPED))
async def test_the_main_turn_and_a_subagent_end_a_dropped_reply_by_the_same_rule(
    serve: StartServer, tmp_path: Path, stop: str
) -> None:
    server = await serve(lambda r: Reply.text("partial", stop_reason=stop))
    settings = settings_for(server, tmp_path)
    async with open_conversation(settings, Credentials(api_key=API_KEY)) as session:
        main = await session.turn("go")
    worker, _ = await run_subagent(server, tmp_path)
    rule = STOPS[stop]
    assert main.stop == stop and main.text.endswith(rule.note)
    assert worker.status is rule.status and worker.text.endswith(rule.note)
    assert main.text.startswith("partial") and worker.text.startswith("partial")
    assert not any(m["role"] == "assistant" for m in session.history)


def _is_stub(request: ScriptedRequest) -> bool:
    last = request.messages[-1]["content"]
    return isinstance(last, list) and last[0]["content"].startswith("[orchmode: this tool")


async def test_a_subagent_compacts_and_asks_again_when_the_window_is_exceeded(
    serve: StartServer, tmp_path: Path
) -> None:
    """The subagent used to stop at ``model_context_window_exceeded``; like the main agent,
    it now stubs its results (the latest too) and asks once more."""

    def respond(request: ScriptedRequest) -> Reply:
        if request.index == 0:
            return Reply.tool_use("bash", {"command": "head -c 9000 /dev/zero | tr '\\0' a"})
        if not _is_stub(request):
            return Reply.text("", stop_reason="model_context_window_exceeded")
        return report("read it", [])

    server = await serve(respond)
    window = Window(
        tokens=20_000, compact_at=16_000, compact_to=1_000, result_tokens=5_000, quote_tokens=500
    )
    result, seen = await run_subagent(server, tmp_path, window)
    assert result.status is Status.FINISHED, result.text
    assert json.loads(result.text)["summary"] == "read it"
    assert result.turns == 3  # the exceeded reply was a turn; the compaction was not
    compacted = [e for e in seen if isinstance(e, ContextCompacted)]
    assert [(e.agent, e.how, e.refused) for e in compacted] == [("worker 1.1", "stubbed", True)]
    assert [e.status for e in server.log] == [200, 200, 200]


async def test_a_subagent_that_cannot_make_room_still_stops_at_the_window(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("", stop_reason="model_context_window_exceeded"))
    window = Window(
        tokens=20_000, compact_at=16_000, compact_to=1_000, result_tokens=5_000, quote_tokens=500
    )
    result, seen = await run_subagent(server, tmp_path, window)
    assert result.status is Status.CONTEXT_EXCEEDED and len(server.log) == 1
    assert not [e for e in seen if isinstance(e, ContextCompacted)]


async def test_a_main_request_refused_as_too_long_does_not_use_up_a_turn(
    serve: StartServer, tmp_path: Path
) -> None:
    """With two model calls a turn: a command's output, a refusal, a compaction, the answer."""

    def respond(request: ScriptedRequest) -> Reply:
        if request.messages[-1]["role"] == "system" or isinstance(
            request.messages[-1]["content"], str
        ):
            return Reply.tool_use("bash", {"command": "head -c 180000 /dev/zero | tr '\\0' a"})
        return Reply.text("done")

    server = await serve(respond, context_window=30_000, context_management=False)
    events = EventBus()
    seen: list[Any] = []
    events.subscribe(seen.append)
    settings = settings_for(
        server,
        tmp_path,
        main_turns=2,
        context_window=100_000,
        context_management="harness",
        output_limit=200_000,
    )
    async with open_conversation(settings, Credentials(api_key=API_KEY), events=events) as session:
        result = await session.turn("go")
    assert (result.text, result.stop) == ("done", "end_turn")
    assert [e.status for e in server.log] == [200, 400, 200]
    assert result.model_calls == 3  # every request sent, the refused one too
    assert [(e.how, e.refused) for e in seen if isinstance(e, ContextCompacted)] == [
        ("stubbed", True)
    ]


# --------------------------------------------------------------------------- the loop as a machine


class FakeGateway:
    """Answers from a script of (stop reason, tool calls, has text), no HTTP."""

    context_editing = False

    def __init__(self, script: list[tuple[str | None, int, bool]]) -> None:
        self.script = list(script)
        self.sent = 0
        self.last: list[Block] = []

    async def complete(self, *, messages: Any, on_send: Any = None, **_: Any) -> ModelReply:
        if on_send is not None:
            on_send()
        self.sent += 1
        n = self.sent
        stop, calls, has_text = self.script.pop(0) if self.script else ("end_turn", 0, True)
        content: list[Block] = [{"type": "text", "text": f"r{n}"}] if has_text else []
        content += [
            {"type": "tool_use", "id": f"u{n}.{k}", "name": "t", "input": {}} for k in range(calls)
        ]
        self.last = content
        return ModelReply(f"m{n}", content, stop, TokenUsage(input_tokens=10))


def _reply(stop: str | None, calls: int, has_text: bool) -> tuple[str | None, int, bool]:
    """As the API answers: tool calls only with ``tool_use`` (or cut off at ``max_tokens``)."""
    return stop, calls if stop in ("tool_use", "max_tokens") else 0, has_text


SCRIPTS = st.lists(
    st.builds(
        _reply,
        st.one_of(st.none(), st.sampled_from(sorted(STOPS)), st.just("other")),
        st.integers(0, 2),
        st.booleans(),
    ),
    max_size=10,
)


@given(script=SCRIPTS, max_turns=st.integers(1, 6))
def test_the_loop_keeps_the_conversation_valid_and_ends_by_the_table(
    script: list[tuple[str | None, int, bool]], max_turns: int
) -> None:
    gateway: Any = FakeGateway(script)
    started: list[int] = []

    async def echo(tool_use: Block, _gathered: Sequence[Block]) -> Block:
        return tool_result(tool_use["id"], "ok")

    room = Room("a", gateway, EventBus(), "system", Meter(["system"]))
    loop = AgentLoop(gateway, "a", "system", room, on_first_send=lambda: started.append(1))
    messages: list[Message] = [{"role": "user", "content": "go"}]
    done = asyncio.run(loop.run(messages, Toolbox([{"name": "t"}], {"t": echo}), max_turns))

    assert started == [1] and done.turns == done.requests == gateway.sent <= max_turns
    # Every tool call is answered by the very next message, one result each, in order.
    for i, message in enumerate(messages[1:], 1):
        uses = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
        if message["role"] == "assistant" and uses:
            assert [b["tool_use_id"] for b in messages[i + 1]["content"]] == uses
    stop, calls, _ = [*script, *[("end_turn", 0, True)] * done.turns][done.turns - 1]
    rule = rule_for(stop, calls > 0)
    last = {"role": "assistant", "content": gateway.last}
    if done.ending is Ending.STOPPED:
        assert done.rule == rule and rule.step is Step.STOP
        assert done.stop == (stop or "end_turn") and done.empty == (not gateway.last)
        # A kept reply ends the conversation; a dropped one never enters it.
        assert (messages[-1] == last) == (rule.kept and bool(gateway.last))
        assert rule.kept or last not in messages
    else:
        assert done.ending is Ending.TURN_LIMIT and done.turns == max_turns
        assert rule.step is not Step.STOP
