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

from ..core.wire import JsonObject
from .cache import CacheUsage
from .replies import Reply


def _usage(cache: CacheUsage, output_tokens: int) -> JsonObject:
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


def _stop_fields(stop_reason: str) -> JsonObject:
    fields: JsonObject = {"stop_reason": stop_reason, "stop_sequence": None}
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
    diagnostics: JsonObject | None
    context_management: JsonObject | None

    def logged(self) -> JsonObject:
        """What the request log keeps of this answer."""
        return {
            "reply": self.reply,
            "message_id": self.message_id,
            "usage": self.cache,
            "context_management": copy.deepcopy(self.context_management),
        }

    def message(self) -> JsonObject:
        """The non-streaming ``Message`` body."""
        assert self.reply.output_tokens is not None and self.reply.stop_reason is not None
        body: JsonObject = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.reply.content,
            **_stop_fields(self.reply.stop_reason),
            "usage": _usage(self.cache, self.reply.output_tokens),
        }
        if self.diagnostics is not None:
            body["diagnostics"] = self.diagnostics
        if self.context_management is not None:
            body["context_management"] = self.context_management
        return body

    def events(self, chunk_size: int) -> list[tuple[str, JsonObject]]:
        """The SSE events (without pings), in the order the API sends them."""
        assert self.reply.output_tokens is not None and self.reply.stop_reason is not None
        start: JsonObject = {
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
        events: list[tuple[str, JsonObject]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for index, block in enumerate(self.reply.content):
            events.extend(_block_events(index, block, chunk_size))
        usage = {
            "input_tokens": self.cache.input_tokens,
            "cache_creation_input_tokens": self.cache.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache.cache_read_input_tokens,
            "output_tokens": self.reply.output_tokens,
        }
        delta: JsonObject = {
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


def _block_events(index: int, block: JsonObject, chunk_size: int) -> list[tuple[str, JsonObject]]:
    def delta(payload: JsonObject) -> tuple[str, JsonObject]:
        body = {"type": "content_block_delta", "index": index, "delta": payload}
        return ("content_block_delta", body)

    kind = block["type"]
    deltas: list[tuple[str, JsonObject]]
    if kind == "text":
        opening: JsonObject = {"type": "text", "text": ""}
        deltas = [
            delta({"type": "text_delta", "text": c}) for c in _chunks(block["text"], chunk_size)
        ]
    elif kind == "tool_use":
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        encoded = json.dumps(block["input"], ensure_ascii=False)
        # Short inputs still arrive in several pieces, as they do from the API.
        size = max(1, min(chunk_size, math.ceil(len(encoded) / 3)))
        deltas = [
            delta({"type": "input_json_delta", "partial_json": c}) for c in _chunks(encoded, size)
        ]
    else:  # thinking
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            delta({"type": "thinking_delta", "thinking": c})
            for c in _chunks(block["thinking"], chunk_size)
        ]
        deltas.append(delta({"type": "signature_delta", "signature": block["signature"]}))
    start = {"type": "content_block_start", "index": index, "content_block": opening}
    stop = {"type": "content_block_stop", "index": index}
    return [("content_block_start", start), *deltas, ("content_block_stop", stop)]
