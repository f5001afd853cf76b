"""Runs killed with SIGKILL at chosen moments, then resumed: what the fault suite
(``tests/test_faults.py``) and ``bench/faults.py`` share.

The scenario is a worktree fan-out over a git repository of a few thousand files whose
workers write, delete and rename files (``kill_scenario.py``): one rewrites
600 files, one deletes a package, one renames a directory and changes modes, one adds
files and a binary one, one (refuted) must never land, one edits a file no other touches;
three of them append a line to ``CHANGELOG.md``, so two conflicts go to resolvers.

A :class:`Moment` names an observable point of the run (a request the scripted server
received, a row in the journal, a file of a change appearing or vanishing in the working
directory) and an offset after it; :func:`kill_at` starts ``orchmode run``, waits for the
point, waits the offset, and sends SIGKILL. :func:`resume` then runs ``orchmode resume``
once (it must finish), and :func:`check` compares the directory with an
uninterrupted run's: every file's bytes and mode, the set of paths, the repository's own
state, each change applied once, and nothing left behind (workspaces, temporary files,
processes).

Everything is read from outside, as a user would see it: the server's log, the journal
through plain ``sqlite3``, the files; nothing in orchmode is hooked.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchmode.testing import LoggedRequest, ScriptedServer
from orchmode.testing.scenario import role_of
from support.kill_scenario import (
    API_KEY,
    CHANGELOG_LINES,
    DOCS,
    LEGACY,
    METRICS,
    MODULES,
    REFUTED_LINE,
    RENAMED,
    SUBTASKS,
    copy_repo,
    scenario,
    start_server,
)
from support.run_state import (
    Entry,
    differences,
    left_behind,
    processes_in,
    repo_state,
    tree_state,
)

#: A short lease, so a killed run's claims lapse quickly for the resume.
LEASE = ("--claim-lease", "2")
TASK = "Tidy the code base"

#: The phases a moment can fall in, in the order a run goes through them.
PHASES = ("planning", "fan-out", "verification", "merge", "synthesis")

# ------------------------------------------------------------------------- the processes


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "ORCHMODE_"))}
    env["ANTHROPIC_API_KEY"] = API_KEY
    return env


def flags(server: ScriptedServer) -> tuple[str, ...]:
    return ("--base-url", server.url, "--isolation", "worktree", "--plain", *LEASE)


def orchmode(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchmode", *args],
        cwd=cwd,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start_run(server: ScriptedServer, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchmode", "run", TASK, *flags(server)],
        cwd=cwd,
        env=base_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# ---------------------------------------------------------------------- what is observed


def db_rows(journal: Path, query: str) -> list[tuple[object, ...]]:
    """Rows of a SQLite journal another process writes (none before it exists)."""
    if not journal.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
        try:
            return list(db.execute(query))
        finally:
            db.close()
    except sqlite3.OperationalError:  # not created yet, or mid-creation
        return []


def journal_roles(journal: Path) -> list[tuple[str, str]]:
    """The (role, prompt) of every result recorded in a SQLite journal so far."""
    return [(str(r[0]), str(r[1])) for r in db_rows(journal, "SELECT role, prompt FROM results")]


@dataclass
class Watch:
    """What a moment's condition may look at: the server's log, the journal, the files."""

    server: ScriptedServer
    workdir: Path
    #: The server's requests before this run's (another run's, not looked at).
    since: int = 0

    @property
    def journal(self) -> Path:
        return self.workdir / ".orchmode" / "journal.db"

    def requests(self, role: str) -> int:
        return sum(1 for e in self.server.log[self.since :] if role_of(e.body) == role)

    def main_requests(self) -> int:
        return self.requests("main")

    def recorded(self, role: str, prefix: str = "") -> int:
        return sum(1 for r, p in journal_roles(self.journal) if r == role and p.startswith(prefix))

    def exists(self, relative: str) -> bool:
        return os.path.lexists(self.workdir / relative)

    def holds(self, relative: str, text: str) -> bool:
        try:
            return text in (self.workdir / relative).read_text()
        except OSError:
            return False


@dataclass(frozen=True)
class Trigger:
    """An observable point of a run, and the phase it falls in."""

    name: str
    phase: str
    ready: Callable[[Watch], bool]


def _first_renamed(w: Watch) -> bool:
    return w.holds(f"{RENAMED[0]}/mod000.py", "new_helper")


#: Points spread over a whole run, each observable from outside.
TRIGGERS: tuple[Trigger, ...] = (
    Trigger("first request", "planning", lambda w: w.main_requests() >= 1),
    Trigger("Workflow asked for", "planning", lambda w: w.main_requests() >= 2),
    Trigger("first worker request", "fan-out", lambda w: w.requests("worker") >= 1),
    Trigger("4 worker requests", "fan-out", lambda w: w.requests("worker") >= 4),
    Trigger("2 workers recorded", "fan-out", lambda w: w.recorded("worker") >= 2),
    Trigger("first verifier request", "verification", lambda w: w.requests("verifier") >= 1),
    Trigger("4 verifiers recorded", "verification", lambda w: w.recorded("verifier") >= 4),
    Trigger("change 1 being written", "merge", _first_renamed),
    Trigger("first resolver request", "merge", lambda w: w.requests("resolver") >= 1),
    Trigger("a resolution recorded", "merge", lambda w: w.recorded("resolver", "resolution") >= 1),
    Trigger("legacy/ being deleted", "merge", lambda w: not w.exists("legacy/part0/old000.py")),
    Trigger("docs/ being moved", "merge", lambda w: not w.exists("docs/section0/page000.md")),
    Trigger("metrics being written", "merge", lambda w: w.exists("src/app/metrics")),
    Trigger("synthesis asked for", "synthesis", lambda w: w.main_requests() >= 3),
    Trigger("summary turn asked for", "synthesis", lambda w: w.main_requests() >= 4),
)  # fmt: skip


@dataclass(frozen=True)
class Moment:
    """Kill once ``trigger`` holds, ``offset`` seconds later."""

    trigger: Trigger
    offset: float

    def __str__(self) -> str:
        return f"{self.trigger.name} + {self.offset * 1000:.0f} ms"


def choose_moments(seed: int, count: int, max_offset: float = 0.05) -> list[Moment]:
    """``count`` distinct moments: every trigger once (while there are more kills than
    triggers), the rest drawn at random; each with a random offset."""
    rng = random.Random(seed)
    triggers = list(TRIGGERS)
    rng.shuffle(triggers)
    chosen = triggers[:count]
    while len(chosen) < count:
        chosen.append(rng.choice(TRIGGERS))
    moments: list[Moment] = []
    for trigger in chosen:
        moment = Moment(trigger, round(rng.uniform(0, max_offset), 4))
        while moment in moments:
            moment = Moment(trigger, round(rng.uniform(0, max_offset), 4))
        moments.append(moment)
    return moments


@dataclass
class Killed:
    """What a kill found: when it fired, and what the run had got to."""

    moment: Moment
    #: False: the run ended before the moment came (nothing was killed).
    killed: bool
    phase: str
    #: A change was written in part when the kill came (files of it on disk, others not).
    mid_write: bool
    elapsed: float


def kill_at(
    moment: Moment, server: ScriptedServer, workdir: Path, *, deadline: float = 120
) -> Killed:
    """Start ``orchmode run`` in ``workdir``; SIGKILL it at ``moment``."""
    since = len(server.log)
    watch = Watch(server, workdir, since)
    started = time.monotonic()
    process = start_run(server, workdir)
    try:
        while not moment.trigger.ready(watch):
            if process.poll() is not None:
                break
            if time.monotonic() - started > deadline:
                raise AssertionError(f"the run never got to {moment.trigger.name!r}")
            time.sleep(0.001)  # polling what another process writes
        else:
            if moment.offset:
                time.sleep(moment.offset)  # the moment itself: a delay after the point
    finally:
        killed = process.poll() is None
        if killed:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
    elapsed = time.monotonic() - started
    mid = bool(partly_written(workdir))
    phase = "merge" if mid else phase_of(server.log[since:])
    return Killed(moment, killed, phase, mid, elapsed)


def phase_of(log: Sequence[LoggedRequest]) -> str:
    """Where the run was, from the requests it made: the main agent's first two are the
    plan, its third (the Workflow result) on the synthesis; between them, the workers, their
    verifiers, then the merge (resolvers included)."""
    roles = [role_of(e.body) for e in log]
    mains = roles.count("main")
    if mains >= 3:
        return "synthesis"
    if "worker" not in roles:
        return "planning"
    if "resolver" in roles:
        return "merge"
    workers_done = sum(
        1 for e in log if role_of(e.body) == "worker" and e.outcome == "ok" and _reported(e)
    )
    verifiers = [e for e in log if role_of(e.body) == "verifier"]
    finished = all(e.outcome == "ok" for e in verifiers)
    if workers_done == len(SUBTASKS) and len(verifiers) == len(SUBTASKS) and finished:
        return "merge"
    if verifiers:
        return "verification"
    return "fan-out"


def _reported(entry: LoggedRequest) -> bool:
    reply = entry.reply
    return reply is not None and any(
        isinstance(b, dict) and b.get("name") == "report_findings" for b in reply.content
    )


def partly_written(workdir: Path) -> list[str]:
    """The changes of which some files are in the working directory and some are not yet:
    a kill that came while a merge was writing."""

    def share(done: Sequence[bool]) -> bool:
        return any(done) and not all(done)

    def rewritten(path: Path) -> bool | None:
        """Whether the rename's edit is in ``path``; None while it is absent (a git the
        killed run started may still be writing)."""
        try:
            return "new_helper" in path.read_text()
        except FileNotFoundError:
            return None

    found = []
    seen = (rewritten(workdir / p / f"mod{m:03d}.py") for p in RENAMED for m in range(MODULES))
    renamed = [done for done in seen if done is not None]
    if share(renamed):
        found.append("rename")
    legacy = [not (workdir / f"legacy/part{i // 50}/old{i:03d}.py").exists() for i in range(LEGACY)]
    if share(legacy):
        found.append("legacy")
    moved = [
        *(not (workdir / f"docs/section{i // 30}/page{i:03d}.md").exists() for i in range(DOCS)),
        *((workdir / f"manual/section{i // 30}/page{i:03d}.md").exists() for i in range(DOCS)),
    ]
    if share(moved):
        found.append("docs")
    metrics = [(workdir / f"src/app/metrics/m{i}.py").exists() for i in range(1, METRICS + 1)]
    if share(metrics):
        found.append("metrics")
    return found


# ------------------------------------------------------------------------------ resuming


@dataclass
class Resumed:
    returncode: int
    stderr: str
    attempts: int
    elapsed: float


def resume(server: ScriptedServer, workdir: Path, *, attempts: int = 1) -> Resumed:
    """``orchmode resume`` until it finishes, at most ``attempts`` times (each failure's
    output is kept)."""
    started = time.monotonic()
    errors: list[str] = []
    done: subprocess.CompletedProcess[str] | None = None
    for n in range(1, attempts + 1):
        done = orchmode("resume", *flags(server), cwd=workdir)
        if done.returncode == 0:
            return Resumed(0, "\n".join(errors), n, time.monotonic() - started)
        errors.append(done.stderr)
    assert done is not None
    return Resumed(done.returncode, "\n".join(errors), attempts, time.monotonic() - started)


# ---------------------------------------------------------------------------- the checks


def applied_once(workdir: Path) -> list[str]:
    """What is wrong with the changes as the directory holds them: a change missing,
    applied twice or in part, or the refuted one there at all (empty: all well)."""
    problems = []
    try:
        changelog = (workdir / "CHANGELOG.md").read_text().splitlines()
    except OSError as exc:
        return [f"CHANGELOG.md: {exc}"]
    for line in CHANGELOG_LINES:
        count = changelog.count(line)
        if count != 1:
            problems.append(f"CHANGELOG.md holds {line!r} {count} times")
    if REFUTED_LINE in changelog:
        problems.append("CHANGELOG.md holds the refuted change's line")
    if [line for line in changelog if line.startswith("<<<<<<<") or line == "======="]:
        problems.append("CHANGELOG.md holds conflict markers")
    for p in RENAMED:
        for m in range(MODULES):
            path = workdir / p / f"mod{m:03d}.py"
            text = path.read_text() if path.exists() else ""
            if text.count("new_helper") != 2 or "old_helper" in text:
                problems.append(f"{path.relative_to(workdir)}: the renaming is not there whole")
                break
    if (workdir / "legacy").exists():
        problems.append("legacy/ is still there (in part)")
    if (workdir / "docs").exists():
        problems.append("docs/ is still there (in part)")
    pages = list((workdir / "manual").rglob("*.md")) if (workdir / "manual").exists() else []
    if len(pages) != DOCS:
        problems.append(f"manual/ holds {len(pages)} pages, not {DOCS}")
    for script in ("scripts/build.sh", "scripts/deploy.sh"):
        if not os.access(workdir / script, os.X_OK):
            problems.append(f"{script} is not executable")
    metrics = list((workdir / "src/app/metrics").glob("m*.py"))
    if len(metrics) != METRICS:
        problems.append(f"src/app/metrics holds {len(metrics)} modules, not {METRICS}")
    logo = workdir / "src/app/metrics/logo.bin"
    if not logo.exists() or logo.read_bytes() != b"\x00\x01\x02\xff":
        problems.append("src/app/metrics/logo.bin is not the worker's four bytes")
    if (workdir / "src/app/version.py").exists():
        problems.append("the refuted change's src/app/version.py is there")
    if "DEBUG = False" not in (workdir / "config.py").read_text():
        problems.append("config.py: debugging is still on")
    return problems


@dataclass
class Outcome:
    """One kill and its resume, checked."""

    number: int
    killed: Killed
    resumed: Resumed | None
    problems: list[str] = field(default_factory=list)
    #: Each change applied once, none in part, the refuted one nowhere.
    once: bool = False

    @property
    def survived(self) -> bool:
        return self.resumed is not None and self.resumed.returncode == 0 and not self.problems


def check(
    workdir: Path,
    expected: Mapping[str, Entry],
    repo_before: Mapping[str, str],
    *,
    wait_for_processes: float = 10,
) -> tuple[list[str], bool]:
    """Every way the directory differs from the uninterrupted run's; whether each change is
    there exactly once."""
    problems = [f"tree: {line}" for line in differences(expected, tree_state(workdir))]
    once = applied_once(workdir)
    problems += [f"changes: {line}" for line in once]
    if repo_state(workdir) != dict(repo_before):
        now = repo_state(workdir)
        problems += [f"git: {k} changed" for k in repo_before if repo_before[k] != now.get(k)]
    problems += [f"left behind: {p}" for p in left_behind(workdir)]
    deadline = time.monotonic() + wait_for_processes
    while (alive := processes_in(workdir)) and time.monotonic() < deadline:
        time.sleep(0.05)  # a process just killed may take a moment to be reaped
    problems += [f"process left: {p}" for p in alive]
    return problems, not once


def table(outcomes: Sequence[Outcome]) -> str:
    """One line a kill: its moment, the phase it hit, the resume, and what was wrong."""
    lines = [
        f"{'#':>3}  {'moment':<36} {'phase':<13} {'mid-write':<9} {'resume':<14} result",
    ]
    for o in outcomes:
        k, r = o.killed, o.resumed
        if not k.killed:
            resumed = "not killed"
        elif r is None:
            resumed = "-"
        else:
            tries = f" ({r.attempts} tries)" if r.attempts > 1 else ""
            how = "ok" if r.returncode == 0 else f"exit {r.returncode}"
            resumed = f"{how} {r.elapsed:.1f} s{tries}"
        result = "ok" if o.survived else "; ".join(o.problems)[:400]
        lines.append(
            f"{o.number:>3}  {k.moment!s:<36} {k.phase:<13} {'yes' if k.mid_write else '':<9} "
            f"{resumed:<14} {result}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Reference:
    """The starting repository, and what an uninterrupted run makes of it."""

    start: Path
    expected: dict[str, Entry]
    repo: dict[str, str]
    #: The uninterrupted run's wall time.
    elapsed: float


def reference_run(start: Path, where: Path) -> Reference:
    """Run the scenario once, uninterrupted, on a copy of ``start``; what it leaves, which
    must itself pass every check."""
    server = start_server(scenario())
    try:
        workdir = copy_repo(start, where)
        began = time.monotonic()
        done = orchmode("run", TASK, *flags(server), cwd=workdir)
        elapsed = time.monotonic() - began
    finally:
        server.stop_thread()
    if done.returncode != 0:
        raise AssertionError(f"the uninterrupted run failed: {done.stderr}")
    expected = tree_state(workdir)
    if expected == tree_state(start):
        raise AssertionError("the uninterrupted run changed nothing")
    problems, _ = check(workdir, expected, repo_state(start))
    if problems:
        raise AssertionError(f"the uninterrupted run fails its own checks: {problems}")
    return Reference(start, expected, repo_state(start), elapsed)


def kill_and_resume(
    number: int, moment: Moment, server: ScriptedServer, reference: Reference, where: Path
) -> Outcome:
    """Kill a run of a fresh copy of the repository at ``moment``, resume it, check it.
    The copy is removed when all is well, kept to look at when not."""
    workdir = copy_repo(reference.start, where / f"kill-{number:02d}")
    killed = kill_at(moment, server, workdir)
    resumed = resume(server, workdir) if killed.killed else None
    outcome = Outcome(number, killed, resumed)
    if resumed is not None and resumed.returncode != 0:
        outcome.problems.append(f"resume failed: {resumed.stderr.strip()[-2000:]}")
    problems, once = check(workdir, reference.expected, reference.repo)
    outcome.problems += problems
    outcome.once = once
    if outcome.survived:
        remove = subprocess.run(["rm", "-rf", str(workdir)], check=False)
        if remove.returncode != 0:
            outcome.problems.append(f"{workdir} could not be removed")
    return outcome


def run_kills(
    moments: Sequence[Moment], reference: Reference, where: Path, *, lanes: int = 2
) -> list[Outcome]:
    """Every moment's kill and resume, ``lanes`` at a time (each lane a scripted server of
    its own, so that what one run's moment waits for is that run's requests alone)."""
    numbered = list(enumerate(moments, 1))
    outcomes: list[Outcome] = []

    def lane(mine: Sequence[tuple[int, Moment]]) -> list[Outcome]:
        server = start_server(scenario())
        try:
            return [kill_and_resume(n, m, server, reference, where) for n, m in mine]
        finally:
            server.stop_thread()

    with ThreadPoolExecutor(max(1, lanes)) as pool:
        shares = [numbered[i :: max(1, lanes)] for i in range(max(1, lanes))]
        for done in pool.map(lane, shares):
            outcomes.extend(done)
    return sorted(outcomes, key=lambda o: o.number)
