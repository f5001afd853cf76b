"""A session's parts, built in order and closed in reverse: the start-up every session shares.

Everything that can be refused without cost is checked first — the sandbox, the agent
definitions, the permission rules, the executor — so a mistake in the settings is one line
before any store is opened or any token spent. Then the secrets are learnt, so every part
built after them masks what they mask, and the parts that hold resources (the store, the
gateway's connections, the shells, MCP servers, the executor, the tracer) are opened.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets as random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from ..core.agents import AgentDefinition, load_definitions
from ..core.errors import ConfigError
from ..core.events import EventBus
from ..core.permissions import Rules
from ..core.secrets import Secrets, committed_secrets_warning
from ..core.settings import Settings
from ..executors import Executor, check_executor, open_executor
from ..executors.approvals import Approvals
from ..executors.host import AgentHost, ShellFactory
from ..executors.node import NodeParts, node_parts, session_permits
from ..executors.permits import Permits
from ..model.budget import SessionBudget
from ..model.gateway import ModelGateway
from ..model.providers import Credentials
from ..shell.sandbox import preflight
from ..store import Store, open_store
from ..store.result_files import ResultFiles, results_dir
from ..telemetry.traces import Traces, start_tracing, tracing_wanted
from ..tools.mcptools import McpHub
from ..trees.copies import Trees

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


@asynccontextmanager
async def session_parts(
    settings: Settings,
    credentials: Credentials,
    *,
    warn: Warn | None = None,
    events: EventBus | None = None,
    rules: Rules | None = None,
    executor: Executor | None = None,
    store: Store | None = None,
) -> AsyncIterator[Parts]:
    """The parts of a session in ``settings.workdir`` (which must be set), all closed on the
    way out; the executor started only by its user, and closed here unless ``executor`` was
    brought by the caller.

    ``events`` is a bus of the caller's own (its mask is set if it has none); ``rules``
    replaces the permission rules the settings and files would give; ``store`` is one the
    caller opened (and closes), instead of the one the settings name.
    """
    workdir = settings.workdir
    if workdir is None:
        raise ConfigError("a session needs a working directory — set Settings(workdir=...)")
    warn = warn or _log_warning
    for warning in preflight(settings):  # before anything is spent
        warn(warning)
    roles = _roles(settings, workdir, warn)
    secrets = Secrets.start(settings.secret_files, workdir, os.environ, credentials.secrets)
    if secrets.in_git:
        warn(committed_secrets_warning(secrets.in_git))
    if rules is None:
        rules, rule_warnings = Rules.load(settings, workdir, os.environ)
        for warning in rule_warnings:
            warn(warning)
    check_executor(settings, workdir)
    bus = events or EventBus()
    if bus.mask is None:
        bus.mask = secrets.masker.mask_event
    session_id = settings.session or new_session_id()
    mcp = McpHub.from_settings(settings, workdir, bus, os.environ)
    results = ResultFiles(results_dir(workdir, session_id), secrets.masker)
    readable = (results.directory,) if results.make_directory() else ()
    async with AsyncExitStack() as stack:
        traces = _tracing(settings, secrets, bus, session_id, mcp, stack)  # closed last
        node = node_parts(settings, workdir, secrets, credentials.secrets, mcp, readable=readable)
        stack.callback(node.close)
        node.trees.sweep()  # copies left by a run that was killed
        if store is None:
            store = await open_store(settings.store_url(workdir))
            stack.push_async_callback(store.close)
        gateway = ModelGateway(settings, credentials, bus)
        stack.push_async_callback(gateway.close)
        gateway.budget = budget = SessionBudget(store, session_id, settings)
        stack.push_async_callback(budget.flush)
        approvals, permits = session_permits(
            rules, store, session_id, workdir, settings, bus.emit, node
        )
        stack.push_async_callback(approvals.close)
        if mcp is not None:
            stack.push_async_callback(mcp.close)
        if executor is None:
            host = AgentHost(
                settings, gateway, store, node.make_shell, node.trees, mcp,
                masker=node.masker, permits=permits,
            )  # fmt: skip
            executor = open_executor(settings, credentials, workdir, host)
            stack.push_async_callback(executor.close)
        yield Parts(
            settings, workdir, session_id, bus, store, gateway, budget, secrets, mcp,
            results, node, approvals, permits, executor, roles, traces,
        )  # fmt: skip


def _tracing(
    settings: Settings,
    secrets: Secrets,
    bus: EventBus,
    session_id: str,
    mcp: McpHub | None,
    stack: AsyncExitStack,
) -> Traces | None:
    """The session's tracer, when traces are asked for: subscribed to its events, told the
    session's secrets, and flushed on the way out (also after Ctrl-C or an error)."""
    if not tracing_wanted(settings):
        return None
    traces = start_tracing(settings, secrets.masker.secrets)
    traces.session_id = session_id
    bus.subscribe(traces)
    if mcp is not None:
        traces.hide(mcp.secrets)
        mcp.traceparent = traces.traceparent

    async def close() -> None:
        await asyncio.shield(asyncio.to_thread(traces.close))

    stack.push_async_callback(close)
    return traces


def _roles(settings: Settings, workdir: Path, warn: Warn) -> dict[str, AgentDefinition]:
    """The agent definitions, read once for the session; each bad file is a warning.

    Under a cost cap, a role whose model has no price is an error before anything runs,
    as the settings' own models are.
    """
    roles, warnings = load_definitions(workdir, extra=settings.agents_dir)
    for warning in warnings:
        warn(warning)
    if settings.max_cost is not None:
        for role in roles.values():
            if role.model is not None and settings.price(role.model) is None:
                raise ConfigError(
                    f"max_cost needs a price for {role.model}, the model of agent "
                    f"{role.name!r} ({role.path}) — add one to the prices setting"
                )
    return roles


def _log_warning(warning: str) -> None:
    log.warning("%s", warning)
