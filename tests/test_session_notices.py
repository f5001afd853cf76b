"""Mode notices in a real history: each directly after its user turn, as the strict API demands."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import API_KEY, conversation_for
from orchmode.core.prompts import NOTICES
from orchmode.core.settings import Settings
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import Reply, ScriptedServer
from test_mode import events, reference

TEXT_OF = {text: notice.value for notice, text in NOTICES.items()}


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    server = ScriptedServer(lambda r: Reply.text("noted"), api_key=API_KEY)
    with server.in_thread():
        yield server


async def drive(
    server: ScriptedServer,
    workdir: Path,
    start_on: bool,
    every: int,
    script: list[tuple[str, bool | None]],
) -> list[dict[str, object]]:
    config = Settings(
        base_url=server.url, max_retries=0, mode=start_on, refresh_every=every, workdir=workdir
    )
    store = SQLiteStore.open(workdir / "store.db")
    session = await conversation_for(config, store=store)
    try:
        for n, (kind, value) in enumerate(script):
            if kind == "set":
                session.set_mode(bool(value))
            else:
                result = await session.turn(f"user turn {n}")
                assert result.ok, result.text
    finally:
        await session.close()
        await store.close()
    return session.history


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(start_on=st.booleans(), every=st.integers(1, 4), script=events)
def test_each_notice_sits_directly_after_its_user_turn(
    server: ScriptedServer,
    tmp_path: Path,
    start_on: bool,
    every: int,
    script: list[tuple[str, bool | None]],
) -> None:
    before = len(server.log)
    history = asyncio.run(drive(server, tmp_path, start_on, every, script))
    per_turn: list[list[str]] = []
    for i, message in enumerate(history):
        if message["role"] == "user":
            per_turn.append([])
        elif message["role"] == "system":
            assert history[i - 1]["role"] in ("user", "system")
            assert any(m["role"] == "user" for m in history[:i])
            previous_user = max(j for j in range(i) if history[j]["role"] == "user")
            assert all(m["role"] == "system" for m in history[previous_user + 1 : i])
            per_turn[-1].append(TEXT_OF[str(message["content"])])
    assert per_turn == reference(start_on, every, script)
    assert all(entry.status == 200 for entry in server.log[before:])
