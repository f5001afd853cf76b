"""An agent's full result as its file keeps it: prompt, report, verdict and change."""

from __future__ import annotations

import json
from collections.abc import Callable

from ..core.events import Role
from ..core.results import AgentResult
from ..trees.patches import describe_change


def agent_record(
    role: Role,
    prompt: str,
    result: AgentResult,
    verdict: str | None,
    write_patch: Callable[[str], str],
) -> dict[str, object]:
    """What the agent's result file holds; ``write_patch`` keeps a change's patch apart
    (it may be large) and says where."""
    try:
        report: object = json.loads(result.text)
    except ValueError:
        report = None
    record: dict[str, object] = {
        "role": role,
        "prompt": prompt,
        "status": result.status.value,
        "turns": result.turns,
        "verdict": verdict,
        "report": report if isinstance(report, dict) else None,
        "text": result.text,
    }
    change = result.change
    if change is not None and not change.empty:
        record["change"] = {
            "base": change.base,
            "files": describe_change(change),
            "patch": write_patch(change.patch),
        }
    if change is not None and change.left_out:
        record["left_out"] = list(change.left_out)
    return record
