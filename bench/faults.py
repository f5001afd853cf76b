"""Does a run survive ``kill -9`` at any moment? Kills at random moments, each resumed.

The scenario is the fault suite's (``tests/support/kills.py``): ``orchmode run`` of a
worktree fan-out over a git repository of about 2,300 files, against the scripted server,
whose six workers rewrite 600 files, delete a package, move a directory and change modes,
add files and a binary one, and edit one file; three append to one changelog (two
conflicts, each resolved by a resolver and verified again); one change is refuted. It runs
once uninterrupted, for the reference. Then ``--kills`` times, on a fresh copy of the
repository: the run is SIGKILLed at a moment drawn at random (``--seed``): an observable
point of the run (a request the server received, a row in the journal, a file of a change
appearing or vanishing as it is merged into the working directory) plus a random offset
of up to ``--max-offset`` ms; then ``orchmode resume`` runs once, and the directory is
checked against the reference.

Printed: one line per kill, then kills tried, runs survived (the resume finished and the
directory is the reference's byte for byte, modes and the set of paths too; the
repository's HEAD, index, refs and config untouched; no workspace, temporary file or
process left), changes applied exactly once (each changelog line once, every file of each
change there whole, the refuted one nowhere), the moments hit by phase (where the run was
when it was killed, read from the server's log; ``merge`` covers resolvers and writing,
and a kill that found a change written in part counts as mid-write), and the time.

    .venv/bin/python bench/faults.py [--kills 20] [--seed N] [--lanes 2] [--max-offset 50]
        [--tmp DIR]

``--lanes`` runs that many kills at once, each lane with a scripted server of its own.
Kills cost what creating files costs where the repositories are: ``--tmp /dev/shm`` puts
them on a tmpfs (kill -9 loses nothing a tmpfs keeps: the page cache outlives a process).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from support.kill_scenario import make_repo, repo_files
from support.kills import (
    PHASES,
    choose_moments,
    reference_run,
    run_kills,
    table,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="kills to try")
    parser.add_argument("--seed", type=int, default=None, help="picks the moments (random)")
    parser.add_argument("--lanes", type=int, default=2, help="kills run at once")
    parser.add_argument(
        "--max-offset", type=float, default=50, help="ms after a point a kill may come"
    )
    parser.add_argument("--tmp", default=None, help="where the repositories go")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1_000_000)
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="orchmode-faults-", dir=args.tmp))
    try:
        print(f"seed {seed}; {len(repo_files()):,} files in the repository; in {root}")
        reference = reference_run(make_repo(root / "start"), root / "uninterrupted")
        print(f"uninterrupted run: {reference.elapsed:.1f} s")
        moments = choose_moments(seed, args.kills, args.max_offset / 1000)
        outcomes = run_kills(moments, reference, root, lanes=args.lanes)
        print(table(outcomes))
        tried = sum(1 for o in outcomes if o.killed.killed)
        survived = sum(1 for o in outcomes if o.survived)
        once = sum(1 for o in outcomes if o.once)
        phases = Counter(o.killed.phase for o in outcomes if o.killed.killed)
        mid = sum(1 for o in outcomes if o.killed.mid_write)
        print()
        print(f"kills tried               {tried} (of {len(outcomes)} moments)")
        print(f"runs survived             {survived} of {tried}")
        print(f"changes applied once      {once} of {tried}")
        hit = ", ".join(f"{p} {phases.get(p, 0)}" for p in PHASES)
        print(f"moments hit by phase      {hit} (of the merges, {mid} mid-write)")
        resumes = [o.resumed.elapsed for o in outcomes if o.resumed is not None]
        if resumes:
            print(f"resume                    {sum(resumes) / len(resumes):.1f} s on average")
        print(f"time                      {time.monotonic() - started:.0f} s")
        failed = [o for o in outcomes if not o.survived]
        if failed:
            print(f"kept for a look: {', '.join(f'kill-{o.number:02d}' for o in failed)}")
    finally:
        if not any(root.glob("kill-*")):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
