"""Normalising the Workflow tool's subtasks from every shape a model emits, and the per-call cap."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from orchmode.fanout.plans import Plan, normalise_subtasks, plan_subtasks, title, verdict_of

line = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
one_line = line.filter(lambda s: "\n" not in s and "\r" not in s and not s.strip().startswith("["))


def expected(items: list[str]) -> list[str]:
    return [s.strip() for s in items if s.strip()]


@given(st.lists(line, max_size=20))
def test_a_list_keeps_non_empty_trimmed_strings_in_order(items: list[str]) -> None:
    assert normalise_subtasks(items) == expected(items)


@given(st.lists(line, max_size=20))
def test_a_json_encoded_list_is_decoded(items: list[str]) -> None:
    assert normalise_subtasks(json.dumps(items)) == expected(items)


@given(
    st.lists(
        one_line.filter(lambda s: all(c not in s for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")),
        min_size=1,
        max_size=20,
    )
)
def test_a_newline_separated_string_is_split(items: list[str]) -> None:
    assert normalise_subtasks("\n".join(items)) == expected(items)


@given(one_line.filter(lambda s: all(c not in s for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")))
def test_a_single_string_is_one_subtask(item: str) -> None:
    assert normalise_subtasks(item) == expected([item])


@given(
    st.one_of(
        st.none(), st.integers(), st.floats(), st.booleans(), st.dictionaries(st.text(), st.text())
    )
)
def test_other_shapes_give_no_subtasks(raw: object) -> None:
    assert normalise_subtasks(raw) == []


def test_non_string_items_are_kept_as_json_not_dropped() -> None:
    got = normalise_subtasks(["a", {"prompt": "b"}, 3, None])
    assert got == ["a", '{"prompt": "b"}', "3"]


@given(st.integers(1, 30), st.integers(1, 30))
def test_the_per_call_cap_runs_the_first_n_and_says_how_many_were_not_run(n: int, cap: int) -> None:
    plan = plan_subtasks({"subtasks": [f"task {i}" for i in range(n)]}, cap)
    assert isinstance(plan, Plan)
    assert plan.subtasks == [f"task {i}" for i in range(min(n, cap))]
    assert plan.not_run == max(0, n - cap)
    if n > cap:
        assert f"{n - cap} were not run" in plan.note
        assert "Call Workflow again" in plan.note
    else:
        assert plan.note == ""


def test_no_usable_subtasks_is_an_error_result() -> None:
    for bad in ({"subtasks": []}, {"subtasks": "  \n "}, {}, "subtasks", None, {"subtasks": 7}):
        result = plan_subtasks(bad, 10)
        assert isinstance(result, str) and result.startswith("error:")


def test_titles_are_one_short_line() -> None:
    assert title("first line\nsecond") == "first line"
    assert len(title("x" * 500)) == 120


def test_verdict_is_read_from_the_verifier_summary() -> None:
    assert verdict_of(json.dumps({"summary": "Confirmed: yes", "findings": []})) == "confirmed"
    assert verdict_of(json.dumps({"summary": "refuted: no", "findings": []})) == "refuted"
    assert verdict_of("the agent ran out of turns") == "unclear"
