"""A conversation's saved state: its history, its mode and its run, as one JSON record."""

from __future__ import annotations

from typing import NotRequired

from pydantic import TypeAdapter
from typing_extensions import TypedDict

from ..core.mode import ModeState
from ..core.wire import Message
from .run_record import RunRecord


class SavedState(TypedDict):
    history: list[Message]
    #: :class:`ModeState`'s fields.
    mode: dict[str, object]
    #: The run's record; empty for a chat (and missing from a state saved before runs had one).
    meta: NotRequired[dict[str, object]]


SAVED_STATE: TypeAdapter[SavedState] = TypeAdapter(SavedState)


def state_json(history: list[Message], mode: ModeState, run: RunRecord | None) -> str:
    """The record a session saves at a turn's start and end (UTF-8 JSON)."""
    state: SavedState = {
        "history": history,
        "mode": mode.snapshot(),
        "meta": run.saved() if run is not None else {},
    }
    return SAVED_STATE.dump_json(state).decode()
