"""The scripted server's context features, driven through the real SDK over real HTTP.

A harness that budgets its context (a window, ``count_tokens``, the beta tool-result
clearing) is only tested if the fake refuses and edits prompts the way the API does, so
these tests pin the exact errors, the clearing rules and the token arithmetic that ties
``count_tokens``, ``usage`` and the window together.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import anthropic
import pytest
from anthropic.types.beta import BetaMessage

from conftest import API_KEY, StartServer
from orchmode.core.mode import Notice
from orchmode.core.prompts import NOTICES, REPORT_FINDINGS_TOOL, VERIFY_MARKER, verify_prompt
from orchmode.testing import Reply, ScriptedRequest
from orchmode.testing.cache import CLEARED_TOOL_RESULT
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.testing.server import COUNT_TOKENS_PATH, MESSAGES_PATH, ScriptedServer

pytestmark = pytest.mark.timeout(30)

MODEL = "claude-test-1"
BETA = "context-management-2025-06-27"
EXTRA_INPUTS = "context_management: Extra inputs are not permitted"
UNKNOWN_BETA = (
    f"Unexpected value(s) `{BETA}` for the `anthropic-beta` header. Please consult our"
    " documentation at docs.anthropic.com or try again without the header."
)
TOOLS: list[dict[str, Any]] = [
    {
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
    for name in ("bash", "read")
]

_clients: list[anthropic.AsyncAnthropic] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _clients:
        await _clients.pop().close()


def client_for(server: ScriptedServer) -> anthropic.AsyncAnthropic:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key=API_KEY, max_retries=0)
    _clients.append(client)
    return client


class Recording:
    """A responder that keeps what it was shown and answers a fixed text."""

    def __init__(self) -> None:
        self.requests: list[ScriptedRequest] = []

    def __call__(self, request: ScriptedRequest) -> Reply:
        self.requests.append(request)
        return Reply.text("done")


def conversation(names: list[str], size: int = 800) -> list[Any]:
    """A task, then one tool use per name, each answered by a ``size``-character result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Investigate the repo."}]
    for i, name in enumerate(names):
        tool_id = f"toolu_{i:02d}"
        call = {"type": "tool_use", "id": tool_id, "name": name, "input": {"command": f"cat {i}"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "Next."}, call]})
        output = f"output {i}: " + "abcdefgh" * (size // 8)
        result = {"type": "tool_result", "tool_use_id": tool_id, "content": output}
        messages.append({"role": "user", "content": [result]})
    return messages


def clear(**fields: Any) -> dict[str, Any]:
    return {"edits": [{"type": "clear_tool_uses_20250919", **fields}]}


def low_trigger(**fields: Any) -> dict[str, Any]:
    """An edit that triggers on any of these conversations (they are all > 100 tokens)."""
    return clear(trigger={"type": "input_tokens", "value": 100}, **fields)


def results_seen(request: ScriptedRequest) -> list[Any]:
    """Every tool_result content the model was shown, oldest first."""
    return [
        block["content"]
        for message in request.messages
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]


def inputs_seen(request: ScriptedRequest) -> list[Any]:
    return [
        block["input"]
        for message in request.messages
        if message["role"] == "assistant"
        for block in message["content"]
        if block["type"] == "tool_use"
    ]


def billed(usage: Any) -> int:
    return int(
        usage.input_tokens
        + (usage.cache_read_input_tokens or 0)
        + (usage.cache_creation_input_tokens or 0)
    )


async def count(client: anthropic.AsyncAnthropic, messages: list[Any], **kwargs: Any) -> int:
    """The plain (non-beta) count_tokens answer for this prompt with the test tools."""
    answer = await client.messages.count_tokens(
        model=MODEL, messages=messages, tools=cast(Any, TOOLS), **kwargs
    )
    return answer.input_tokens


async def beta_create(
    client: anthropic.AsyncAnthropic, messages: list[Any], edits: Any
) -> BetaMessage:
    """One non-streaming request with the context-editing beta and these edits."""
    return await client.beta.messages.create(
        model=MODEL,
        max_tokens=10,
        messages=messages,
        tools=cast(Any, TOOLS),
        betas=[BETA],
        context_management=cast(Any, edits),
    )


# ------------------------------------------------------------------------- the context window


async def test_a_prompt_over_the_window_gets_the_apis_400(serve: StartServer) -> None:
    messages = conversation(["bash"] * 3)
    size = await count(client_for(await serve(Recording())), messages)
    responder = Recording()
    server = await serve(responder, context_window=size - 1)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(server).messages.create(
            model=MODEL, max_tokens=10, messages=messages, tools=cast(Any, TOOLS)
        )
    message = f"prompt is too long: {size} tokens > {size - 1} maximum"
    body = cast(dict[str, Any], caught.value.body)
    assert body["type"] == "error" and body["request_id"].startswith("req_")
    assert body["error"] == {"type": "invalid_request_error", "message": message}
    assert caught.value.status_code == 400
    assert server.log[0].outcome == f"invalid:{message}"
    assert server.log[0].prompt_tokens == size
    assert responder.requests == []


async def test_a_prompt_that_just_fits_is_answered_and_billed_its_size(
    serve: StartServer,
) -> None:
    messages = conversation(["bash"] * 3)
    size = await count(client_for(await serve(Recording())), messages)
    server = await serve(Recording(), context_window=size)
    answer = await client_for(server).messages.create(
        model=MODEL, max_tokens=10, messages=messages, tools=cast(Any, TOOLS)
    )
    assert billed(answer.usage) == size
    assert server.log[0].outcome == "ok" and server.log[0].prompt_tokens == size


async def test_the_window_counts_the_prompt_after_clearing(serve: StartServer) -> None:
    messages = conversation(["bash"] * 4, size=2000)
    probe = client_for(await serve(Recording()))
    full = await count(probe, messages)
    edited = await probe.beta.messages.count_tokens(
        model=MODEL,
        messages=messages,
        tools=cast(Any, TOOLS),
        betas=[BETA],
        context_management=cast(Any, low_trigger(keep={"type": "tool_uses", "value": 1})),
    )
    assert edited.input_tokens < full
    server = await serve(Recording(), context_window=edited.input_tokens)
    client = client_for(server)
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        await client.messages.create(
            model=MODEL, max_tokens=10, messages=messages, tools=cast(Any, TOOLS)
        )
    answer = await beta_create(
        client, messages, low_trigger(keep={"type": "tool_uses", "value": 1})
    )
    assert billed(answer.usage) == edited.input_tokens == server.log[1].prompt_tokens


# ------------------------------------------------------------------------- count_tokens


async def test_count_tokens_equals_the_billed_input_of_the_same_prompt(
    serve: StartServer,
) -> None:
    responder = Recording()
    server = await serve(responder)
    client = client_for(server)
    messages = conversation(["bash", "read"])
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    counted = await count(client, messages, system=cast(Any, system))
    for _ in range(2):  # a cache write, then a cache read: the total never changes
        answer = await client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=messages,
            system=cast(Any, system),
            tools=cast(Any, TOOLS),
            cache_control={"type": "ephemeral"},
        )
        assert billed(answer.usage) == counted
    assert answer.usage.cache_read_input_tokens == counted
    assert [e.path for e in server.log] == [COUNT_TOKENS_PATH, MESSAGES_PATH, MESSAGES_PATH]
    assert server.log[0].usage is None and server.log[0].prompt_tokens == counted
    assert len(responder.requests) == 2


async def test_count_tokens_refuses_max_tokens_and_ignores_the_window(
    serve: StartServer,
) -> None:
    server = await serve(Recording(), context_window=10)
    client = client_for(server)
    messages = conversation(["bash"])
    assert await count(client, messages) > 10
    with pytest.raises(anthropic.BadRequestError) as caught:
        await count(client, messages, extra_body={"max_tokens": 5})
    error = cast(dict[str, Any], caught.value.body)["error"]
    assert error["message"] == "max_tokens: Extra inputs are not permitted"
    with pytest.raises(
        anthropic.BadRequestError, match=r"messages\.0: all messages must have non-empty content"
    ):
        await client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": ""}])


async def test_beta_count_tokens_reports_the_size_before_and_after_clearing(
    serve: StartServer,
) -> None:
    server = await serve(Recording())
    client = client_for(server)
    messages = conversation(["bash"] * 4)
    full = await count(client, messages)
    counted = await client.beta.messages.count_tokens(
        model=MODEL,
        messages=messages,
        tools=cast(Any, TOOLS),
        betas=[BETA],
        context_management=cast(Any, low_trigger()),
    )
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == full
    answer = await beta_create(client, messages, low_trigger())
    assert counted.input_tokens == billed(answer.usage) < full
    assert answer.context_management is not None
    assert answer.context_management.applied_edits[0].cleared_input_tokens == (
        full - counted.input_tokens
    )


# ------------------------------------------------------------------------- clearing tool uses


async def test_clearing_replaces_the_oldest_results_and_keeps_the_last_ones(
    serve: StartServer,
) -> None:
    responder = Recording()
    server = await serve(responder)
    client = client_for(server)
    messages = conversation(["bash"] * 5)
    full = await count(client, messages)
    answer = await beta_create(
        client, messages, low_trigger(keep={"type": "tool_uses", "value": 2})
    )
    seen = results_seen(responder.requests[0])
    originals = [m["content"][0]["content"] for m in messages[2::2]]
    assert seen == [CLEARED_TOOL_RESULT] * 3 + originals[3:]
    assert inputs_seen(responder.requests[0]) == [{"command": f"cat {i}"} for i in range(5)]
    assert answer.context_management is not None
    [edit] = answer.context_management.applied_edits
    assert edit.type == "clear_tool_uses_20250919" and edit.cleared_tool_uses == 3
    assert edit.cleared_input_tokens == full - billed(answer.usage) > 0
    entry = server.log[1]
    assert entry.body["messages"] == messages  # the log keeps what the client sent
    assert entry.prompt_tokens == billed(answer.usage)
    assert entry.context_management == {
        "applied_edits": [
            {
                "type": edit.type,
                "cleared_tool_uses": 3,
                "cleared_input_tokens": edit.cleared_input_tokens,
            }
        ]
    }


async def test_a_stream_reports_the_applied_edit_on_message_delta(serve: StartServer) -> None:
    """Default keep (3); excluded tools are never cleared; inputs cleared when asked."""
    responder = Recording()
    server = await serve(responder)
    names = ["bash", "read", "bash", "bash", "read", "bash", "bash"]
    messages = conversation(names)
    edits = low_trigger(exclude_tools=["read"], clear_tool_inputs=True)
    deltas: list[Any] = []
    async with client_for(server).beta.messages.stream(
        model=MODEL,
        max_tokens=10,
        messages=messages,
        tools=cast(Any, TOOLS),
        betas=[BETA],
        context_management=cast(Any, edits),
    ) as stream:
        async for event in stream:
            if event.type == "message_delta":
                deltas.append(event.context_management)
        final = await stream.get_final_message()
    cleared = [
        i
        for i, content in enumerate(results_seen(responder.requests[0]))
        if content == CLEARED_TOOL_RESULT
    ]
    assert cleared == [0, 2, 3]  # bash uses older than the last three uses of any tool
    inputs = inputs_seen(responder.requests[0])
    assert [i for i, value in enumerate(inputs) if value == {}] == [0, 2, 3]
    [delta] = deltas
    assert delta is not None and delta.applied_edits[0].cleared_tool_uses == 3
    assert final.context_management == delta


async def test_clear_tool_inputs_may_name_the_tools_whose_inputs_go(serve: StartServer) -> None:
    responder = Recording()
    server = await serve(responder)
    await client_for(server).beta.messages.create(
        model=MODEL,
        max_tokens=10,
        messages=conversation(["bash", "read", "bash", "read"]),
        tools=cast(Any, TOOLS),
        betas=[BETA],
        context_management=cast(
            Any, low_trigger(keep={"type": "tool_uses", "value": 0}, clear_tool_inputs=["read"])
        ),
    )
    request = responder.requests[0]
    assert results_seen(request) == [CLEARED_TOOL_RESULT] * 4
    assert inputs_seen(request) == [{"command": "cat 0"}, {}, {"command": "cat 2"}, {}]


async def test_an_edit_below_its_trigger_changes_nothing(serve: StartServer) -> None:
    responder = Recording()
    server = await serve(responder)
    client = client_for(server)
    messages = conversation(["bash"] * 5)
    full = await count(client, messages)
    edits = clear(trigger={"type": "input_tokens", "value": full})  # exceeded only above
    answer = await beta_create(client, messages, edits)
    assert answer.context_management is not None
    assert answer.context_management.applied_edits == []
    assert responder.requests[0].messages == messages
    assert billed(answer.usage) == full


@pytest.mark.parametrize(("value", "applied"), [(5, False), (4, True)])
async def test_a_tool_uses_trigger_fires_above_its_value(
    serve: StartServer, value: int, applied: bool
) -> None:
    responder = Recording()
    server = await serve(responder)
    answer = await client_for(server).beta.messages.create(
        model=MODEL,
        max_tokens=10,
        messages=conversation(["bash"] * 5),
        tools=cast(Any, TOOLS),
        betas=[BETA],
        context_management=cast(Any, clear(trigger={"type": "tool_uses", "value": value})),
    )
    assert answer.context_management is not None
    assert len(answer.context_management.applied_edits) == int(applied)
    cleared = results_seen(responder.requests[0]).count(CLEARED_TOOL_RESULT)
    assert cleared == (2 if applied else 0)


async def test_clear_at_least_is_all_or_nothing(serve: StartServer) -> None:
    """Exactly the clearable amount applies; one token more and nothing is cleared."""
    responder = Recording()
    server = await serve(responder)
    client = client_for(server)
    messages = conversation(["bash"] * 5)

    async def ask(minimum: int | None) -> Any:
        extra = (
            {}
            if minimum is None
            else {"clear_at_least": {"type": "input_tokens", "value": minimum}}
        )
        return await beta_create(client, messages, low_trigger(**extra))

    clearable = (await ask(None)).context_management.applied_edits[0].cleared_input_tokens
    assert (await ask(clearable)).context_management.applied_edits[0].cleared_tool_uses == 2
    unmet = await ask(clearable + 1)
    assert unmet.context_management.applied_edits == []
    assert results_seen(responder.requests[-1]).count(CLEARED_TOOL_RESULT) == 0
    assert billed(unmet.usage) == await count(client, messages)


async def test_clearing_breaks_the_cached_prefix_from_the_first_cleared_block(
    serve: StartServer,
) -> None:
    server = await serve(Recording())
    client = client_for(server)
    messages = conversation(["bash"] * 5)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]

    async def ask(edits: dict[str, Any]) -> Any:
        return await client.beta.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=messages,
            system=cast(Any, system),
            tools=cast(Any, TOOLS),
            cache_control={"type": "ephemeral"},
            betas=[BETA],
            context_management=cast(Any, edits),
        )

    dormant = clear()  # the default trigger, 100k tokens, is far away
    await ask(dormant)
    warm = await ask(dormant)
    assert warm.usage.cache_read_input_tokens == billed(warm.usage)
    edited = await ask(low_trigger())
    assert 0 < edited.usage.cache_read_input_tokens < warm.usage.cache_read_input_tokens
    assert edited.usage.cache_creation_input_tokens > 0
    again = await ask(low_trigger())  # the edited prompt is stable, so it caches in turn
    assert again.usage.cache_read_input_tokens == billed(again.usage) == billed(edited.usage)


# ------------------------------------------------------------------------- beta gating


async def test_context_management_without_the_beta_header_is_an_unknown_field(
    serve: StartServer,
) -> None:
    responder = Recording()
    server = await serve(responder)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(server).messages.create(
            model=MODEL,
            max_tokens=10,
            messages=conversation(["bash"]),
            extra_body={"context_management": low_trigger()},
        )
    assert cast(dict[str, Any], caught.value.body)["error"]["message"] == EXTRA_INPUTS
    assert server.log[0].outcome == f"invalid:{EXTRA_INPUTS}" and not responder.requests


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}},
            "context_management.edits.0.keep.value: Input should be greater than or equal to 0",
        ),
        (
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 0}},
            "context_management.edits.0.trigger.value: Input should be greater than or equal to 1",
        ),
        (
            {"type": "clear_tool_uses_20250919", "trigger": {"type": "messages", "value": 3}},
            "context_management.edits.0.trigger.type: Input should be 'input_tokens'"
            " or 'tool_uses'",
        ),
        (
            {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses"}},
            "context_management.edits.0.keep.value: Field required",
        ),
        (
            {"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": True}},
            "context_management.edits.0.keep.value: Input should be a valid integer",
        ),
        (
            {
                "type": "clear_tool_uses_20250919",
                "clear_at_least": {"type": "tool_uses", "value": 1},
            },
            "context_management.edits.0.clear_at_least.type: Input should be 'input_tokens'",
        ),
        (
            {"type": "clear_tool_uses_20250919", "exclude_tools": "bash"},
            "context_management.edits.0.exclude_tools: Input should be a valid list",
        ),
        (
            {"type": "clear_tool_uses_20250919", "clear_tool_inputs": "yes"},
            "context_management.edits.0.clear_tool_inputs: Input should be a valid boolean or list"
            " of strings",
        ),
        (
            {"type": "clear_tool_uses_20250919", "placeholder": "gone"},
            "context_management.edits.0.placeholder: Extra inputs are not permitted",
        ),
        (
            {"type": "clear_thinking_20251015"},
            "context_management.edits.0.type: 'clear_thinking_20251015' is not supported by this"
            " scripted server",
        ),
        (
            {"type": "forget_everything"},
            "context_management.edits.0: Input tag 'forget_everything' found using 'type' does not"
            " match any of the expected tags: 'clear_tool_uses_20250919',"
            " 'clear_thinking_20251015', 'compact_20260112'",
        ),
        (
            {"trigger": {"type": "input_tokens", "value": 5}},
            "context_management.edits.0: Unable to extract tag using discriminator 'type'",
        ),
    ],
)
async def test_malformed_edits_are_400s_that_say_where(
    serve: StartServer, edit: dict[str, Any], message: str
) -> None:
    responder = Recording()
    server = await serve(responder)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client_for(server).beta.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=conversation(["bash"]),
            betas=[BETA],
            context_management=cast(Any, {"edits": [edit]}),
        )
    assert cast(dict[str, Any], caught.value.body)["error"]["message"] == message
    assert not responder.requests


async def test_an_endpoint_without_the_beta_refuses_the_field_and_the_header(
    serve: StartServer,
) -> None:
    responder = Recording()
    server = await serve(responder, context_management=False)
    client = client_for(server)
    messages = conversation(["bash"])
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.beta.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=messages,
            betas=[BETA],
            context_management=cast(Any, low_trigger()),
        )
    assert cast(dict[str, Any], caught.value.body)["error"]["message"] == EXTRA_INPUTS
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.beta.messages.count_tokens(
            model=MODEL, messages=messages, betas=[BETA], context_management=cast(Any, clear())
        )
    assert cast(dict[str, Any], caught.value.body)["error"]["message"] == EXTRA_INPUTS
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.beta.messages.create(
            model=MODEL, max_tokens=10, messages=messages, betas=[BETA]
        )
    assert cast(dict[str, Any], caught.value.body)["error"]["message"] == UNKNOWN_BETA
    assert not responder.requests
    answer = await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
    assert answer.content[0].type == "text"
    assert [e.status for e in server.log] == [400, 400, 400, 200]


# ------------------------------------------------------------------------- transport


async def test_every_connection_has_nagle_disabled(serve: StartServer) -> None:
    server = await serve(Recording())
    client = client_for(server)
    for _ in range(2):  # the second request reuses the keep-alive connection
        async with client.messages.stream(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            await stream.get_final_message()
    await count(client, [{"role": "user", "content": "hi"}])
    assert [e.tcp_nodelay for e in server.log] == [True, True, True]


# ------------------------------------------------------------------------- scenario reports

REPORT_TOOLS = [REPORT_FINDINGS_TOOL, TOOLS[0]]


async def report_of(
    client: anthropic.AsyncAnthropic, first: str, command_output: str = "/work"
) -> dict[str, Any]:
    """The report_findings input a scripted worker (or verifier) sends after one command."""
    messages = [
        {"role": "user", "content": first},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "pwd"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": command_output}],
        },
    ]
    answer = await client.messages.create(
        model=MODEL, max_tokens=4000, messages=cast(Any, messages), tools=cast(Any, REPORT_TOOLS)
    )
    [call] = [b for b in answer.content if b.type == "tool_use"]
    assert call.name == "report_findings"
    return cast(dict[str, Any], call.input)


def sentences(text: str) -> int:
    return len(re.findall(r"[.!?](?:\s|$)", text))


async def test_scenario_reports_have_the_size_asked_for_and_are_reproducible(
    serve: StartServer,
) -> None:
    scenario = OrchestrationScenario(report_bytes=6000, verifier_command="ls")
    client = client_for(await serve(scenario))
    first = await report_of(client, "Review the cache layer", command_output="one")
    again = await report_of(client, "Review the cache layer", command_output="other")
    other = await report_of(client, "Review the CLI")
    assert first == again  # the subtask alone decides the report
    assert other != first
    for report in (first, other):
        size = len(json.dumps(report["findings"]))
        assert 5400 <= size <= 6600, size
        severities = [f["severity"] for f in report["findings"]]
        assert severities.count("high") <= 2 and 1 <= severities.count("medium") <= 3
        assert set(severities) <= {"high", "medium", "low", "info"}
        assert severities.count("low") + severities.count("info") >= len(severities) // 2
        assert 2 <= sentences(report["summary"]) <= 3
        for finding in report["findings"]:
            assert sentences(finding["claim"]) == 1
            lines = finding["evidence"].split("\n")
            assert re.fullmatch(r"[\w/.]+\.py:\d+", lines[0]) and lines[1].startswith("$ ")
            assert len(lines) >= 3


async def test_verifier_reports_can_be_sized_too_and_keep_the_verdict(
    serve: StartServer,
) -> None:
    scenario = OrchestrationScenario(
        verifier_report_bytes=2000, verifier_command="ls", verdict=lambda _: "refuted"
    )
    client = client_for(await serve(scenario))
    prompt = verify_prompt("Review the cache layer", '{"summary": "Finished", "findings": []}')
    assert prompt.startswith(VERIFY_MARKER)
    report = await report_of(client, prompt)
    assert report["summary"].startswith("refuted: ")
    assert 1800 <= len(json.dumps(report["findings"])) <= 2200
    assert report == await report_of(client, prompt)


async def test_unsized_reports_are_unchanged(serve: StartServer) -> None:
    client = client_for(await serve(OrchestrationScenario(verifier_command="ls")))
    report = await report_of(client, "Check item 1", command_output="/work/dir")
    assert report == {
        "summary": "Finished: Check item 1",
        "findings": [{"claim": "Check item 1 holds", "evidence": "/work/dir", "severity": "info"}],
    }
    verdict = await report_of(client, verify_prompt("Check item 1", "fine"))
    assert verdict["summary"] == "confirmed: re-checked the claim"
    assert len(verdict["findings"]) == 1


async def test_the_synthesis_counts_condensed_and_json_verdicts(serve: StartServer) -> None:
    workflow = {
        "name": "Workflow",
        "description": "Fan out.",
        "input_schema": {"type": "object", "properties": {}},
    }
    result = "\n\n".join(
        [
            "[agent 1: cache]\nFinished: cache.",
            "[verify 1] (report: verify-1.json)\nconfirmed: the lock is held across await",
            "[agent 2: cli]\nFinished: cli.",
            "[verify 2]\nrefuted: no such flag",
            "[agent 3: db]\nFinished: db.",
            "[verify 3] confirmed: the query is formatted",
            "[agent 4: http]\nFinished: http.",
            '[verify 4]\n{"summary": "confirmed: re-checked", "findings": []}',
            "[budget: 8 subagents in this session; 12 subagents left]",
        ]
    )
    messages = [
        {"role": "user", "content": "Review it."},
        {"role": "system", "content": NOTICES[Notice.ENTER]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "bash", "input": {"command": "ls"}}
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t2", "name": "Workflow", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t2", "content": result}],
        },
    ]
    client = client_for(await serve(OrchestrationScenario()))
    answer = await client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=cast(Any, messages),
        tools=cast(Any, [workflow, TOOLS[0]]),
    )
    assert answer.content[0].type == "text"
    assert answer.content[0].text == "Synthesis: 4 agents reported; 3 results were confirmed."
