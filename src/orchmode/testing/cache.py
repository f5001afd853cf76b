"""A deterministic stand-in for prompt caching and cache-miss diagnostics.

The real API caches prompt prefixes in the order tools -> system -> messages and bills a
request as ``cache_read`` (prefix found), ``cache_creation`` (newly written up to the last
breakpoint) and plain ``input`` (the rest). This module reproduces that arithmetic so a
harness can be tested for *cache-friendly* behaviour, using these approximations:

* A prompt is a list of *segments*: each tool definition, each system text block and each
  message content block (a string ``content`` counts as one text block; a block is keyed
  with its message role). ``cache_control`` markers are stripped before comparing, so
  moving a breakpoint never changes what matches.
* Tokens are ``characters of canonical JSON // 4``, cumulated over segments.
* A *breakpoint* is any segment carrying ``cache_control``; a top-level
  ``cache_control`` marks the last segment. A request with no breakpoint neither reads
  nor writes the cache.
* Each breakpoint's prefix is remembered (per model) forever: no TTL, no minimum
  cacheable length, no 20-block lookback limit. A later request reads the longest
  remembered prefix of itself that ends at or before its last breakpoint.
* ``ideal_read_tokens`` is what the cache could have served had every block boundary been
  a breakpoint: the longest prefix, at any boundary, that an earlier request also sent.
  It is not on the wire; benchmarks compare a harness's real reads against it.
* Diagnostics compare with the request that produced ``previous_message_id``: model,
  then tools, then system, then whether the old messages are a prefix of the new ones.
  ``cache_missed_input_tokens`` is the old prompt's tokens past the common prefix.

The same segment arithmetic is *the* prompt size everywhere in the scripted server
(:func:`prompt_tokens`): the context window, ``count_tokens`` and the beta context edits
(:func:`apply_context_edits`) all count exactly what ``usage`` bills as
``input + cache_read + cache_creation``, so a harness that budgets with one sees the
same number in the others. Context edits run before the cache is consulted, as on the
real API: clearing a tool result changes the prompt from that block on, so the cached
prefix past the first cleared block no longer matches.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NotRequired, TypedDict

from ..core.wire import MessagesRequest

__all__ = [
    "CLEARED_TOOL_RESULT",
    "AppliedEdit",
    "CacheUsage",
    "ClearToolUses",
    "Diagnostics",
    "EditedPrompt",
    "PromptCache",
    "apply_context_edits",
    "canonical_json",
    "estimate_tokens",
    "prompt_tokens",
]

_CHARS_PER_TOKEN = 4


def canonical_json(value: Any) -> str:
    """Serialise deterministically, so equal prompts give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def estimate_tokens(value: Any) -> int:
    """The module-wide token estimate: four characters of canonical JSON per token."""
    return len(canonical_json(value)) // _CHARS_PER_TOKEN


def _strip_cache_control(value: Any) -> Any:
    """Drop every ``cache_control`` key: markers move between turns, content does not."""
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _blocks(content: Any) -> list[Any]:
    """String content is shorthand for one text block; the API treats both alike."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


@dataclass(frozen=True)
class _Segment:
    part: str  # "tools" | "system" | "messages"
    message: int  # index into messages, -1 for tools/system
    text: str
    ttl: str | None  # the cache_control ttl if this segment is a breakpoint, else None


def _ttl(marker: Any) -> str | None:
    if not isinstance(marker, dict):
        return None
    return "1h" if marker.get("ttl") == "1h" else "5m"


def _segments(body: MessagesRequest) -> list[_Segment]:
    segments: list[_Segment] = []
    for tool in body.get("tools") or []:
        ttl = _ttl(tool.get("cache_control")) if isinstance(tool, dict) else None
        segments.append(_Segment("tools", -1, canonical_json(_strip_cache_control(tool)), ttl))
    for block in _blocks(body.get("system")):
        ttl = _ttl(block.get("cache_control")) if isinstance(block, dict) else None
        segments.append(_Segment("system", -1, canonical_json(_strip_cache_control(block)), ttl))
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        for block in _blocks(message.get("content")):
            ttl = _ttl(block.get("cache_control")) if isinstance(block, dict) else None
            text = canonical_json([role, _strip_cache_control(block)])
            segments.append(_Segment("messages", i, text, ttl))
    top = _ttl(body.get("cache_control"))
    if top is not None and segments:
        last = segments[-1]
        segments[-1] = _Segment(last.part, last.message, last.text, top)
    return segments


@dataclass(frozen=True)
class CacheUsage:
    """Input-token accounting for one request, split the way the API reports it."""

    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int
    ideal_read_tokens: int = 0

    @property
    def total_input_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


class CacheMissReason(TypedDict):
    type: str
    cache_missed_input_tokens: NotRequired[int]


class Diagnostics(TypedDict):
    """A response's ``diagnostics``: why its prompt missed the cache, if it did."""

    cache_miss_reason: CacheMissReason | None


@dataclass(frozen=True)
class _Fingerprint:
    """What diagnostics need to remember about a request that produced a message."""

    model: str
    tools: str
    system: str
    messages: tuple[str, ...]
    tools_tokens: int
    system_tokens: int
    message_tokens: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return self.tools_tokens + self.system_tokens + sum(self.message_tokens)


class PromptCache:
    """Remembered prefixes plus per-message fingerprints; one per server.

    Thread-safe so it can be shared, though the server only uses it from its own loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prefixes: set[tuple[str, str]] = set()
        self._every_prefix: set[tuple[str, str]] = set()
        self._fingerprints: dict[str, _Fingerprint] = {}

    def account(self, body: MessagesRequest) -> CacheUsage:
        """Bill ``body`` against the cache, then remember its breakpoint prefixes."""
        model = str(body.get("model", ""))
        segments = _segments(body)
        cumulative = [0]
        hashes = [""]
        digest = hashlib.sha256()
        for seg in segments:
            cumulative.append(cumulative[-1] + len(seg.text))
            digest.update(seg.text.encode())
            digest.update(b"\x00")
            hashes.append(digest.copy().hexdigest())
        total = cumulative[-1] // _CHARS_PER_TOKEN
        breakpoints = [k + 1 for k, seg in enumerate(segments) if seg.ttl is not None]
        with self._lock:
            ideal = max(
                (k for k in range(1, len(hashes)) if (model, hashes[k]) in self._every_prefix),
                default=0,
            )
            self._every_prefix.update((model, h) for h in hashes[1:])
            if not breakpoints:
                return CacheUsage(total, 0, 0, 0, 0, cumulative[ideal] // _CHARS_PER_TOKEN)
            last = breakpoints[-1]
            hit = max(
                (k for k in range(1, last + 1) if (model, hashes[k]) in self._prefixes),
                default=0,
            )
            self._prefixes.update((model, hashes[k]) for k in breakpoints)
        read = cumulative[hit] // _CHARS_PER_TOKEN
        created = max(0, cumulative[last] // _CHARS_PER_TOKEN - read)
        # Written up to the last hour-long breakpoint is kept an hour; the rest five minutes
        # (the API takes hour-long breakpoints only before the five-minute ones).
        hourly = [k for k in breakpoints if segments[k - 1].ttl == "1h"]
        hour_end = cumulative[hourly[-1]] // _CHARS_PER_TOKEN if hourly else 0
        long_lived = min(created, max(0, hour_end - read))
        return CacheUsage(
            input_tokens=max(0, total - read - created),
            cache_creation_input_tokens=created,
            cache_read_input_tokens=read,
            ephemeral_5m_input_tokens=created - long_lived,
            ephemeral_1h_input_tokens=long_lived,
            ideal_read_tokens=cumulative[ideal] // _CHARS_PER_TOKEN,
        )

    def remember(self, message_id: str, body: MessagesRequest) -> None:
        """Record the request that produced ``message_id`` for later diagnostics."""
        fingerprint = _fingerprint(body)
        with self._lock:
            self._fingerprints[message_id] = fingerprint

    def diagnose(self, body: MessagesRequest) -> Diagnostics | None:
        """The response's ``diagnostics`` object, or None when the request did not ask."""
        request = body.get("diagnostics")
        if not isinstance(request, dict):
            return None
        previous_id = request.get("previous_message_id")
        if previous_id is None:
            return {"cache_miss_reason": None}
        with self._lock:
            previous = self._fingerprints.get(str(previous_id))
        if previous is None:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        current = _fingerprint(body)
        if current.model != previous.model:
            reason, common = "model_changed", 0
        elif current.tools != previous.tools:
            reason, common = "tools_changed", 0
        elif current.system != previous.system:
            reason, common = "system_changed", previous.tools_tokens
        else:
            same = 0
            for old, new in zip(previous.messages, current.messages, strict=False):
                if old != new:
                    break
                same += 1
            if same == len(previous.messages):
                return {"cache_miss_reason": None}
            reason = "messages_changed"
            common = previous.tools_tokens + previous.system_tokens
            common += sum(previous.message_tokens[:same])
        missed = max(0, previous.total_tokens - common)
        return {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _fingerprint(body: MessagesRequest) -> _Fingerprint:
    """Hashes and sizes only: a benchmark may keep thousands of these."""
    tools = canonical_json(_strip_cache_control(body.get("tools") or []))
    system = canonical_json(_strip_cache_control(_blocks(body.get("system"))))
    messages = [
        canonical_json([m.get("role"), _strip_cache_control(_blocks(m.get("content")))])
        for m in body.get("messages") or []
        if isinstance(m, dict)
    ]
    return _Fingerprint(
        model=str(body.get("model", "")),
        tools=_digest(tools),
        system=_digest(system),
        messages=tuple(_digest(m) for m in messages),
        tools_tokens=len(tools) // _CHARS_PER_TOKEN,
        system_tokens=len(system) // _CHARS_PER_TOKEN,
        message_tokens=tuple(len(m) // _CHARS_PER_TOKEN for m in messages),
    )


# --------------------------------------------------------------------------- prompt size


def prompt_tokens(body: MessagesRequest) -> int:
    """The prompt's size as billed: what ``account`` splits into input, read and write.

    The window check, ``count_tokens`` and the context edits use this one number, so a
    harness can compare any of them with a 200 answer's ``usage`` and get equality.
    """
    return sum(len(seg.text) for seg in _segments(body)) // _CHARS_PER_TOKEN


# --------------------------------------------------------------------------- context edits

#: What a cleared ``tool_result`` holds instead of its content (a fixed, short text, so
#: tests and the scripted model can recognise it).
CLEARED_TOOL_RESULT = "[cleared to save context]"


@dataclass(frozen=True)
class ClearToolUses:
    """A validated ``clear_tool_uses_20250919`` edit, the API's defaults filled in.

    ``clear_inputs`` is True/False for every cleared tool use, or the names of the tools
    whose ``input`` is cleared along with the result.
    """

    type: ClassVar[str] = "clear_tool_uses_20250919"

    trigger: Literal["input_tokens", "tool_uses"] = "input_tokens"
    trigger_value: int = 100_000
    keep: int = 3
    clear_at_least: int | None = None
    exclude_tools: frozenset[str] = field(default_factory=frozenset)
    clear_inputs: bool | frozenset[str] = False

    def clears_input_of(self, name: str) -> bool:
        if isinstance(self.clear_inputs, bool):
            return self.clear_inputs
        return name in self.clear_inputs


class AppliedEdit(TypedDict):
    """One context edit as the response's ``context_management.applied_edits`` reports it."""

    type: str
    cleared_tool_uses: int
    cleared_input_tokens: int


@dataclass(frozen=True)
class EditedPrompt:
    """A request after its context edits: what the model sees, is cached and is billed.

    ``applied_edits`` is None when the request configured no context management, else
    the response's ``context_management.applied_edits`` (``[]`` when nothing applied).
    """

    body: MessagesRequest
    input_tokens: int
    original_input_tokens: int
    applied_edits: list[AppliedEdit] | None


@dataclass(frozen=True)
class _ToolUse:
    message: int
    block: int
    id: str
    name: str


def apply_context_edits(body: MessagesRequest, edits: list[ClearToolUses] | None) -> EditedPrompt:
    """Run ``edits`` in order over a validated request, without touching ``body`` itself.

    ``edits=None`` means the request carried no ``context_management``.
    """
    original = prompt_tokens(body)
    if edits is None:
        return EditedPrompt(body, original, original, None)
    applied: list[AppliedEdit] = []
    current, tokens = body, original
    for edit in edits:
        result = _clear_tool_uses(current, tokens, edit)
        if result is not None:
            current, cleared, tokens_after = result
            applied.append(
                {
                    "type": edit.type,
                    "cleared_tool_uses": cleared,
                    "cleared_input_tokens": tokens - tokens_after,
                }
            )
            tokens = tokens_after
    return EditedPrompt(current, tokens, original, applied)


def _tool_uses(messages: list[Any]) -> list[_ToolUse]:
    """Every ``tool_use`` of the conversation, oldest first."""
    uses: list[_ToolUse] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, dict) and block.get("type") == "tool_use":
                uses.append(_ToolUse(i, j, str(block.get("id")), str(block.get("name"))))
    return uses


def _tool_results(messages: list[Any]) -> dict[str, tuple[int, int]]:
    """Where each ``tool_result`` sits, by the ``tool_use_id`` it answers."""
    where: dict[str, tuple[int, int]] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                where.setdefault(str(block.get("tool_use_id")), (i, j))
    return where


def _clear_tool_uses(
    body: MessagesRequest, tokens: int, edit: ClearToolUses
) -> tuple[MessagesRequest, int, int] | None:
    """The edited body, tool uses cleared and its new size; None when nothing applies.

    When triggered, every tool use older than the last ``keep`` (counted over the whole
    conversation, excluded tools included) and not of an excluded tool has its result
    replaced by :data:`CLEARED_TOOL_RESULT` (and its input emptied, if asked); a use
    already in that state does not count. If that saves less than ``clear_at_least``
    tokens, nothing is cleared: a cache-breaking edit must be worth its cost.
    """
    messages: list[Any] = list(body.get("messages") or [])
    uses = _tool_uses(messages)
    size = tokens if edit.trigger == "input_tokens" else len(uses)
    if size <= edit.trigger_value:
        return None
    results = _tool_results(messages)
    # Copy-on-write: only the messages and blocks that change are copied.
    copied: dict[int, list[Any]] = {}

    def block_list(i: int) -> list[Any]:
        if i not in copied:
            copied[i] = list(messages[i]["content"])
        return copied[i]

    cleared = 0
    for use in uses[: max(0, len(uses) - edit.keep)]:
        if use.name in edit.exclude_tools:
            continue
        changed = False
        where = results.get(use.id)
        if where is not None:
            blocks = block_list(where[0])
            result = blocks[where[1]]
            if result.get("content") != CLEARED_TOOL_RESULT:
                blocks[where[1]] = {**result, "content": CLEARED_TOOL_RESULT}
                changed = True
        if edit.clears_input_of(use.name):
            blocks = block_list(use.message)
            tool_use = blocks[use.block]
            if tool_use.get("input") != {}:
                blocks[use.block] = {**tool_use, "input": {}}
                changed = True
        if changed:
            cleared += 1
    if not cleared:
        return None
    for i, blocks in copied.items():
        messages[i] = {**messages[i], "content": blocks}
    edited: MessagesRequest = {**body, "messages": messages}
    after = prompt_tokens(edited)
    if edit.clear_at_least is not None and tokens - after < edit.clear_at_least:
        return None
    return edited, cleared, after
