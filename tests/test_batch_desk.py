"""The batch desk against the scripted batch endpoints: gathering, results, never paying twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest

from orchmode.model.batch_ids import custom_id
from orchmode.model.batches import BatchDesk, BatchFailed
from orchmode.store import Store, open_store
from orchmode.testing import (
    BatchFate,
    BatchSettings,
    Fault,
    FaultKind,
    Reply,
    ScriptedRequest,
    ScriptedServer,
)

pytestmark = pytest.mark.timeout(60)

KEY = "test-key"


def params(text: str) -> dict[str, Any]:
    return {
        "model": "claude-test-1",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
    }


def echo(request: ScriptedRequest) -> Reply:
    return Reply.text(f"said: {request.last_user_text}")


class Bench:
    """A scripted server with batch endpoints, an SDK client on it, and a SQLite store."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.servers: list[ScriptedServer] = []
        self.clients: list[anthropic.AsyncAnthropic] = []
        self.stores: list[Store] = []
        self.desks: list[BatchDesk] = []

    async def serve(
        self, responder: Callable[[ScriptedRequest], Any] = echo, **settings: Any
    ) -> ScriptedServer:
        server = ScriptedServer(responder, api_key=KEY, batches=BatchSettings(**settings))
        await server.start()
        self.servers.append(server)
        return server

    async def desk(self, server: ScriptedServer, **options: Any) -> BatchDesk:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key=KEY, max_retries=0)
        self.clients.append(client)
        store = await open_store(f"sqlite://{self.tmp_path / 'store.db'}")
        self.stores.append(store)
        options = {"window": 0.05, "first_poll": 0.01, **options}
        made = BatchDesk(store, "s1", client.messages.batches, **options)
        self.desks.append(made)
        return made

    async def close(self) -> None:
        for made in self.desks:
            await made.close()
        for client in self.clients:
            await client.close()
        for store in self.stores:
            await store.close()
        for server in self.servers:
            await server.stop()


@pytest.fixture
async def bench(tmp_path: Path) -> AsyncIterator[Bench]:
    made = Bench(tmp_path)
    yield made
    await made.close()


def text_of(message: Any) -> str:
    return "".join(block.get("text", "") for block in message["content"])


async def test_requests_ready_together_go_in_one_batch_and_each_gets_its_own_result(
    bench: Bench,
) -> None:
    server = await bench.serve(delay=0.1)
    desk = await bench.desk(server)
    results = await asyncio.gather(*(desk.ask(params(f"task {n}")) for n in range(40)))
    assert [r.outcome for r in results] == ["succeeded"] * 40
    assert [text_of(r.message) for r in results] == [f"said: task {n}" for n in range(40)]
    assert len(server.batches.all()) == 1
    assert sorted(server.batches.submissions.values()) == [1] * 40


async def test_a_full_batch_is_sent_at_once_and_the_rest_go_in_the_next(bench: Bench) -> None:
    server = await bench.serve()
    desk = await bench.desk(server, window=30.0, max_requests=10)
    results = await asyncio.gather(*(desk.ask(params(f"t{n}")) for n in range(20)))
    assert all(r.outcome == "succeeded" for r in results)
    assert sorted(len(batch.items) for batch in server.batches.all()) == [10, 10]


async def test_a_resumed_run_takes_a_sent_requests_result_from_its_batch(bench: Bench) -> None:
    server = await bench.serve(delay=0.2)
    first = await bench.desk(server)
    asking = asyncio.ensure_future(first.ask(params("only once")))
    while not server.batches.all():  # the batch is created; the run stops before its end
        await asyncio.sleep(0.01)
    asking.cancel()
    await first.close()
    again = await bench.desk(server)
    result = await again.ask(params("only once"))
    assert text_of(result.message) == "said: only once"
    assert server.batches.submissions == {custom_id(params("only once")): 1}


async def test_a_request_recorded_just_before_its_batch_was_created_is_found_by_listing(
    bench: Bench,
) -> None:
    server = await bench.serve(delay=0.05)
    desk = await bench.desk(server)
    body = params("sent, but its batch id never recorded")
    cid = custom_id(body)
    # As a run killed between the API's answer and recording the id leaves it: recorded
    # with no batch, and the batch made at the API, among others.
    await desk.store.record_batch_requests("s1", [cid])
    client = bench.clients[0]
    await client.messages.batches.create(requests=[{"custom_id": "other-0", "params": params("x")}])
    await client.messages.batches.create(requests=[{"custom_id": cid, "params": body}])
    result = await desk.ask(body)
    assert text_of(result.message) == "said: sent, but its batch id never recorded"
    assert server.batches.submissions[cid] == 1
    found = await desk.store.batch_request(cid)
    assert found is not None and found.batch_id


async def test_a_request_recorded_but_never_sent_is_sent_once(bench: Bench) -> None:
    server = await bench.serve()
    desk = await bench.desk(server)
    body = params("recorded, then the run stopped before the batch was created")
    await desk.store.record_batch_requests("s1", [custom_id(body)])
    result = await desk.ask(body)
    assert result.outcome == "succeeded"
    assert server.batches.submissions == {custom_id(body): 1}


@pytest.mark.parametrize("fate", [BatchFate.errored(), BatchFate.expired(), BatchFate.canceled()])
async def test_a_failed_result_says_why_and_the_next_attempt_is_a_new_request(
    bench: Bench, fate: BatchFate
) -> None:
    asked: list[str] = []

    def once_failing(request: ScriptedRequest) -> Reply | BatchFate:
        asked.append(str(request.custom_id))
        return fate if len(asked) == 1 else echo(request)

    server = await bench.serve(once_failing)
    desk = await bench.desk(server)
    failed = await desk.ask(params("flaky"))
    assert failed.outcome == fate.kind and failed.message is None
    retried = await desk.ask(params("flaky"), attempt=1)
    assert text_of(retried.message) == "said: flaky"
    assert asked == [custom_id(params("flaky"), 0), custom_id(params("flaky"), 1)]


async def test_cancel_ends_the_batches_in_flight_with_canceled_results(bench: Bench) -> None:
    server = await bench.serve(delay=30.0)
    desk = await bench.desk(server)
    asking = [asyncio.ensure_future(desk.ask(params(f"slow {n}"))) for n in range(3)]
    while not server.batches.all():
        await asyncio.sleep(0.01)
    await desk.cancel()
    results = await asyncio.gather(*asking)
    assert [r.outcome for r in results] == ["canceled"] * 3


async def test_cancel_sends_nothing_still_being_gathered(bench: Bench) -> None:
    server = await bench.serve()
    desk = await bench.desk(server, window=30.0)
    asking = asyncio.ensure_future(desk.ask(params("not sent yet")))
    while not desk._gathering:
        await asyncio.sleep(0.01)
    await desk.cancel()
    result = await asking
    assert result.outcome == "canceled"
    assert server.batches.all() == []
    assert await desk.store.batch_request(custom_id(params("not sent yet"))) is None


async def test_a_request_with_bad_params_ends_errored_and_its_batch_is_answered(
    bench: Bench,
) -> None:
    server = await bench.serve()
    desk = await bench.desk(server)
    bad = {**params("bad"), "max_tokens": -1}
    refused, fine = await asyncio.gather(desk.ask(bad), desk.ask(params("fine")))
    assert (refused.outcome, refused.error_type) == ("errored", "invalid_request_error")
    assert "max_tokens" in refused.error
    assert text_of(fine.message) == "said: fine"
    assert len(server.batches.all()) == 1


@pytest.mark.parametrize("kind", ["overloaded", "rate_limit", "server_error"])
async def test_a_create_turned_away_as_busy_is_tried_again_and_nothing_is_sent_twice(
    bench: Bench, kind: FaultKind
) -> None:
    server = await bench.serve(create_faults=(Fault(kind), Fault(kind)))
    desk = await bench.desk(server)
    results = await asyncio.gather(*(desk.ask(params(f"t{n}")) for n in range(5)))
    assert [text_of(r.message) for r in results] == [f"said: t{n}" for n in range(5)]
    assert len(server.batches.all()) == 1
    assert set(server.batches.submissions.values()) == {1}
    creates = [e.status for e in server.log if e.path == "/v1/messages/batches"]
    assert creates.count(200) == 1 and len(creates) == 3


async def test_a_batch_made_whose_answer_was_lost_is_found_and_not_sent_again(
    bench: Bench,
) -> None:
    server = await bench.serve(delay=0.05, create_faults=(Fault("drop"),))
    desk = await bench.desk(server)
    results = await asyncio.gather(*(desk.ask(params(f"t{n}")) for n in range(5)))
    assert [text_of(r.message) for r in results] == [f"said: t{n}" for n in range(5)]
    assert len(server.batches.all()) == 1
    assert set(server.batches.submissions.values()) == {1}
    found = await desk.store.batch_request(custom_id(params("t0")))
    assert found is not None and found.batch_id == server.batches.all()[0].id


async def test_a_batch_the_api_refuses_fails_every_request_in_it(bench: Bench) -> None:
    server = await bench.serve(max_body_bytes=2000)
    desk = await bench.desk(server)
    asking = [desk.ask(params("x" * 3000)), desk.ask(params("small, but in the same batch"))]
    outcomes = await asyncio.gather(*asking, return_exceptions=True)
    assert all(isinstance(o, BatchFailed) for o in outcomes)
    assert "413" in str(outcomes[0]) or "size" in str(outcomes[0])
    assert server.batches.submissions == {}
