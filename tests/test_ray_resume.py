"""`orchmode resume` of a run whose driver was SIGKILLed during a fan-out on a real Ray cluster.

The nodes are real ``ray start`` processes (see ``tests/support/raycluster.py``), the
store is a real PostgreSQL server, the model is the scripted server, and both the killed
run and its resume are ``orchmode`` processes, as a user runs them. The main agent plans
anew on every request, so the resume passes only if nothing asks it for the plan again.

When the driver dies, the agents it had placed die with it: Ray ends the actors a dead
driver owned (within a fraction of a second here). The claims held for the dead run — the
actors' on their running agents, the driver's on the agents still waiting for a slot — are
renewed no more. They lapse within ``--claim-lease`` (2 s here: gone by the time the
resumed driver's actors are up), or, being all in the driver's name, are taken over at
once by a resume on its host that finds that process gone. Either way the resumed
fan-out takes every one of them over.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import (
    OrchestrationScenario,
    mode_is_on,
    role_of,
    tool_call,
    turn_messages,
)
from recorded_runs import base_env
from support.raycluster import (
    LocalCluster,
    RayUnavailable,
    local_ray_cluster,
    session_members,
)

pytestmark = pytest.mark.timeout(300)

API_KEY = f"sk-ant-test-{secrets.token_hex(12)}"
SUBTASKS = 16
#: Seconds every model request takes: a fan-out of 16 chains, 4 at a time, lasts ~4 s.
DELAY = 0.5
#: A short lease, so the killed run's claims lapse quickly for the resume.
LEASE = ("--claim-lease", "2")
FLAGS = ("--max-concurrent", "4", "--sandbox", "off", *LEASE)
#: The resume starts its actors, takes over the claims (or waits out their 2 s leases) and
#: runs what is left: ~15 s. Much longer means it waited on more than lapsing claims
#: (actors that outlived their driver and kept theirs renewed, say, or a 30 s lease).
RESUME_BOUND = 90.0
#: How the workers of a plan are told apart: each subtask carries the plan's request number.
PLAN_TAG = re.compile(r"\(plan (\d+)\)")


@dataclass
class Replanning(OrchestrationScenario):
    """A main agent that samples a new plan on every request, as a real model does.

    Each subtask carries the number of the request that planned it, so a resume that asked
    for the plan again would run other subtasks, and show it.
    """

    plans: int = 0

    def main(self, request: ScriptedRequest) -> Reply:
        messages = request.messages
        if mode_is_on(messages) and self.scout_command is not None:
            step = sum(1 for m in turn_messages(messages) if m.get("role") == "assistant")
            if step == 1:
                self.plans += 1
                subtasks = [f"{s} (plan {request.index})" for s in self.subtask_list()]
                return tool_call("Workflow", {"subtasks": subtasks}, say="Fanning out.")
        return super().main(request)


def scenario() -> Replanning:
    return Replanning(subtasks=SUBTASKS, delay=DELAY, worker_command=None)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """Two nodes of its own, so the only actors on them are this test's."""
    try:
        with local_ray_cluster(nodes=2) as started:
            yield started
    except RayUnavailable as exc:
        if os.environ.get("ORCHMODE_TEST_RAY") == "required":
            pytest.fail(f"{exc} (ORCHMODE_TEST_RAY=required)")
        pytest.skip(str(exc))


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start a process; any still running when the test ends is killed."""
    processes: list[subprocess.Popen[str]] = []

    def start(command: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, text=True, **kwargs)
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate()


def orchmode_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchmode", *args]


def run_env(cluster: LocalCluster | None) -> dict[str, str]:
    env = base_env(ANTHROPIC_API_KEY=API_KEY)
    if cluster is not None:
        env.update(cluster.env)
    return env


def on_ray(cluster: LocalCluster, store: str) -> list[str]:
    return ["--executor", "ray", "--ray-address", cluster.address, "--store", store]


def asked(server: ScriptedServer, role: str, since: int = 0) -> list[str]:
    """The first prompts of the requests made to the model for ``role`` since ``since``."""
    bodies = [e.body for e in server.log[since:] if e.path == "/v1/messages"]
    return [b["messages"][0]["content"] for b in bodies if role_of(b) == role]


def query(store: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows read from PostgreSQL behind orchmode's back."""
    with psycopg.connect(store, autocommit=True) as db:
        return db.execute(sql, params).fetchall()


def recorded_workers(store: str) -> set[str]:
    try:
        return {p for (p,) in query(store, "SELECT prompt FROM results WHERE role = 'worker'")}
    except psycopg.errors.UndefinedTable:  # the run has not made its tables yet
        return set()


def agent_pools(cluster: LocalCluster) -> set[int]:
    """The pids of the orchmode actor processes on the cluster's nodes, from /proc.

    A node's processes all stay in the session its ``ray start`` began; looking only there
    leaves out any other cluster on the machine.
    """
    pids = set()
    for node in cluster.nodes:
        for pid in session_members(node.pid):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::AgentPool"):
                    pids.add(pid)
            except OSError:
                continue  # it ended while we looked
    return pids


def item_of(subtask: str) -> int:
    found = re.match(r"Check item (\d+) ", subtask)
    assert found, subtask
    return int(found[1])


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_ray_run_whose_driver_is_killed_mid_fanout_resumes_without_a_new_plan(
    cluster: LocalCluster,
    postgres_clean_url: str,
    tmp_path: Path,
    scripted: Any,
    spawn: Callable[..., subprocess.Popen[str]],
) -> None:
    store = postgres_clean_url
    # What the run prints when nothing stops it (the local executor prints the same), run
    # alongside the one that is killed.
    alone = scripted(scenario(), api_key=API_KEY)
    (tmp_path / "uninterrupted").mkdir()
    uninterrupted = spawn(
        orchmode_command("run", "review this", "--base-url", alone.url, *FLAGS),
        cwd=tmp_path / "uninterrupted", env=run_env(None),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip

    replanning = scenario()
    started = scripted(replanning, api_key=API_KEY)
    project = tmp_path / "project"
    project.mkdir()
    (project / "kept.txt").write_text("shipped\n")
    ray_flags = [*on_ray(cluster, store), *FLAGS]
    killed_log = tmp_path / "killed.log"
    with killed_log.open("w") as log:
        driver = spawn(
            orchmode_command("run", "review this", "--base-url", started.url, *ray_flags),
            cwd=project, env=run_env(cluster), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(finished := recorded_workers(store)) < 3:
        assert driver.poll() is None, killed_log.read_text()
        assert time.monotonic() < deadline, "no worker was recorded:\n" + killed_log.read_text()
        time.sleep(0.02)  # polling the store another process writes
    pools = agent_pools(cluster)
    driver.send_signal(signal.SIGKILL)  # its main shell, on its own, ends when its pipe does
    driver.wait()
    killed_at = time.time()
    assert 3 <= len(finished) < SUBTASKS and replanning.plans == 1, finished
    assert len(pools) == 2, pools  # one actor on each node, running the fan-out
    # What the dead run left held: claims nobody renews now, on agents not yet recorded.
    left_held = {
        key
        for key, expires in query(store, "SELECT key, expires_at FROM claims")
        if expires > killed_at and not key.startswith("session:")
    }
    assert left_held, "the killed run held no claim: the fan-out was not in progress"
    (plan,) = {PLAN_TAG.findall(p)[0] for p in asked(started, "worker")}
    expected, errors = uninterrupted.communicate(timeout=120)
    assert uninterrupted.returncode == 0, errors
    assert f"Synthesis: {SUBTASKS} agents reported; {SUBTASKS} results" in expected
    (session,) = {s for (s,) in query(store, "SELECT id FROM sessions")}
    (last_seq,) = query(store, "SELECT max(seq) FROM events WHERE session = %s", session)[0]

    since = len(started.log)
    began = time.monotonic()
    resumed = subprocess.run(
        orchmode_command("resume", "--base-url", started.url, *ray_flags),
        cwd=project, env=run_env(cluster), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    took = time.monotonic() - began
    assert resumed.returncode == 0, resumed.stderr
    assert "[session] resuming" in resumed.stderr
    assert resumed.stdout == expected
    assert replanning.plans == 1  # nobody asked for the plan again
    assert took < RESUME_BOUND, f"the resume took {took:.1f} s:\n{resumed.stderr}"
    again = asked(started, "worker", since)
    assert again, "the resume ran no worker: the kill came too late to test anything"
    assert not finished & set(again), "a worker recorded before the kill was run again"
    assert {PLAN_TAG.findall(p)[0] for p in again + asked(started, "verifier", since)} == {plan}

    # The resumed fan-out served the recorded workers from the journal, and took over the
    # claims the dead run held once they lapsed: every agent has its result now.
    events = [
        json.loads(data)
        for (data,) in query(
            store,
            "SELECT data FROM events WHERE session = %s AND seq > %s AND kind = 'SubagentDone'",
            session,
            last_seq,
        )
    ]
    assert len(events) == 2 * SUBTASKS and {e["status"] for e in events} == {"finished"}
    from_journal = {e["index"] for e in events if e["role"] == "worker" and e["from_journal"]}
    assert {item_of(p) for p in finished} <= from_journal
    results = dict(query(store, "SELECT key, role FROM results"))
    assert sorted(results.values()).count("worker") == SUBTASKS
    assert sorted(results.values()).count("verifier") == SUBTASKS
    assert left_held <= set(results), "a claim the dead run held was never taken over"
    assert query(store, "SELECT key, holder FROM claims") == []  # and let go of them all
    # Ray ended the dead driver's actors; none of them lingers on the nodes.
    assert not [pid for pid in pools if alive(pid)]
