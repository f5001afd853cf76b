"""Request validation as strict as the real Messages API, so bugs surface in tests.

A harness that builds a malformed conversation (an orphaned ``tool_use``, an empty text
block, a system notice in the wrong place) gets the same HTTP 400 here that it would get
in production, instead of a scripted reply that hides the bug. Messages imitate the
API's ``path: problem`` style; the first problem found, in document order, is reported.

``POST /v1/messages/count_tokens`` takes the same body minus ``max_tokens`` and
``stream`` (which it refuses as extra inputs, as the API does). The beta
``context_management`` field is checked by :func:`check_context_management`, which also
enforces the ``anthropic-beta`` header that unlocks it.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any, cast

import typing_extensions
from anthropic.types.beta.beta_content_block_param import BetaContentBlockParam
from anthropic.types.content_block_param import ContentBlockParam

from ..core.wire import MessagesRequest, UncheckedJson
from .cache import ClearToolUses
from .web import InvalidWebTool, check_web_tool, web_tool_name

__all__ = [
    "CONTEXT_MANAGEMENT_BETA",
    "BlockShape",
    "InvalidRequest",
    "block_shapes",
    "check_context_management",
    "learn_block_shapes",
    "validate_request",
]

#: The ``anthropic-beta`` value that unlocks ``context_management``.
CONTEXT_MANAGEMENT_BETA = "context-management-2025-06-27"
_CLEAR_TOOL_USES = "clear_tool_uses_20250919"
_EDIT_TYPES = (_CLEAR_TOOL_USES, "clear_thinking_20251015", "compact_20260112")
_CLEAR_TOOL_USES_FIELDS = frozenset(
    {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}
)

_ROLES = ("user", "assistant", "system")


class InvalidRequest(ValueError):
    """A request the real API would refuse with 400 ``invalid_request_error``."""


#: One kind of content block as a request may hold it: the fields it may have, by the names
#: the API spells (``from``, not the SDK's ``from_``), and those it must.
BlockShape = tuple[frozenset[str], frozenset[str]]


def learn_block_shapes(learned: dict[str, BlockShape], blocks: Iterable[Mapping[str, Any]]) -> None:
    """Widen ``learned`` to take back every block as it was sent, fields the SDK does not
    declare included (a recording holds what the API really sent)."""
    known = block_shapes()
    for block in blocks:
        kind = block.get("type")
        if isinstance(kind, str):
            empty: BlockShape = (frozenset(), frozenset({"type"}))
            seen = learned.get(kind) or known.get(kind) or empty
            learned[kind] = (seen[0] | block.keys(), seen[1])


def _literal_of(hint: object) -> object:
    while typing.get_origin(hint) is not typing.Literal and typing.get_args(hint):
        hint = typing.get_args(hint)[0]
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Literal else None


_REQUIRED: tuple[object, ...] = (typing.Required, typing_extensions.Required)


@cache
def block_shapes() -> dict[str, BlockShape]:
    """Every content block a request may hold, read from the installed SDK's request types
    (beta and not), so a block type the SDK adds is known here the day it is installed."""
    shapes: dict[str, BlockShape] = {}
    members = (*typing.get_args(ContentBlockParam), *typing.get_args(BetaContentBlockParam))
    for param in members:
        if not typing_extensions.is_typeddict(param):
            continue  # the union also takes the response models themselves
        hints = typing_extensions.get_type_hints(param, include_extras=True)
        kind = _literal_of(hints.get("type"))
        if not isinstance(kind, str):
            continue
        required = frozenset(
            key for key, hint in hints.items() if typing.get_origin(hint) in _REQUIRED
        )
        allowed = frozenset(hints)
        known = shapes.get(kind)
        shapes[kind] = (
            (allowed, required) if known is None else (known[0] | allowed, known[1] & required)
        )
    return shapes


def _fail(message: str) -> InvalidRequest:
    return InvalidRequest(message)


def validate_request(
    body: object,
    *,
    count_tokens: bool = False,
    more_blocks: Mapping[str, BlockShape] | None = None,
) -> MessagesRequest:
    """Return ``body`` as the request it has been checked to be, or raise
    :class:`InvalidRequest` explaining why not.

    ``count_tokens`` validates a ``/v1/messages/count_tokens`` body instead. Content blocks
    are held to the shapes the SDK declares (:func:`block_shapes`): an unknown field, or a
    field under the SDK's Python name instead of the API's (``from_``), is refused as the
    API refuses it. ``more_blocks`` adds shapes this SDK does not know (a newer API's, which
    the server itself sent).
    """
    if not isinstance(body, dict):
        raise _fail("Request body must be a JSON object")
    _check_model_and_limits(body, count_tokens)
    _check_system(body.get("system"))
    _check_tools(body.get("tools"))
    _check_top_level_cache_control(body.get("cache_control"))
    _check_diagnostics(body.get("diagnostics"))
    _check_messages(body, {**block_shapes(), **(more_blocks or {})})
    return cast(MessagesRequest, body)  # just checked, field by field


def _check_model_and_limits(body: UncheckedJson, count_tokens: bool) -> None:
    if "model" not in body:
        raise _fail("model: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise _fail("model: Input should be a non-empty string")
    if count_tokens:
        for extra in ("max_tokens", "stream"):
            if extra in body:
                raise _fail(f"{extra}: Extra inputs are not permitted")
    elif "max_tokens" not in body:
        raise _fail("max_tokens: Field required")
    else:
        max_tokens = body["max_tokens"]
        if not _is_int(max_tokens):
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_text_block(block: UncheckedJson, path: str) -> None:
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


#: The API's rule for a tool's name.
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")


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
        if not _TOOL_NAME.match(name):
            raise _fail(
                f"tools.{i}.custom.name: String should match pattern '{_TOOL_NAME.pattern}'"
            )
        if tool.get("type", "custom") in (None, "custom"):
            if "input_schema" not in tool:
                raise _fail(f"tools.{i}.custom.input_schema: Field required")
            if not isinstance(tool["input_schema"], dict):
                raise _fail(f"tools.{i}.custom.input_schema: Input should be a valid dictionary")
        if web_tool_name(tool.get("type")) is not None:
            try:
                check_web_tool(tool, f"tools.{i}")
            except InvalidWebTool as exc:
                raise _fail(str(exc)) from None
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


def _blocks_of(message: object) -> list[UncheckedJson]:
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


def _check_messages(body: UncheckedJson, shapes: Mapping[str, BlockShape]) -> None:
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
        _check_content(message["content"], role, path, shapes)
        if role == "assistant":
            _check_tool_uses(messages, i, seen_tool_use_ids)
        elif role == "user":
            _check_tool_results(messages, i)
    _check_prefill(messages[-1], len(messages) - 1)


def _check_content(content: object, role: str, path: str, shapes: Mapping[str, BlockShape]) -> None:
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
        _check_shape(block, kind, block_path, shapes)
        if kind == "text":
            _check_text_block(block, block_path)
        elif kind == "tool_use":
            _check_tool_use_block(block, role, block_path)
        elif kind == "tool_result":
            _check_tool_result_block(block, role, block_path)


def _check_shape(
    block: UncheckedJson, kind: str, path: str, shapes: Mapping[str, BlockShape]
) -> None:
    """The block's type is one the API takes, with its required fields and no others."""
    shape = shapes.get(kind)
    if shape is None:
        expected = ", ".join(f"'{k}'" for k in sorted(shapes))
        raise _fail(
            f"{path}: Input tag '{kind}' found using 'type' does not match any of the"
            f" expected tags: {expected}"
        )
    allowed, required = shape
    for key in block:
        if key not in allowed:
            raise _fail(f"{path}.{kind}.{key}: Extra inputs are not permitted")
    for key in sorted(required - block.keys()):
        raise _fail(f"{path}.{kind}.{key}: Field required")


def _check_tool_use_block(block: UncheckedJson, role: str, path: str) -> None:
    if role != "assistant":
        raise _fail(f"{path}: `tool_use` blocks are only allowed in assistant messages")
    for field in ("id", "name"):
        if not isinstance(block.get(field), str) or not block[field]:
            raise _fail(f"{path}.{field}: Field required")
    if not isinstance(block.get("input"), dict):
        raise _fail(f"{path}.input: Input should be a valid dictionary")


def _check_tool_result_block(block: UncheckedJson, role: str, path: str) -> None:
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


def _check_prefill(last: UncheckedJson, i: int) -> None:
    """A final assistant message is a prefill; the API refuses trailing whitespace there."""
    if last["role"] != "assistant":
        return
    content = last["content"]
    text = content if isinstance(content, str) else None
    if isinstance(content, list) and content and content[-1].get("type") == "text":
        text = content[-1]["text"]
    if text is not None and text != text.rstrip():
        raise _fail(f"messages.{i}: final assistant content cannot end with trailing whitespace")


# --------------------------------------------------------------------------- context management


def check_context_management(
    body: MessagesRequest, betas: set[str], *, supported: bool = True
) -> list[ClearToolUses] | None:
    """The request's validated context edits, or None when it configures none.

    The field exists only under the ``anthropic-beta: context-management-2025-06-27``
    header; without it the API refuses the field as an unknown one. ``supported=False``
    plays an endpoint that does not know the beta at all (older deployments, some
    compatible gateways): the field is refused, and so is the beta header on its own, as
    an unknown beta name.
    """
    present = "context_management" in body
    unlocked = CONTEXT_MANAGEMENT_BETA in betas
    if not supported and not present and unlocked:
        raise _fail(
            f"Unexpected value(s) `{CONTEXT_MANAGEMENT_BETA}` for the `anthropic-beta` header."
            " Please consult our documentation at docs.anthropic.com or try again without"
            " the header."
        )
    if not present:
        return None
    if not supported or not unlocked:
        raise _fail("context_management: Extra inputs are not permitted")
    config = body["context_management"]
    if config is None:
        return None
    if not isinstance(config, dict):
        raise _fail("context_management: Input should be a valid dictionary")
    for key in config:
        if key != "edits":
            raise _fail(f"context_management.{key}: Extra inputs are not permitted")
    edits = config.get("edits", [])
    if not isinstance(edits, list):
        raise _fail("context_management.edits: Input should be a valid list")
    return [_parse_edit(edit, f"context_management.edits.{i}") for i, edit in enumerate(edits)]


def _parse_edit(edit: object, path: str) -> ClearToolUses:
    if not isinstance(edit, dict):
        raise _fail(f"{path}: Input should be a valid dictionary")
    if "type" not in edit:
        raise _fail(f"{path}: Unable to extract tag using discriminator 'type'")
    kind = edit["type"]
    if kind not in _EDIT_TYPES:
        expected = ", ".join(f"'{t}'" for t in _EDIT_TYPES)
        raise _fail(
            f"{path}: Input tag {kind!r} found using 'type' does not match any of the"
            f" expected tags: {expected}"
        )
    if kind != _CLEAR_TOOL_USES:
        raise _fail(f"{path}.type: {kind!r} is not supported by this scripted server")
    for key in edit:
        if key not in _CLEAR_TOOL_USES_FIELDS:
            raise _fail(f"{path}.{key}: Extra inputs are not permitted")
    trigger, trigger_value = "input_tokens", 100_000
    if "trigger" in edit:
        trigger, trigger_value = _counter(
            edit["trigger"], f"{path}.trigger", ("input_tokens", "tool_uses"), minimum=1
        )
    keep = 3
    if "keep" in edit:
        _, keep = _counter(edit["keep"], f"{path}.keep", ("tool_uses",), minimum=0)
    clear_at_least: int | None = None
    if edit.get("clear_at_least") is not None:
        _, clear_at_least = _counter(
            edit["clear_at_least"], f"{path}.clear_at_least", ("input_tokens",), minimum=0
        )
    exclude = _names(edit.get("exclude_tools"), f"{path}.exclude_tools")
    inputs = edit.get("clear_tool_inputs")
    clear_inputs: bool | frozenset[str]
    if inputs is None or isinstance(inputs, bool):
        clear_inputs = bool(inputs)
    elif isinstance(inputs, list):
        clear_inputs = _names(inputs, f"{path}.clear_tool_inputs")
    else:
        raise _fail(f"{path}.clear_tool_inputs: Input should be a valid boolean or list of strings")
    return ClearToolUses(
        trigger="tool_uses" if trigger == "tool_uses" else "input_tokens",
        trigger_value=trigger_value,
        keep=keep,
        clear_at_least=clear_at_least,
        exclude_tools=exclude,
        clear_inputs=clear_inputs,
    )


def _counter(value: object, path: str, kinds: tuple[str, ...], *, minimum: int) -> tuple[str, int]:
    """A ``{type, value}`` object such as ``trigger`` or ``keep``: its type and value."""
    if not isinstance(value, dict):
        raise _fail(f"{path}: Input should be a valid dictionary")
    kind = value.get("type")
    if kind not in kinds:
        expected = " or ".join(f"'{k}'" for k in kinds)
        raise _fail(f"{path}.type: Input should be {expected}")
    for key in value:
        if key not in ("type", "value"):
            raise _fail(f"{path}.{key}: Extra inputs are not permitted")
    if "value" not in value:
        raise _fail(f"{path}.value: Field required")
    number = value["value"]
    if not _is_int(number):
        raise _fail(f"{path}.value: Input should be a valid integer")
    if number < minimum:
        raise _fail(f"{path}.value: Input should be greater than or equal to {minimum}")
    return str(kind), int(number)


def _names(value: object, path: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list):
        raise _fail(f"{path}: Input should be a valid list")
    for k, name in enumerate(value):
        if not isinstance(name, str):
            raise _fail(f"{path}.{k}: Input should be a valid string")
    return frozenset(value)
