"""Typed results: schemas checked before anything runs, data validated by path, nothing fetched."""

from __future__ import annotations

import copy
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.core.prompts import REPORT_FINDINGS_TOOL
from orchmode.core.results import Report, TypedReport, parse_report
from orchmode.core.schemas import (
    MAX_REPORT_ATTEMPTS,
    MAX_SCHEMA_BYTES,
    MAX_VIOLATIONS,
    Rejected,
    ReportAttempts,
    check_schema,
    report_tool,
    validate_data,
)

SCORES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "score": {"type": "number"}},
                "required": ["name", "score"],
            },
        }
    },
    "required": ["items"],
}

WITH_DEFS: dict[str, Any] = {
    "type": "object",
    "properties": {"best": {"$ref": "#/$defs/entry"}, "all": {"$ref": "#/$defs/entries"}},
    "required": ["best"],
    "$defs": {
        "entry": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "entries": {"type": "array", "items": {"$ref": "#/$defs/entry"}},
    },
}


def report(data: object) -> dict[str, Any]:
    return {"summary": "Done.", "findings": [], "data": data}


def first_attempt(tool_input: object, schema: dict[str, Any] | None) -> TypedReport | str:
    """A subagent's first report_findings call: its report, or what the agent is told."""
    taken = ReportAttempts(schema).take(tool_input)
    return taken if isinstance(taken, TypedReport) else taken.message


# --- check_schema -------------------------------------------------------------------------


def test_a_usable_schema_passes() -> None:
    assert check_schema(SCORES) is None
    assert check_schema(WITH_DEFS) is None
    assert check_schema({}) is None


def test_a_bad_type_is_named_with_where_it_is() -> None:
    error = check_schema({"type": "object", "properties": {"x": {"type": "nope"}}})
    assert error is not None
    assert "/properties/x/type" in error and "'nope'" in error


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ([{"type": "string"}], "an array"),
        ("string", "a string"),
        (True, "a boolean"),
        (None, "null"),
    ],
)
def test_a_schema_that_is_not_an_object_is_refused(schema: object, named: str) -> None:
    assert check_schema(schema) == f"the schema must be a JSON object, not {named}"


def test_a_schema_that_is_not_json_is_refused() -> None:
    error = check_schema({"enum": [float("nan")]})
    assert error is not None and error.startswith("the schema is not JSON")
    error = check_schema({"enum": [{1, 2}]})
    assert error is not None and error.startswith("the schema is not JSON")


def test_an_unknown_dialect_is_refused_and_a_known_older_one_is_used() -> None:
    error = check_schema({"$schema": "https://example.com/my-dialect", "type": "string"})
    assert error is not None and "$schema" in error and "my-dialect" in error
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"type": "integer"}},
        "properties": {"x": {"$ref": "#/definitions/n"}},
    }
    assert check_schema(draft7) is None
    assert validate_data(draft7, {"x": "one"}) == ["data.x: 'one' is not of type 'integer'"]
    # Draft 4's boolean exclusiveMaximum is refused under draft 7's meta-schema.
    assert check_schema({**draft7, "exclusiveMaximum": True}) is not None


def test_a_schema_over_the_size_cap_is_refused_and_one_under_it_is_not() -> None:
    def of_size(size: int) -> dict[str, Any]:
        base = {"description": ""}
        pad = size - len(json.dumps(base).encode())
        return {"description": "x" * pad}

    assert len(json.dumps(of_size(MAX_SCHEMA_BYTES)).encode()) == MAX_SCHEMA_BYTES
    assert check_schema(of_size(MAX_SCHEMA_BYTES)) is None
    error = check_schema(of_size(MAX_SCHEMA_BYTES + 1))
    assert error is not None and "64 KB" in error and "limit" in error


@pytest.mark.parametrize(
    "ref",
    ["#/$defs/missing", "other.json", "file:///etc/passwd", "https://example.com/s.json#/a"],
)
def test_a_reference_that_does_not_resolve_within_the_schema_is_refused(ref: str) -> None:
    error = check_schema({"type": "object", "properties": {"x": {"$ref": ref}}})
    assert error is not None
    assert json.dumps(ref) in error and "never fetched" in error


def test_references_inside_the_schema_resolve_including_embedded_ids_and_meta_schemas() -> None:
    embedded = {
        "$id": "https://example.com/root.json",
        "$defs": {"b": {"$id": "b.json", "type": "integer"}},
        "properties": {"x": {"$ref": "b.json"}, "y": {"$ref": "#/$defs/b"}},
    }
    assert check_schema(embedded) is None
    assert validate_data(embedded, {"x": "s"}) == ["data.x: 's' is not of type 'integer'"]
    # The meta-schemas ship with jsonschema: resolving them reads no network.
    assert check_schema({"$ref": "https://json-schema.org/draft/2020-12/schema"}) is None


def test_a_reference_loop_that_never_checks_anything_is_refused() -> None:
    error = check_schema({"$ref": "#"})
    assert error is not None and "loop" in error
    error = check_schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#"}]}},
                          "$ref": "#/$defs/a"})  # fmt: skip
    assert error is not None and "loop" in error
    # Recursion that descends into the data is fine.
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    assert check_schema(tree) is None
    assert validate_data(tree, {"kids": [{"kids": [{"kids": 1}]}]}) == [
        "data.kids[0].kids[0].kids: 1 is not of type 'array'"
    ]


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        body = json.dumps({"type": "string"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def schema_server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Recorder", (_Recorder,), {"hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_remote_reference_is_refused_and_never_fetched(
    schema_server: tuple[str, list[str]],
) -> None:
    url, hits = schema_server
    schema = {"type": "object", "properties": {"x": {"$ref": f"{url}/s.json"}}}
    # The control: jsonschema left to itself does fetch it, so the server would see it.
    with pytest.warns(DeprecationWarning):
        jsonschema.validate({"x": "fine"}, schema)
    assert hits == ["/s.json"]
    hits.clear()

    error = check_schema(schema)
    assert error is not None and f"{url}/s.json" in error and "never fetched" in error
    violations = validate_data(schema, {"x": "fine"})  # even if the check were skipped
    assert len(violations) == 1 and "cannot be resolved" in violations[0]
    assert isinstance(first_attempt(report({"x": "fine"}), schema), str)
    assert hits == []


# --- report_tool --------------------------------------------------------------------------


def test_without_a_schema_the_tool_is_the_shared_one() -> None:
    assert report_tool(None) is REPORT_FINDINGS_TOOL
    assert "data" not in REPORT_FINDINGS_TOOL["input_schema"]["properties"]


def test_the_tool_schema_and_the_report_model_agree() -> None:
    tool_schema = REPORT_FINDINGS_TOOL["input_schema"]
    good = {"summary": "s", "findings": [{"claim": "c", "evidence": "e", "severity": "low"}]}
    bad = [
        {"summary": "", "findings": []},
        {"summary": "s"},
        {"summary": "s", "findings": [{"claim": "c", "evidence": "e", "severity": "grave"}]},
        {"summary": "s", "findings": [{"claim": "c", "severity": "low"}]},
    ]
    assert check_schema(tool_schema) is None and "$defs" not in tool_schema
    assert validate_data(tool_schema, good) == [] and isinstance(parse_report(good), Report)
    for report_input in bad:
        assert validate_data(tool_schema, report_input) != []
        assert isinstance(parse_report(report_input), str)


def test_with_a_schema_data_is_required_and_the_shared_tool_is_untouched() -> None:
    before = copy.deepcopy(REPORT_FINDINGS_TOOL)
    tool = report_tool(SCORES)
    assert before == REPORT_FINDINGS_TOOL
    assert tool["name"] == "report_findings"
    assert tool["description"].startswith(REPORT_FINDINGS_TOOL["description"])
    assert "`data`" in tool["description"] and tool["description"] != before["description"]
    assert tool["input_schema"]["properties"]["data"] == SCORES
    assert tool["input_schema"]["required"] == ["summary", "findings", "data"]
    assert (
        tool["input_schema"]["properties"]["findings"]
        == before["input_schema"]["properties"]["findings"]
    )
    # Later changes to either do not reach the other.
    tool["input_schema"]["properties"]["data"]["type"] = "array"
    assert SCORES["type"] == "object" and before == REPORT_FINDINGS_TOOL


def test_the_embedded_schema_keeps_its_references_pointing_at_its_own_defs() -> None:
    tool_schema = report_tool(WITH_DEFS)["input_schema"]
    assert check_schema(tool_schema) is None
    data = tool_schema["properties"]["data"]
    assert data["properties"]["best"]["$ref"] == "#/properties/data/$defs/entry"
    assert WITH_DEFS["properties"]["best"]["$ref"] == "#/$defs/entry"
    good = report({"best": {"n": 1}, "all": [{"n": 2}]})
    bad = report({"best": {"n": 1}, "all": [{"n": "two"}]})
    assert validate_data(tool_schema, good) == []
    assert validate_data(tool_schema, bad) == ["data.data.all[0].n: 'two' is not of type 'integer'"]


def test_a_schema_with_its_own_id_is_embedded_as_it_is() -> None:
    schema = {"$id": "https://example.com/s.json", **WITH_DEFS}
    tool_schema = report_tool(schema)["input_schema"]
    assert tool_schema["properties"]["data"] == schema
    assert validate_data(tool_schema, report({"best": {"n": "x"}})) == [
        "data.data.best.n: 'x' is not of type 'integer'"
    ]


# --- validate_data ------------------------------------------------------------------------


def test_data_that_fits_has_no_violations() -> None:
    assert validate_data(SCORES, {"items": [{"name": "a", "score": 1.5}], "extra": True}) == []


def test_every_violation_is_named_by_its_path_in_order() -> None:
    items = [{"name": "ok", "score": 1}] * 12
    items[2] = {"name": "c", "score": "high"}
    items[10] = {"score": 3}
    items[11] = {"name": 7, "score": None}
    assert validate_data(SCORES, {"items": items}) == [
        "data.items[2].score: 'high' is not of type 'number'",
        "data.items[10]: 'name' is a required property",
        "data.items[11].name: 7 is not of type 'string'",
        "data.items[11].score: None is not of type 'number'",
    ]


def test_keys_that_are_not_names_are_quoted_in_the_path() -> None:
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    assert validate_data(schema, {"a b": "x", "0": "y", "ok": 1}) == [
        """data["0"]: 'y' is not of type 'integer'""",
        """data["a b"]: 'x' is not of type 'integer'""",
    ]
    assert validate_data({"type": "object"}, []) == ["data: [] is not of type 'object'"]


def test_many_violations_are_capped_and_counted() -> None:
    schema = {"type": "array", "items": {"type": "string"}}
    violations = validate_data(schema, list(range(MAX_VIOLATIONS + 5)))
    assert len(violations) == MAX_VIOLATIONS + 1
    assert violations[0] == "data[0]: 0 is not of type 'string'"
    assert violations[MAX_VIOLATIONS - 1].startswith(f"data[{MAX_VIOLATIONS - 1}]:")
    assert violations[-1] == "… and 5 more"
    assert len(validate_data(schema, list(range(MAX_VIOLATIONS)))) == MAX_VIOLATIONS


def test_a_long_offending_value_is_clipped_in_the_message() -> None:
    (violation,) = validate_data({"type": "integer"}, "x" * 5000)
    assert violation.startswith("data: 'xxx") and violation.endswith("…")
    assert len(violation) < 400


# --- the first attempt and the attempts ---------------------------------------------------


def test_a_valid_typed_report_carries_its_data_and_is_a_report() -> None:
    data = {"items": [{"name": "a", "score": 2}]}
    parsed = first_attempt(report(data), SCORES)
    assert isinstance(parsed, TypedReport) and isinstance(parsed, Report)
    assert parsed.data == data and parsed.summary == "Done." and parsed.findings == []
    assert parsed.model_dump()["data"] == data


def test_data_may_be_null_when_the_schema_allows_it_but_not_missing() -> None:
    parsed = first_attempt(report(None), {"type": "null"})
    assert isinstance(parsed, TypedReport) and parsed.data is None
    error = first_attempt({"summary": "s", "findings": []}, {"type": "null"})
    assert isinstance(error, str) and "- data: Field required" in error


def test_without_a_schema_data_is_dropped() -> None:
    parsed = first_attempt(report({"anything": 1}), None)
    assert isinstance(parsed, TypedReport) and parsed.data is None


def test_an_invalid_report_lists_every_problem_and_asks_again() -> None:
    bad = {"summary": "", "findings": [{"claim": "c"}], "data": {"items": [{"score": "x"}]}}
    error = first_attempt(bad, SCORES)
    assert isinstance(error, str)
    lines = error.splitlines()
    assert lines[0] == "error: report_findings input is invalid:"
    assert set(lines[1:-2]) == {
        "- summary: String should have at least 1 character",
        "- findings.0.evidence: Field required",
        "- findings.0.severity: Field required",
        "- data.items[0]: 'name' is a required property",
        "- data.items[0].score: 'x' is not of type 'number'",
    }
    assert lines[-2].startswith("Call report_findings again") and "data" in lines[-2]
    assert lines[-1] == "(2 attempts left.)"


def test_the_untyped_report_error_reads_as_before() -> None:
    assert parse_report({"findings": []}) == (
        "error: report_findings input is invalid (summary: Field required). Call "
        "report_findings again with a summary string and a findings list of {claim, evidence, "
        "severity}."
    )


def test_three_invalid_reports_fail_the_subtask_with_the_last_problems() -> None:
    attempts = ReportAttempts(SCORES)
    assert MAX_REPORT_ATTEMPTS == 3
    first = attempts.take(report({"items": 1}))
    second = attempts.take(report({}))
    third = attempts.take(report({"items": [{"name": "a", "score": "x"}]}))
    assert isinstance(first, Rejected) and not first.final
    assert first.message.endswith("(2 attempts left.)")
    assert "- data.items: 1 is not of type 'array'" in first.message
    assert isinstance(second, Rejected) and second.message.endswith("(1 attempt left.)")
    assert isinstance(third, Rejected) and third.final
    assert third.message == (
        "error: the subagent's report was still invalid after 3 attempts:\n"
        "- data.items[0].score: 'x' is not of type 'number'"
    )


def test_a_valid_report_within_the_attempts_ends_the_subtask() -> None:
    attempts = ReportAttempts(SCORES)
    assert isinstance(attempts.take(report({})), Rejected)
    done = attempts.take(report({"items": []}))
    assert isinstance(done, TypedReport) and done.data == {"items": []}
    assert attempts.used == 2


# --- properties ---------------------------------------------------------------------------

LEAVES: dict[str, tuple[st.SearchStrategy[Any], object]] = {
    # type: (values of it, a value of another type)
    "string": (st.text(max_size=5), 1),
    "integer": (st.integers(), "1"),
    "number": (st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)), "1"),
    "boolean": (st.booleans(), 0),
    "null": (st.none(), False),
}
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)

schemas: st.SearchStrategy[dict[str, Any]] = st.recursive(
    st.sampled_from(sorted(LEAVES)).map(lambda t: {"type": t}),
    lambda inner: st.one_of(
        st.dictionaries(NAMES, inner, min_size=1, max_size=4).map(
            lambda props: {
                "type": "object",
                "properties": props,
                "required": sorted(props),
                "additionalProperties": False,
            }
        ),
        inner.map(lambda items: {"type": "array", "items": items, "minItems": 1}),
    ),
    max_leaves=8,
)


def instance_of(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = schema["type"]
    if kind == "object":
        return st.fixed_dictionaries({k: instance_of(v) for k, v in schema["properties"].items()})
    if kind == "array":
        return st.lists(instance_of(schema["items"]), min_size=1, max_size=3)
    return LEAVES[kind][0]


def leaves(value: Any, schema: dict[str, Any], path: str) -> Iterator[tuple[str, list[Any], str]]:
    """Each scalar in ``value``: its path as written, the route to it, and its schema type."""
    if schema["type"] == "object":
        for key, sub in schema["properties"].items():
            for where, route, kind in leaves(value[key], sub, f"{path}.{key}"):
                yield where, [key, *route], kind
    elif schema["type"] == "array":
        for i, item in enumerate(value):
            for where, route, kind in leaves(item, schema["items"], f"{path}[{i}]"):
                yield where, [i, *route], kind
    else:
        yield path, [], schema["type"]


@st.composite
def schema_and_instance(draw: st.DrawFn) -> tuple[dict[str, Any], Any]:
    schema = draw(schemas)
    return schema, draw(instance_of(schema))


@settings(max_examples=150, deadline=None)
@given(schema_and_instance())
def test_generated_instances_of_generated_schemas_pass(case: tuple[dict[str, Any], Any]) -> None:
    schema, instance = case
    assert check_schema(schema) is None
    assert validate_data(schema, instance) == []
    parsed = first_attempt(report(instance), schema)
    assert isinstance(parsed, TypedReport) and parsed.data == instance


@settings(max_examples=150, deadline=None)
@given(schema_and_instance(), st.data())
def test_one_field_of_another_type_is_exactly_one_violation_at_its_path(
    case: tuple[dict[str, Any], Any], data: st.DataObject
) -> None:
    schema, instance = case
    where, route, kind = data.draw(st.sampled_from(list(leaves(instance, schema, "data"))))
    broken = copy.deepcopy(instance)
    wrong = LEAVES[kind][1]
    if not route:
        broken = wrong
    else:
        parent = broken
        for step in route[:-1]:
            parent = parent[step]
        parent[route[-1]] = wrong
    (violation,) = validate_data(schema, broken)
    assert violation == f"{where}: {wrong!r} is not of type {kind!r}"
    error = first_attempt(report(broken), schema)
    assert isinstance(error, str) and f"- {violation}\n" in error


def test_an_empty_schema_still_asks_for_data() -> None:
    error = first_attempt({"summary": "s", "findings": []}, {})
    assert isinstance(error, str) and "- data: Field required" in error
    assert error.endswith("and data following the schema of the data property.\n(2 attempts left.)")
    parsed = first_attempt(report([1, "two"]), {})
    assert isinstance(parsed, TypedReport) and parsed.data == [1, "two"]
