"""The SQLite journal: content keys, finished-only serving, durability and clear errors."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from orchmode.errors import JournalError
from orchmode.events import TokenUsage
from orchmode.journal import Journal, content_key
from orchmode.subagent import AgentResult, Status

BASE = dict(
    role="worker", model="m", effort="xhigh", system="s", tools=[{"name": "bash"}], prompt="p"
)


@pytest.mark.parametrize(
    "change",
    [
        {"role": "verifier"},
        {"model": "m2"},
        {"effort": "high"},
        {"system": "s2"},
        {"tools": [{"name": "bash2"}]},
        {"prompt": "p2"},
    ],
)
def test_the_key_covers_everything_that_determines_a_result(change: dict[str, object]) -> None:
    assert content_key(**{**BASE, **change}) != content_key(**BASE)  # type: ignore[arg-type]
    assert content_key(**BASE) == content_key(**dict(BASE))  # type: ignore[arg-type]


async def test_a_finished_result_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "journal.db"
    journal = Journal.open(path)
    result = AgentResult('{"summary": "x"}', Status.FINISHED, 2, TokenUsage(1, 2, 3, 4))
    await journal.record("k", "worker", "p", result)
    journal.close()
    journal = Journal.open(path)
    assert await journal.lookup("k") == result
    assert await journal.lookup("other") is None
    journal.close()


@pytest.mark.parametrize(
    "status", [Status.TURN_LIMIT, Status.MAX_TOKENS, Status.FAILED, Status.EMPTY]
)
async def test_unfinished_attempts_are_recorded_but_never_served(
    tmp_path: Path, status: Status
) -> None:
    journal = Journal.open(tmp_path / "j.db")
    await journal.record("k", "worker", "p", AgentResult("partial", status))
    assert await journal.lookup("k") is None
    journal.close()
    rows = sqlite3.connect(tmp_path / "j.db").execute("SELECT key, status FROM attempts").fetchall()
    assert rows == [("k", status.value)]


async def test_a_write_failure_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = Journal.open(tmp_path / "j.db")
    other = sqlite3.connect(tmp_path / "j.db")
    other.execute("DROP TABLE results")
    other.commit()
    other.close()
    with caplog.at_level(logging.WARNING, logger="orchmode"):
        await journal.record("k", "worker", "p", AgentResult("done", Status.FINISHED))
    assert "could not record" in caplog.text
    journal.close()


def test_a_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(JournalError, match="unusable"):
        Journal.open(path)


def test_a_journal_from_a_newer_orchmode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    Journal.open(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO schema_migrations VALUES (99, 'future', 0)")
    db.commit()
    db.close()
    with pytest.raises(JournalError, match="newer orchmode"):
        Journal.open(path)


def test_an_unwritable_location_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(JournalError, match="cannot open the journal"):
        Journal.open(blocker / "j.db")


def test_the_journal_uses_wal(tmp_path: Path) -> None:
    Journal.open(tmp_path / "j.db").close()
    mode = sqlite3.connect(tmp_path / "j.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
