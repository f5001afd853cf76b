"""The session's budget as the gateway and the fan-out see it: caps, reservations, status.

With a token or dollar cap, every model request first reserves its worst case — its input
as estimated from the request's size, plus ``max_tokens`` of output, at the dearest input
price — and settles to the real usage when it ends. The reservation is one atomic update
of the ledger in the store, so requests in flight, in any number of processes, can never
together spend past a cap. Without caps, requests only add what they used, gathered for
:data:`SETTLE_WINDOW` into one update: nothing waits on an uncapped ledger's exactness, and
an update per request was a transaction per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import BudgetExhausted as BudgetExhausted  # where callers catch it
from ..core.errors import OrchmodeError
from ..core.events import TokenUsage
from ..core.settings import Settings
from ..core.web_tools import most_searches
from ..store import BudgetCaps, BudgetState, Store
from .context import estimate_tokens

log = logging.getLogger("orchmode")

#: Seconds an uncapped session's use gathers before it goes into the ledger (``flush``
#: writes at once).
SETTLE_WINDOW = 0.025


@dataclass(frozen=True)
class Reservation:
    tokens: int
    cost: float


def estimate_input_tokens(system: str, messages: Sequence[Any], tools: Sequence[Any]) -> int:
    """A request's input, estimated high: its reservation must cover what it will use."""
    return estimate_tokens(system, [messages, tools])


@dataclass
class SessionBudget:
    store: Store
    session: str
    settings: Settings
    #: Use not yet in the ledger (sessions without caps only), and the task writing it.
    _unsettled_tokens: int = field(default=0, repr=False)
    _unsettled_cost: float = field(default=0.0, repr=False)
    _settler: asyncio.Task[None] | None = field(default=None, repr=False)
    _hurry: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    #: Subagents waiting for a place in the ledger, and the task reserving them.
    _waiting: list[asyncio.Future[bool]] = field(default_factory=list, repr=False)
    _reserver: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def caps(self) -> BudgetCaps:
        s = self.settings
        return BudgetCaps(s.max_subagents, s.max_session_tokens, s.max_cost)

    @property
    def metered(self) -> bool:
        return self.settings.max_session_tokens is not None or self.settings.max_cost is not None

    def cost(self, usage: TokenUsage, model: str | None = None, *, batched: bool = False) -> float:
        price = self.settings.price(model, batched=batched)
        return price.cost(usage) if price else 0.0

    async def before_request(
        self,
        system: str,
        messages: Sequence[Any],
        tools: Sequence[Any],
        model: str | None = None,
        *,
        batched: bool = False,
        output_tokens: int | None = None,
    ) -> Reservation | None:
        """Reserve the request's worst case (at the batch price for a batched request), or
        raise :class:`BudgetExhausted`. ``output_tokens``: the output it asks for, when an
        agent's budget cut it below ``max_tokens``."""
        if not self.metered:
            return None
        input_tokens = estimate_input_tokens(system, messages, tools)
        output_tokens = output_tokens or self.settings.max_tokens
        price = self.settings.price(model, batched=batched)
        cost = price.worst_case(input_tokens, output_tokens, hour_writes=batched) if price else 0.0
        if price is not None:
            cost += price.searches(most_searches(tools))
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

    async def after_request(
        self,
        reservation: Reservation | None,
        usage: TokenUsage,
        model: str | None = None,
        *,
        batched: bool = False,
    ) -> None:
        """Settle the ledger to what the request really used (nothing, if it failed), at the
        price it was answered at."""
        tokens = usage.total_input + usage.output_tokens
        cost = self.cost(usage, model, batched=batched)
        if reservation is not None:
            tokens, cost = tokens - reservation.tokens, cost - reservation.cost
        if not (tokens or cost):
            return
        if self.metered:  # a cap counts on the ledger being exact now
            await self.store.adjust_budget(self.session, tokens=tokens, cost=cost)
            return
        self._unsettled_tokens += tokens
        self._unsettled_cost += cost
        if self._settler is None or self._settler.done():
            self._settler = asyncio.create_task(self._settle_unsettled())

    async def reserve_subagent(self) -> bool:
        """Count one more subagent against the cap; false if the session may launch no more.

        The subagents of a wave that ask together are reserved together, in one update of
        the ledger, while the cap still holds for all of them. Reserving them one update at
        a time would queue the whole wave on the ledger's row.
        """
        waiting: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiting)
        if self._reserver is None or self._reserver.done():
            self._reserver = asyncio.create_task(self._reserve_waiting())
        return await waiting

    async def _reserve_waiting(self) -> None:
        while self._waiting:
            batch = [f for f in self._waiting if not f.done()]
            self._waiting = []
            try:
                granted = await self._grant(len(batch))
            except OrchmodeError as exc:
                for waiting in batch:
                    if not waiting.done():
                        waiting.set_exception(exc)
                continue
            for i, waiting in enumerate(batch):
                if not waiting.done():
                    waiting.set_result(i < granted)

    async def _grant(self, count: int) -> int:
        """Reserve ``count`` subagents, or as many as the cap leaves room for."""
        if count == 0:
            return 0
        reserve = self.store.reserve
        if await reserve(self.session, self.caps, subagents=count, tokens=0, cost=0.0):
            return count
        granted = 0  # near the cap: one at a time, until it says no
        while granted < count and await reserve(
            self.session, self.caps, subagents=1, tokens=0, cost=0.0
        ):
            granted += 1
        return granted

    async def flush(self) -> None:
        """Wait until every request's use so far is in the ledger."""
        self._hurry.set()
        try:
            while self._settler is not None and not self._settler.done():
                await asyncio.shield(self._settler)
        finally:
            self._hurry.clear()

    async def _settle_unsettled(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), SETTLE_WINDOW)
        while self._unsettled_tokens or self._unsettled_cost:
            tokens, cost = self._unsettled_tokens, self._unsettled_cost
            self._unsettled_tokens, self._unsettled_cost = 0, 0.0
            try:
                await self.store.adjust_budget(self.session, tokens=tokens, cost=cost)
            except OrchmodeError as exc:  # the ledger is short by this much; the run goes on
                log.warning("could not add %d tokens to the budget ledger: %s", tokens, exc)

    def describe(self, state: BudgetState) -> str:
        """``12 of 500 subagents launched; 120,340 tokens; $0.84 spent``, with any caps."""
        return describe_budget(state, self.settings)


def describe_budget(state: BudgetState, settings: Settings) -> str:
    """``12 of 500 subagents launched; 120,340 tokens; $0.84 spent``, with the caps of
    ``settings``; no dollars where a model has no price."""
    parts = [f"{state.subagents} of {settings.max_subagents} subagents launched"]
    tokens = f"{state.tokens:,}"
    if settings.max_session_tokens is not None:
        tokens += f" of {settings.max_session_tokens:,}"
    parts.append(f"{tokens} tokens")
    if settings.unpriced() is None:
        cost = f"${state.cost:.2f}"
        if settings.max_cost is not None:
            cost += f" of ${settings.max_cost:.2f}"
        parts.append(f"{cost} spent")
    return "; ".join(parts)
