"""Recorded histories read back through the message types: as recorded, or one clear error."""

from __future__ import annotations

import json

import pytest

from orchmode.core.wire import Message, message_json, read_history
from orchmode.session.resume import pending_calls

#: Shapes earlier versions recorded: a mid-conversation system note, blocks and fields this
#: version does not declare (compaction, redacted thinking, citations, a server tool's).
RECORDED: list[object] = [
    {"role": "user", "content": "review this"},
    {"role": "system", "content": "[orchmode] plan mode is on"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Looking.", "citations": None},
            {"type": "compaction", "content": "the story so far", "encrypted_content": None},
            {"id": "t1", "name": "bash", "input": {"command": "ls"}, "type": "tool_use"},
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [{"type": "text", "text": "a.py"}],
                "is_error": False,
                "cache_control": {"type": "ephemeral"},
            }
        ],
    },
]


def test_a_recorded_history_is_read_back_as_it_was_recorded() -> None:
    before = json.dumps(RECORDED)
    history = read_history(RECORDED)
    assert history is RECORDED  # no copy: the request resends the recorded bytes
    assert json.dumps(history) == before


@pytest.mark.parametrize(
    ("recorded", "where"),
    [
        ({"role": "user", "content": "x"}, "the whole"),
        ([{"role": "user"}], "0.content"),
        ([{"role": "robot", "content": "x"}], "0.role"),
        ([{"role": "assistant", "content": [{"type": "tool_use", "name": "bash"}]}], "id"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "type"),
    ],
)
def test_a_history_that_cannot_be_read_is_one_line_saying_where(
    recorded: object, where: str
) -> None:
    with pytest.raises(ValueError) as caught:
        read_history(recorded)
    said = str(caught.value)
    assert said.startswith("history is not a list of messages (")
    assert where in said and "\n" not in said


def test_a_checkpointed_message_keeps_its_keys_and_their_order() -> None:
    message: Message = {
        "role": "assistant",
        "content": [{"id": "t1", "name": "bash", "input": {"command": "ls"}, "type": "tool_use"}],
    }
    text = message_json(message)
    assert json.loads(text) == message
    assert list(json.loads(text)["content"][0]) == ["id", "name", "input", "type"]


def test_the_calls_a_checkpoint_left_unanswered_are_named() -> None:
    last: Message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Running."},
            {"type": "tool_use", "id": "a", "name": "bash", "input": {"command": "make"}},
            {"type": "tool_use", "id": "b", "name": "Workflow", "input": {"subtasks": ["x"]}},
            {"type": "tool_use", "id": "c", "name": "mcp__x__y", "input": {}},
        ],
    }
    assert pending_calls([message_json(last)]) == [
        "bash `make`",
        "Workflow (1 subtasks)",
        "mcp__x__y",
    ]
    assert pending_calls(["{not json"]) == []
    assert pending_calls([json.dumps({"role": "user", "content": "hi"})]) == []
