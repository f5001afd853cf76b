"""The Ray executor: subagents run as coroutines in async actors on a Ray cluster's nodes.

Each live node gets ``--ray-actors`` actors (pinned to it), each running up to
``--ray-max-per-actor`` subagents at once; a job goes to the least busy actor. An actor
runs its jobs through an :class:`AgentHost` of its own, in the working directory Ray
unpacked on its node, with its own sandbox, its own connection to the PostgreSQL store
and its own gateway to the Messages API. It streams each agent's events back as they
happen and ends the stream with the result, which it records in the background.

Secrets (the API key, the store's password) go to the actors as arguments of their
creation, through Ray's object transport. They are kept out of the runtime environment's
``env_vars`` on purpose: Ray's runtime-environment agent logs that dict, values and all,
to every node's ``runtime_env_agent.log``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..core.errors import AuthError, ClusterError
from ..core.events import (
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BashStarted,
    BatchEnded,
    BatchSent,
    BatchWaiting,
    Event,
    EventBus,
    McpCallDone,
    McpCallStarted,
    McpServerFailed,
    ModelRequestDone,
    NetworkConnection,
    WorkspacesChosen,
)
from ..core.permissions import Rules
from ..core.results import AgentResult, Status
from ..core.secrets import Masker, SecretFiles, Secrets
from ..core.settings import Settings
from ..model.gateway import ModelGateway, session_gateway
from ..model.providers import Credentials
from ..store import Store, open_store
from ..tools.mcpconfig import McpConfig, load
from ..tools.mcptools import McpHub
from ..trees.trees import Trees
from . import Job, WorkerLost
from .host import AgentHost, ShellFactory
from .node import NodeParts, node_parts, session_permits
from .parking import RemoteParking
from .parking import current as current_parking
from .permits import Permits
from .upload import package_workdir

log = logging.getLogger("orchmode")

#: Events an agent's work makes on a node, sent to the driver in its job's stream: the
#: driver records them and shows them, as if the agent ran there.
AGENT_EVENTS = (
    ModelRequestDone,
    BashStarted,
    BashDone,
    McpCallStarted,
    McpCallDone,
    NetworkConnection,
    ApprovalRequested,
    ApprovalAnswered,
    BatchWaiting,
)

#: Seconds to wait for the head node's port to answer before giving up.
REACH_TIMEOUT = 5.0
#: Seconds between looks for nodes that joined the cluster during a run.
LOOK_EVERY = 5.0

#: What Ray raises when the actor a call went to, or the node under it, is gone.
LOST = (
    ray.exceptions.RayActorError,  # ActorDiedError and ActorUnavailableError among them
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
)


class Secret:
    """A string that never shows itself in a repr, a log line or an error message."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "Secret(***)"


@dataclass(frozen=True)
class NodeInfo:
    """What an actor reports of itself once ready."""

    node_id: str
    address: str
    pid: int
    #: Why bash cannot be sandboxed on that node, if it cannot.
    sandbox_problem: str | None


@dataclass(frozen=True)
class Finished:
    """The last item of a job's stream: its result, or the credential error that stops all."""

    result: AgentResult | None
    auth_error: str | None = None


@dataclass(frozen=True)
class ActorStats:
    pid: int
    #: The actor process's peak resident memory, in bytes.
    peak_rss: int
    running: int
    #: CPU seconds the actor process has used, user and system.
    cpu: float


class AgentPool:
    """One Ray actor: many subagents at once, as coroutines, on the node it is pinned to."""

    def __init__(
        self,
        settings: Settings,
        credentials: Credentials,
        store_url: Secret,
        mcp: McpConfig | None = None,
        masked: Secret | None = None,
        rules: tuple[Rules, str] | None = None,
    ) -> None:
        self.settings = settings
        self.credentials = credentials
        self.store_url = store_url
        #: The driver's permission rules and working directory: an ``ask`` on this node is
        #: a question in the store, answered from wherever the user is.
        self.rules = rules
        #: The driver's secret values, one per line, masked here as there.
        self.masked = masked
        self.mcp_config = mcp
        #: This node's own MCP servers: stdio ones start here, HTTP ones are reached from here.
        self.mcp: McpHub | None = None
        self.events = EventBus()
        self.events.subscribe(self._route)
        self.routes: dict[str, Callable[[Event], None]] = {}
        self.hosts: dict[str, AgentHost] = {}
        #: The driver's secrets and this node's, masked in all that leaves the node.
        self.node_masker: Masker | None = None
        self.store: Store | None = None
        self.gateways: list[ModelGateway] = []
        self.make_shell: ShellFactory | None = None
        self.trees: Trees | None = None
        self.node: NodeParts | None = None

    async def ready(self) -> NodeInfo:
        """Open the store and build the shells' sandbox; say where this actor is."""
        self.store = await open_store(self.store_url.value)
        credentials = self.credentials
        secrets: tuple[str, ...] = (*credentials.secrets, self.store_url.value)
        if self.mcp_config is not None:
            self.mcp = McpHub.of(self.mcp_config, self.settings, Path.cwd(), self.events)
            secrets += self.mcp_config.secrets
        masker = Masker(self.masked.value.split("\n") if self.masked else ())
        withheld = Secrets(SecretFiles(self.settings.secret_files), Path.cwd(), masker)
        withheld.look()
        # Copies live outside the directory Ray unpacked: Ray may replace that one.
        home = Path(tempfile.mkdtemp(prefix="orchmode-trees-"))
        self.node = node_parts(
            self.settings, Path.cwd(), withheld, secrets, self.mcp, trees_home=home
        )
        self.node_masker = masker
        self.make_shell, self.trees = self.node.make_shell, self.node.trees
        sandbox = self.make_shell.sandbox
        problem = sandbox.probe().problem if sandbox is not None else None
        context = ray.get_runtime_context()
        address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return NodeInfo(context.get_node_id(), address, os.getpid(), problem)

    async def run(self, job: Job) -> AsyncIterator[Event | Finished]:
        """The job's events as they happen, then its :class:`Finished`."""
        host = self._host(job.session)
        queue: asyncio.Queue[Event | Finished] = asyncio.Queue()
        self.routes[job.name] = queue.put_nowait
        task = asyncio.create_task(host.run(job, self.events))
        task.add_done_callback(lambda done: queue.put_nowait(_finished(done)))
        try:
            while True:
                item = await queue.get()
                yield item
                if isinstance(item, Finished):
                    return
        finally:
            self.routes.pop(job.name, None)
            if not task.done():
                task.cancel()  # the caller went away: its claim is let go for a rerun

    async def finish_housekeeping(self) -> None:
        """Wait until this actor's results are recorded and its claims let go."""
        for host in list(self.hosts.values()):
            await host.finish_housekeeping()

    async def stats(self) -> ActorStats:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        return ActorStats(os.getpid(), usage.ru_maxrss * 1024, len(self.routes), cpu)

    async def shutdown(self) -> None:
        for host in self.hosts.values():
            await host.finish_housekeeping()
        for gateway in self.gateways:
            await gateway.close()
        if self.mcp is not None:
            await self.mcp.close()
        if self.trees is not None:
            self.trees.close()
        if self.store is not None:
            await self.store.close()

    def _host(self, session: str) -> AgentHost:
        host = self.hosts.get(session)
        if host is None:
            if self.store is None or self.make_shell is None:
                raise RuntimeError("the actor was not made ready")
            gateway = session_gateway(
                self.settings, self.credentials, self.events, self.store, session
            )
            self.gateways.append(gateway)
            permits = None
            if self.rules is not None and self.node is not None:
                rules, workdir = self.rules
                _, permits = session_permits(
                    rules, self.store, session, Path(workdir), self.settings, self.events.emit,
                    self.node,
                )  # fmt: skip
            host = AgentHost(
                self.settings,
                gateway,
                self.store,
                self.make_shell,
                self.trees,
                self.mcp,
                permits=permits,
            )
            self.hosts[session] = host
        return host

    def _route(self, event: Event) -> None:
        """Send an agent's event to the stream of the job it belongs to."""
        deliver: Callable[[Event], None] | None = None
        if isinstance(event, AGENT_EVENTS):
            deliver = self.routes.get(event.agent)
        elif isinstance(event, McpServerFailed | WorkspacesChosen | BatchSent | BatchEnded):
            # Said once on the node: to whichever job is running, so the driver says it too.
            deliver = next(iter(self.routes.values()), None)
        if deliver is not None:
            deliver(event)


def _finished(task: asyncio.Task[AgentResult]) -> Finished:
    if task.cancelled():
        return Finished(AgentResult("[orchmode: cancelled]", Status.FAILED))
    failure = task.exception()
    if isinstance(failure, AuthError):
        return Finished(None, str(failure))
    if failure is not None:
        return Finished(AgentResult(f"error: the subagent failed: {failure}", Status.FAILED))
    return Finished(task.result())


@dataclass
class _Member:
    actor: Any
    node: str
    info: NodeInfo
    running: int = 0
    alive: bool = True


@dataclass
class RayExecutor:
    """Runs jobs on a Ray cluster; one per session process, started before the first job."""

    settings: Settings
    credentials: Credentials
    workdir: Path
    #: The session's secret values, shipped to every actor to mask there too.
    masker: Masker | None = None
    #: The session's permission rules, shipped to every actor to ask there too.
    permits: Permits | None = None
    members: list[_Member] = field(default_factory=list)
    _changed: asyncio.Condition | None = None
    _tmp: Path | None = None
    _started: bool = False
    #: When nodes were last looked for, and the background task starting actors on new ones.
    _looked: float = 0.0
    _joining: asyncio.Task[None] | None = None
    #: Snapshots already in Ray's object store, by commit.
    _bundles: dict[str, Any] = field(default_factory=dict)
    #: The user's MCP servers, read once and shipped to every actor (each starts its own).
    _mcp: McpConfig | None = None

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        _check_reachable(self.settings.ray_address)
        if self.settings.mcp_config is not None:
            self._mcp = load(self.settings.mcp_config, os.environ)
        self._tmp = Path(tempfile.mkdtemp(prefix="orchmode-ray-"))
        package = package_workdir(
            self.workdir,
            self.settings.ray_max_upload_mb,
            self._tmp,
            SecretFiles(self.settings.secret_files),
        )
        log.info("shipping %d files (%d bytes) to the Ray nodes", package.files, package.size)
        try:
            ray.init(
                address=self.settings.ray_address,
                runtime_env={"working_dir": str(package.path)},
                log_to_driver=False,
                logging_level=logging.WARNING,
                namespace="orchmode",
            )
        except Exception as exc:  # ConnectionError, AuthenticationError, ValueError …
            raise ClusterError(
                f"could not join the Ray cluster at {self.settings.ray_address}: "
                f"{_first_line(exc)} — start one with `ray start --head`, or pass its "
                "head's host:port with --ray-address (and its token in RAY_AUTH_TOKEN if "
                "it uses RAY_AUTH_MODE=token)"
            ) from None
        self._changed = asyncio.Condition()
        await self._fill()
        self._looked = time.monotonic()

    async def run(
        self, job: Job, events: EventBus, on_placed: Callable[[str], None]
    ) -> AgentResult:
        member = await self._pick()
        member.running += 1
        on_placed(member.node)
        stream = member.actor.run.options(num_returns="streaming").remote(job)
        # its approvals are asked on the node; its slot is here, and given away meanwhile
        away = RemoteParking(current_parking())
        try:
            async for ref in stream:
                item = await ref
                if isinstance(item, Finished):
                    if item.auth_error is not None:
                        raise AuthError(item.auth_error)
                    assert item.result is not None
                    return item.result
                events.emit(item)
                away.follow(item)
            raise WorkerLost(member.node, "its stream ended without a result")
        except LOST as exc:
            await self._lost(member)
            reason = (
                "its actor stopped answering"
                if isinstance(exc, ray.exceptions.RayActorError)
                else _first_line(exc)
            )
            raise WorkerLost(member.node, reason) from None
        except ray.exceptions.RayError as exc:
            return AgentResult(
                f"error: the subagent failed on Ray: {_first_line(exc)}", Status.FAILED
            )
        except asyncio.CancelledError:
            ray.cancel(stream)
            raise
        finally:
            await away.end()
            member.running -= 1
            await self._notify()

    async def share_tree(self, trees: Trees, commit: str) -> Any:
        """The snapshot as a git bundle in Ray's object store, put there once per snapshot
        and fetched by each node that runs a copy of it."""
        ref = self._bundles.get(commit)
        if ref is None:
            ref = ray.put(await trees.store.bundle(commit))
            self._bundles[commit] = ref
        return ref

    async def finish_housekeeping(self) -> None:
        live = [m for m in self.members if m.alive]
        answers = await asyncio.gather(
            *(m.actor.finish_housekeeping.remote() for m in live), return_exceptions=True
        )
        for member, answer in zip(live, answers, strict=True):
            if isinstance(answer, Exception):  # a lost node's results are rerun, not lost
                log.warning("node %s could not finish its records: %s", member.node, answer)

    async def close(self) -> None:
        if self._joining is not None:
            self._joining.cancel()
        if self.members:
            live = [m for m in self.members if m.alive]
            await asyncio.gather(*(m.actor.shutdown.remote() for m in live), return_exceptions=True)
            for member in live:
                ray.kill(member.actor)
            self.members.clear()
        if self._started and ray.is_initialized():
            ray.shutdown()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    async def stats(self) -> dict[str, list[ActorStats]]:
        """Each live node's actors, for benchmarks: pid, peak memory, jobs running."""
        by_node: dict[str, list[ActorStats]] = {}
        for member in self.members:
            if member.alive:
                by_node.setdefault(member.node, []).append(await member.actor.stats.remote())
        return by_node

    async def _fill(self) -> None:
        """Start actors on every live node that has none; raise if no node can run any."""
        covered = {m.info.node_id for m in self.members if m.alive}
        every: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        nodes = [n for n in every if n.get("Alive") and n["NodeID"] not in covered]
        remote: Any = ray.remote(AgentPool)
        settings = self.settings.model_copy(
            update={
                "store": None,
                "journal": None,
                "workdir": None,
                "base_url": self.settings.base_url or os.environ.get("ANTHROPIC_BASE_URL"),
            }
        )
        store_url = Secret(self.settings.store or "")
        masked = Secret("\n".join(self.masker.secrets)) if self.masker is not None else None
        permits = self.permits
        rules = (permits.rules, str(permits.workdir)) if permits is not None else None
        actors: list[Any] = [
            remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                max_concurrency=self.settings.ray_max_per_actor,
                num_cpus=0,
                max_restarts=0,
            ).remote(settings, self.credentials, store_url, self._mcp, masked, rules)
            for node in nodes
            for _ in range(self.settings.ray_actors)
        ]
        answers = await asyncio.gather(*(a.ready.remote() for a in actors), return_exceptions=True)
        failures: list[str] = []
        infos: list[tuple[Any, NodeInfo]] = []
        for actor, answer in zip(actors, answers, strict=True):
            if isinstance(answer, NodeInfo):
                infos.append((actor, answer))
            else:
                failures.append(_first_line(answer))
                ray.kill(actor)
        nodes_seen = {info.node_id: info.address for _, info in infos}
        nodes_seen.update({m.info.node_id: m.info.address for m in self.members})
        addresses = list(nodes_seen.values())
        for actor, info in infos:
            if info.sandbox_problem is not None and self.settings.sandbox != "off":
                log.warning("node %s cannot sandbox bash: %s", info.address, info.sandbox_problem)
            self.members.append(_Member(actor, _label(info, addresses), info))
        if not any(m.alive for m in self.members):
            reason = f": {failures[0]}" if failures else ": the cluster has no live node"
            raise ClusterError(
                f"no Ray node could run subagents{reason} — every node needs "
                "`pip install 'orchmode[ray]'` in the same Python as the head"
            )
        for failure in failures:
            log.warning("a Ray actor could not start: %s", failure)

    async def _pick(self) -> _Member:
        """The live actor with the fewest jobs, once one has room."""
        assert self._changed is not None
        self._look_for_new_nodes()
        async with self._changed:
            while True:
                live = [m for m in self.members if m.alive]
                if not live:
                    await self._fill()
                    continue
                member = min(live, key=lambda m: m.running)
                if member.running < self.settings.ray_max_per_actor:
                    return member
                await self._changed.wait()

    def _look_for_new_nodes(self) -> None:
        """Now and then, start actors on nodes that joined (or came back) since the start.

        In the background: an actor takes a second or more to start, and jobs should not
        wait for it while the nodes already known have room.
        """
        now = time.monotonic()
        if now - self._looked < LOOK_EVERY or (self._joining and not self._joining.done()):
            return
        self._looked = now

        async def join() -> None:
            try:
                await self._fill()
            except ClusterError as exc:  # _pick reports it when no node is left at all
                log.warning("%s", exc)
            await self._notify()

        self._joining = asyncio.create_task(join())

    async def _lost(self, member: _Member) -> None:
        if member.alive:
            member.alive = False
            log.warning("lost the Ray actor on node %s", member.node)

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()


def _check_reachable(address: str) -> None:
    """Fail in seconds on a head that does not answer: Ray itself keeps trying for minutes."""
    if address == "auto":
        return  # Ray finds the local cluster, or says at once that there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray-address {address!r} is not auto or host:port")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT):
            return
    except OSError as exc:
        raise ClusterError(
            f"no Ray head answers at {address} ({exc.strerror or exc}) — start one with "
            "`ray start --head`, or pass its host:port with --ray-address"
        ) from None


def _label(info: NodeInfo, addresses: list[str]) -> str:
    """A node's name in the records: its address, and its id too if the address is shared."""
    if addresses.count(info.address) > 1:
        return f"{info.address}#{info.node_id[:6]}"
    return info.address


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
