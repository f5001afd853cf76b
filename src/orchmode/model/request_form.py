"""A request written as the provider's endpoint takes it: cache breakpoints, notices, fields.

On Amazon Bedrock and Google Vertex AI (see :mod:`orchmode.model.providers`) what the
endpoint is not known to take is left out or sent in a form it does take.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from ..core.prompts import notice_as_user_text
from ..core.wire import Block, Message, joined_text
from .providers import Capabilities

#: A 5-minute cache breakpoint, as the API spells it.
EPHEMERAL: Any = {"type": "ephemeral"}
#: A breakpoint kept an hour: a batched request's prefix outlives the wait for its batch.
HOUR_BREAKPOINT: Any = {"type": "ephemeral", "ttl": "1h"}
#: The beta that carries the API's own context editing (``context_management``).
CONTEXT_BETA = "context-management-2025-06-27"

_BREAKPOINT_BLOCKS = frozenset({"text", "tool_result", "tool_use", "image", "document"})


def wire_messages(
    messages: Sequence[Message], caps: Capabilities, *, breakpoint: bool = False
) -> list[Message]:
    """The messages as this provider takes them: system notices folded into the user
    turn where it takes none, and the prompt cache's breakpoint on the last message
    where top-level ``cache_control`` is not known to work."""
    wire = list(messages) if caps.system_messages else fold_system_messages(messages)
    if breakpoint and not caps.automatic_caching:
        wire = with_breakpoint(wire)
    return wire


def optional_fields(
    caps: Capabilities, previous_message_id: str | None, effort: str
) -> dict[str, object]:
    """The request fields only some providers take; the body version some require."""
    fields: dict[str, object] = {}
    if caps.effort:
        fields["output_config"] = {"effort": effort}
    if caps.automatic_caching:
        fields["cache_control"] = EPHEMERAL
    if caps.cache_diagnostics:
        fields["diagnostics"] = {"previous_message_id": previous_message_id}
    if caps.body_version is not None:
        fields["extra_body"] = {"anthropic_version": caps.body_version}
    return fields


def with_breakpoint(messages: list[Message]) -> list[Message]:
    """The last message with a cache breakpoint on its last block: the same prefix caching
    the top-level ``cache_control`` asks for, in the form every platform documents. Only
    the request's copy is marked; the history is not touched."""
    if not messages:
        return messages
    last = messages[-1]
    content = last.get("content")
    if isinstance(content, str):
        if not content.strip():
            return messages
        blocks: list[Block] = [{"type": "text", "text": content}]
    elif isinstance(content, list) and content and isinstance(content[-1], dict):
        blocks = list(content)
    else:
        return messages
    if blocks[-1].get("type") not in _BREAKPOINT_BLOCKS:
        return messages
    blocks[-1] = cast(Block, {**blocks[-1], "cache_control": EPHEMERAL})
    return [*messages[:-1], {**last, "content": blocks}]


def fold_system_messages(messages: Sequence[Message]) -> list[Message]:
    """``system`` messages folded into the user turn before them, as user-text notices.

    For an endpoint that takes none: a history recorded with system notices (a session
    begun on the Messages API, resumed here) is still sent in a form it accepts.
    """
    folded: list[Message] = []
    for message in messages:
        if message.get("role") != "system":
            folded.append(message)
            continue
        notice = notice_as_user_text(joined_text(message.get("content"), "\n"))
        previous = folded[-1] if folded else None
        if previous is None or previous.get("role") != "user":
            folded.append({"role": "user", "content": notice.lstrip()})
            continue
        content = previous.get("content")
        if isinstance(content, str):
            folded[-1] = {**previous, "content": content + notice}
        else:
            blocks = list(content) if isinstance(content, list) else []
            folded[-1] = {**previous, "content": [*blocks, {"type": "text", "text": notice}]}
    return folded
