"""Runs killed with SIGKILL at chosen moments, then resumed: what the fault suite
(``tests/test_faults.py``) and ``bench/faults.py`` share.

The scenario is a worktree fan-out over a git repository of a few thousand files whose
workers write, delete and rename files (:func:`make_repo`, :data:`SUBTASKS`): one rewrites
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

import contextlib
import hashlib
import os
import random
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from orchmode.testing import LoggedRequest, Reply, ScriptedRequest, ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario, mode_is_on, role_of

API_KEY = "test-key"
#: A short lease, so a killed run's claims lapse quickly for the resume.
LEASE = ("--claim-lease", "2")
GIT = ("git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main")
TASK = "Tidy the code base"

#: The phases a moment can fall in, in the order a run goes through them.
PHASES = ("planning", "fan-out", "verification", "merge", "synthesis")

# ------------------------------------------------------------------------ the repository

PACKAGES = 20
MODULES = 100
#: The packages whose modules the renaming worker rewrites (6 × 100 = 600 files).
RENAMED = tuple(f"src/app/pkg{p:02d}" for p in range(6))
LEGACY = 200
DOCS = 120
METRICS = 40


def _module(p: int, m: int) -> str:
    lines = [
        f'"""Module {m} of package {p}."""',
        "",
        "from app.util import old_helper",
        "",
        "",
        f"def run_{m}(value: int) -> int:",
        f"    return old_helper(value) + {p * MODULES + m}",
        "",
    ]
    return "\n".join(lines)


def repo_files() -> dict[str, str]:
    """The repository's files: about 2,500, source-like."""
    files = {
        "README.md": "# app\n\nA service.\n",
        "CHANGELOG.md": "# Changelog\n\n## Unreleased\n",
        "config.py": "DEBUG = True\nLIMIT = 10\n",
        "src/app/__init__.py": "",
        "src/app/util.py": "def old_helper(value: int) -> int:\n    return value * 2\n",
        "tmp/scratch.txt": "scratch\n",
        "scripts/build.sh": "#!/bin/sh\necho build\n",
        "scripts/deploy.sh": "#!/bin/sh\necho deploy\n",
    }
    for p in range(PACKAGES):
        files[f"src/app/pkg{p:02d}/__init__.py"] = ""
        for m in range(MODULES):
            files[f"src/app/pkg{p:02d}/mod{m:03d}.py"] = _module(p, m)
    for i in range(LEGACY):
        files[f"legacy/part{i // 50}/old{i:03d}.py"] = f"# legacy {i}\nVALUE = {i}\n"
    for i in range(DOCS):
        files[f"docs/section{i // 30}/page{i:03d}.md"] = f"# Page {i}\n\n" + "text " * 40 + "\n"
    return files


def make_repo(root: Path) -> Path:
    """The repository, committed, with an uncommitted edit and an untracked file too."""
    root.mkdir(parents=True)
    for name, content in repo_files().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    subprocess.run([*GIT, "init", "-q"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "start"], cwd=root, check=True)
    with (root / "README.md").open("a") as handle:
        handle.write("Uncommitted line.\n")
    (root / "NOTES.txt").write_text("untracked notes\n")
    return root


def copy_repo(source: Path, target: Path) -> Path:
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)
    return target


# ---------------------------------------------------------------------------- the workers

#: Each worker's subtask names its one command after ``$ ``; "REFUTE" marks the one its
#: verifier refutes. The first three append to the changelog: the first merges, the other
#: two conflict with it (and each other) and go to resolvers.
SUBTASKS = (
    "Rename old_helper to new_helper $ sed -i 's/old_helper/new_helper/g' src/app/util.py "
    + " ".join(f"{p}/*.py" for p in RENAMED)
    + " && echo '- renamed old_helper to new_helper' >> CHANGELOG.md",
    "Drop the legacy package $ git rm -q -r legacy && echo '- dropped legacy/' >> CHANGELOG.md",
    # mv, not git mv: an overlay refuses to rename a directory of its lower layer (EXDEV),
    # and mv then copies and deletes, as it does across file systems.
    "Move the docs to manual/ $ mv docs manual && chmod +x scripts/build.sh "
    "scripts/deploy.sh && echo '- moved docs/ to manual/' >> CHANGELOG.md",
    "Add a metrics package $ mkdir -p src/app/metrics && for i in $(seq 1 "
    f'{METRICS}); do echo "VALUE_$i = $i" > src/app/metrics/m$i.py; done && '
    "printf '\\000\\001\\002\\377' > src/app/metrics/logo.bin",
    "Bump the version REFUTE $ echo 'VERSION = 9' > src/app/version.py && "
    "echo '- bumped the version' >> CHANGELOG.md",
    "Turn debugging off $ sed -i 's/DEBUG = True/DEBUG = False/' config.py && rm tmp/scratch.txt",
)
#: The lines the confirmed workers append to the changelog: each must be there once.
CHANGELOG_LINES = (
    "- renamed old_helper to new_helper",
    "- dropped legacy/",
    "- moved docs/ to manual/",
)
REFUTED_LINE = "- bumped the version"


def command_of(subtask: str) -> str | None:
    return subtask.split("$ ", 1)[1] if "$ " in subtask else None


def refute_marked(prompt: str) -> str:
    return "refuted" if "REFUTE" in prompt else "confirmed"


#: The summary turn's reply waits this long: the last moments (a point plus its offset)
#: must still find the run alive.
LAST_REPLY_DELAY = 0.25


@dataclass
class KilledScenario(OrchestrationScenario):
    """The scenario, its last reply (the summary turn's) held back a little."""

    def main(self, request: ScriptedRequest) -> Reply:
        reply = super().main(request)
        if not mode_is_on(request.messages):
            reply.delay = max(reply.delay, LAST_REPLY_DELAY)
        return reply


def scenario(delay: float = 0.03) -> OrchestrationScenario:
    return KilledScenario(
        subtasks=list(SUBTASKS),
        scout_command="ls",
        worker_command=command_of,
        verdict=refute_marked,
        delay=delay,
    )


def start_server(responder: OrchestrationScenario) -> ScriptedServer:
    server = ScriptedServer(responder, api_key=API_KEY)
    server.start_in_thread()
    return server


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


def journal_roles(journal: Path) -> list[tuple[str, str]]:
    """The (role, prompt) of every result recorded in a SQLite journal so far."""
    if not journal.exists():
        return []
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
        try:
            return [(r[0], r[1]) for r in db.execute("SELECT role, prompt FROM results")]
        finally:
            db.close()
    except sqlite3.OperationalError:  # not created yet, or mid-creation
        return []


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

Entry = tuple[str, int, str]  # kind, permission bits, sha256 of the bytes (or link target)


def tree_state(root: Path, skip: Sequence[str] = (".orchmode", ".git")) -> dict[str, Entry]:
    """Every path under ``root`` (directories too) but ``skip``: its kind, mode, content."""
    found: dict[str, Entry] = {}
    for top, dirs, files in os.walk(root):
        rel = os.path.relpath(top, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in skip]
        for name in (*dirs, *files):  # a link to a directory is among dirs, not followed
            path = os.path.join(top, name)
            info = os.lstat(path)
            key = os.path.relpath(path, root)
            if stat.S_ISLNK(info.st_mode):
                found[key] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[key] = ("dir", stat.S_IMODE(info.st_mode), "")
            else:
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
                found[key] = ("file", stat.S_IMODE(info.st_mode), digest)
    return found


def differences(expected: Mapping[str, Entry], actual: Mapping[str, Entry]) -> list[str]:
    """How ``actual`` differs from ``expected``, one line a path (the first 20)."""
    lines = []
    for path in sorted(set(expected) | set(actual)):
        want, have = expected.get(path), actual.get(path)
        if want == have:
            continue
        if want is None:
            lines.append(f"{path}: there, but not in the uninterrupted run's")
        elif have is None:
            lines.append(f"{path}: missing")
        elif want[0] != have[0]:
            lines.append(f"{path}: a {have[0]}, not a {want[0]}")
        elif want[1] != have[1]:
            lines.append(f"{path}: mode {have[1]:o}, not {want[1]:o}")
        else:
            lines.append(f"{path}: other bytes")
    return lines[:20] + ([f"… and {len(lines) - 20} more"] if len(lines) > 20 else [])


def git_out(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def repo_state(root: Path) -> dict[str, str]:
    """Everything of the user's repository that orchmode must never change (its own path
    written as ``<workdir>``, so that copies of one repository compare)."""
    dot = root / ".git"
    state = {
        "head": git_out(root, "rev-parse", "HEAD"),
        "symbolic": git_out(root, "symbolic-ref", "HEAD"),
        "branches": git_out(root, "branch", "--list", "-a"),
        "refs": git_out(root, "for-each-ref"),
        "stash": git_out(root, "stash", "list"),
        "worktrees": git_out(root, "worktree", "list", "--porcelain"),
        "index": hashlib.sha256((dot / "index").read_bytes()).hexdigest(),
        "config": (dot / "config").read_text(),
        "staged": git_out(root, "diff", "--cached", "--name-status"),
    }
    return {k: v.replace(str(root), "<workdir>") for k, v in state.items()}


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


#: What orchmode keeps in ``.orchmode/trees`` between sessions: the store, the checkout
#: and the locks sessions share (``flock``: the files stay, no lock is held).
KEPT_IN_TREES = frozenset(
    {
        "store.git",
        "plain.git",
        "checkout",
        "checkout.commit",
        "checkout.lock",
        "store.lock",
        "merge.lock",
        "base-objects",
        "runs",
    }
)
#: Names of temporary files, anywhere under ``.orchmode`` (outside git's own object store).
_TEMPORARY = re.compile(r"^(\.tmp-.*|.*\.tmp|.*\.lock|\.trash-.*|\.link-.*|.*\.index)$")


def left_behind(workdir: Path) -> list[str]:
    """Workspaces, layers, copies and temporary files a finished session should not leave."""
    state = workdir / ".orchmode"
    trees = state / "trees"
    found = []
    if trees.exists():
        found += [f"trees/{p.name}" for p in trees.iterdir() if p.name not in KEPT_IN_TREES]
        runs = trees / "runs"
        if runs.exists():
            found += [f"trees/runs/{p.name}" for p in runs.iterdir()]
    for top, dirs, files in os.walk(state):
        rel = os.path.relpath(top, state)
        if rel.startswith(("trees/checkout", "trees/store.git/objects", "trees/plain.git")):
            dirs[:] = []
            continue
        for name in [*files, *dirs]:
            where = os.path.join(rel, name) if rel != "." else name
            if where in ("trees/checkout.lock", "trees/store.lock", "trees/merge.lock"):
                continue
            if _TEMPORARY.match(name):
                found.append(where)
    return sorted(set(found))


def processes_in(workdir: Path) -> list[str]:
    """The processes whose working directory or command line is in ``workdir``."""
    where = os.path.realpath(workdir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if cwd == where or cwd.startswith(where + "/") or where in argv:
                found.append(f"{entry.name}: {argv.strip()[:120]} (in {cwd})")
    return found


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
