"""Budgets per agent and per subtree: never over, exact however many requests are in flight."""

from __future__ import annotations

import asyncio
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.core.errors import AllowanceSpent, BudgetExhausted
from orchmode.core.pricing import ModelPrice
from orchmode.core.results import Status
from orchmode.executors import Job
from orchmode.fanout.plans import budget_of, plan_subtasks
from orchmode.model.allowance import (
    ALLOWANCE,
    MIN_OUTPUT,
    AgentLimits,
    Allowance,
    allowance_for,
    allowance_here,
    running,
)

PRICE = ModelPrice(input=4, output=20, cache_write=5, cache_read=0.2)


def _within(level: Allowance) -> None:
    """What a level has spent and reserved together never passes its limits."""
    if level.limits.tokens is not None:
        assert level.spent_tokens + level.reserved_tokens <= level.limits.tokens
    if level.limits.usd is not None:
        assert level.spent_usd + level.reserved_usd <= level.limits.usd + 1e-9


@settings(max_examples=60)
@given(
    root_tokens=st.integers(5_000, 200_000),
    child_tokens=st.lists(st.one_of(st.none(), st.integers(2_000, 80_000)), min_size=1, max_size=6),
    requests=st.lists(
        st.tuples(
            st.integers(0, 5),  # which child's agent asks
            st.integers(100, 6_000),  # its input
            st.floats(0.0, 1.0),  # the share of its reservation it really uses
            st.integers(0, 3),  # how many times it yields while in flight
        ),
        min_size=1,
        max_size=40,
    ),
)
async def test_concurrent_requests_never_reserve_past_any_level_and_spent_is_exact(
    root_tokens: int,
    child_tokens: list[int | None],
    requests: list[tuple[int, int, float, int]],
) -> None:
    root = Allowance(AgentLimits(tokens=root_tokens), name="worker 1.1")
    middle = root.child(AgentLimits(), "worker 1.1.1")
    leaves = [middle.child(AgentLimits(tokens=t), f"w {i}") for i, t in enumerate(child_tokens)]
    levels = [root, middle, *leaves]
    used: dict[int, int] = {id(level): 0 for level in levels}

    async def ask(leaf: Allowance, input_tokens: int, share: float, yields: int) -> None:
        try:
            hold = await leaf.reserve(input_tokens, 4_000)
        except AllowanceSpent:
            return
        for level in levels:
            _within(level)
        for _ in range(yields):
            await asyncio.sleep(0)
        real = math.floor(hold.tokens * share)
        hold.settle(real, 0.0)
        for level in hold.levels:
            used[id(level)] += real
        for level in levels:
            _within(level)

    await asyncio.gather(
        *(ask(leaves[i % len(leaves)], n, share, y) for i, n, share, y in requests)
    )
    for level in levels:
        assert level.reserved_tokens == 0
        assert level.spent_tokens == used[id(level)]
        _within(level)


@settings(max_examples=40)
@given(
    usd=st.floats(0.05, 2.0),
    inputs=st.lists(st.integers(500, 8_000), min_size=1, max_size=30),
)
async def test_a_dollar_budget_is_never_passed_by_what_requests_could_cost(
    usd: float, inputs: list[int]
) -> None:
    subtree = Allowance(AgentLimits(usd=usd), name="worker 2.1")
    agents = [subtree.child(AgentLimits(), f"worker 2.1.{i}") for i in range(len(inputs))]

    async def ask(agent: Allowance, input_tokens: int) -> None:
        try:
            hold = await agent.reserve(input_tokens, 8_000, PRICE)
        except AllowanceSpent:
            return
        assert hold.usd <= usd
        await asyncio.sleep(0)
        hold.settle(hold.tokens, hold.usd)  # the worst case, really used

    await asyncio.gather(*(ask(a, n) for a, n in zip(agents, inputs, strict=True)))
    assert subtree.spent_usd <= usd + 1e-9
    assert subtree.reserved_usd == pytest.approx(0.0, abs=1e-12)


async def test_an_agent_short_of_room_asks_for_less_output_then_stops_saying_why() -> None:
    own = Allowance(AgentLimits(tokens=20_000), name="worker 1.3")
    hold = await own.reserve(5_000, 64_000)
    assert (hold.output_tokens, hold.cut, own.cut) == (15_000, True, True)
    hold.settle(19_874, 0.0)
    with pytest.raises(AllowanceSpent) as spent:
        await own.reserve(100, 64_000)
    assert spent.value.reason == "its budget of 20,000 tokens was spent (19,874 used)"
    assert isinstance(spent.value, BudgetExhausted)
    assert str(spent.value).startswith("worker 1.3: its budget of 20,000 tokens was spent")


async def test_less_than_the_least_output_left_is_a_spent_budget() -> None:
    own = Allowance(AgentLimits(tokens=10_000))
    with pytest.raises(AllowanceSpent):
        await own.reserve(10_000 - MIN_OUTPUT + 1, 64_000)
    hold = await own.reserve(10_000 - MIN_OUTPUT, 64_000)
    assert hold.output_tokens == MIN_OUTPUT


async def test_a_child_is_given_no_more_than_its_parent_has_left_and_names_the_subtree() -> None:
    parent = Allowance(AgentLimits(tokens=30_000, usd=1.0), name="worker 3.2")
    hold = await parent.reserve(4_000, 6_000)
    hold.settle(10_000, 0.25)
    asked = parent.child(AgentLimits(tokens=50_000, usd=0.1, turns=4), "worker 3.2.1")
    assert asked.limits == AgentLimits(tokens=20_000, usd=0.1, turns=4)
    free = parent.child(AgentLimits(), "worker 3.2.2")
    assert free.limits == AgentLimits()  # bounded by the chain, not by a limit of its own
    hold = await free.reserve(15_000, 64_000)
    assert hold.output_tokens == 5_000  # what the parent has room for
    hold.settle(19_500, 0.0)
    with pytest.raises(AllowanceSpent) as spent:
        await free.reserve(10, 64_000)
    assert "the budget of its subtree (under worker 3.2) of 30,000 tokens" in spent.value.reason


async def test_a_request_waits_for_room_others_hold_rather_than_stopping() -> None:
    subtree = Allowance(AgentLimits(tokens=10_000))
    first, second = subtree.child(AgentLimits()), subtree.child(AgentLimits())
    held = await first.reserve(2_000, 6_000)
    waiting = asyncio.ensure_future(second.reserve(2_000, 6_000))
    await asyncio.sleep(0)
    assert not waiting.done()
    held.settle(1_000, 0.0)  # most of it given back
    hold = await waiting
    assert hold.output_tokens == 6_000
    assert subtree.reserved_tokens == 8_000


async def test_the_running_agents_allowance_is_a_context_variable() -> None:
    assert ALLOWANCE.get() is None
    lone = allowance_for(AgentLimits(tokens=5_000), "worker 1.1")
    assert lone.parent is None
    with running(lone):
        nested = allowance_for(AgentLimits(tokens=50_000), "worker 1.1.1")
        assert nested.parent is lone and nested.limits.tokens == 5_000
        assert allowance_here(AgentLimits(tokens=1), "x") is lone
    assert ALLOWANCE.get() is None
    assert allowance_here(AgentLimits(tokens=7), "worker 4.1").limits.tokens == 7
    # only a chain that limits tokens or dollars has anything to reserve
    assert not Allowance(AgentLimits(turns=3)).limited
    assert Allowance(AgentLimits(usd=1.0)).child(AgentLimits(turns=3)).limited


def test_limits_are_plain_data_and_fill_in_from_defaults() -> None:
    limits = AgentLimits(tokens=20_000, turns=3)
    assert pickle.loads(pickle.dumps(limits)) == limits
    job = Job("k", "h", "s", "worker", "worker 1.1", "p", limits=limits)
    assert pickle.loads(pickle.dumps(job)).limits == limits  # as a cluster's node gets it
    assert limits.over(AgentLimits(9, 0.5, 15)) == AgentLimits(20_000, 0.5, 3)
    assert limits.describe() == "20,000 tokens, 3 turns"
    assert Status.BUDGET.value == "budget"


def test_a_subtask_budget_is_read_with_its_plan() -> None:
    plan = plan_subtasks(
        {"subtasks": [{"prompt": "a", "budget": {"tokens": 20_000, "usd": 1, "turns": 5}}, "b"]},
        10,
    )
    assert not isinstance(plan, str)
    assert plan.budget_of(0) == AgentLimits(20_000, 1.0, 5)
    assert plan.budget_of(1) is None
    assert budget_of({"usd": 0.5}) == AgentLimits(usd=0.5)


@pytest.mark.parametrize(
    ("budget", "words"),
    [
        ({"tokens": 0}, '"budget" tokens must be a whole number above 0, not 0'),
        ({"tokens": 1.5}, "tokens must be a whole number above 0, not 1.5"),
        ({"turns": True}, "turns must be a whole number above 0, not true"),
        ({"usd": -1}, "usd must be a number of dollars above 0, not -1"),
        ({"usd": "1"}, 'usd must be a number of dollars above 0, not "1"'),
        ({"usd": math.nan}, "usd must be a number of dollars above 0"),
        ({"dollars": 1}, 'unknown key "dollars" in "budget"'),
        ({}, '"budget" takes {"tokens": 20000'),
        (20_000, '"budget" takes {"tokens": 20000'),
    ],
)
def test_a_bad_budget_is_a_clear_error_and_nothing_runs(budget: object, words: str) -> None:
    plan = plan_subtasks({"subtasks": [{"prompt": "a"}, {"prompt": "b", "budget": budget}]}, 10)
    assert isinstance(plan, str)
    assert plan.startswith("error: subtask 2: ")
    assert words in plan
    assert plan.endswith("nothing was run")
