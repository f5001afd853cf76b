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
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..core.background import Background
from ..core.errors import AuthError, OrchmodeError
from ..core.events import EventBus, WorkspacesChosen
from ..core.prompts import SUBAGENT_TOOLS, subagent_system
from ..core.results import AgentResult, Status
from ..core.schemas import typed_tools
from ..core.secrets import Masker, Secrets
from ..core.settings import Settings
from ..core.web_tools import session_web_tools
from ..core.wire import ToolSchema
from ..model.allowance import allowance_here, running
from ..model.budget import BudgetExhausted
from ..model.context import Window
from ..model.gateway import ModelChoice, ModelGateway
from ..shell.bash import BashSession
from ..shell.bwrap import overlay_problem
from ..shell.environment import command_environment
from ..shell.sandbox import Sandbox, ShellSandboxing
from ..store import Store
from ..store.claims import Claim
from ..tools.mcptools import with_mcp_tools
from ..trees.limits import DiskLimits, WriteWatch, floor_problem, watching
from ..trees.nested import working_in
from ..trees.trees import Trees
from ..trees.workspaces import Spec, Workspace, Workspaces
from . import Job, TreeJob
from .nesting import NESTING
from .permits import Permits
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


def _awaiting(task: asyncio.Task[None]) -> Callable[[], Awaitable[None]]:
    """The shell's wait for its workspace; one that failed is an OSError the shell reports."""

    async def wait() -> None:
        try:
            await asyncio.shield(task)
        except OrchmodeError as exc:
            raise OSError(f"the agent's copy of the tree could not be made: {exc}") from None

    return wait


def _reads_only(job: Job) -> bool:
    """Whether ``job`` runs in a role whose bash may only read the tree."""
    return job.agent is not None and job.agent.shell == "read"


def _shell_less(job: Job) -> bool:
    """Whether ``job`` runs in a role that has no bash: its shell is never started."""
    return job.agent is not None and job.agent.shell == "none"


async def _fetch(bundle: object) -> bytes:
    """A snapshot's bundle: the bytes themselves, or a Ray object ref to them."""
    if isinstance(bundle, bytes):
        return bundle
    data = await bundle  # type: ignore[misc]
    if not isinstance(data, bytes):
        raise OSError("the snapshot's bundle did not arrive")
    return data


class Shells(Protocol):
    """What a host needs of whatever makes its agents' shells: a :class:`ShellFactory`,
    or a test's own maker of shells."""

    #: The working directory the shells work in (a writing agent's disk is watched there).
    workdir: Path
    #: The sandbox the shells start in; None only when the user turned it off.
    sandbox: Sandbox | None

    def __call__(self) -> BashSession:
        """A shell in the working directory."""
        ...

    def reading(self) -> BashSession:
        """A shell that cannot write the working directory."""
        ...

    def in_workspace(
        self, workspace: Workspace, prepare: Callable[[], Awaitable[None]]
    ) -> BashSession:
        """A shell working in ``workspace``, once ``prepare`` has opened it."""
        ...


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
    #: Secret values masked in every command's output.
    masker: Masker | None = None
    #: Every shell it made that may still be running (see :meth:`abandon_all`).
    made: weakref.WeakSet[BashSession] = field(
        default_factory=weakref.WeakSet, repr=False, compare=False
    )

    @classmethod
    def build(
        cls,
        settings: Settings,
        workdir: Path,
        keys: tuple[str, ...],
        readable: tuple[Path, ...] = (),
        secrets: Secrets | None = None,
    ) -> ShellFactory:
        """From this process's environment, less credentials and any of ``keys``;
        ``readable`` directories are shown read-only inside the sandbox, ``secrets``' files
        are withheld and their values masked."""
        return cls(
            settings,
            workdir,
            command_environment(os.environ, keys),
            Sandbox.from_settings(settings, workdir, readable, secrets),
            secrets.masker if secrets is not None else None,
        )

    def abandon_all(self) -> None:
        """Kill every shell it made that is still up, at once: when a session ends after an
        interrupt, shells whose close was cancelled (or never began) go too. The filtering
        proxy its shells reached the network through stops with them."""
        for shell in list(self.made):
            shell.abandon()
        if self.sandbox is not None and self.sandbox.proxy is not None:
            self.sandbox.proxy.close()

    def __call__(self) -> BashSession:
        return self._shell(self.sandbox)

    def reading(self) -> BashSession:
        """A shell that cannot write the working directory (a role whose bash only reads).
        With the sandbox off nothing can hold it to that: a plain shell, as every agent's."""
        return self._shell(self.sandbox.read_only() if self.sandbox is not None else None)

    def floor_guard(self, disk: Path, what: str) -> Callable[[], str | None]:
        """A writing shell's guard: no command runs, nor goes on running, while the disk
        holding ``disk`` (``what``) has less free than ``min_free_disk_mb``."""
        limits = DiskLimits.from_settings(self.settings)

        def guard() -> str | None:
            problem = floor_problem(disk, limits, what)
            if problem is None:
                return None
            return f"orchmode: {problem} — free some disk, or lower min_free_disk_mb"

        return guard

    def _shell(self, sandbox: Sandbox | None) -> BashSession:
        writes = sandbox is None or sandbox.mode == "workspace-write"
        guard = self.floor_guard(self.workdir, "the working directory") if writes else None
        shell = BashSession(
            self.workdir,
            timeout=self.settings.bash_timeout,
            output_limit=self.settings.output_limit,
            env=self.env,
            sandbox=sandbox.for_shell() if sandbox is not None else None,
            masker=self.masker,
            guard=guard,
        )
        self.made.add(shell)
        return shell

    def in_workspace(
        self, workspace: Workspace, before_start: Callable[[], Awaitable[None]]
    ) -> BashSession:
        """A shell that works in ``workspace``: shown at the working directory's path inside
        the sandbox (an overlay mounted first, if it is one), with the ignored entries and
        the objects its git needs shown read-only. Unsandboxed (``--sandbox off``, where
        workspaces are copies) the shell simply starts in the copy."""
        writes = workspace.spec.writable
        guard = self.floor_guard(workspace.disk, "its workspace") if writes else None
        base = self.sandbox
        if base is None:
            sandbox = None
            cwd = workspace.view.root
        else:

            def build() -> Sandbox:  # once the workspace is open: its layers are known then
                view = workspace.view
                return base.in_copy(
                    view.root,
                    writable=view.writable,
                    shared=view.shown,
                    views=view.objects,
                    overlay=view.overlay,
                )

            sandbox = ShellSandboxing(build, base.mode)
            cwd = self.workdir
        shell = BashSession(
            cwd,
            timeout=self.settings.bash_timeout,
            output_limit=self.settings.output_limit,
            env=self.env,
            sandbox=sandbox,
            before_start=before_start,
            masker=self.masker,
            guard=guard,
        )
        self.made.add(shell)
        return shell


@dataclass
class AgentHost:
    """What running subagents needs in one process, and the running itself."""

    settings: Settings
    gateway: ModelGateway
    store: Store
    make_shell: Shells
    #: The tree's private store and copies, for jobs under ``worktree`` isolation.
    trees: Trees | None = None
    #: The user's MCP servers, shared by every agent this host runs.
    mcp: McpHub | None = None
    #: The session's secret values (a cluster's actors are given them too).
    masker: Masker | None = None
    #: The permission rules, and whom their ``ask`` goes to (None: no rules, as before).
    permits: Permits | None = None
    #: The agents' workspaces (``worktree`` isolation), of the kind that works here: chosen
    #: when the first isolated job comes. Workers' workspaces are kept for their verifiers.
    workspaces: Workspaces | None = field(default=None, repr=False)
    _choosing: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    _spawn_gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SPAWNS))
    _housekeeping: Background = field(default_factory=Background, repr=False)
    #: Shells started ahead for the agents to come (see :mod:`.pool`).
    pool: SandboxPool = field(init=False, repr=False)
    #: The API's web tools, for the roles whose ``tools`` name them.
    web_tools: list[ToolSchema] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.pool = SandboxPool(self.settings.max_concurrent, self._spawn_gate, self._discard_ready)
        rules = self.permits.rules if self.permits is not None else None
        self.web_tools, _ = session_web_tools(self.settings, rules)

    async def run(self, job: Job, events: EventBus) -> AgentResult:
        """The job's result; any failure but a rejected credential becomes an error result.

        Its claim is renewed here while it runs. The result is recorded in the background
        (finish_housekeeping() waits for it), so the chain goes on; the claim is let go in
        the same write, so an agent waiting on it never finds neither.
        """
        work = self._run_seated(job, events)
        claim = Claim.held(self.store, job.key, job.holder, self.settings.claim_lease)
        return await claim.around(work, job.role, job.prompt, later=self.background)

    async def _run_seated(self, job: Job, events: EventBus) -> AgentResult:
        """The agent run in its shell (and workspace), which are closed after it.

        A shell not taken ready from the pool starts while the first model request is in
        flight, so its start-up is off the critical path (and not ahead of a wave of
        requests going out); the pool refills then too. Closed in the background, for the
        same reason.
        """
        if self._in_copy(job):
            await self._choose_workspaces(events)
        kind = self._pool_kind(job)
        ready = (self.pool.take(kind) if kind is not None else None) or self._fresh(job)
        shell, workspace, made = ready.shell, ready.workspace, ready.made
        # Its connections through the network proxy are this agent's from now on (a pooled
        # shell was started before the agent was known).
        shell.seat.agent = job.name
        shell.seat.emit = events.emit
        try:
            result = await self._run_agent(job, events, ready, kind)
        except BaseException:
            if made is not None:
                made.cancel()  # its workspace goes with the run's directory at the end
                self.background(shell.close())
            raise
        finally:
            if workspace is None:
                self.background(shell.close())
        if workspace is not None and made is not None:
            result = await self._finish_workspace(result, job, shell, workspace, made)
        return result

    async def _run_agent(
        self, job: Job, events: EventBus, ready: Ready, kind: Hashable | None
    ) -> AgentResult:
        """The subagent's result; a failure of its own is an error result."""
        shell = ready.shell
        try:
            mcp_permit = None
            if self.permits is not None:
                # asked with the agent parked, if it waits for the user
                self.permits.attach(shell, job.name, events.emit)
                mcp_permit = self.permits.for_agent(job.name, events.emit).mcp

            def first_request_sent() -> None:
                self._first_request_sent(job, kind, shell)

            watch = self._watch(job, shell, ready.workspace)
            agent = await self._agent(job, events, shell, first_request_sent)
            agent.watch, agent.mcp_permit = watch, mcp_permit
            async with watching(watch):
                with (
                    running(allowance_here(job.limits, job.name)),
                    working_in(ready.workspace, shell, ready.made),
                ):
                    return await agent.run(job.prompt)
        except AuthError:
            raise  # retrying cannot help: stop the whole run
        except BudgetExhausted as exc:
            return AgentResult(f"[orchmode: stopped — {exc}]", Status.SKIPPED)
        except Exception as exc:
            return AgentResult(describe_failure(exc), Status.FAILED)

    async def _agent(
        self, job: Job, events: EventBus, shell: BashSession, on_first_request: Callable[[], None]
    ) -> Subagent:
        """The subagent for ``job``: its role's tools, prompt and model, working in ``shell``."""
        tools = await with_mcp_tools(SUBAGENT_TOOLS, self.mcp, job.role)
        nesting = NESTING.get()
        if nesting is not None:  # offered Workflow (a worker may fan out through it)
            tools = [nesting.tool, *tools]
        if job.agent is not None:
            tools = job.agent.offered([*tools, *self.web_tools])
        choice = ModelChoice.of(self.settings, job.role, job.agent)
        window = Window.from_settings(self.settings, choice.model)
        turns = self.settings.subagent_turns
        return Subagent(
            gateway=self.gateway,
            shell=shell,
            events=events,
            name=job.name,
            system=subagent_system(job.agent),
            tools=typed_tools(tools, job.schema),
            max_turns=(job.limits.turns or turns) if job.limits is not None else turns,
            on_first_request=on_first_request,
            window=window,
            mcp=self.mcp,
            role=job.role,
            schema=job.schema,
            choice=choice,
            agent=job.agent,
        )

    async def finish_housekeeping(self) -> None:
        """Wait for the housekeeping so far: results recorded, claims let go, shells closed,
        the requests' use in the budget ledger."""
        for failure in await self._housekeeping.wait():
            log.warning("housekeeping after a subagent failed: %s", failure)
        if self.gateway.budget is not None:
            await self.gateway.budget.flush()
        await self.pool.drain()
        if self.workspaces is not None:
            self.workspaces.discard_kept()  # kept for verifiers that ran elsewhere, or not at all

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Housekeeping off the critical path; :meth:`finish_housekeeping` waits for all of it."""
        self._housekeeping.start(work)

    def _watch(
        self, job: Job, shell: BashSession, workspace: Workspace | None
    ) -> WriteWatch | None:
        """What watches an agent that writes: what it wrote in its workspace (when it has
        one) against ``agent_write_mb``, and the free disk against ``min_free_disk_mb``;
        past either, its shell is stopped at once, and it may only report (see
        :class:`Subagent`). None for an agent that cannot write."""
        limits = DiskLimits.from_settings(self.settings)
        if workspace is not None:
            if not workspace.spec.writable:
                return None
            return WriteWatch(limits, workspace.disk, workspace.written, shell.stop)
        factory = self.make_shell
        if _reads_only(job):
            return None
        if factory.sandbox is not None and factory.sandbox.mode != "workspace-write":
            return None
        return WriteWatch(limits, factory.workdir, None, shell.stop, where="the working directory")

    def _pool_kind(self, job: Job) -> Hashable | None:
        """Which pooled shells suit ``job``: any shell for a shared tree, one in a fresh
        workspace of its snapshot for a worker; None for any other workspace, for a role
        whose bash only reads the tree, and for one that has no bash."""
        if _reads_only(job) or _shell_less(job):
            return None
        if not self._in_copy(job):
            return SHARED
        assert job.tree is not None
        if job.tree.writable and not job.tree.patch:
            if job.tree.pending is not None:
                return job.tree.pending  # the call's snapshot, still being taken
            return (job.tree.base, job.tree.ignored)
        return None

    def _in_copy(self, job: Job) -> bool:
        return job.tree is not None and self.trees is not None

    async def _choose_workspaces(self, events: EventBus) -> None:
        """Overlays where they work, else full copies; said once, with the reason."""
        async with self._choosing:
            if self.workspaces is not None:
                return
            assert self.trees is not None
            await self.trees.open()
            reason = await asyncio.to_thread(self._overlay_problem)
            self.workspaces = Workspaces(
                self.trees, overlays=reason is None, limits=DiskLimits.from_settings(self.settings)
            )
            if reason is not None:
                log.info("agents' workspaces are full copies: %s", reason)
            events.emit(WorkspacesChosen(reason is None, reason or ""))

    def _overlay_problem(self) -> str | None:
        assert self.trees is not None
        settings = self.settings
        if settings.workspaces == "copy":
            return "full copies were asked for (workspaces = copy)"
        if self.make_shell.sandbox is None:
            return "the sandbox is off, and overlays are mounted inside it"
        return overlay_problem(settings.sandbox_bwrap, settings.allow_network, self.trees.store.run)

    def _fresh(self, job: Job, stem: str | None = None) -> Ready:
        """A new shell for ``job``: in a workspace being opened, if it works in one."""
        if not self._in_copy(job):
            if _reads_only(job):
                return Ready(self.make_shell.reading())
            return Ready(self.make_shell())
        assert job.tree is not None and self.workspaces is not None
        tree = job.tree
        spec = Spec(tree.base, tree.patch, tree.writable, tree.ignored, tree.chain)
        workspace = self.workspaces.workspace(stem or job.name, spec)
        # Opened while the first model request is in flight; the shell waits for it.
        made = asyncio.create_task(self._open(workspace, tree))
        return Ready(self.make_shell.in_workspace(workspace, _awaiting(made)), workspace, made)

    def _first_request_sent(self, job: Job, kind: Hashable | None, shell: BashSession) -> None:
        if not shell.running and not _shell_less(job):
            self.background(self._prewarm(shell))
        if kind is not None:
            self.pool.refill(kind, lambda: self._fresh(job, "ready"))

    async def _discard_ready(self, ready: Ready) -> None:
        """A pooled shell no agent took: closed, and its workspace (once open) discarded."""
        await ready.shell.close()
        if ready.workspace is None:
            return
        if ready.made is not None:
            with contextlib.suppress(Exception):
                await ready.made
        ready.workspace.discard()

    async def _open(self, workspace: Workspace, tree: TreeJob) -> None:
        assert self.trees is not None
        if tree.pending is not None:  # the snapshot is taken now
            tree = await tree.with_snapshot()
            workspace.spec = replace(workspace.spec, base=tree.base, ignored=tree.ignored)
        if tree.bundle is not None and not await self.trees.store.has(tree.base):
            await self.trees.store.receive(tree.base, await _fetch(tree.bundle))
        await workspace.open()

    async def _finish_workspace(
        self,
        result: AgentResult,
        job: Job,
        shell: BashSession,
        workspace: Workspace,
        made: asyncio.Task[None],
    ) -> AgentResult:
        """The agent's change, read from its workspace as it closes. A workspace that could
        not be made fails the agent, whatever it said: it never worked on the tree."""
        assert job.tree is not None
        await shell.close()  # nothing may still be writing in it
        try:
            await made
        except (OSError, OrchmodeError) as exc:
            workspace.discard()
            return AgentResult(
                f"error: the agent's copy of the tree could not be made: {exc}",
                Status.FAILED,
                result.turns,
                result.usage,
            )
        verified = self.settings.verify and (job.agent is None or job.agent.verify)
        # one that did not finish is not verified: its workspace (perhaps at its disk cap)
        # goes at once
        keep = verified and job.tree.writable and not job.tree.patch and result.finished
        try:
            change = await workspace.close(keep_for=job.tree.chain if keep else None)
        except OrchmodeError as exc:
            return AgentResult(
                f"error: the agent's change could not be read from its copy: {exc}",
                Status.FAILED,
                result.turns,
                result.usage,
            )
        if change is None:
            return result
        if self.masker and self.masker.holds(change.patch):
            # kept out of the journal and the tree alike; the agent read it from git's
            # history, or a credential from somewhere the sandbox could not hide
            return AgentResult(
                "error: the agent's change writes the value of a secret (held by a file "
                "secret_files withholds, or a credential) into the tree, and was dropped",
                Status.FAILED,
                result.turns,
                result.usage,
            )
        return replace(result, change=change)

    async def _prewarm(self, shell: BashSession) -> None:
        """Start a shell ahead of need, a few at a time (see :data:`SPAWNS`)."""
        async with self._spawn_gate:
            await shell.start()
