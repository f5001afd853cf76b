"""The session's budget as the gateway and the fan-out see it: caps, reservations, status.

With a token or dollar cap, every model request first reserves its worst case — its input
as estimated from the request's size, plus ``max_tokens`` of output, at the dearest input
price — and settles to the real usage when it ends. The reservation is one atomic update
of the ledger in the store, so requests in flight, in any number of processes, can never
together spend past a cap. Without caps, requests only add what they used.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import OrchmodeError
from .events import TokenUsage
from .settings import Settings
from .store import BudgetCaps, BudgetState, Store

#: Characters per token when estimating a request's input; low, so the estimate is high.
CHARS_PER_TOKEN = 3


class BudgetExhausted(OrchmodeError):
    """A cap of the session's budget would be crossed."""

    exit_code = 7


@dataclass(frozen=True)
class Reservation:
    tokens: int
    cost: float


def estimate_input_tokens(system: str, messages: Sequence[Any], tools: Sequence[Any]) -> int:
    size = len(system) + len(json.dumps([messages, tools], ensure_ascii=False, default=str))
    return size // CHARS_PER_TOKEN + 1


@dataclass
class SessionBudget:
    store: Store
    session: str
    settings: Settings

    @property
    def caps(self) -> BudgetCaps:
        s = self.settings
        return BudgetCaps(s.max_subagents, s.max_session_tokens, s.max_cost)

    @property
    def metered(self) -> bool:
        return self.settings.max_session_tokens is not None or self.settings.max_cost is not None

    def cost(self, usage: TokenUsage) -> float:
        price = self.settings.price()
        return price.cost(usage) if price else 0.0

    async def before_request(
        self, system: str, messages: Sequence[Any], tools: Sequence[Any]
    ) -> Reservation | None:
        """Reserve the request's worst case, or raise :class:`BudgetExhausted`."""
        if not self.metered:
            return None
        input_tokens = estimate_input_tokens(system, messages, tools)
        output_tokens = self.settings.max_tokens
        price = self.settings.price()
        cost = price.worst_case(input_tokens, output_tokens) if price else 0.0
        reservation = Reservation(input_tokens + output_tokens, cost)
        if not await self.store.reserve(
            self.session, self.caps, subagents=0, tokens=reservation.tokens, cost=cost
        ):
            state = await self.store.budget(self.session)
            raise BudgetExhausted(
                f"the session's budget is used up ({self.describe(state)}); the next model "
                f"request could take {reservation.tokens:,} tokens and ${cost:.2f} — raise "
                "--max-session-tokens or --max-cost, or start a new session"
            )
        return reservation

    async def after_request(self, reservation: Reservation | None, usage: TokenUsage) -> None:
        """Settle the ledger to what the request really used (nothing, if it failed)."""
        tokens = usage.total_input + usage.output_tokens
        cost = self.cost(usage)
        if reservation is not None:
            tokens, cost = tokens - reservation.tokens, cost - reservation.cost
        if tokens or cost:
            await self.store.settle(self.session, tokens=tokens, cost=cost)

    def describe(self, state: BudgetState) -> str:
        """``12 of 500 subagents launched; 120,340 tokens; $0.84 spent``, with any caps."""
        s = self.settings
        parts = [f"{state.subagents} of {s.max_subagents} subagents launched"]
        tokens = f"{state.tokens:,}"
        if s.max_session_tokens is not None:
            tokens += f" of {s.max_session_tokens:,}"
        parts.append(f"{tokens} tokens")
        if s.price() is not None:
            cost = f"${state.cost:.2f}"
            if s.max_cost is not None:
                cost += f" of ${s.max_cost:.2f}"
            parts.append(f"{cost} spent")
        return "; ".join(parts)
