"""What a responder sees and says: the request, its Reply or Fault, and the request log entries.

These are the scripted server's public vocabulary, the part a test writes against; they
know nothing of HTTP, so a responder (or :mod:`.faults`, :mod:`.scenario`) can be built
and checked without a server.
"""

from __future__ import annotations

import copy
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, NotRequired, Required, TypeAlias, TypedDict, cast, get_args

from ..core.events import TokenUsage
from ..core.wire import (
    ApiObject,
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolInput,
    ToolResultBlock,
    ToolSchema,
    UncheckedJson,
    blocks_of,
)
from .batch_fate import BatchFate
from .cache import AppliedEdit, CacheUsage, estimate_tokens

__all__ = [
    "Fault",
    "FaultKind",
    "LoggedRequest",
    "Recorded",
    "Reply",
    "Responder",
    "ScriptedBlock",
    "ScriptedRequest",
    "StopReason",
]

StopReason = Literal[
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
    "compaction",
]
FaultKind = Literal["overloaded", "rate_limit", "server_error", "drop", "sse_error"]

_STOP_REASONS = frozenset(get_args(StopReason))
_FAULT_KINDS = frozenset(get_args(FaultKind))
#: A server tool's result blocks, which a scripted reply may hold after its ``server_tool_use``.
_SERVER_RESULTS = frozenset({"web_search_tool_result", "web_fetch_tool_result"})
_BLOCK_TYPES = frozenset({"text", "tool_use", "thinking", "server_tool_use", *_SERVER_RESULTS})


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(18).replace('-', 'A').replace('_', 'B')}"


class ScriptedToolUse(TypedDict, total=False):
    """A scripted tool call: its ``id`` is made up when the script gives none."""

    type: Required[Literal["tool_use"]]
    id: str
    name: Required[str]
    input: Required[ToolInput]


class ScriptedServerToolUse(TypedDict, total=False):
    """A scripted use of a server tool (``web_search``): its ``id`` is made up when absent."""

    type: Required[Literal["server_tool_use"]]
    id: str
    name: Required[str]
    input: Required[ToolInput]


class ScriptedServerResult(TypedDict, total=False):
    """A server tool's result: ``tool_use_id`` is the ``server_tool_use`` before it, when the
    script gives none."""

    type: Required[Literal["web_search_tool_result", "web_fetch_tool_result"]]
    tool_use_id: str
    content: Required[Any]


#: A block a scripted reply holds (a thinking block's ``signature`` is made up if absent).
ScriptedBlock: TypeAlias = (
    TextBlock | ScriptedToolUse | ThinkingBlock | ScriptedServerToolUse | ScriptedServerResult
)


#: A response's ``context_management``: its one key, ``applied_edits``, lists the context
#: edits the request had applied. (A plain dict: the server builds it as a bare literal.)
ContextManagementReply: TypeAlias = dict[str, list[AppliedEdit]]


@dataclass
class Reply:
    """What the scripted model answers: API content blocks plus stop reason and pacing.

    ``content`` holds ``text``, ``tool_use`` (``id`` optional) and ``thinking`` blocks.
    ``delay`` is waited (asynchronously) before the response starts; ``event_delay``
    between streamed events, to simulate a token rate.
    """

    content: list[ScriptedBlock]
    stop_reason: str | None = None
    delay: float = 0.0
    output_tokens: int | None = None
    event_delay: float = 0.0

    def __post_init__(self) -> None:
        """Reject malformed scripts at construction, where the mistake is."""
        for i, block in enumerate(self.content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in _BLOCK_TYPES:
                raise ValueError(f"Reply.content[{i}]: type must be one of {sorted(_BLOCK_TYPES)}")
            if kind == "text" and not isinstance(block.get("text"), str):
                raise ValueError(f"Reply.content[{i}]: text block needs a str 'text'")
            if kind == "tool_use" and (
                not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict)
            ):
                raise ValueError(f"Reply.content[{i}]: tool_use needs str 'name', dict 'input'")
            if kind == "thinking" and not isinstance(block.get("thinking"), str):
                raise ValueError(f"Reply.content[{i}]: thinking block needs a str 'thinking'")
            if kind == "server_tool_use" and (
                block.get("name") not in ("web_search", "web_fetch")
                or not isinstance(block.get("input"), dict)
            ):
                raise ValueError(
                    f"Reply.content[{i}]: server_tool_use needs name web_search or web_fetch "
                    "and a dict 'input'"
                )
            if kind in _SERVER_RESULTS and "content" not in block:
                raise ValueError(f"Reply.content[{i}]: {kind} needs its 'content'")
        if self.stop_reason is not None and self.stop_reason not in _STOP_REASONS:
            raise ValueError(f"Reply.stop_reason must be one of {sorted(_STOP_REASONS)}")

    @classmethod
    def text(cls, text: str, **kwargs: Any) -> Reply:
        """A plain text answer."""
        return cls([{"type": "text", "text": text}], **kwargs)

    @classmethod
    def tool_use(
        cls,
        name: str,
        input: ToolInput,
        *,
        id: str | None = None,
        preamble: str | None = None,
        **kwargs: Any,
    ) -> Reply:
        """A single tool call, optionally preceded by some text."""
        block: ScriptedToolUse = {"type": "tool_use", "name": name, "input": input}
        if id is not None:
            block["id"] = id
        content: list[ScriptedBlock] = [{"type": "text", "text": preamble}] if preamble else []
        return cls([*content, block], **kwargs)

    @property
    def effective_stop_reason(self) -> str:
        """``stop_reason`` or the API's default for this content."""
        if self.stop_reason is not None:
            return self.stop_reason
        has_tool = any(b.get("type") == "tool_use" for b in self.content)
        return "tool_use" if has_tool else "end_turn"

    def finalised(self) -> Reply:
        """A deep copy with tool_use ids, stop reason and output tokens filled in."""
        content: list[ScriptedBlock] = []
        server_id = ""
        for block in copy.deepcopy(self.content):
            if block["type"] == "tool_use":
                tool_id = block.pop("id", None) or _new_id("toolu")
                block = {"type": "tool_use", "id": tool_id, **block}
            elif block["type"] == "thinking":
                block.setdefault("signature", _new_id("sig"))
            elif block["type"] == "server_tool_use":
                server_id = str(block.pop("id", "")) or _new_id("srvtoolu")
                block = {"type": "server_tool_use", "id": server_id, **block}
            elif block["type"] in _SERVER_RESULTS:
                used = block.get("tool_use_id") or server_id
                block = cast(ScriptedBlock, {"type": block["type"], **block, "tool_use_id": used})
            content.append(block)
        tokens = self.output_tokens
        if tokens is None:
            tokens = max(1, estimate_tokens(content))
        return replace(
            self, content=content, stop_reason=self.effective_stop_reason, output_tokens=tokens
        )


#: What a cut stream carries when its fault names no ``partial`` reply.
_INTERRUPTED = Reply.text(
    "This reply was interrupted part-way through; the rest of it never arrived, "
    "because the scripted server cut the stream on purpose."
)


@dataclass
class Fault:
    """A failure instead of, or part-way through, a reply.

    ``overloaded`` -> 529, ``rate_limit`` -> 429 with ``retry-after``/``retry-after-ms``,
    ``server_error`` -> 500; ``drop`` streams ``after_events`` events of ``partial`` then
    aborts the TCP connection; ``sse_error`` streams them then sends an SSE ``error``
    event. ``after_events`` is capped so ``message_stop`` is never sent. Without
    streaming, ``drop`` aborts before any response and ``sse_error`` becomes a 529.
    """

    kind: FaultKind
    retry_after: float | None = None
    after_events: int = 3
    partial: Reply | None = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _FAULT_KINDS:
            raise ValueError(f"Fault.kind must be one of {sorted(_FAULT_KINDS)}")
        if self.after_events < 0:
            raise ValueError("Fault.after_events must be >= 0")

    @property
    def cut_reply(self) -> Reply:
        """The reply whose first events a ``drop`` or ``sse_error`` sends."""
        return self.partial or _INTERRUPTED


#: One server-sent event: its name and its data (a JSON object, or the text as it came).
SseEvent = tuple[str, Mapping[str, object] | str]


@dataclass
class Recorded:
    """A recorded response stream, replayed event for event: every block, delta, ping,
    ``error`` and unknown event as it was sent, in order (only ``message_start``'s message
    id is made fresh, so the cache diagnostics can tell responses apart).

    Load one with :meth:`load` (an SSE file, as ``curl -N`` saves it) or :meth:`from_sse`.
    It answers a streaming request only. A content block whose type the installed SDK does
    not know is taken by the server's validation as the shape it was sent in: a server that
    sends a block knows it.
    """

    events: list[SseEvent] = field(default_factory=list)
    delay: float = 0.0
    event_delay: float = 0.0
    #: Where it was read from (named in errors and test ids).
    name: str = ""

    @classmethod
    def from_sse(cls, text: str, **kwargs: Any) -> Recorded:
        """The events of an SSE text: ``event:`` and ``data:`` lines, blank-line separated."""
        events: list[SseEvent] = []
        for chunk in text.replace("\r\n", "\n").split("\n\n"):
            name, data = "", []
            for line in chunk.split("\n"):
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
            if not name and not data:
                continue
            raw = "\n".join(data)
            try:
                value: ApiObject | str = json.loads(raw)
            except ValueError:
                value = raw
            if not name and isinstance(value, dict):
                name = str(value.get("type", "message"))
            events.append((name, value))
        return cls(events, **kwargs)

    @classmethod
    def load(cls, path: str | Path, **kwargs: Any) -> Recorded:
        source = Path(path)
        kwargs.setdefault("name", source.stem)
        return cls.from_sse(source.read_text(encoding="utf-8"), **kwargs)

    def blocks(self) -> list[ApiObject]:
        """The content blocks as their ``content_block_start`` events opened them."""
        return [
            block
            for name, data in self.events
            if name == "content_block_start"
            and isinstance(data, dict)
            and isinstance(block := data.get("content_block"), dict)
        ]

    def fresh(self) -> list[SseEvent]:
        """The events to send: a copy, with a new message id in ``message_start``."""
        events = copy.deepcopy(self.events)
        for name, data in events:
            if name == "message_start" and isinstance(data, dict):
                message = data.get("message")
                if isinstance(message, dict):
                    message["id"] = _new_id("msg")
        return events


def _flatten_text(content: Any) -> str:
    """Text of a content value, with tool_result contents flattened in."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_result":
            parts.append(_flatten_text(block.get("content", "")))
    return "\n".join(p for p in parts if p)


@dataclass(frozen=True)
class ScriptedRequest:
    """A valid request as the responder sees it.

    ``index`` counts requests handed to the responder (0-based, in arrival order), so a
    scripted list is not thrown off by requests the server rejected on its own. A request
    from a message batch names its batch and ``custom_id`` (None when interactive).
    """

    index: int
    body: MessagesRequest
    headers: dict[str, str]
    batch_id: str | None = None
    custom_id: str | None = None

    @property
    def batched(self) -> bool:
        return self.batch_id is not None

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))

    @property
    def system(self) -> str:
        """The top-level system prompt, text blocks joined by newlines."""
        return _flatten_text(self.body.get("system", ""))

    @property
    def messages(self) -> list[Message]:
        return list(self.body.get("messages", []))

    @property
    def tools(self) -> list[ToolSchema]:
        return list(self.body.get("tools") or [])

    @property
    def tool_names(self) -> set[str]:
        return {str(t.get("name")) for t in self.tools}

    def _last_user(self) -> Message | None:
        return next((m for m in reversed(self.messages) if m.get("role") == "user"), None)

    @property
    def last_user_text(self) -> str:
        """Text of the final user message, tool_result contents included."""
        message = self._last_user()
        return _flatten_text(message["content"]) if message else ""

    @property
    def tool_results(self) -> list[ToolResultBlock]:
        """The tool_result blocks of the final user message."""
        message = self._last_user()
        return blocks_of(message["content"] if message else [], "tool_result")


class RequestSummary(TypedDict):
    """A log entry as another process reads it (see :meth:`LoggedRequest.summary`)."""

    index: int
    path: str
    provider: str
    started: float
    finished: float | None
    status: int | None
    outcome: str
    first_user_text: str | None
    usage: dict[str, int] | None
    prompt_tokens: int | None
    #: The whole body as sent, only when the log was asked for bodies.
    body: NotRequired[UncheckedJson]


@dataclass(frozen=True)
class LoggedRequest:
    """One HTTP request as the server handled it; immutable, replaced when it finishes.

    ``outcome`` is ``pending``, ``ok``, ``fault:<kind>``, ``invalid:<message>``, ``auth``,
    ``rate_limited``, ``not_found``, ``disconnected`` (client went away),
    ``cancelled`` (server stopped) or ``error:<exception>`` (the responder raised); on
    Bedrock and Vertex a refused signature or token is ``auth:<the platform's error>``.
    ``path`` tells ``/v1/messages`` from ``/v1/messages/count_tokens`` (and names the
    platform's model and method); ``provider`` says which front door the request used.
    ``body`` is what the client sent, before any context edit or translation (the
    responder sees the edited one, in the Messages API's shape).
    """

    index: int
    method: str
    path: str
    body: UncheckedJson
    headers: dict[str, str]
    started: float
    status: int | None = None
    finished: float | None = None
    outcome: str = "pending"
    reply: Reply | None = None
    message_id: str | None = None
    #: The input-token accounting of a 200 answer (cache reads, writes, the ideal read).
    usage: CacheUsage | None = None
    #: The prompt's size after context edits, once the request validated (count_tokens too).
    prompt_tokens: int | None = None
    #: The response's ``context_management`` (``applied_edits``), when the request had one.
    context_management: ContextManagementReply | None = None
    #: TCP_NODELAY as read back from the server's side of the connection.
    tcp_nodelay: bool | None = None
    #: ``anthropic``, ``bedrock`` or ``vertex``: whose wire format the request used.
    provider: str = "anthropic"

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started

    def summary(self) -> RequestSummary:
        """The entry as JSON for another process: timings on the server's monotonic clock,
        and of the body only the first user message (enough to tell which agent sent it)."""
        messages = self.body.get("messages") if isinstance(self.body, dict) else None
        first = messages[0].get("content") if isinstance(messages, list) and messages else None
        return {
            "index": self.index,
            "path": self.path,
            "provider": self.provider,
            "started": self.started,
            "finished": self.finished,
            "status": self.status,
            "outcome": self.outcome,
            "first_user_text": first if isinstance(first, str) else None,
            "usage": None if self.usage is None else asdict(self.usage),
            "prompt_tokens": self.prompt_tokens,
        }

    @property
    def billed(self) -> TokenUsage | None:
        """What the answer was billed, as orchmode counts it; None for a request that got
        no answer (a fault, a refusal, a count_tokens call)."""
        if self.usage is None or self.reply is None or self.reply.output_tokens is None:
            return None
        return TokenUsage(
            self.usage.input_tokens,
            self.reply.output_tokens,
            self.usage.cache_read_input_tokens,
            self.usage.cache_creation_input_tokens,
        )


Answer = Reply | Fault | Recorded | BatchFate
Responder = Callable[[ScriptedRequest], Answer | Awaitable[Answer]]
