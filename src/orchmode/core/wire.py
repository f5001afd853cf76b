"""The Messages API's wire data as orchmode keeps it: messages and content blocks, typed.

A conversation is saved, resumed, compacted and sent as the API's own JSON, so a message
and a block are TypedDicts over plain dicts: typing costs nothing at run time, and a block
goes back to the API with exactly the keys, order and unknown fields it came with. The
SDK's ``MessageParam`` family is not used because its ``Iterable`` fields cannot be read
twice and cannot be checked without being consumed, and a history is both re-sent and
checked on the way back from disk.

What orchmode reads of a block (text, tool calls, their results, thinking) is declared; any
other block (``compaction``, ``redacted_thinking``, a server tool's, one this version does not
know) is an :class:`OtherBlock` that keeps its fields. :data:`HISTORY` checks a recorded
history on restore, the one place a message arrives untyped.

JSON whose fields are someone else's to define (a tool's input, a schema, a body not yet
validated) is named for its kind, so a signature says which free-form JSON it takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    TypeAlias,
    TypeGuard,
    overload,
)

from pydantic import ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

# The free-form kinds: JSON whose fields orchmode does not declare, because someone else
# defines them. Underneath each is a plain dict of Any; the name says who that someone is.

#: A tool call's ``input``: its fields are whatever the tool's own schema asks for.
ToolInput: TypeAlias = dict[str, Any]
#: A JSON schema (a tool's ``input_schema``, a typed subtask's ``data``): its keywords are
#: JSON Schema's, for ``jsonschema`` and the model to read.
JsonSchema: TypeAlias = dict[str, Any]
#: A JSON object as it came over HTTP, before validation has said what it is: a request
#: body, or a part of one that the checks are still reading.
UncheckedJson: TypeAlias = dict[str, Any]
#: An object of the API's passed along as it came (a citation, a response block while its
#: deltas arrive, a recorded stream's event): its fields are the API's to define.
ApiObject: TypeAlias = dict[str, Any]
#: A JSON object orchmode writes out for people and other programs and never reads back:
#: an event record for ``--json``, an agent's answer to an orchestration script.
JsonRecord: TypeAlias = dict[str, Any]

#: Who speaks; ``system`` is a note orchmode adds mid-conversation (folded into the next
#: user message for endpoints without it).
Role: TypeAlias = Literal["user", "assistant", "system"]
#: The block kinds orchmode itself reads or writes.
BlockKind: TypeAlias = Literal["text", "tool_use", "tool_result", "thinking"]

_KEEP_UNKNOWN = ConfigDict(extra="allow")


class CacheControl(TypedDict):
    type: Literal["ephemeral"]
    ttl: NotRequired[str]


@with_config(_KEEP_UNKNOWN)
class TextBlock(TypedDict, total=False):
    type: Required[Literal["text"]]
    text: Required[str]
    citations: list[ApiObject] | None
    cache_control: CacheControl


@with_config(_KEEP_UNKNOWN)
class ToolUseBlock(TypedDict, total=False):
    type: Required[Literal["tool_use"]]
    id: Required[str]
    name: Required[str]
    input: Required[ToolInput]
    cache_control: CacheControl


@with_config(_KEEP_UNKNOWN)
class ToolResultBlock(TypedDict, total=False):
    type: Required[Literal["tool_result"]]
    tool_use_id: Required[str]
    content: str | list[Block]
    is_error: bool
    cache_control: CacheControl


@with_config(_KEEP_UNKNOWN)
class ThinkingBlock(TypedDict, total=False):
    type: Required[Literal["thinking"]]
    thinking: Required[str]
    signature: str


@with_config(_KEEP_UNKNOWN)
class OtherBlock(TypedDict, total=False):
    """Any block orchmode passes along without reading it."""

    type: Required[str]


def _block_kind(value: object) -> str:
    kind = value.get("type") if isinstance(value, Mapping) else None
    return kind if kind in _DECLARED else "other"


_DECLARED = frozenset(("text", "tool_use", "tool_result", "thinking"))

#: One content block, told apart by its ``type``.
Block: TypeAlias = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]


@with_config(_KEEP_UNKNOWN)
class Message(TypedDict):
    role: Role
    content: str | list[Block]


class ToolSchema(TypedDict, total=False):
    """A tool as a request offers it: a custom tool's ``input_schema``, or a server tool's
    ``type`` (``bash_20250124``)."""

    name: Required[str]
    type: str
    description: str
    input_schema: JsonSchema
    cache_control: CacheControl


class StopDetails(TypedDict, total=False):
    """What a response adds to its ``stop_reason``: a refusal's policy ``category`` and
    ``explanation``, either of which the API may leave null."""

    type: Required[str]
    category: str | None
    explanation: str | None


class _Amount(TypedDict):
    type: str
    value: int


class ContextEdit(TypedDict):
    """The one context edit orchmode asks for (beta ``context_management``): clear old tool
    uses once the input passes ``trigger``, keeping the last ``keep``. Declared here, as the
    SDK's ``BetaClearToolUses20250919EditParam`` is: importing the SDK's types makes type
    checking of pydantic validators elsewhere go astray."""

    type: Literal["clear_tool_uses_20250919"]
    trigger: _Amount
    keep: _Amount
    clear_at_least: _Amount


class DiagnosticsParam(TypedDict, total=False):
    previous_message_id: str | None


class MessagesRequest(TypedDict, total=False):
    """A Messages API request body that has passed the API's checks: the fields read from
    it are declared, any other (``temperature``, ``metadata``, ...) passes along unread."""

    model: Required[str]
    messages: Required[list[Message]]
    max_tokens: int
    stream: bool
    system: str | list[TextBlock]
    tools: list[ToolSchema]
    cache_control: CacheControl
    diagnostics: DiagnosticsParam | None
    #: Checked on its own, after the body (it needs the request's beta headers too).
    context_management: UncheckedJson | None


#: A recorded history: checked once on restore, leniently (unknown fields and block types
#: kept), so every history an earlier version recorded still loads.
HISTORY: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
#: One message as a checkpoint records it.
MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)


def read_history(value: object) -> list[Message]:
    """``value`` (parsed JSON) as a history, or a one-line ``ValueError`` saying where it is
    not one.

    The checked copy is thrown away: it would put keys in declared order, and a restored
    history has to be sent with the bytes it was recorded with (the prompt cache is keyed
    on them).
    """
    try:
        HISTORY.validate_python(value)
    except ValidationError as exc:
        # The deepest complaint names the field; the shallow ones only the union it is in.
        worst = max(exc.errors(), key=lambda error: len(error["loc"]))
        where = ".".join(str(part) for part in worst["loc"] if "[" not in str(part))
        raise ValueError(
            f"history is not a list of messages ({where or 'the whole'}: {worst['msg']})"
        ) from None
    return value  # type: ignore[return-value]  # just checked


def message_json(message: Message) -> str:
    """One message as recorded (UTF-8 JSON, keys in the order they were built)."""
    return MESSAGE.dump_json(message).decode()


@overload
def is_block(value: object, kind: Literal["text"]) -> TypeGuard[TextBlock]: ...
@overload
def is_block(value: object, kind: Literal["tool_use"]) -> TypeGuard[ToolUseBlock]: ...
@overload
def is_block(value: object, kind: Literal["tool_result"]) -> TypeGuard[ToolResultBlock]: ...
@overload
def is_block(value: object, kind: Literal["thinking"]) -> TypeGuard[ThinkingBlock]: ...
def is_block(value: object, kind: BlockKind) -> bool:
    """Whether ``value`` is a content block of ``kind``."""
    return isinstance(value, dict) and value.get("type") == kind


@overload
def blocks_of(content: object, kind: Literal["text"]) -> list[TextBlock]: ...
@overload
def blocks_of(content: object, kind: Literal["tool_use"]) -> list[ToolUseBlock]: ...
@overload
def blocks_of(content: object, kind: Literal["tool_result"]) -> list[ToolResultBlock]: ...
@overload
def blocks_of(content: object, kind: Literal["thinking"]) -> list[ThinkingBlock]: ...
def blocks_of(content: object, kind: BlockKind) -> list[Any]:
    """The blocks of ``kind`` in a message's content, in order; none when the content is a
    string or not a list at all."""
    if not isinstance(content, list):
        return []
    return [block for block in content if is_block(block, kind)]


def has_block(content: object, kind: BlockKind) -> bool:
    """Whether a message's content holds a block of ``kind``."""
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == kind for block in content
    )


def joined_text(content: object, separator: str = "\n\n") -> str:
    """The text blocks of a message's content joined as one reply (a string is its own)."""
    if isinstance(content, str):
        return content
    return separator.join(str(block.get("text", "")) for block in blocks_of(content, "text"))
