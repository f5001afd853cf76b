"""Parking: an agent waiting for the user gives its slot away and takes one back first."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.executors.parking import PARKING, current, parked
from orchmode.fanout.slots import WORKER_PRIORITY, PrioritySlots, Tenure


class Census:
    """How many holders run at once (not parked), and the most there ever were."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def leave(self) -> None:
        self.now -= 1


def test_a_parked_holder_gives_its_slot_to_the_next_and_comes_back_before_the_queue() -> None:
    async def scenario() -> list[str]:
        slots = PrioritySlots(1)
        order: list[str] = []
        answer = asyncio.Event()
        a_parked = asyncio.Event()
        b_running = asyncio.Event()

        async def a() -> None:
            async with slots.slot(WORKER_PRIORITY) as tenure:
                order.append("a runs")
                async with tenure.parked():
                    a_parked.set()
                    await answer.wait()
                order.append("a back")

        async def b() -> None:
            await a_parked.wait()
            async with slots.slot(WORKER_PRIORITY):
                order.append("b runs")
                b_running.set()
                await asyncio.sleep(0)  # yield, so c queues behind a's return
                answer.set()
                await asyncio.sleep(0)
                order.append("b done")

        async def c() -> None:
            await b_running.wait()
            async with slots.slot(WORKER_PRIORITY):
                order.append("c runs")

        await asyncio.wait_for(asyncio.gather(a(), b(), c()), 5)
        return order

    order = asyncio.run(scenario())
    assert order == ["a runs", "b runs", "b done", "a back", "c runs"]


def test_parked_time_is_counted_apart() -> None:
    async def scenario() -> float:
        slots = PrioritySlots(1)
        async with slots.slot(WORKER_PRIORITY) as tenure:
            async with tenure.parked():
                await asyncio.sleep(0.05)
            return tenure.parked_seconds

    assert asyncio.run(scenario()) >= 0.05


def test_overlapping_parks_give_the_slot_once_and_take_it_back_once() -> None:
    async def scenario() -> tuple[bool, int]:
        slots = PrioritySlots(1)
        census = Census()
        release = asyncio.Event()
        async with slots.slot(WORKER_PRIORITY) as tenure:

            async def wait_parked() -> None:
                async with tenure.parked():
                    await release.wait()

            waits = [asyncio.create_task(wait_parked()) for _ in range(3)]
            await asyncio.sleep(0)

            async def other() -> None:
                async with slots.slot(WORKER_PRIORITY):
                    census.enter()
                    release.set()
                    census.leave()

            await asyncio.wait_for(asyncio.gather(other(), *waits), 5)
            held = tenure.held
        return held, slots._free

    held, free = asyncio.run(scenario())
    assert held and free == 1


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(1, 3),
    plans=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.integers(0, 3)), min_size=1, max_size=8
    ),
)
def test_parking_never_runs_more_than_the_limit_nor_loses_a_slot(
    limit: int, plans: list[tuple[bool, bool, int]]
) -> None:
    """Holders park or not, are cancelled while parked or not: at no time do more than
    ``limit`` run unparked, and every slot is free again at the end."""

    async def scenario() -> tuple[int, int]:
        slots = PrioritySlots(limit)
        census = Census()

        async def holder(parks: bool, cancelled: bool, steps: int) -> None:
            async with slots.slot(WORKER_PRIORITY) as tenure:
                census.enter()
                running = True
                try:
                    for _ in range(steps):
                        await asyncio.sleep(0)
                    if parks:
                        census.leave()
                        running = False
                        try:
                            async with tenure.parked():
                                for _ in range(steps + 1):
                                    await asyncio.sleep(0)
                        finally:
                            if tenure.held:
                                census.enter()
                                running = True
                finally:
                    if running:
                        census.leave()

        tasks = [asyncio.create_task(holder(*plan)) for plan in plans]
        for _ in range(3):
            await asyncio.sleep(0)
        for task, (parks, cancelled, _) in zip(tasks, plans, strict=True):
            if cancelled and parks:
                task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        return census.most, slots._free

    most, free = asyncio.run(scenario())
    assert most <= limit
    assert free == limit


def test_parking_reaches_what_the_agent_starts_and_does_nothing_outside_a_fanout() -> None:
    async def scenario() -> tuple[bool, bool]:
        outside = current() is None
        async with parked(current()):  # no fan-out: a plain wait
            pass
        slots = PrioritySlots(1)
        async with slots.slot(WORKER_PRIORITY) as tenure:
            token = PARKING.set(tenure)
            try:
                seen = await asyncio.create_task(_current_tenure())
            finally:
                PARKING.reset(token)
        return outside, seen is tenure

    outside, inherited = asyncio.run(scenario())
    assert outside and inherited


async def _current_tenure() -> object:
    return current()


@pytest.mark.parametrize("limit", [1, 2])
def test_a_holder_cancelled_while_coming_back_gives_up_its_place(limit: int) -> None:
    async def scenario() -> int:
        slots = PrioritySlots(limit)
        parked_now = asyncio.Event()
        hold = asyncio.Event()

        async def parker() -> None:
            async with slots.slot(WORKER_PRIORITY) as tenure:
                assert isinstance(tenure, Tenure)
                async with tenure.parked():
                    parked_now.set()

        async def hogs() -> None:
            await parked_now.wait()
            async with asyncio.TaskGroup() as group:
                for _ in range(limit):
                    group.create_task(hog())

        async def hog() -> None:
            async with slots.slot(WORKER_PRIORITY):
                await hold.wait()

        task = asyncio.create_task(parker())
        hogging = asyncio.create_task(hogs())
        while slots._free:  # until every slot is taken by the hogs
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()  # waiting to come back
        await asyncio.gather(task, return_exceptions=True)
        hold.set()
        await asyncio.wait_for(hogging, 5)
        return slots._free

    assert asyncio.run(scenario()) == limit


def test_an_agent_on_another_node_is_parked_here_from_the_events_it_sends() -> None:
    """A Ray node asks the user itself; the driver gives the agent's slot away from the
    question's event to its answer's, and stops waiting for it when the agent is done."""
    from orchmode.core.events import ApprovalAnswered, ApprovalRequested
    from orchmode.executors.parking import RemoteParking

    async def scenario() -> tuple[list[str], int]:
        slots = PrioritySlots(1)
        order: list[str] = []
        asked = asyncio.Event()
        other_ran = asyncio.Event()

        async def remote_agent() -> None:
            async with slots.slot(WORKER_PRIORITY) as tenure:
                away = RemoteParking(tenure)
                away.follow(ApprovalRequested(4, "worker 1.1", "domain", "pypi.org:443", "ask"))
                away.follow(ApprovalRequested(5, "worker 1.1", "domain", "npmjs.org:443", "ask"))
                asked.set()
                await other_ran.wait()
                away.follow(ApprovalAnswered(4, "worker 1.1", "approved", False, ""))
                order.append("one answer of two")
                away.follow(ApprovalAnswered(5, "worker 1.1", "approved", False, ""))
                await away.end()  # done on its node before a slot came back
                order.append("remote done")

        async def other() -> None:
            await asked.wait()
            await asyncio.sleep(0)
            async with slots.slot(WORKER_PRIORITY):
                order.append("other runs")
                other_ran.set()

        await asyncio.wait_for(asyncio.gather(remote_agent(), other()), 5)
        return order, slots._free

    order, free = asyncio.run(scenario())
    assert order[0] == "other runs" and "remote done" in order
    assert free == 1
