"""The fault suite: a worktree fan-out killed with SIGKILL at random moments, then resumed.

Real processes, real git, the real sandbox and real HTTP to the scripted model. The
scenario (``tests/support/kills.py``) is a repository of about 2,300 files whose workers
rewrite 600 of them, delete a package, move a directory and change modes, add files and a
binary one; three of them append to one changelog, so two conflicts go to resolvers; one
change is refuted. After each kill, ``orchmode resume`` must finish the run with the working
directory byte for byte the uninterrupted run's, every change applied once and whole, the
repository's own state untouched, and nothing left behind.

``ORCHMODE_FAULTS_SEED`` picks the moments (a random seed otherwise, printed on failure);
``ORCHMODE_FAULTS_KILLS`` how many (20).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from orchmode.shell.bwrap import probe
from support.kill_scenario import make_repo
from support.kills import (
    TRIGGERS,
    Reference,
    choose_moments,
    reference_run,
    run_kills,
    table,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The starting repository and what an uninterrupted run makes of it (once)."""
    problem = probe().problem
    if problem is not None:
        pytest.fail(problem)
    root = tmp_path_factory.mktemp("faults")
    return reference_run(make_repo(root / "start"), root / "uninterrupted")


def seed() -> int:
    given = os.environ.get("ORCHMODE_FAULTS_SEED")
    return int(given) if given else random.SystemRandom().randrange(1_000_000)


def test_a_run_killed_at_random_moments_resumes_to_what_an_uninterrupted_run_makes(
    reference: Reference, tmp_path: Path
) -> None:
    """20 kills at distinct moments chosen at random (every observable point of the run
    once, then random ones, each plus a random few ms): after each, ``orchmode resume``
    ends with the directory as the uninterrupted run left it, each change there exactly
    once, and nothing left behind."""
    chosen = seed()
    count = int(os.environ.get("ORCHMODE_FAULTS_KILLS", "20"))
    moments = choose_moments(chosen, count)
    assert len(set(moments)) == count
    outcomes = run_kills(moments, reference, tmp_path)
    report = f"seed {chosen} (ORCHMODE_FAULTS_SEED={chosen} repeats it)\n{table(outcomes)}"
    print(report)
    assert all(o.killed.killed for o in outcomes), report  # every moment came before the end
    assert all(o.survived for o in outcomes), report
    assert all(o.once for o in outcomes), report
    if count >= len(TRIGGERS):
        hit = {o.killed.phase for o in outcomes}
        assert {"planning", "fan-out", "merge", "synthesis"} <= hit, report
