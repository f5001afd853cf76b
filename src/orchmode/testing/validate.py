"""Request validation as strict as the real Messages API, so bugs surface in tests.

A harness that builds a malformed conversation (an orphaned ``tool_use``, an empty text
block, a system notice in the wrong place) gets the same HTTP 400 here that it would get
in production, instead of a scripted reply that hides the bug. Messages imitate the
API's ``path: problem`` style; the first problem found, in document order, is reported.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InvalidRequest", "validate_request"]

_ROLES = ("user", "assistant", "system")


class InvalidRequest(ValueError):
    """A request the real API would refuse with 400 ``invalid_request_error``."""


def _fail(message: str) -> InvalidRequest:
    return InvalidRequest(message)


def validate_request(body: object) -> dict[str, Any]:
    """Return ``body`` typed as a dict, or raise :class:`InvalidRequest` explaining why not."""
    if not isinstance(body, dict):
        raise _fail("Request body must be a JSON object")
    _check_model_and_limits(body)
    _check_system(body.get("system"))
    _check_tools(body.get("tools"))
    _check_top_level_cache_control(body.get("cache_control"))
    _check_diagnostics(body.get("diagnostics"))
    _check_messages(body)
    return body


def _check_model_and_limits(body: dict[str, Any]) -> None:
    if "model" not in body:
        raise _fail("model: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise _fail("model: Input should be a non-empty string")
    if "max_tokens" not in body:
        raise _fail("max_tokens: Field required")
    max_tokens = body["max_tokens"]
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise _fail("max_tokens: Input should be a valid integer")
    if max_tokens < 1:
        raise _fail("max_tokens: Input should be greater than or equal to 1")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _fail("stream: Input should be a valid boolean")
    if "messages" not in body:
        raise _fail("messages: Field required")
    if not isinstance(body["messages"], list):
        raise _fail("messages: Input should be a valid list")
    if not body["messages"]:
        raise _fail("messages: at least one message is required")


def _check_text_block(block: dict[str, Any], path: str) -> None:
    text = block.get("text")
    if not isinstance(text, str):
        raise _fail(f"{path}.text: Field required")
    if not text:
        raise _fail(f"{path}.text: text content blocks must be non-empty")
    if not text.strip():
        raise _fail(f"{path}.text: text content blocks must contain non-whitespace text")


def _check_system(system: object) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise _fail("system: Input should be a valid string or list of text blocks")
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _fail(f"system.{i}.type: Input should be 'text'")
        _check_text_block(block, f"system.{i}")


def _check_tools(tools: object) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _fail("tools: Input should be a valid list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _fail(f"tools.{i}: Input should be a valid dictionary")
        name = tool.get("name")
        if "name" not in tool:
            raise _fail(f"tools.{i}.name: Field required")
        if not isinstance(name, str) or not name:
            raise _fail(f"tools.{i}.name: Input should be a non-empty string")
        if tool.get("type", "custom") in (None, "custom"):
            if "input_schema" not in tool:
                raise _fail(f"tools.{i}.custom.input_schema: Field required")
            if not isinstance(tool["input_schema"], dict):
                raise _fail(f"tools.{i}.custom.input_schema: Input should be a valid dictionary")
        if name in names:
            raise _fail(f"tools: Tool names must be unique (duplicate: {name!r})")
        names.add(name)


def _check_top_level_cache_control(marker: object) -> None:
    if marker is None:
        return
    if not isinstance(marker, dict) or marker.get("type") != "ephemeral":
        raise _fail("cache_control.type: Input should be 'ephemeral'")


def _check_diagnostics(diagnostics: object) -> None:
    if diagnostics is None:
        return
    if not isinstance(diagnostics, dict):
        raise _fail("diagnostics: Input should be a valid dictionary")
    previous = diagnostics.get("previous_message_id")
    if previous is not None and not isinstance(previous, str):
        raise _fail("diagnostics.previous_message_id: Input should be a valid string")


def _blocks_of(message: object) -> list[dict[str, Any]]:
    """Tolerant view of a message's blocks, for look-ahead before it is validated."""
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict)]


def _role_of(message: object) -> object:
    return message.get("role") if isinstance(message, dict) else None


def _tool_use_ids(message: object) -> list[str]:
    if _role_of(message) != "assistant":
        return []
    return [str(b.get("id")) for b in _blocks_of(message) if b.get("type") == "tool_use"]


def _tool_result_ids(message: object) -> list[str]:
    if _role_of(message) != "user":
        return []
    return [
        str(b.get("tool_use_id")) for b in _blocks_of(message) if b.get("type") == "tool_result"
    ]


def _check_messages(body: dict[str, Any]) -> None:
    messages: list[Any] = body["messages"]
    seen_tool_use_ids: set[str] = set()
    for i, message in enumerate(messages):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise _fail(f"{path}: Input should be a valid dictionary")
        if "role" not in message:
            raise _fail(f"{path}.role: Field required")
        role = message["role"]
        if role not in _ROLES:
            raise _fail(f"{path}.role: Input should be 'user', 'assistant' or 'system'")
        if i == 0 and role != "user":
            raise _fail('messages: first message must use the "user" role')
        if role == "system" and _role_of(messages[i - 1]) != "user":
            raise _fail(f"{path}: a system message must directly follow a user message")
        if "content" not in message:
            raise _fail(f"{path}.content: Field required")
        _check_content(message["content"], role, path)
        if role == "assistant":
            _check_tool_uses(messages, i, seen_tool_use_ids)
        elif role == "user":
            _check_tool_results(messages, i)
    _check_prefill(messages[-1], len(messages) - 1)


def _check_content(content: object, role: str, path: str) -> None:
    if isinstance(content, str):
        if not content:
            raise _fail(f"{path}: all messages must have non-empty content")
        if not content.strip():
            raise _fail(f"{path}.content: text content must contain non-whitespace text")
        return
    if not isinstance(content, list):
        raise _fail(f"{path}.content: Input should be a valid string or list of content blocks")
    if not content:
        raise _fail(f"{path}: all messages must have non-empty content")
    for j, block in enumerate(content):
        block_path = f"{path}.content.{j}"
        if not isinstance(block, dict):
            raise _fail(f"{block_path}: Input should be a valid dictionary")
        kind = block.get("type")
        if not isinstance(kind, str):
            raise _fail(f"{block_path}.type: Field required")
        if role == "system" and kind != "text":
            raise _fail(f"{block_path}.type: system messages may only contain text blocks")
        if kind == "text":
            _check_text_block(block, block_path)
        elif kind == "tool_use":
            _check_tool_use_block(block, role, block_path)
        elif kind == "tool_result":
            _check_tool_result_block(block, role, block_path)


def _check_tool_use_block(block: dict[str, Any], role: str, path: str) -> None:
    if role != "assistant":
        raise _fail(f"{path}: `tool_use` blocks are only allowed in assistant messages")
    for field in ("id", "name"):
        if not isinstance(block.get(field), str) or not block[field]:
            raise _fail(f"{path}.{field}: Field required")
    if not isinstance(block.get("input"), dict):
        raise _fail(f"{path}.input: Input should be a valid dictionary")


def _check_tool_result_block(block: dict[str, Any], role: str, path: str) -> None:
    if role != "user":
        raise _fail(f"{path}: `tool_result` blocks are only allowed in user messages")
    if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
        raise _fail(f"{path}.tool_use_id: Field required")
    content = block.get("content")
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _fail(f"{path}.content: Input should be a valid string or list of content blocks")
    for k, inner in enumerate(content):
        if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
            raise _fail(f"{path}.content.{k}.type: Field required")
        if inner["type"] == "text":
            _check_text_block(inner, f"{path}.content.{k}")


def _check_tool_uses(messages: list[Any], i: int, seen: set[str]) -> None:
    """Every tool_use needs a unique id and a tool_result in the very next message."""
    ids = _tool_use_ids(messages[i])
    for j, block in enumerate(_blocks_of(messages[i])):
        if block.get("type") != "tool_use":
            continue
        if block["id"] in seen:
            raise _fail(f"messages.{i}.content.{j}: `tool_use` ids must be unique")
        seen.add(block["id"])
    if not ids:
        return
    answered = set(_tool_result_ids(messages[i + 1])) if i + 1 < len(messages) else set()
    missing = [tool_id for tool_id in ids if tool_id not in answered]
    if missing:
        raise _fail(
            f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately"
            f" after: {', '.join(missing)}. Each `tool_use` block must have a corresponding"
            " `tool_result` block in the next message."
        )


def _check_tool_results(messages: list[Any], i: int) -> None:
    """tool_results answer the immediately preceding assistant turn, first and once each."""
    expected = set(_tool_use_ids(messages[i - 1])) if i > 0 else set()
    answered: set[str] = set()
    other_seen = False
    for j, block in enumerate(_blocks_of(messages[i])):
        path = f"messages.{i}.content.{j}"
        if block.get("type") != "tool_result":
            other_seen = True
            continue
        if other_seen:
            raise _fail(f"{path}: `tool_result` blocks must come before any other content")
        tool_use_id = block["tool_use_id"]
        if tool_use_id not in expected:
            raise _fail(
                f"{path}: unexpected `tool_use_id` found in `tool_result` blocks: {tool_use_id}."
                " Each `tool_result` block must have a corresponding `tool_use` block in the"
                " previous message."
            )
        if tool_use_id in answered:
            raise _fail(f"{path}: duplicate `tool_result` for `tool_use_id` {tool_use_id}")
        answered.add(tool_use_id)


def _check_prefill(last: dict[str, Any], i: int) -> None:
    """A final assistant message is a prefill; the API refuses trailing whitespace there."""
    if last["role"] != "assistant":
        return
    content = last["content"]
    text = content if isinstance(content, str) else None
    if isinstance(content, list) and content and content[-1].get("type") == "text":
        text = content[-1]["text"]
    if text is not None and text != text.rstrip():
        raise _fail(f"messages.{i}: final assistant content cannot end with trailing whitespace")
