"""One finalised reply rendered as the Messages API's ``Message`` body or its streamed events.

The shapes here are the API's own (usage, stop fields, content-block deltas), kept apart
from the HTTP server so that what is said can be read without how it is sent: the server
frames these events as SSE or Bedrock event-stream bytes.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Literal, NotRequired, TypeAlias

from typing_extensions import TypedDict

from ..core.wire import TextBlock, ThinkingBlock
from .cache import CacheUsage, Diagnostics
from .replies import (
    ContextManagementReply,
    Reply,
    ScriptedBlock,
    ScriptedServerToolUse,
    ScriptedToolUse,
)


class CountedTokens(TypedDict):
    """``count_tokens``'s answer; ``context_management`` when context edits applied."""

    input_tokens: int
    context_management: NotRequired[dict[str, int]]


class CacheCreation(TypedDict):
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class ServerToolUse(TypedDict):
    """``usage.server_tool_use``: the reply's searches and fetches (a search is billed)."""

    web_search_requests: int
    web_fetch_requests: int


class Usage(TypedDict):
    """A message's ``usage`` as ``message_start`` and the non-streaming body carry it."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation: CacheCreation
    output_tokens: int
    service_tier: str
    server_tool_use: NotRequired[ServerToolUse]


class DeltaUsage(TypedDict):
    """The cumulative counts ``message_delta`` ends a stream with."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int
    server_tool_use: NotRequired[ServerToolUse]


class RefusalDetails(TypedDict):
    type: Literal["refusal"]
    category: str | None
    explanation: str | None


class StopFields(TypedDict, closed=True):
    """Closed: spread into a message body, it can bring no key besides these."""

    stop_reason: str
    stop_sequence: None
    stop_details: NotRequired[RefusalDetails]


class MessageBody(TypedDict):
    """The ``Message`` object: a non-streaming answer, or ``message_start``'s opening one."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ScriptedBlock]
    stop_reason: str | None
    stop_sequence: None
    stop_details: NotRequired[RefusalDetails]
    usage: Usage
    diagnostics: NotRequired[Diagnostics]
    context_management: NotRequired[ContextManagementReply]


class MessageStart(TypedDict):
    type: Literal["message_start"]
    message: MessageBody


class ContentBlockStart(TypedDict):
    type: Literal["content_block_start"]
    index: int
    content_block: ScriptedBlock


class TextDelta(TypedDict):
    type: Literal["text_delta"]
    text: str


class InputJsonDelta(TypedDict):
    type: Literal["input_json_delta"]
    partial_json: str


class ThinkingDelta(TypedDict):
    type: Literal["thinking_delta"]
    thinking: str


class SignatureDelta(TypedDict):
    type: Literal["signature_delta"]
    signature: str


class ContentBlockDelta(TypedDict):
    type: Literal["content_block_delta"]
    index: int
    delta: TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta


class ContentBlockStop(TypedDict):
    type: Literal["content_block_stop"]
    index: int


class MessageDelta(TypedDict):
    type: Literal["message_delta"]
    delta: StopFields
    usage: DeltaUsage
    context_management: NotRequired[ContextManagementReply]


class InvocationMetrics(TypedDict):
    inputTokenCount: int
    outputTokenCount: int | None
    invocationLatency: int
    firstByteLatency: int


#: The stream's last event; Bedrock adds its metrics to it (a key no identifier can name).
MessageStop = TypedDict(
    "MessageStop",
    {
        "type": Literal["message_stop"],
        "amazon-bedrock-invocationMetrics": NotRequired[InvocationMetrics],
    },
)


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorBody(TypedDict):
    """The API's error: an HTTP error's body (with ``request_id``) or a stream's ``error``
    event (without)."""

    type: Literal["error"]
    error: ErrorDetail
    request_id: NotRequired[str]


#: One streamed event's data.
StreamEvent: TypeAlias = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | ErrorBody
)


class LoggedAnswer(TypedDict):
    """What the request log keeps of an answer (fields of its ``LoggedRequest``)."""

    reply: Reply
    message_id: str
    usage: CacheUsage
    context_management: ContextManagementReply | None


def _usage(cache: CacheUsage, output_tokens: int) -> Usage:
    return {
        "input_tokens": cache.input_tokens,
        "cache_creation_input_tokens": cache.cache_creation_input_tokens,
        "cache_read_input_tokens": cache.cache_read_input_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": cache.ephemeral_5m_input_tokens,
            "ephemeral_1h_input_tokens": cache.ephemeral_1h_input_tokens,
        },
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def _stop_fields(stop_reason: str) -> StopFields:
    fields: StopFields = {"stop_reason": stop_reason, "stop_sequence": None}
    if stop_reason == "refusal":
        fields["stop_details"] = {"type": "refusal", "category": None, "explanation": None}
    return fields


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass(frozen=True)
class _Answer:
    """Everything needed to render one reply, streamed or not."""

    message_id: str
    model: str
    reply: Reply  # finalised
    cache: CacheUsage
    diagnostics: Diagnostics | None
    context_management: ContextManagementReply | None

    def logged(self) -> LoggedAnswer:
        """What the request log keeps of this answer."""
        return {
            "reply": self.reply,
            "message_id": self.message_id,
            "usage": self.cache,
            "context_management": copy.deepcopy(self.context_management),
        }

    def server_tool_use(self) -> ServerToolUse | None:
        """The reply's server tool uses, counted as the API counts them; None with none."""
        names = [b.get("name") for b in self.reply.content if b["type"] == "server_tool_use"]
        if not names:
            return None
        return {
            "web_search_requests": names.count("web_search"),
            "web_fetch_requests": names.count("web_fetch"),
        }

    def message(self) -> MessageBody:
        """The non-streaming ``Message`` body."""
        assert self.reply.output_tokens is not None and self.reply.stop_reason is not None
        body: MessageBody = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.reply.content,
            **_stop_fields(self.reply.stop_reason),
            "usage": _usage(self.cache, self.reply.output_tokens),
        }
        uses = self.server_tool_use()
        if uses is not None:
            body["usage"]["server_tool_use"] = uses
        if self.diagnostics is not None:
            body["diagnostics"] = self.diagnostics
        if self.context_management is not None:
            body["context_management"] = self.context_management
        return body

    def events(self, chunk_size: int) -> list[tuple[str, StreamEvent]]:
        """The SSE events (without pings), in the order the API sends them."""
        assert self.reply.output_tokens is not None and self.reply.stop_reason is not None
        start: MessageBody = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(self.cache, 1),
        }
        if self.diagnostics is not None:
            # Delta has no diagnostics field; the SDK keeps message_start's message.
            start["diagnostics"] = self.diagnostics
        events: list[tuple[str, StreamEvent]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for index, block in enumerate(self.reply.content):
            events.extend(_block_events(index, block, chunk_size))
        usage: DeltaUsage = {
            "input_tokens": self.cache.input_tokens,
            "cache_creation_input_tokens": self.cache.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache.cache_read_input_tokens,
            "output_tokens": self.reply.output_tokens,
        }
        uses = self.server_tool_use()
        if uses is not None:
            usage["server_tool_use"] = uses
        delta: MessageDelta = {
            "type": "message_delta",
            "delta": _stop_fields(self.reply.stop_reason),
            "usage": usage,
        }
        if self.context_management is not None:
            # The API reports applied edits on the final delta, not on message_start.
            delta["context_management"] = self.context_management
        events.append(("message_delta", delta))
        events.append(("message_stop", {"type": "message_stop"}))
        return events


def _block_events(
    index: int, block: ScriptedBlock, chunk_size: int
) -> list[tuple[str, StreamEvent]]:
    def delta(
        payload: TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta,
    ) -> tuple[str, StreamEvent]:
        body: ContentBlockDelta = {"type": "content_block_delta", "index": index, "delta": payload}
        return ("content_block_delta", body)

    deltas: list[tuple[str, StreamEvent]]
    opening: ScriptedBlock
    if block["type"] == "text":
        opening = TextBlock(type="text", text="")
        deltas = [
            delta({"type": "text_delta", "text": c}) for c in _chunks(block["text"], chunk_size)
        ]
    elif block["type"] == "tool_use":
        opening = ScriptedToolUse(type="tool_use", id=block["id"], name=block["name"], input={})
        encoded = json.dumps(block["input"], ensure_ascii=False)
        # Short inputs still arrive in several pieces, as they do from the API.
        size = max(1, min(chunk_size, math.ceil(len(encoded) / 3)))
        deltas = [
            delta({"type": "input_json_delta", "partial_json": c}) for c in _chunks(encoded, size)
        ]
    elif block["type"] == "server_tool_use":
        # The API streams a server tool's input as a tool call's, from an empty one.
        opening = ScriptedServerToolUse(
            type="server_tool_use", id=block["id"], name=block["name"], input={}
        )
        encoded = json.dumps(block["input"], ensure_ascii=False)
        deltas = [delta({"type": "input_json_delta", "partial_json": encoded})]
    elif block["type"] != "thinking":
        opening, deltas = block, []  # a server tool's result comes whole, with no deltas
    else:
        opening = ThinkingBlock(type="thinking", thinking="", signature="")
        deltas = [
            delta({"type": "thinking_delta", "thinking": c})
            for c in _chunks(block["thinking"], chunk_size)
        ]
        deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    start: ContentBlockStart = {
        "type": "content_block_start",
        "index": index,
        "content_block": opening,
    }
    stop: ContentBlockStop = {"type": "content_block_stop", "index": index}
    return [("content_block_start", start), *deltas, ("content_block_stop", stop)]
