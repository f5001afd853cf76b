"""Which recorded session to resume, and whether it can be: read from the store, changing nothing.

A session is *interrupted* when its last turn started and never ended (a killed process,
a closed laptop, Ctrl-C). Every refusal here is one line that says what is wrong and what
to do, raised before anything runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import OrchmodeError
from ..core.wire import MESSAGE, blocks_of
from ..records.history import read_session
from ..store import Store
from .run_record import RunRecord

#: Recorded sessions looked through for the latest interrupted one, newest first.
LOOK_BACK = 50


class CannotResume(OrchmodeError):
    """The session asked for cannot be resumed (unknown, finished, elsewhere, unreadable)."""


@dataclass(frozen=True)
class Interrupted:
    id: str
    workdir: str
    #: the run it was started for, and how far that got (None: a chat)
    run: RunRecord | None

    @property
    def command(self) -> str:
        return f"orchmode resume {self.id}"


async def interrupted(store: Store, session: str, task: str | None = None) -> Interrupted | None:
    """The session if its last turn never ended (and it ran ``task``, if given), else None.

    The task is checked first, from the saved state: reading and parsing a session's
    events is the dear part, and ``orchmode run`` looks before every start.
    """
    record = await store.load_session(session)
    if record is None:
        return None
    run = run_of_state(record.state)
    if task is not None and (run is None or run.task != task):
        return None
    history = read_session(await store.events(session), session=session)
    cut_off = bool(history.turns) and history.turns[-1].status == "interrupted"
    # A run stopped between its two turns never started its summary turn.
    unfinished_run = run is not None and run.phase != "done"
    if not (cut_off or unfinished_run):
        return None
    return Interrupted(session, record.workdir, run)


async def latest_interrupted(
    store: Store, workdir: Path, task: str | None = None
) -> Interrupted | None:
    """The newest interrupted session that ran in ``workdir`` (on ``task``, if given)."""
    here = _same_dir(workdir)
    for info in (await store.sessions())[:LOOK_BACK]:
        if _same_dir(Path(info.workdir)) != here:
            continue
        found = await interrupted(store, info.id, task)
        if found is not None:
            return found
    return None


async def choose(store: Store, workdir: Path, wanted: str | None) -> Interrupted:
    """The session ``orchmode resume [SESSION]`` continues, or why none can be."""
    if wanted is None:
        found = await latest_interrupted(store, workdir)
        if found is None:
            raise CannotResume(
                f"no interrupted session ran in {workdir} — `orchmode runs` lists the recorded "
                "ones; `orchmode resume SESSION` names one"
            )
        return found
    record = await store.load_session(wanted)
    if record is None:
        raise CannotResume(
            f"there is no session {wanted!r} in {store.location} — `orchmode runs` lists "
            "the recorded ones"
        )
    if _same_dir(Path(record.workdir)) != _same_dir(workdir):
        raise CannotResume(
            f"session {wanted!r} ran in {record.workdir}, not in {workdir} — run `orchmode "
            f"resume {wanted}` there, or pass --workdir {record.workdir}"
        )
    found = await interrupted(store, wanted)
    if found is None:
        raise CannotResume(
            f"session {wanted!r} was not interrupted: its last turn ended — continue the "
            f"conversation with `orchmode chat --session {wanted}`"
        )
    return found


def pending_calls(messages: list[str]) -> list[str]:
    """The tool calls the last checkpointed step left without results, described briefly."""
    if not messages:
        return []
    try:
        last = MESSAGE.validate_json(messages[-1])
    except ValueError:
        return []
    if last["role"] != "assistant":
        return []
    described = []
    for block in blocks_of(last["content"], "tool_use"):
        name, tool_input = block["name"], block["input"]
        if name == "bash":
            described.append(f"bash `{str(tool_input.get('command', '(restart)'))[:80]}`")
        elif name == "Workflow" and isinstance(tool_input.get("subtasks"), list):
            described.append(f"Workflow ({len(tool_input['subtasks'])} subtasks)")
        elif name == "Workflow":
            described.append("Workflow (a script)")
        else:
            described.append(name)
    return described


def run_of_state(state: str) -> RunRecord | None:
    """The run record in a saved state; None for a chat's, or one that cannot be read."""
    try:
        value = json.loads(state)
        return RunRecord.read(value.get("meta") if isinstance(value, dict) else None)
    except (ValueError, OrchmodeError):
        return None  # the session's own restore says what is wrong with it


def _same_dir(path: Path) -> str:
    return os.path.realpath(path)
