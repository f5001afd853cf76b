"""The orchestration-mode notice state machine: which system notices go out with a user turn.

Pure: no I/O and no text. A notice is never sent on its own; it rides on the next user
turn, placed directly after it (see ``SPEC.md`` section 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Notice(StrEnum):
    ENTER = "enter"
    REFRESH = "refresh"
    EXIT = "exit"


@dataclass
class ModeState:
    """Whether the mode is on, and what the model has been told about it."""

    mode_on: bool = True
    refresh_every: int = 10
    announced: bool = False
    exit_pending: bool = False
    turns_since_refresh: int = 0

    def set_mode(self, on: bool) -> None:
        if on == self.mode_on:
            return
        self.mode_on = on
        if on:
            self.exit_pending = False
        elif self.announced:
            self.exit_pending = True

    def user_turn(self) -> list[Notice]:
        """Notices due on this user turn, in order; counts the turn."""
        due: list[Notice] = []
        if self.exit_pending:
            due.append(Notice.EXIT)
            self.exit_pending = False
            self.announced = False
        if self.mode_on and not self.announced:
            due.append(Notice.ENTER)
            self.announced = True
            self.turns_since_refresh = 0
        elif self.mode_on and self.turns_since_refresh >= self.refresh_every:
            due.append(Notice.REFRESH)
            self.turns_since_refresh = 0
        self.turns_since_refresh += 1
        return due

    def snapshot(self) -> dict[str, object]:
        """A plain dict, for run records and resuming a session."""
        return {
            "mode_on": self.mode_on,
            "refresh_every": self.refresh_every,
            "announced": self.announced,
            "exit_pending": self.exit_pending,
            "turns_since_refresh": self.turns_since_refresh,
        }
