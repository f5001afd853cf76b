"""Where and how subagents run: the subagent loop, in this process or on a Ray cluster.

``local`` runs them as coroutines here; ``ray`` on a cluster's nodes.

The fan-out decides *what* runs — journal, claims, budget, slots — and hands each subagent
that must run to an executor as a :class:`Job`. The executor runs it wherever it runs
agents, renews the job's claim while it runs, records the result and lets the claim go,
and reports the agent's events back here as they happen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.errors import ClusterError, ConfigError
from ..core.events import EventBus, Role
from ..core.results import AgentResult
from ..core.wire import JsonSchema
from ..model.allowance import AgentLimits

if TYPE_CHECKING:
    from ..core.agents import AgentDefinition
    from ..core.settings import Settings
    from ..model.providers import Credentials
    from ..trees.trees import Trees
    from .host import AgentHost
    from .ray import RayExecutor


@dataclass(frozen=True)
class Job:
    """One subagent to run, with the claim the fan-out took for it."""

    #: The journal address of its result; the claim is on it.
    key: str
    #: Who holds the claim: the executor renews it under this name while the agent runs.
    holder: str
    #: The session whose budget ledger its requests count against.
    session: str
    role: Role
    #: ``worker 1.3``: how its requests and commands are labelled.
    name: str
    prompt: str
    #: Set under ``worktree`` isolation: the copy of the tree the agent works in.
    tree: TreeJob | None = None
    #: The JSON Schema the report's ``data`` must follow (None: an untyped report); plain
    #: data, so a job pickles for a cluster's nodes.
    schema: JsonSchema | None = field(default=None, hash=False)
    #: The role it runs in (its agent definition; None: a plain worker or verifier).
    agent: AgentDefinition | None = None
    #: What it may spend and how many turns it may take (None: the settings' turns, no
    #: budget). Plain data: on a cluster's node only these, its own, apply.
    limits: AgentLimits | None = None


@dataclass(frozen=True)
class TreeJob:
    """Where a job works under ``worktree`` isolation: a copy of a snapshot of the tree."""

    #: The snapshot's commit in the session's private store.
    base: str
    #: Applied to the copy before the agent starts (a verifier's worker's change).
    patch: str = ""
    #: A worker's copy is writable and its change is returned; a verifier's is read-only.
    writable: bool = True
    #: Entries the copy leaves out (ignored ones), shown read-only from the working dir.
    ignored: tuple[str, ...] = ()
    #: For a node that does not have the snapshot: where to fetch it (a Ray object ref).
    bundle: Any = None
    #: The subtask it belongs to (``1.3``): a verifier that runs where its worker ran
    #: checks that very copy, found by it.
    chain: str = ""
    #: Set while the call's snapshot is still being taken (here, as its workers' first
    #: requests are in flight): it gives the snapshot's job, and ``base`` is "" until then.
    pending: asyncio.Future[TreeJob] | None = field(default=None, compare=False, repr=False)

    def for_subtask(self, call: int, index: int) -> TreeJob:
        """The same copy, named for subtask ``index`` of call ``call``."""
        return replace(self, chain=f"{call}.{index}")

    async def with_snapshot(self) -> TreeJob:
        """This job once its snapshot is taken (itself when it already was)."""
        if self.pending is None:
            return self
        taken = await asyncio.shield(self.pending)
        return replace(taken, patch=self.patch, writable=self.writable, chain=self.chain)


class WorkerLost(Exception):
    """The node running a job went away before the job ended.

    The job's claim is left to lapse rather than let go: the node may only be cut off,
    still working, and it records its result if it finishes. Whoever runs the job again
    waits for the lease, then finds either that result or a free claim.
    """

    def __init__(self, node: str, reason: str) -> None:
        super().__init__(f"lost node {node}: {reason}")
        self.node = node


class Executor(Protocol):
    """Runs jobs; ``start`` and ``close`` bracket a session's use of it."""

    async def start(self) -> None:
        """Get ready to run jobs (connect, ship the working directory); may raise."""

    async def run(
        self, job: Job, events: EventBus, on_placed: Callable[[str], None]
    ) -> AgentResult:
        """Run ``job`` to its result; ``on_placed(node)`` is called once it has a place.

        Raises :class:`WorkerLost` if its node went away, and ``AuthError`` if the API
        refused the credentials; any other failure is an error result.
        """

    async def share_tree(self, trees: Trees, commit: str) -> Any:
        """Make a snapshot reachable where jobs run: None here (they share the store), a
        reference to its bundle on a cluster; it goes into each job's :class:`TreeJob`."""

    async def finish_housekeeping(self) -> None:
        """Wait until every result run so far is recorded and its claim let go."""

    async def close(self) -> None:
        """Stop whatever :meth:`start` began."""


def open_executor(
    settings: Settings, credentials: Credentials, workdir: Path, host: AgentHost
) -> Executor:
    """The executor ``settings`` ask for, not yet started.

    ``host`` is this process's: the local executor runs every job through it, while a
    cluster's actors each build their own on their node. Raises as :func:`check_executor`.
    """
    if settings.executor == "local":
        from .local import LocalExecutor

        return LocalExecutor(host)
    return _cluster_executor(settings, workdir)(
        settings, credentials, workdir, host.masker, host.permits
    )


def check_executor(settings: Settings, workdir: Path) -> None:
    """Raise if the executor ``settings`` ask for cannot run here.

    Called before anything is opened or spent: the Ray executor needs a store that every
    node can reach, and Ray itself.
    """
    if settings.executor != "local":
        _cluster_executor(settings, workdir)


def _cluster_executor(settings: Settings, workdir: Path) -> type[RayExecutor]:
    if not settings.store_url(workdir).startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            "--executor ray needs a PostgreSQL store that every node reaches (--store "
            "postgresql://user:password@host/db): a SQLite file cannot be shared between "
            "machines"
        )
    try:
        from .ray import RayExecutor
    except ImportError:
        raise ClusterError(
            "--executor ray needs Ray, which is not installed — pip install 'orchmode[ray]'"
        ) from None
    return RayExecutor
