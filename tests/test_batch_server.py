"""The scripted server's Message Batches endpoints, driven by the SDK's own batch client.

Batch mode in orchmode is tested against these endpoints alone, so they are pinned down
here as the API defines them: the batch object and its life, list pagination, the JSONL
results, every refusal of a bad create body, and the scripting a test needs (outcomes,
delay, expiry, cancel, and the count of every ``custom_id`` submitted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from orchmode.testing import BatchFate, BatchSettings, Fault, Reply, ScriptedRequest, ScriptedServer

pytestmark = pytest.mark.timeout(60)

KEY = "test-key"
MODEL = "claude-test-1"


def params(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def echo(request: ScriptedRequest) -> Reply:
    return Reply.text(f"{request.custom_id}: {request.last_user_text}")


_clients: list[anthropic.AsyncAnthropic] = []


@pytest.fixture
async def start() -> AsyncIterator[Any]:
    """Start scripted servers and SDK clients on this test's loop; all closed at the end."""
    servers: list[ScriptedServer] = []

    async def serve(
        responder: Any = echo, **settings: Any
    ) -> tuple[ScriptedServer, anthropic.AsyncAnthropic]:
        server = ScriptedServer(responder, api_key=KEY, batches=BatchSettings(**settings))
        await server.start()
        servers.append(server)
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key=KEY, max_retries=0)
        _clients.append(client)
        return server, client

    yield serve
    while _clients:
        await _clients.pop().close()
    for server in servers:
        await server.stop()


async def until_ended(client: anthropic.AsyncAnthropic, batch_id: str) -> MessageBatch:
    """Poll the batch as a client would, until it has ended."""
    while True:
        batch = await client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        await asyncio.sleep(0.01)


async def results_of(
    client: anthropic.AsyncAnthropic, batch_id: str
) -> dict[str, MessageBatchIndividualResponse]:
    return {line.custom_id: line async for line in await client.messages.batches.results(batch_id)}


async def refusal(call: Any) -> anthropic.APIStatusError:
    """The API error a call ends in (the test fails if it succeeds)."""
    with pytest.raises(anthropic.APIStatusError) as caught:
        await call
    return caught.value


def message_of(error: anthropic.APIStatusError) -> str:
    assert isinstance(error.body, dict)
    return str(error.body["error"]["message"])


# --------------------------------------------------------------------------- the batch's life


async def test_a_batch_waits_its_delay_then_every_request_succeeds(start: Any) -> None:
    server, client = await start(delay=0.3)
    requests = [{"custom_id": f"job-{n}", "params": params(f"task {n}")} for n in range(3)]

    created = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]

    assert created.type == "message_batch"
    assert created.processing_status == "in_progress"
    assert created.request_counts.processing == 3
    assert created.request_counts.succeeded == 0
    assert created.results_url is None and created.ended_at is None
    assert (created.expires_at - created.created_at).total_seconds() == pytest.approx(86400)
    ended = await until_ended(client, created.id)
    assert ended.ended_at is not None
    assert (ended.ended_at - created.created_at).total_seconds() >= 0.3
    assert ended.request_counts.succeeded == 3 and ended.request_counts.processing == 0
    assert ended.results_url == f"{server.url}/v1/messages/batches/{created.id}/results"
    results = await results_of(client, created.id)
    assert sorted(results) == ["job-0", "job-1", "job-2"]
    for n in range(3):
        result = results[f"job-{n}"].result
        assert result.type == "succeeded"
        assert result.message.content[0].type == "text"
        assert result.message.content[0].text == f"job-{n}: task {n}"
        assert result.message.usage.output_tokens > 0


async def test_a_test_can_end_a_batch_without_waiting_its_delay(start: Any) -> None:
    server, client = await start(delay=3600)
    created = await client.messages.batches.create(
        requests=[{"custom_id": "now", "params": params()}]  # type: ignore[list-item]
    )
    assert (await client.messages.batches.retrieve(created.id)).processing_status == "in_progress"

    server.batches.finish(created.id)

    ended = await until_ended(client, created.id)
    assert ended.request_counts.succeeded == 1


async def test_the_responder_sees_each_batched_requests_custom_id(start: Any) -> None:
    seen: list[tuple[bool, str | None, str | None]] = []

    def responder(request: ScriptedRequest) -> Reply:
        seen.append((request.batched, request.batch_id, request.custom_id))
        return Reply.text("ok")

    server, client = await start(responder)
    await client.messages.create(**params())  # type: ignore[call-overload]
    created = await client.messages.batches.create(
        requests=[{"custom_id": c, "params": params(c)} for c in ("alpha", "beta")]  # type: ignore[misc]
    )
    await until_ended(client, created.id)

    assert seen[0] == (False, None, None)
    assert sorted(seen[1:]) == [(True, created.id, "alpha"), (True, created.id, "beta")]
    assert server.responder_calls == 3


async def test_batched_requests_share_the_prompt_cache_with_interactive_ones(start: Any) -> None:
    server, client = await start()
    system = [{"type": "text", "text": "rules " * 800, "cache_control": {"type": "ephemeral"}}]
    first = await client.messages.create(**params(system=system))  # type: ignore[call-overload]
    created = await client.messages.batches.create(
        requests=[{"custom_id": "again", "params": params(system=system)}]  # type: ignore[list-item]
    )
    await until_ended(client, created.id)

    result = (await results_of(client, created.id))["again"].result
    assert result.type == "succeeded"
    assert first.usage.cache_creation_input_tokens > 0
    assert result.message.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert result.message.usage.cache_creation_input_tokens == 0
    item = server.batches.all()[0].items[0]
    assert item.usage is not None
    assert item.usage.cache_read_input_tokens == result.message.usage.cache_read_input_tokens
    assert item.billed is not None
    assert item.billed.output_tokens == result.message.usage.output_tokens


async def test_a_hundred_kilobyte_result_comes_back_whole(start: Any) -> None:
    report = "".join(f"line {n}: " + "x" * 90 + "\n" for n in range(1000))
    assert len(report) > 100_000
    _, client = await start(lambda request: Reply.text(report))
    created = await client.messages.batches.create(
        requests=[
            {"custom_id": "big", "params": params()},
            {"custom_id": "small", "params": params()},
        ]  # type: ignore[list-item]
    )
    await until_ended(client, created.id)

    results = await results_of(client, created.id)
    for custom_id in ("big", "small"):
        result = results[custom_id].result
        assert result.type == "succeeded"
        assert result.message.content[0].type == "text"
        assert result.message.content[0].text == report


def test_the_sync_batch_client_works_too(scripted: Any) -> None:
    server = scripted(echo, batches=BatchSettings(delay=0.05))
    with anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0) as client:
        created = client.messages.batches.create(
            requests=[{"custom_id": "sync-1", "params": params("hi")}]  # type: ignore[list-item]
        )
        while (batch := client.messages.batches.retrieve(created.id)).processing_status != "ended":
            time.sleep(0.01)
        assert batch.request_counts.succeeded == 1
        [line] = list(client.messages.batches.results(created.id))
        assert line.custom_id == "sync-1"
        assert line.result.type == "succeeded"
        assert [b.id for b in client.messages.batches.list()] == [created.id]
        assert client.messages.batches.delete(created.id).type == "message_batch_deleted"


# --------------------------------------------------------------------------- list


async def test_list_pages_through_every_batch_newest_first(start: Any) -> None:
    _, client = await start(delay=3600)
    ids = []
    for n in range(5):
        requests = [{"custom_id": f"b{n}", "params": params()}]
        ids.append((await client.messages.batches.create(requests=requests)).id)  # type: ignore[arg-type]
    newest_first = ids[::-1]

    first = await client.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == newest_first[:2]
    assert first.has_more is True
    assert (first.first_id, first.last_id) == (newest_first[0], newest_first[1])
    assert [b.id async for b in client.messages.batches.list(limit=2)] == newest_first

    after = await client.messages.batches.list(after_id=newest_first[1], limit=2)
    assert [b.id for b in after.data] == newest_first[2:4] and after.has_more is True
    last = await client.messages.batches.list(after_id=newest_first[3], limit=2)
    assert [b.id for b in last.data] == newest_first[4:] and last.has_more is False
    before = await client.messages.batches.list(before_id=newest_first[4], limit=2)
    assert [b.id for b in before.data] == newest_first[2:4] and before.has_more is True
    error = await refusal(client.messages.batches.list(limit=1001))
    assert error.status_code == 400


# --------------------------------------------------------------------------- outcomes


async def test_a_responder_can_make_requests_errored_expired_or_canceled(start: Any) -> None:
    answers: dict[str, Reply | Fault | BatchFate] = {
        "fine": Reply.text("ok"),
        "broken": BatchFate.errored("invalid_request_error", "scripted: no such tool"),
        "late": BatchFate.expired(),
        "dropped": BatchFate.canceled(),
        "overloaded": Fault("overloaded"),
    }
    _, client = await start(lambda request: answers[str(request.custom_id)])
    created = await client.messages.batches.create(
        requests=[{"custom_id": c, "params": params()} for c in answers]  # type: ignore[misc]
    )

    ended = await until_ended(client, created.id)

    counts = ended.request_counts
    assert (counts.succeeded, counts.errored, counts.expired, counts.canceled) == (1, 2, 1, 1)
    results = {c: line.result for c, line in (await results_of(client, created.id)).items()}
    assert results["fine"].type == "succeeded"
    assert results["late"].type == "expired"
    assert results["dropped"].type == "canceled"
    broken = results["broken"]
    assert broken.type == "errored"
    assert broken.error.error.type == "invalid_request_error"
    assert broken.error.error.message == "scripted: no such tool"
    overloaded = results["overloaded"]
    assert overloaded.type == "errored" and overloaded.error.error.type == "overloaded_error"


async def test_a_batch_past_its_expiry_ends_with_every_request_expired(start: Any) -> None:
    server, client = await start(delay=3600, expiry=0.2)
    created = await client.messages.batches.create(
        requests=[{"custom_id": c, "params": params()} for c in ("x", "y")]  # type: ignore[misc]
    )

    ended = await until_ended(client, created.id)

    assert ended.request_counts.expired == 2
    assert {line.result.type for line in (await results_of(client, created.id)).values()} == {
        "expired"
    }
    assert server.responder_calls == 0


async def test_cancel_turns_requests_still_processing_into_canceled(start: Any) -> None:
    def responder(request: ScriptedRequest) -> Reply:
        return Reply.text("done", delay=0 if request.custom_id == "quick" else 30)

    server, client = await start(responder, cancel_delay=0.2)
    created = await client.messages.batches.create(
        requests=[{"custom_id": c, "params": params()} for c in ("quick", "slow")]  # type: ignore[misc]
    )
    server.batches.finish(created.id)
    while server.batches.all()[0].items[0].result is None:  # the quick one is answered
        await asyncio.sleep(0.01)

    canceling = await client.messages.batches.cancel(created.id)

    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None
    assert (await client.messages.batches.retrieve(created.id)).processing_status == "canceling"
    ended = await until_ended(client, created.id)
    assert (ended.request_counts.succeeded, ended.request_counts.canceled) == (1, 1)
    results = await results_of(client, created.id)
    assert results["quick"].result.type == "succeeded"
    assert results["slow"].result.type == "canceled"


async def test_an_ended_batch_can_be_deleted_but_not_canceled(start: Any) -> None:
    _, client = await start(delay=3600)
    created = await client.messages.batches.create(
        requests=[{"custom_id": "one", "params": params()}]  # type: ignore[list-item]
    )
    still = await refusal(client.messages.batches.delete(created.id))
    assert still.status_code == 400 and still.type == "invalid_request_error"  # type: ignore[attr-defined]

    await client.messages.batches.cancel(created.id)
    await until_ended(client, created.id)
    again = await refusal(client.messages.batches.cancel(created.id))
    assert isinstance(again, anthropic.BadRequestError)
    assert "already ended" in message_of(again)

    deleted = await client.messages.batches.delete(created.id)
    assert (deleted.id, deleted.type) == (created.id, "message_batch_deleted")
    gone = await refusal(client.messages.batches.retrieve(created.id))
    assert isinstance(gone, anthropic.NotFoundError)
    assert [b.id async for b in client.messages.batches.list()] == []


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("custom_id", "problem"),
    [
        ("", "String should have at least 1 character"),
        ("x" * 65, "String should have at most 64 characters"),
        ("has space", "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"),
        ("dot.ted", "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'"),
        (7, "Input should be a valid string"),
    ],
)
async def test_a_bad_custom_id_is_refused(start: Any, custom_id: Any, problem: str) -> None:
    server, client = await start()
    requests = [
        {"custom_id": "fine", "params": params()},
        {"custom_id": custom_id, "params": params()},
    ]

    error = await refusal(client.messages.batches.create(requests=requests))  # type: ignore[arg-type]

    assert isinstance(error, anthropic.BadRequestError)
    assert message_of(error) == f"requests.1.custom_id: {problem}"
    assert server.batches.submissions == {} and server.batches.all() == []


async def test_a_custom_id_used_twice_in_one_batch_is_refused(start: Any) -> None:
    _, client = await start()
    requests = [{"custom_id": "same", "params": params()} for _ in range(2)]

    error = await refusal(client.messages.batches.create(requests=requests))  # type: ignore[arg-type]

    assert error.status_code == 400
    assert message_of(error).startswith("requests.1.custom_id: 'same' is already used")


async def errored_alone(client: anthropic.AsyncAnthropic, bad: dict[str, Any]) -> Any:
    """Send ``bad`` in a batch beside a good request; the error of its result, once the
    batch has ended (the good one must have succeeded)."""
    requests = [{"custom_id": "bad", "params": bad}, {"custom_id": "good", "params": params()}]
    batch = await client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    ended = await until_ended(client, batch.id)
    assert (ended.request_counts.errored, ended.request_counts.succeeded) == (1, 1)
    results = await results_of(client, batch.id)
    assert results["good"].result.type == "succeeded"
    result = results["bad"].result
    assert result.type == "errored"
    return result.error.error


async def test_streaming_inside_a_batch_ends_its_request_errored(start: Any) -> None:
    _, client = await start()
    error = await errored_alone(client, params(stream=True))
    assert error.type == "invalid_request_error"
    assert error.message.startswith("stream:")


@pytest.mark.parametrize(
    "bad",
    [
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        params(max_tokens=0),
        {**params(), "messages": []},
        {**params(), "messages": [{"role": "user", "content": ""}]},
        {
            **params(),
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
                },
                {"role": "user", "content": "no result"},
            ],
        },
    ],
    ids=["no-max-tokens", "zero-max-tokens", "no-messages", "empty-text", "orphan-tool-use"],
)
async def test_bad_params_end_errored_with_the_message_the_messages_endpoint_gives(
    start: Any, bad: dict[str, Any]
) -> None:
    """The API checks a batched request's params only once the batch runs: the batch is
    taken, and the request ends errored with the complaint /v1/messages makes."""
    _, client = await start()
    interactive = await refusal(client.post("/v1/messages", body=bad, cast_to=object))
    error = await errored_alone(client, bad)
    assert interactive.status_code == 400
    assert error.type == "invalid_request_error"
    assert error.message == message_of(interactive)


async def test_the_request_count_and_body_size_limits(start: Any) -> None:
    _, client = await start(max_requests=3, max_body_bytes=4000)
    three = [{"custom_id": f"r{n}", "params": params()} for n in range(3)]
    await client.messages.batches.create(requests=three)  # type: ignore[arg-type]

    many = await refusal(
        client.messages.batches.create(requests=[*three, three[0] | {"custom_id": "r3"}])
    )  # type: ignore[arg-type]
    empty = await refusal(client.messages.batches.create(requests=[]))
    large = await refusal(
        client.messages.batches.create(
            requests=[{"custom_id": "big", "params": params("x" * 5000)}]  # type: ignore[list-item]
        )
    )

    assert message_of(many) == "requests: List should have at most 3 items after validation, not 4"
    assert message_of(empty) == "requests: List should have at least 1 item after validation, not 0"
    assert large.status_code == 413
    assert large.type == "request_too_large"  # type: ignore[attr-defined]


async def test_an_unknown_batch_is_not_found(start: Any) -> None:
    server, client = await start()
    batches = client.messages.batches
    for call in (
        batches.retrieve("msgbatch_nope"),
        batches.cancel("msgbatch_nope"),
        batches.delete("msgbatch_nope"),
    ):
        error = await refusal(call)
        assert isinstance(error, anthropic.NotFoundError)
        assert error.type == "not_found_error"  # type: ignore[attr-defined]
    async with httpx2.AsyncClient() as http:
        url = f"{server.url}/v1/messages/batches/msgbatch_nope/results"
        raw = await http.get(url, headers={"x-api-key": KEY})
    assert raw.status_code == 404


async def test_results_before_the_batch_ends_are_refused(start: Any) -> None:
    server, client = await start(delay=3600)
    created = await client.messages.batches.create(
        requests=[{"custom_id": "wait", "params": params()}]  # type: ignore[list-item]
    )
    with pytest.raises(anthropic.AnthropicError, match="Has it finished processing"):
        await client.messages.batches.results(created.id)

    async with httpx2.AsyncClient() as http:
        raw = await http.get(
            f"{server.url}/v1/messages/batches/{created.id}/results", headers={"x-api-key": KEY}
        )

    assert raw.status_code == 400
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert "has not ended" in raw.json()["error"]["message"]


async def test_the_batch_endpoints_need_the_api_key(start: Any) -> None:
    server, _ = await start()
    async with anthropic.AsyncAnthropic(
        base_url=server.url, api_key="wrong", max_retries=0
    ) as stranger:
        create = stranger.messages.batches.create(
            requests=[{"custom_id": "k", "params": params()}]  # type: ignore[list-item]
        )
        for call in (create, stranger.messages.batches.list()):
            error = await refusal(call)
            assert isinstance(error, anthropic.AuthenticationError)
    assert server.batches.submissions == {}


# --------------------------------------------------------------------------- bookkeeping


async def test_every_submission_of_a_custom_id_is_counted(start: Any) -> None:
    server, client = await start()
    first = [{"custom_id": c, "params": params()} for c in ("a", "b")]
    await client.messages.batches.create(requests=first)  # type: ignore[arg-type]
    await client.messages.batches.create(requests=first[:1])  # type: ignore[arg-type]
    await refusal(
        client.messages.batches.create(
            requests=[{"custom_id": "c d", "params": params()}]  # type: ignore[list-item]
        )
    )

    assert server.batches.submissions == {"a": 2, "b": 1}
    assert [[i.custom_id for i in b.items] for b in server.batches.all()] == [["a", "b"], ["a"]]
    paths = [(e.method, e.path, e.status) for e in server.log]
    assert paths.count(("POST", "/v1/messages/batches", 200)) == 2
    assert paths.count(("POST", "/v1/messages/batches", 400)) == 1


async def test_a_batch_fate_for_an_interactive_request_is_a_server_error(start: Any) -> None:
    _, client = await start(lambda request: BatchFate.expired())

    error = await refusal(client.messages.create(**params()))  # type: ignore[call-overload]

    assert error.status_code == 500
    assert "BatchFate" in message_of(error)
