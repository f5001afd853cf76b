"""A streamed response put together from the SDK's raw events into a finished reply."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..core.errors import StreamInterrupted
from ..core.events import ModelRefused, TokenUsage
from ..core.wire import (
    ApiObject,
    Block,
    StopDetails,
    ToolInput,
    ToolUseBlock,
    blocks_of,
    joined_text,
)


@dataclass(frozen=True)
class ModelReply:
    """One finished response, its content already in request (param) form."""

    message_id: str
    content: list[Block]
    stop_reason: str | None
    usage: TokenUsage
    cache_miss: str | None = None
    cache_missed_tokens: int = 0
    #: What the API's context editing cleared from this request, if it did.
    cleared_tool_uses: int = 0
    cleared_tokens: int = 0
    #: The model the response names.
    model: str = ""
    #: Times the request was tried again before this answer.
    retries: int = 0
    #: The API's ``stop_details`` (a refusal's ``category`` and ``explanation``), as sent.
    stop_details: StopDetails | None = None
    #: Answered from a Message Batch, at the batch price.
    batched: bool = False

    @property
    def text(self) -> str:
        return joined_text(self.content).strip()

    @property
    def tool_uses(self) -> list[ToolUseBlock]:
        return blocks_of(self.content, "tool_use")

    @property
    def refusal(self) -> ModelRefused | None:
        """A refusal's ``stop_details`` (its agent left blank); None for any other stop."""
        if self.stop_reason != "refusal":
            return None
        details: Mapping[str, object] = self.stop_details or {}
        category, explanation = details.get("category"), details.get("explanation")
        return ModelRefused(
            "",
            category if isinstance(category, str) else "",
            " ".join(explanation.split()) if isinstance(explanation, str) else "",
        )


class ReplyBuilder:
    """Builds a :class:`ModelReply` from the SDK's raw stream events.

    The SDK's ``messages.stream()`` helper rebuilds a typed snapshot on every event and
    re-parses a tool call's partial JSON on every delta; measured on a fan-out, that was
    most of the harness's CPU. The events are the SDK's own types; only the assembly is ours.

    A block goes back in the next request exactly as the API sent it: each is taken as the
    API's JSON (field names as the API spells them, ``from`` not ``from_``; only the fields
    it sent, nulls included; fields and block types this SDK does not know kept too), and
    only what its deltas add is added to it.
    """

    def __init__(self) -> None:
        self.message_id = ""
        self.model = ""
        self.stop_reason: str | None = None
        self.stop_details: StopDetails | None = None
        #: The blocks by their index in the response (the API numbers them from 0), as the
        #: API's JSON while their deltas come in.
        self.blocks: dict[int, ApiObject] = {}
        self.json_parts: dict[int, list[str]] = {}
        self.open: set[int] = set()
        self.usage: dict[str, int] = {}
        self.cache_miss: str | None = None
        self.cache_missed_tokens = 0
        self.cleared_tool_uses = 0
        self.cleared_tokens = 0
        #: The stream's framing events seen, to say what an incomplete stream lacked.
        self.started = self.delta_seen = self.stopped = False

    def feed(self, event: Any) -> str | None:
        """Take one event; return the text it adds, if any."""
        kind = event.type
        if kind == "content_block_delta":
            delta = event.delta
            try:
                block = self.blocks[event.index]
            except KeyError:
                raise StreamInterrupted(
                    f"the response stream sent a delta for content block {event.index}, "
                    "which it never started (no content_block_start)"
                ) from None
            dtype = delta.type
            if dtype == "text_delta":
                text = cast(str, delta.text)
                block["text"] = block.get("text", "") + text
                return text
            if dtype == "input_json_delta":
                self.json_parts.setdefault(event.index, []).append(delta.partial_json)
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.thinking
            elif dtype == "signature_delta":
                block["signature"] = delta.signature
            elif dtype == "citations_delta":
                citations = block.get("citations") or []
                block["citations"] = [*citations, _as_json(delta.citation)]
            elif dtype == "compaction_delta":
                _add_compaction(block, _as_json(delta))
        elif kind == "content_block_start":
            self.open.add(event.index)
            self.blocks[event.index] = _as_json(event.content_block)
        elif kind == "content_block_stop":
            self.open.discard(event.index)
            parts = self.json_parts.pop(event.index, None)
            if parts is not None and event.index in self.blocks:
                self.blocks[event.index]["input"] = _tool_input("".join(parts))
        elif kind == "message_start":
            self.started = True
            self.message_id = event.message.id
            self.model = str(getattr(event.message, "model", "") or "")
            self._take_usage(event.message.usage)
            diagnostics = getattr(event.message, "diagnostics", None)
            reason = getattr(diagnostics, "cache_miss_reason", None)
            if reason is not None:
                self.cache_miss = str(reason.type)
                self.cache_missed_tokens = getattr(reason, "cache_missed_input_tokens", 0) or 0
        elif kind == "message_delta":
            self.delta_seen = True
            self.stop_reason = event.delta.stop_reason
            details = getattr(event.delta, "stop_details", None)
            if details is not None:
                self.stop_details = cast(StopDetails, _as_json(details))  # the API's own
            self._take_usage(event.usage)
            managed = getattr(event, "context_management", None)
            for edit in getattr(managed, "applied_edits", None) or []:
                self.cleared_tool_uses += getattr(edit, "cleared_tool_uses", 0) or 0
                self.cleared_tokens += getattr(edit, "cleared_input_tokens", 0) or 0
        elif kind == "message_stop":
            self.stopped = True
        return None

    def _take_usage(self, usage: Any) -> None:
        # message_delta carries cumulative totals: they replace, and absent ones keep theirs.
        for field_name in _USAGE:
            value = getattr(usage, field_name, None)
            if value is not None:
                self.usage[field_name] = value
        hour = getattr(getattr(usage, "cache_creation", None), _HOUR_WRITES, None)
        if isinstance(hour, int):
            self.usage[_HOUR_WRITES] = hour
        server = getattr(usage, "server_tool_use", None)
        for field_name in _SERVER_USES:
            value = getattr(server, field_name, None)
            if isinstance(value, int):
                self.usage[field_name] = value

    def missing(self) -> str | None:
        """What the stream lacked to be a whole response, in the API's own terms; None when
        nothing did."""
        if not self.started or not self.message_id:
            return "without a message_start (no message id)"
        if self.open:
            index = min(self.open)
            kind = self.blocks[index].get("type", "?")
            return f"inside content block {index} ({kind}), before its content_block_stop"
        if not self.delta_seen:
            also = "" if self.stopped else " or message_stop"
            return f"without a message_delta{also} (no stop reason or final usage)"
        if self.stop_reason is None:
            return "with a message_delta that gave no stop reason"
        return None

    def reply(self) -> ModelReply:
        ordered = (self.blocks[i] for i in sorted(self.blocks))
        content = [b for b in map(_request_block, ordered) if b is not None]
        usage = TokenUsage(
            input_tokens=self.usage.get("input_tokens", 0),
            output_tokens=self.usage.get("output_tokens", 0),
            cache_read_tokens=self.usage.get("cache_read_input_tokens", 0),
            cache_write_tokens=self.usage.get("cache_creation_input_tokens", 0),
            cache_write_1h_tokens=self.usage.get(_HOUR_WRITES, 0),
            web_search_requests=self.usage.get("web_search_requests", 0),
            web_fetch_requests=self.usage.get("web_fetch_requests", 0),
        )
        return ModelReply(
            self.message_id,
            content,
            self.stop_reason,
            usage,
            self.cache_miss,
            self.cache_missed_tokens,
            self.cleared_tool_uses,
            self.cleared_tokens,
            self.model,
            stop_details=self.stop_details,
        )


def reply_of_message(message: Any) -> ModelReply:
    """A whole response (a batch's result, as the API's JSON) as the reply its stream
    would have made."""
    builder = ReplyBuilder()
    builder.started = builder.delta_seen = builder.stopped = True
    builder.message_id = str(message.get("id", ""))
    builder.model = str(message.get("model", "") or "")
    builder.stop_reason = message.get("stop_reason")
    details = message.get("stop_details")
    builder.stop_details = cast(StopDetails, dict(details)) if isinstance(details, dict) else None
    usage = message.get("usage") or {}
    builder.usage = {name: int(usage[name]) for name in _USAGE if isinstance(usage.get(name), int)}
    hour = (usage.get("cache_creation") or {}).get(_HOUR_WRITES)
    if isinstance(hour, int):
        builder.usage[_HOUR_WRITES] = hour
    server = usage.get("server_tool_use") or {}
    builder.usage.update({n: server[n] for n in _SERVER_USES if isinstance(server.get(n), int)})
    content = message.get("content") or []
    builder.blocks = {i: dict(block) for i, block in enumerate(content) if isinstance(block, dict)}
    return builder.reply()


_USAGE = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
#: The server tools' uses (``usage.server_tool_use``): a web search is billed per use.
_SERVER_USES = ("web_search_requests", "web_fetch_requests")
#: Of the cache writes (``usage.cache_creation``), those kept an hour.
_HOUR_WRITES = "ephemeral_1h_input_tokens"


def _as_json(value: Any) -> ApiObject:
    """An SDK object as the API's JSON: its fields by the API's names, only those the API
    sent (an explicit null kept), fields the SDK does not declare kept as they came."""
    if isinstance(value, dict):
        return dict(value)
    return cast(
        ApiObject,
        value.model_dump(mode="json", by_alias=True, exclude_unset=True, warnings=False),
    )


def _add_compaction(block: ApiObject, delta: ApiObject) -> None:
    """A ``compaction_delta`` into its block: the summary (``content``) is streamed in
    pieces and joined; ``encrypted_content`` is opaque, so the latest one sent stands."""
    piece = delta.get("content")
    if isinstance(piece, str):
        block["content"] = (block.get("content") or "") + piece
    secret = delta.get("encrypted_content")
    if secret is not None:
        block["encrypted_content"] = secret


def _tool_input(raw: str) -> ToolInput:
    """A tool call's input; malformed JSON is kept visibly so the tool can say what is wrong."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_unparsed_input": raw}
    return value if isinstance(value, dict) else {"_unparsed_input": raw}


def _request_block(block: ApiObject) -> Block | None:
    """A response block as the next request sends it back: as it came, except that a text
    block with no visible text, which the API refuses in a request, is left out."""
    if block.get("type") == "text" and not str(block.get("text", "")).strip():
        return None
    return cast(Block, block)  # the API's own block, whatever its type
