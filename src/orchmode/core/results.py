"""What an agent's run comes to: how it ended, its report, and a worker's change.

These types sit at the bottom so that the store, which keeps them, and the loops and the
fan-out, which make and read them, all import them from one place.

A report is declared by :class:`Report` alone: report_findings' schema is generated from it
(:func:`report_input_schema`), the model's input is checked against it, and a recorded
report is read back through it, leniently, by :func:`read_report`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from .events import TokenUsage
from .wire import JsonSchema


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
    BUDGET = "budget"  # stopped part-way: its own budget, or its subtree's, was spent


@dataclass(frozen=True)
class AgentResult:
    text: str
    status: Status
    turns: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    #: A worker's change to its copy of the tree (``worktree`` isolation), else None.
    change: Change | None = None
    #: The journal key it is recorded under, set by the fan-out engine: its report file
    #: is found from it, and a merge names its change by it. Empty for a result no agent
    #: gave, such as a verifier's "not verified"; never stored, never compared.
    key: str = field(default="", compare=False)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


Severity = Literal["high", "medium", "low", "info"]
#: The severities, most severe first: the order a reader wants.
SEVERITIES: tuple[str, ...] = get_args(Severity)

#: The validation context that reads a recorded report: see :func:`read_report`.
_RECORDED = {"recorded": True}


def _recorded(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and info.context.get("recorded") is True


class Finding(BaseModel):
    model_config = ConfigDict(extra="ignore")

    claim: str = Field(min_length=1, description="One sentence.")
    evidence: str = Field(
        min_length=1,
        description="The file and line, or command output, that verified the claim.",
    )
    severity: Severity

    @field_validator("severity", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="wrap")
    @classmethod
    def _as_recorded(
        cls, data: object, handler: ModelWrapValidatorHandler[Finding], info: ValidationInfo
    ) -> Finding:
        """A recorded finding needs only its claim: evidence that is not text reads as "",
        a severity that is not text as info, and one this version does not know is kept as
        written (it sorts after the others)."""
        if not _recorded(info):
            return handler(data)
        if not isinstance(data, dict) or not isinstance(data.get("claim"), str):
            raise ValueError("a recorded finding without a claim")
        evidence, severity = data.get("evidence"), data.get("severity")
        return cls.model_construct(
            claim=data["claim"],
            evidence=evidence if isinstance(evidence, str) else "",
            severity=severity.strip().lower() if isinstance(severity, str) else "info",
        )


class Report(BaseModel):
    """The input of report_findings: the subagent's structured result."""

    model_config = ConfigDict(extra="ignore")

    summary: str = Field(
        min_length=1, description="Two or three sentences: the answer to your subtask."
    )
    findings: list[Finding]

    @model_validator(mode="wrap")
    @classmethod
    def _as_recorded(
        cls, data: object, handler: ModelWrapValidatorHandler[Report], info: ValidationInfo
    ) -> Report:
        """A recorded report (by an older version, or cut short) keeps what can be read:
        a summary or a findings list is enough, and a finding without a claim is left out."""
        if not _recorded(info):
            return handler(data)
        if not isinstance(data, dict):
            raise ValueError("a recorded report is a JSON object")
        summary, items = data.get("summary"), data.get("findings")
        if not isinstance(summary, str) and not isinstance(items, list):
            raise ValueError("a recorded report without a summary or findings")
        findings = []
        for item in items if isinstance(items, list) else []:
            try:
                findings.append(Finding.model_validate(item, context=_RECORDED))
            except ValidationError:
                continue
        fields: dict[str, Any] = {
            "summary": summary if isinstance(summary, str) else "",
            "findings": findings,
        }
        if "data" in data and "data" in cls.model_fields:
            fields["data"] = data["data"]
        return cls.model_construct(**fields)


class TypedReport(Report):
    """A report with its ``data``, which followed the subtask's schema (None without one).

    A :class:`Report` in every other way, so code that takes a report takes this one too.
    """

    data: Any = None


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


def read_report(result: str) -> TypedReport | None:
    """A finished agent's recorded report, as far as it can be read; None for other text
    (an error, a limit's note). Its ``data`` is in ``model_fields_set`` when it had one."""
    try:
        return TypedReport.model_validate(json.loads(result), context=_RECORDED)
    except (ValueError, TypeError, RecursionError):  # ValidationError is a ValueError
        return None


def summary_of(result: str) -> str:
    """What an agent's result says in brief: its report's summary, or the whole text where it
    is not a report (an error, a limit's note, plain text from an older version)."""
    report = read_report(result)
    return report.summary if report is not None and report.summary else result


def severity_rank(severity: str) -> int:
    """Where a severity sorts: most severe first, one this version does not know last."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


class _ToolSchema(GenerateJsonSchema):
    """A model's JSON Schema as a tool's ``input_schema``: no titles and no docstring, which
    name Python classes and would be sent with every request."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        generated = super().model_schema(schema)
        generated.pop("title", None)
        generated.pop("description", None)
        return generated


def report_input_schema() -> JsonSchema:
    """The ``input_schema`` of report_findings, generated from :class:`Report`.

    Each finding's schema is written in place rather than referenced from ``$defs``: a typed
    subtask's own schema goes in beside it, under ``data``, with ``$defs`` of its own.
    """
    generated = Report.model_json_schema(schema_generator=_ToolSchema)
    definitions = generated.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    inlined: JsonSchema = inline(generated)
    return inlined
