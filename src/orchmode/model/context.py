"""How big a conversation is, and how it is made smaller before it overflows the window.

Sizes are honest rather than guessed whole: a :class:`Meter` starts from the API's own
count of the conversation's previous request and adds a conservative estimate (three
characters a token; real text runs nearer four) of only what was appended since.

Compaction is the harness's own way to make room: the oldest tool results are replaced
by a short stub naming their saved copy, the latest turns are kept whole, and every
``tool_use`` keeps its ``tool_result``, so the request stays valid. It goes far below the
point that triggered it (``compact_to`` against ``compact_at``), so it happens rarely and
the cached prompt prefix is rebuilt seldom. Everything here is pure but the ``save``
callback the caller passes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from ..core.kept import KeptByIdentity
from ..core.settings import Settings
from ..core.wire import Block, Message, ToolResultBlock, has_block, is_block, joined_text

#: Characters per token for what the API has not counted yet; low, so estimates run high.
CHARS_PER_TOKEN = 3
#: A tool result this small is not worth a stub: the stub would be nearly as long.
STUB_WORTH = 150
#: User turns at the end of a conversation kept whole while older results can go.
KEEP_TURNS = 2
#: Share of an estimate by which it may run high: a size this close past a point is worth
#: the API's own count (``count_tokens``) before compacting on it.
ESTIMATE_SLACK = 0.35
#: The API's words for a request over the window: "prompt is too long: N tokens > M maximum".
TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+)")


def estimate_tokens(*values: object) -> int:
    """A high estimate of the tokens ``values`` (text, or anything JSON) take in a request."""
    size = sum(
        len(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str))
        for v in values
    )
    return size // CHARS_PER_TOKEN + 1


def _json_size(value: object) -> int:
    """The length of the JSON :func:`estimate_tokens` makes of ``value``."""
    return len(json.dumps(value, ensure_ascii=False, default=str))


#: Each tool schema's JSON size: every agent of a fan-out is sent the same schemas.
_schema_size = KeptByIdentity(_json_size)


def _fixed_tokens(part: object) -> int:
    """``estimate_tokens(part)`` for a system prompt or a list of tool schemas, each schema
    measured once: a list's JSON is its items' joined by ", " in brackets."""
    if not isinstance(part, list | tuple) or not part:
        return estimate_tokens(part)
    size = 2 * len(part) + sum(_schema_size(item) for item in part)
    return size // CHARS_PER_TOKEN + 1


def too_long_count(message: str) -> int | None:
    """The prompt's size from the API's "prompt is too long" message, if it is one."""
    found = TOO_LONG.search(message)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Window:
    """One model's context window and the budgets cut from it, in tokens."""

    tokens: int
    #: A request estimated above this is compacted before it goes out.
    compact_at: int
    #: What a compaction brings the conversation down to.
    compact_to: int
    #: The most one Workflow result may take (before the room left is considered).
    result_tokens: int
    #: The most of a worker's result that its verifier's prompt quotes.
    quote_tokens: int

    @classmethod
    def from_settings(cls, settings: Settings, model: str | None = None) -> Window:
        """The window of ``model`` (default: the main agent's), with the settings' points."""
        tokens = settings.window_of(model or settings.model)
        return cls(
            tokens=tokens,
            compact_at=int(tokens * settings.compact_at),
            compact_to=int(tokens * settings.compact_to),
            result_tokens=settings.workflow_result_tokens or tokens // 4,
            quote_tokens=settings.verify_quote_tokens or tokens // 20,
        )

    def result_budget(self, conversation_tokens: int, point: int | None = None) -> int:
        """A Workflow result's budget: its share, never more than the room left.

        The room is what lies between the conversation and the compaction ``point``
        (``compact_at`` unless given); when a conversation has almost none left, the result
        still gets a small floor (its summaries and verdicts must go somewhere) and the next
        request compacts.
        """
        room = (self.compact_at if point is None else point) - conversation_tokens
        return max(min(self.result_tokens, room), self.tokens // 50)


class Meter:
    """The calibrated size of one conversation's next request."""

    def __init__(self, fixed: Sequence[object]) -> None:
        #: System prompt and tool schemas: sent with every request, counted once here.
        self.fixed_tokens = sum(_fixed_tokens(part) for part in fixed)
        self._sent = 0  # messages in the last request the API counted
        self._counted = 0  # the API's input tokens for that request
        self._known = False

    def observe(self, messages_sent: int, input_tokens: int) -> None:
        """The API's own count of a request of ``messages_sent`` messages."""
        self._sent, self._counted, self._known = messages_sent, input_tokens, True

    def forget(self) -> None:
        """The messages changed in place (a compaction): estimate afresh until told again."""
        self._known = False

    def size(self, messages: Sequence[Message]) -> int:
        """Tokens the next request with ``messages`` will take: the API's count of what it
        has seen, and a high estimate of the rest."""
        if self._known and len(messages) >= self._sent:
            return self._counted + sum(estimate_tokens(m) for m in messages[self._sent :])
        return self.estimate(messages)

    def uncounted(self, messages: Sequence[Message]) -> int:
        """The part of :meth:`size` that is estimated rather than counted by the API."""
        if self._known and len(messages) >= self._sent:
            return sum(estimate_tokens(m) for m in messages[self._sent :])
        return self.estimate(messages)

    def estimate(self, messages: Sequence[Message]) -> int:
        """The high estimate of the whole request, with no help from the API's count."""
        return self.fixed_tokens + sum(estimate_tokens(m) for m in messages)

    def target(self, messages: Sequence[Message], tokens: int) -> int:
        """``tokens`` of real size in the units of :meth:`estimate`, which compaction uses.

        The estimate runs high for ordinary text, and a target in its units is then safe as
        it is; where the API counted more than estimated (dense text, base64), the target
        shrinks by as much.
        """
        if not self._known or len(messages) < self._sent:
            return tokens
        estimated = self.estimate(messages[: self._sent])
        counted = self._counted
        return tokens if counted <= estimated else tokens * estimated // counted


# --------------------------------------------------------------------------- compaction

#: ``save(tool_use_id, text)`` keeps a tool result's text and returns where, or None.
Saver = Callable[[str, str], str | None]


@dataclass(frozen=True)
class Compaction:
    messages: list[Message]
    stubbed: int
    tokens_removed: int

    @property
    def detail(self) -> str:
        results = "tool result" if self.stubbed == 1 else "tool results"
        return f"{self.stubbed} {results}, about {self.tokens_removed:,} tokens"


def stub_text(tokens: int, saved: str | None) -> str:
    """What stands in the conversation for a tool result that was taken out."""
    if saved is None:
        return (
            f"[orchmode: this tool result (about {tokens:,} tokens) was removed to keep the "
            "conversation within the context window; run the command again if you need it]"
        )
    return (
        f"[orchmode: this tool result (about {tokens:,} tokens) was removed to keep the "
        f"conversation within the context window; its full text is saved at {saved} — read "
        "what you need of it with cat, grep or jq]"
    )


def _is_stub(content: object) -> bool:
    return isinstance(content, str) and content.startswith("[orchmode: this tool result (")


def turn_starts(messages: Sequence[Message]) -> list[int]:
    """Indexes of the user messages that open a turn (text, not tool results)."""
    starts = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "user":
            continue
        if has_block(content, "tool_result"):
            continue
        starts.append(i)
    return starts


def _candidates(messages: Sequence[Message], keep_last: bool) -> list[tuple[int, int]]:
    """(message, block) of every tool result that may be stubbed, in the order to stub them.

    Results older than the last :data:`KEEP_TURNS` turns go first, oldest first; then the
    kept turns' results, oldest first. The most recent tool results message goes last of
    all, and only when ``keep_last`` is false.
    """
    starts = turn_starts(messages)
    kept_from = starts[-KEEP_TURNS] if len(starts) >= KEEP_TURNS else 0
    last_results = max(
        (
            i
            for i, m in enumerate(messages)
            if m.get("role") == "user" and i not in starts and isinstance(m.get("content"), list)
        ),
        default=-1,
    )
    old: list[tuple[int, int]] = []
    recent: list[tuple[int, int]] = []
    latest: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not is_block(block, "tool_result"):
                continue
            if _is_stub(block.get("content")):
                continue
            if i == last_results:
                latest.append((i, j))
            elif i < kept_from:
                old.append((i, j))
            else:
                recent.append((i, j))
    return old + recent + ([] if keep_last else latest)


def compact(
    messages: Sequence[Message],
    size: int,
    target: int,
    save: Saver,
    *,
    keep_last: bool = True,
) -> Compaction:
    """Stub tool results, oldest first, until the conversation of ``size`` tokens is at
    ``target`` or nothing stubbable is left. ``messages`` itself is not changed.

    Deterministic: the same conversation and target give the same bytes.
    """
    out = list(messages)  # only the messages a stub changes become new objects
    stubbed = removed = 0
    for i, j in _candidates(messages, keep_last):
        if size - removed <= target:
            break
        content = list(cast("list[Block]", out[i]["content"]))  # candidates are in lists
        block = cast(ToolResultBlock, content[j])  # and are tool results
        text = content_text(block.get("content"))
        tokens = estimate_tokens(block.get("content"))
        if tokens < STUB_WORTH:
            continue
        stub = stub_text(tokens, save(str(block.get("tool_use_id", "")), text))
        content[j] = {**block, "content": stub}
        out[i] = {**out[i], "content": content}
        stubbed += 1
        removed += tokens - estimate_tokens(stub)
    return Compaction(out, stubbed, removed)


def content_text(content: object) -> str:
    """The text of a message's or tool result's content: a string, or its text blocks."""
    if content is None:
        return ""
    if isinstance(content, str | list):
        return joined_text(content, "\n")
    return json.dumps(content, ensure_ascii=False)
