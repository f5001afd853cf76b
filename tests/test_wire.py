"""The one reader of a content block's type: anything read back from disk may be malformed."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from orchmode.core.wire import blocks_of, has_block, is_block, joined_text

KINDS = st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", 3, None])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
BLOCK = st.fixed_dictionaries({"type": KINDS}, optional={"text": JSON, "input": JSON})
CONTENT = st.one_of(st.text(max_size=10), st.lists(st.one_of(BLOCK, JSON), max_size=6), JSON)


@given(CONTENT, st.sampled_from(["text", "tool_use", "tool_result", "thinking"]))
def test_blocks_of_keeps_exactly_the_blocks_of_one_kind_in_order(content: Any, kind: Any) -> None:
    found = blocks_of(content, kind)
    expected = (
        [b for b in content if isinstance(b, dict) and b.get("type") == kind]
        if isinstance(content, list)
        else []
    )
    assert found == expected
    assert all(is_block(b, kind) for b in found)
    assert has_block(content, kind) == bool(expected)


@given(CONTENT)
def test_joined_text_never_fails_and_a_string_is_its_own_text(content: Any) -> None:
    text = joined_text(content)
    assert isinstance(text, str)
    if isinstance(content, str):
        assert text == content
    elif not blocks_of(content, "text"):
        assert text == ""


def test_the_text_of_a_reply_skips_its_tool_calls() -> None:
    content = [
        {"type": "text", "text": "one"},
        {"type": "tool_use", "id": "t", "name": "bash", "input": {}},
        {"type": "text", "text": "two"},
    ]
    assert joined_text(content) == "one\n\ntwo"
    assert [b["id"] for b in blocks_of(content, "tool_use")] == ["t"]
