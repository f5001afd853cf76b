"""The scripted API server, driven through the real ``anthropic`` SDK over real HTTP.

Every other test in the project trusts this server to behave like the Messages API, so
these tests pin down its wire format, validation, faults and bookkeeping.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx2
import pytest
from anthropic.types import MessageParam

from orchmode.testing import (
    Fault,
    FaultSchedule,
    Reply,
    Responder,
    ScriptedRequest,
    ScriptedServer,
    validate_request,
)
from orchmode.testing.__main__ import fallback_responder, load_responder
from orchmode.testing.cache import estimate_tokens

pytestmark = pytest.mark.timeout(30)

KEY = "test-key"
MODEL = "claude-test-1"
SRC = Path(__file__).resolve().parents[1] / "src"

Serve = Callable[..., Awaitable[ScriptedServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start servers on demand; stop them all at the end of the test."""
    started: list[ScriptedServer] = []

    async def start(responder: Responder, **kwargs: Any) -> ScriptedServer:
        server = ScriptedServer(responder, **kwargs)
        await server.start()
        started.append(server)
        return server

    yield start
    while _open_clients:
        await _open_clients.pop().close()
    for server in started:
        await server.stop()


_open_clients: list[anthropic.AsyncAnthropic] = []


def client_for(
    server: ScriptedServer, *, key: str = KEY, retries: int = 0
) -> anthropic.AsyncAnthropic:
    """An SDK client for ``server``; the ``serve`` fixture closes it on the test's loop."""
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key=key, max_retries=retries)
    _open_clients.append(client)
    return client


class Counting:
    """A responder that counts its calls and answers from a fixed reply or fault."""

    def __init__(self, answer: Reply | Fault | None = None) -> None:
        self.answer = answer or Reply.text("ok")
        self.requests: list[ScriptedRequest] = []

    def __call__(self, request: ScriptedRequest) -> Reply | Fault:
        self.requests.append(request)
        return self.answer


def user(text: str) -> MessageParam:
    return {"role": "user", "content": text}


async def raw_post(
    server: ScriptedServer, body: Any, *, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """Bypass the SDK, for bodies it would refuse to build and for byte-level checks."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    all_headers = {"x-api-key": KEY, "content-type": "application/json", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.url}/v1/messages", data=data, headers=all_headers) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.text()


def parse_sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in text.split("\n\n"):
        if not chunk:
            continue
        name_line, data_line = chunk.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), chunk
        events.append((name_line[7:], json.loads(data_line[6:])))
    return events


# ------------------------------------------------------------------------- happy paths


async def test_streamed_text_round_trips_in_several_deltas(serve: Serve) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 5
    server = await serve(Counting(Reply.text(text)), chunk_size=10)
    deltas: list[str] = []
    async with client_for(server).messages.stream(
        model=MODEL, max_tokens=100, messages=[user("hi")]
    ) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                deltas.append(event.delta.text)
        message = await stream.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text == text
    assert len(deltas) == 23 and all(len(d) == 10 for d in deltas[:-1])
    assert message.stop_reason == "end_turn"
    assert message.model == MODEL
    assert message.id.startswith("msg_")
    assert message.usage.input_tokens > 0
    assert message.usage.output_tokens == server.log[0].reply.output_tokens  # type: ignore[union-attr]
    assert server.log[0].outcome == "ok" and server.log[0].message_id == message.id


async def test_streamed_tool_use_input_survives_chunked_json(serve: Serve) -> None:
    tool_input = {"command": "grep -rn 'needle' .", "options": {"depth": 3, "tags": ["a", "ü"]}}
    reply = Reply(
        [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "name": "bash", "input": tool_input},
            {"type": "tool_use", "id": "toolu_fixed", "name": "noop", "input": {}},
        ]
    )
    server = await serve(Counting(reply), chunk_size=8)
    json_deltas = 0
    async with client_for(server).messages.stream(
        model=MODEL, max_tokens=100, messages=[user("find it")]
    ) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                json_deltas += 1
        message = await stream.get_final_message()
    first, second = message.content[1], message.content[2]
    assert first.type == "tool_use" and second.type == "tool_use"
    assert first.input == tool_input and first.name == "bash"
    assert first.id.startswith("toolu_") and len(first.id) > 10
    assert second.id == "toolu_fixed" and second.input == {}
    assert json_deltas > 3
    assert message.stop_reason == "tool_use"


async def test_non_streaming_create_returns_a_message(serve: Serve) -> None:
    reply = Reply.tool_use("bash", {"command": "ls"}, preamble="Listing.", output_tokens=42)
    server = await serve(Counting(reply))
    message = await client_for(server).messages.create(
        model=MODEL, max_tokens=100, messages=[user("ls please")]
    )
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[1].type == "tool_use"
    assert message.content[1].input == {"command": "ls"}
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens == 42
    assert message.usage.cache_read_input_tokens == 0


@pytest.mark.parametrize("stop_reason", ["max_tokens", "pause_turn", "refusal"])
async def test_explicit_stop_reasons_reach_the_client(serve: Serve, stop_reason: str) -> None:
    server = await serve(Counting(Reply.text("partial", stop_reason=stop_reason)))
    async with client_for(server).messages.stream(
        model=MODEL, max_tokens=5, messages=[user("go")]
    ) as stream:
        message = await stream.get_final_message()
    assert message.stop_reason == stop_reason
    assert (message.stop_details is not None) == (stop_reason == "refusal")


async def test_thinking_blocks_stream_with_signature(serve: Serve) -> None:
    reply = Reply([{"type": "thinking", "thinking": "hmm " * 20}, {"type": "text", "text": "42"}])
    server = await serve(Counting(reply))
    async with client_for(server).messages.stream(
        model=MODEL, max_tokens=5, messages=[user("answer?")]
    ) as stream:
        message = await stream.get_final_message()
    thinking = message.content[0]
    assert thinking.type == "thinking" and thinking.thinking == "hmm " * 20
    assert thinking.signature.startswith("sig_")


async def test_async_responder_and_its_view_of_the_request(serve: Serve) -> None:
    seen: list[ScriptedRequest] = []

    async def responder(request: ScriptedRequest) -> Reply:
        seen.append(request)
        return Reply.text("done")

    server = await serve(responder)
    messages: list[Any] = [
        user("start"),
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "out"}],
                },
                {"type": "text", "text": "go on"},
            ],
        },
        {"role": "system", "content": "Notice: two minutes left."},
    ]
    await client_for(server).messages.create(
        model=MODEL,
        max_tokens=5,
        system=[{"type": "text", "text": "You are"}, {"type": "text", "text": "terse."}],
        tools=[{"name": "bash", "input_schema": {"type": "object"}}],
        messages=messages,
    )
    (request,) = seen
    assert request.index == 0 and request.model == MODEL and not request.stream
    assert request.system == "You are\nterse."
    assert request.tool_names == {"bash"}
    assert request.last_user_text == "out\ngo on"
    assert [r["tool_use_id"] for r in request.tool_results] == ["t1"]
    assert request.messages[-1]["role"] == "system"


async def test_raw_stream_is_real_sse_with_ping_after_message_start(serve: Serve) -> None:
    server = await serve(Counting(Reply.text("hello")))
    status, headers, text = await raw_post(
        server, {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [user("hi")]}
    )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_")
    names = [name for name, _ in parse_sse(text)]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    events = dict(parse_sse(text))
    start = events["message_start"]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 1
    assert set(start["usage"]) >= {
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }
    assert events["message_delta"]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


async def test_raw_tool_use_streams_input_as_several_json_fragments(serve: Serve) -> None:
    tool_input = {"command": "ls"}
    server = await serve(Counting(Reply.tool_use("bash", tool_input, id="toolu_1")))
    _, _, text = await raw_post(
        server, {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [user("hi")]}
    )
    events = [data for name, data in parse_sse(text) if name.startswith("content_block")]
    assert events[0]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "bash",
        "input": {},
    }
    fragments = [e["delta"]["partial_json"] for e in events[1:-1]]
    assert all(e["delta"]["type"] == "input_json_delta" for e in events[1:-1])
    assert len(fragments) >= 3 and json.loads("".join(fragments)) == tool_input


async def test_ping_every_interleaves_pings(serve: Serve) -> None:
    server = await serve(Counting(Reply.text("x" * 50)), chunk_size=5, ping_every=3)
    _, _, text = await raw_post(
        server, {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [user("hi")]}
    )
    names = [name for name, _ in parse_sse(text)]
    real = [n for n in names if n != "ping"]
    assert len(real) == 15  # start, block start, 10 deltas, block stop, delta, stop
    assert names.count("ping") == 5
    assert all(names[i] == "ping" for i in (3, 7, 11, 15, 19))


async def test_stream_is_flushed_event_by_event(serve: Serve) -> None:
    """The first event arrives while the server is still pacing the rest."""
    server = await serve(Counting(Reply.text("slow " * 3, event_delay=0.3)), chunk_size=5)
    async with client_for(server).messages.stream(
        model=MODEL, max_tokens=5, messages=[user("hi")]
    ) as stream:
        first = await stream.__anext__()
        assert first.type == "message_start"
        assert server.log[0].outcome == "pending"
        assert server.in_flight == 1
    assert server.max_in_flight_seen == 1


async def test_client_closing_mid_stream_is_logged_as_disconnected(serve: Serve) -> None:
    server = await serve(Counting(Reply.text("word " * 10, event_delay=0.05)), chunk_size=5)
    async with client_for(server).messages.stream(
        model=MODEL, max_tokens=5, messages=[user("hi")]
    ) as stream:
        await stream.__anext__()
    await server.stop()  # waits for the handler to notice the closed socket and finish
    assert server.log[0].outcome == "disconnected"
    assert server.in_flight == 0


async def test_reply_delay_is_honoured(serve: Serve) -> None:
    server = await serve(Counting(Reply.text("late", delay=0.2)))
    await client_for(server).messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])
    duration = server.log[0].duration
    assert duration is not None and duration >= 0.2


# ------------------------------------------------------------------------- validation


def base(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": [user("hi")]}
    body.update(changes)
    return {k: v for k, v in body.items() if v is not DROP}


DROP = object()
TOOL_USE = {
    "role": "assistant",
    "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}],
}


def result(tool_id: str = "t1") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": "done"}


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no model", base(model=DROP), "model: Field required"),
    ("model not str", base(model=7), "model: Input should be a non-empty string"),
    ("no max_tokens", base(max_tokens=DROP), "max_tokens: Field required"),
    (
        "zero max_tokens",
        base(max_tokens=0),
        "max_tokens: Input should be greater than or equal to 1",
    ),
    ("str max_tokens", base(max_tokens="5"), "max_tokens: Input should be a valid integer"),
    ("no messages", base(messages=DROP), "messages: Field required"),
    ("empty messages", base(messages=[]), "messages: at least one message is required"),
    (
        "messages not list",
        base(messages={"role": "user"}),
        "messages: Input should be a valid list",
    ),
    (
        "assistant first",
        base(messages=[{"role": "assistant", "content": "hi"}]),
        'messages: first message must use the "user" role',
    ),
    (
        "system first",
        base(messages=[{"role": "system", "content": "hi"}, user("x")]),
        'messages: first message must use the "user" role',
    ),
    (
        "unknown role",
        base(messages=[user("a"), {"role": "tool", "content": "x"}]),
        "messages.1.role: Input should be 'user', 'assistant' or 'system'",
    ),
    (
        "system after assistant",
        base(
            messages=[
                user("a"),
                {"role": "assistant", "content": "b"},
                {"role": "system", "content": "c"},
            ]
        ),
        "messages.2: a system message must directly follow a user message",
    ),
    (
        "system after system",
        base(
            messages=[
                user("a"),
                {"role": "system", "content": "b"},
                {"role": "system", "content": "c"},
            ]
        ),
        "messages.2: a system message must directly follow a user message",
    ),
    (
        "empty string content",
        base(messages=[user("")]),
        "messages.0: all messages must have non-empty content",
    ),
    (
        "empty list content",
        base(messages=[{"role": "user", "content": []}]),
        "messages.0: all messages must have non-empty content",
    ),
    (
        "empty text block",
        base(messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]),
        "messages.0.content.0.text: text content blocks must be non-empty",
    ),
    (
        "whitespace text block",
        base(messages=[{"role": "user", "content": [{"type": "text", "text": " \n"}]}]),
        "messages.0.content.0.text: text content blocks must contain non-whitespace text",
    ),
    (
        "empty final assistant",
        base(messages=[user("a"), {"role": "assistant", "content": ""}]),
        "messages.1: all messages must have non-empty content",
    ),
    (
        "prefill with trailing space",
        base(messages=[user("a"), {"role": "assistant", "content": "The answer is "}]),
        "messages.1: final assistant content cannot end with trailing whitespace",
    ),
    (
        "tool_use answered by text",
        base(messages=[user("a"), TOOL_USE, user("no result")]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: t1",
    ),
    (
        "tool_use last",
        base(messages=[user("a"), TOOL_USE]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: t1",
    ),
    (
        "tool_use then assistant",
        base(messages=[user("a"), TOOL_USE, {"role": "assistant", "content": "x"}]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: t1",
    ),
    (
        "tool_result after text",
        base(
            messages=[
                user("a"),
                TOOL_USE,
                {"role": "user", "content": [{"type": "text", "text": "x"}, result()]},
            ]
        ),
        "messages.2.content.1: `tool_result` blocks must come before any other content",
    ),
    (
        "tool_result for unknown id",
        base(messages=[user("a"), TOOL_USE, {"role": "user", "content": [result(), result("t9")]}]),
        "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: t9",
    ),
    (
        "tool_result with no preceding assistant",
        base(messages=[user("a"), {"role": "user", "content": [result()]}]),
        "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: t1",
    ),
    (
        "duplicate tool_use ids",
        base(
            messages=[
                user("a"),
                TOOL_USE,
                {"role": "user", "content": [result()]},
                TOOL_USE,
                {"role": "user", "content": [result()]},
            ]
        ),
        "messages.3.content.0: `tool_use` ids must be unique",
    ),
    (
        "tool without name",
        base(tools=[{"input_schema": {"type": "object"}}]),
        "tools.0.name: Field required",
    ),
    (
        "tool name the API refuses",
        base(tools=[{"name": "mcp__my server__read.file", "input_schema": {"type": "object"}}]),
        "tools.0.custom.name: String should match pattern",
    ),
    (
        "custom tool without schema",
        base(tools=[{"name": "x"}]),
        "tools.0.custom.input_schema: Field required",
    ),
    (
        "typed custom tool without schema",
        base(tools=[{"name": "x", "type": "custom"}]),
        "tools.0.custom.input_schema: Field required",
    ),
]


@pytest.mark.parametrize(("body", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
async def test_invalid_requests_get_400_before_the_responder(
    serve: Serve, body: dict[str, Any], message: str
) -> None:
    responder = Counting()
    server = await serve(responder)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(server).post("/v1/messages", cast_to=object, body=body)
    assert caught.value.status_code == 400
    assert caught.value.type == "invalid_request_error"
    assert caught.value.api_message is not None and caught.value.api_message.startswith(message)
    assert responder.requests == []
    assert server.log[0].outcome == f"invalid:{caught.value.api_message}"


async def test_unparseable_json_is_a_400(serve: Serve) -> None:
    responder = Counting()
    server = await serve(responder)
    status, headers, text = await raw_post(server, b"{not json")
    assert status == 400 and headers["request-id"].startswith("req_")
    assert json.loads(text)["error"]["type"] == "invalid_request_error"
    assert responder.requests == []


VALID: list[tuple[str, dict[str, Any]]] = [
    (
        "system message after user",
        base(
            messages=[user("a"), {"role": "system", "content": [{"type": "text", "text": "note"}]}]
        ),
    ),
    (
        "system message mid-conversation",
        base(
            messages=[
                user("a"),
                {"role": "system", "content": "note"},
                {"role": "assistant", "content": "b"},
                user("c"),
            ]
        ),
    ),
    ("consecutive user messages", base(messages=[user("a"), user("b")])),
    (
        "consecutive assistant messages",
        base(
            messages=[
                user("a"),
                {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"},
            ]
        ),
    ),
    (
        "non-empty prefill",
        base(messages=[user("a"), {"role": "assistant", "content": "The answer is"}]),
    ),
    (
        "tool results then text, then a notice",
        base(
            messages=[
                user("a"),
                TOOL_USE,
                {"role": "user", "content": [result(), {"type": "text", "text": "more"}]},
                {"role": "system", "content": "note"},
            ]
        ),
    ),
    ("server tool without input_schema", base(tools=[{"type": "bash_20250124", "name": "bash"}])),
    (
        "empty tool_result content",
        base(
            messages=[
                user("a"),
                TOOL_USE,
                {"role": "user", "content": [result("t1") | {"content": ""}]},
            ]
        ),
    ),
]


@pytest.mark.parametrize("body", [c[1] for c in VALID], ids=[c[0] for c in VALID])
async def test_valid_edge_cases_reach_the_responder(serve: Serve, body: dict[str, Any]) -> None:
    responder = Counting()
    server = await serve(responder)
    reply = await client_for(server).post("/v1/messages", cast_to=object, body=body)
    assert isinstance(reply, dict) and reply["type"] == "message"
    assert len(responder.requests) == 1
    assert server.log[0].outcome == "ok"


def test_validator_accepts_what_the_sdk_builds_from_a_reply() -> None:
    """A transcript of the server's own answers stays valid when sent back."""
    body = base(
        messages=[
            user("a"),
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "x"}, TOOL_USE["content"][0]],
            },
            {"role": "user", "content": [result()]},
        ]
    )
    assert validate_request(body) is body


# ------------------------------------------------------------------------- auth and routing


async def test_wrong_key_is_401_and_never_reaches_the_responder(serve: Serve) -> None:
    responder = Counting()
    server = await serve(responder)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        await client_for(server, key="wrong").messages.create(
            model=MODEL, max_tokens=5, messages=[user("hi")]
        )
    assert caught.value.status_code == 401 and caught.value.api_message == "invalid x-api-key"
    assert responder.requests == []
    assert server.log[0].outcome == "auth"


async def test_x_api_key_header_and_open_servers(serve: Serve) -> None:
    strict = await serve(Counting())
    status, _, _ = await raw_post(strict, base(), headers={"x-api-key": KEY})
    assert status == 200
    status, _, text = await raw_post(strict, base(), headers={"x-api-key": "nope"})
    assert status == 401 and json.loads(text)["error"]["type"] == "authentication_error"
    open_server = await serve(Counting(), api_key=None)
    status, _, _ = await raw_post(open_server, base(), headers={"x-api-key": "anything"})
    assert status == 200


async def test_other_paths_are_404(serve: Serve) -> None:
    server = await serve(Counting())
    with pytest.raises(anthropic.NotFoundError):
        await client_for(server).get("/v1/models", cast_to=object)
    assert server.log[0].outcome == "not_found" and server.log[0].status == 404


async def test_log_redacts_the_key(serve: Serve) -> None:
    secret = "sk-ant-very-secret-123"
    server = await serve(Counting(), api_key=secret)
    await client_for(server, key=secret).messages.create(
        model=MODEL, max_tokens=5, messages=[user("hi")]
    )
    await raw_post(server, base(), headers={"x-api-key": secret})
    first, second = server.log
    assert first.headers["authorization"] == "***"
    assert second.headers["x-api-key"] == "***"
    assert secret not in repr(server.log)


# ------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("fault", "error", "status", "kind"),
    [
        (Fault("overloaded"), anthropic.OverloadedError, 529, "overloaded_error"),
        (Fault("rate_limit", retry_after=2.5), anthropic.RateLimitError, 429, "rate_limit_error"),
        (Fault("server_error"), anthropic.InternalServerError, 500, "api_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_http_faults_map_to_sdk_errors(
    serve: Serve,
    fault: Fault,
    error: type[anthropic.APIStatusError],
    status: int,
    kind: str,
    stream: bool,
) -> None:
    server = await serve(Counting(fault))
    client = client_for(server)
    with pytest.raises(error) as caught:
        if stream:
            async with client.messages.stream(
                model=MODEL, max_tokens=5, messages=[user("hi")]
            ) as s:
                await s.get_final_message()
        else:
            await client.messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])
    assert caught.value.status_code == status and caught.value.type == kind
    assert caught.value.request_id is not None and caught.value.request_id.startswith("req_")
    if fault.kind == "rate_limit":
        assert caught.value.response.headers["retry-after"] == "2.5"
        assert caught.value.response.headers["retry-after-ms"] == "2500"
    assert server.log[0].outcome == f"fault:{fault.kind}"


async def test_sdk_retries_a_fault_and_honours_retry_after(serve: Serve) -> None:
    def responder(request: ScriptedRequest) -> Reply | Fault:
        if request.index == 0:
            return Fault("rate_limit", retry_after=0.01)
        return Reply.text("recovered")

    server = await serve(responder)
    message = await client_for(server, retries=2).messages.create(
        model=MODEL, max_tokens=5, messages=[user("hi")]
    )
    assert message.content[0].type == "text" and message.content[0].text == "recovered"
    assert [e.outcome for e in server.log] == ["fault:rate_limit", "ok"]
    assert server.log[1].headers["x-stainless-retry-count"] == "1"


def cut_mid_body(exc: BaseException) -> bool:
    """Whether the body was cut short: the transport's own error, raised as it is (SDK 2.16)
    or as the cause of a connection error (2.17 and later)."""
    if isinstance(exc, anthropic.APIConnectionError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return isinstance(exc, httpx2.RemoteProtocolError) and "incomplete" in str(exc)


async def test_drop_cuts_the_stream_mid_message(serve: Serve) -> None:
    partial = Reply.text("abcdefghij" * 3)
    server = await serve(Counting(Fault("drop", after_events=4, partial=partial)), chunk_size=10)
    received = ""
    with pytest.raises(Exception) as caught:
        async with client_for(server).messages.stream(
            model=MODEL, max_tokens=5, messages=[user("hi")]
        ) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    received += event.delta.text
    assert cut_mid_body(caught.value)
    # message_start, content_block_start, then two deltas
    assert received == "abcdefghij" * 2
    assert server.log[0].outcome == "fault:drop" and server.log[0].status == 200


async def test_drop_without_streaming_is_a_connection_error(serve: Serve) -> None:
    server = await serve(Counting(Fault("drop")))
    with pytest.raises(anthropic.APIConnectionError):
        await client_for(server).messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])
    assert server.log[0].outcome == "fault:drop"


async def test_drop_never_sends_message_stop(serve: Serve) -> None:
    server = await serve(Counting(Fault("drop", after_events=1000)))
    with pytest.raises(Exception) as caught:
        async with client_for(server).messages.stream(
            model=MODEL, max_tokens=5, messages=[user("hi")]
        ) as stream:
            await stream.get_final_message()
    assert cut_mid_body(caught.value)


async def test_sse_error_event_raises_a_plain_api_status_error(serve: Serve) -> None:
    server = await serve(Counting(Fault("sse_error", after_events=2)))
    events: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        async with client_for(server).messages.stream(
            model=MODEL, max_tokens=5, messages=[user("hi")]
        ) as stream:
            async for event in stream:
                events.append(event.type)
    assert type(caught.value) is anthropic.APIStatusError  # HTTP status was 200
    assert caught.value.status_code == 200 and caught.value.type == "overloaded_error"
    assert events[:2] == ["message_start", "content_block_start"]
    assert "message_stop" not in events


async def test_responder_exception_is_a_non_retryable_500(serve: Serve) -> None:
    def responder(request: ScriptedRequest) -> Reply:
        raise RuntimeError("script bug")

    server = await serve(responder)
    with pytest.raises(anthropic.InternalServerError) as caught:
        await client_for(server, retries=2).messages.create(
            model=MODEL, max_tokens=5, messages=[user("hi")]
        )
    assert "script bug" in str(caught.value)
    assert len(server.log) == 1 and server.log[0].outcome == "error:RuntimeError: script bug"


def test_replies_and_faults_reject_bad_scripts() -> None:
    with pytest.raises(ValueError, match="type must be one of"):
        Reply([{"type": "image"}])
    with pytest.raises(ValueError, match="tool_use needs"):
        Reply([{"type": "tool_use", "name": "x"}])
    with pytest.raises(ValueError, match="stop_reason"):
        Reply.text("x", stop_reason="done")
    with pytest.raises(ValueError, match="kind"):
        Fault("explode")  # type: ignore[arg-type]


# ------------------------------------------------------------------------- concurrency


class Gate:
    """Holds requests inside the responder until released, so overlap is certain."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived = 0
        self.all_arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, request: ScriptedRequest) -> Reply:
        self.arrived += 1
        if self.arrived == self.expected:
            self.all_arrived.set()
        await self.release.wait()
        return Reply.text(f"reply {request.index}")


async def test_max_in_flight_rejects_the_excess_with_429(serve: Serve) -> None:
    gate = Gate(expected=2)
    server = await serve(gate, max_in_flight=2, rate_limit_retry_after=0.25)
    client = client_for(server)

    def ask() -> Awaitable[anthropic.types.Message]:
        return client.messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])

    held = [asyncio.ensure_future(ask()) for _ in range(2)]
    await gate.all_arrived.wait()
    with pytest.raises(anthropic.RateLimitError) as caught:
        await ask()
    assert caught.value.response.headers["retry-after-ms"] == "250"
    gate.release.set()
    answers = await asyncio.gather(*held)
    assert len(answers) == 2
    assert server.max_in_flight_seen == 2
    assert sorted(e.outcome for e in server.log) == ["ok", "ok", "rate_limited"]
    assert server.in_flight == 0


async def test_max_in_flight_seen_counts_overlapping_requests(serve: Serve) -> None:
    gate = Gate(expected=5)
    server = await serve(gate)
    client = client_for(server)
    calls = [
        asyncio.ensure_future(
            client.messages.create(model=MODEL, max_tokens=5, messages=[user(str(i))])
        )
        for i in range(5)
    ]
    await gate.all_arrived.wait()
    assert server.in_flight == 5
    gate.release.set()
    await asyncio.gather(*calls)
    assert server.max_in_flight_seen == 5
    assert server.in_flight == 0
    assert sorted(e.index for e in server.log) == [0, 1, 2, 3, 4]


async def test_sequential_requests_never_overlap(serve: Serve) -> None:
    server = await serve(Counting())
    client = client_for(server)
    for _ in range(3):
        async with client.messages.stream(model=MODEL, max_tokens=5, messages=[user("x")]) as s:
            await s.get_final_message()
    assert server.max_in_flight_seen == 1


# ------------------------------------------------------------------------- caching


def conversation(turns: int) -> list[MessageParam]:
    messages: list[MessageParam] = [user("Please review this repository. " * 20)]
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"Step {i} done. " * 10})
        messages.append(user(f"Continue with step {i + 1}."))
    return messages


SYSTEM = "You are a careful reviewer. " * 30


async def test_top_level_cache_control_gives_cache_reads_on_extension(serve: Serve) -> None:
    server = await serve(Counting())
    client = client_for(server)
    first = await client.messages.create(
        model=MODEL,
        max_tokens=5,
        system=SYSTEM,
        messages=conversation(0),
        cache_control={"type": "ephemeral"},
    )
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens is not None
    assert first.usage.cache_creation_input_tokens > 0
    async with client.messages.stream(
        model=MODEL,
        max_tokens=5,
        system=SYSTEM,
        messages=conversation(1),
        cache_control={"type": "ephemeral"},
    ) as stream:
        second = await stream.get_final_message()
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens is not None
    assert second.usage.cache_creation_input_tokens > 0
    # the same prompt under another model shares nothing
    other = await client.messages.create(
        model="claude-other",
        max_tokens=5,
        system=SYSTEM,
        messages=conversation(1),
        cache_control={"type": "ephemeral"},
    )
    assert other.usage.cache_read_input_tokens == 0


async def test_block_level_cache_control_caches_up_to_the_marker(serve: Serve) -> None:
    server = await serve(Counting())
    client = client_for(server)
    system: Any = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    first = await client.messages.create(
        model=MODEL, max_tokens=5, system=system, messages=[user("question one")]
    )
    second = await client.messages.create(
        model=MODEL, max_tokens=5, system=system, messages=[user("a different question")]
    )
    assert first.usage.cache_creation_input_tokens == second.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens is not None
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens > 0


async def test_writes_up_to_an_hour_long_breakpoint_are_kept_an_hour_and_the_rest_five_minutes(
    serve: Serve,
) -> None:
    server = await serve(Counting())
    client = client_for(server)
    hour: Any = {"type": "ephemeral", "ttl": "1h"}
    system: Any = [{"type": "text", "text": SYSTEM, "cache_control": hour}]
    question: Any = {
        "role": "user",
        "content": [{"type": "text", "text": "x " * 400, "cache_control": {"type": "ephemeral"}}],
    }
    first = await client.messages.create(
        model=MODEL, max_tokens=5, system=system, messages=[question]
    )
    created = first.usage.cache_creation
    assert created is not None
    assert created.ephemeral_1h_input_tokens > 0 and created.ephemeral_5m_input_tokens > 0
    assert first.usage.cache_creation_input_tokens == (
        created.ephemeral_1h_input_tokens + created.ephemeral_5m_input_tokens
    )
    # the system prompt alone, the part kept an hour, is what another question reads back
    other: Any = {"role": "user", "content": "another question"}
    second = await client.messages.create(
        model=MODEL, max_tokens=5, system=system, messages=[other]
    )
    assert second.usage.cache_read_input_tokens == created.ephemeral_1h_input_tokens


async def test_no_cache_control_means_no_cache_accounting(serve: Serve) -> None:
    server = await serve(Counting())
    client = client_for(server)
    totals = []
    for turns in (0, 1, 1):
        message = await client.messages.create(
            model=MODEL, max_tokens=5, system=SYSTEM, messages=conversation(turns)
        )
        assert message.usage.cache_read_input_tokens == 0
        assert message.usage.cache_creation_input_tokens == 0
        totals.append(message.usage.input_tokens)
    assert totals[0] < totals[1] == totals[2]


async def test_the_log_knows_what_the_cache_could_have_served(serve: Serve) -> None:
    """Top-level caching only: a shared system prompt is not read, though it could have been."""
    server = await serve(Counting())
    client = client_for(server)
    for question in ("question one", "a different question"):
        await client.messages.create(
            model=MODEL,
            max_tokens=5,
            system=SYSTEM,
            messages=[user(question)],
            cache_control={"type": "ephemeral"},
        )
    first, second = (entry.usage for entry in server.log)
    assert first is not None and second is not None
    assert first.ideal_read_tokens == 0 and second.cache_read_input_tokens == 0
    assert second.ideal_read_tokens == estimate_tokens({"type": "text", "text": SYSTEM})


async def test_cache_diagnostics_explain_misses(serve: Serve) -> None:
    server = await serve(Counting())
    client = client_for(server)

    async def ask(previous: str | None, **overrides: Any) -> anthropic.types.Message:
        params: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 5,
            "system": SYSTEM,
            "messages": conversation(1),
            "diagnostics": {"previous_message_id": previous},
        }
        params.update(overrides)
        message: anthropic.types.Message = await client.messages.create(**params)
        return message

    first = await ask(None, messages=conversation(0))
    assert first.diagnostics is not None and first.diagnostics.cache_miss_reason is None
    extended = await ask(first.id)
    assert extended.diagnostics is not None and extended.diagnostics.cache_miss_reason is None
    reasons = {}
    changes: dict[str, dict[str, Any]] = {
        "model_changed": {"model": "claude-other"},
        "tools_changed": {"tools": [{"name": "t", "input_schema": {"type": "object"}}]},
        "system_changed": {"system": "Different."},
        "messages_changed": {"messages": [user("Something else entirely.")]},
    }
    for name, overrides in changes.items():
        reply = await ask(first.id, **overrides)
        assert reply.diagnostics is not None and reply.diagnostics.cache_miss_reason is not None
        reasons[name] = reply.diagnostics.cache_miss_reason
    for name, reason in reasons.items():
        assert reason.type == name
        assert getattr(reason, "cache_missed_input_tokens", 0) > 0
    missing = await ask("msg_unknown")
    assert missing.diagnostics is not None and missing.diagnostics.cache_miss_reason is not None
    assert missing.diagnostics.cache_miss_reason.type == "previous_message_not_found"
    plain = await client.messages.create(model=MODEL, max_tokens=5, messages=[user("x")])
    assert plain.diagnostics is None


async def test_streamed_diagnostics_arrive_on_the_final_message(serve: Serve) -> None:
    server = await serve(Counting())
    client = client_for(server)
    first = await client.messages.create(model=MODEL, max_tokens=5, messages=[user("a")])
    async with client.messages.stream(
        model=MODEL,
        max_tokens=5,
        system="changed",
        messages=[user("a")],
        diagnostics={"previous_message_id": first.id},
    ) as stream:
        message = await stream.get_final_message()
    assert message.diagnostics is not None and message.diagnostics.cache_miss_reason is not None
    assert message.diagnostics.cache_miss_reason.type == "system_changed"


# ------------------------------------------------------------------------- threads and CLI


def test_threaded_server_serves_a_sync_client() -> None:
    server = ScriptedServer(lambda request: Reply.text(f"#{request.index}"))
    with server.in_thread():
        with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0) as client:
            with client.messages.stream(model=MODEL, max_tokens=5, messages=[user("hi")]) as s:
                streamed = s.get_final_message()
            created = client.messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])
        assert [e.outcome for e in server.log] == ["ok", "ok"]
    assert streamed.content[0].type == "text" and streamed.content[0].text == "#0"
    assert created.content[0].type == "text" and created.content[0].text == "#1"
    with pytest.raises(RuntimeError):
        _ = server.url


def test_threaded_server_can_restart() -> None:
    server = ScriptedServer(lambda request: Reply.text("x"))
    server.start_in_thread()
    first_url = server.url
    server.stop_thread()
    server.start_in_thread()
    try:
        with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0) as client:
            client.messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])
    finally:
        server.stop_thread()
    assert first_url.startswith("http://127.0.0.1:")
    assert len(server.log) == 1


def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [
        sys.executable,
        "-m",
        "orchmode.testing",
        "--api-key",
        "cli-key",
        "--responder",
        "orchmode.testing.__main__:fallback_responder",
    ]
    with (
        (tmp_path / "stderr.txt").open("w") as stderr,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        ) as process,
    ):
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("listening on http://127.0.0.1:"), line
            url = line.split()[-1]
            with anthropic.Anthropic(base_url=url, api_key="cli-key", max_retries=0) as client:
                message = client.messages.create(model=MODEL, max_tokens=5, messages=[user("hi")])
            assert message.content[0].type == "text"
            assert message.content[0].text == "Scripted reply #0."
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
        finally:
            if process.poll() is None:
                process.kill()
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()


def test_cli_falls_back_when_the_default_responder_is_missing() -> None:
    assert load_responder("orchmode.testing.no_such_module:x", optional=True) is fallback_responder
    with pytest.raises(ModuleNotFoundError):
        load_responder("orchmode.testing.no_such_module:x")


async def test_the_request_log_is_served_as_json_for_other_processes() -> None:
    import aiohttp

    from orchmode.testing.server import LOG_PATH

    async with ScriptedServer(lambda r: Reply.text("hi")) as server:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test-key", max_retries=0)
        await client.messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "first words"}]
        )
        await client.close()
        async with aiohttp.ClientSession() as http:
            async with http.get(server.url + LOG_PATH) as response:
                entries = await response.json()
            async with http.get(server.url + LOG_PATH, params={"bodies": "1"}) as response:
                with_bodies = await response.json()
    assert len(entries) == 1 and "body" not in entries[0]
    assert entries[0]["first_user_text"] == "first words" and entries[0]["status"] == 200
    assert entries[0]["finished"] >= entries[0]["started"]
    assert with_bodies[0]["body"] == server.log[0].body
    assert with_bodies[0]["body"]["messages"][0]["content"] == "first words"


# -------------------------------------------------------------------- fault schedules


async def statuses(client: anthropic.AsyncAnthropic, questions: list[str]) -> list[int]:
    """The HTTP status each question got, asked one after another."""
    got = []
    for question in questions:
        try:
            await client.messages.create(model=MODEL, max_tokens=5, messages=[user(question)])
            got.append(200)
        except anthropic.APIStatusError as exc:
            got.append(exc.status_code)
    return got


async def test_a_schedule_fails_the_requests_it_names_and_passes_the_rest(serve: Serve) -> None:
    schedule = FaultSchedule(Counting(), at={1: Fault("overloaded"), 3: Fault("server_error")})
    server = await serve(schedule)
    got = await statuses(client_for(server), [f"q{i}" for i in range(5)])
    assert got == [200, 529, 200, 500, 200]
    assert schedule.injected == ["overloaded", "server_error"]


async def test_a_rate_fails_a_share_of_bodies_once_each_or_for_good(serve: Serve) -> None:
    """The same body meets the same fate; first_try_only lets its second try through."""
    kinds = [Fault("server_error")]
    once = FaultSchedule(Counting(), rate=0.3, kinds=kinds, seed="s")
    always = FaultSchedule(Counting(), rate=0.3, kinds=kinds, seed="s", first_try_only=False)
    outcomes: dict[str, list[list[int]]] = {}
    for name, schedule in (("once", once), ("always", always)):
        server = await serve(schedule)
        client = client_for(server)
        questions = [f"question {i}" for i in range(100)]
        outcomes[name] = [await statuses(client, questions) for _ in range(2)]
    first, second = outcomes["once"]
    assert 15 <= first.count(500) <= 45 and second.count(500) == 0
    assert outcomes["always"] == [first, first]  # the same bodies, failing every time
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultSchedule(Counting(), rate=1.5)
