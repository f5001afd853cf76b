"""Conversation checkpoints, the same suite on both backends: append, rewrite, truncate,
isolation, refusals, the upgrade from the previous schema, concurrent stores, big messages."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from both_stores import DONE, execute
from orchmode.core.errors import StoreError
from orchmode.store import EventRow, SessionRecord, Store, open_store, schema


def message(n: int, note: str = "") -> str:
    """Message ``n`` of a conversation, as the JSON text the orchestrator records."""
    role = "user" if n % 2 == 0 else "assistant"
    return json.dumps({"role": role, "content": [{"type": "text", "text": f"step {n}{note}"}]})


def conversation(count: int, note: str = "") -> list[str]:
    return [message(n, note) for n in range(count)]


async def test_appending_in_steps_gives_back_the_whole_conversation_in_order(
    store_url: str,
) -> None:
    whole = conversation(25)  # past 10, so an ordering by text ("10" < "2") would show
    store = await open_store(store_url)
    assert await store.load_messages("s") == []
    recorded = 0
    for step in (1, 2, 1, 2, 2, 1, 2, 2, 2, 2, 2, 2, 2, 2):
        await store.record_messages("s", recorded, whole[recorded : recorded + step])
        recorded += step
        assert await store.load_messages("s") == whole[:recorded]
    await store.close()
    store = await open_store(store_url)  # and it is all still there after reopening
    assert await store.load_messages("s") == whole
    await store.close()


async def test_a_rewrite_from_an_earlier_index_replaces_the_tail_and_keeps_the_head(
    store: Store,
) -> None:
    await store.record_messages("s", 0, conversation(12))
    shorter = conversation(2, " (compacted)")
    await store.record_messages("s", 4, shorter)
    assert await store.load_messages("s") == conversation(4) + shorter
    longer = conversation(9, " (again)")
    await store.record_messages("s", 5, longer)
    assert await store.load_messages("s") == [*conversation(4), shorter[0], *longer]
    await store.record_messages("s", 0, ["only"])
    assert await store.load_messages("s") == ["only"]


async def test_an_empty_checkpoint_truncates(store: Store) -> None:
    await store.record_messages("s", 0, conversation(5))
    await store.record_messages("s", 3, [])  # a truncated reply dropped
    assert await store.load_messages("s") == conversation(3)
    await store.record_messages("s", 3, [])  # already that short: nothing changes
    await store.record_messages("s", 7, [])  # past the end: nothing to drop
    assert await store.load_messages("s") == conversation(3)
    await store.record_messages("s", 3, [message(3)])  # and it appends on from there
    assert await store.load_messages("s") == conversation(4)
    await store.record_messages("s", 0, [])
    assert await store.load_messages("s") == []


async def test_sessions_do_not_see_each_others_messages(store: Store) -> None:
    for n in range(6):  # interleaved, one message at a time
        await store.record_messages("s", n, [message(n, " of s")])
        await store.record_messages("s1", n, [message(n, " of s1")])
    await store.record_messages("s", 2, [])  # truncating one session leaves the other be
    await store.record_messages("s1", 0, ["fresh"])
    assert await store.load_messages("s") == conversation(2, " of s")
    assert await store.load_messages("s1") == ["fresh"]
    assert await store.load_messages("S") == []


async def test_a_checkpoint_that_would_leave_a_gap_is_refused(store: Store) -> None:
    await store.record_messages("s", 0, conversation(3))
    with pytest.raises(StoreError, match="fewer than 5 messages recorded") as caught:
        await store.record_messages("s", 5, [message(5)])
    assert str(caught.value).startswith(
        f"could not checkpoint the conversation in {store.location}"
    )
    with pytest.raises(StoreError, match="would leave a gap"):
        await store.record_messages("fresh", 1, [message(1)])
    with pytest.raises(ValueError, match="start at index 0"):
        await store.record_messages("s", -1, [message(0)])
    assert await store.load_messages("s") == conversation(3)
    assert await store.load_messages("fresh") == []


async def test_a_failed_checkpoint_changes_nothing(store: Store) -> None:
    await store.record_messages("s", 0, conversation(4))
    # A lone surrogate cannot be stored as UTF-8: the second message fails after the
    # truncation and the first insert ran, and both must be undone with it.
    with pytest.raises(StoreError, match="could not checkpoint the conversation"):
        await store.record_messages("s", 1, ["replacement", '"\ud800"'])
    assert await store.load_messages("s") == conversation(4)
    await store.record_messages("s", 4, [message(4)])  # the store carries on
    assert await store.load_messages("s") == conversation(5)


async def test_a_missing_table_is_a_store_error_naming_the_store(
    store: Store, store_url: str
) -> None:
    execute(store_url, "DROP TABLE session_messages")
    with pytest.raises(StoreError, match="could not checkpoint the conversation in") as caught:
        await store.record_messages("s", 0, [message(0)])
    assert store.location in str(caught.value) and "session_messages" in str(caught.value)
    with pytest.raises(StoreError, match="the conversation"):
        await store.load_messages("s")


def _tables(url: str) -> set[str]:
    if url.startswith("sqlite://"):
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    else:
        query = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
    return {str(row[0]) for row in execute(url, query)}


async def test_a_store_from_the_previous_schema_upgrades_and_keeps_its_data(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = next(
        version
        for version, (_, statements) in enumerate(schema.MIGRATIONS, start=1)
        if any("session_messages" in statement for statement in statements)
    )
    with monkeypatch.context() as patch:  # the orchmode before this migration
        patch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[: ours - 1])
        old = await open_store(store_url)
        u = DONE.usage
        execute(  # the old orchmode's own row: its columns, not today's
            store_url,
            "INSERT INTO results (key, role, prompt, result, turns, input_tokens, "
            "output_tokens, cache_read_tokens, cache_write_tokens, recorded_at) VALUES "
            f"('k', 'worker', 'p', '{DONE.text}', {DONE.turns}, {u.input_tokens}, "
            f"{u.output_tokens}, {u.cache_read_tokens}, {u.cache_write_tokens}, 1.0)",
        )
        await old.save_session("s", "/work", '{"history": []}')
        await old.append_events("s", [EventRow(1, 1.0, "TurnStarted", "{}")])
        await old.close()
    assert "session_messages" not in _tables(store_url)
    versions = [row[0] for row in execute(store_url, "SELECT version FROM schema_migrations")]
    assert sorted(versions) == list(range(1, ours))

    store = await open_store(store_url)
    try:
        migrations = execute(store_url, "SELECT version, name FROM schema_migrations")
        assert sorted(migrations) == [
            (version, name) for version, (name, _) in enumerate(schema.MIGRATIONS, start=1)
        ]
        assert await store.lookup("k") == DONE
        assert await store.load_session("s") == SessionRecord("/work", '{"history": []}')
        assert await store.events("s") == [EventRow(1, 1.0, "TurnStarted", "{}")]
        assert await store.load_messages("s") == []
        await store.record_messages("s", 0, conversation(3))
        assert await store.load_messages("s") == conversation(3)
    finally:
        await store.close()


async def test_two_stores_append_to_their_sessions_at_once(store_url: str) -> None:
    """Two store instances on one SQLite file (or one database), each its own writer."""
    first, second = await open_store(store_url), await open_store(store_url)
    steps = 60

    async def append(store: Store, session: str) -> None:
        for n in range(steps):
            await store.record_messages(session, n, [message(n, f" of {session}")])

    try:
        await asyncio.gather(append(first, "a"), append(second, "b"))
        third = await open_store(store_url)
        try:
            for reader in (first, second, third):
                assert await reader.load_messages("a") == conversation(steps, " of a")
                assert await reader.load_messages("b") == conversation(steps, " of b")
        finally:
            await third.close()
    finally:
        await first.close()
        await second.close()


async def test_a_large_non_ascii_message_round_trips_byte_identically(store_url: str) -> None:
    text = 'naïve café — 日本語のテキスト 🙂🚀 "quoted" \\ back\\slash\n\ttab \u2028 ∑∫√ Ωμ '
    blocks = []
    while len(json.dumps(blocks, ensure_ascii=False).encode("utf-8")) < 100_000:
        n = len(blocks)
        blocks.append({"type": "tool_result", "tool_use_id": f"toolu_{n:04d}", "content": text})
    big = json.dumps({"role": "user", "content": blocks}, ensure_ascii=False)
    assert len(big.encode("utf-8")) >= 100_000 and not big.isascii()
    store = await open_store(store_url)
    await store.record_messages("s", 0, [message(0), big, message(2)])
    await store.close()
    store = await open_store(store_url)
    try:
        loaded = await store.load_messages("s")
    finally:
        await store.close()
    assert loaded[1].encode("utf-8") == big.encode("utf-8")
    assert loaded == [message(0), big, message(2)]


async def test_a_postgres_checkpoint_is_one_round_trip(
    postgres_clean_url: str, tmp_path: Path
) -> None:
    """BEGIN, the truncation, the inserts and COMMIT all reach the server before any reply."""
    from orchmode.store.postgres import PostgresStore

    store = await PostgresStore.open(postgres_clean_url)
    trace = tmp_path / "libpq.trace"
    try:
        await store.record_messages("s", 0, conversation(200))  # also leaves the pool warm
        fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            async with store._pool.connection() as conn:  # the pool's only connection
                conn.pgconn.trace(fd)
            await store.record_messages("s", 200, [message(200), message(201)])
            async with store._pool.connection() as conn:
                conn.pgconn.untrace()
        finally:
            os.close(fd)
        assert await store.load_messages("s") == conversation(202)
    finally:
        await store.close()
    # libpq's trace: one line per protocol message, "F" sent by us, "B" by the server.
    lines = [line.split("\t") for line in trace.read_text().splitlines()]
    assert any("session_messages" in line for fields in lines for line in fields), lines
    sent = [fields[3] for fields in lines if fields[1] == "F"]
    assert sent.count("Execute") == 5 and sent.count("Sync") == 1  # BEGIN DELETE 2×INSERT COMMIT
    directions = [fields[1] for fields in lines]
    round_trips = sum(
        1 for i, d in enumerate(directions) if d == "F" and (i == 0 or directions[i - 1] == "B")
    )
    assert round_trips == 1, directions
