"""A session's budget as the user reads it: the ledger against its caps, and what it used."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import OrchmodeError
from ..core.settings import Settings
from ..model.budget import describe_budget
from ..records.totals import SessionTotals, session_totals, web_uses
from ..store import BudgetState, Store


@dataclass(frozen=True)
class BudgetReport:
    """What ``orchmode budget`` prints: the ledger (subagents launched, tokens, dollars)
    against the caps of the settings it was read with, and the requests behind it."""

    session: str
    #: The ledger: reservations not yet settled included.
    ledger: BudgetState
    #: The requests recorded, by agent and by model.
    used: SessionTotals
    settings: Settings

    @property
    def subagents_left(self) -> int:
        return max(0, self.settings.max_subagents - self.ledger.subagents)

    def describe(self) -> str:
        """One line: ``12 of 500 subagents launched; 120,340 tokens; $0.84 spent``."""
        return describe_budget(self.ledger, self.settings)

    def describe_web(self) -> str:
        """``2 web searches ($0.0200), 1 web fetch``: the API's web tools used, with what
        the searches cost at each answering model's price; "" when none was used."""
        usage = self.used.all.usage
        uses = web_uses(usage)
        if not uses or not usage.web_search_requests:
            return uses
        dollars = 0.0
        for model, part in self.used.by_model.items():
            price = self.settings.price(model or None)
            dollars += price.searches(part.usage.web_search_requests) if price else 0.0
        searches, _, rest = uses.partition(", ")
        return f"{searches} (${dollars:.4f})" + (f", {rest}" if rest else "")

    def lines(self) -> list[str]:
        """The whole report, a line a quantity, as ``orchmode budget`` prints it."""
        state, s = self.ledger, self.settings
        tokens = f"{state.tokens:,} used" + (
            f" of {s.max_session_tokens:,}" if s.max_session_tokens else ""
        )
        cost = f"${state.cost:.2f} spent" + (f" of ${s.max_cost:.2f}" if s.max_cost else "")
        lines = [
            f"session    {self.session}",
            f"subagents  {state.subagents} launched of {s.max_subagents} "
            f"({self.subagents_left} left)",
            f"tokens     {tokens}",
            f"cost       {cost}",
            f"requests   {self.used.all.requests:,} to the model",
        ]
        if models := self.used.describe_models():
            lines.append(f"models     {models}")
        if batched := self.used.all.describe_batched():
            lines.append(f"batched    {batched}")
        if web := self.describe_web():
            lines.append(f"web        {web}")
        lines.append(f"cache      {self.used.describe_cache()}")
        return lines


async def budget_report(store: Store, session: str | None, settings: Settings) -> BudgetReport:
    """The budget of ``session`` (the most recent one when None) in ``store``.

    Raises :class:`OrchmodeError` when the store has no such session, or none at all.
    """
    session = session or await store.latest_session()
    if session is None:
        raise OrchmodeError(
            f"no sessions are recorded in {store.location} — run `orchmode run` first"
        )
    if await store.load_session(session) is None:
        raise OrchmodeError(f"no session named {session!r} is recorded in {store.location}")
    state = await store.budget(session)
    return BudgetReport(session, state, session_totals(await store.events(session)), settings)
