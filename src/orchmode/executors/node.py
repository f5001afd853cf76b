"""What every process that runs agents builds alike: its masker, shells, trees and permits.

A session's own process and a Ray actor on another node differ in where their secrets come
from and where their trees live, not in how the parts fit together: every secret value the
node knows is masked in all that leaves it, the shells it makes hide the credentials, and an
``ask`` from any of its agents parks that agent and waits for the store's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.events import Event
from ..core.permissions import Rules
from ..core.secrets import Masker, Secrets
from ..core.settings import Settings
from ..store import Store
from ..tools.mcptools import McpHub
from ..trees.trees import Trees
from .approvals import Approvals
from .host import ShellFactory
from .permits import Permits


@dataclass
class NodeParts:
    """The parts one process shares among all the agents it runs."""

    #: Every secret value this process knows: credentials, MCP configuration, secret files.
    masker: Masker
    make_shell: ShellFactory
    trees: Trees

    def close(self) -> None:
        """Kill the shells still up and let go of the trees' copies."""
        try:
            self.make_shell.abandon_all()
        finally:
            self.trees.close()


def node_parts(
    settings: Settings,
    workdir: Path,
    secrets: Secrets,
    keys: tuple[str, ...],
    mcp: McpHub | None,
    *,
    readable: tuple[Path, ...] = (),
    trees_home: Path | None = None,
) -> NodeParts:
    """The parts for agents working in ``workdir``; ``keys`` are secret values (API keys, the
    store's password) that no shell may see and every output has masked."""
    if mcp is not None:
        keys += mcp.secrets
        mcp.masker = secrets.masker  # which learns the MCP configuration's values with the keys
    trees = Trees(workdir, home=trees_home, secrets=secrets)
    secrets.masker.add(keys)
    make_shell = ShellFactory.build(settings, workdir, keys, readable, secrets)
    return NodeParts(secrets.masker, make_shell, trees)


def session_permits(
    rules: Rules | None,
    store: Store,
    session: str,
    workdir: Path,
    settings: Settings,
    emit: Callable[[Event], None],
    node: NodeParts,
) -> tuple[Approvals, Permits | None]:
    """Whom a session's ``ask`` goes to (the user, through the store), and the permits that
    apply its rules to commands, MCP calls and the proxy's connections (None: no rules)."""
    approvals = Approvals(store, session, workdir, settings, emit)
    if rules is None:
        return approvals, None
    permits = Permits(rules, session, workdir, approvals, node.masker)
    sandbox = node.make_shell.sandbox
    if sandbox is not None and sandbox.proxy is not None:
        permits.guard(sandbox.proxy)
    return approvals, permits
