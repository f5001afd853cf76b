"""Pytest plugin: one real PostgreSQL server per test session, and an empty database per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from support.postgres import PostgresUnavailable, postgres_server, reset_database


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The DSN of a server started once for the session; skipped (or failed in CI) if absent."""
    with ExitStack() as stack:
        try:
            url = stack.enter_context(postgres_server())
        except PostgresUnavailable as exc:
            if os.environ.get("ORCHMODE_TEST_POSTGRES") == "required":
                pytest.fail(f"{exc} (ORCHMODE_TEST_POSTGRES=required)")
            pytest.skip(str(exc))
        yield url


@pytest.fixture
def postgres_clean_url(postgres_url: str) -> str:
    """The session server's DSN with every table dropped, so the test starts from nothing."""
    reset_database(postgres_url)
    return postgres_url
