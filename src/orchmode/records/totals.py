"""What a session has used so far: requests, tokens, the share read from cache, dollars.

Built from ``ModelRequestDone`` events, live (as an event subscriber) or afterwards from the
records in the store (:func:`session_totals`), so a running session and ``orchmode budget``
agree to the cent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.events import Event, ModelRequestDone, TokenUsage
from ..store import EventRow
from .codec import parse_row


@dataclass
class UsageTotals:
    requests: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0

    def add(self, usage: TokenUsage, cost: float) -> None:
        self.requests += 1
        self.usage = self.usage + usage
        self.cost += cost


@dataclass
class SessionTotals:
    """Totals for the main agent and for the subagents, kept apart and together."""

    main: UsageTotals = field(default_factory=UsageTotals)
    subagents: UsageTotals = field(default_factory=UsageTotals)
    cache_misses: int = 0
    #: The same use split by the model that answered, in the order each was first seen
    #: ("" for requests recorded before each role could have its own model).
    by_model: dict[str, UsageTotals] = field(default_factory=dict)

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelRequestDone):
            part = self.main if event.agent == "main" else self.subagents
            part.add(event.usage, event.cost)
            self.by_model.setdefault(event.model, UsageTotals()).add(event.usage, event.cost)
            self.cache_misses += event.cache_miss is not None

    @property
    def all(self) -> UsageTotals:
        both = UsageTotals()
        for part in (self.main, self.subagents):
            both.requests += part.requests
            both.usage = both.usage + part.usage
            both.cost += part.cost
        return both

    def describe(self) -> str:
        """One line: requests, input with its cached share, output, dollars."""
        total = self.all
        return (
            f"{total.requests} model requests · {total.usage.total_input:,} input tokens "
            f"({total.usage.cache_hit:.0%} read from cache) · "
            f"{total.usage.output_tokens:,} output · ${total.cost:.2f}"
        )

    def describe_models(self) -> str:
        """Each model's share of the dollars, its dollars and tokens, dearest first:
        ``claude-opus-5-5 81% ($1.20, 40,100 tokens) · claude-haiku-4-5 19% ($0.280, 88,000
        tokens)``; "" when only one model answered."""
        named = {model: part for model, part in self.by_model.items() if model}
        if len(named) < 2:
            return ""
        total = self.all.cost
        shares = []
        for model, part in sorted(named.items(), key=lambda kv: -kv[1].cost):
            share = f" {part.cost / total:.0%}" if total else ""
            tokens = part.usage.total_input + part.usage.output_tokens
            dollars = f"${part.cost:.3f}" if part.cost < 1 else f"${part.cost:,.2f}"
            shares.append(f"{model}{share} ({dollars}, {tokens:,} tokens)")
        return " · ".join(shares)

    def describe_cache(self) -> str:
        """The cache's share of input, for the main agent and the subagents apart."""
        if not self.all.requests:
            return "no model requests recorded"
        parts = [
            f"{name} {part.usage.cache_hit:.0%} of {part.usage.total_input:,}"
            for name, part in (("main", self.main), ("subagents", self.subagents))
            if part.requests
        ]
        misses = f"; {self.cache_misses} reported cache misses" if self.cache_misses else ""
        share = self.all.usage.cache_hit
        return f"{share:.0%} of input read from cache ({', '.join(parts)}){misses}"


def session_totals(rows: Iterable[EventRow]) -> SessionTotals:
    """A session's totals rebuilt from its records (rows that cannot be read are skipped)."""
    totals = SessionTotals()
    for row in rows:
        event = parse_row(row)
        if event is not None:
            totals(event)
    return totals
