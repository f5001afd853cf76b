"""What an agent's run comes to: how it ended, its report, and a worker's change.

These types sit at the bottom so that the store, which keeps them, and the loops and the
fan-out, which make and read them, all import them from one place.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .events import TokenUsage


@dataclass(frozen=True)
class Change:
    """A worker's change: a binary git patch against the snapshot it started from.

    What the patch changes is read by :func:`orchmode.trees.patches.summary_of`.
    """

    base: str
    patch: str
    #: The files the agent wrote that were too big for the patch, each with its size and
    #: the limit it passed (``big.bin (3.0 GB, over change_file_max_mb = 100)``).
    left_out: tuple[str, ...] = field(default=(), compare=False)

    @property
    def empty(self) -> bool:
        return not self.patch.strip()

    @property
    def digest(self) -> str:
        """The patch's SHA-256: what tells two changes apart (journal keys, kept copies)."""
        return hashlib.sha256(self.patch.encode(errors="surrogateescape")).hexdigest()


class Status(StrEnum):
    """How a subagent ended. Only ``FINISHED`` results are served from the journal."""

    FINISHED = "finished"
    TURN_LIMIT = "turn_limit"
    MAX_TOKENS = "max_tokens"
    REFUSAL = "refusal"
    CONTEXT_EXCEEDED = "context_exceeded"
    EMPTY = "empty"
    FAILED = "failed"
    SKIPPED = "skipped"  # not run: the session's budget was used up


@dataclass(frozen=True)
class AgentResult:
    text: str
    status: Status
    turns: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    #: A worker's change to its copy of the tree (``worktree`` isolation), else None.
    change: Change | None = None

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


class Finding(BaseModel):
    model_config = ConfigDict(extra="ignore")

    claim: str = Field(min_length=1)
    evidence: str = Field(min_length=1)
    severity: Literal["high", "medium", "low", "info"]

    @field_validator("severity", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


class Report(BaseModel):
    """The input of report_findings: the subagent's structured result."""

    model_config = ConfigDict(extra="ignore")

    summary: str = Field(min_length=1)
    findings: list[Finding]


def parse_report(tool_input: object) -> Report | str:
    """The validated report, or an explanation the model can act on."""
    report = check_report(tool_input)
    if isinstance(report, Report):
        return report
    return (
        f"error: report_findings input is invalid ({'; '.join(report)}). Call report_findings "
        "again with a summary string and a findings list of {claim, evidence, severity}."
    )


def check_report(tool_input: object) -> Report | list[str]:
    """The validated report, or each problem as ``"<path>: <message>"``.

    What :func:`parse_report` and a typed report (:mod:`orchmode.core.schemas`) both check.
    """
    try:
        return Report.model_validate(tool_input)
    except ValidationError as exc:
        return [
            f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors()
        ]
