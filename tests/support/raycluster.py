"""A real Ray cluster of several nodes on this machine, for tests and benchmarks.

Each node is a ``ray start --block`` process with an address of its own on the loopback
range (127.0.0.2, 127.0.0.3, …; Ray swaps 127.0.0.1 for the machine's outward address),
in a process group of its own, so a test can take one node away with everything it runs.
The cluster uses token authentication and no dashboard.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

#: Waiting longer than this for a node to join means something is wrong with the machine.
JOIN_TIMEOUT = 90.0


class RayUnavailable(RuntimeError):
    """Ray is not installed, or its nodes would not start here."""


@dataclass
class LocalCluster:
    address: str
    #: What a process needs in its environment to join: the token and its mode.
    env: dict[str, str]
    temp_dir: Path
    cpus: int = 1
    ray: str = "ray"
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)

    def start_node(self) -> None:
        """Start one more node, on the next loopback address; the first is the head."""
        index = len(self.nodes)
        ip = f"127.0.0.{2 + index}"
        common = ["--block", "--num-cpus", str(self.cpus), "--disable-usage-stats"]
        if index == 0:
            port = self.address.rsplit(":", 1)[1]
            where = ["--head", "--port", port, "--include-dashboard", "false"]
            where += ["--temp-dir", str(self.temp_dir)]
        else:
            where = ["--address", self.address]
        with (self.temp_dir / "nodes.log").open("ab") as log:
            node = subprocess.Popen(
                [self.ray, "start", *where, "--node-ip-address", ip, *common],
                env=self.full_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.nodes.append(node)
        self.addresses.append(ip)
        if index == 0:
            host, port = self.address.rsplit(":", 1)
            _wait_for_port(host, int(port), node)

    def add_node(self) -> str:
        """Start a node that joins the running cluster; its address once it has joined."""
        self.start_node()
        _wait_for_nodes(self, len(self.nodes))
        return self.addresses[-1]

    def full_env(self) -> dict[str, str]:
        return {**os.environ, **self.env, "RAY_USAGE_STATS_ENABLED": "0"}

    def kill_node(self, index: int) -> None:
        """Take node ``index`` away at once, as a crashed machine goes: SIGKILL to all of it.

        All of it is its session: Ray puts each worker process in a process group of its
        own, but they all stay in the session that the node's ``ray start`` began.
        """
        node = self.nodes[index]
        for pid in session_members(node.pid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _kill_group(node, signal.SIGKILL)


def session_members(session: int) -> list[int]:
    """The processes of a session (whose session id is ``session``), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended while we looked
        if int(fields[3]) == session:
            members.append(int(stat.parent.name))
    return members


def ray_command() -> str:
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise RayUnavailable("Ray is not installed: pip install 'orchmode[ray]'")
    return found


@contextmanager
def local_ray_cluster(nodes: int = 2, cpus: int = 1) -> Iterator[LocalCluster]:
    """Start ``nodes`` Ray nodes on loopback addresses; stop them all on exit."""
    ray = ray_command()
    token = secrets.token_hex(32)
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    # Short: Ray's socket paths under it must fit in 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    head_ip = "127.0.0.2"
    port = _free_port(head_ip)
    cluster = LocalCluster(f"{head_ip}:{port}", env, temp_dir, cpus=cpus, ray=ray)
    try:
        for _ in range(nodes):
            cluster.start_node()
        _wait_for_nodes(cluster, nodes)
        yield cluster
    finally:
        for node in cluster.nodes:
            _kill_group(node, signal.SIGTERM)
        for node in cluster.nodes:
            try:
                node.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _kill_group(node, signal.SIGKILL)
                node.wait()
        for index in range(len(cluster.nodes)):  # any worker the node left behind
            cluster.kill_node(index)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _kill_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_for_port(host: str, port: int, node: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        if node.poll() is not None:
            raise RayUnavailable(f"the Ray head node exited with status {node.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RayUnavailable("the Ray head node never listened") from None
            time.sleep(0.1)  # a process we started is coming up; nothing to wait on but it


_COUNT_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[3])
while sum(1 for n in ray.nodes() if n["Alive"]) < int(sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.2)
"""


def _wait_for_nodes(cluster: LocalCluster, count: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_NODES, cluster.address, str(count), str(JOIN_TIMEOUT)],
        env=cluster.full_env(),
        capture_output=True,
        timeout=JOIN_TIMEOUT + 30,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise RayUnavailable(f"{count} Ray nodes never joined: {' | '.join(tail)}")
