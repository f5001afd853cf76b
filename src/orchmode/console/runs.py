"""What the runs page lists: each session of the store with its task, size, cost and state."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ..records.history import SessionHistory, read_session
from ..session.api import session_key
from ..store import SessionInfo, Store
from ..store.claims import holder_is_dead

#: The states a run is shown in, as the runs page's filter names them.
STATES = ("running", "waiting for approval", "finished", "failed", "interrupted")


@dataclass(frozen=True)
class RunSummary:
    """One row of the runs page."""

    id: str
    workdir: str
    started_at: float
    task: str
    turns: int
    agents: int
    cost: float
    state: str
    #: the process driving it, when it runs on this host and this server may signal it
    pid: int | None


class HistoryCache:
    """Histories read from the store, read again only once a session has new events: the
    runs page is asked for often, and a finished session never changes."""

    def __init__(self) -> None:
        self._read: dict[str, tuple[int, SessionHistory]] = {}

    async def history(self, store: Store, session: str, workdir: str = "") -> SessionHistory:
        next_seq = await store.next_event_seq(session)
        cached = self._read.get(session)
        if cached is not None and cached[0] == next_seq:
            return cached[1]
        record = await store.load_session(session)
        history = read_session(
            await store.events(session),
            session=session,
            workdir=workdir or (record.workdir if record else ""),
            state=record.state if record else None,
        )
        self._read[session] = (next_seq, history)
        return history


async def list_runs(store: Store, cache: HistoryCache, wanted: str = "") -> list[RunSummary]:
    """Every session of the store, newest first; with ``wanted`` only those whose id, task,
    directory or state contain it (case aside)."""
    waiting = await _waiting_sessions(store)
    runs = [await _summary(store, cache, info, waiting) for info in await store.sessions()]
    return [run for run in runs if _matches(run, wanted)]


async def one_run(store: Store, cache: HistoryCache, session: str) -> RunSummary | None:
    """The runs page's row of ``session``; None when the store has no such session."""
    for info in await store.sessions():
        if info.id == session:
            return await _summary(store, cache, info, await _waiting_sessions(store))
    return None


async def _waiting_sessions(store: Store) -> set[str]:
    return {approval.request.session for approval in await store.approvals(None)}


async def _summary(
    store: Store, cache: HistoryCache, info: SessionInfo, waiting: set[str]
) -> RunSummary:
    history = await cache.history(store, info.id, info.workdir)
    holder = await driver(store, info.id)
    alive = holder is not None
    return RunSummary(
        id=info.id, workdir=info.workdir, started_at=info.created_at,
        task=history.turns[0].task if history.turns else "", turns=len(history.turns),
        agents=len(history.agents), cost=history.totals.all.cost,
        state=_state(history, alive=alive, waiting=info.id in waiting),
        pid=signalable_pid(holder) if holder else None,
    )  # fmt: skip


async def driver(store: Store, session: str) -> str | None:
    """The claim holder of the live process that drives ``session``; None when none does
    (the claim was let go, lapsed, or names a process of this host that died)."""
    holder = await store.holder(session_key(session))
    return None if holder is None or holder_is_dead(holder) else holder


def _state(history: SessionHistory, *, alive: bool, waiting: bool) -> str:
    """A session a live process holds is running (waiting when an agent asks); otherwise
    as its last turn ended, as ``orchmode runs`` says it."""
    if alive:
        return "waiting for approval" if waiting else "running"
    if not history.turns:
        return "interrupted"
    return history.turns[-1].status


def _matches(run: RunSummary, wanted: str) -> bool:
    if not wanted:
        return True
    needle = wanted.casefold()
    return any(needle in text.casefold() for text in (run.id, run.task, run.workdir, run.state))


def signalable_pid(holder: str) -> int | None:
    """The process id in a claim holder's name (``host:pid:part``) when that process is on
    this host and this server's user may signal it; None for any other."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return None
    try:
        os.kill(int(pid), 0)
    except OSError:
        return None
    return int(pid)
