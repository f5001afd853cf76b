"""The store, the same suite on both backends: journal, claims, budget ledger, migrations, races."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from both_stores import DONE, execute
from orchmode.core.errors import StoreError
from orchmode.core.events import TokenUsage
from orchmode.core.results import AgentResult, Status
from orchmode.store import ApprovalRequest, BudgetCaps, Store, content_key, open_store

BASE: dict[str, Any] = dict(
    role="worker", model="m", effort="xhigh", system="s", tools=[{"name": "bash"}], prompt="p"
)


@pytest.mark.parametrize(
    "change",
    [
        {"role": "verifier"},
        {"model": "m2"},
        {"effort": "high"},
        {"system": "s2"},
        {"tools": [{"name": "bash2"}]},
        {"prompt": "p2"},
    ],
)
def test_the_key_covers_everything_that_determines_a_result(change: dict[str, Any]) -> None:
    assert content_key(**{**BASE, **change}) != content_key(**BASE)
    assert content_key(**BASE) == content_key(**dict(BASE))


def reference_key(**parts: Any) -> str:
    """The journal key as every earlier version made it: one json.dumps of the whole."""
    whole = {k: v for k, v in parts.items() if v is not None}
    whole["tools"] = list(whole["tools"])
    if whole.get("isolation") == "shared":
        del whole["isolation"]
    text = json.dumps(whole, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_text = st.text(max_size=40)
_schemas = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers() | _text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)


@given(
    role=st.sampled_from(["worker", "verifier", "resolver"]),
    model=_text,
    effort=_text,
    system=_text,
    tools=st.lists(_schemas, max_size=4),
    prompt=_text,
    isolation=st.sampled_from(["shared", "worktree"]),
    agent=st.none() | _text,
)
def test_the_key_is_the_one_earlier_versions_made(**parts: Any) -> None:
    """Journals written before keep their results: the key's text never changes, whether
    its tools list is encoded afresh or taken from the encodings kept."""
    expected = reference_key(**parts)
    assert content_key(**parts) == expected
    assert content_key(**parts) == expected  # the same schemas again: their kept encodings
    grown = parts["tools"]
    grown.append({"name": "added later"})  # the same list, one schema more
    assert content_key(**parts) == reference_key(**parts) != expected
    assert content_key(**{**parts, "tools": grown[::-1]}) == reference_key(
        **{**parts, "tools": grown[::-1]}
    )


async def test_a_finished_result_survives_reopening(store_url: str) -> None:
    store = await open_store(store_url)
    await store.record("k", "worker", "p", DONE)
    await store.close()
    store = await open_store(store_url)
    assert await store.lookup("k") == DONE
    assert await store.lookup("other") is None
    await store.close()


@pytest.mark.parametrize(
    "status", [Status.TURN_LIMIT, Status.MAX_TOKENS, Status.FAILED, Status.EMPTY]
)
async def test_unfinished_attempts_are_recorded_but_never_served(
    store: Store, store_url: str, status: Status
) -> None:
    await store.record("k", "worker", "p", AgentResult("partial", status))
    assert await store.lookup("k") is None
    assert execute(store_url, "SELECT key, status FROM attempts") == [("k", status.value)]


async def test_a_write_failure_is_logged_not_raised(
    store: Store, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    execute(store_url, "DROP TABLE results")
    with caplog.at_level(logging.WARNING, logger="orchmode"):
        await store.record("k", "worker", "p", DONE)
    assert "could not record" in caplog.text


async def test_a_claim_is_exclusive_until_released(store: Store) -> None:
    assert await store.claim("k", "a", 30)
    assert not await store.claim("k", "b", 30)
    assert await store.claim("k", "a", 30)  # already ours
    await store.release("k", "b")  # not b's to release
    assert not await store.claim("k", "b", 30)
    await store.release("k", "a")
    assert await store.claim("k", "b", 30)


async def test_recording_with_the_holder_lets_its_claim_go_in_the_same_write(
    store: Store,
) -> None:
    assert await store.claim("k", "a", 30)
    await store.record("k", "worker", "p", DONE, holder="b")  # not b's claim: it stays
    assert not await store.claim("k", "c", 30)
    await store.record("k", "worker", "p", DONE, holder="a")
    assert await store.lookup("k") == DONE
    assert await store.claim("k", "c", 30)


async def test_an_expired_claim_is_taken_over_and_its_holder_knows(store: Store) -> None:
    assert await store.claim("k", "dead", -1)  # a lease that has already run out
    assert await store.claim("k", "alive", 30)
    assert not await store.renew("k", "dead", 30)
    assert await store.renew("k", "alive", 30)


async def test_reservations_stop_exactly_at_each_cap(store: Store) -> None:
    caps = BudgetCaps(max_subagents=3)
    got = [await store.reserve("s", caps, subagents=1, tokens=0, cost=0.0) for _ in range(5)]
    assert got == [True, True, True, False, False]
    assert (await store.budget("s")).subagents == 3
    assert (await store.budget("other")).subagents == 0
    tokens = BudgetCaps(max_subagents=100, max_tokens=1000)
    assert await store.reserve("t", tokens, subagents=1, tokens=600, cost=0.0)
    assert not await store.reserve("t", tokens, subagents=1, tokens=600, cost=0.0)
    await store.adjust_budget("t", tokens=-500, cost=0.0)  # it used less than reserved
    assert await store.reserve("t", tokens, subagents=1, tokens=600, cost=0.0)
    dollars = BudgetCaps(max_subagents=100, max_cost=1.0)
    assert await store.reserve("d", dollars, subagents=1, tokens=0, cost=0.75)
    assert not await store.reserve("d", dollars, subagents=1, tokens=0, cost=0.5)
    state = await store.budget("t")
    assert (state.subagents, state.tokens) == (2, 700)


async def test_parallel_reservations_never_overshoot(store: Store) -> None:
    import asyncio

    caps = BudgetCaps(max_subagents=20)
    got = await asyncio.gather(
        *(store.reserve("s", caps, subagents=1, tokens=0, cost=0.0) for _ in range(60))
    )
    assert sum(got) == 20 and (await store.budget("s")).subagents == 20


async def test_a_store_from_a_newer_orchmode_is_refused(store_url: str) -> None:
    store = await open_store(store_url)
    await store.close()
    execute(store_url, "INSERT INTO schema_migrations VALUES (99, 'future', 0)")
    with pytest.raises(StoreError, match="newer orchmode"):
        await open_store(store_url)


async def test_migrations_are_recorded_once(store_url: str) -> None:
    for _ in range(2):
        await (await open_store(store_url)).close()
    versions = [row[0] for row in execute(store_url, "SELECT version FROM schema_migrations")]
    assert sorted(versions) == list(range(1, len(versions) + 1)) and len(versions) >= 2


RACER = textwrap.dedent(
    """
    import asyncio, json, os, random, sys, time
    from pathlib import Path
    from orchmode.store import BudgetCaps, open_store

    async def main(url, holder, what, n):
        store = await open_store(url)
        print("ready", flush=True)
        sys.stdin.readline()  # the starting gun: every racer is ready
        line = Path(sys.argv[5])  # and the start line: each waits there for all four
        (line / holder).touch()
        while len(os.listdir(line)) < 4:
            time.sleep(0.001)  # polls the condition; a loaded machine starts racers late
        started = time.monotonic()
        won = []
        order = list(range(n))
        random.Random(holder).shuffle(order)  # each racer goes its own way through the keys
        for i in order:
            if what == "claim":
                if await store.claim(f"key-{i}", holder, 60):
                    won.append(i)
            elif await store.reserve("race", BudgetCaps(max_subagents=500), subagents=1,
                                     tokens=0, cost=0.0):
                won.append(i)
        finished = time.monotonic()
        await store.close()
        print(json.dumps({"won": won, "started": started, "finished": finished}))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


def race(url: str, what: str, n: int) -> list[list[int]]:
    """Four processes doing the same thing to the same store at the same time; what each
    one won (a lock need not be fair, so one racer may win everything)."""
    return [r["won"] for r in run_racers(RACER, lambda i: [url, f"racer-{i}", what, str(n)])]


def run_racers(script: str, argv: Callable[[int], list[str]]) -> list[dict[str, Any]]:
    """Four processes of ``script`` (each given ``argv(i)`` and then the start line's
    directory) started together: each says "ready", hears the starting gun on its stdin,
    then waits at the start line for all four. Their JSON reports, after checking that all
    four really were at work at once (CLOCK_MONOTONIC is one clock for every process on the
    machine)."""
    start_line = Path(tempfile.mkdtemp(prefix="orchmode-race-"))
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv(i), str(start_line)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    shutil.rmtree(start_line)
    assert all(racer.returncode == 0 for racer in racers)
    reports = [json.loads(output) for output in outputs]
    assert max(r["started"] for r in reports) < min(r["finished"] for r in reports)
    return reports


async def test_four_processes_racing_on_a_thousand_claims_win_each_exactly_once(
    store_url: str,
) -> None:
    await (await open_store(store_url)).close()
    wins = race(store_url, "claim", 1000)
    every = [key for won in wins for key in won]
    assert sorted(every) == list(range(1000))


async def test_four_processes_reserving_against_a_cap_of_500_get_exactly_500(
    store_url: str,
) -> None:
    await (await open_store(store_url)).close()
    wins = race(store_url, "reserve", 200)
    assert sum(len(won) for won in wins) == 500
    store = await open_store(store_url)
    assert (await store.budget("race")).subagents == 500
    await store.close()


def test_a_corrupt_sqlite_file_is_a_clear_error(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "j.db"
    path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(StoreError, match=r"is damaged .* orchmode has not changed it"):
        asyncio.run(open_store(f"sqlite://{path}"))
    assert path.read_bytes() == b"this is not a database at all" * 100


async def test_an_unwritable_sqlite_location_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot open the store"):
        await open_store(f"sqlite://{blocker / 'j.db'}")


async def test_sqlite_uses_wal_and_full_sync(tmp_path: Path) -> None:
    await (await open_store(f"sqlite://{tmp_path / 'j.db'}")).close()
    db = sqlite3.connect(tmp_path / "j.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


async def test_an_unknown_store_scheme_is_a_config_error() -> None:
    from orchmode.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unsupported store 'mysql'"):
        await open_store("mysql://x")


async def test_a_session_is_saved_found_and_updated(store: Store) -> None:
    from orchmode.store import SessionRecord

    assert await store.latest_session() is None
    assert await store.load_session("a") is None
    await store.save_session("a", "/work", '{"history": []}')
    await store.save_session("b", "/work", '{"history": [1]}')
    await store.save_session("a", "/elsewhere", '{"history": [2]}')
    assert await store.load_session("a") == SessionRecord("/elsewhere", '{"history": [2]}')
    assert await store.latest_session() == "a"


async def test_events_come_back_in_order_and_number_on(store: Store) -> None:
    from orchmode.store import EventRow

    assert await store.next_event_seq("s") == 1
    rows = [EventRow(i, 100.0 + i, "Kind", f'{{"n": {i}}}') for i in range(1, 4)]
    await store.append_events("s", rows[::-1])
    await store.append_events("other", [EventRow(1, 1.0, "Kind", "{}")])
    assert await store.events("s") == rows
    assert await store.next_event_seq("s") == 4


async def test_sessions_are_listed_newest_first_with_those_known_only_by_events(
    store: Store, store_url: str
) -> None:
    from orchmode.store import EventRow, SessionInfo

    assert await store.sessions() == []
    await store.save_session("old", "/work/a", "{}")
    await store.save_session("new", "/work/b", "{}")
    # A run killed in its first turn recorded events but never saved its state.
    await store.append_events("killed", [EventRow(1, 1.0e12, "TurnStarted", "{}")])
    await store.append_events("killed", [EventRow(2, 1.0e12 + 5, "TurnDone", "{}")])
    await store.append_events("old", [EventRow(1, 3.0, "TurnStarted", "{}")])
    listed = await store.sessions()
    assert [s.id for s in listed] == ["killed", "new", "old"]
    assert listed[0] == SessionInfo("killed", "", 1.0e12, 1.0e12 + 5)
    assert listed[1].workdir == "/work/b"
    assert listed[1].created_at <= listed[1].updated_at
    updated = {s.id: s.updated_at for s in listed}
    assert updated["new"] >= updated["old"]
    execute(store_url, "UPDATE sessions SET updated_at = 2e12 WHERE id = 'old'")
    assert [s.id for s in await store.sessions()] == ["old", "killed", "new"]


async def test_settling_a_new_session_creates_its_ledger(store: Store) -> None:
    await store.adjust_budget("fresh", tokens=1234, cost=0.5)
    state = await store.budget("fresh")
    assert (state.subagents, state.tokens, state.cost) == (0, 1234, 0.5)


def test_a_locked_sqlite_file_is_a_clear_error(tmp_path: Path) -> None:
    from orchmode.store.sqlite import SQLiteStore

    path = tmp_path / "j.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another program holds the file
    try:
        with pytest.raises(StoreError, match="locked by another program"):
            SQLiteStore.open(path, busy_timeout=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_a_wave_reserving_together_never_overshoots_the_cap(store: Store) -> None:
    import asyncio

    from orchmode.core.settings import Settings
    from orchmode.model.budget import SessionBudget

    budget = SessionBudget(store, "s", Settings(max_subagents=20))
    first = await asyncio.gather(*(budget.reserve_subagent() for _ in range(15)))
    wave = await asyncio.gather(*(budget.reserve_subagent() for _ in range(30)))
    assert all(first) and sum(wave) == 5
    assert wave[:5] == [True] * 5  # in the order they asked
    assert (await store.budget("s")).subagents == 20


async def test_use_added_together_reaches_the_ledger_exactly(store: Store) -> None:
    import asyncio

    from orchmode.core.settings import Settings
    from orchmode.model.budget import SessionBudget

    budget = SessionBudget(store, "s", Settings())
    await asyncio.gather(
        *(budget.after_request(None, TokenUsage(i, 1, 0, 0)) for i in range(1, 201))
    )
    await budget.flush()
    assert (await store.budget("s")).tokens == sum(range(1, 201)) + 200


# --- approvals ------------------------------------------------------------------------------


def asking(key: str = "k", session: str = "s1", **change: Any) -> ApprovalRequest:
    fields: dict[str, Any] = dict(
        session=session, agent="worker 1.2", workdir="/w", kind="command", what="npm ci",
        why="Bash(npm:*) in permissions_ask", rule="Bash(npm ci)", key=key,
    )  # fmt: skip
    return ApprovalRequest(**{**fields, **change})


async def test_an_approval_is_recorded_pending_with_a_small_store_wide_id(store: Store) -> None:
    first = await store.request_approval(asking("a"))
    second = await store.request_approval(asking("b", session="s2", kind="domain"))
    assert (first.id, second.id) == (1, 2)
    assert first.status == "pending" and first.answered_at is None and not first.always
    assert first.request == asking("a") and second.request == asking("b", "s2", kind="domain")
    assert await store.approval(2) == second
    assert await store.approval(3) is None


async def test_asking_twice_is_one_question_answered_or_not(store: Store) -> None:
    first = await store.request_approval(asking())
    again = await store.request_approval(asking(what="ignored: the key decides"))
    assert again == first
    answered = await store.answer_approval(first.id, True, always=True, reason="fine")
    assert answered is not None
    assert await store.request_approval(asking()) == answered  # a resumed run finds it
    other_session = await store.request_approval(asking(session="s2"))
    assert other_session.id == 2  # the same key in another session is another question


async def test_an_answer_is_kept_once_and_a_second_answer_changes_nothing(store: Store) -> None:
    pending = await store.request_approval(asking())
    denied = await store.answer_approval(pending.id, False, reason="not today")
    assert denied is not None
    assert (denied.status, denied.reason, denied.always) == ("denied", "not today", False)
    assert denied.answered_at is not None and denied.answered_at >= pending.created_at
    assert await store.answer_approval(pending.id, True) is None
    assert await store.time_out_approval(pending.id) is None
    assert await store.approval(pending.id) == denied
    assert await store.answer_approval(99, True) is None  # no such approval


async def test_a_timed_out_approval_counts_as_answered(store: Store) -> None:
    pending = await store.request_approval(asking())
    late = await store.time_out_approval(pending.id)
    assert late is not None and late.status == "timed out" and late.answered_at is not None
    assert await store.answer_approval(pending.id, True) is None


async def test_approvals_are_listed_oldest_first_by_session_and_pending(store: Store) -> None:
    a = await store.request_approval(asking("a"))
    b = await store.request_approval(asking("b", session="s2"))
    c = await store.request_approval(asking("c"))
    await store.answer_approval(a.id, True)
    assert [x.id for x in await store.approvals()] == [1, 2, 3]
    assert [x.id for x in await store.approvals(pending=True)] == [b.id, c.id]
    assert [x.id for x in await store.approvals("s1")] == [a.id, c.id]
    assert [x.id for x in await store.approvals("s1", pending=True)] == [c.id]
    assert await store.approvals("nobody") == []


async def test_an_approval_survives_reopening_the_store(store_url: str) -> None:
    store = await open_store(store_url)
    asked = await store.request_approval(asking())
    await store.close()
    store = await open_store(store_url)
    try:
        assert await store.approvals(pending=True) == [asked]
        assert (answered := await store.answer_approval(asked.id, True)) is not None
    finally:
        await store.close()
    store = await open_store(store_url)
    try:
        assert await store.approval(asked.id) == answered
    finally:
        await store.close()


APPROVAL_RACER = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from pathlib import Path
    from orchmode.store import ApprovalRequest, open_store

    async def main(url, racer, n):
        store = await open_store(url)
        print("ready", flush=True)
        sys.stdin.readline()  # the starting gun: every racer is ready
        line = Path(sys.argv[4])  # and the start line: each waits there for all four
        (line / racer).touch()
        while len(os.listdir(line)) < 4:
            time.sleep(0.001)  # polls the condition; a loaded machine starts racers late
        started = time.monotonic()
        ids, won = {}, []
        for i in range(n):  # every racer asks the same n questions, then answers them all
            asked = await store.request_approval(ApprovalRequest(
                session="race", agent=racer, workdir="/w", kind="command",
                what=f"cmd {i}", why="ask", rule=f"Bash(cmd {i})", key=f"key-{i}"))
            ids[i] = asked.id
        for i in range(n):
            answer = await store.answer_approval(ids[i], racer.endswith("0"), reason=racer)
            if answer is not None:
                won.append(ids[i])
        finished = time.monotonic()
        await store.close()
        print(json.dumps({"ids": ids, "won": won, "started": started, "finished": finished}))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
    """
)


async def test_four_processes_asking_and_answering_the_same_approvals_agree(
    store_url: str,
) -> None:
    """Asked at once, a question gets one id for everyone; answered at once, one answer wins."""
    await (await open_store(store_url)).close()
    reports = run_racers(APPROVAL_RACER, lambda i: [store_url, f"racer-{i}", "50"])
    assert all(r["ids"] == reports[0]["ids"] for r in reports)
    assert sorted(reports[0]["ids"].values()) == list(range(1, 51))
    winners = {approval_id: i for i, r in enumerate(reports) for approval_id in r["won"]}
    assert sorted(approval_id for r in reports for approval_id in r["won"]) == list(range(1, 51))
    store = await open_store(store_url)
    try:
        for approval in await store.approvals("race"):
            racer = winners[approval.id]  # the one that won says what was recorded
            assert approval.reason == f"racer-{racer}"
            assert approval.status == ("approved" if racer == 0 else "denied")
    finally:
        await store.close()
