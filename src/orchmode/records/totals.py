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
from .batches import saved_by_batching
from .codec import parse_row


def web_uses(usage: TokenUsage) -> str:
    """``2 web searches, 1 web fetch``: the API's web tools used (a search is billed per
    use); "" when none was."""
    parts = [
        f"{count:,} web {noun}{'' if count == 1 else plural}"
        for count, noun, plural in (
            (usage.web_search_requests, "search", "es"),
            (usage.web_fetch_requests, "fetch", "es"),
        )
        if count
    ]
    return ", ".join(parts)


@dataclass(frozen=True)
class RequestTotals:
    """Model requests and what they used: tokens by kind, and dollars at the settings' prices."""

    requests: int = 0
    usage: TokenUsage = field(default_factory=TokenUsage)
    #: Dollars, from :attr:`Settings.prices` (0 for a model without a price).
    cost: float = 0.0
    #: Of those, the requests answered from a Message Batch and the dollars paid for them.
    batched: int = 0
    batched_cost: float = 0.0

    @property
    def tokens(self) -> int:
        """Every token billed: input (cached and not) and output, as the budget counts them."""
        return self.usage.total_input + self.usage.output_tokens

    @property
    def saved(self) -> float:
        """Dollars batching saved: the batched requests' usage at the interactive price,
        less what was paid."""
        return saved_by_batching(self.batched_cost)

    def __add__(self, other: RequestTotals) -> RequestTotals:
        return RequestTotals(
            self.requests + other.requests,
            self.usage + other.usage,
            self.cost + other.cost,
            self.batched + other.batched,
            self.batched_cost + other.batched_cost,
        )

    def plus(self, usage: TokenUsage, cost: float, *, batched: bool = False) -> RequestTotals:
        """These totals and one more request (``batched``: answered from a batch)."""
        return RequestTotals(
            self.requests + 1,
            self.usage + usage,
            self.cost + cost,
            self.batched + batched,
            self.batched_cost + (cost if batched else 0.0),
        )

    def describe_batched(self) -> str:
        """``12 of 20 requests · $0.0600 of the $0.2000 spent · $0.0600 saved``: how many
        requests were batched, what they cost of the whole, what batching saved; "" if none."""
        if not self.batched:
            return ""
        return (
            f"{self.batched:,} of {self.requests:,} requests · ${self.batched_cost:.4f} of the "
            f"${self.cost:.4f} spent · ${self.saved:.4f} saved"
        )

    def describe(self) -> str:
        """One line: requests, input with its cached share, output, web tool uses, dollars."""
        web = web_uses(self.usage)
        return (
            f"{self.requests} model requests · {self.usage.total_input:,} input tokens "
            f"({self.usage.cache_hit:.0%} read from cache) · "
            f"{self.usage.output_tokens:,} output · {web + ' · ' if web else ''}${self.cost:.2f}"
        )


@dataclass(frozen=True)
class Totals:
    """What a session has used so far, main agent and subagents apart and together.

    A resumed session's totals include what it used before it was resumed, so they agree
    with ``orchmode budget`` for the same session.
    """

    main: RequestTotals
    subagents: RequestTotals
    #: Subagents (workers and verifiers) counted against ``max_subagents``; journal hits
    #: are free and not counted.
    subagents_launched: int
    #: Requests whose prompt cache missed, as the API's diagnostics reported it.
    cache_misses: int = 0

    @property
    def all(self) -> RequestTotals:
        """The main agent and the subagents together."""
        return self.main + self.subagents

    @property
    def requests(self) -> int:
        """Model requests in all."""
        return self.all.requests

    @property
    def tokens(self) -> int:
        """Tokens in all: input, cache reads and writes, and output."""
        return self.all.tokens

    @property
    def cost(self) -> float:
        """Dollars in all."""
        return self.all.cost

    def describe(self) -> str:
        """The line ``orchmode run`` ends with: requests, input and its cached share, output, $."""
        return self.all.describe()


@dataclass
class SessionTotals:
    """The running tally behind :class:`Totals`: counted as each request's event goes by."""

    main: RequestTotals = field(default_factory=RequestTotals)
    subagents: RequestTotals = field(default_factory=RequestTotals)
    cache_misses: int = 0
    #: The same use split by the model that answered, in the order each was first seen
    #: ("" for requests recorded before each role could have its own model).
    by_model: dict[str, RequestTotals] = field(default_factory=dict)

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelRequestDone):
            batched = event.batched
            if event.agent == "main":
                self.main = self.main.plus(event.usage, event.cost, batched=batched)
            else:
                self.subagents = self.subagents.plus(event.usage, event.cost, batched=batched)
            known = self.by_model.get(event.model, RequestTotals())
            self.by_model[event.model] = known.plus(event.usage, event.cost, batched=batched)
            self.cache_misses += event.cache_miss is not None

    @property
    def all(self) -> RequestTotals:
        return self.main + self.subagents

    def describe(self) -> str:
        """One line: requests, input with its cached share, output, dollars."""
        return self.all.describe()

    def snapshot(self, launched: int) -> Totals:
        """The totals as they stand, with ``launched`` subagents from the ledger."""
        return Totals(self.main, self.subagents, launched, self.cache_misses)

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
