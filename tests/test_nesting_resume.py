"""A tree of agents killed with SIGKILL at random moments and resumed each time: every agent
finished before a kill, at any depth, is taken from the journal; no parent plans again; and
under ``worktree`` isolation every change reaches the working directory once."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from nested_runs import (
    IN_COPIES,
    journal_rows,
    leaf_file,
    plans_per_parent,
    tree_scenario,
    tree_size,
    written_ledger,
)
from orchmode.testing import ScriptedServer
from recorded_runs import kill_run_when, orchmode

#: A short lease, so a killed run's claims lapse quickly for the resume.
LEASE = ("--claim-lease", "2")
SEED = 35


def finished(journal: Path) -> set[str]:
    """The prompts of every agent whose result is recorded, workers and verifiers."""
    return set(journal_rows(journal, "worker")) | set(journal_rows(journal, "verifier"))


def asked_again(server: ScriptedServer, since: int, done: set[str]) -> list[str]:
    """Agents of ``done`` that a model was asked to start again since request ``since``."""
    firsts = [
        e.body["messages"][0]["content"]
        for e in server.log[since:]
        if e.path == "/v1/messages" and len(e.body["messages"]) == 1
    ]
    return [prompt for prompt in firsts if prompt in done]


@pytest.mark.slow
def test_a_tree_killed_five_times_resumes_without_running_a_finished_agent_again(
    scripted: Callable[..., ScriptedServer], tmp_path: Path
) -> None:
    server = scripted(tree_scenario(5, "5x5", delay=0.01, **IN_COPIES))
    journal = tmp_path / ".orchmode" / "journal.db"
    flags = ("--base-url", server.url, "--max-depth", "3", *LEASE)
    moments = sorted(random.Random(SEED).sample(range(5, 150), 5))
    command, prompt = "run", ("review this",)
    for moment in moments:
        done, since = finished(journal), len(server.log)
        kill_run_when(
            lambda m=moment: len(journal_rows(journal, "worker")) >= m,
            *prompt,
            *flags,
            cwd=tmp_path,
            command=command,
        )
        assert not asked_again(server, since, done)
        command, prompt = "resume", ()
    done, since = finished(journal), len(server.log)
    result = orchmode("resume", *flags, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert not asked_again(server, since, done)
    workers = journal_rows(journal, "worker")
    assert len(workers) == len(set(workers)) == tree_size(5, "5x5")
    # every parent's children come from the one plan it made, whatever was killed when
    plans = plans_per_parent(workers)
    assert len(plans) == 30 and all(len(made) == 1 for made in plans.values())
    # each leaf's change went into its parent's workspace, and the working directory got
    # each top worker's change once, whatever the kills interrupted
    written = {p.name: p.read_text() for p in tmp_path.glob("leaf-*")}
    assert set(written) == {leaf_file(p) for p in workers if "fan out" not in p}
    assert set(written.values()) == {"written\n"}
    assert sorted(written_ledger(journal)) == [f"change {i} of call 1 written" for i in range(1, 6)]
