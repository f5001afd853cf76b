"""Pytest plugin: each store test runs on a SQLite file and on PostgreSQL alike."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orchmode.core.events import TokenUsage
from orchmode.core.results import AgentResult, Status
from orchmode.store import Store, open_store

DONE = AgentResult('{"summary": "x"}', Status.FINISHED, 2, TokenUsage(1, 2, 3, 4))


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_clean_url"))


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    opened = await open_store(store_url)
    yield opened
    await opened.close()


def execute(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Run SQL on the store's database behind its back, as another program would."""
    if url.startswith("sqlite://"):
        db = sqlite3.connect(url.removeprefix("sqlite://"))
        try:
            rows = db.execute(sql).fetchall()
            db.commit()
            return rows
        finally:
            db.close()
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql.encode())
        return cur.fetchall() if cur.description else []
