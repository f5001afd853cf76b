"""Token and dollar caps: each request reserves its worst case first, so nothing overshoots."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from conftest import StartServer, conversation_for, settings_for, store_for
from orchmode.core.events import TokenUsage
from orchmode.core.pricing import ModelPrice, default_prices
from orchmode.core.prompts import MAIN_SYSTEM, MAIN_TOOLS
from orchmode.model.budget import BudgetExhausted, SessionBudget, estimate_input_tokens
from orchmode.store.sqlite import SQLiteStore
from orchmode.testing import Reply
from orchmode.testing.scenario import OrchestrationScenario

PRICE = ModelPrice(input=4, output=20, cache_write=5, cache_read=0.2)


def test_cost_adds_each_kind_of_token_at_its_price() -> None:
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=2_000_000,
                       cache_write_tokens=400_000)  # fmt: skip
    assert PRICE.cost(usage) == pytest.approx(4 + 2 + 0.4 + 2)
    assert PRICE.worst_case(1_000_000, 100_000) == pytest.approx(5 + 2)


def test_cache_writes_kept_an_hour_cost_their_own_rate_and_a_batch_halves_every_rate() -> None:
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=100_000,
                       cache_write_tokens=400_000, cache_write_1h_tokens=300_000)  # fmt: skip
    # 100k written for five minutes at 5, 300k for an hour at twice the input rate (8)
    assert PRICE.cost(usage) == pytest.approx(4 + 2 + 0.5 + 2.4)
    assert PRICE.batched().cost(usage) == pytest.approx((4 + 2 + 0.5 + 2.4) / 2)
    own = ModelPrice(input=4, output=20, cache_write=5, cache_read=0.2, cache_write_1h=6)
    assert own.cost(usage) == pytest.approx(4 + 2 + 0.5 + 1.8)
    # the worst case counts the hour-long rate only for a request that asks for it
    assert PRICE.worst_case(1_000_000, 100_000) == pytest.approx(5 + 2)
    assert PRICE.batched().worst_case(1_000_000, 0, hour_writes=True) == pytest.approx(4)


def test_the_default_model_has_a_price() -> None:
    assert "claude-opus-5-5" in default_prices()


def test_the_input_estimate_is_never_below_a_quarter_of_the_characters() -> None:
    messages = [{"role": "user", "content": "x" * 4000}]
    assert estimate_input_tokens("s" * 400, messages, []) >= 4400 / 4


async def test_a_token_cap_stops_requests_before_they_can_cross_it(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("short answer"))
    # Room for the first request's worst case (its estimated input and max_tokens of
    # output) and a little more, so the cap lets it through and stops a later one.
    first = estimate_input_tokens(
        MAIN_SYSTEM, [{"role": "user", "content": "question 0"}], MAIN_TOOLS
    )
    cap = first + 1000 + 500
    settings = settings_for(server, tmp_path, max_tokens=1000, max_session_tokens=cap)
    store = store_for(tmp_path)
    session = await conversation_for(settings, store=store)
    results = [await session.turn(f"question {i}") for i in range(5)]
    assert results[0].ok
    failed = [r for r in results if not r.ok]
    assert failed and isinstance(failed[0].error, BudgetExhausted)
    assert "--max-session-tokens" in failed[0].text
    state = await store.budget(session.session_id)
    assert state.tokens <= cap
    assert len(server.log) == sum(1 for r in results if r.ok)  # refused requests never left


async def test_settling_leaves_exactly_what_was_used(serve: StartServer, tmp_path: Path) -> None:
    server = await serve(lambda r: Reply.text("answer " * 30))
    settings = settings_for(server, tmp_path, max_cost=10.0)
    store = store_for(tmp_path)
    session = await conversation_for(settings, store=store)
    await session.turn("question")
    state = await store.budget(session.session_id)
    used = session.gateway.usage
    assert state.tokens == used.total_input + used.output_tokens
    assert state.cost == pytest.approx(default_prices()["claude-opus-5-5"].cost(used))


async def test_a_dollar_cap_skips_subagents_and_says_so(serve: StartServer, tmp_path: Path) -> None:
    scenario = OrchestrationScenario(subtasks=6, worker_command=None, scout_command=None)
    server = await serve(scenario)
    # Each request reserves its worst case, about $0.05 (2,000 output tokens at $20/MTok and
    # its input at the cache-write price) and really spends a few tenths of a cent (the whole
    # turn, uncapped, about $0.03): a cap of $0.06 admits one request at a time, and only
    # until a little has been spent.
    settings = settings_for(server, tmp_path, max_tokens=2000, max_cost=0.06, max_concurrent=2)
    store = store_for(tmp_path)
    session = await conversation_for(settings, store=store)
    result = await session.turn("go")
    state = await store.budget(session.session_id)
    assert 0 < state.cost <= 0.06
    sent = str([m for e in server.log for m in e.body["messages"] if m["role"] == "user"])
    stopped_subagents = "[orchmode: stopped — the session's budget is used up" in sent
    assert stopped_subagents or isinstance(result.error, BudgetExhausted)
    if stopped_subagents:
        assert "--max-cost" in sent


async def test_without_caps_nothing_is_reserved_but_use_is_recorded(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("fine"))
    settings = settings_for(server, tmp_path)
    store = store_for(tmp_path)
    budget = SessionBudget(store, "s", settings)
    assert not budget.metered
    assert await budget.before_request("s", [], []) is None
    await budget.after_request(None, TokenUsage(10, 5, 0, 0))
    await budget.flush()  # without caps, use reaches the ledger in the background
    assert (await store.budget("s")).tokens == 15
    del server


class LedgerWritesCounted(SQLiteStore):
    """A SQLite store that counts the settlements of the ledger it is asked for."""

    writes = 0

    async def adjust_budget(self, session: str, *, tokens: int, cost: float) -> None:
        self.writes += 1
        await super().adjust_budget(session, tokens=tokens, cost=cost)


async def test_an_uncapped_ledger_takes_many_requests_use_in_one_update(
    serve: StartServer, tmp_path: Path
) -> None:
    server = await serve(lambda r: Reply.text("fine"))
    store = LedgerWritesCounted.open(tmp_path / "ledger.db")
    try:
        budget = SessionBudget(store, "s", settings_for(server, tmp_path))
        for _ in range(40):
            await budget.after_request(None, TokenUsage(10, 5, 0, 0))
            await asyncio.sleep(0)  # the loop turns between requests, as in a fan-out
        await budget.flush()
        assert (await store.budget("s")).tokens == 40 * 15
        assert store.writes <= 2  # one per request would be 40
    finally:
        await store.close()
