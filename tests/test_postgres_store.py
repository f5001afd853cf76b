"""PostgreSQL-only behaviour: concurrent migrations, connection errors, multi-process races."""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from orchmode.core.errors import StoreError
from orchmode.store import schema
from orchmode.store.base import BudgetCaps
from orchmode.store.postgres import MIGRATION_LOCK, PostgresStore

# Fresh interpreters, never forks of pytest (its event loop, threads and sockets). A fork
# server with orchmode preloaded starts each one in milliseconds, where spawn re-imports
# everything per process (~2 s each here, most of it the anthropic SDK).
SPAWN = multiprocessing.get_context("forkserver")
SPAWN.set_forkserver_preload([__name__, "orchmode.store.postgres"])
DEADLINE = 30.0
KEYS = 1000
CAP = 500
WORKERS = 4
T = TypeVar("T")


def with_parts(url: str, *, password: str | None = None, port: int | None = None,
               dbname: str | None = None) -> str:  # fmt: skip
    """``url`` with some of its parts replaced."""
    parts = urlsplit(url)
    user = parts.username or ""
    secret = parts.password if password is None else password
    netloc = f"{user}:{secret}@{parts.hostname}:{parts.port if port is None else port}"
    path = parts.path if dbname is None else f"/{dbname}"
    return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


def password_of(url: str) -> str:
    secret = urlsplit(url).password
    assert secret
    return secret


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def run_sql(url: str, sql: str, params: tuple[Any, ...] = ()) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql, params)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` until it holds; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


async def opened(url: str) -> PostgresStore:
    return await PostgresStore.open(url)


# --- migrations -----------------------------------------------------------------------------


async def test_migrations_are_applied_once_and_recorded(postgres_clean_url: str) -> None:
    store = await opened(postgres_clean_url)
    assert await store.claim("k", "me", 30)
    await store.close()
    first = query(postgres_clean_url, "SELECT version, name, applied_at FROM schema_migrations")
    assert [(v, n) for v, n, _ in sorted(first)] == [
        (i, name) for i, (name, _) in enumerate(schema.MIGRATIONS, start=1)
    ]
    store = await opened(postgres_clean_url)  # a second open applies nothing
    assert not await store.claim("k", "someone else", 30)  # the data survived too
    await store.close()
    assert sorted(query(postgres_clean_url, "SELECT * FROM schema_migrations")) == sorted(first)


def test_processes_opening_a_fresh_database_together_wait_for_one_migrator(
    postgres_clean_url: str,
) -> None:
    """Both openers queue on the advisory lock while we hold it, then both succeed."""
    waiting = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = %s"
    )
    results: Queue[tuple[str, Any]] = SPAWN.Queue()
    with psycopg.connect(postgres_clean_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        with spawned(_open_worker, [(postgres_clean_url, results)] * 2):
            wait_until(
                lambda: query(postgres_clean_url, waiting, (MIGRATION_LOCK,)) == [(2,)],
                "both processes to wait on the migration lock",
            )
            assert query(postgres_clean_url, "SELECT to_regclass('schema_migrations')") == [(None,)]
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
            assert collect(results, 2) == [None, None]
    versions = query(postgres_clean_url, "SELECT version FROM schema_migrations ORDER BY 1")
    assert versions == [(i,) for i in range(1, len(schema.MIGRATIONS) + 1)]


async def test_a_database_from_a_newer_orchmode_is_refused(postgres_clean_url: str) -> None:
    store = await opened(postgres_clean_url)
    await store.close()
    newer = len(schema.MIGRATIONS) + 1
    run_sql(
        postgres_clean_url,
        "INSERT INTO schema_migrations VALUES (%s, 'from the future', 0)",
        (newer,),
    )
    with pytest.raises(StoreError) as caught:
        await opened(postgres_clean_url)
    message = str(caught.value)
    assert f"written by a newer orchmode (schema {newer}" in message
    assert "upgrade orchmode" in message
    assert store.location in message
    assert "\n" not in message and password_of(postgres_clean_url) not in message


# --- connection errors ----------------------------------------------------------------------


def test_location_names_the_server_without_the_password(postgres_clean_url: str) -> None:
    async def location() -> str:
        store = await opened(postgres_clean_url)
        await store.close()
        return store.location

    port = urlsplit(postgres_clean_url).port
    assert asyncio.run(location()) == f"postgresql://orchmode@127.0.0.1:{port}/orchmode"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"port": "closed"},
            ": connection refused — is the server running? check --store",
        ),
        (
            {"password": "wrong-Pa55word"},
            ': password authentication failed for user "orchmode" — check the password in --store',
        ),
        (
            {"dbname": "orchmode_missing"},
            ': database "orchmode_missing" does not exist — create it',
        ),
    ],
    ids=["unreachable", "wrong-password", "missing-database"],
)
async def test_connection_failures_are_one_line_without_the_password(
    postgres_url: str, change: dict[str, str], expected: str
) -> None:
    port = closed_port() if change.get("port") == "closed" else None
    url = with_parts(
        postgres_url, password=change.get("password"), port=port, dbname=change.get("dbname")
    )
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        await opened(url)
    message = str(caught.value)
    assert message.startswith("cannot connect to PostgreSQL at postgresql://orchmode@127.0.0.1:")
    assert expected in message
    assert "\n" not in message
    assert password_of(url) not in message and password_of(postgres_url) not in message
    assert time.monotonic() - started < 5


async def test_a_silent_server_times_out_instead_of_hanging(postgres_url: str) -> None:
    with socket.socket() as silent:  # accepts TCP connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = with_parts(postgres_url, port=silent.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(StoreError, match="connection timed out") as caught:
            await PostgresStore.open(url, connect_timeout=2)
    assert time.monotonic() - started < 8
    assert password_of(url) not in str(caught.value)


async def test_a_malformed_url_is_not_echoed() -> None:
    with pytest.raises(StoreError, match="not a valid PostgreSQL address") as caught:
        await opened("postgresql://orchmode:sec ret@127.0.0.1/orchmode")
    assert "sec ret" not in str(caught.value)


async def test_a_failing_operation_names_the_store_not_the_password(
    postgres_clean_url: str,
) -> None:
    store = await opened(postgres_clean_url)
    run_sql(postgres_clean_url, "DROP TABLE claims")
    with pytest.raises(StoreError) as caught:
        await store.claim("k", "me", 30)
    await store.close()
    message = str(caught.value)
    assert message.startswith(f"could not claim a subtask in {store.location}: ")
    assert 'relation "claims" does not exist' in message
    assert password_of(postgres_clean_url) not in message


# --- races between OS processes -------------------------------------------------------------


def test_processes_racing_for_the_same_keys_each_key_gets_one_holder(
    postgres_clean_url: str,
) -> None:
    results: Queue[tuple[str, Any]] = SPAWN.Queue()
    barrier = SPAWN.Barrier(WORKERS)
    args = [(postgres_clean_url, f"holder-{i}", barrier, results) for i in range(WORKERS)]
    with spawned(_claim_worker, args):
        won: dict[str, list[str]] = dict(collect(results, WORKERS))
    winners: dict[str, list[str]] = {}
    for holder, keys in won.items():
        for key in keys:
            winners.setdefault(key, []).append(holder)
    assert len(winners) == KEYS
    assert all(len(holders) == 1 for holders in winners.values())
    assert sum(len(keys) for keys in won.values()) == KEYS
    rows = dict(query(postgres_clean_url, "SELECT key, holder FROM claims"))
    assert rows == {key: holders[0] for key, holders in winners.items()}


def test_processes_reserving_against_one_cap_never_exceed_it(postgres_clean_url: str) -> None:
    results: Queue[tuple[str, Any]] = SPAWN.Queue()
    barrier = SPAWN.Barrier(WORKERS)
    args = [(postgres_clean_url, barrier, results) for _ in range(WORKERS)]
    with spawned(_reserve_worker, args):
        granted: list[int] = collect(results, WORKERS)
    assert sum(granted) == CAP

    async def ledger() -> tuple[int, int]:
        store = await opened(postgres_clean_url)
        state = await store.budget("race")
        await store.close()
        return state.subagents, state.tokens

    assert asyncio.run(ledger()) == (CAP, CAP * 10)


# --- helpers that run in spawned processes --------------------------------------------------


@contextmanager
def spawned(target: Callable[..., None], args: list[tuple[Any, ...]]) -> Iterator[None]:
    """Start one process per argument tuple; on exit join them, killing any still running."""
    processes: list[BaseProcess] = [SPAWN.Process(target=target, args=a) for a in args]
    for process in processes:
        process.start()
    try:
        yield
    except BaseException:
        for process in processes:  # the test failed: no point waiting for the rest
            process.kill()
        raise
    finally:
        for process in processes:
            process.join(timeout=DEADLINE)
            if process.is_alive():
                process.kill()
                process.join()


def collect(results: Queue[tuple[str, T]], count: int) -> list[T]:
    """Every worker's value, or the test fails naming the workers' errors."""
    outcomes = []
    for _ in range(count):
        try:
            outcomes.append(results.get(timeout=DEADLINE))
        except queue.Empty:
            pytest.fail(f"a worker process did not report within {DEADLINE:.0f} s")
    errors = [value for kind, value in outcomes if kind != "ok"]
    assert not errors, errors
    return [value for _, value in outcomes]


def _report(results: Queue[tuple[str, Any]], work: Callable[[], Any]) -> None:
    """Put ("ok", value) or ("error", text) on the queue, so the test never waits in vain."""
    try:
        results.put(("ok", work()))
    except BaseException as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def _race(
    url: str,
    barrier: Barrier,
    results: Queue[tuple[str, Any]],
    work: Callable[[PostgresStore], Awaitable[Any]],
) -> None:
    """Open the store, wait until every process has, then all run ``work`` at once."""

    async def run() -> Any:
        try:
            store = await PostgresStore.open(url)
        except BaseException:
            barrier.abort()  # the others stop waiting for us
            raise
        try:
            barrier.wait(timeout=DEADLINE)
            return await work(store)
        finally:
            await store.close()

    _report(results, lambda: asyncio.run(run()))


def _open_worker(url: str, results: Queue[tuple[str, Any]]) -> None:
    async def run() -> None:
        store = await PostgresStore.open(url)
        await store.close()

    _report(results, lambda: asyncio.run(run()))


def _claim_worker(url: str, holder: str, barrier: Barrier, results: Queue[tuple[str, Any]]) -> None:
    async def claim_all(store: PostgresStore) -> tuple[str, list[str]]:
        won: list[str] = []

        async def take(key: str) -> None:
            if await store.claim(key, holder, 600):
                won.append(key)

        # Every process walks the keys in the same order, so each key is contested at once.
        await asyncio.gather(*(take(f"key-{i}") for i in range(KEYS)))
        return holder, won

    _race(url, barrier, results, claim_all)


def _reserve_worker(url: str, barrier: Barrier, results: Queue[tuple[str, Any]]) -> None:
    async def reserve_until_refused(store: PostgresStore) -> int:
        granted = 0
        caps = BudgetCaps(max_subagents=CAP)

        async def loop() -> None:
            nonlocal granted
            for _ in range(CAP + 1):  # bounded, so a cap that never bites fails fast
                if not await store.reserve("race", caps, subagents=1, tokens=10, cost=0.01):
                    return
                granted += 1

        await asyncio.gather(*(loop() for _ in range(4)))
        return granted

    _race(url, barrier, results, reserve_until_refused)
