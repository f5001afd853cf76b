"""What lasts: the journal, claims, budget and records (SQLite or PostgreSQL), and result files.

SQLite is the default; PostgreSQL serves several machines sharing the work.

``open_store`` picks the backend from a URL: ``sqlite:///abs/path.db`` (or
``sqlite://relative/path.db``) or ``postgresql://user:password@host:port/dbname``.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ConfigError
from .base import (
    Approval,
    ApprovalKind,
    ApprovalRequest,
    ApprovalStatus,
    BatchRequest,
    BudgetCaps,
    BudgetState,
    EventRow,
    SessionInfo,
    SessionRecord,
    Store,
    content_key,
)

__all__ = [
    "Approval",
    "ApprovalKind",
    "ApprovalRequest",
    "ApprovalStatus",
    "BatchRequest",
    "BudgetCaps",
    "BudgetState",
    "EventRow",
    "SessionInfo",
    "SessionRecord",
    "Store",
    "content_key",
    "open_store",
]


async def open_store(url: str) -> Store:
    """Open (creating and upgrading as needed) the store at ``url``."""
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteStore

        path = url.removeprefix("sqlite://")
        if not path:
            raise ConfigError("--store sqlite:// needs a file path, e.g. sqlite:///tmp/orch.db")
        return SQLiteStore.open(Path(path))
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return await PostgresStore.open(url)
    scheme = url.split("://", 1)[0] if "://" in url else url
    raise ConfigError(
        f"unsupported store {scheme!r} — use sqlite:///path/to/file.db or postgresql://…"
    )
