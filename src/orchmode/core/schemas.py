"""Typed results: a JSON Schema for a subtask's report, checked, offered to the agent and enforced.

With a schema, report_findings takes a required ``data`` property of that schema. The schema
is checked before anything runs (:func:`check_schema`), so a bad one is an error result rather
than a run of agents that can never report; each report is validated (:func:`validate_data`),
and an invalid one goes back to the agent naming every violation by path, for at most
:data:`MAX_REPORT_ATTEMPTS` tries (:class:`ReportAttempts`).

No ``$ref`` is ever fetched: schemas come from the model, and following a reference out to
the network or the disk would let a prompt reach places the sandbox keeps it from. Every
reference must resolve inside the schema itself (or to a JSON Schema meta-schema, which
jsonschema ships); :func:`check_schema` says so when one does not.

``format`` stays an annotation, as the 2020-12 specification has it by default: whether it
were checked would otherwise depend on which optional packages happen to be installed.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import referencing.jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from jsonschema_specifications import REGISTRY as META_SCHEMAS
from referencing import Registry, Resource, Specification
from referencing.exceptions import Unresolvable

from .prompts import REPORT_FINDINGS_TOOL
from .results import Report, TypedReport, check_report
from .wire import JsonSchema, ToolSchema

#: How many report_findings calls a typed subtask gets: after this many invalid ones it fails.
MAX_REPORT_ATTEMPTS = 3
#: The largest schema taken, as UTF-8 JSON: it goes into every agent's tool list.
MAX_SCHEMA_BYTES = 64 * 1024
#: The most violations listed for one report; the rest are counted.
MAX_VIOLATIONS = 20
#: The longest one violation's message (jsonschema's quote the whole offending value).
MAX_MESSAGE_CHARS = 300

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_REF_KEYWORDS = ("$ref", "$dynamicRef")


def check_schema(schema: object) -> str | None:
    """None if ``schema`` is a JSON Schema orchmode can use, else one line saying what is wrong.

    Checked here, before any agent runs: a JSON object, at most 64 KB of JSON, valid against
    its draft's meta-schema (2020-12 unless ``$schema`` names another), and every ``$ref``
    resolvable within the schema, since none is ever fetched.
    """
    if not isinstance(schema, dict):
        return f"the schema must be a JSON object, not {_json_type(schema)}"
    try:
        size = len(json.dumps(schema, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        return f"the schema is not JSON: {exc}"
    except RecursionError:
        return "the schema is nested too deeply"
    if size > MAX_SCHEMA_BYTES:
        return (
            f"the schema is {size // 1024} KB of JSON, over the {MAX_SCHEMA_BYTES // 1024} KB "
            "limit: make it smaller"
        )
    dialect = schema.get("$schema")
    if dialect is not None and (
        not isinstance(dialect, str) or validator_for(schema, default=None) is None
    ):
        return (
            f"the schema's $schema {json.dumps(dialect)} is not a JSON Schema draft jsonschema "
            "knows: name one of its drafts, or leave $schema out for 2020-12"
        )
    cls = validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        return f"the schema is invalid at {_schema_path(exc.path)}: {_clip(exc.message)}"
    except RecursionError:
        return "the schema is nested too deeply"
    return _unresolved_reference(schema, cls) or _endless_loop(schema, cls)


def report_tool(schema: JsonSchema | None) -> ToolSchema:
    """The report_findings tool for an agent: the shared one, or with ``data`` of ``schema``.

    ``schema`` goes in as the ``data`` property; its ``#`` pointers are rewritten to point
    under ``/properties/data``, where it now sits, so a ``$ref`` to its ``$defs`` still
    lands on them. The shared constant is never changed.
    """
    if schema is None:
        return REPORT_FINDINGS_TOOL
    tool = copy.deepcopy(REPORT_FINDINGS_TOOL)
    tool["description"] += (
        " Put the subtask's result in `data` too: it must follow the schema of the data "
        "property exactly."
    )
    tool["input_schema"]["properties"]["data"] = _embedded(schema)
    tool["input_schema"]["required"] = [*tool["input_schema"]["required"], "data"]
    return tool


def typed_tools(tools: list[ToolSchema], schema: JsonSchema | None) -> list[ToolSchema]:
    """``tools`` with report_findings taking ``data`` of ``schema``; ``tools`` itself without."""
    if schema is None:
        return tools
    typed = report_tool(schema)
    return [typed if t.get("name") == typed["name"] else t for t in tools]


def validate_data(schema: JsonSchema, data: object) -> list[str]:
    """Each way ``data`` breaks ``schema``, as ``"<path>: <message>"``; empty when it fits.

    Paths read as the agent wrote the data (``data.items[2].score``); the list is sorted by
    path, then message, so the same report always gets the same answer, and at most
    :data:`MAX_VIOLATIONS` are listed, then ``"… and N more"``. ``schema`` must have passed
    :func:`check_schema`.
    """
    cls = validator_for(schema, default=Draft202012Validator)
    validator = cls(schema, registry=Registry())  # no retrieval: nothing is fetched
    try:
        errors = list(validator.iter_errors(data))
    except RecursionError:
        return ["data: too deeply nested to check (or the schema's $refs loop without end)"]
    except Unresolvable as exc:  # only if check_schema was skipped
        return [f"data: the schema's reference cannot be resolved ({exc})"]
    errors.sort(key=lambda e: (_sort_key(e.absolute_path), e.message))
    violations = [f"{_data_path(e.absolute_path)}: {_clip(e.message)}" for e in errors]
    if len(violations) > MAX_VIOLATIONS:
        rest = len(violations) - MAX_VIOLATIONS
        violations = [*violations[:MAX_VIOLATIONS], f"… and {rest} more"]
    return violations


def _asking_again(problems: list[str], schema: JsonSchema | None) -> str:
    """The error tool result for an invalid report: each problem, and what to send instead."""
    listed = "\n".join(f"- {p}" for p in problems)
    asked = ", and data following the schema of the data property" if schema is not None else ""
    return (
        f"error: report_findings input is invalid:\n{listed}\nCall report_findings again "
        f"with every problem above fixed: a summary string, a findings list of {{claim, "
        f"evidence, severity}}{asked}."
    )


def _judge(tool_input: object, schema: JsonSchema | None) -> TypedReport | list[str]:
    """The report, or every problem with it as ``"<path>: <message>"``."""
    checked = check_report(tool_input)
    problems = [] if isinstance(checked, Report) else list(checked)
    data = None
    if schema is not None:
        if isinstance(tool_input, Mapping) and "data" in tool_input:
            data = tool_input["data"]
            problems += validate_data(schema, data)
        else:
            problems.append("data: Field required (a value following the data schema)")
    if problems or not isinstance(checked, Report):
        return problems
    return TypedReport(summary=checked.summary, findings=checked.findings, data=data)


@dataclass(frozen=True)
class Rejected:
    """An invalid report: the text to answer it with, and whether that ends the subtask.

    While ``final`` is false, ``message`` is the error tool result for the agent; once it is
    true, ``message`` is the subtask's failure, and the agent is not asked again.
    """

    message: str
    final: bool


class ReportAttempts:
    """Counts one agent's report_findings calls against :data:`MAX_REPORT_ATTEMPTS`.

    The rule: every report_findings call is an attempt; a valid one ends the subtask; an
    invalid one is answered with its problems and the attempts left, and the last allowed
    invalid one fails the subtask, naming the problems it still had.
    """

    def __init__(self, schema: JsonSchema | None, limit: int = MAX_REPORT_ATTEMPTS) -> None:
        self.schema = schema
        self.limit = limit
        self.used = 0

    def take(self, tool_input: object) -> TypedReport | Rejected:
        """Judge one report_findings call: the report, or how to answer it."""
        self.used += 1
        report = _judge(tool_input, self.schema)
        if isinstance(report, TypedReport):
            return report
        left = self.limit - self.used
        if left > 0:
            tries = "1 attempt" if left == 1 else f"{left} attempts"
            message = _asking_again(report, self.schema)
            return Rejected(f"{message}\n({tries} left.)", final=False)
        problems = "\n".join(f"- {p}" for p in report)
        return Rejected(
            f"error: the subagent's report was still invalid after {self.limit} attempts:\n"
            f"{problems}",
            final=True,
        )


def _unresolved_reference(schema: JsonSchema, cls: Any) -> str | None:
    """The first ``$ref`` that does not resolve within the schema, as an error, else None."""
    registry: Registry[Any] = META_SCHEMAS.combine(Registry())  # no retrieval
    resource = _specification(cls).create_resource(schema)
    resolver = registry.resolver_with_root(resource)
    pending = [(resolver, resource)]
    while pending:
        resolver, resource = pending.pop()
        contents = resource.contents
        if isinstance(contents, dict):
            for keyword in _REF_KEYWORDS:
                ref = contents.get(keyword)
                if isinstance(ref, str):
                    try:
                        resolver.lookup(ref)
                    except Unresolvable:
                        return (
                            f"the schema's {keyword} {json.dumps(ref)} does not resolve within "
                            "the schema: references are never fetched, so put what it names "
                            "in the schema's $defs and point to it as #/$defs/<name>"
                        )
        pending.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())
    return None


def _endless_loop(schema: JsonSchema, cls: Any) -> str | None:
    """An error if checking even the simplest values never ends (``{"$ref": "#"}``), else None."""
    validator = cls(schema, registry=Registry())
    probes: tuple[object, ...] = (None, {}, [])
    for probe in probes:
        try:
            for _ in validator.iter_errors(probe):
                pass
        except RecursionError:
            return "the schema's $refs loop without end: each must lead to a schema that checks"
    return None


def _specification(cls: Any) -> Specification[Any]:
    """The referencing specification of a jsonschema validator class (how it finds ids)."""
    return referencing.jsonschema.specification_with(
        cls.ID_OF(cls.META_SCHEMA) or "urn:unknown-dialect", default=Specification.OPAQUE
    )


def _embedded(schema: JsonSchema) -> JsonSchema:
    """A copy of ``schema`` whose own ``#`` pointers point under ``#/properties/data``."""
    embedded = copy.deepcopy(schema)
    cls = validator_for(embedded, default=Draft202012Validator)
    root = _specification(cls).create_resource(embedded)
    if root.id() is not None:  # its pointers resolve against its own $id: leave them be
        return embedded
    pending: list[Resource[Any]] = [root]
    while pending:
        resource = pending.pop()
        contents = resource.contents
        if isinstance(contents, dict):
            for keyword in _REF_KEYWORDS:
                ref = contents.get(keyword)
                if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                    contents[keyword] = "#/properties/data" + ref[1:]
        # A subschema with an $id of its own is a resource of its own: its pointers are its.
        pending.extend(sub for sub in resource.subresources() if sub.id() is None)
    return embedded


def _data_path(path: Iterable[object]) -> str:
    """``data.items[2].score``: a path into the report's data as it would be written."""
    out = "data"
    for key in path:
        if isinstance(key, int):
            out += f"[{key}]"
        elif isinstance(key, str) and _IDENTIFIER.match(key):
            out += f".{key}"
        else:
            out += f"[{json.dumps(key, ensure_ascii=False)}]"
    return out


def _schema_path(path: Sequence[object]) -> str:
    """A place in the schema, as a JSON pointer (``/properties/x/type``), or "its root"."""
    if not path:
        return "its root"
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _sort_key(path: Iterable[object]) -> list[tuple[int, int, str]]:
    """Sorts paths so that ``[2]`` comes before ``[10]`` and keys sort as text."""
    return [(0, k, "") if isinstance(k, int) else (1, 0, str(k)) for k in path]


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 1] + "…"


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "null" if value is None else type(value).__name__
