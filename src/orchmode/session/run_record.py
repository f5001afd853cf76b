"""What a session was started for, saved with its state so a resume can finish it."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ..core.errors import OrchmodeError
from ..core.knobs import BatchMode
from ..core.settings import Settings


class RunRecord(BaseModel):
    """What a session was started for, saved with its state: ``orchmode run``'s task, and
    how far the run got (1: the task's turn, 2: the summary's, ``"done"``), and its batch
    mode, which a resume keeps."""

    model_config = ConfigDict(frozen=True)

    command: Literal["run"] = "run"
    task: str
    phase: Literal[1, 2, "done"] = 1
    batch: BatchMode = "off"

    @field_validator("batch", mode="before")
    @classmethod
    def _known_mode(cls, value: Any) -> Any:
        """A mode this version does not know is read as ``off``: the run still resumes, at
        the interactive price, rather than not at all."""
        return value if value in get_args(BatchMode) else "off"

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

    def settings_for_resume(self, settings: Settings) -> Settings:
        """``settings`` with the run's batch mode, unless they set ``batch`` themselves (a
        ``--batch`` flag, ``ORCHMODE_BATCH``, a TOML key or ``Settings(batch=...)``): the
        requests a resume asks again are the ones the run meant to batch."""
        if "batch" in settings.model_fields_set or settings.batch == self.batch:
            return settings
        return settings.model_copy(update={"batch": self.batch})


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])
