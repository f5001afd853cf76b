"""Where each batched request went, on both backends: a resumed run pays no request twice."""

from __future__ import annotations

from both_stores import execute
from orchmode.store import BatchRequest, Store, open_store


async def test_a_request_never_recorded_is_not_found(store: Store) -> None:
    assert await store.batch_request("abc-0") is None


async def test_a_request_is_recorded_before_its_batch_exists_and_takes_its_id_after(
    store: Store,
) -> None:
    await store.record_batch_requests("s1", ["a-0", "b-0"])
    before = await store.batch_request("a-0")
    assert before is not None and before.batch_id == ""
    await store.record_batch_requests("s1", ["a-0", "b-0"], "msgbatch_1")
    after = await store.batch_request("a-0")
    assert after == BatchRequest("a-0", "msgbatch_1", before.recorded_at)
    found = await store.batch_request("b-0")
    assert found is not None and found.batch_id == "msgbatch_1"


async def test_a_known_batch_id_is_never_lost_to_a_later_record(store: Store) -> None:
    await store.record_batch_requests("s1", ["a-0"], "msgbatch_1")
    await store.record_batch_requests("s1", ["a-0"])
    found = await store.batch_request("a-0")
    assert found is not None and found.batch_id == "msgbatch_1"


async def test_the_record_outlives_the_store_being_closed(store_url: str) -> None:
    first = await open_store(store_url)
    await first.record_batch_requests("s1", [f"r{n}-0" for n in range(500)], "msgbatch_9")
    await first.close()
    again = await open_store(store_url)
    try:
        found = await again.batch_request("r499-0")
        assert found is not None and found.batch_id == "msgbatch_9"
    finally:
        await again.close()
    rows = execute(store_url, "SELECT COUNT(*) FROM batch_requests WHERE session = 's1'")
    assert rows == [(500,)]
