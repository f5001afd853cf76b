"""Trees of agents for the nesting tests and the benchmark: a scripted model whose workers
fan out as their subtasks ask, and leaves that each write a file of their own."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from orchmode.testing.scenario import OrchestrationScenario


def leaf_file(subtask: str) -> str:
    """The file a leaf writes: named for where it is in the tree (``leaf-1.3.2``)."""
    return "leaf-" + subtask.split(" (plan", 1)[0].split(":", 1)[0].split()[-1]


def leaf_command(subtask: str) -> str | None:
    """A leaf appends a line to its own file; a worker that fans out runs nothing itself."""
    if "fan out" in subtask:
        return None
    return f"echo written >> {leaf_file(subtask)}"


def tree_scenario(top: int, shape: str, **kwargs: Any) -> OrchestrationScenario:
    """``top`` subtasks for the main agent, each fanning out as ``shape`` says (``5x5``:
    five workers that each start five leaves); everything in the shared tree."""
    subtasks = [f"Part {i}: fan out into {shape}" for i in range(1, top + 1)]
    kwargs.setdefault("workflow_input", {"isolation": "shared"})
    kwargs.setdefault("nested_input", {"isolation": "shared"})
    return OrchestrationScenario(subtasks=subtasks, worker_command=leaf_command, **kwargs)


def tree_size(top: int, shape: str) -> int:
    """Workers in the tree ``top`` and ``shape`` make: 5 and ``5x5`` make 5 + 25 + 125."""
    total = level = top
    for count in (int(n) for n in shape.split("x")):
        level *= count
        total += level
    return total


def journal_rows(journal: Path, role: str) -> list[str]:
    """The prompts recorded for ``role`` in a SQLite journal (none before it exists)."""
    if not journal.exists():
        return []
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=5)
    try:
        return [r[0] for r in db.execute("SELECT prompt FROM results WHERE role = ?", (role,))]
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        db.close()


_PLAN = re.compile(r"^Part ([\d.]+)\.\d+ \(plan (\d+)\)")


def plans_per_parent(prompts: list[str]) -> dict[str, set[str]]:
    """For each parent (``1.3``), the plans its recorded children came from."""
    plans: dict[str, set[str]] = {}
    for prompt in prompts:
        match = _PLAN.match(prompt)
        if match is not None:
            plans.setdefault(match.group(1), set()).add(match.group(2))
    return plans


#: The Workflow inputs that put every level's workers in copies of their parent's tree.
IN_COPIES: dict[str, Any] = {
    "workflow_input": {"isolation": "worktree"},
    "nested_input": {"isolation": "worktree"},
}


def written_ledger(journal: Path) -> list[str]:
    """The journal's record of each change written into the working directory."""
    return [p for p in journal_rows(journal, "resolver") if p.endswith(" written")]
