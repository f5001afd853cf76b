"""The model gateway against the strict scripted server: request shape, usage, and every failure."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from conftest import StartServer, gateway_for, settings_for
from orchmode.core.errors import AuthError, EndpointError, ModelRequestError
from orchmode.core.events import EventBus, ModelRequestDone
from orchmode.core.prompts import MAIN_TOOLS
from orchmode.model.limits import CUT, KNEE, AdaptiveLimit
from orchmode.model.providers import Credentials
from orchmode.testing import Fault, Reply, ScriptedRequest

USER = [{"role": "user", "content": "hello"}]


async def test_a_reply_streams_with_text_callbacks_and_usage(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("a reply long enough to arrive in several deltas"))
    events = EventBus()
    seen: list[object] = []
    events.subscribe(seen.append)
    gateway = gateway_for(settings_for(server, tmp_path), events)
    pieces: list[str] = []
    reply = await gateway.complete(
        agent="main", system="s", messages=USER, tools=MAIN_TOOLS, on_text=pieces.append
    )
    assert reply.text == "a reply long enough to arrive in several deltas"
    assert len(pieces) > 1 and "".join(pieces) == reply.text
    assert reply.stop_reason == "end_turn" and reply.message_id.startswith("msg_")
    assert reply.usage.input_tokens + reply.usage.cache_write_tokens > 0
    assert reply.usage.output_tokens > 0
    assert gateway.usage == reply.usage and gateway.requests == 1
    done = [e for e in seen if isinstance(e, ModelRequestDone)]
    assert len(done) == 1 and done[0].agent == "main" and done[0].usage == reply.usage
    body = server.log[0].body
    assert body["output_config"] == {"effort": "xhigh"}
    assert body["cache_control"] == {"type": "ephemeral"}
    assert body["stream"] is True and body["system"] == [
        {"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}
    ]
    await gateway.close()


async def test_a_growing_conversation_reads_its_prefix_from_the_cache(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("answer " * 40))
    gateway = gateway_for(settings_for(server, tmp_path))
    messages: list[dict[str, object]] = [{"role": "user", "content": "question " * 200}]
    first = await gateway.complete(agent="main", system="s", messages=messages, tools=MAIN_TOOLS)
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "more"},
    ]
    second = await gateway.complete(agent="main", system="s", messages=messages, tools=MAIN_TOOLS)
    assert first.usage.cache_read_tokens == 0
    assert second.usage.cache_read_tokens > 0
    await gateway.close()


async def test_tool_input_arrives_whole_from_chunked_json(
    serve: StartServer, tmp_path: Path
) -> None:
    subtasks = [f"subtask number {i} with some words" for i in range(30)]
    server = await serve(lambda r: Reply.tool_use("Workflow", {"subtasks": subtasks}))
    gateway = gateway_for(settings_for(server, tmp_path))
    reply = await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert reply.tool_uses[0]["input"] == {"subtasks": subtasks}
    assert reply.tool_uses[0]["id"].startswith("toolu_")
    await gateway.close()


@pytest.mark.parametrize(
    ("fault", "needle"),
    [
        (Fault("overloaded"), "529"),
        (Fault("server_error"), "500"),
        (Fault("rate_limit", retry_after=0.01), "429"),
        (Fault("drop", after_events=4), "broke off"),
        (Fault("sse_error", after_events=4), "reported an error"),
    ],
)
async def test_failures_become_endpoint_errors(
    serve: StartServer, tmp_path: Path, fault: Fault, needle: str
) -> None:
    server = await serve(lambda r: fault)
    settings = settings_for(server, tmp_path, stream_retries=0, overload_patience=0.2)
    gateway = gateway_for(settings)
    with pytest.raises(EndpointError, match=needle):
        await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert gateway.requests == 0
    await gateway.close()


async def test_a_slow_response_times_out(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(lambda r: Reply.text("late", delay=5))
    gateway = gateway_for(settings_for(server, tmp_path, request_timeout=0.3))
    with pytest.raises(EndpointError, match=r"timed out after 0\.3 s"):
        await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    await gateway.close()


async def test_an_invalid_request_surfaces_the_api_message(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("never"))
    gateway = gateway_for(settings_for(server, tmp_path))
    bad = [{"role": "assistant", "content": "I speak first"}]
    with pytest.raises(ModelRequestError, match="400") as info:
        await gateway.complete(agent="main", system="s", messages=bad, tools=MAIN_TOOLS)
    assert "user" in str(info.value)
    await gateway.close()


async def test_a_wrong_key_is_an_auth_error_without_the_key(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("never"))
    gateway = gateway_for(settings_for(server, tmp_path), api_key="sk-secret-123")
    with pytest.raises(AuthError) as info:
        await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert "sk-secret-123" not in str(info.value) and "sk-secret-123" not in repr(
        gateway.credentials
    )
    assert "***" in str(server.log[0].headers)
    await gateway.close()


def test_credentials_prefer_the_api_key_and_need_one() -> None:
    assert (
        Credentials.from_env({"ANTHROPIC_API_KEY": "k", "ANTHROPIC_AUTH_TOKEN": "t"}).api_key == "k"
    )
    assert Credentials.from_env({"ANTHROPIC_AUTH_TOKEN": "t"}).auth_token == "t"
    with pytest.raises(AuthError, match="ANTHROPIC_API_KEY"):
        Credentials.from_env({"ANTHROPIC_API_KEY": ""})


@pytest.mark.parametrize(
    "fault", [Fault("drop", after_events=5), Fault("sse_error", after_events=5)]
)
async def test_a_stream_broken_part_way_is_sent_again_from_the_start(
    serve: StartServer, tmp_path: Path, fault: Fault
) -> None:
    server = await serve(lambda r: fault if r.index < 2 else Reply.text("whole at last"))
    gateway = gateway_for(settings_for(server, tmp_path, stream_retries=3))
    reply = await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert reply.text == "whole at last"
    assert len(server.log) == 3 and server.log[0].body == server.log[2].body
    assert gateway.requests == 1


async def test_a_stream_that_keeps_breaking_fails_after_the_retries(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Fault("drop", after_events=5))
    gateway = gateway_for(settings_for(server, tmp_path, stream_retries=2))
    with pytest.raises(EndpointError, match="broke off"):
        await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert len(server.log) == 3


async def test_a_stream_that_goes_silent_part_way_is_a_broken_stream_not_a_lost_endpoint(
    serve: StartServer, tmp_path: Path
) -> None:
    # Each event comes after longer than the read timeout: the response opened, then stalled.
    # Margins wide enough for a loaded machine: a whole reply well within the timeout,
    # each stalled event well past it.
    stalled = Reply.text("slow " * 4, event_delay=3.0)
    server = await serve(lambda r: stalled if r.index == 0 else Reply.text("whole at last"))
    settings = settings_for(server, tmp_path, request_timeout=1.0, stream_retries=1, max_retries=0)
    gateway = gateway_for(settings)
    reply = await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert reply.text == "whole at last" and len(server.log) == 2
    with pytest.raises(EndpointError, match="broke off") as caught:
        server.responder = lambda r: stalled
        await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert "cannot reach" not in str(caught.value)
    await gateway.close()


async def test_a_rate_limited_request_waits_as_told_and_finishes(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(
        lambda r: Fault("rate_limit", retry_after=0.2) if r.index < 2 else Reply.text("done")
    )
    gateway = gateway_for(settings_for(server, tmp_path))
    reply = await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert reply.text == "done" and len(server.log) == 3
    for refused, retried in itertools.pairwise(server.log):
        assert refused.finished is not None
        assert retried.started - refused.finished >= 0.18  # retry-after honoured


async def test_a_server_error_is_retried_max_retries_times(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Fault("server_error"))
    gateway = gateway_for(settings_for(server, tmp_path, max_retries=2))
    with pytest.raises(EndpointError, match="500"):
        await gateway.complete(agent="main", system="s", messages=USER, tools=MAIN_TOOLS)
    assert len(server.log) == 3


async def test_the_limit_settles_at_what_the_server_accepts(
    serve: StartServer, tmp_path: Path
) -> None:
    """12 agents at once against a server that takes 3: all finish, none fails."""
    server = await serve(lambda r: Reply.text("ok", delay=0.1), max_in_flight=3)
    gateway = gateway_for(settings_for(server, tmp_path, max_concurrent=12))
    replies = await asyncio.gather(
        *(
            gateway.complete(agent=f"a{i}", system="s", messages=USER, tools=MAIN_TOOLS)
            for i in range(12)
        )
    )
    assert [r.text for r in replies] == ["ok"] * 12
    outcomes = [e.outcome for e in server.log]
    assert outcomes.count("ok") == 12 and "rate_limited" in outcomes
    assert gateway.limit.limit < 12


async def test_adaptive_limit_cuts_once_per_round_and_grows_back() -> None:
    limit = AdaptiveLimit(10)
    started = [await limit.acquire() for _ in range(10)]
    for t in started[:2]:  # two refusals of one round: one signal
        limit.overloaded(t)
    assert limit.limit == pytest.approx(10 * CUT)
    for _ in started:
        limit.release()
    refused_level = 10.0
    grown = []
    for _ in range(200):
        await limit.acquire()
        limit.release()
        limit.succeeded()
        grown.append(limit.limit)
    # Quick (half a request per success) back to KNEE of the refused level; slow after.
    quick, level = [], 10 * CUT
    while level < KNEE * refused_level:
        level += 0.5
        quick.append(level)
    assert quick and grown[: len(quick)] == pytest.approx(quick)
    assert grown[len(quick)] - quick[-1] == pytest.approx(1 / quick[-1])
    assert limit.limit == 10  # back to the ceiling, never past it
    assert limit.peak == 10


async def test_a_storm_of_refusals_drops_the_limit_to_what_was_in_flight() -> None:
    """Refused with n others out: more than n is too many, whatever the round says."""
    limit = AdaptiveLimit(100)
    started = [await limit.acquire() for _ in range(100)]
    for t in started[20:]:  # the API took 20 and refused 80
        limit.overloaded(t)
        limit.release()
    assert limit.limit == 20
    for _ in started[:20]:
        limit.release()
    for _ in range(30):  # and it comes back quickly, towards the round's refused level
        await limit.acquire()
        limit.release()
        limit.succeeded()
    assert limit.limit == pytest.approx(35)


async def test_a_probe_refused_at_the_wall_found_before_drops_below_it_without_the_cut() -> None:
    loop = asyncio.get_running_loop()

    def later() -> float:
        """A start after the last cut: the refusal is a new round's signal."""
        return loop.time() + 1

    limit = AdaptiveLimit(40)
    for _ in range(21):
        await limit.acquire()
    limit.overloaded(later())  # refused with 20 others out: the wall is at 21
    limit.release()
    assert limit.limit == 20
    for _ in range(3):
        while limit.allowed < 21:  # successes, 20 at a time, until a 21st may go out
            limit.release()
            limit.succeeded()
            await limit.acquire()
        await limit.acquire()  # the probe, refused at the same wall
        limit.overloaded(later())
        limit.release()
        assert limit.limit == 20  # just below the wall again, not cut to 18
    while limit.in_flight > 15:
        limit.release()
    limit.overloaded(later())  # refused with 14 others out: the wall moved in
    assert limit.limit == 14


async def test_adaptive_limit_queues_beyond_the_limit() -> None:
    limit = AdaptiveLimit(2)
    await limit.acquire()
    await limit.acquire()
    third = asyncio.create_task(limit.acquire())
    while not limit._waiters:  # until the third has queued up
        await asyncio.sleep(0)
    assert not third.done()
    limit.release()
    await asyncio.wait_for(third, 1)
    assert limit.in_flight == 2


async def test_cache_diagnostics_name_what_broke_the_prefix(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("answer " * 20))
    events = EventBus()
    seen: list[ModelRequestDone] = []
    events.subscribe(lambda e: seen.append(e) if isinstance(e, ModelRequestDone) else None)
    gateway = gateway_for(settings_for(server, tmp_path), events)
    messages: list[dict[str, object]] = [{"role": "user", "content": "question " * 100}]
    first = await gateway.complete(agent="main", system="s", messages=messages, tools=MAIN_TOOLS)
    assert server.log[0].body["diagnostics"] == {"previous_message_id": None}
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "more"},
    ]
    second = await gateway.complete(
        agent="main", system="s", messages=messages, tools=MAIN_TOOLS,
        previous_message_id=first.message_id,
    )  # fmt: skip
    assert second.cache_miss is None  # it only appended
    third = await gateway.complete(
        agent="main", system="a different system prompt", messages=messages, tools=MAIN_TOOLS,
        previous_message_id=second.message_id,
    )  # fmt: skip
    assert third.cache_miss == "system_changed" and third.cache_missed_tokens > 0
    assert [e.cache_miss for e in seen] == [None, None, "system_changed"]


async def test_a_refused_request_gives_its_place_back_while_it_waits(
    serve: StartServer, tmp_path: Path
) -> None:
    """One request at a time: the second goes while the first sits out its retry-after."""

    def respond(request: ScriptedRequest) -> Reply | Fault:
        if request.index == 0:
            return Fault("rate_limit", retry_after=0.5)
        return Reply.text("ok")

    server = await serve(respond)
    gateway = gateway_for(settings_for(server, tmp_path, max_concurrent=1))
    first = asyncio.create_task(
        gateway.complete(agent="a", system="s", messages=USER, tools=MAIN_TOOLS)
    )
    second = asyncio.create_task(
        gateway.complete(agent="b", system="s", messages=USER, tools=MAIN_TOOLS)
    )
    await asyncio.gather(first, second)
    refused, other, retried = server.log
    assert refused.outcome == "rate_limited" or refused.outcome.startswith("fault:")
    assert retried.started - refused.started >= 0.45  # the retry-after was honoured
    # ...and the other request went during the wait, not after it
    assert other.finished is not None and other.finished - refused.started < 0.45


async def test_on_send_is_called_once_even_when_the_request_is_retried(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Fault("server_error") if r.index == 0 else Reply.text("ok"))
    gateway = gateway_for(settings_for(server, tmp_path, max_retries=1))
    calls: list[int] = []
    await gateway.complete(
        agent="a",
        system="s",
        messages=USER,
        tools=MAIN_TOOLS,
        on_send=lambda: calls.append(len(server.log)),
    )
    assert calls == [0] and len(server.log) == 2  # before the first attempt, and only then
