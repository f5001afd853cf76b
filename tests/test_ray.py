"""The Ray executor on a real two-node Ray cluster started on this machine, with PostgreSQL.

The nodes are real ``ray start`` processes on 127.0.0.2 and 127.0.0.3 with token auth; the
model is the scripted server; orchmode runs as its own process, as a user runs it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from nested_runs import tree_scenario
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, role_of
from phoenix_fixture import Phoenix
from recorded_runs import base_env
from support.raycluster import LocalCluster, RayUnavailable, local_ray_cluster

pytestmark = pytest.mark.timeout(300)

#: A key unlike any other string, so finding it anywhere means it leaked.
API_KEY = f"sk-ant-test-{secrets.token_hex(12)}"
#: A worker's command that passes only in the shipped copy of the project, not the original:
#: the kept file is there, the ignored one is not, and it is somewhere else.
SHIPPED_CHECK = 'test -f kept.txt && ! test -e ignored.log && test "$(pwd)" != '


def _cluster(nodes: int = 2) -> Iterator[LocalCluster]:
    try:
        with local_ray_cluster(nodes=nodes) as cluster:
            yield cluster
    except RayUnavailable as exc:
        if os.environ.get("ORCHMODE_TEST_RAY") == "required":
            pytest.fail(f"{exc} (ORCHMODE_TEST_RAY=required)")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two nodes shared by the tests that leave them standing."""
    yield from _cluster()


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """Two nodes for a test that takes one away."""
    yield from _cluster()


@pytest.fixture
def one_node() -> Iterator[LocalCluster]:
    """A cluster of one node, for a test that adds another."""
    yield from _cluster(nodes=1)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "kept.txt").write_text("shipped\n")
    (root / "ignored.log").write_text("never shipped\n")
    (root / ".gitignore").write_text("*.log\n")
    return root


@pytest.fixture
def server() -> Iterator[Any]:
    servers: list[ScriptedServer] = []

    def start(scenario: OrchestrationScenario) -> ScriptedServer:
        started = ScriptedServer(scenario, api_key=API_KEY)
        started.start_in_thread()
        servers.append(started)
        return started

    yield start
    for started in servers:
        started.stop_thread()


def run_env(cluster: LocalCluster | None) -> dict[str, str]:
    env = base_env(ANTHROPIC_API_KEY=API_KEY)
    if cluster is not None:
        env.update(cluster.env)
    return env


ORCHMODE_RUN = [sys.executable, "-m", "orchmode", "run", "check"]


def orchmode_args(server: ScriptedServer, *flags: str) -> list[str]:
    return [*ORCHMODE_RUN, "--base-url", server.url, *flags]


def run_orchmode(
    args: list[str], project: Path, cluster: LocalCluster | None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=project, env=run_env(cluster), capture_output=True, text=True, timeout=timeout
    )


def watch_run(
    args: list[str], project: Path, cluster: LocalCluster, on_line: Callable[[str], None]
) -> tuple[str, list[str]]:
    """Run orchmode with ``--json``, calling ``on_line`` on each live event line as it comes.

    Returns its stdout and every stderr line, once it has exited with status 0.
    """
    process = subprocess.Popen(
        [*args, "--json"],
        cwd=project,
        env=run_env(cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None and process.stdout is not None
    lines: list[str] = []
    for line in process.stderr:
        lines.append(line)
        on_line(line)
    stdout = process.stdout.read()
    assert process.wait(timeout=240) == 0, "".join(lines)
    return stdout, lines


def on_ray(cluster: LocalCluster, store: str) -> list[str]:
    return ["--executor", "ray", "--ray-address", cluster.address, "--store", store]


def session_of(stderr: str) -> str:
    found = re.search(r"recorded as (\S+);", stderr)
    assert found, stderr
    return found[1]


def recorded(store: str, session: str) -> list[tuple[str, dict[str, Any]]]:
    """The session's events, read from PostgreSQL behind orchmode's back."""
    with psycopg.connect(store) as db:
        rows = db.execute(
            "SELECT kind, data FROM events WHERE session = %s ORDER BY seq", (session,)
        ).fetchall()
    return [(kind, json.loads(data)) for kind, data in rows]


def agents(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [data for kind, data in events if kind == "SubagentDone"]


def test_fifty_subtasks_on_two_nodes_give_every_result_and_verdict(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    scenario = OrchestrationScenario(
        subtasks=50, worker_command=SHIPPED_CHECK + str(project), scout_command="true"
    )
    started = server(scenario)
    done = run_orchmode(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url), "--max-concurrent", "20"),
        project,
        cluster,
    )
    assert done.returncode == 0, done.stderr
    assert "50 agents reported; 50 results were confirmed" in done.stdout
    events = recorded(postgres_clean_url, session_of(done.stderr))
    finished = agents(events)
    assert Counter((a["role"], a["status"]) for a in finished) == {
        ("worker", "finished"): 50,
        ("verifier", "finished"): 50,
    }
    assert {a["verdict"] for a in finished if a["role"] == "verifier"} == {"confirmed"}
    assert {a["node"] for a in finished} == {"127.0.0.2", "127.0.0.3"}
    # Every worker's bash ran in the shipped copy, in the sandbox, and passed its check.
    commands = [data for kind, data in events if kind == "BashDone" and data["agent"] != "main"]
    assert len(commands) == 50
    assert {(c["exit_code"], c["sandbox"]) for c in commands} == {(0, "workspace-write")}


def test_the_api_key_reaches_no_ray_log_nor_record(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    started = server(OrchestrationScenario(subtasks=4, worker_command="env"))
    done = run_orchmode(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url), "--json"),
        project,
        cluster,
    )
    assert done.returncode == 0, done.stderr
    assert API_KEY not in done.stdout + done.stderr
    leaked = subprocess.run(
        ["grep", "-rl", "--binary-files=text", API_KEY, str(cluster.temp_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert leaked.stdout == "", f"the key is in {leaked.stdout}"
    with psycopg.connect(postgres_clean_url) as db:
        for table in ("events", "results", "sessions"):
            dump = db.execute(f"SELECT string_agg(t::text, ' ') FROM {table} t").fetchone()
            assert API_KEY not in str(dump), table
    # The control: the grep does find what the nodes did write, so an empty answer means
    # something. Ray's runtime-environment log names the package that was shipped.
    assert (
        subprocess.run(
            ["grep", "-rlq", "working_dir", str(cluster.temp_dir)], check=False
        ).returncode
        == 0
    )


def test_secret_files_stay_on_the_driver_and_their_values_are_masked_on_the_nodes(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    """A .env is never shipped; the same password, pasted into a shipped file, is masked by
    the nodes' shells, which the driver gave the values of its secret files."""
    password = "hunter2-on-the-driver-7781"
    (project / ".env").write_text(f"DB_PASSWORD={password}\n")
    (project / "settings.py").write_text(f"PASSWORD = '{password}'\n")
    command = "cat settings.py; cat .env; ls -a"
    started = server(OrchestrationScenario(subtasks=4, worker_command=command))
    done = run_orchmode(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url)), project, cluster
    )
    assert done.returncode == 0, done.stderr
    sent = json.dumps([e.body for e in started.log])
    assert password not in sent and password not in done.stdout + done.stderr
    assert "PASSWORD = '***'" in sent  # the workers did read it, on the nodes
    assert ".env: No such file" in sent  # which never got the file itself
    workers = [a for a in agents(recorded(postgres_clean_url, session_of(done.stderr)))]
    assert {a["node"] for a in workers if a["role"] == "worker"} <= {"127.0.0.2", "127.0.0.3"}
    with psycopg.connect(postgres_clean_url) as db:
        for table in ("events", "results", "session_messages"):
            dump = db.execute(f"SELECT string_agg(t::text, ' ') FROM {table} t").fetchone()
            assert password not in str(dump), table


def test_losing_a_node_mid_run_still_completes_the_run(
    own_cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    started = server(OrchestrationScenario(subtasks=16, delay=0.5, worker_command=None))
    killed = False

    def kill_second_node_once_it_has_work(line: str) -> None:
        nonlocal killed
        if not killed and '"SubagentStarted"' in line and '"node": "127.0.0.3"' in line:
            own_cluster.kill_node(1)
            killed = True

    stdout, lines = watch_run(
        orchmode_args(
            started,
            *on_ray(own_cluster, postgres_clean_url),
            *["--claim-lease", "2", "--max-concurrent", "8", "--sandbox", "off"],
        ),
        project,
        own_cluster,
        kill_second_node_once_it_has_work,
    )
    assert killed, "no subagent ever started on the second node"
    assert "16 agents reported; 16 results were confirmed" in stdout
    events = recorded(postgres_clean_url, session_of("".join(lines)))
    started_on = {
        (d["role"], d["index"], d["node"]) for kind, d in events if kind == "SubagentStarted"
    }
    finished = agents(events)
    assert len(finished) == 32 and {a["status"] for a in finished} == {"finished"}
    # Some agent started on the lost node and was finished on the one left.
    moved = [
        a
        for a in finished
        if ("worker", a["index"], "127.0.0.3") in started_on
        and a["role"] == "worker"
        and a["node"] == "127.0.0.2"
    ]
    assert moved, "no agent was run again after its node was lost:\n" + "".join(lines)
    assert any("running it again on another node" in line for line in lines)


def test_a_node_that_joins_mid_run_is_given_work(
    one_node: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    started = server(OrchestrationScenario(subtasks=40, delay=0.5, worker_command=None))
    joined = ""

    def add_a_node_once_work_is_done(line: str) -> None:
        nonlocal joined
        if not joined and '"SubagentDone"' in line:
            joined = one_node.add_node()  # 127.0.0.3, while the run goes on

    stdout, lines = watch_run(
        orchmode_args(
            started,
            *on_ray(one_node, postgres_clean_url),
            *["--max-concurrent", "2", "--sandbox", "off"],
        ),
        project,
        one_node,
        add_a_node_once_work_is_done,
    )
    assert "40 agents reported; 40 results were confirmed" in stdout
    nodes = Counter(
        a["node"] for a in agents(recorded(postgres_clean_url, session_of(stdout + "".join(lines))))
    )
    assert set(nodes) == {"127.0.0.2", joined}, nodes


def refute_item_three(prompt: str) -> str:
    return "refuted" if "Check item 3\n" in prompt else "confirmed"


def test_ray_and_local_executors_give_the_same_results(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any, tmp_path: Path
) -> None:
    def outcome(flags: list[str], store: str | None) -> tuple[str, list[tuple[Any, ...]]]:
        # The workers read a file of the project: its content is the same on every node,
        # where the path it lies at is not.
        started = server(
            OrchestrationScenario(
                subtasks=8, verdict=refute_item_three, worker_command="cat kept.txt"
            )
        )
        done = run_orchmode(
            orchmode_args(started, "--sandbox", "off", *flags),
            project,
            cluster,
        )
        assert done.returncode == 0, done.stderr
        session = session_of(done.stderr)
        if store is None:
            from recorded_runs import agents_done

            finished = agents_done(project, session)
        else:
            finished = agents(recorded(store, session))
        results = sorted(
            (a["role"], a["index"], a["status"], a["verdict"], a["result"]) for a in finished
        )
        return done.stdout, results

    local = outcome([], None)
    on_cluster = outcome(on_ray(cluster, postgres_clean_url), postgres_clean_url)
    assert on_cluster[0] == local[0]
    only_local = [r for r in local[1] if r not in on_cluster[1]]
    only_ray = [r for r in on_cluster[1] if r not in local[1]]
    assert (only_local, only_ray) == ([], [])
    assert len(local[1]) == 16
    assert all("shipped" in r[4] for r in local[1] if r[0] == "worker")
    assert "8 agents reported; 7 results were confirmed" in local[0]


def test_the_ray_executor_refuses_a_sqlite_store(project: Path) -> None:
    done = run_orchmode(
        [*ORCHMODE_RUN, "--executor", "ray"],
        project,
        None,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a PostgreSQL store" in lines[0], done.stderr


def test_an_unreachable_head_is_one_clear_error_within_seconds(
    project: Path, postgres_clean_url: str
) -> None:
    done = run_orchmode(
        [
            *ORCHMODE_RUN,
            "--executor",
            "ray",
            "--ray-address",
            "127.0.0.9:9",
            "--store",
            postgres_clean_url,
            "--sandbox",
            "off",
        ],
        project,
        None,
        timeout=60,
    )
    assert done.returncode == 9, done.stderr
    assert "no Ray head answers at 127.0.0.9:9" in done.stderr


def test_a_working_directory_over_the_upload_limit_stops_before_anything_is_spent(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    (project / "data.bin").write_bytes(b"x" * 300_000)
    started = server(OrchestrationScenario(subtasks=2))
    done = run_orchmode(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url), "--ray-max-upload-mb", "0.2"),
        project,
        cluster,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "0.3 MB to ship to the Ray nodes, over --ray-max-upload-mb 0.2" in done.stderr
    assert "data.bin 0.3 MB" in done.stderr
    assert started.log == []  # the model was never asked anything


def test_changes_made_on_two_nodes_are_merged_into_the_working_directory(
    cluster: LocalCluster, postgres_clean_url: str, tmp_path: Path, server: Any
) -> None:
    """Each node's workers work in overlays on its own checkout of a bundle of the
    snapshot; their patches come back to the driver, which merges them here — nothing stays
    on a node."""
    project = tmp_path / "repo"
    project.mkdir()
    (project / "notes.txt").write_text("".join(f"line {i}\n" for i in range(1, 13)))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "-A"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=project, check=True)
    subtasks = [
        f"Part {i} $ echo part {i} > part_{i}.txt && sed -i 's/^line {2 * i}$/line {2 * i} "
        f"(worker {i})/' notes.txt"
        for i in range(1, 7)
    ]
    scenario = OrchestrationScenario(
        subtasks=subtasks,
        worker_command=lambda s: s.split("$ ", 1)[1] if "$ " in s else None,
        scout_command="true",
    )
    started = server(scenario)
    done = run_orchmode(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url)), project, cluster
    )
    assert done.returncode == 0, done.stderr
    events = recorded(postgres_clean_url, session_of(done.stderr))
    settled = [data for kind, data in events if kind == "ChangeSettled"]
    assert [(d["index"], d["fate"]) for d in settled] == [(i, "merged") for i in range(1, 7)]
    workers = [a for a in agents(events) if a["role"] == "worker"]
    assert {a["node"] for a in workers} == {"127.0.0.2", "127.0.0.3"}
    chosen = [data for kind, data in events if kind == "WorkspacesChosen"]
    assert len(chosen) == 2 and all(d["overlays"] for d in chosen)  # once by each node
    for i in range(1, 7):
        assert (project / f"part_{i}.txt").read_text() == f"part {i}\n"
    notes = (project / "notes.txt").read_text()
    assert all(f"line {2 * i} (worker {i})" in notes for i in range(1, 7))
    assert (
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True
        ).stdout.count("part_")
        == 6
    )


def test_each_node_starts_its_own_stdio_mcp_servers(
    cluster: LocalCluster, postgres_clean_url: str, tmp_path: Path, server: Any
) -> None:
    """The driver ships the parsed MCP config; every node's actor starts the server itself,
    so the workers' calls are answered by processes whose parent is their node's actor."""
    project = tmp_path / "project"
    project.mkdir()
    config = tmp_path / "mcp.json"
    servers = Path(__file__).with_name("mcp_servers.py")
    config.write_text(json.dumps({"mcpServers": {"demo": {
        "command": sys.executable, "args": [str(servers), "demo"]}}}))  # fmt: skip
    scenario = OrchestrationScenario(
        subtasks=12,
        scout_call=("mcp__demo__whereami", {}),
        worker_call=lambda _s: ("mcp__demo__whereami", {}),
    )
    started = server(scenario)
    args = orchmode_args(started, *on_ray(cluster, postgres_clean_url), "--mcp-config", str(config))
    done = run_orchmode(args, project, cluster)
    assert done.returncode == 0, done.stderr
    events = recorded(postgres_clean_url, session_of(done.stderr))
    workers = [a for a in agents(events) if a["role"] == "worker"]
    assert {a["node"] for a in workers} == {"127.0.0.2", "127.0.0.3"}
    calls = [data for kind, data in events if kind == "McpCallDone"]
    assert len(calls) == 13 and all(c["ok"] for c in calls)
    parents: dict[str, set[str]] = {}
    for entry in started.log:
        role = "main" if "Workflow" in {t["name"] for t in entry.body["tools"]} else "worker"
        for message in entry.body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else []:
                text = str(block.get("content", ""))
                if block.get("type") == "tool_result" and text.startswith("served by pid"):
                    parents.setdefault(role, set()).add(text.rsplit(" ", 1)[1])
    assert len(parents["main"]) == 1
    assert len(parents["worker"]) == 2  # one actor per node, each with its own server
    assert not parents["main"] & parents["worker"]


def test_agents_on_the_nodes_share_the_drivers_trace(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any, phoenix: Phoenix
) -> None:
    started = server(OrchestrationScenario(subtasks=4, worker_command="true", scout_command="true"))
    spans_to = phoenix.project()
    done = subprocess.run(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url)),
        cwd=project,
        env={**run_env(cluster), **phoenix.exporter_env(spans_to)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    requests = len(started.log)
    spans = phoenix.wait_for(
        spans_to, lambda found: sum(s["name"].startswith("chat ") for s in found) >= requests
    )
    by_id = {s["context"]["span_id"]: s for s in spans}
    workers = [s for s in spans if s["name"].startswith("invoke_agent worker")]
    assert len(workers) == 4
    assert {w["attributes"]["orchmode.node"] for w in workers} <= {"127.0.0.2", "127.0.0.3"}
    (call,) = [s for s in spans if s["name"] == "execute_tool Workflow"]
    for worker in workers:
        assert worker["parent_id"] == call["context"]["span_id"]
        assert worker["context"]["trace_id"] == call["context"]["trace_id"]
        inside = [s for s in spans if s["parent_id"] == worker["context"]["span_id"]]
        assert {s["name"].split()[0] for s in inside} == {"chat", "execute_tool"}
        assert all(s["context"]["trace_id"] == call["context"]["trace_id"] for s in inside)
    assert all(by_id.get(s["parent_id"]) or s["parent_id"] is None for s in spans)


def test_a_nodes_connections_and_approvals_travel_in_their_agents_stream() -> None:
    """On a node, the proxy's and the broker's events go into the job stream of the agent
    they name, as its commands' do, and come through Ray's transport unchanged: the driver
    then records and shows them like its own. (No cluster needed: the actor's own routing.)"""
    import ray.cloudpickle

    from orchmode.core.events import (
        ApprovalAnswered,
        ApprovalRequested,
        Event,
        McpServerFailed,
        NetworkConnection,
    )
    from orchmode.core.settings import Settings
    from orchmode.executors.ray import AgentPool, Secret
    from orchmode.model.providers import Credentials

    pool = AgentPool(Settings(), Credentials(api_key=API_KEY), Secret("postgresql://nowhere"))
    streams: dict[str, list[Event]] = {"worker 1.1": [], "worker 1.2": []}
    for name, stream in streams.items():
        pool.routes[name] = stream.append
    made: list[Event] = [
        NetworkConnection("worker 1.1", "pypi.org", 443, "allowed", "preset", 900, 40_000, 0.1),
        ApprovalRequested(3, "worker 1.2", "domain", "files.example:443", "network_ask"),
        ApprovalAnswered(3, "worker 1.2", "approved", True, ""),
        NetworkConnection("worker 1.2", "files.example", 443, "approved", "network_ask", 1, 2, 0.1),
        NetworkConnection("worker 9.9", "gone.example", 443, "denied", "", 0, 0, 0.0),
    ]
    for event in made:
        pool.events.emit(event)
    assert streams == {"worker 1.1": [made[0]], "worker 1.2": made[1:4]}  # 9.9 has no job here
    for event in made:
        assert ray.cloudpickle.loads(ray.cloudpickle.dumps(event)) == event
    pool.events.emit(McpServerFailed("srv", "down"))  # said once: to whichever job runs
    assert sum(isinstance(e, McpServerFailed) for s in streams.values() for e in s) == 1


def test_an_agent_on_a_node_asks_through_the_store_and_gives_its_slot_away_on_the_driver(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    """One slot for six chains on Ray: worker 3 asks from its node; the driver gives its slot
    away, so the other five chains all finish while it waits; `orchmode approve`, from
    another process against the same store, lets it go on."""
    import time

    def command(prompt: str) -> str:
        found = re.search(r"item (\d+)", prompt)
        return "echo deploy 3" if found and found[1] == "3" else "true"

    started = server(OrchestrationScenario(subtasks=6, worker_command=command))
    args = orchmode_args(
        started,
        *on_ray(cluster, postgres_clean_url),
        "--max-concurrent", "1", "--permissions-ask", "Bash(echo deploy:*)",
    )  # fmt: skip
    env = run_env(cluster)

    def pending() -> list[dict[str, Any]]:
        listed = subprocess.run(
            [sys.executable, "-m", "orchmode", "approvals", "--json", "--store",
             postgres_clean_url],
            cwd=project, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        return [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]

    def finished_chains() -> int:
        with psycopg.connect(postgres_clean_url) as db:
            (count,) = db.execute(
                "SELECT count(*) FROM results WHERE role = 'verifier'"
            ).fetchone() or (0,)
        return int(count)

    run = subprocess.Popen(args, cwd=project, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not pending():
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "worker 3 never asked"
            time.sleep(0.2)  # polling a store another process writes
        (asked,) = pending()
        assert asked["what"] == "echo deploy 3"
        while finished_chains() < 5:  # only possible with the asking agent's slot given away
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the other chains did not finish"
            time.sleep(0.2)
        answer = subprocess.run(
            [sys.executable, "-m", "orchmode", "approve", str(asked["id"]), "--store",
             postgres_clean_url],
            cwd=project, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        out, err = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err[-3000:]
    assert "6 agents reported" in out
    events = recorded(postgres_clean_url, session_of(err))
    kinds = [kind for kind, _ in events]
    assert "ApprovalRequested" in kinds and "ApprovalAnswered" in kinds


def test_a_worker_on_a_node_is_not_offered_workflow_and_is_told_why_if_it_calls(
    cluster: LocalCluster, postgres_clean_url: str, project: Path, server: Any
) -> None:
    """Nesting needs the driver's engine, which a node cannot reach: every agent is a leaf."""
    started = server(tree_scenario(2, "2", fan_out_regardless=True))
    done = run_orchmode(
        orchmode_args(started, *on_ray(cluster, postgres_clean_url)), project, cluster
    )
    assert done.returncode == 0, done.stderr
    workers = [e.body for e in started.log if role_of(e.body) == "worker"]
    assert workers and all("Workflow" not in {t["name"] for t in body["tools"]} for body in workers)
    refused = [
        str(block.get("content"))
        for body in workers
        for message in body["messages"][1:]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("is_error")
    ]
    assert len(refused) == 2
    assert all("not offered to agents running on a Ray cluster" in text for text in refused)
