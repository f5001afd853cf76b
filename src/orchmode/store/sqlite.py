"""The embedded store: one SQLite file in WAL mode, safe for several processes on one machine.

``synchronous=FULL``: a write is on disk when its call returns, and a process killed at any
moment leaves a file that opens cleanly. Every write is one ``BEGIN IMMEDIATE``
transaction (the write lock up front, so a busy writer waits instead of deadlocking), with
a busy timeout for other processes' writers.

Results are written on one dedicated thread, so the event loop never waits on a disk
flush. Reads are one indexed lookup on a second connection, done inline: WAL readers never
wait for the writer, and a hop to a thread costs more than the query (measured in
``bench/fanout.py``). Claims and budget reservations sit on every subagent's critical path,
so they are tried inline first on a third connection that neither waits for a lock nor
flushes (``synchronous=NORMAL``: safe against a crashed process, and the next flushed
result makes them durable too); only when another writer holds the lock do they go to the
writer thread and wait their turn there.

Conversation checkpoints take the writer thread too, flushed like results: a resumed run
trusts every checkpoint that returned.

Two failures stop the run (see :class:`~orchmode.store.base.Failure`): the disk full, and
a damaged file. After either, every write is refused, so nothing is half-recorded and a
damaged file is never written to; the file is never moved, repaired or deleted either —
the message says what to do with it. A new file is made under a temporary name and linked
into place whole, so a journal of zero bytes is never one of orchmode's: it is refused too.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..core.errors import StoreError
from ..core.events import Role
from ..core.results import AgentResult
from . import schema
from .base import (
    Approval,
    ApprovalRequest,
    BatchRequest,
    BudgetCaps,
    BudgetState,
    EventRow,
    Failure,
    SessionInfo,
    SessionRecord,
)

log = logging.getLogger("orchmode")
T = TypeVar("T")

BUSY_TIMEOUT_MS = 10_000
#: The first bytes of a write-ahead log SQLite wrote (big- or little-endian checksums).
WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
#: SQLite's result codes for a full disk, and for a damaged or foreign file.
SQLITE_FULL, SQLITE_CORRUPT, SQLITE_NOTADB = 13, 11, 26
#: errno values that mean no space is left (a quota counts as full too).
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


def disk_full(exc: BaseException) -> bool:
    """True if ``exc`` says the disk (or the quota) is full."""
    if isinstance(exc, OSError):
        return exc.errno in NO_SPACE
    if isinstance(exc, sqlite3.Error):
        return getattr(
            exc, "sqlite_errorcode", None
        ) == SQLITE_FULL or "database or disk is full" in str(exc)
    return False


def damaged(exc: BaseException) -> bool:
    """True if ``exc`` says the file is not a (whole) SQLite database."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    text = str(exc)
    return code in (SQLITE_CORRUPT, SQLITE_NOTADB) or (
        "malformed" in text or "not a database" in text
    )


def full_message(path: Path | str, what: str) -> str:
    return (
        f"could not {what} in {path}: the disk is full — free space there, then "
        "`orchmode resume` continues the run from its last recorded step"
    )


def damaged_message(path: Path | str, detail: object) -> str:
    return (
        f"the journal {path} is damaged ({detail}) — orchmode has not changed it: restore it "
        "from a backup, or move it aside (with its -wal file) and orchmode starts a new "
        "one; --store picks another location"
    )


class SQLiteStore:
    """A store in one SQLite file; open it with :meth:`SQLiteStore.open`."""

    def __init__(
        self,
        path: Path,
        writer: sqlite3.Connection,
        reader: sqlite3.Connection,
        quick: sqlite3.Connection,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.path = path
        self.location = str(path)
        self._writer = writer
        self._reader = reader
        self._quick = quick
        self._executor = executor
        self.failure = Failure()

    @classmethod
    def open(cls, path: Path, *, busy_timeout: float = BUSY_TIMEOUT_MS / 1000) -> SQLiteStore:
        """Open, creating and upgrading the file; ``busy_timeout``: seconds to wait for a lock."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orchmode-store")
        try:
            writer = executor.submit(_connect, path, busy_timeout).result()
        except BaseException:
            executor.shutdown(wait=False)
            raise
        try:
            reader = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout)
            reader.execute("PRAGMA query_only = ON")
            quick = sqlite3.connect(path, isolation_level=None, timeout=0)
            quick.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            executor.submit(writer.close).result()
            executor.shutdown(wait=False)
            if damaged(exc):
                raise StoreError(damaged_message(path, exc)) from exc
            raise StoreError(f"cannot read the store {path}: {exc}") from exc
        return cls(path, writer, reader, quick, executor)

    def _failed(self, what: str, exc: BaseException) -> StoreError:
        """The error for a failed ``what``; a full disk or a damaged file stops the run."""
        if disk_full(exc):
            kept = self.failure.trip(StoreError(full_message(self.path, what)))
        elif damaged(exc):
            kept = self.failure.trip(StoreError(damaged_message(self.path, exc)))
        else:
            return StoreError(f"could not {what} in {self.path}: {exc}")
        return StoreError(str(kept))

    async def _write(self, statements: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``statements`` in one immediate transaction on the writer thread."""
        self.failure.check()

        def run() -> T:
            with _transaction(self._writer):
                return statements(self._writer)

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    async def lookup(self, key: str) -> AgentResult | None:
        try:
            row = self._reader.execute(schema.LOOKUP, (key,)).fetchone()
        except sqlite3.Error as exc:
            error = self._failed("look up a result", exc)
            log.warning("the store could not be read, recomputing: %s", error)
            return None
        if row is None:
            return None
        return schema.result_of(row)

    async def record(
        self, key: str, role: Role, prompt: str, result: AgentResult, *, holder: str = ""
    ) -> None:
        def write(db: sqlite3.Connection) -> None:
            now = time.time()
            db.execute(
                schema.INSERT_ATTEMPT, (key, role, result.status.value, result.text[:2000], now)
            )
            if result.finished:
                db.execute(
                    schema.UPSERT_RESULT,
                    schema.result_row(key, role, prompt, result, now),
                )
            if holder:
                db.execute(schema.RELEASE, (key, holder))

        try:
            await self._write(write)
        except (sqlite3.Error, OSError) as exc:
            log.warning("%s", self._failed("record a result", exc))
        except StoreError as exc:  # refused: the run is stopping
            log.debug("%s", exc)

    async def claim(self, key: str, holder: str, lease: float) -> bool:
        def take(db: sqlite3.Connection) -> bool:
            now = time.time()
            return db.execute(schema.CLAIM, (key, holder, now + lease, now)).rowcount == 1

        return await self._guarded(take, "claim a subtask")

    async def holder(self, key: str) -> str | None:
        row = await self._read(schema.HOLDER, (key, time.time()), "read a claim")
        return None if row is None else str(row[0])

    async def renew(self, key: str, holder: str, lease: float) -> bool:
        def extend(db: sqlite3.Connection) -> bool:
            return db.execute(schema.RENEW, (time.time() + lease, key, holder)).rowcount == 1

        return await self._guarded(extend, "renew a claim")

    async def release(self, key: str, holder: str) -> None:
        def drop(db: sqlite3.Connection) -> None:
            db.execute(schema.RELEASE, (key, holder))

        try:
            await self._guarded(drop, "release a claim")
        except StoreError as exc:  # the lease will expire by itself
            log.warning("%s", exc)

    async def reserve(
        self, session: str, caps: BudgetCaps, *, subagents: int, tokens: int, cost: float
    ) -> bool:
        params = schema.reserve_params(session, caps, subagents=subagents, tokens=tokens, cost=cost)

        def add(db: sqlite3.Connection) -> bool:
            db.execute(schema.ENSURE_BUDGET, (session,))
            return db.execute(schema.RESERVE, params).rowcount == 1

        return await self._guarded(add, "reserve budget")

    async def adjust_budget(self, session: str, *, tokens: int, cost: float) -> None:
        def adjust(db: sqlite3.Connection) -> None:
            db.execute(schema.ENSURE_BUDGET, (session,))
            db.execute(schema.SETTLE, (tokens, cost, session))

        await self._guarded(adjust, "settle the budget")

    async def budget(self, session: str) -> BudgetState:
        try:
            row = self._reader.execute(schema.BUDGET, (session,)).fetchone()
        except sqlite3.Error as exc:
            raise self._failed("read the budget", exc) from exc
        return BudgetState(*row) if row else BudgetState()

    async def save_session(self, session: str, workdir: str, state: str) -> None:
        def save(db: sqlite3.Connection) -> None:
            now = time.time()
            db.execute(schema.SAVE_SESSION, (session, workdir, now, now, state))

        await self._guarded(save, "save the session")

    async def load_session(self, session: str) -> SessionRecord | None:
        row = await self._read(schema.LOAD_SESSION, (session,), "read the session")
        return SessionRecord(row[0], row[1]) if row else None

    async def latest_session(self) -> str | None:
        row = await self._read(schema.LATEST_SESSION, (), "find the latest session")
        return str(row[0]) if row else None

    async def sessions(self) -> list[SessionInfo]:
        try:
            rows = self._reader.execute(schema.LIST_SESSIONS).fetchall()
        except sqlite3.Error as exc:
            raise self._failed("list the sessions", exc) from exc
        return [SessionInfo(str(r[0]), str(r[1]), float(r[2]), float(r[3])) for r in rows]

    async def next_event_seq(self, session: str) -> int:
        row = await self._read(schema.NEXT_EVENT_SEQ, (session,), "number the events")
        return int(row[0]) if row else 1

    async def append_events(self, session: str, events: Sequence[EventRow]) -> None:
        def append(db: sqlite3.Connection) -> None:
            db.executemany(
                schema.INSERT_EVENT, [(session, e.seq, e.at, e.kind, e.data) for e in events]
            )

        await self._guarded(append, "record events")

    async def events(self, session: str) -> list[EventRow]:
        try:
            rows = self._reader.execute(schema.EVENTS, (session,)).fetchall()
        except sqlite3.Error as exc:
            raise self._failed("read the events", exc) from exc
        return [EventRow(*row) for row in rows]

    async def record_messages(self, session: str, start: int, messages: Sequence[str]) -> None:
        rows = schema.message_rows(session, start, messages)

        def write(db: sqlite3.Connection) -> None:
            db.execute(schema.TRUNCATE_MESSAGES, (session, start))
            db.executemany(schema.INSERT_MESSAGE, rows)

        try:
            await self._write(write)
        except (sqlite3.Error, UnicodeEncodeError) as exc:
            # UnicodeEncodeError: a lone surrogate, which UTF-8 (and so SQLite) cannot hold.
            if isinstance(exc, sqlite3.IntegrityError) and "session_messages.seq" in str(exc):
                raise schema.gap_error(self.path, session, start) from None
            if isinstance(exc, UnicodeEncodeError):
                raise StoreError(
                    f"could not checkpoint the conversation in {self.path}: {exc}"
                ) from exc
            raise self._failed("checkpoint the conversation", exc) from exc

    async def load_messages(self, session: str) -> list[str]:
        try:
            rows = self._reader.execute(schema.LOAD_MESSAGES, (session,)).fetchall()
        except sqlite3.Error as exc:
            raise self._failed("read the conversation", exc) from exc
        return [str(row[0]) for row in rows]

    async def request_approval(self, request: ApprovalRequest) -> Approval:
        def ask(db: sqlite3.Connection) -> Approval:
            db.execute(schema.REQUEST_APPROVAL, schema.request_params(request, time.time()))
            row = db.execute(schema.APPROVAL_BY_KEY, (request.session, request.key)).fetchone()
            return schema.approval_of(row)

        return await self._durable(ask, "record an approval")

    async def answer_approval(
        self, id: int, approved: bool, *, always: bool = False, reason: str = ""
    ) -> Approval | None:
        params = schema.answer_params(id, approved, always=always, reason=reason, now=time.time())
        return await self._durable(_answer(params), "answer an approval")

    async def time_out_approval(self, id: int) -> Approval | None:
        params = schema.timed_out_params(id, time.time())
        return await self._durable(_answer(params), "time out an approval")

    async def approval(self, id: int) -> Approval | None:
        row = await self._read(schema.APPROVAL, (id,), "read an approval")
        return None if row is None else schema.approval_of(row)

    async def approvals(
        self, session: str | None = None, *, pending: bool = False
    ) -> list[Approval]:
        query, params = schema.approvals_query(session, pending)
        try:
            rows = self._reader.execute(query, params).fetchall()
        except sqlite3.Error as exc:
            raise self._failed("read the approvals", exc) from exc
        return [schema.approval_of(row) for row in rows]

    async def record_batch_requests(
        self, session: str, custom_ids: Sequence[str], batch_id: str = ""
    ) -> None:
        rows = [(custom_id, session, batch_id, time.time()) for custom_id in custom_ids]

        def write(db: sqlite3.Connection) -> None:
            db.executemany(schema.RECORD_BATCH_REQUEST, rows)

        await self._durable(write, "record the batched requests")

    async def batch_request(self, custom_id: str) -> BatchRequest | None:
        row = await self._read(schema.BATCH_REQUEST, (custom_id,), "read a batched request")
        return None if row is None else BatchRequest(custom_id, str(row[0]), float(row[1]))

    async def _durable(self, statements: Callable[[sqlite3.Connection], T], what: str) -> T:
        """A write flushed to disk before it returns (on the writer thread): an approval
        and its answer survive a kill, like a result."""
        try:
            return await self._write(statements)
        except sqlite3.Error as exc:
            raise self._failed(what, exc) from exc

    async def _read(
        self, query: str, params: tuple[object, ...], what: str
    ) -> tuple[Any, ...] | None:
        try:
            row: tuple[Any, ...] | None = self._reader.execute(query, params).fetchone()
        except sqlite3.Error as exc:
            raise self._failed(what, exc) from exc
        return row

    async def _guarded(self, statements: Callable[[sqlite3.Connection], T], what: str) -> T:
        """A small bookkeeping write: inline if the lock is free, else on the writer thread."""
        self.failure.check()
        try:
            with _transaction(self._quick):
                return statements(self._quick)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise self._failed(what, exc) from exc
        except sqlite3.Error as exc:
            raise self._failed(what, exc) from exc
        try:
            return await self._write(statements)
        except sqlite3.Error as exc:
            raise self._failed(what, exc) from exc

    async def close(self) -> None:
        self._reader.close()
        self._quick.close()
        try:
            self._executor.submit(self._writer.close).result()
        finally:
            self._executor.shutdown(wait=True)


def _answer(params: tuple[object, ...]) -> Callable[[sqlite3.Connection], Approval | None]:
    """The write that answers a pending approval: the approval as answered, None if it was
    not pending (no such id, or answered already)."""

    def answer(db: sqlite3.Connection) -> Approval | None:
        rows = db.execute(schema.ANSWER_APPROVAL, params).fetchall()  # all: done stepping
        return schema.approval_of(rows[0]) if rows else None

    return answer


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back already (a full disk does that): then there is no
        # transaction left, and the error to report is the one that ended it.
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


def _into_wal(db: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch a new file to WAL; another process creating the same file at that moment
    makes SQLite refuse at once ("locked") rather than wait, so try again until the
    busy timeout is spent."""
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)  # another process holds the file's lock for a moment


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _refuse_damaged(path)
        if not path.exists():
            _create(path, busy_timeout)
        db = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout)
    except (OSError, sqlite3.Error) as exc:
        if disk_full(exc):
            raise StoreError(full_message(path, "create the journal")) from exc
        raise StoreError(
            f"cannot open the store {path}: {exc} — pass --store with a writable location"
        ) from exc
    try:
        _set_up(db, path, busy_timeout)
        problems = [" ".join(str(row[0]).split()) for row in db.execute("PRAGMA quick_check(2)")]
        if problems != ["ok"]:
            raise StoreError(damaged_message(path, "; ".join(problems)))
    except sqlite3.OperationalError as exc:
        db.close()
        if disk_full(exc):
            raise StoreError(full_message(path, "open the journal")) from exc
        if "locked" in str(exc) or "busy" in str(exc):
            raise StoreError(
                f"the store {path} is locked by another program ({exc}) — wait for it to "
                "finish, or pass --store with another location"
            ) from exc
        raise StoreError(f"the store {path} is unusable ({exc})") from exc
    except sqlite3.DatabaseError as exc:
        db.close()
        if damaged(exc):
            raise StoreError(damaged_message(path, exc)) from exc
        raise StoreError(
            f"the store {path} is unusable ({exc}) — move it aside to start fresh, "
            "or pass --store with another location"
        ) from exc
    except StoreError:
        db.close()
        raise
    return db


def _set_up(db: sqlite3.Connection, path: Path, busy_timeout: float) -> None:
    """WAL, full sync, and the schema brought up to date."""
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    _into_wal(db, busy_timeout)
    db.execute("PRAGMA synchronous = FULL")
    with _transaction(db):
        migrate(db, path, schema.MIGRATIONS)


def _refuse_damaged(path: Path) -> None:
    """Refuse, before SQLite touches them, a journal of zero bytes and a log that is not one.

    SQLite would take an empty file for a new database and write into it, and would reset
    a write-ahead log it cannot read; either would hide that the journal was lost.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0 and not _being_made(path):
        raise StoreError(
            f"the journal {path} is empty (0 bytes; orchmode never leaves one so) — orchmode "
            "has not changed it: restore it from a backup, or delete it and orchmode starts "
            "a new one; --store picks another location"
        )
    wal = path.with_name(path.name + "-wal")
    try:
        with wal.open("rb") as handle:
            head = handle.read(32)
    except FileNotFoundError:
        return
    if len(head) == 32 and head[:4] not in WAL_MAGIC:
        raise StoreError(
            f"the journal's write-ahead log {wal} is damaged (not a SQLite log) — orchmode has "
            f"not changed it: move it aside to open {path.name} as it was before its last "
            "writes, or restore both from a backup"
        )


def _being_made(path: Path) -> bool:
    """True if another program holds a lock on the (empty) file: it is making it now."""
    probe = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        probe.execute("BEGIN IMMEDIATE")  # takes the lock only: an empty file stays empty
        probe.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc) or "busy" in str(exc)
    finally:
        probe.close()
    return False


def _create(path: Path, busy_timeout: float) -> None:
    """Make a new journal under a temporary name and link it into place whole.

    So a journal is never seen half-made (zero bytes, or without its schema): a process
    killed here leaves only a temporary file. Another process that makes the same journal
    at the same moment wins or loses the link; the loser opens the winner's.
    """
    partial = path.with_name(f".{path.name}.new-{uuid.uuid4().hex[:12]}")
    try:
        db = sqlite3.connect(partial, isolation_level=None, timeout=busy_timeout)
        try:
            _set_up(db, partial, busy_timeout)
        finally:
            db.close()
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another process made it first
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            log.debug("no hard links in %s (%s): the journal is made in place", path.parent, exc)
    finally:
        for leftover in (partial, *(partial.with_name(partial.name + s) for s in ("-wal", "-shm"))):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def migrate(
    db: sqlite3.Connection, where: Path, migrations: Sequence[tuple[str, list[str]]]
) -> None:
    """Apply the missing numbered migrations, inside the caller's transaction."""
    db.execute(schema.MIGRATIONS_TABLE)
    applied = {row[0] for row in db.execute(schema.APPLIED_VERSIONS)}
    for version, name, statements in schema.pending_migrations(applied, migrations, where):
        for statement in statements:
            db.execute(statement)
        db.execute(schema.RECORD_MIGRATION, (version, name, time.time()))
