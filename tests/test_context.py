"""The pure parts of staying inside the window: sizes, compaction and condensed results."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.core.prompts import quote_result, verify_prompt
from orchmode.core.results import SEVERITIES
from orchmode.core.settings import Settings
from orchmode.fanout.condense import AgentEntry, SubtaskEntry, fit_result, fit_value, full_text
from orchmode.model.context import (
    KEEP_TURNS,
    Meter,
    Window,
    compact,
    estimate_tokens,
    too_long_count,
)

Message = dict[str, Any]


# --------------------------------------------------------------------------- the window


def test_window_defaults_come_from_the_models_table_and_the_shares() -> None:
    window = Window.from_settings(Settings())
    assert window.tokens == 200_000
    assert window.compact_at == 160_000
    assert window.compact_to == 100_000
    assert window.result_tokens == 50_000
    assert window.quote_tokens == 10_000


def test_a_set_context_window_overrides_the_table() -> None:
    window = Window.from_settings(Settings(context_window=40_000, workflow_result_tokens=3_000))
    assert (window.tokens, window.result_tokens) == (40_000, 3_000)


def test_compact_to_must_be_below_compact_at() -> None:
    with pytest.raises(ValueError, match="compact_to"):
        Settings(compact_at=0.5, compact_to=0.6)


@given(st.integers(0, 400_000))
def test_a_result_budget_never_passes_its_share_nor_the_room_left(used: int) -> None:
    window = Window.from_settings(Settings())
    budget = window.result_budget(used)
    assert budget <= window.result_tokens
    floor = window.tokens // 50
    assert budget == floor or budget <= window.compact_at - used


def test_the_apis_too_long_message_gives_the_count() -> None:
    message = "prompt is too long: 254572 tokens > 200000 maximum"
    assert too_long_count(message) == 254_572
    assert too_long_count("max_tokens: Field required") is None


def test_the_meter_starts_from_the_apis_count_and_estimates_only_what_is_new() -> None:
    meter = Meter(["system", [{"name": "bash"}]])
    history: list[Message] = [{"role": "user", "content": "hello " * 1000}]
    rough = meter.size(history)
    assert rough == meter.estimate(history)
    meter.observe(1, 1234)
    assert meter.size(history) == 1234
    history.append({"role": "assistant", "content": "x" * 300})
    assert meter.size(history) == 1234 + estimate_tokens(history[1])
    meter.forget()
    assert meter.size(history) == meter.estimate(history)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(st.text(max_size=50), st.lists(st.dictionaries(st.text(max_size=5), _json_values)))
def test_the_meters_fixed_part_is_what_estimate_tokens_gives_it_whole(
    system: str, tools: list[dict[str, Any]]
) -> None:
    # The tool schemas are measured one at a time (and each kept): the sum must be the
    # estimate of the list whole, asked of the same schemas again or of others.
    expected = estimate_tokens(system) + estimate_tokens(tools)
    assert Meter([system, tools]).fixed_tokens == expected
    assert Meter([system, list(tools)]).fixed_tokens == expected


def test_a_target_shrinks_when_the_api_counted_more_than_estimated() -> None:
    meter = Meter([])
    history: list[Message] = [{"role": "user", "content": "x" * 3000}]
    estimate = meter.estimate(history)
    meter.observe(1, estimate * 2)  # dense text: twice the estimate
    assert meter.target(history, 1000) == 500
    meter.observe(1, estimate // 2)  # ordinary text: the estimate runs high, keep the target
    assert meter.target(history, 1000) == 1000


# --------------------------------------------------------------------------- compaction


def conversation(turns: int, results_per_turn: int, size: int) -> list[Message]:
    """A valid main-agent conversation whose tool results are ``size`` characters."""
    messages: list[Message] = []
    n = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"task {turn}"})
        messages.append({"role": "system", "content": "Orchestration mode is ON."})
        for _ in range(results_per_turn):
            n += 1
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"c": n}}
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": f"t{n}", "content": f"{n}:" * size}
                    ],
                }
            )
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "done"}]})
    return messages


def tool_ids(messages: list[Message], kind: str) -> list[str]:
    key = "id" if kind == "tool_use" else "tool_use_id"
    return [
        b[key]
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == kind
    ]


def test_compaction_stubs_the_oldest_results_and_names_their_saved_copies() -> None:
    messages = conversation(turns=4, results_per_turn=2, size=2000)
    saved: dict[str, str] = {}

    def save(tool_use_id: str, text: str) -> str:
        saved[tool_use_id] = text
        return f"/results/tool-{tool_use_id}.txt"

    size = Meter([]).estimate(messages)
    done = compact(messages, size, size // 2, save)
    assert done.stubbed >= 1
    first = done.messages[3]["content"][0]["content"]
    assert first.startswith("[orchmode: this tool result (")
    assert "/results/tool-t1.txt" in first
    assert saved["t1"] == "1:" * 2000
    assert messages[3]["content"][0]["content"] == "1:" * 2000  # the input is not changed
    assert Meter([]).estimate(done.messages) <= size // 2


@settings(max_examples=60, deadline=None)
@given(
    turns=st.integers(1, 6),
    per_turn=st.integers(1, 4),
    size=st.integers(10, 3000),
    share=st.floats(0.0, 1.0),
    keep_last=st.booleans(),
)
def test_compaction_keeps_the_conversation_valid_and_deterministic(
    turns: int, per_turn: int, size: int, share: float, keep_last: bool
) -> None:
    messages = conversation(turns, per_turn, size)
    total = Meter([]).estimate(messages)
    target = int(total * share)

    def save(tool_use_id: str, _text: str) -> str:
        return f"/r/{tool_use_id}"

    done = compact(messages, total, target, save, keep_last=keep_last)
    again = compact(messages, total, target, save, keep_last=keep_last)
    assert json.dumps(done.messages) == json.dumps(again.messages)
    # every tool_use keeps its tool_result, in the same places
    assert tool_ids(done.messages, "tool_use") == tool_ids(messages, "tool_use")
    assert tool_ids(done.messages, "tool_result") == tool_ids(messages, "tool_result")
    assert [m["role"] for m in done.messages] == [m["role"] for m in messages]
    after = Meter([]).estimate(done.messages)
    assert after <= total
    if after > target:  # then nothing worth stubbing is left
        for i, message in enumerate(done.messages):
            if keep_last and i == len(messages) - 2:
                continue
            for block in message["content"] if isinstance(message["content"], list) else []:
                if block.get("type") == "tool_result":
                    content = block["content"]
                    assert content.startswith("[orchmode:") or estimate_tokens(content) < 150
    if keep_last:  # the latest tool results are never stubbed while others can go
        assert done.messages[-2] == messages[-2]


def test_compaction_takes_older_turns_before_the_latest_ones() -> None:
    messages = conversation(turns=KEEP_TURNS + 2, results_per_turn=1, size=3000)
    total = Meter([]).estimate(messages)
    one = estimate_tokens(messages[3])
    done = compact(messages, total, total - one // 2, lambda _i, _t: None)
    assert done.stubbed == 1
    assert done.messages[7] == messages[7]
    assert done.messages[3]["content"][0]["content"].startswith("[orchmode:")
    assert "run the command again" in done.messages[3]["content"][0]["content"]


# --------------------------------------------------------------------------- condensing


def report(summary: str, findings: list[tuple[str, str]]) -> str:
    return json.dumps(
        {
            "summary": summary,
            "findings": [
                {"claim": claim, "evidence": "src/x.py:12 " + "e" * 400, "severity": severity}
                for severity, claim in findings
            ],
        }
    )


def entries(count: int, findings_each: int) -> list[SubtaskEntry]:
    out = []
    for i in range(1, count + 1):
        worker = report(
            f"Summary of subtask {i}.",
            [(SEVERITIES[n % 4], f"claim {i}.{n}") for n in range(findings_each)],
        )
        verifier = json.dumps({"summary": f"confirmed: rechecked {i}", "findings": []})
        out.append(
            SubtaskEntry(
                f"Subtask {i}",
                AgentEntry(worker, f"/r/worker-{i:012d}.json"),
                AgentEntry(verifier, f"/r/verifier-{i:012d}.json"),
            )
        )
    return out


def test_a_result_within_its_budget_is_exactly_the_whole_one() -> None:
    items = entries(3, 2)
    fitted = fit_result(["head"], items, ["[budget: x]"], 1_000_000, saved_at="/s", directory="/r")
    assert not fitted.condensed
    assert fitted.text == full_text(["head"], items, ["[budget: x]"])


def test_a_condensed_result_keeps_every_summary_and_verdict_and_high_findings_first() -> None:
    items = entries(40, 8)
    whole = full_text([], items, ["[budget: x]"])
    budget = estimate_tokens(whole) // 4
    fitted = fit_result([], items, ["[budget: x]"], budget, saved_at="/s/w.txt", directory="/r")
    assert fitted.condensed
    assert fitted.tokens_shown <= budget
    for i in range(1, 41):
        assert f"[agent {i}: Subtask {i}] (report: worker-{i:012d}.json)" in fitted.text
        assert f"Summary of subtask {i}." in fitted.text
        assert f"[verify {i}] (report: verifier-{i:012d}.json)\nconfirmed: rechecked {i}" in (
            fitted.text
        )
    shown = {s: fitted.text.count(f"- [{s}] ") for s in SEVERITIES}
    assert shown["high"] == 80  # every high finding made it
    assert shown["info"] == 0 or shown["low"] == 80
    assert "findings not shown" in fitted.omitted
    assert "/s/w.txt" in fitted.text
    assert fitted.text.endswith("[budget: x]")


def test_omissions_are_named_per_agent_with_its_file() -> None:
    items = entries(2, 8)
    whole = full_text([], items, [])
    fitted = fit_result([], items, [], estimate_tokens(whole) // 3, saved_at="/s", directory="/r")
    assert "info findings not shown — all of them in worker-000000000001.json)" in fitted.text


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 30), per=st.integers(0, 10), share=st.floats(0.05, 1.5))
def test_condensing_is_deterministic_and_never_drops_a_summary(
    count: int, per: int, share: float
) -> None:
    items = entries(count, per)
    budget = max(1, int(estimate_tokens(full_text([], items, [])) * share))
    one = fit_result([], items, [], budget, saved_at="/s", directory="/r")
    two = fit_result([], items, [], budget, saved_at="/s", directory="/r")
    assert one.text == two.text
    for i in range(1, count + 1):
        assert f"Summary of subtask {i}." in one.text
        assert f"confirmed: rechecked {i}" in one.text


def test_a_plain_text_result_is_kept_and_cut_long() -> None:
    items = [
        SubtaskEntry("t", AgentEntry("error: the subagent failed: " + "z" * 5000, "/r/w.json"))
    ]
    fitted = fit_result([], items, [], 100, saved_at="/s", directory="/r")
    assert "error: the subagent failed:" in fitted.text
    assert "[cut; the whole text is in the report file]" in fitted.text


def test_a_scripts_value_drops_low_findings_first_then_is_cut() -> None:
    value = {
        "reviews": [
            json.loads(report(f"s{i}", [("high", "h"), ("low", "l" * 300), ("info", "i" * 300)]))
            for i in range(30)
        ]
    }
    text = json.dumps(value)
    fitted, note = fit_value(text, estimate_tokens(text) // 2, "/s/script.txt")
    decoded = json.loads(fitted)
    severities = {f["severity"] for r in decoded["reviews"] for f in r["findings"]}
    assert "info" not in severities and "high" in severities
    assert "info" in note and "/s/script.txt" in note
    cut, note = fit_value(text, 50, None)
    assert len(cut) < len(text) and "cut it after" in note


def test_a_verify_prompt_quotes_a_long_result_within_its_budget() -> None:
    result = "r" * 100_000
    quoted = quote_result(result, 30_000, "/r/worker-abc.json")
    prompt = verify_prompt("the subtask", quoted)
    assert len(prompt) < 31_500
    assert "/r/worker-abc.json" in prompt and "100,000 characters" in prompt
    assert quote_result("short", 30_000, "/r/x") == "short"
