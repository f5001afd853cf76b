"""What ``worktree`` isolation costs per agent, and what it adds to a fan-out's makespan.

Both parts run on git repositories built in a temporary directory, of 1,000, 10,000 and
100,000 committed files (``--sizes``): source-like text of 2-4 KB each, ten to a
directory, two levels deep; on top of the last commit a few uncommitted edits and
untracked files, and an ignored ``.venv/``. The user's index is fresh, as a working
repository's is.

1. **One agent's workspace**, through :mod:`orchmode.trees.workspaces`, ``--repeats``
   times each (medians), as a copy-on-write overlay and as a full copy (the fallback), in
   the same run: the call's snapshot; the session's one checkout (overlays: the first
   workspace pays it); a worker's workspace opened; the worker edits three files (through
   its overlay, in its own namespace), then its change is read as the workspace closes
   (target for overlays: open + change <= 20 ms at every size); the disk the workspace
   takes beyond the files the worker wrote (target <= 1 MB); its verifier's view (the
   worker's kept layer, and one made anew from the patch, as on Ray or after a resume);
   the merge into the working directory.
2. **The makespan of a fan-out**: a session of two orchestrated turns, then a new session
   of one, against the scripted server, 1 s per model request; in each, the main agent
   scouts, fans out 8
   subtasks (8 in flight) and sums up; each worker appends a line to a file of its own,
   then reports, and each verifier confirms it. Each call's wall time with
   ``isolation = "worktree"`` (``overlay``: copy-on-write workspaces; ``copy``: full
   copies) against ``"shared"`` (every worker writes the working directory), in the
   bubblewrap sandbox (target <= 1.10x), and each against its lower bound: six requests
   one after the other (scout, Workflow, worker's two, verifier's, synthesis). The first
   call pays for checking the tree out; later calls, and the next session (which finds
   the checkout kept), only for what changed. Where a turn went: before the fan-out (the
   scout's and the Workflow call's requests, and the snapshot), the fan-out, merging (from
   the fan-out's end to the last change merged) and after (the synthesis); and the disk
   the working directory takes after each call beyond what it took before (``du``, which
   counts a file linked twice once), and at its peak during the call: the file system's
   blocks in use, read every 5 ms, over what they were before the session. The peak counts
   whatever else writes to that file system meanwhile: give ``--tmp`` a file system of its
   own (a loop-mounted image, say) for a figure that is orchmode's alone. The first call's
   targets: <= 64 MB at its peak, and <= 1.5x ``shared``. Every worker's lines must be in
   the working directory at the end.

    .venv/bin/python bench/isolation.py [--sizes 1000,10000,100000] [--repeats 5]
        [--runs 2] [--parts 1,2] [--kinds shared,overlay,copy] [--tmp DIR]

Checkouts and copies cost what creating files costs on the filesystem the repositories
are on (the script prints its type): ``--tmp /dev/shm`` puts them on a tmpfs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchmode.core.events import ChangeSettled, Event, EventBus, FanoutDone, FanoutStarted
from orchmode.core.settings import Settings
from orchmode.model.providers import Credentials
from orchmode.session.agent import open_conversation
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.trees.trees import Trees
from orchmode.trees.workspaces import OverlayWorkspace, Spec, Workspace, Workspaces

KEY = "test-key"
SIZES = (1_000, 10_000, 100_000)
PARTS = (1, 2)
#: Part 1: files the worker edits in its copy.
EDITED = 3
#: The repository's state on top of its last commit.
UNCOMMITTED = 5
UNTRACKED = 5
IGNORED = 200
#: Part 2: the fan-out.
SUBTASKS = 8
CONCURRENT = 8
DELAY = 1.0
#: Model requests one after the other: scout, Workflow, worker (bash, report), verifier,
#: synthesis.
SERIAL_REQUESTS = 6
TARGET = 1.05
#: The first call ever in a directory, which makes the session's checkout (of links where
#: the working directory's files can be linked), and the disk it may add at most.
FIRST_TARGET = 1.5
FIRST_DISK_MB = 64
#: Seconds between two reads of the file system's blocks in use (see :class:`DiskPeak`).
PEAK_EVERY = 0.005
#: Seconds one turn may take before the benchmark gives up on it.
TURN_DEADLINE = 120.0
#: An hour ago: the committed files were written long before the index (none racy).
OLD = time.time() - 3600

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
    "LC_ALL": "C",
}

LINES = (
    "import os",
    "import json",
    "from dataclasses import dataclass",
    "",
    "",
    "def load_settings(path):",
    '    """Read the settings file, or the defaults when there is none."""',
    "    try:",
    "        with open(path) as handle:",
    "            return json.load(handle)",
    "    except FileNotFoundError:",
    "        return dict(DEFAULTS)",
    "class Cache:",
    "    def __init__(self, size=128):",
    "        self.size = size",
    "        self._items = {}",
    "    def get(self, key, default=None):",
    "        return self._items.get(key, default)",
    "    for attempt in range(retries):",
    "        time.sleep(delay * 2 ** attempt)",
    "    result = merge_results(items, strict=False)",
    "    if token == expected:",
    "        raise PermissionError('bad token')",
    "    log.debug('cache miss for %s', key)",
    "    query = 'SELECT id, name FROM jobs WHERE state = ?'",
    "    rows = connection.execute(query, (state,)).fetchall()",
    "    return [Job(*row) for row in rows]",
    "# TODO: the retry loop should give up after the deadline",
    "    assert isinstance(payload, dict), payload",
)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` is on (its longest mount point), from
    /proc/mounts: copies cost what creating files costs there."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "gc.auto=0", *args],
        cwd=cwd,
        env=GIT_ENV,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def source(rng: random.Random, name: str) -> str:
    """A source-like file of 2-4 KB, its own (its name and numbers differ)."""
    size = rng.randint(2_000, 4_000)
    lines = [f'"""{name}: generated for the isolation benchmark."""', ""]
    total = 0
    while total < size:
        line = rng.choice(LINES)
        if rng.random() < 0.2:
            line = f"{line}  # {rng.randint(0, 10**6)}" if line else line
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) + "\n"


def tracked_name(i: int) -> str:
    return f"src/pkg{i // 100:03d}/mod{(i // 10) % 10}/file{i:05d}.py"


def build_repo(root: Path, files: int, seed: int = 0) -> list[str]:
    """A committed repository of ``files`` files, then some uncommitted work; the paths."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    names = [tracked_name(i) for i in range(files - 3)]
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source(rng, name))
    (root / "README.md").write_text("# A generated repository\n\nFor bench/isolation.py.\n")
    (root / "pyproject.toml").write_text('[project]\nname = "generated"\nversion = "0.1"\n')
    (root / ".gitignore").write_text(".venv/\n__pycache__/\n")
    for path in root.rglob("*"):
        os.utime(path, (OLD, OLD))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the generated tree")
    git(root, "repack", "-a", "-d", "-q")  # packed, as a repository that has lived is
    # The work on top of it: edits not committed, new files not added, an ignored venv.
    for name in rng.sample(names[len(names) // 2 :], UNCOMMITTED):
        with (root / name).open("a") as handle:
            handle.write("# an edit not committed yet\n")
    for n in range(UNTRACKED):
        (root / f"src/new_{n}.py").write_text(source(rng, f"src/new_{n}.py"))
    packages = root / ".venv" / "lib" / "python3.11" / "site-packages"
    for n in range(IGNORED):
        path = packages / f"dep{n // 20}" / f"part{n}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source(rng, path.name))
    git(root, "update-index", "-q", "--refresh")
    return names


def clone(template: Path, where: Path) -> None:
    """A copy of the template repository, its index refreshed (new inodes, new ctimes)."""
    subprocess.run(["cp", "-a", str(template), str(where)], check=True)
    subprocess.run(
        ["git", "-c", "gc.auto=0", "update-index", "-q", "--refresh"],
        cwd=where,
        env=GIT_ENV,
        check=False,
    )


# ------------------------------------------------------------- 1. one agent's workspace


@dataclass
class Steps:
    """Seconds of each step of one kind of workspace, one entry per repetition."""

    kind: str
    snapshot: list[float] = field(default_factory=list)
    #: the first workspace of the session (overlays: the session's one checkout of the
    #: tree), and of each later call (the checkout brought up to date)
    checkout: float = 0.0
    update: list[float] = field(default_factory=list)
    open: list[float] = field(default_factory=list)
    change: list[float] = field(default_factory=list)
    verifier_kept: list[float] = field(default_factory=list)
    verifier_anew: list[float] = field(default_factory=list)
    merge: list[float] = field(default_factory=list)
    #: bytes on disk of the worker's workspace, and of the files it wrote (whole)
    disk: list[int] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    patch_bytes: int = 0


def used_bytes(path: Path) -> int:
    """Bytes in use on the file system that holds ``path`` (its blocks, not its files)."""
    stats = os.statvfs(path)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


class DiskPeak:
    """The most of a file system in use while it runs, read every :data:`PEAK_EVERY` s on
    a thread of its own: ``du`` after a call misses what the call wrote and removed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.most = used_bytes(path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(PEAK_EVERY):
            self.most = max(self.most, used_bytes(self.path))

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.most = max(self.most, used_bytes(self.path))


def disk_bytes(path: Path) -> int:
    """What ``path`` takes on disk (``du -sb``: apparent sizes of everything in it)."""
    done = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def edit_in(workspace: Workspace, names: list[str], n: int) -> int:
    """The worker's edit, made as its shell would make it (through the overlay, in its
    namespace; in a copy, in the copy); the bytes of the files it wrote."""
    lines = [
        f"sed -i 's/^import os$/import os  # edited/' {name} && "
        f"echo '# edited by worker {n}' >> {name}"
        for name in names
    ]
    script = " && ".join(lines)
    view = workspace.view
    argv = ["/bin/sh", "-c", script]
    if view.overlay is not None:
        subprocess.run(view.overlay.wrap(argv), check=True)
        root = view.overlay.upper
        assert root is not None
    else:
        subprocess.run(argv, cwd=view.root, check=True)
        root = view.root
    return sum((root / name).stat().st_size for name in names)


async def workspace_steps(workdir: Path, names: list[str], repeats: int, overlays: bool) -> Steps:
    steps = Steps("overlay" if overlays else "copy")
    trees = Trees(workdir)
    workspaces = Workspaces(trees, overlays=overlays)
    try:
        for n in range(repeats):
            started = time.perf_counter()
            snapshot = await trees.snapshots.snapshot()
            steps.snapshot.append(time.perf_counter() - started)
            spec = Spec(snapshot.commit, ignored=snapshot.ignored, chain=f"1.{n}")
            # The call's first workspace brings the session's checkout up to date (the
            # first call's checks the tree out): once per call, timed on its own.
            first = workspaces.workspace(f"first-{n}", spec)
            started = time.perf_counter()
            await first.open()
            elapsed = time.perf_counter() - started
            if n == 0:
                steps.checkout = elapsed
            else:
                steps.update.append(elapsed)
            first.discard()
            worker = workspaces.workspace(f"worker-{n}", spec)
            started = time.perf_counter()
            await worker.open()
            elapsed = time.perf_counter() - started
            steps.open.append(elapsed)
            steps.written.append(edit_in(worker, names[n * EDITED : (n + 1) * EDITED], n))
            started = time.perf_counter()
            change = await worker.close(keep_for=spec.chain)
            steps.change.append(time.perf_counter() - started)
            assert change is not None
            steps.patch_bytes = len(change.patch.encode())
            home = worker.home if isinstance(worker, OverlayWorkspace) else worker.view.root
            steps.disk.append(disk_bytes(home))

            check = Spec(change.base, change.patch, writable=False, chain=spec.chain)
            started = time.perf_counter()
            kept = workspaces.workspace(f"verifier-{n}", check)
            await kept.open()
            steps.verifier_kept.append(time.perf_counter() - started)
            anew = workspaces.workspace(f"verifier-{n}", replace(check, chain="elsewhere"))
            started = time.perf_counter()
            await anew.open()
            steps.verifier_anew.append(time.perf_counter() - started)

            started = time.perf_counter()
            merged = await trees.merges.merge(change)
            steps.merge.append(time.perf_counter() - started)
            if merged.fate != "merged":
                raise SystemExit(f"the worker's change was not merged: {merged}")
            await kept.close()
            await anew.close()
        for name in names[: repeats * EDITED]:
            if "# edited by worker" not in (workdir / name).read_text():
                raise SystemExit(f"{name}: the merged edit is not in the working directory")
    finally:
        workspaces.discard_kept()
        trees.close()
    return steps


def report_steps(results: dict[int, list[Steps]]) -> dict[int, tuple[float, int]]:
    """One table: a row per step, a column per repository size and kind (medians); the
    overlays' per-agent time and extra disk, by size."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def extra(s: Steps) -> int:
        return int(statistics.median(d - w for d, w in zip(s.disk, s.written, strict=True)))

    columns = [(n, s) for n, kinds in results.items() for s in kinds]
    rows: list[tuple[str, Callable[[Steps], str]]] = [
        ("snapshot (once per Workflow call)", lambda s: ms(med(s.snapshot))),
        ("session's first workspace (checkout)", lambda s: ms(s.checkout)),
        ("a later call's first (brought up to date)", lambda s: ms(med(s.update))),
        ("worker's workspace: open", lambda s: ms(med(s.open))),
        (f"  its change read ({EDITED} files edited)", lambda s: ms(med(s.change))),
        ("  open + change (target <= 20 ms)", lambda s: ms(med(s.open) + med(s.change))),
        ("  disk beyond its writes (<= 1 MB)", lambda s: f"{extra(s) / 1e3:,.0f} KB"),
        ("verifier's view of it, kept", lambda s: ms(med(s.verifier_kept))),
        ("verifier's view, anew (Ray, resume)", lambda s: ms(med(s.verifier_anew))),
        ("merge into the working directory", lambda s: ms(med(s.merge))),
    ]
    head = "".join(f"{f'{n:,} {s.kind}':>17}" for n, s in columns)
    print(f"  {'median per step':<40}{head}")
    for label, cell in rows:
        print(f"  {label:<40}" + "".join(f"{cell(s):>17}" for _, s in columns))
    return {
        n: (med(s.open) + med(s.change), extra(s))
        for n, kinds in results.items()
        for s in kinds
        if s.kind == "overlay"
    }


def report_step_targets(figures: dict[int, tuple[float, int]]) -> None:
    for files, (seconds, extra) in figures.items():
        time_ok = "met" if seconds <= 0.020 else "MISSED"
        disk_ok = "met" if extra <= 1_000_000 else "MISSED"
        print(
            f"  {files:,} files: an overlay workspace's open + change read {ms(seconds)} "
            f"(target <= 20 ms) {time_ok}; disk beyond its writes {extra / 1e3:,.0f} KB "
            f"(target <= 1 MB) {disk_ok}"
        )


# ----------------------------------------------------------------------- 2. the makespan


def edit_command(names: list[str]) -> Callable[[str], str | None]:
    """Worker ``i`` appends a line to file ``i``: each edits a file of its own."""

    def command(subtask: str) -> str | None:
        match = re.search(r"Check item (\d+)", subtask)
        if match is None:
            return None
        i = int(match.group(1))
        return f"echo '# edited by worker {i}' >> {names[i - 1]}"

    return command


@dataclass
class Makespan:
    """One Workflow call's turn: its wall time, and where it went (seconds)."""

    kind: str
    turn: float
    #: the scout's and the Workflow call's requests, and the snapshot
    before: float
    fanout: float
    #: from the fan-out's end to the last change settled (merged or kept)
    merging: float
    fates: list[str]
    #: bytes the working directory took on disk after the turn beyond what it took before
    #: the session (``du``: a file linked twice counts once)
    disk: int = 0
    #: the most bytes of its file system in use during the turn, over what was in use
    #: before the session (see :class:`DiskPeak`)
    peak: int = 0


@dataclass
class Tally:
    """When each turn's fan-out started and ended, and when each change settled."""

    started: float = 0.0
    fanout_started: float | None = None
    fanout_done: float | None = None
    settled: list[float] = field(default_factory=list)
    fates: list[str] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        now = time.perf_counter()
        if isinstance(event, FanoutStarted) and self.fanout_started is None:
            self.fanout_started = now
        elif isinstance(event, FanoutDone) and self.fanout_done is None:
            self.fanout_done = now
        elif isinstance(event, ChangeSettled):
            self.settled.append(now)
            self.fates.append(event.fate)

    def span(self, kind: str, wall: float) -> Makespan:
        if self.fanout_started is None or self.fanout_done is None:
            raise SystemExit(f"{kind}: the turn made no fan-out")
        last = max(self.settled, default=self.fanout_done)
        return Makespan(
            kind,
            wall,
            self.fanout_started - self.started,
            self.fanout_done - self.fanout_started,
            last - self.fanout_done,
            self.fates,
        )


#: What each kind of run sets: the agents' isolation, and what their workspaces are.
KINDS: dict[str, dict[str, str]] = {
    "shared": {"isolation": "shared"},
    "overlay": {"isolation": "worktree", "workspaces": "auto"},
    "copy": {"isolation": "worktree", "workspaces": "copy"},
}


#: The calls measured: a session's first and second, then a new session's first.
CALLS = ("first", "later", "next session")


async def three_turns(
    url: str, workdir: Path, store_path: Path, kind: str, base: int, base_used: int
) -> list[Makespan]:
    """Two orchestrated turns in one session, then one in a new session: the first pays
    for checking the tree out (under overlays), the second only for what changed since,
    and so does the new session, which finds the checkout the first one kept."""
    settings = Settings(
        base_url=url,
        workdir=workdir,
        max_retries=0,
        max_concurrent=CONCURRENT,
        max_subtasks=SUBTASKS,
        max_subagents=4 * SUBTASKS + 10,
        merge="verified",
        fresh=True,  # the later turns' agents run too, rather than come from the journal
        **KINDS[kind],  # type: ignore[arg-type]
    )
    spans: list[Makespan] = []
    for turns in (2, 1):
        events = EventBus()
        store = SQLiteStore.open(store_path)
        credentials = Credentials(api_key=KEY)
        try:
            async with open_conversation(
                settings, credentials, events=events, store=store
            ) as session:
                for _ in range(turns):
                    tally = Tally()
                    events.subscribers = [tally]
                    tally.started = started = time.perf_counter()
                    with DiskPeak(workdir) as peak:
                        result = await asyncio.wait_for(
                            session.turn("Fan out the edits."), TURN_DEADLINE
                        )
                    wall = time.perf_counter() - started
                    if result.error is not None:
                        raise SystemExit(f"{kind}: the turn failed: {result.error}")
                    span = tally.span(kind, wall)
                    disk = disk_bytes(workdir) - base
                    spans.append(replace(span, disk=disk, peak=peak.most - base_used))
        finally:
            await store.close()
    return spans


def makespan(template: Path, names: list[str], kind: str, where: Path) -> list[Makespan]:
    scenario = OrchestrationScenario(
        subtasks=SUBTASKS, delay=DELAY, scout_command="ls", worker_command=edit_command(names)
    )
    server = ScriptedServer(scenario, api_key=KEY)
    where.mkdir()
    workdir = where / "repo"
    clone(template, workdir)
    base, base_used = disk_bytes(workdir), used_bytes(workdir)
    with server.in_thread():
        spans = asyncio.run(
            three_turns(server.url, workdir, where / "store.db", kind, base, base_used)
        )
    for i, name in enumerate(names[:SUBTASKS], start=1):
        if (workdir / name).read_text().count(f"# edited by worker {i}\n") != len(CALLS):
            raise SystemExit(f"{kind}: worker {i}'s edits are not all in the working directory")
    shutil.rmtree(where, ignore_errors=True)
    return spans


def makespan_header() -> None:
    print(
        f"  {'files':>7}  {'kind':<7} {'call':<12} {'turn s':>7} {'/ bound':>7} {'before':>7} "
        f"{'fan-out':>7} {'merging':>7} {'after':>6} {'disk MB':>8} {'peak MB':>8}  runs (turn s)"
    )


def report_makespans(files: int, runs: dict[str, list[list[Makespan]]]) -> dict[str, float]:
    """A row per kind and call (medians of the runs); each kind's ratio to ``shared``, by
    call (``first``, ``later``)."""
    ideal = SERIAL_REQUESTS * DELAY
    medians: dict[tuple[str, int], float] = {}
    verdicts: list[str] = []

    def med(values: list[float]) -> float:
        return statistics.median(values)

    for kind, sessions in runs.items():
        for call, label in enumerate(CALLS):
            spans = [turns[call] for turns in sessions]
            turn = med([s.turn for s in spans])
            before = med([s.before for s in spans])
            fanout = med([s.fanout for s in spans])
            merging = med([s.merging for s in spans])
            after = med([s.turn - s.before - s.fanout - s.merging for s in spans])
            disk = max(s.disk for s in spans) / 1e6
            peak = max(s.peak for s in spans) / 1e6
            medians[kind, call] = turn
            print(
                f"  {files:>7,}  {kind:<7} {label:<12} {turn:7.3f} {turn / ideal:6.3f}x "
                f"{before:7.3f} {fanout:7.3f} {merging:7.3f} {after:6.3f} {disk:8.1f} "
                f"{peak:8.1f}  {', '.join(f'{s.turn:.3f}' for s in spans)}"
            )
            if kind != "shared" and label == "first":
                verdict = "met" if peak <= FIRST_DISK_MB else "MISSED"
                verdicts.append(
                    f"  {files:,} files, {kind} workspaces, the first call's extra disk at "
                    f"its peak {peak:.1f} MB, after it {disk:.1f} MB (target <= "
                    f"{FIRST_DISK_MB} MB at its peak) {verdict}"
                )
        fates = Counter(f for turns in sessions for s in turns for f in s.fates)
        expected = len(CALLS) * SUBTASKS * len(sessions) if kind != "shared" else 0
        if fates.get("merged", 0) != expected:
            print(f"  WARNING: {kind}: changes {dict(fates)}, expected {expected} merged")
    print("\n".join(verdicts))
    return {
        f"{kind}|{label}": medians[kind, call] / medians["shared", call]
        for kind in runs
        if kind != "shared"
        for call, label in enumerate(CALLS)
    }


def report_ratios(ratios: dict[int, dict[str, float]]) -> None:
    for files, by_kind in ratios.items():
        for name, ratio in by_kind.items():
            kind, call = name.split("|")
            target = FIRST_TARGET if call == "first" else TARGET
            verdict = "met" if ratio <= target else "MISSED"
            what = {
                "first": "the session's first call",
                "later": "a later call",
                "next session": "a new session's first call",
            }[call]
            print(
                f"  {files:,} files, {kind} workspaces, {what}: makespan / shared "
                f"{ratio:.3f}x (target <= {target:.2f}x) {verdict}"
            )


# ----------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="files")
    parser.add_argument("--repeats", type=int, default=5, help="part 1: times each step runs")
    parser.add_argument("--runs", type=int, default=2, help="part 2: sessions per kind")
    parser.add_argument("--parts", default="1,2", help="which parts to run")
    parser.add_argument(
        "--kinds",
        default="shared,overlay",
        help="part 2: kinds of run (shared, overlay, copy); part 1 always times both "
        "kinds of workspace",
    )
    parser.add_argument(
        "--tmp", default=None, help="where the repositories go (default: the system's temp dir)"
    )
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        parts = {int(p) for p in args.parts.split(",") if p.strip()}
    except ValueError:
        parser.error("--sizes and --parts are comma-separated numbers")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if parts - set(PARTS) or not parts:
        parser.error("--parts is a comma-separated list of 1 and 2")
    if set(kinds) - set(KINDS) or "shared" not in kinds:
        parser.error(f"--kinds is a comma-separated list of {', '.join(KINDS)}, with shared")
    if any(s < SUBTASKS + EDITED * args.repeats + UNCOMMITTED + 3 for s in sizes):
        parser.error("a repository needs more files than the edits take")
    if args.repeats < 2 or args.runs < 1:
        parser.error("--repeats must be >= 2 and --runs >= 1")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="orchmode-bench-", dir=args.tmp) as tmp:
        root = Path(tmp)
        print(f"repositories in {root.parent} ({filesystem(root)})")
        templates: dict[int, tuple[Path, list[str]]] = {}
        for files in sizes:
            started = time.perf_counter()
            template = root / f"template-{files}"
            templates[files] = (template, build_repo(template, files))
            print(f"built a {files:,}-file repository in {time.perf_counter() - started:.1f} s")
        if 1 in parts:
            print(f"1. one agent's workspace, overlay and full copy ({args.repeats} times each; "
                  f"{load()})", flush=True)  # fmt: skip
            results: dict[int, list[Steps]] = {}
            for files in sizes:
                template, names = templates[files]
                results[files] = []
                for overlays in (True, False):
                    workdir = root / f"steps-{files}-{overlays}" / "repo"
                    workdir.parent.mkdir()
                    clone(template, workdir)
                    steps = asyncio.run(workspace_steps(workdir, names, args.repeats, overlays))
                    results[files].append(steps)
                    shutil.rmtree(workdir.parent, ignore_errors=True)
            report_step_targets(report_steps(results))
        if 2 in parts:
            print(
                f"2. fan-out makespan: {SUBTASKS} subtasks, {CONCURRENT} in flight, {DELAY:g} s "
                f"per model request, each worker edits one file, bubblewrap sandbox, merge = "
                f"verified; two calls in a session, then a new session's; median of "
                f"{args.runs} runs each "
                f"({load()})",
                flush=True,
            )
            makespan_header()
            ratios: dict[int, dict[str, float]] = {}
            for files in sizes:
                template, names = templates[files]
                runs: dict[str, list[list[Makespan]]] = {kind: [] for kind in kinds}
                for n in range(args.runs):
                    for kind in kinds:
                        where = root / f"turn-{files}-{kind}-{n}"
                        runs[kind].append(makespan(template, names, kind, where))
                ratios[files] = report_makespans(files, runs)
            report_ratios(ratios)
    print(f"({time.perf_counter() - began:.1f} s in all)")


if __name__ == "__main__":
    main()
