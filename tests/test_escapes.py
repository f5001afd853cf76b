"""Every way out of the sandbox, tried for real: each attempt fails, and the run goes on.

The attempts and how each is judged are in ``escape_attempts.py``. Two lanes:

- each attempt as a real command in a real sandboxed shell, made as orchmode makes the main
  agent's (secret files withheld, values masked), in ``workspace-write`` and ``read-only``;
- whole runs against the scripted Messages API: the main agent, two workers, their
  verifiers and a resolver (two workers' changes conflict) each try the attempts, while
  an honest worker writes a normal change. The run completes, the honest change is merged,
  and nothing outside the working directory changed.

After every attempt: it did not say it got through, no listener was reached, no secret is
in what it printed in any form, the files it aimed at are as they were, the process it
aimed at lives, and the shell's next command runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import API_KEY, StartServer, settings_for
from escape_attempts import (
    ATTEMPTS,
    BY_ID,
    CANARY,
    CANARY_NAME,
    SECRET_FILES,
    Attempt,
    Listeners,
    Targets,
    Victim,
    differences,
    digest,
    escaped,
    leaks,
    make_repository,
    prepare_home,
    prepare_outside,
    quick,
    remove,
    with_argument,
)
from orchmode.core.events import ChangeSettled, Event, EventBus
from orchmode.core.secrets import WITHHELD_NOTE, Secrets
from orchmode.core.settings import SandboxMode, Settings
from orchmode.executors.host import ShellFactory
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.shell.bash import BashSession, ShellResult
from orchmode.shell.bwrap import probe
from orchmode.testing import Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import (
    OrchestrationScenario,
    first_user_text,
    mode_is_on,
    role_of,
    text,
    tool_call,
    turn_messages,
)
from test_workspaces import python_for_anyone, unprivileged_tree  # noqa: F401  (a fixture)

MODES: list[SandboxMode] = ["workspace-write", "read-only"]


@pytest.fixture(autouse=True)
def _bubblewrap_works() -> None:
    """Fail, not skip, without a working bubblewrap: orchmode refuses to run without one."""
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)


def test_the_table_holds_at_least_forty_attempts_in_every_group_the_issue_names() -> None:
    assert len(quick(ATTEMPTS)) >= 40
    groups = {a.group for a in ATTEMPTS}
    assert groups == {
        "network", "processes", "devices", "privileges", "links", "secrets", "exhaustion",
        "descriptors",
    }  # fmt: skip
    for attempt in ATTEMPTS:
        assert attempt.commands and all(c.strip() for c in attempt.commands), attempt.id


@pytest.fixture
async def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Targets]:
    """The repository, a directory and a home outside it (not in /tmp, which the sandbox
    covers), every listener, a process standing for the harness and other agents, and a
    credential in the harness's own environment."""
    tag = secrets.token_hex(6)
    outside = prepare_outside(Path("/var/tmp", f"orchmode-escapes-{tag}"))
    home = prepare_home(Path("/var/tmp", f"orchmode-escapes-home-{tag}"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv(CANARY_NAME, CANARY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    work = make_repository(tmp_path / "work")
    victim = Victim().start()
    try:
        async with Listeners(outside, work) as listeners:
            yield Targets(work, outside, home, listeners, victim)
    finally:
        victim.stop()
        remove(outside, home)


def main_shell(targets: Targets, mode: SandboxMode, **settings: Any) -> BashSession:
    """A shell made as the main agent's is: the sandbox, secret files withheld, values and
    the environment's credentials masked."""
    chosen = Settings(sandbox=mode, **settings)
    found = Secrets.start(chosen.secret_files, targets.work, os.environ)
    return ShellFactory.build(chosen, targets.work, (), secrets=found)()


def main_shell_in(work: Path, mode: SandboxMode = "workspace-write") -> BashSession:
    chosen = Settings(sandbox=mode)
    found = Secrets.start(chosen.secret_files, work, os.environ)
    return ShellFactory.build(chosen, work, (), secrets=found)()


def working_directory(work: Path) -> dict[str, str]:
    """The working directory less orchmode's state and the test's socket."""
    return {
        k: v for k, v in digest(work).items() if not k.startswith(".orchmode") and k != "db.sock"
    }


@dataclass
class Verdict:
    attempt: Attempt
    results: list[ShellResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "\n".join(r.output for r in self.results)


async def attempt(
    shell: BashSession, targets: Targets, tried: Attempt, *, read_only: bool
) -> Verdict:
    """Run one attempt's commands in ``shell``, then judge it."""
    before = targets.world()
    reached = len(targets.listeners.reached)
    tree = working_directory(targets.work) if read_only else None
    verdict = Verdict(tried)
    for command in tried.commands:
        verdict.results.append(await shell.run(targets.command(command)))
    next_one = await shell.run("/bin/echo alive")  # a process of its own: it can fork
    output = verdict.output
    problems = verdict.problems
    if escaped(output):
        problems.append(f"it says it got through: {escaped(output)}")
    if leaks(output):
        problems.append(f"a secret is in its output: {leaks(output)}")
    if targets.listeners.reached[reached:]:
        problems.append(f"a listener was reached: {targets.listeners.reached[reached:]}")
    problems += differences(before, targets.world())
    if tree is not None and working_directory(targets.work) != tree:
        problems.append("the read-only working directory changed")
    # (output a background job of the attempt's wrote meanwhile comes first, as it should)
    if "alive" not in next_one.output.splitlines():
        problems.append(f"the next command did not run: {next_one.output!r}")
    return verdict


def report(verdicts: Iterable[Verdict]) -> str:
    return "\n".join(
        f"{v.attempt.id} ({v.attempt.tries}):\n  "
        + "\n  ".join(v.problems)
        + "\n  output: "
        + v.output[-600:].replace("\n", "\n    ")
        for v in verdicts
    )


def held(attempts: Iterable[Attempt]) -> list[Attempt]:
    """The attempts the sandbox must stop: all but the known holes, quick ones only."""
    return [a for a in quick(attempts) if a.hole is None]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
async def test_every_attempt_fails_in_a_sandboxed_shell_and_the_next_command_runs(
    targets: Targets, mode: SandboxMode
) -> None:
    """Many attempts per shell, as an agent would make them one after another: the shell
    lives on (or is replaced, after those that kill it) for the next."""
    shell = main_shell(targets, mode, bash_timeout=15)
    exhausting = main_shell(targets, mode, bash_timeout=4, sandbox_memory_mb=256)
    other = main_shell(targets, mode)  # another agent, whose process the attempts aim at
    marker = f"1000.{secrets.randbelow(10**6):06d}"
    await other.run(f"sleep {marker} > /dev/null 2>&1 &")
    for _ in range(250):  # until the background job has become `sleep` (no event says so)
        if with_argument(marker):
            break
        await asyncio.sleep(0.02)
    (pid,) = with_argument(marker)
    targets.agent = (pid, marker)
    verdicts = []
    try:
        for tried in held(ATTEMPTS):
            use = exhausting if tried.exhausts else shell
            verdicts.append(await attempt(use, targets, tried, read_only=mode == "read-only"))
    finally:
        await shell.close()
        await exhausting.close()
        await other.close()
    failed = [v for v in verdicts if v.problems]
    assert not failed, f"{len(failed)} attempts got through:\n{report(failed)}"
    assert (
        "No such process"
        in verdicts[[v.attempt.id for v in verdicts].index("signal-other-agent")].output
    )
    # each was really tried: what stopped it shows in its output
    by_id = {v.attempt.id: v.output for v in verdicts}
    assert "Connection refused" in by_id["tcp-loopback"]
    assert "Network is unreachable" in by_id["tcp-internet"]
    assert "Read-only file system" in by_id["write-outside"]
    assert by_id["secret-cat"].count(WITHHELD_NOTE.strip()) == 2
    assert "DB_PASSWORD=***" in by_id["git-show"]  # from git's objects: masked
    assert "found /" in by_id["mountinfo-layers"]
    assert "[output truncated" in by_id["long-line"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", MODES)
async def test_every_exhaustion_ends_with_a_clear_result(
    targets: Targets, mode: SandboxMode
) -> None:
    shell = main_shell(targets, mode, bash_timeout=4, sandbox_memory_mb=256, output_limit=500)
    try:
        results = {}
        for tried in quick(a for a in ATTEMPTS if a.exhausts):
            (results[tried.id],) = [await shell.run(targets.command(c)) for c in tried.commands]
            assert (await shell.run("echo alive")).output == "alive", tried.id
    finally:
        await shell.close()
    assert "No space left on device" in results["fill-tmp"].output
    assert "of 314572800 characters shown" in results["flood-300mb"].output
    assert "of 104857600 characters shown" in results["long-line"].output
    assert (
        results["never-ends"].timed_out
        and "the shell was restarted" in results["never-ends"].output
    )
    for killed in ("kill-everything", "exit-shell"):  # the shell with it: a fresh one next
        assert results[killed].exit_code == 128 + 9, results[killed].output
        assert "the next command starts a fresh shell" in results[killed].output
    assert not results["binary-output"].is_error
    for result in results.values():
        assert len(result.output) < 2000


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_slow_exhaustions_end_with_a_clear_result(targets: Targets) -> None:
    verdicts = []
    for tried in (a for a in ATTEMPTS if a.slow):
        timeout = 10 if tried.id == "fork-bomb" else 120  # the bomb runs until it is stopped
        shell = main_shell(targets, "workspace-write", bash_timeout=timeout, sandbox_processes=64)
        try:
            verdicts.append(await attempt(shell, targets, tried, read_only=False))
        finally:
            await shell.close()
    failed = [v for v in verdicts if v.problems]
    assert not failed, report(failed)
    bomb = next(v for v in verdicts if v.attempt.id == "fork-bomb")
    assert "Resource temporarily unavailable" in bomb.output
    flood = next(v for v in verdicts if v.attempt.id == "flood-10gb")
    shown = re.search(r"of (\d+) characters shown", flood.output)
    assert shown and int(shown[1]) >= 10 * 1024**3, flood.output[-200:]


async def test_links_planted_where_the_sandbox_binds_do_not_stop_the_next_shell(
    targets: Targets, tmp_path: Path
) -> None:
    """An agent links ``orchmode.toml`` (none existed) and secret-named files to files
    outside; the next sandbox binds a note or the config there, and bubblewrap, which
    cannot mount on a link, used to refuse to start: no shell in this directory again."""
    work = tmp_path / "bare"
    work.mkdir()
    (work / "README.md").write_text("a project\n")
    shell = main_shell_in(work)
    try:
        planted = await shell.run(
            targets.command(
                "ln -s @outside@/target.txt orchmode.toml && ln -s @outside@/target.txt deploy.pem"
                " && ln -s @home@/.ssh/id_ed25519 id_ed25519 && ln -s README.md local.key && ls"
            )
        )
    finally:
        await shell.close()
    assert "deploy.pem" in planted.output, planted.output
    before = targets.world()
    shell = main_shell_in(work)  # the next session's, which withholds the links
    try:
        later = await shell.run("/bin/echo alive; cat deploy.pem local.key; cat id_ed25519")
        again = await shell.run("/bin/echo alive")
    finally:
        await shell.close()
    assert later.output.splitlines()[1] == "alive", later.output  # after "(exit code 1)"
    assert later.output.count(WITHHELD_NOTE.strip()) == 2  # on the files the links lead to
    assert "id_ed25519: No such file or directory" in later.output  # the hidden home
    assert leaks(later.output) == [] and again.output == "alive"
    assert differences(before, targets.world()) == []


#: Attempts that are safe to make unsandboxed (they touch only what the test made, or read).
SAFE_UNSANDBOXED = (
    "unix-socket-outside", "unix-socket-inside", "unix-socket-abstract", "tcp-loopback",
    "udp-loopback", "tcp-loopback-ipv6", "udp-loopback-ipv6", "tcp-host-address",
    "proc-harness", "process-vm-readv", "proc-sys-write", "write-outside", "symlink-outside",
    "hardlink-outside", "into-home", "secret-base64", "ipc-host", "signal-harness",
)  # fmt: skip


async def test_with_the_sandbox_off_the_same_attempts_get_through(targets: Targets) -> None:
    """The judges can fail: unsandboxed, each safe attempt is seen getting through (the
    process it kills last)."""
    shell = main_shell(targets, "off")
    try:
        verdicts = [
            await attempt(shell, targets, BY_ID[id], read_only=False) for id in SAFE_UNSANDBOXED
        ]
    finally:
        await shell.close()
    held = [v.attempt.id for v in verdicts if not v.problems]
    assert held == [], "unsandboxed, these were not seen getting through"
    assert {p.split(":")[0] for v in verdicts for p in v.problems} >= {
        "it says it got through",
        "a listener was reached",
        "a secret is in its output",
    }
    assert not targets.victim.alive()


HOLES = [a for a in ATTEMPTS if a.hole is not None]


@pytest.mark.parametrize(
    "tried",
    [
        pytest.param(
            a, id=a.id, marks=pytest.mark.xfail(strict=True, reason=f"known hole: {a.hole}")
        )
        for a in HOLES
    ],
)
async def test_a_known_hole_is_still_open(targets: Targets, tried: Attempt) -> None:
    """Each hole the sandbox still has, as an attempt that gets through (see docs/sandbox.md);
    strict, so that closing one fails here until it moves to the attempts that must fail."""
    shell = main_shell(targets, "workspace-write")
    try:
        verdict = await attempt(shell, targets, tried, read_only=False)
    finally:
        await shell.close()
    assert not verdict.problems, report([verdict])


_LINK_IN_A_LOCKED_DIRECTORY = """
import os, sys
from pathlib import Path
from orchmode.trees.runs import remove_tree

base = Path(sys.argv[1])
outside = base / "outside.txt"
outside.write_text("mine")
os.chmod(outside, 0o644)
copy = base / "copy"
(copy / "locked").mkdir(parents=True)
os.symlink(outside, copy / "locked" / "link")
os.chmod(copy / "locked", 0o555)  # so the link cannot simply be unlinked
remove_tree(copy)
print(oct(outside.stat().st_mode & 0o777), copy.exists())
"""


def test_removing_a_copy_never_follows_a_link_an_agent_left_in_it(
    unprivileged_tree: tuple[list[str], Path, int],  # noqa: F811
) -> None:
    """An agent leaves a link to a file outside in a directory it made read-only; removing
    its copy (as a user who is not root, whom the directory's mode binds) used to make the
    directory writable and then the link's target, outside the copy, mode 0700."""
    prefix, base, uid = unprivileged_tree
    os.chown(base, uid, uid)
    python, path = python_for_anyone()
    done = subprocess.run(
        [*prefix, python, "-c", _LINK_IN_A_LOCKED_DIRECTORY, str(base)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0o644", "False"]


# ------------------------------------------------------------------------- whole runs


def commands_of(attempts: Iterable[Attempt], targets: Targets) -> list[str]:
    """The attempts as an agent's bash calls: those that may end the shell, and the halves
    of a split read, each a call of its own; the rest many to a call."""
    calls: list[str] = []
    batch: list[str] = []
    for tried in attempts:
        commands = [targets.command(c) for c in tried.commands]
        if tried.exhausts or tried.id.endswith("-split"):
            calls.extend(commands)
            continue
        batch.extend(commands)
        if len(batch) >= 16:
            calls.append("\n".join(batch))
            batch = []
    if batch:
        calls.append("\n".join(batch))
    return calls


def steps(request: ScriptedRequest) -> int:
    return sum(1 for m in request.messages if m.get("role") == "assistant")


@dataclass
class Attacking(OrchestrationScenario):
    """Every role tries its commands first, then goes on as the scenario's role would."""

    attacks: dict[str, list[str]] = field(default_factory=dict)

    def main(self, request: ScriptedRequest) -> Reply:
        if not mode_is_on(request.messages):
            return text(self.summary)
        own = self.attacks.get("main", [])
        step = sum(1 for m in turn_messages(request.messages) if m.get("role") == "assistant")
        if step < len(own):
            return tool_call("bash", {"command": own[step]})
        if step == len(own):
            return tool_call("Workflow", {"subtasks": self.subtask_list(), **self.workflow_input})
        return text("Done: every agent reported.")

    def worker(self, request: ScriptedRequest) -> Reply:
        subtask = first_user_text(request)
        own = self.attacks.get("worker", []) if subtask.startswith("Attack") else []
        commands = [*own, subtask.split("$ ", 1)[1]]
        if steps(request) < len(commands):
            return tool_call("bash", {"command": commands[steps(request)]})
        return super().worker(request)

    def verifier(self, request: ScriptedRequest) -> Reply:
        own = self.attacks.get("verifier", [])
        if steps(request) < len(own):
            return tool_call("bash", {"command": own[steps(request)]})
        return super().verifier(request)

    def resolver(self, request: ScriptedRequest) -> Reply:
        own = self.attacks.get("resolver", [])
        if 1 <= steps(request) <= len(own):  # after its own fix, which comes first
            return tool_call("bash", {"command": own[steps(request) - 1]})
        return super().resolver(request)


#: Two attackers whose changes conflict (so a resolver runs), an honest worker, and one
#: whose change plants links out of the tree and a setuid file.
SUBTASKS = [
    "Attack from worker A $ echo from-a >> shared.txt",
    "Attack from worker B $ echo from-b >> shared.txt",
    "Write the notes honestly $ echo 'plain notes' > notes.txt",
    "Plant links $ ln -s @outside@/target.txt out-link; ln -s @home@/.bashrc rc; "
    "ln -s .git/hooks hooks; ln -s .orchmode om; cp /bin/sh tool; chmod 4755 tool",
]

TAMPER = "echo tampered >> shared.txt; echo tampered > notes.txt; rm -f README.md"

#: In a whole run, the exhaustions that end a command or its shell but take no time.
RUN_EXHAUSTIONS = ("long-line", "binary-output", "kill-everything", "close-stdout", "exit-shell")


def in_a_run(attempt: Attempt) -> bool:
    return (
        not attempt.slow
        and attempt.hole is None
        and (not attempt.exhausts or attempt.id in RUN_EXHAUSTIONS)
    )


def everything_recorded(root: Path) -> Iterable[tuple[Path, bytes]]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.is_socket():
            yield path, path.read_bytes()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
async def test_a_run_whose_agents_all_attack_completes_and_every_change_stays_in_the_tree(
    serve: StartServer, targets: Targets, tmp_path: Path, mode: SandboxMode
) -> None:
    work = targets.work
    calls = commands_of([a for a in ATTEMPTS if in_a_run(a)], targets)
    roles = ("main", "worker", "verifier", "resolver")
    scenario = Attacking(
        subtasks=[targets.command(t) for t in SUBTASKS],
        scout_command=None,
        worker_command=None,
        workflow_input={"isolation": "worktree"},
        # a verifier also tries to change the change it checks (its view is read-only)
        attacks={role: [*calls, *([TAMPER] if role == "verifier" else [])] for role in roles},
    )
    server: ScriptedServer = await serve(scenario)
    before = targets.world()
    state = tmp_path / "state"
    state.mkdir()
    settings = settings_for(
        server,
        state,
        workdir=work,
        sandbox=mode,
        bash_timeout=30,
        output_limit=40000,
        main_turns=60,
        subagent_turns=60,
    )
    events = EventBus()
    seen: list[Event] = []
    events.subscribe(seen.append)
    async with open_conversation(settings, Credentials(api_key=API_KEY), events=events) as session:
        await session.turn("do the work")

    # every role tried every attempt
    ran = {role: scenario.stats.get(role, 0) for role in roles}
    assert ran["worker"] >= 2 * len(calls) and ran["verifier"] >= 3 * len(calls), ran
    if mode == "workspace-write":
        assert ran["resolver"] >= len(calls), ran
    sent = json.dumps([e.body for e in server.log])
    assert escaped(sent) == []
    assert leaks(sent) == [], "a secret reached the model"
    assert leaks(repr(seen)) == [], "a secret is in the run's events"
    for path, data in [
        *everything_recorded(state),
        *everything_recorded(work / ".orchmode"),
    ]:
        assert leaks(data) == [], f"a secret is in {path}"
    assert targets.listeners.reached == []
    assert differences(before, targets.world()) == []
    for name, content in SECRET_FILES.items():
        assert (work / name).read_text() == content
    assert (work / "README.md").read_text() == "a project\n"  # no verifier's hand in it
    tampering = [
        json.dumps(e.body["messages"][-1])
        for e in server.log
        if role_of(e.body) == "verifier" and "tampered" in json.dumps(e.body["messages"][-2:])
    ]
    assert tampering and all("Read-only file system" in t for t in tampering)
    settled = {e.index: e for e in seen if isinstance(e, ChangeSettled)}
    workflow = json.dumps(
        [e.body["messages"][-1] for e in server.log if role_of(e.body) == "main"][-1]
    )
    assert "Finished: Write the notes honestly" in workflow  # every agent's result came back
    assert "Finished: Attack from worker B" in workflow
    if mode == "workspace-write":
        # the honest change landed, and the attackers' appends, after the resolver
        assert (work / "notes.txt").read_text() == "plain notes\n"
        assert sorted((work / "shared.txt").read_text().split()) == ["from-a", "from-b", "head"]
        fates = {i: e.fate for i, e in settled.items()}
        assert fates == {1: "merged", 2: "merged", 3: "merged", 4: "refused"}, fates
        assert "points outside the tree" in settled[4].detail
        assert "points into .git" in settled[4].detail
        assert not (work / "tool").exists() and not (work / "out-link").is_symlink()
    else:
        assert not (work / "notes.txt").exists() and settled == {}
    final = server.log[-1].body
    assert "Done: every agent reported." not in json.dumps(final)  # the last reply was asked
    assert BY_ID["secret-cat"]  # the table is what ran
