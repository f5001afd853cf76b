"""A session's parts, built in order and closed in reverse: the start-up every session shares.

Everything that can be refused without cost is checked first — the sandbox, the agent
definitions, the permission rules, the executor — so a mistake in the settings is one line
before any store is opened or any token spent. Then the secrets are learnt, so every part
built after them masks what they mask, and the parts that hold resources (the store, the
gateway's connections, the shells, MCP servers, the executor, the tracer) are opened.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets as random
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from typing_extensions import Unpack

from ..core.agents import AgentDefinition, check_role_prices, load_definitions
from ..core.errors import ConfigError
from ..core.events import EventBus
from ..core.permissions import Rules
from ..core.secrets import Secrets, committed_secrets_warning
from ..core.settings import Settings
from ..core.web_tools import TOOL_TYPES, main_web_tool_names, web_tool_notes
from ..executors import Executor, check_executor, open_executor
from ..executors.approvals import Approvals
from ..executors.host import AgentHost, ShellFactory
from ..executors.node import NodeParts, node_parts, session_permits
from ..executors.permits import Permits
from ..model.budget import SessionBudget
from ..model.gateway import ModelGateway, session_gateway
from ..model.providers import Credentials, check_batching
from ..shell.sandbox import preflight
from ..store import Store, open_store
from ..store.result_files import ResultFiles, results_dir
from ..telemetry.session_traces import close_tracing, session_tracing
from ..telemetry.traces import Traces
from ..tools.mcptools import McpHub
from ..trees.trees import Trees

log = logging.getLogger("orchmode")

#: Where the start-up's warnings go: the sandbox is off, a file is not an agent definition.
Warn = Callable[[str], object]


def new_session_id() -> str:
    """Sortable and unique enough: when it started, and a little randomness."""
    return time.strftime("%Y%m%d-%H%M%S-") + random.token_hex(3)


@dataclass
class Parts:
    """Everything a conversation runs on, opened and ready; closed by whoever built it."""

    settings: Settings
    workdir: Path
    session_id: str
    events: EventBus
    store: Store
    gateway: ModelGateway
    budget: SessionBudget
    secrets: Secrets
    #: The user's MCP servers (``mcp_config``), started when an agent first needs them.
    mcp: McpHub | None
    #: Every agent's full result, and every tool result a compaction took out.
    results: ResultFiles
    node: NodeParts
    approvals: Approvals
    #: The permission rules applied (None: the settings have none).
    permits: Permits | None
    executor: Executor
    #: The agent definitions subtasks may name, read once for the session.
    roles: Mapping[str, AgentDefinition]
    traces: Traces | None

    @property
    def make_shell(self) -> ShellFactory:
        return self.node.make_shell

    @property
    def trees(self) -> Trees:
        return self.node.trees


class StartOptions(TypedDict, total=False):
    """What a start-up may be given besides its settings and credentials."""

    #: The working directory, as :func:`orchmode.open_session` takes it.
    workdir: str | os.PathLike[str] | None
    #: The session's name: a recorded one is taken up again.
    session: str | None
    #: Where the start-up's warnings go (the ``orchmode`` logger when left out).
    warn: Warn | None
    #: A bus of the caller's own (its mask is set if it has none).
    events: EventBus | None
    #: Rules in place of those the settings and files would give.
    rules: Rules | None
    #: An executor the caller brought (and closes).
    executor: Executor | None
    #: A store the caller opened (and closes), in place of the one the settings name.
    store: Store | None


@asynccontextmanager
async def session_parts(
    settings: Settings, credentials: Credentials | None = None, **options: Unpack[StartOptions]
) -> AsyncIterator[Parts]:
    """The parts of a session, all closed on the way out; the executor started only by its
    user. ``credentials`` default to the environment's."""
    start = _checked(
        settings,
        options.get("workdir"),
        options.get("session"),
        credentials,
        options.get("warn") or _log_warning,
        options.get("events"),
        options.get("rules"),
    )
    async with AsyncExitStack() as stack:
        stack.enter_context(_fewer_collections())
        yield await _opened(stack, start, options.get("executor"), options.get("store"))


#: Python's default pace for its cyclic collector's youngest generation (allocations between
#: collections), and the pace while a session is open.
PYTHON_PACE, SESSION_PACE = 700, 10_000
_sessions_open = 0


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Python's cyclic collector at a slower pace while sessions are open, unless the
    program chose its own pace.

    A wide fan-out keeps thousands of young objects alive (every agent's request, reply and
    shell), and at Python's pace the collector walks them every 700 allocations: about a
    twentieth of the harness's CPU per model request in ``bench/fanout.py``. Reference counting
    frees everything as before; only garbage in cycles waits a little longer.
    """
    global _sessions_open
    first, *older = gc.get_threshold()
    if _sessions_open == 0 and first != PYTHON_PACE:
        yield  # the program's own choice
        return
    _sessions_open += 1
    gc.set_threshold(SESSION_PACE, *older)
    try:
        yield
    finally:
        _sessions_open -= 1
        if _sessions_open == 0:
            gc.set_threshold(PYTHON_PACE, *older)


@dataclass
class _Start:
    """What the start-up learnt before it opened anything."""

    settings: Settings
    workdir: Path
    credentials: Credentials
    session_id: str
    events: EventBus
    mcp: McpHub | None
    roles: Mapping[str, AgentDefinition]
    secrets: Secrets
    rules: Rules | None


def _checked(
    settings: Settings,
    workdir: str | os.PathLike[str] | None,
    session: str | None,
    credentials: Credentials | None,
    warn: Warn,
    events: EventBus | None,
    rules: Rules | None,
) -> _Start:
    """Everything that can be refused without cost, refused before anything is opened: the
    settings, the executor, the credentials, the MCP configuration, the sandbox, the prices,
    the agent definitions and the rules."""
    settings = _placed(settings, workdir, session)
    where = settings.workdir
    assert where is not None
    check_executor(settings, where)
    check_batching(settings)
    credentials = credentials or Credentials.from_env(os.environ, settings.provider)
    bus = events or EventBus()
    mcp = McpHub.from_settings(settings, where, bus, os.environ)
    for warning in preflight(settings):
        warn(warning)
    if settings.test_mode:  # what load_settings does for the CLI, so the setting means the same
        settings = settings.with_test_limits()
    if settings.max_cost is not None and (model := settings.unpriced()) is not None:
        raise ConfigError(
            f"max_cost needs a price for {model} — add one to the prices setting "
            f'([prices."{model}"] in ~/.config/orchmode/config.toml, or Settings(prices=...))'
        )
    roles, warnings = load_definitions(where, extra=settings.agents_dir)
    check_role_prices(roles, settings)
    secrets = Secrets.start(settings.secret_files, where, os.environ, credentials.secrets)
    if bus.mask is None:
        bus.mask = secrets.masker.mask_event
    if rules is None:
        rules, rule_warnings = Rules.load(settings, where, os.environ)
        warnings += rule_warnings
    if main_web_tool_names(settings) or any(
        role.allows(name) for role in roles.values() for name in TOOL_TYPES
    ):
        warnings += web_tool_notes(settings, rules)
    if secrets.in_git:
        warnings.append(committed_secrets_warning(secrets.in_git))
    for warning in warnings:
        warn(warning)
    session_id = settings.session or new_session_id()
    return _Start(settings, where, credentials, session_id, bus, mcp, roles, secrets, rules)


async def _opened(
    stack: AsyncExitStack, start: _Start, executor: Executor | None, store: Store | None
) -> Parts:
    """The parts that hold resources, each closed by ``stack`` in the reverse order."""
    settings, workdir, bus, mcp = start.settings, start.workdir, start.events, start.mcp
    hidden = (*start.secrets.masker.secrets, *(mcp.secrets if mcp is not None else ()))
    traces = session_tracing(settings, hidden, bus, start.session_id)
    if traces is not None:  # closed last: every span sent, also after Ctrl-C or an error
        stack.push_async_callback(close_tracing, traces)
        if mcp is not None:
            mcp.traceparent = traces.traceparent
    if store is None:
        store = await open_store(settings.store_url(workdir))
        stack.push_async_callback(store.close)
    results = ResultFiles(results_dir(workdir, start.session_id), start.secrets.masker)
    gateway = session_gateway(settings, start.credentials, bus, store, start.session_id)
    stack.push_async_callback(gateway.close)
    budget = gateway.budget
    assert budget is not None
    stack.push_async_callback(budget.flush)
    readable = (results.directory,) if results.make_directory() else ()
    node = node_parts(
        settings, workdir, start.secrets, start.credentials.secrets, mcp, readable=readable
    )
    stack.callback(node.close)
    node.trees.sweep()  # copies left by a run that was killed
    approvals, permits = session_permits(
        start.rules, store, start.session_id, workdir, settings, bus.emit, node
    )
    stack.push_async_callback(approvals.close)
    if mcp is not None:
        stack.push_async_callback(mcp.close)
    if executor is None:
        host = AgentHost(
            settings, gateway, store, node.make_shell, node.trees, mcp,
            masker=node.masker, permits=permits,
        )  # fmt: skip
        executor = open_executor(settings, start.credentials, workdir, host)
        stack.push_async_callback(executor.close)
    return Parts(
        settings, workdir, start.session_id, bus, store, gateway, budget, start.secrets, mcp,
        results, node, approvals, permits, executor, start.roles, traces,
    )  # fmt: skip


def _placed(
    settings: Settings, workdir: str | os.PathLike[str] | None, name: str | None
) -> Settings:
    """The settings with the working directory resolved (it must exist) and the session's
    name, if one is given."""
    where = Path(workdir) if workdir is not None else settings.workdir or Path.cwd()
    where = where.expanduser().resolve()
    if not where.is_dir():
        raise ConfigError(
            f"the working directory {where} does not exist — name an existing one (--workdir, "
            "or workdir=)"
        )
    update: dict[str, object] = {"workdir": where}
    if name is not None:
        if not name.strip():
            raise ConfigError("a session name needs some text — pass session=None for a new one")
        update["session"] = name
    return settings.model_copy(update=update)


def _log_warning(warning: str) -> None:
    log.warning("%s", warning)
