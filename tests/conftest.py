"""Shared fixtures: a scripted Messages API server over real HTTP, and clients pointed at it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from orchmode.core.events import EventBus
from orchmode.core.permissions import Rules
from orchmode.core.settings import Settings
from orchmode.executors import Executor
from orchmode.model.gateway import ModelGateway
from orchmode.model.providers import Credentials
from orchmode.session.agent import Conversation, start_conversation
from orchmode.store import Store
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import Responder, ScriptedServer

# Property tests check what is true, not how fast: no deadline, which a loaded machine (CI,
# or several suites at once) would otherwise fail on a slow first example.
hypothesis.settings.register_profile("orchmode", deadline=None)
hypothesis.settings.load_profile("orchmode")

API_KEY = "test-key"

pytest_plugins = ["postgres_fixture", "phoenix_fixture", "both_stores"]

#: What a test needs, told by the fixtures it uses: ``scripts/test --quick`` leaves these out.
_NEEDS = {
    "postgres_url": "postgres",
    "postgres_clean_url": "postgres",
    "chromium": "browser",
    "phoenix": "phoenix",
}


#: Modules of pure logic, the ``unit`` lane (``scripts/test --unit``): no process, no
#: sandbox, no server, no network; :func:`_refuse_outside_logic` holds them to it.
UNIT_MODULES = frozenset(
    {
        "test_agent_definitions.py",
        "test_batch_ids.py",
        "test_context.py",
        "test_domains.py",
        "test_environment.py",
        "test_mode.py",
        "test_parking.py",
        "test_readme.py",
        "test_settings.py",
        "test_subtasks.py",
        "test_unit_lane.py",
        "test_wire.py",
    }
)

#: Audit events a unit test must not raise: starting a process, or any network traffic.
_NOT_LOGIC = frozenset(
    {
        "subprocess.Popen",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.spawn",
        "os.system",
        "pty.spawn",
        "socket.bind",
        "socket.connect",
    }
)
_unit_test_running = False


class NotPureLogic(BaseException):
    """A unit test started a process or used the network. A BaseException, so that no
    ``except Exception`` in the code under test can swallow it."""


def _refuse_outside_logic(event: str, args: tuple[Any, ...]) -> None:
    if _unit_test_running and event in _NOT_LOGIC:
        raise NotPureLogic(f"a unit test raised the audit event {event} {args!r:.200}")


sys.addaudithook(_refuse_outside_logic)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """Hold a ``unit`` test (its fixtures included) to pure logic while it runs."""
    global _unit_test_running
    _unit_test_running = item.get_closest_marker("unit") is not None
    try:
        return (yield)
    finally:
        _unit_test_running = False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m unit`` does not import the other test modules: the lane is whole modules."""
    name = collection_path.name
    if config.option.markexpr == "unit" and name.startswith("test_") and name.endswith(".py"):
        return name not in UNIT_MODULES or None
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the services it needs (``postgres``, ``ray``, ``browser``), from
    its fixtures and module, so no test has to remember to say so; and the ``unit`` lane."""
    for item in items:
        if item.path.name in UNIT_MODULES:
            item.add_marker("unit")
        needs = {_NEEDS[n] for n in getattr(item, "fixturenames", ()) if n in _NEEDS}
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("store_url") == "postgres":
            needs.add("postgres")
        if item.path.name.startswith("test_ray"):
            needs.add("ray")
        for need in sorted(needs):
            item.add_marker(need)


StartServer = Callable[..., Awaitable[ScriptedServer]]


@pytest.fixture
async def serve() -> AsyncIterator[StartServer]:
    """Start scripted servers on this test's event loop; all stopped at the end."""
    servers: list[ScriptedServer] = []

    async def start(responder: Responder, **kwargs: Any) -> ScriptedServer:
        server = ScriptedServer(responder, api_key=API_KEY, **kwargs)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def settings_for(server: ScriptedServer, tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "base_url": server.url,
        "max_retries": 0,
        "journal": tmp_path / "journal.db",
        "workdir": tmp_path,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedServer]]:
    """Start scripted servers in threads of their own (for tests that run orchmode processes
    or block); all stopped at the end."""
    servers: list[ScriptedServer] = []

    def start(responder: Responder, **kwargs: Any) -> ScriptedServer:
        kwargs.setdefault("api_key", API_KEY)
        server = ScriptedServer(responder, **kwargs)
        server.start_in_thread()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop_thread()


_gateways: list[ModelGateway] = []


def gateway_for(
    settings: Settings, events: EventBus | None = None, api_key: str = API_KEY
) -> ModelGateway:
    """A gateway to the scripted server; closed when the test ends."""
    gateway = ModelGateway(settings, Credentials(api_key=api_key), events or EventBus())
    _gateways.append(gateway)
    return gateway


_stores: list[SQLiteStore] = []


def store_for(tmp_path: Path) -> SQLiteStore:
    """A SQLite store in the test's directory; closed when the test ends."""
    store = SQLiteStore.open(tmp_path / "store.db")
    _stores.append(store)
    return store


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _gateways:
        await _gateways.pop().close()
    while _stores:
        await _stores.pop().close()


_conversations: list[Conversation] = []


async def conversation_for(
    settings: Settings,
    *,
    events: EventBus | None = None,
    store: Store | None = None,
    executor: Executor | None = None,
    rules: Rules | None = None,
    api_key: str = API_KEY,
) -> Conversation:
    """A conversation opened as every session opens one (the wiring builds its parts),
    against the scripted server of ``settings``; closed, parts and all, by its ``close()``
    or when the test ends."""
    conversation = await start_conversation(
        settings,
        Credentials(api_key=api_key),
        events=events,
        store=store,
        executor=executor,
        rules=rules,
    )
    _conversations.append(conversation)
    return conversation


@pytest.fixture(autouse=True)
async def _close_conversations() -> AsyncIterator[None]:
    yield
    while _conversations:
        await _conversations.pop().close()


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory, with a home of its own (no agent definitions, settings or trust
    of the real user's); a module may define its own ``work``."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    return tmp_path / "work"
