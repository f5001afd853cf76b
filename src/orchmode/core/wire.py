"""The Messages API's wire data as orchmode keeps it: one name for a message, one for a block.

A conversation is saved, resumed, compacted and sent as the API's own JSON, and read back
from disk, so messages and content blocks stay plain JSON objects rather than the SDK's
``MessageParam`` TypedDicts (which a stubbed or restored block would have to be rebuilt
into). A block's ``type`` is read only through the helpers below, and they take anything,
because what comes from disk may be malformed.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias, TypeGuard

#: One content block: ``{"type": "text", "text": ...}``, ``tool_use``, ``tool_result``, …
Block: TypeAlias = dict[str, Any]
#: One message: ``{"role": "user" | "assistant", "content": str | list[Block]}``.
Message: TypeAlias = dict[str, Any]
#: The block kinds orchmode itself reads or writes.
BlockKind: TypeAlias = Literal["text", "tool_use", "tool_result", "thinking"]


def is_block(value: object, kind: BlockKind) -> TypeGuard[Block]:
    """Whether ``value`` is a content block of ``kind``."""
    return isinstance(value, dict) and value.get("type") == kind


def blocks_of(content: object, kind: BlockKind) -> list[Block]:
    """The blocks of ``kind`` in a message's content, in order; none when the content is a
    string or not a list at all."""
    if not isinstance(content, list):
        return []
    return [block for block in content if is_block(block, kind)]


def has_block(content: object, kind: BlockKind) -> bool:
    """Whether a message's content holds a block of ``kind``."""
    return isinstance(content, list) and any(is_block(block, kind) for block in content)


def joined_text(content: object, separator: str = "\n\n") -> str:
    """The text blocks of a message's content joined as one reply (a string is its own)."""
    if isinstance(content, str):
        return content
    return separator.join(str(block.get("text", "")) for block in blocks_of(content, "text"))
