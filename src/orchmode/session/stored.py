"""What a caller reads or answers in a store without opening a session: approvals, budgets,
and which session was interrupted.

Each opens the store that a session in the same working directory (and settings) would
use, and closes it; a SQLite store that was never made is not made just to be looked at.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ..core.errors import ConfigError, OrchmodeError
from ..core.settings import Settings, user_config_dir
from ..executors.approvals import record_answer, remember_rule
from ..store import Approval, Store, open_store
from .ledger import BudgetReport, budget_report
from .resume import CannotResume, Interrupted, choose, latest_interrupted, run_of_state
from .run_record import RunRecord


class ApprovalNotPending(OrchmodeError):
    """An approval that cannot be answered: none has that id, or it was answered already."""


async def approvals(
    settings: Settings | None = None,
    *,
    workdir: str | os.PathLike[str] | None = None,
    session: str | None = None,
    pending: bool = True,
) -> list[Approval]:
    """The approvals in the store of ``settings`` and ``workdir`` (as :func:`open_session`
    finds it), oldest first: of every session or of ``session``, only those waiting for an
    answer unless ``pending=False``. A store not made yet has none (and is not made)."""
    _, _, url = _located(settings, workdir)
    async with _store_of(url) as store:
        return [] if store is None else await store.approvals(session, pending=pending)


async def approve(
    id: int,
    always: bool = False,
    *,
    reason: str = "",
    settings: Settings | None = None,
    workdir: str | os.PathLike[str] | None = None,
    config_dir: str | os.PathLike[str] | None = None,
) -> Approval:
    """Say yes to approval ``id`` from any process: the agent waiting for it goes on.

    ``always`` remembers its rule for the directory it was asked in, in your own
    configuration (``config_dir``, default ``~/.config/orchmode``), so the next run there
    does not ask. Raises :class:`ApprovalNotPending` for an id with no pending approval.
    """
    return await _answer_in_store(
        id, True, always=always, reason=reason, settings=settings, workdir=workdir,
        config_dir=config_dir,
    )  # fmt: skip


async def deny(
    id: int,
    reason: str = "",
    *,
    settings: Settings | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> Approval:
    """Say no to approval ``id`` from any process; ``reason`` reaches the agent.

    Raises :class:`ApprovalNotPending` for an id with no pending approval.
    """
    return await _answer_in_store(id, False, reason=reason, settings=settings, workdir=workdir)


async def _answer_in_store(
    id: int,
    approved: bool,
    *,
    always: bool = False,
    reason: str,
    settings: Settings | None,
    workdir: str | os.PathLike[str] | None,
    config_dir: str | os.PathLike[str] | None = None,
) -> Approval:
    _, _, url = _located(settings, workdir)
    async with _store_of(url) as store:
        if store is None:
            raise ApprovalNotPending(
                f"no approval {id}: nothing is recorded in {url} yet "
                "— pass the run's --store (or --workdir)"
            )
        answered = await record_answer(store, id, approved, always=always, reason=reason)
        if answered is None:
            raise await not_pending(store, id)
    if answered.always:
        where = Path(config_dir) if config_dir is not None else user_config_dir(os.environ)
        remember_rule(answered, where)
    return answered


async def not_pending(store: Store, id: int) -> ApprovalNotPending:
    """Why approval ``id`` cannot be answered, said for the person who tried."""
    found = await store.approval(id)
    if found is None:
        return ApprovalNotPending(
            f"no approval {id} in {store.location} — `orchmode approvals` lists the pending ones"
        )
    return ApprovalNotPending(
        f"approval {id} was answered already ({found.status}) — `orchmode approvals` lists "
        "the pending ones"
    )


def _located(
    settings: Settings | None, workdir: str | os.PathLike[str] | None
) -> tuple[Settings, Path, str]:
    """The settings, the working directory and the store a session there would use."""
    settings = settings or Settings()
    where = Path(workdir) if workdir is not None else settings.workdir or Path.cwd()
    where = where.expanduser().resolve()
    return settings, where, settings.store_url(where)


@asynccontextmanager
async def _store_of(url: str) -> AsyncIterator[Store | None]:
    """The store at ``url``, opened; None for a SQLite file not made yet."""
    if url.startswith("sqlite://") and not Path(url.removeprefix("sqlite://")).exists():
        yield None
        return
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.close()


async def budget(
    settings: Settings | None = None,
    *,
    workdir: str | os.PathLike[str] | None = None,
    session: str | None = None,
) -> BudgetReport:
    """The budget ledger of ``session`` (or ``settings.session``; the most recent one when
    neither is given), read against the caps of ``settings``.

    Raises :class:`~orchmode.OrchmodeError` when the store holds no such session.
    """
    settings, _, url = _located(settings, workdir)
    async with _store_of(url) as store:
        if store is None:
            raise OrchmodeError(f"no sessions are recorded in {url} — run `orchmode run` first")
        return await budget_report(store, session or settings.session, settings)


async def interrupted_run(
    task: str,
    settings: Settings | None = None,
    *,
    workdir: str | os.PathLike[str] | None = None,
) -> Interrupted | None:
    """The newest run on ``task`` in ``workdir`` that was interrupted, if there is one."""
    _, where, url = _located(settings, workdir)
    async with _store_of(url) as store:
        if store is None:
            return None
        return await latest_interrupted(store, where, task)


async def recorded_run(
    settings: Settings, *, workdir: str | os.PathLike[str] | None, session: str
) -> RunRecord | None:
    """The run record ``session`` was saved with, if it is recorded and was a run."""
    _, _, url = _located(settings, workdir)
    async with _store_of(url) as store:
        record = None if store is None else await store.load_session(session)
    return None if record is None else run_of_state(record.state)


async def resumable(
    settings: Settings | None = None,
    *,
    workdir: str | os.PathLike[str] | None = None,
    session: str | None = None,
) -> Interrupted:
    """The session ``orchmode resume [SESSION]`` would continue: ``session``, else the newest
    interrupted one that ran in ``workdir``.

    Raises :class:`CannotResume` with what to do when there is none, or ``session`` is
    unknown, finished, or ran in another directory.
    """
    _, where, url = _located(settings, workdir)
    if not where.is_dir():
        raise ConfigError(f"the working directory {where} does not exist")
    async with _store_of(url) as store:
        if store is None:
            raise CannotResume(
                f"no interrupted session ran in {where} — nothing is recorded in {url} yet"
            )
        return await choose(store, where, session)
