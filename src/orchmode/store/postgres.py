"""The shared store: one PostgreSQL database that several machines' orchmode processes use at once.

Every operation is one short transaction on a pooled connection, running the same SQL as the
SQLite backend (:mod:`orchmode.store.schema`, ``?`` turned into ``%s``). PostgreSQL's row
locks make ``claim`` and ``reserve`` atomic across processes: a concurrent ``INSERT … ON
CONFLICT DO UPDATE … WHERE`` or ``UPDATE … WHERE`` waits for the other writer and then
re-checks its condition against the committed row, under the default READ COMMITTED.

Times are each client's ``time.time()``, as in the SQLite backend: machines sharing a
database are assumed NTP-synced, which is ample for leases of tens of seconds.

A server restarted, or unreachable for a while, does not fail the run: an operation whose
connection was lost (or that could not get one) is tried again on a fresh connection, with
backoff, for up to :data:`OUTAGE_LIMIT` seconds of outage; the pool replaces the broken
connections. Every operation is one transaction, so a lost one left nothing behind, and
trying it again is safe: results, claims, sessions and checkpoints are keyed writes. (Two
are additions: a budget reservation or settlement whose COMMIT the server made but whose
answer was lost counts twice — the ledger errs high, never low.) Past the limit the store's
:class:`~orchmode.store.base.Failure` trips and the run stops, resumable once the server
is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from ..core.errors import StoreError
from ..core.events import Role
from ..core.results import AgentResult
from . import base, schema
from .pg_address import connect_message, location_of, one_line, parse_url

log = logging.getLogger("orchmode")
T = TypeVar("T")

#: Seconds to wait for the server to answer a connection attempt; never hang on a dead host.
CONNECT_TIMEOUT = 5.0
#: Seconds an operation waits for a free pooled connection before failing.
POOL_TIMEOUT = 10.0
POOL_MIN, POOL_MAX = 1, 10
#: Seconds a pooled connection may sit unused before it is checked on checkout. A server
#: restart takes longer than this, so a connection it broke is always checked first.
IDLE_CHECK = 1.0
#: Seconds of a lost server that a run waits out: each operation is tried again, with
#: backoff, until the server answers or this long has passed since the outage began.
OUTAGE_LIMIT = 60.0
#: The backoff between tries: the first wait, and the longest.
RETRY_FIRST, RETRY_LONGEST = 0.1, 2.0
#: Key of the transaction-level advisory lock that serialises migrations between processes
#: (an arbitrary constant, "orchmode" in ASCII, so it does not collide with other apps' keys).
MIGRATION_LOCK = 0x6F7263686D6F6465
#: Key of the advisory lock that makes recording approvals one at a time, so that no two
#: get the same id ("approval" in ASCII).
APPROVAL_LOCK = 0x617070726F76616C

Conn = AsyncConnection[tuple[Any, ...]]


class _IdleCheck:
    """The pool's checkout check: a round trip, but only on a connection that sat idle."""

    _last_used: ClassVar[weakref.WeakKeyDictionary[Conn, float]] = weakref.WeakKeyDictionary()

    @classmethod
    def used(cls, conn: Conn) -> None:
        cls._last_used[conn] = time.monotonic()

    async def __call__(self, conn: Conn) -> None:
        if time.monotonic() - self._last_used.get(conn, 0.0) > IDLE_CHECK:
            await AsyncConnectionPool.check_connection(conn)


def _pg(query: str) -> str:
    """A schema query with PostgreSQL's placeholders (the queries contain no other ``?``/``%``)."""
    assert "%" not in query, query
    return query.replace("?", "%s")


MIGRATIONS_TABLE = _pg(schema.MIGRATIONS_TABLE)
APPLIED_VERSIONS = _pg(schema.APPLIED_VERSIONS)
RECORD_MIGRATION = _pg(schema.RECORD_MIGRATION)
LOOKUP = _pg(schema.LOOKUP)
INSERT_ATTEMPT = _pg(schema.INSERT_ATTEMPT)
UPSERT_RESULT = _pg(schema.UPSERT_RESULT)
CLAIM = _pg(schema.CLAIM)
RENEW = _pg(schema.RENEW)
RELEASE = _pg(schema.RELEASE)
HOLDER = _pg(schema.HOLDER)
ENSURE_BUDGET = _pg(schema.ENSURE_BUDGET)
RESERVE = _pg(schema.RESERVE)
SETTLE = _pg(schema.SETTLE)
BUDGET = _pg(schema.BUDGET)
SAVE_SESSION = _pg(schema.SAVE_SESSION)
LOAD_SESSION = _pg(schema.LOAD_SESSION)
LATEST_SESSION = _pg(schema.LATEST_SESSION)
RECORD_BATCH_REQUEST = _pg(schema.RECORD_BATCH_REQUEST)
BATCH_REQUEST = _pg(schema.BATCH_REQUEST)
LIST_SESSIONS = _pg(schema.LIST_SESSIONS)
NEXT_EVENT_SEQ = _pg(schema.NEXT_EVENT_SEQ)
INSERT_EVENT = _pg(schema.INSERT_EVENT)
EVENTS = _pg(schema.EVENTS)
TRUNCATE_MESSAGES = _pg(schema.TRUNCATE_MESSAGES)
INSERT_MESSAGE = _pg(schema.INSERT_MESSAGE)
LOAD_MESSAGES = _pg(schema.LOAD_MESSAGES)
REQUEST_APPROVAL = _pg(schema.REQUEST_APPROVAL)
APPROVAL_BY_KEY = _pg(schema.APPROVAL_BY_KEY)
APPROVAL = _pg(schema.APPROVAL)
ANSWER_APPROVAL = _pg(schema.ANSWER_APPROVAL)


class PostgresStore:
    """A store in a PostgreSQL database; open it with :meth:`PostgresStore.open`."""

    def __init__(
        self,
        location: str,
        pool: AsyncConnectionPool[Conn],
        secret: str,
        *,
        outage_limit: float | None = None,
    ) -> None:
        self.location = location
        self._pool = pool
        self._secret = secret
        self.failure = base.Failure()
        self._outage_limit = outage_limit
        #: When the current outage began (monotonic), None while the server answers.
        self._down_since: float | None = None

    @classmethod
    async def open(cls, url: str, *, connect_timeout: float = CONNECT_TIMEOUT) -> PostgresStore:
        """Connect, bring the schema up to date, and start a small connection pool.

        The first connection is made directly, not through the pool, so a refused connection
        or a wrong password surfaces as that error at once instead of a pool timeout.
        """
        params = parse_url(url)
        location = location_of(params)
        secret = str(params.get("password") or "")
        # A timeout in the URL wins; libpq counts whole seconds, at least 2.
        kwargs: dict[str, Any] = {"autocommit": False}
        if "connect_timeout" not in params:
            kwargs["connect_timeout"] = max(2, round(connect_timeout))
        try:
            conn = await AsyncConnection.connect(url, **kwargs)
        except psycopg.Error as exc:
            raise StoreError(connect_message(location, exc, secret)) from None
        try:
            async with conn:
                await _migrate(conn, location, schema.MIGRATIONS)
        except psycopg.Error as exc:
            hint = (
                "use a user that owns the database (or may create tables in it)"
                if isinstance(exc, psycopg.errors.InsufficientPrivilege)
                else "check --store"
            )
            raise StoreError(
                f"cannot prepare the store at {location}: {one_line(exc, secret)} — {hint}"
            ) from None
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            url,
            kwargs=kwargs,
            min_size=POOL_MIN,
            max_size=POOL_MAX,
            open=False,
            timeout=POOL_TIMEOUT,
            # A cheap round trip on checkout replaces connections a server restart broke;
            # only for connections that sat idle, so a busy fan-out does not pay it twice.
            check=_IdleCheck(),
            name="orchmode-store",
        )
        try:
            await pool.open(wait=True, timeout=connect_timeout * 2)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(connect_message(location, exc, secret)) from None
            raise
        return cls(location, pool, secret)

    async def _transaction(self, statements: Callable[[Conn], Awaitable[T]]) -> T:
        """Run ``statements`` in one transaction on a pooled connection (again, if the
        connection is lost, for as long as the outage limit allows)."""

        async def once(wait: float) -> T:
            async with self._pool.connection(timeout=wait) as conn:
                try:
                    async with conn.transaction():
                        return await statements(conn)
                finally:
                    _IdleCheck.used(conn)

        return await self._retrying(once)

    async def _retrying(self, once: Callable[[float], Awaitable[T]]) -> T:
        """``once()``, tried again with backoff while the server cannot be reached.

        A lost connection, a refused one, a server shutting down or starting up, and a pool
        with no connection to give all raise :class:`psycopg.OperationalError`. Past the
        outage limit the store's failure trips, and this raises it (:class:`StoreError`);
        after that every operation raises it at once. ``once`` is given how long it may
        wait for a pooled connection: during an outage, no longer than what is left of it.
        """
        self.failure.check()
        wait = RETRY_FIRST
        while True:
            pool_wait = POOL_TIMEOUT
            if self._down_since is not None:
                left = self.outage_limit - (time.monotonic() - self._down_since)
                pool_wait = min(POOL_TIMEOUT, max(RETRY_FIRST, left))
            try:
                result = await once(pool_wait)
            except psycopg.OperationalError as exc:
                now = time.monotonic()
                if self._down_since is None:
                    self._down_since = now
                    log.warning(
                        "lost the store at %s (%s); trying again for up to %g s",
                        self.location,
                        self._clean(exc),
                        self.outage_limit,
                    )
                if now - self._down_since >= self.outage_limit:
                    kept = self.failure.trip(
                        StoreError(
                            f"the store at {self.location} has been unreachable for "
                            f"{now - self._down_since:.0f} s ({self._clean(exc)}) — the run "
                            "stopped; once the server is back, `orchmode resume` continues it "
                            "from its last recorded step"
                        )
                    )
                    raise StoreError(str(kept)) from None
                left = self.outage_limit - (time.monotonic() - self._down_since)
                await asyncio.sleep(max(0.0, min(wait, left)))
                wait = min(wait * 2, RETRY_LONGEST)
                self.failure.check()
                continue
            if self._down_since is not None:
                log.warning(
                    "the store at %s answers again, after %.1f s",
                    self.location,
                    time.monotonic() - self._down_since,
                )
                self._down_since = None
            return result

    @property
    def outage_limit(self) -> float:
        """Seconds of outage waited out (the module's :data:`OUTAGE_LIMIT` unless set)."""
        return OUTAGE_LIMIT if self._outage_limit is None else self._outage_limit

    async def _pipelined(self, statements: Callable[[Conn], Awaitable[None]]) -> None:
        """Run ``statements`` between BEGIN and COMMIT sent as one pipeline: one round trip.

        psycopg waits for the server after the BEGIN it issues itself and around a
        ``transaction()`` block, so the connection is in autocommit for the moment and the
        transaction is spelled out. Only for writes that read no result on the way. After an
        error the server skips the rest, COMMIT included; the transaction is rolled back
        here, and a connection that cannot be put back as it was is closed for the pool to
        replace.
        """

        async def once(wait: float) -> None:
            async with self._pool.connection(timeout=wait) as conn:
                try:
                    await conn.set_autocommit(True)
                    try:
                        async with conn.pipeline():
                            await conn.execute("BEGIN")
                            await statements(conn)
                            await conn.execute("COMMIT")
                    finally:
                        await _restore(conn)
                finally:
                    _IdleCheck.used(conn)

        await self._retrying(once)

    async def lookup(self, key: str) -> AgentResult | None:
        async def read(conn: Conn) -> tuple[Any, ...] | None:
            return await (await conn.execute(LOOKUP, (key,))).fetchone()

        try:
            row = await self._transaction(read)
        except psycopg.Error as exc:
            log.warning("the store could not be read, recomputing: %s", self._clean(exc))
            return None
        except StoreError as exc:  # the store is lost: the run is stopping
            log.debug("%s", exc)
            return None
        if row is None:
            return None
        return schema.result_of(row)

    async def record(
        self, key: str, role: Role, prompt: str, result: AgentResult, *, holder: str = ""
    ) -> None:
        async def write(conn: Conn) -> None:
            now = time.time()
            await conn.execute(
                INSERT_ATTEMPT, (key, role, result.status.value, result.text[:2000], now)
            )
            if result.finished:
                await conn.execute(
                    UPSERT_RESULT,
                    schema.result_row(key, role, prompt, result, now),
                )
            if holder:
                await conn.execute(RELEASE, (key, holder))

        try:
            await self._transaction(write)
        except psycopg.Error as exc:
            log.warning("could not record a result in %s: %s", self.location, self._clean(exc))
        except StoreError as exc:  # the store is lost: the run is stopping
            log.debug("%s", exc)

    async def claim(self, key: str, holder: str, lease: float) -> bool:
        async def take(conn: Conn) -> bool:
            now = time.time()
            return (await conn.execute(CLAIM, (key, holder, now + lease, now))).rowcount == 1

        return await self._guarded(take, "claim a subtask")

    async def holder(self, key: str) -> str | None:
        async def read(conn: Conn) -> tuple[Any, ...] | None:
            return await (await conn.execute(HOLDER, (key, time.time()))).fetchone()

        try:
            row = await self._transaction(read)
        except psycopg.Error as exc:
            raise StoreError(
                f"could not read a claim in {self.location}: {self._clean(exc)}"
            ) from exc
        return None if row is None else str(row[0])

    async def renew(self, key: str, holder: str, lease: float) -> bool:
        async def extend(conn: Conn) -> bool:
            return (await conn.execute(RENEW, (time.time() + lease, key, holder))).rowcount == 1

        return await self._guarded(extend, "renew a claim")

    async def release(self, key: str, holder: str) -> None:
        async def drop(conn: Conn) -> None:
            await conn.execute(RELEASE, (key, holder))

        try:
            await self._transaction(drop)
        except psycopg.Error as exc:  # the lease will expire by itself
            log.warning("could not release a claim in %s: %s", self.location, self._clean(exc))
        except StoreError as exc:  # likewise
            log.debug("%s", exc)

    async def reserve(
        self, session: str, caps: base.BudgetCaps, *, subagents: int, tokens: int, cost: float
    ) -> bool:
        params = schema.reserve_params(session, caps, subagents=subagents, tokens=tokens, cost=cost)

        async def add(conn: Conn) -> bool:
            await conn.execute(ENSURE_BUDGET, (session,))
            return (await conn.execute(RESERVE, params)).rowcount == 1

        return await self._guarded(add, "reserve budget")

    async def adjust_budget(self, session: str, *, tokens: int, cost: float) -> None:
        async def adjust(conn: Conn) -> None:
            await conn.execute(ENSURE_BUDGET, (session,))
            await conn.execute(SETTLE, (tokens, cost, session))

        await self._guarded(adjust, "settle the budget")

    async def budget(self, session: str) -> base.BudgetState:
        async def read(conn: Conn) -> tuple[Any, ...] | None:
            return await (await conn.execute(BUDGET, (session,))).fetchone()

        try:
            row = await self._transaction(read)
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot read the budget in {self.location}: {self._clean(exc)}"
            ) from None
        return base.BudgetState(*row) if row else base.BudgetState()

    async def save_session(self, session: str, workdir: str, state: str) -> None:
        async def save(conn: Conn) -> None:
            now = time.time()
            await conn.execute(SAVE_SESSION, (session, workdir, now, now, state))

        await self._guarded(save, "save the session")

    async def load_session(self, session: str) -> base.SessionRecord | None:
        row = await self._row(LOAD_SESSION, (session,), "read the session")
        return base.SessionRecord(row[0], row[1]) if row else None

    async def latest_session(self) -> str | None:
        row = await self._row(LATEST_SESSION, (), "find the latest session")
        return str(row[0]) if row else None

    async def sessions(self) -> list[base.SessionInfo]:
        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(LIST_SESSIONS)).fetchall()

        rows = await self._guarded(read, "list the sessions")
        return [base.SessionInfo(str(r[0]), str(r[1]), float(r[2]), float(r[3])) for r in rows]

    async def next_event_seq(self, session: str) -> int:
        row = await self._row(NEXT_EVENT_SEQ, (session,), "number the events")
        return int(row[0]) if row else 1

    async def append_events(self, session: str, events: Sequence[base.EventRow]) -> None:
        async def append(conn: Conn) -> None:
            async with conn.cursor() as cur:
                await cur.executemany(
                    INSERT_EVENT, [(session, e.seq, e.at, e.kind, e.data) for e in events]
                )

        await self._guarded(append, "record events")

    async def events(self, session: str) -> list[base.EventRow]:
        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(EVENTS, (session,))).fetchall()

        rows = await self._guarded(read, "read the events")
        return [base.EventRow(*row) for row in rows]

    async def record_messages(self, session: str, start: int, messages: Sequence[str]) -> None:
        rows = schema.message_rows(session, start, messages)

        async def write(conn: Conn) -> None:
            await conn.execute(TRUNCATE_MESSAGES, (session, start))
            if rows:
                async with conn.cursor() as cur:
                    await cur.executemany(INSERT_MESSAGE, rows)

        try:
            await self._pipelined(write)
        except (psycopg.Error, UnicodeEncodeError) as exc:
            # UnicodeEncodeError: a lone surrogate, which UTF-8 (and so the server) cannot hold.
            if isinstance(exc, psycopg.errors.NotNullViolation) and exc.diag.column_name == "seq":
                raise schema.gap_error(self.location, session, start) from None
            raise StoreError(
                f"could not checkpoint the conversation in {self.location}: {self._clean(exc)}"
            ) from None

    async def load_messages(self, session: str) -> list[str]:
        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(LOAD_MESSAGES, (session,))).fetchall()

        rows = await self._guarded(read, "read the conversation")
        return [str(row[0]) for row in rows]

    async def request_approval(self, request: base.ApprovalRequest) -> base.Approval:
        async def ask(conn: Conn) -> tuple[Any, ...] | None:
            # Asked again: the row is there, and no lock or id is needed.
            found = await (
                await conn.execute(APPROVAL_BY_KEY, (request.session, request.key))
            ).fetchone()
            if found is not None:
                return found
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (APPROVAL_LOCK,))
            await conn.execute(REQUEST_APPROVAL, schema.request_params(request, time.time()))
            return await (
                await conn.execute(APPROVAL_BY_KEY, (request.session, request.key))
            ).fetchone()

        row = await self._guarded(ask, "record an approval")
        assert row is not None  # inserted, or found: the transaction saw one or the other
        return schema.approval_of(row)

    async def answer_approval(
        self, id: int, approved: bool, *, always: bool = False, reason: str = ""
    ) -> base.Approval | None:
        params = schema.answer_params(id, approved, always=always, reason=reason, now=time.time())
        return await self._answer(params, "answer an approval")

    async def time_out_approval(self, id: int) -> base.Approval | None:
        return await self._answer(schema.timed_out_params(id, time.time()), "time out an approval")

    async def _answer(self, params: tuple[object, ...], what: str) -> base.Approval | None:
        """Answer a pending approval. Of two answers at once, the second waits on the row's
        lock, then finds it no longer pending (READ COMMITTED re-checks the WHERE against
        the committed row) and changes nothing."""

        async def answer(conn: Conn) -> tuple[Any, ...] | None:
            return await (await conn.execute(ANSWER_APPROVAL, params)).fetchone()

        row = await self._guarded(answer, what)
        return None if row is None else schema.approval_of(row)

    async def approval(self, id: int) -> base.Approval | None:
        row = await self._row(APPROVAL, (id,), "read an approval")
        return None if row is None else schema.approval_of(row)

    async def approvals(
        self, session: str | None = None, *, pending: bool = False
    ) -> list[base.Approval]:
        query, params = schema.approvals_query(session, pending)

        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            return await (await conn.execute(_pg(query), params)).fetchall()

        rows = await self._guarded(read, "read the approvals")
        return [schema.approval_of(row) for row in rows]

    async def record_batch_requests(
        self, session: str, custom_ids: Sequence[str], batch_id: str = ""
    ) -> None:
        rows = [(custom_id, session, batch_id, time.time()) for custom_id in custom_ids]

        async def write(conn: Conn) -> None:
            async with conn.cursor() as cursor:
                await cursor.executemany(RECORD_BATCH_REQUEST, rows)

        await self._guarded(write, "record the batched requests")

    async def batch_request(self, custom_id: str) -> base.BatchRequest | None:
        row = await self._row(BATCH_REQUEST, (custom_id,), "read a batched request")
        if row is None:
            return None
        return base.BatchRequest(custom_id, str(row[0]), float(row[1]))

    async def _row(
        self, query: str, params: tuple[object, ...], what: str
    ) -> tuple[Any, ...] | None:
        async def read(conn: Conn) -> tuple[Any, ...] | None:
            return await (await conn.execute(query, params)).fetchone()

        return await self._guarded(read, what)

    async def _guarded(self, statements: Callable[[Conn], Awaitable[T]], what: str) -> T:
        try:
            return await self._transaction(statements)
        except psycopg.Error as exc:
            raise StoreError(f"could not {what} in {self.location}: {self._clean(exc)}") from None

    def _clean(self, exc: BaseException) -> str:
        return one_line(exc, self._secret)

    async def close(self) -> None:
        await self._pool.close()


async def _restore(conn: Conn) -> None:
    """Roll back what a failed pipeline left open and leave autocommit; else close ``conn``."""
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.execute("ROLLBACK")
        await conn.set_autocommit(False)
    except psycopg.Error:
        await conn.close()


async def _migrate(conn: Conn, location: str, migrations: Sequence[tuple[str, list[str]]]) -> None:
    """Apply the missing numbered migrations in one transaction, one process at a time.

    The advisory lock is held until the transaction ends, so a second process starting at the
    same moment waits, then finds every migration recorded and applies nothing.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(MIGRATIONS_TABLE)
        applied = {row[0] for row in await (await conn.execute(APPLIED_VERSIONS)).fetchall()}
        for version, name, statements in schema.pending_migrations(applied, migrations, location):
            for statement in statements:
                await conn.execute(_pg(statement))
            await conn.execute(RECORD_MIGRATION, (version, name, time.time()))
