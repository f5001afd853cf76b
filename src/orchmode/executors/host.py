"""Runs one job in this process: its subagent loop, its shell, its claim and its record.

The local executor runs its jobs through an :class:`AgentHost` in the user's process; each
Ray actor has one of its own on its node. Either way the host that runs an agent is the
one that keeps the agent's claim alive, so a host that dies takes its claims' renewals
with it and the claims lapse for someone else to take.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import AuthError, OrchmodeError
from ..core.events import EventBus
from ..core.prompts import SUBAGENT_SYSTEM, SUBAGENT_TOOLS
from ..core.results import AgentResult, Change, Status
from ..core.settings import Settings
from ..model.budget import BudgetExhausted
from ..model.context import Window
from ..model.gateway import ModelGateway
from ..shell.bash import BashSession
from ..shell.environment import command_environment
from ..shell.sandbox import Sandbox
from ..store import Store
from ..tools.mcptools import with_mcp_tools
from ..trees.copies import Copy, Trees
from . import Job, TreeJob
from .pool import Ready, SandboxPool
from .subagent import Subagent, describe_failure

if TYPE_CHECKING:
    from ..tools.mcptools import McpHub

log = logging.getLogger("orchmode")

#: Shells started ahead of need at once. Starting one (a fork, a sandbox, its cgroup)
#: holds the event loop for a few milliseconds; a wave of hundreds at once would hold back
#: the wave's model requests, which matter more.
SPAWNS = 2
#: The pool's kind for shells that work in the working directory itself.
SHARED = "shared"


async def keep_claim(store: Store, key: str, holder: str, lease: float) -> None:
    """Renew a claim a third of the lease at a time, until cancelled."""
    while True:
        await asyncio.sleep(lease / 3)
        try:
            if not await store.renew(key, holder, lease):
                log.warning("lost the claim on a running subtask; it may run twice")
                return
        except OrchmodeError as exc:
            log.warning("could not renew a claim: %s", exc)


def _kept_key(tree: TreeJob, base: str, patch: str) -> tuple[str, str, str]:
    return tree.chain, base, Change(base, patch).digest


async def _nothing() -> None:
    return None


def _awaiting(task: asyncio.Task[None]) -> Callable[[], Awaitable[None]]:
    """The shell's wait for its copy; a copy that failed is an OSError the shell reports."""

    async def wait() -> None:
        try:
            await asyncio.shield(task)
        except OrchmodeError as exc:
            raise OSError(f"the agent's copy of the tree could not be made: {exc}") from None

    return wait


async def _fetch(bundle: object) -> bytes:
    """A snapshot's bundle: the bytes themselves, or a Ray object ref to them."""
    if isinstance(bundle, bytes):
        return bundle
    data = await bundle  # type: ignore[misc]
    if not isinstance(data, bytes):
        raise OSError("the snapshot's bundle did not arrive")
    return data


def holder_name(*, renewed_here: bool = True) -> str:
    """A claim holder's name: this host and process, and a part of its own so that two
    claims of one process are told apart.

    ``renewed_here=False`` for a claim that another process renews (a Ray actor on some
    node): its name then carries no process id, so it is never taken for a dead one's.
    """
    pid = str(os.getpid()) if renewed_here else "remote"
    return f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:12]}"


def holder_is_dead(holder: str) -> bool:
    """True only for a holder on this host whose process is gone (killed, crashed).

    A holder elsewhere, or one whose name does not say, is taken to be alive: its claim
    is left to lapse. A process id reused since is taken to be alive too — safe, just slow.
    """
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process: alive
        return False
    return False


async def claim_or_take_over(store: Store, key: str, holder: str, lease: float) -> bool:
    """Claim ``key``; if a process on this host that died holds it, take it over at once
    rather than wait out its lease (after ``kill -9`` the resume starts straight away)."""
    if await store.claim(key, holder, lease):
        return True
    current = await store.holder(key)
    if current is None or not holder_is_dead(current):
        return False
    log.info("taking over a claim from %s, a process that is gone", current)
    await store.release(key, current)
    return await store.claim(key, holder, lease)


@dataclass
class ShellFactory:
    """Makes an agent's persistent shell: in ``workdir``, sandboxed, with no secret in reach.

    If the sandbox cannot work here, the shell's commands are refused rather than run
    unsandboxed; ``sandbox`` is None only when the user turned it off.
    """

    settings: Settings
    workdir: Path
    env: dict[str, str]
    sandbox: Sandbox | None
    #: Every shell it made that may still be running (see :meth:`abandon_all`).
    made: weakref.WeakSet[BashSession] = field(
        default_factory=weakref.WeakSet, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        settings: Settings,
        workdir: Path,
        secrets: tuple[str, ...],
        readable: tuple[Path, ...] = (),
    ) -> ShellFactory:
        """From this process's environment, less credentials and any of ``secrets``;
        ``readable`` directories are shown read-only inside the sandbox."""
        return cls(
            settings,
            workdir,
            command_environment(os.environ, secrets),
            Sandbox.from_settings(settings, workdir, readable),
        )

    def abandon_all(self) -> None:
        """Kill every shell it made that is still up, at once: when a session ends after an
        interrupt, shells whose close was cancelled (or never began) go too."""
        for shell in list(self.made):
            shell.abandon()

    def __call__(self) -> BashSession:
        return self._made(
            BashSession(
                self.workdir,
                timeout=self.settings.bash_timeout,
                output_limit=self.settings.output_limit,
                env=self.env,
                sandbox=self.sandbox.for_shell() if self.sandbox is not None else None,
            )
        )

    def _made(self, shell: BashSession) -> BashSession:
        self.made.add(shell)
        return shell

    def in_copy(
        self,
        trees: Trees,
        copy: Copy,
        tree: TreeJob,
        prepare: Callable[[], Awaitable[None]],
    ) -> BashSession:
        """A shell that works in ``copy``: shown at the working directory's path inside the
        sandbox, with the ignored entries and the objects its git needs shown read-only.
        Unsandboxed (``--sandbox off``) the shell simply starts in the copy."""
        sandbox = None
        cwd = copy.path
        if self.sandbox is not None:
            views = [(trees.store_objects, trees.store_objects)]
            if trees.user_objects is not None:
                views.append((trees.user_objects, trees.alias))
            sandbox = self.sandbox.in_copy(
                copy.path, writable=tree.writable, shared=tree.ignored, views=tuple(views)
            ).for_shell()
            cwd = self.workdir
        return self._made(
            BashSession(
                cwd,
                timeout=self.settings.bash_timeout,
                output_limit=self.settings.output_limit,
                env=self.env,
                sandbox=sandbox,
                prepare=prepare,
            )
        )


@dataclass
class AgentHost:
    """What running subagents needs in one process, and the running itself."""

    settings: Settings
    gateway: ModelGateway
    store: Store
    make_shell: Callable[[], BashSession]
    #: The tree's private store and copies, for jobs under ``worktree`` isolation.
    trees: Trees | None = None
    #: The user's MCP servers, shared by every agent this host runs.
    mcp: McpHub | None = None
    #: Workers' copies kept for their verifiers, by (subtask, snapshot, patch digest): a
    #: verifier that runs here checks the very copy its worker left, read-only, instead of
    #: a new one (a worker that changed nothing too: its copy is the snapshot's).
    _kept: dict[tuple[str, str, str], Copy] = field(default_factory=dict, repr=False)
    _spawn_gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SPAWNS))
    _housekeeping: set[asyncio.Task[None]] = field(default_factory=set, repr=False)
    #: Shells started ahead for the agents to come (see :mod:`.pool`).
    pool: SandboxPool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.pool = SandboxPool(self.settings.max_concurrent, self._spawn_gate, self._discard_ready)

    async def run(self, job: Job, events: EventBus) -> AgentResult:
        """The job's result; any failure but a rejected credential becomes an error result."""
        heartbeat = asyncio.create_task(
            keep_claim(self.store, job.key, job.holder, self.settings.claim_lease)
        )
        kind = self._pool_kind(job)
        ready = self.pool.take(kind) if kind is not None else None
        if ready is None:
            ready = self._kept_copy(job) or self._fresh(job)
        shell, copy, made = ready.shell, ready.copy, ready.made
        # A shell not taken ready from the pool starts while the first model request is in
        # flight, so its start-up is off the critical path (and not ahead of a wave of
        # requests going out); the pool refills then too. Closed in the background, for
        # the same reason.
        try:
            try:
                agent = Subagent(
                    gateway=self.gateway,
                    shell=shell,
                    events=events,
                    name=job.name,
                    system=SUBAGENT_SYSTEM,
                    tools=await with_mcp_tools(SUBAGENT_TOOLS, self.mcp, job.role),
                    max_turns=self.settings.subagent_turns,
                    on_first_request=lambda: self._first_request_sent(job, kind, shell),
                    window=Window.from_settings(self.settings),
                    mcp=self.mcp,
                    role=job.role,
                )
                result = await agent.run(job.prompt)
            except AuthError:
                raise  # retrying cannot help: stop the whole run
            except BudgetExhausted as exc:
                result = AgentResult(f"[orchmode: stopped — {exc}]", Status.SKIPPED)
            except Exception as exc:
                result = AgentResult(describe_failure(exc), Status.FAILED)
        except BaseException:  # cancelled or broken: let the next run take it at once
            self.background(self.store.release(job.key, job.holder))
            if made is not None:
                made.cancel()  # its copy goes with the run's directory when the session closes
                self.background(shell.close())
            raise
        finally:
            heartbeat.cancel()
            if copy is None:
                self.background(shell.close())
        if copy is not None and made is not None and self.trees is not None:
            result = await self._finish_copy(result, job, shell, copy, made)
        # Recorded in the background (settle() waits for it), so the chain goes on; the
        # claim is let go in the same write, so an agent waiting on it never finds neither.
        self.background(self.store.record(job.key, job.role, job.prompt, result, holder=job.holder))
        return result

    async def settle(self) -> None:
        """Wait for the housekeeping so far: results recorded, claims let go, shells closed,
        the requests' use in the budget ledger."""
        while self._housekeeping:
            for failure in await asyncio.gather(*self._housekeeping, return_exceptions=True):
                if isinstance(failure, Exception):
                    log.warning("housekeeping after a subagent failed: %s", failure)
        if self.gateway.budget is not None:
            await self.gateway.budget.flush()
        await self.pool.drain()
        if self.trees is not None:
            kept, self._kept = list(self._kept.values()), {}
            for copy in kept:  # their verifiers ran elsewhere, or not at all
                self.trees.discard(copy)

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Housekeeping off the critical path; :meth:`settle` waits for all of it."""
        task = asyncio.create_task(work)
        self._housekeeping.add(task)
        task.add_done_callback(self._housekeeping.discard)

    def _pool_kind(self, job: Job) -> Hashable | None:
        """Which pooled shells suit ``job``: any shell for a shared tree, one in a fresh
        copy of its snapshot for a worker; None for a verifier's copy of a change."""
        if not self._in_copy(job):
            return SHARED
        assert job.tree is not None
        if job.tree.writable and not job.tree.patch:
            return (job.tree.base, job.tree.ignored)
        return None

    def _in_copy(self, job: Job) -> bool:
        return (
            job.tree is not None
            and self.trees is not None
            and isinstance(self.make_shell, ShellFactory)
        )

    def _kept_copy(self, job: Job) -> Ready | None:
        """The very copy a verifier's worker left here, shown to it read-only."""
        if not self._in_copy(job):
            return None
        assert job.tree is not None
        copy = self._kept.pop(_kept_key(job.tree, job.tree.base, job.tree.patch), None)
        if copy is None:
            return None
        return self._ready_in(copy, asyncio.create_task(_nothing()), job.tree)

    def _fresh(self, job: Job, stem: str | None = None) -> Ready:
        """A new shell for ``job``: in a copy of its tree being made, if it works in one."""
        if not self._in_copy(job):
            return Ready(self.make_shell())
        assert job.tree is not None and self.trees is not None
        assert isinstance(self.make_shell, ShellFactory)
        copy = self.trees.plan_copy(stem or job.name, job.tree.base)
        # Made while the first model request is in flight; the shell waits for it.
        return self._ready_in(copy, asyncio.create_task(self._make_copy(copy, job.tree)), job.tree)

    def _ready_in(self, copy: Copy, made: asyncio.Task[None], tree: TreeJob) -> Ready:
        """A shell that works in ``copy`` once ``made`` has made it."""
        assert self.trees is not None and isinstance(self.make_shell, ShellFactory)
        return Ready(self.make_shell.in_copy(self.trees, copy, tree, _awaiting(made)), copy, made)

    def _first_request_sent(self, job: Job, kind: Hashable | None, shell: BashSession) -> None:
        if not shell.running:
            self.background(self._prewarm(shell))
        if kind is not None:
            self.pool.refill(kind, lambda: self._fresh(job, "ready"))

    async def _discard_ready(self, ready: Ready) -> None:
        """A pooled shell no agent took: closed, and its copy (once made) discarded."""
        await ready.shell.close()
        if ready.copy is None or self.trees is None:
            return
        if ready.made is not None:
            with contextlib.suppress(Exception):
                await ready.made
        self.trees.discard(ready.copy)

    async def _make_copy(self, copy: Copy, tree: TreeJob) -> None:
        assert self.trees is not None
        if tree.bundle is not None and not await self.trees.has(tree.base):
            await self.trees.receive(tree.base, await _fetch(tree.bundle))
        await self.trees.make_copy(copy, tree.patch, tree.ignored)

    async def _finish_copy(
        self,
        result: AgentResult,
        job: Job,
        shell: BashSession,
        copy: Copy,
        made: asyncio.Task[None],
    ) -> AgentResult:
        """A worker's change, read from its copy; then the copy goes. A copy that could not
        be made fails the agent, whatever it said: it never worked on the tree."""
        assert self.trees is not None and job.tree is not None
        await shell.close()  # nothing may still be writing in the copy
        keep = False
        try:
            try:
                await made
            except (OSError, OrchmodeError) as exc:
                return AgentResult(
                    f"error: the agent's copy of the tree could not be made: {exc}",
                    Status.FAILED,
                    result.turns,
                    result.usage,
                )
            if not job.tree.writable:
                return result
            try:
                change = await self.trees.change_of(copy)
            except OrchmodeError as exc:
                return AgentResult(
                    f"error: the agent's change could not be read from its copy: {exc}",
                    Status.FAILED,
                    result.turns,
                    result.usage,
                )
            if self.settings.verify:
                kept = _kept_key(job.tree, change.base, change.patch)
                if kept in self._kept:  # the same subtask again: the older copy goes
                    self.trees.discard(self._kept.pop(kept))
                self._kept[kept] = copy
                keep = True
            return replace(result, change=change)
        finally:
            if not keep:
                self.trees.discard(copy)

    async def _prewarm(self, shell: BashSession) -> None:
        """Start a shell ahead of need, a few at a time (see :data:`SPAWNS`)."""
        async with self._spawn_gate:
            await shell.start()
