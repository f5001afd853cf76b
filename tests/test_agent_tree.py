"""The tree of agents and its cost roll-up: a subtree costs its root and every agent below it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmode.core.events import ModelRequestDone, Role, SubagentStarted
from orchmode.records.agent_tree import CallTree, parent_key
from orchmode.records.codec import event_row
from orchmode.records.history import read_session
from tree_events import PlannedCall, in_order, plan_tree, play, shuffled, subtree_cost

#: Each call's workers, then how many calls each of its workers makes.
shapes = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=9)


def test_a_parent_mark_names_a_worker_or_nothing() -> None:
    assert parent_key("3.2") == (3, 2)
    assert parent_key("12.10") == (12, 10)
    for nothing in ("", "3", "3.", ".2", "a.b", "3.2.1", "-1.2"):
        assert parent_key(nothing) is None


def test_a_link_that_would_make_a_call_its_own_ancestor_is_left_out() -> None:
    tree = CallTree()
    tree.link(2, "1.1")
    tree.link(3, "2.1")
    tree.link(1, "3.1")  # only a damaged record says so
    tree.link(4, "4.1")
    assert tree.maker(1) is None and tree.maker(4) is None
    assert tree.depth(3) == 3 and tree.below((1, 1)) == [2, 3]
    tree.link(3, "1.2")  # a call started again keeps its first maker
    assert tree.maker(3) == (2, 1)


def _costs_by_call(calls: list[PlannedCall]) -> dict[int, float]:
    return {planned.call: sum(planned.costs.values()) for planned in calls}


@given(shapes, st.randoms(use_true_random=False))
def test_a_subtree_costs_its_worker_and_every_agent_below_in_any_link_order(
    shape: list[list[int]], rng: random.Random
) -> None:
    calls = plan_tree(shape)
    links = [(planned.call, planned.parent) for planned in calls]
    rng.shuffle(links)
    tree = CallTree()
    for call, parent in links:
        tree.link(call, parent)
    for planned in calls:
        assert tree.depth(planned.call) == planned.depth
        for index in range(1, planned.workers + 1):
            own = planned.costs[(index, "worker")]
            expected = subtree_cost(calls, planned.call, index, lambda *_: True)
            got = tree.subtree_cost((planned.call, index), own, _costs_by_call(calls))
            assert got == pytest.approx(expected)


@given(shapes, st.integers(0, 2**32), st.floats(0, 1))
def test_the_history_rolls_up_costs_at_any_moment_of_any_run(
    shape: list[list[int]], seed: int, cut: float
) -> None:
    """Read back after any prefix of any order the run could send: what was paid so far."""
    calls = plan_tree(shape)
    events = play(calls, shuffled(seed))
    events = events[: round(len(events) * cut)]
    asked = {
        ev.agent for ev in events if isinstance(ev, ModelRequestDone)
    }  # an agent has paid once its request is done

    def spent(call: int, index: int, role: Role) -> bool:
        return f"{role} {call}.{index}" in asked

    history = read_session([event_row(seq, event) for seq, event in enumerate(events)])
    if not history.turns:
        return
    turn = history.turns[0]
    for agent in turn.agents:
        if agent.role == "worker":
            expected = subtree_cost(calls, agent.call, agent.index, spent)
            assert turn.subtree_cost(agent) == pytest.approx(expected), agent.name
    started = {(e.call, e.index) for e in events if isinstance(e, SubagentStarted)}
    for fanout in turn.fanouts:
        planned = calls[fanout.call - 1]
        assert fanout.depth == planned.depth
        maker = turn.maker(fanout)
        if planned.parent:  # its maker started before it did, so it hangs under it
            assert maker is not None and f"{maker.call}.{maker.index}" == planned.parent
            assert (maker.call, maker.index) in started
            assert fanout in turn.nested(maker) and fanout not in turn.top_fanouts
        else:
            assert maker is None and fanout in turn.top_fanouts


def test_a_flat_run_s_agents_cost_only_themselves() -> None:
    calls = plan_tree([[3], [2]])
    events = play(calls, in_order)
    turn = read_session([event_row(seq, event) for seq, event in enumerate(events)]).turns[0]
    assert not turn.tree and turn.top_fanouts == turn.fanouts
    for agent in turn.agents:
        assert turn.subtree_cost(agent) == agent.cost > 0
        assert turn.nested(agent) == []
