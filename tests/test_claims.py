"""The claim object, on both stores: taken or waited on, renewed, handed over, let go once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from both_stores import DONE
from orchmode.core.events import Role
from orchmode.core.results import AgentResult
from orchmode.store import Store
from orchmode.store.claims import Claim, holder_name

LEASE = 0.6


class CountingStore:
    """A store that counts the writes that end a claim: releases, and records that let go."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.endings = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def release(self, key: str, holder: str) -> None:
        self.endings += 1
        await asyncio.sleep(0)  # a write takes a while: a cancellation may come meanwhile
        await self.store.release(key, holder)

    async def record(
        self, key: str, role: Role, prompt: str, result: AgentResult, *, holder: str = ""
    ) -> None:
        if holder:
            self.endings += 1
        await asyncio.sleep(0)
        await self.store.record(key, role, prompt, result, holder=holder)


def fresh_key() -> str:
    return f"k-{uuid.uuid4().hex[:8]}"


async def test_a_free_key_is_claimed_and_a_second_taker_waits_for_its_result(
    store: Store,
) -> None:
    mine = await Claim.or_result(store, "k", holder_name(), LEASE)
    assert isinstance(mine, Claim)
    waiting = asyncio.create_task(Claim.or_result(store, "k", holder_name(), LEASE))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await mine.record("worker", "p", DONE)
    assert await asyncio.wait_for(waiting, 5) == DONE


async def test_a_claim_kept_renewed_outlives_its_lease_and_is_free_once_released(
    store: Store,
) -> None:
    mine = await Claim.within(store, "k", holder_name(), LEASE, 0)
    assert mine is not None
    async with mine:
        await asyncio.sleep(LEASE + 0.2)  # past the lease: renewed meanwhile
        assert await Claim.within(store, "k", holder_name(), LEASE, 0.1) is None
    theirs = await Claim.within(store, "k", holder_name(), LEASE, 0)
    assert theirs is not None
    await theirs.release()


async def test_a_claim_handed_over_in_this_process_is_the_takers_own(store: Store) -> None:
    taken = await Claim.or_result(store, "k", holder_name(), LEASE)
    assert isinstance(taken, Claim)
    taken.keep()
    taken.hand_over()
    held = Claim.held(store, "k", taken.holder, LEASE)
    assert held is taken
    await held.record("worker", "p", DONE)
    await taken.release()  # the taker's own release after the executor's record: nothing
    assert await store.holder("k") is None
    assert await store.lookup("k") == DONE


async def test_a_claim_held_on_another_node_is_renewed_there(store: Store) -> None:
    holder = holder_name(renewed_here=False)
    taken = await Claim.or_result(store, "k", holder, LEASE)
    assert isinstance(taken, Claim)
    taken.hand_over()
    # What an actor on another node does with the job's key and holder: its own object.
    remote = Claim(store, "k", holder, LEASE)
    remote.keep()
    await asyncio.sleep(LEASE + 0.2)
    assert await store.holder("k") == holder
    await remote.release()
    assert await store.holder("k") is None


async def test_a_taker_cancelled_while_waiting_leaves_the_holders_claim_alone(
    store: Store,
) -> None:
    mine = await Claim.within(store, "k", holder_name(), LEASE, 0)
    assert mine is not None
    waiting = asyncio.create_task(Claim.or_result(store, "k", holder_name(), LEASE))
    await asyncio.sleep(0.1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await store.holder("k") == mine.holder
    await mine.release()


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    enders=st.lists(st.sampled_from(["release", "record"]), min_size=1, max_size=6),
    cancel_after=st.lists(st.integers(min_value=0, max_value=3), min_size=6, max_size=6),
)
async def test_a_claim_ends_exactly_once_however_many_end_it_and_are_cancelled(
    store: Store, enders: list[str], cancel_after: list[int]
) -> None:
    counting = CountingStore(store)
    key = fresh_key()
    claim = await Claim.or_result(counting, key, holder_name(), LEASE)  # type: ignore[arg-type]
    assert isinstance(claim, Claim)
    claim.keep()

    async def end(how: str) -> None:
        if how == "release":
            await claim.release()
        else:
            await claim.record("worker", "p", DONE)

    tasks = [asyncio.create_task(end(how)) for how in enders]
    for task, steps in zip(tasks, cancel_after, strict=False):
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await claim.release()  # and once more after all that: still once
    assert counting.endings == 1
    assert await store.holder(key) is None
    assert await Claim.within(store, key, holder_name(), LEASE, 0) is not None
