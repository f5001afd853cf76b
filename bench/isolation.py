"""What ``worktree`` isolation costs per agent, and what it adds to a fan-out's makespan.

Both parts run on git repositories built in a temporary directory, of 1,000 and 10,000
committed files (``--sizes``): source-like text of 2-4 KB each, ten to a directory, two
levels deep; on top of the last commit a few uncommitted edits and untracked files, and
an ignored ``.venv/``. The user's index is fresh, as a working repository's is.

1. **Per agent, the git steps** of :mod:`orchmode.trees` on the real module, ``--repeats``
   times each (medians, in ms): the call's snapshot of the working directory; the worker's
   copy of it (``make_copy``), against a plain ``cp -r`` of the same files (the baseline,
   in the same run); the worker edits three files, then its patch is read (``change_of``);
   the verifier's copy, with that patch applied; the merge of the patch into the working
   directory; and the removal of the copies.
2. **The makespan of a fan-out**: one orchestrated turn against the scripted server, 1 s
   per model request, in which the main agent scouts, fans out 8 subtasks (8 in flight)
   and sums up; each worker appends a line to a file of its own, then reports, and each
   verifier confirms it. The turn's wall time with ``isolation = "worktree"`` (every
   agent in its own copy, the changes merged at the end) against ``"shared"`` (every
   worker writes the working directory), in the bubblewrap sandbox (target <= 1.10x), and
   each against its lower bound: six requests one after the other (scout, Workflow,
   worker's two, verifier's, synthesis). Where the turn went: before the fan-out (the
   scout's and the Workflow call's requests, and the snapshot), the fan-out (the copies
   are made while each agent's first request is in flight), merging (from the fan-out's
   end to the last change merged, one after another) and after (the synthesis). Every
   worker's line must be in the working directory after either.

    .venv/bin/python bench/isolation.py [--sizes 1000,10000] [--repeats 5] [--runs 2]
        [--parts 1,2] [--tmp DIR]

Copies cost what creating files costs on the filesystem the repositories are on (the
script prints its type): ``--tmp /dev/shm`` puts them on a tmpfs.
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
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchmode.core.events import ChangeSettled, Event, EventBus, FanoutDone, FanoutStarted
from orchmode.core.settings import Isolation, Settings
from orchmode.model.gateway import ModelGateway
from orchmode.model.providers import Credentials
from orchmode.session.agent import Session
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import ScriptedServer
from orchmode.testing.scenario import OrchestrationScenario
from orchmode.trees.copies import Trees

KEY = "test-key"
SIZES = (1_000, 10_000)
PARTS = (1, 2)
ISOLATIONS: tuple[Isolation, ...] = ("shared", "worktree")
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
TARGET = 1.10
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


# ------------------------------------------------------------------- 1. the git steps


@dataclass
class Steps:
    """Seconds of each step, one entry per repetition."""

    snapshot: list[float] = field(default_factory=list)
    copy: list[float] = field(default_factory=list)
    cp: list[float] = field(default_factory=list)
    patch: list[float] = field(default_factory=list)
    verifier_copy: list[float] = field(default_factory=list)
    merge: list[float] = field(default_factory=list)
    remove: list[float] = field(default_factory=list)
    patch_bytes: int = 0
    copied_files: int = 0


def timed_cp(workdir: Path, destination: Path) -> float:
    """``cp -r`` of everything a copy holds (the tree as git sees it: no ``.git``, no
    ignored ``.venv``, no ``.orchmode``); its seconds. The copy is removed untimed."""
    skip = {".git", ".venv", ".orchmode"}
    entries = sorted(str(p) for p in workdir.iterdir() if p.name not in skip)
    destination.mkdir()
    started = time.perf_counter()
    subprocess.run(["cp", "-r", *entries, str(destination)], check=True)
    elapsed = time.perf_counter() - started
    shutil.rmtree(destination)
    return elapsed


async def git_steps(workdir: Path, names: list[str], repeats: int) -> Steps:
    steps = Steps()
    trees = Trees(workdir)
    try:
        for n in range(repeats):
            started = time.perf_counter()
            snapshot = await trees.snapshot()
            steps.snapshot.append(time.perf_counter() - started)

            copy = trees.plan_copy(f"worker-{n}", snapshot.commit)
            started = time.perf_counter()
            await trees.make_copy(copy, ignored=snapshot.ignored)
            steps.copy.append(time.perf_counter() - started)
            steps.cp.append(timed_cp(workdir, workdir.parent / f"cp-{n}"))
            if n == 0:
                steps.copied_files = sum(
                    1 for p in copy.path.rglob("*") if p.is_file() and ".git" not in p.parts
                )

            for name in names[n * EDITED : (n + 1) * EDITED]:  # the worker's edit
                path = copy.path / name
                path.write_text(path.read_text().replace("import os", "import os  # edited", 1))
                with path.open("a") as handle:
                    handle.write(f"# edited by worker {n}\n")
            started = time.perf_counter()
            change = await trees.change_of(copy)
            steps.patch.append(time.perf_counter() - started)
            steps.patch_bytes = len(change.patch.encode())

            check = trees.plan_copy(f"verifier-{n}", change.base)
            started = time.perf_counter()
            await trees.make_copy(check, change.patch, snapshot.ignored)
            steps.verifier_copy.append(time.perf_counter() - started)

            started = time.perf_counter()
            merged = await trees.merge(change)
            steps.merge.append(time.perf_counter() - started)
            if merged.fate != "merged":
                raise SystemExit(f"the worker's change was not merged: {merged}")

            started = time.perf_counter()
            await asyncio.to_thread(trees.remove, copy)
            await asyncio.to_thread(trees.remove, check)
            steps.remove.append(time.perf_counter() - started)
        for name in names[: repeats * EDITED]:
            if "# edited by worker" not in (workdir / name).read_text():
                raise SystemExit(f"{name}: the merged edit is not in the working directory")
    finally:
        trees.close()
    return steps


def report_steps(results: dict[int, Steps]) -> None:
    """One table: a row per step, a column per repository size (medians)."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    sizes = list(results)
    rows: list[tuple[str, Callable[[Steps], str]]] = [
        ("files in a copy", lambda s: f"{s.copied_files:,}"),
        ("snapshot (once per Workflow call)", lambda s: ms(med(s.snapshot))),
        ("worker's copy (make_copy)", lambda s: ms(med(s.copy))),
        ("  baseline: cp -r of the same files", lambda s: ms(med(s.cp))),
        ("  make_copy / cp -r", lambda s: f"{med(s.copy) / med(s.cp):.2f}x"),
        (f"patch of {EDITED} edited files (change_of)", lambda s: ms(med(s.patch))),
        ("verifier's copy, patch applied", lambda s: ms(med(s.verifier_copy))),
        ("merge into the working directory", lambda s: ms(med(s.merge))),
        ("remove both copies", lambda s: ms(med(s.remove))),
        (
            "per agent: copy + patch + merge",
            lambda s: ms(med(s.copy) + med(s.patch) + med(s.merge)),
        ),
        (
            "  with the verifier's copy, removals",
            lambda s: ms(
                med(s.copy) + med(s.patch) + med(s.merge) + med(s.verifier_copy) + med(s.remove)
            ),
        ),
    ]
    print(f"  {'median per step':<40}" + "".join(f"{f'{n:,} files':>15}" for n in sizes))
    for label, cell in rows:
        print(f"  {label:<40}" + "".join(f"{cell(results[n]):>15}" for n in sizes))
    spread = "; ".join(
        f"{n:,}: make_copy {ms(min(s.copy))}-{ms(max(s.copy))}, cp -r {ms(min(s.cp))}-"
        f"{ms(max(s.cp))}"
        for n, s in results.items()
    )
    print(f"  (min-max: {spread})")


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
    """One turn: its wall time, and where it went (seconds from the turn's start)."""

    isolation: str
    turn: float
    #: the scout's and the Workflow call's requests, and the snapshot
    before: float
    fanout: float
    #: from the fan-out's end to the last change settled (merged or kept)
    merging: float
    fates: list[str]
    requests: int


@dataclass
class Tally:
    """When the fan-out started and ended, and when each change settled."""

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


async def one_turn(
    url: str, workdir: Path, store_path: Path, isolation: Isolation
) -> tuple[float, Tally, int]:
    settings = Settings(
        base_url=url,
        workdir=workdir,
        max_retries=0,
        max_concurrent=CONCURRENT,
        max_subtasks=SUBTASKS,
        max_subagents=2 * SUBTASKS + 10,
        isolation=isolation,
        merge="verified",
    )
    events = EventBus()
    tally = Tally()
    events.subscribe(tally)
    store = SQLiteStore.open(store_path)
    gateway = ModelGateway(settings, Credentials(api_key=KEY), events)
    session = Session(settings, gateway, workdir=workdir, store=store, events=events)
    try:
        tally.started = started = time.perf_counter()
        result = await asyncio.wait_for(session.turn("Fan out the edits."), TURN_DEADLINE)
        wall = time.perf_counter() - started
    finally:
        await session.close()
        await gateway.close()
        await store.close()
    if result.error is not None:
        raise SystemExit(f"{isolation}: the turn failed: {result.error}")
    return wall, tally, gateway.requests


def makespan(template: Path, names: list[str], isolation: Isolation, where: Path) -> Makespan:
    scenario = OrchestrationScenario(
        subtasks=SUBTASKS, delay=DELAY, scout_command="ls", worker_command=edit_command(names)
    )
    server = ScriptedServer(scenario, api_key=KEY)
    where.mkdir()
    workdir = where / "repo"
    clone(template, workdir)
    with server.in_thread():
        wall, tally, requests = asyncio.run(
            one_turn(server.url, workdir, where / "store.db", isolation)
        )
    for i, name in enumerate(names[:SUBTASKS], start=1):
        if f"# edited by worker {i}\n" not in (workdir / name).read_text():
            raise SystemExit(f"{isolation}: worker {i}'s edit is not in the working directory")
    shutil.rmtree(where, ignore_errors=True)
    if tally.fanout_started is None or tally.fanout_done is None:
        raise SystemExit(f"{isolation}: the turn made no fan-out")
    last = max(tally.settled, default=tally.fanout_done)
    return Makespan(
        isolation,
        wall,
        tally.fanout_started - tally.started,
        tally.fanout_done - tally.fanout_started,
        last - tally.fanout_done,
        tally.fates,
        requests,
    )


def makespan_header() -> None:
    print(
        f"  {'files':>6}  {'isolation':<9} {'turn s':>7} {'/ bound':>7} {'before':>7} "
        f"{'fan-out':>7} {'merging':>7} {'after':>6}  runs (turn s)"
    )


def report_makespans(files: int, runs: dict[str, list[Makespan]]) -> float:
    """A row per isolation (medians of the runs); the ratio worktree / shared."""
    ideal = SERIAL_REQUESTS * DELAY
    medians: dict[str, float] = {}
    for isolation, spans in runs.items():

        def med(values: list[float]) -> float:
            return statistics.median(values)

        turn = med([s.turn for s in spans])
        before = med([s.before for s in spans])
        fanout = med([s.fanout for s in spans])
        merging = med([s.merging for s in spans])
        after = med([s.turn - s.before - s.fanout - s.merging for s in spans])
        medians[isolation] = turn
        print(
            f"  {files:>6,}  {isolation:<9} {turn:7.3f} {turn / ideal:6.3f}x {before:7.3f} "
            f"{fanout:7.3f} {merging:7.3f} {after:6.3f}  "
            f"{', '.join(f'{s.turn:.3f}' for s in spans)}"
        )
    for isolation, spans in runs.items():
        fates = Counter(f for s in spans for f in s.fates)
        expected = SUBTASKS * len(spans) if isolation == "worktree" else 0
        if fates.get("merged", 0) != expected or any(
            s.requests != spans[0].requests for s in spans
        ):
            print(f"  WARNING: {isolation}: changes {dict(fates)}, expected {expected} merged")
    return medians["worktree"] / medians["shared"]


def report_ratios(ratios: dict[int, float]) -> None:
    for files, ratio in ratios.items():
        verdict = "met" if ratio <= TARGET else "MISSED"
        print(
            f"  {files:,} files: makespan worktree / shared {ratio:.3f}x  "
            f"(target <= {TARGET:.2f}x) {verdict}"
        )


# ----------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="files")
    parser.add_argument("--repeats", type=int, default=5, help="part 1: times each step runs")
    parser.add_argument("--runs", type=int, default=2, help="part 2: turns per isolation")
    parser.add_argument("--parts", default="1,2", help="which parts to run")
    parser.add_argument(
        "--tmp", default=None, help="where the repositories go (default: the system's temp dir)"
    )
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        parts = {int(p) for p in args.parts.split(",") if p.strip()}
    except ValueError:
        parser.error("--sizes and --parts are comma-separated numbers")
    if parts - set(PARTS) or not parts:
        parser.error("--parts is a comma-separated list of 1 and 2")
    if any(s < SUBTASKS + EDITED * args.repeats + UNCOMMITTED + 3 for s in sizes):
        parser.error("a repository needs more files than the edits take")
    if args.repeats < 1 or args.runs < 1:
        parser.error("--repeats and --runs must be >= 1")
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
            print(f"1. per agent, the git steps of worktree isolation ({args.repeats} times each; "
                  f"{load()})", flush=True)  # fmt: skip
            results: dict[int, Steps] = {}
            for files in sizes:
                template, names = templates[files]
                workdir = root / f"steps-{files}" / "repo"
                workdir.parent.mkdir()
                clone(template, workdir)
                results[files] = asyncio.run(git_steps(workdir, names, args.repeats))
                shutil.rmtree(workdir.parent, ignore_errors=True)
            report_steps(results)
        if 2 in parts:
            print(
                f"2. fan-out makespan: {SUBTASKS} subtasks, {CONCURRENT} in flight, {DELAY:g} s "
                f"per model request, each worker edits one file, bubblewrap sandbox, merge = "
                f"verified; median of {args.runs} turns each ({load()})",
                flush=True,
            )
            makespan_header()
            ratios: dict[int, float] = {}
            for files in sizes:
                template, names = templates[files]
                runs: dict[str, list[Makespan]] = {"shared": [], "worktree": []}
                for n in range(args.runs):
                    for isolation in ISOLATIONS:
                        where = root / f"turn-{files}-{isolation}-{n}"
                        runs[isolation].append(makespan(template, names, isolation, where))
                ratios[files] = report_makespans(files, runs)
            report_ratios(ratios)
    print(f"({time.perf_counter() - began:.1f} s in all)")


if __name__ == "__main__":
    main()
