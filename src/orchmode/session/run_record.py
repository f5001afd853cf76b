"""What a session was started for, saved with its state so a resume can finish it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..core.errors import OrchmodeError


class RunRecord(BaseModel):
    """What a session was started for, saved with its state: ``orchmode run``'s task, and
    how far the run got (1: the task's turn, 2: the summary's, ``"done"``)."""

    model_config = ConfigDict(frozen=True)

    command: Literal["run"] = "run"
    task: str
    phase: Literal[1, 2, "done"] = 1

    @classmethod
    def read(cls, saved: object) -> RunRecord | None:
        """The record in a saved state's ``meta`` (None for a chat, which has none).

        Raises :class:`OrchmodeError` for a record that is there but cannot be read.
        """
        if saved is None or saved == {}:
            return None
        try:
            return cls.model_validate(saved)
        except ValidationError as exc:
            raise OrchmodeError(f"its run record cannot be read ({_first_error(exc)})") from exc

    def saved(self) -> dict[str, object]:
        return self.model_dump()


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])
