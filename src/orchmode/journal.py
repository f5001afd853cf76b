"""The journal: subagent results stored by content address, so an interrupted run resumes.

SQLite in WAL mode with ``synchronous=FULL``: a result is on disk once :meth:`Journal.record`
returns, and a process killed at any moment leaves a database that opens cleanly. Every
attempt is kept, but only finished results are served back.

Writes run on one dedicated thread, so the event loop never waits on a disk flush. Reads
are a single indexed lookup on a second connection, done inline: WAL readers never wait
for the writer, and a hop to a thread costs more than the query (measured in
``bench/fanout.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from .errors import JournalError
from .events import Role, TokenUsage
from .subagent import AgentResult, Status

log = logging.getLogger("orchmode")
T = TypeVar("T")


def content_key(
    *,
    role: Role,
    model: str,
    effort: str,
    system: str,
    tools: Sequence[dict[str, Any]],
    prompt: str,
) -> str:
    """SHA-256 over everything that determines a subagent's result."""
    canonical = json.dumps(
        {
            "role": role,
            "model": model,
            "effort": effort,
            "system": system,
            "tools": list(tools),
            "prompt": prompt,
        },
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _create_journal(db: sqlite3.Connection) -> None:
    db.execute(
        """CREATE TABLE results (
            key TEXT PRIMARY KEY,
            role TEXT NOT NULL,
            prompt TEXT NOT NULL,
            result TEXT NOT NULL,
            turns INTEGER NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            cache_read_tokens INTEGER NOT NULL,
            cache_write_tokens INTEGER NOT NULL,
            recorded_at REAL NOT NULL
        )"""
    )
    db.execute(
        """CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL,
            role TEXT NOT NULL,
            status TEXT NOT NULL,
            detail TEXT NOT NULL,
            recorded_at REAL NOT NULL
        )"""
    )
    db.execute("CREATE INDEX attempts_key ON attempts(key)")


#: Numbered schema changes, applied in order and recorded, so an old journal always upgrades.
MIGRATIONS: list[tuple[str, Callable[[sqlite3.Connection], None]]] = [
    ("create journal", _create_journal),
]


class Journal:
    """A SQLite journal file; open it with :meth:`Journal.open`."""

    def __init__(
        self,
        path: Path,
        db: sqlite3.Connection,
        reader: sqlite3.Connection,
        executor: ThreadPoolExecutor,
    ) -> None:
        self.path = path
        self._db = db
        self._reader = reader
        self._executor = executor

    @classmethod
    def open(cls, path: Path) -> Journal:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orchmode-journal")
        try:
            db = executor.submit(_connect, path).result()
        except BaseException:
            executor.shutdown(wait=False)
            raise
        try:
            reader = sqlite3.connect(path, isolation_level=None, timeout=10.0)
            reader.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            executor.submit(db.close).result()
            executor.shutdown(wait=False)
            raise JournalError(f"cannot read the journal {path}: {exc}") from exc
        return cls(path, db, reader, executor)

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def lookup(self, key: str) -> AgentResult | None:
        """The finished result for ``key``, or ``None``; a read error counts as a miss."""

        try:
            row = self._reader.execute(
                "SELECT result, turns, input_tokens, output_tokens, cache_read_tokens, "
                "cache_write_tokens FROM results WHERE key = ?",
                (key,),
            ).fetchone()
        except sqlite3.Error as exc:
            log.warning("journal read failed, recomputing: %s", exc)
            return None
        if row is None:
            return None
        usage = TokenUsage(row[2], row[3], row[4], row[5])
        return AgentResult(row[0], Status.FINISHED, row[1], usage)

    async def record(self, key: str, role: Role, prompt: str, result: AgentResult) -> None:
        """Store an attempt (and the result if finished); a failure is logged, never raised."""

        def write() -> None:
            now = time.time()
            with _transaction(self._db):
                self._db.execute(
                    "INSERT INTO attempts (key, role, status, detail, recorded_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (key, role, result.status.value, result.text[:2000], now),
                )
                if result.finished:
                    u = result.usage
                    self._db.execute(
                        "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            key,
                            role,
                            prompt,
                            result.text,
                            result.turns,
                            u.input_tokens,
                            u.output_tokens,
                            u.cache_read_tokens,
                            u.cache_write_tokens,
                            now,
                        ),
                    )

        try:
            await self._call(write)
        except (sqlite3.Error, OSError) as exc:
            log.warning("could not record a result in the journal %s: %s", self.path, exc)

    def close(self) -> None:
        self._reader.close()
        try:
            self._executor.submit(self._db.close).result()
        finally:
            self._executor.shutdown(wait=True)


def _connect(path: Path) -> sqlite3.Connection:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None, timeout=10.0)
    except (OSError, sqlite3.Error) as exc:
        raise JournalError(
            f"cannot open the journal {path}: {exc} — pass --journal with a writable path"
        ) from exc
    try:
        db.execute("PRAGMA busy_timeout = 10000")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        _migrate(db, path)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise JournalError(
            f"the journal {path} is unusable ({exc}) — move it aside to start fresh, "
            "or pass --journal with another path"
        ) from exc
    return db


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE: take the write lock up front, so a busy writer waits, never deadlocks."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _migrate(db: sqlite3.Connection, path: Path) -> None:
    with _transaction(db):
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        applied = {row[0] for row in db.execute("SELECT version FROM schema_migrations")}
        newest = max(applied, default=0)
        if newest > len(MIGRATIONS):
            raise JournalError(
                f"the journal {path} was written by a newer orchmode (schema {newest}, this "
                f"version knows {len(MIGRATIONS)}) — upgrade orchmode or use another --journal"
            )
        for version, (name, migrate) in enumerate(MIGRATIONS, start=1):
            if version not in applied:
                migrate(db)
                db.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, time.time())
                )
