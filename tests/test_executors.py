"""Where subagents run is one call, ``open_executor``; claims are the store's, used by all."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import API_KEY, gateway_for, store_for
from orchmode.core.errors import ConfigError
from orchmode.core.settings import Settings
from orchmode.executors import Executor, check_executor, open_executor
from orchmode.executors.host import AgentHost, ShellFactory
from orchmode.executors.local import LocalExecutor
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.store.claims import Claim, holder_name


async def test_open_executor_returns_an_executor_for_the_local_case_too(tmp_path: Path) -> None:
    settings = Settings(sandbox="off", workdir=tmp_path)
    store = store_for(tmp_path)
    host = AgentHost(
        settings, gateway_for(settings), store, ShellFactory.build(settings, tmp_path, ())
    )
    executor: Executor = open_executor(settings, Credentials(api_key=API_KEY), tmp_path, host)
    assert isinstance(executor, LocalExecutor) and executor.host is host
    await executor.start()
    await executor.close()


async def test_a_conversation_runs_its_agents_on_the_executor_open_executor_gives(
    tmp_path: Path,
) -> None:
    settings = Settings(sandbox="off", workdir=tmp_path)
    async with open_conversation(settings, Credentials(api_key=API_KEY)) as conversation:
        executor = conversation.executor
        assert isinstance(executor, LocalExecutor)
        assert executor.host.store is conversation.store
        assert executor.host.make_shell is conversation.make_shell


def test_the_ray_executor_is_refused_with_a_sqlite_store_before_anything_opens(
    tmp_path: Path,
) -> None:
    settings = Settings(executor="ray", workdir=tmp_path)
    with pytest.raises(ConfigError, match="needs a PostgreSQL store"):
        check_executor(settings, tmp_path)
    assert not (tmp_path / ".orchmode").exists()
    check_executor(Settings(workdir=tmp_path), tmp_path)  # the local one always can


async def test_a_held_claim_is_refused_to_others_and_let_go_after_the_block(
    tmp_path: Path,
) -> None:
    store = store_for(tmp_path)
    mine, theirs = holder_name(), holder_name()
    claim = await Claim.within(store, "session:s", mine, 0.6, 0)
    assert claim is not None
    async with claim:
        await asyncio.sleep(0.7)  # past the lease: renewed meanwhile
        assert await Claim.within(store, "session:s", theirs, 0.6, 0.1) is None
        assert await store.holder("session:s") == mine
    assert await Claim.within(store, "session:s", theirs, 0.6, 0) is not None
