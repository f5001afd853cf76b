"""Approvals: an agent's question to the user, kept in the store, and the wait for its answer.

A question is a store record (:meth:`~orchmode.store.base.Store.request_approval`), so every
process sees it and a kill loses nothing: any terminal answers it (``orchmode approve``,
the chat, the library), and a resumed run finds the answers already given. The agent that
asked waits parked (its concurrency slot given to the next agent, by the ``park`` its
caller passes); every other agent goes on.

An answer given in this process (:meth:`Approvals.answer`) wakes its waiter at once; one
given elsewhere is seen by the broker's one poller, which reads the store's pending
approvals every :data:`POLL_INTERVAL` seconds while anything waits — one query per
interval for all the waiting agents, not one per agent. Past ``approval_timeout`` the
approval is recorded as timed out and counts as denied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import OrchmodeError
from ..core.events import ApprovalAnswered, ApprovalRequested, Event
from ..core.settings import Settings, user_config_dir
from ..store.base import Approval, ApprovalRequest, ApprovalStatus, Store

__all__ = [
    "POLL_INTERVAL",
    "Answer",
    "Approvals",
    "answer_of",
    "record_answer",
    "remember_rule",
]

log = logging.getLogger("orchmode")

#: Seconds between two looks at the store for answers given in another process.
POLL_INTERVAL = 0.5

ALLOW_MODE = "approved without asking (--approvals allow)"
DENY_MODE = (
    "denied without asking (--approvals deny, for runs nobody watches) — run with "
    "--approvals ask to be asked"
)


@dataclass(frozen=True)
class Answer:
    """What the agent that asked is told: yes or no, and in one line why."""

    approved: bool
    #: ``approved``, ``denied`` or ``timed out`` (never ``pending``).
    status: ApprovalStatus
    #: One line for the agent's tool result (or a proxy's 403): who decided and why.
    reason: str = ""
    #: The user said "always": the rule is remembered for this directory.
    always: bool = False
    #: The approval's id in the store; None when the ``approvals`` setting answered.
    id: int | None = None


def answer_of(approval: Approval, timeout: float | None = None) -> Answer:
    """The answer an answered approval gives (``timeout``: the one this run waited)."""
    said = f": {approval.reason}" if approval.reason else ""
    if approval.status == "approved":
        always = " (always, for this directory)" if approval.always else ""
        return Answer(True, "approved", f"approved by the user{always}{said}", approval.always,
                      approval.id)  # fmt: skip
    if approval.status == "timed out":
        waited = f"within {timeout:g} s " if timeout is not None else ""
        return Answer(
            False,
            "timed out",
            f"no answer came {waited}(approval_timeout) — denied; a rule in "
            "permissions_allow or network_allow lets it through without asking",
            id=approval.id,
        )
    return Answer(False, "denied", f"denied by the user{said}", id=approval.id)


async def record_answer(
    store: Store, id: int, approved: bool, *, always: bool = False, reason: str = ""
) -> Approval | None:
    """Answer approval ``id`` in the store; None if there is none pending under that id.

    "Always" goes with a yes only: a no is never remembered.
    """
    return await store.answer_approval(id, approved, always=always and approved, reason=reason)


def remember_rule(approval: Approval, config_dir: Path) -> None:
    """Record an "always" approval's rule in the user's own configuration, for the
    directory it was asked in: the next run there does not ask again."""
    from ..core.permissions import remember

    request = approval.request
    if not request.rule:
        raise OrchmodeError(
            f"approval {approval.id} is approved this once: what it asked cannot be remembered "
            "as a rule (a command that may contain a denied one asks every time)"
        )
    try:
        remember(config_dir, Path(request.workdir), request.rule)
    except (OSError, OrchmodeError) as exc:
        raise OrchmodeError(
            f"approval {approval.id} is approved, but its rule {request.rule} could not be "
            f"remembered in {config_dir}: {exc} — the next run will ask again"
        ) from exc


@asynccontextmanager
async def _unparked() -> AsyncIterator[None]:
    yield


class Approvals:
    """The approvals of one session: asks for agents, and answers given in this process."""

    def __init__(
        self,
        store: Store,
        session: str,
        workdir: Path,
        settings: Settings,
        emit: Callable[[Event], None],
        *,
        config_dir: Path | None = None,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.store = store
        self.session = session
        self.workdir = workdir
        self.settings = settings
        self.emit = emit
        #: Where "always" answers are remembered (the user's own configuration).
        self.config_dir = config_dir or user_config_dir(os.environ)
        self.poll_interval = poll_interval
        #: Approval id -> (its session, the futures of the agents waiting for it).
        self._waiting: dict[int, tuple[str, list[asyncio.Future[Approval]]]] = {}
        self._poller: asyncio.Task[None] | None = None

    async def ask(
        self,
        request: ApprovalRequest,
        *,
        park: Callable[[], AbstractAsyncContextManager[None]] | None = None,
    ) -> Answer:
        """The user's answer to ``request``, waited for parked (inside ``park()``).

        The ``approvals`` setting ``deny`` or ``allow`` answers at once, recording nothing
        (unless the question has an answer already). Asked before (a resumed run), the
        answer given then. Cancelled (the run stopped),
        the approval stays pending, and a resumed run asks again. A store that cannot
        record the question is a denial, never a crash.
        """
        if self.settings.approvals != "ask":
            given = await self._given(request)
            if given is not None:  # answered while no process was running: it stands
                return answer_of(given)
            if self.settings.approvals == "deny":
                return Answer(False, "denied", DENY_MODE)
            return Answer(True, "approved", ALLOW_MODE)
        try:
            asked = await self.store.request_approval(request)
        except OrchmodeError as exc:
            return Answer(False, "denied", f"the question could not be recorded ({exc}) — denied")
        if asked.status != "pending":
            return answer_of(asked)
        self.emit(
            ApprovalRequested(asked.id, request.agent, request.kind, request.what, request.why)
        )
        timeout = self.settings.approval_timeout
        async with (park or _unparked)():
            try:
                final = await self._wait(asked.id, request.session, timeout)
            except OrchmodeError as exc:  # the store failed while we waited
                return Answer(
                    False, "denied", f"the answer could not be read ({exc}) — denied", id=asked.id
                )
            self.emit(
                ApprovalAnswered(final.id, request.agent, final.status, final.always, final.reason)
            )
        return answer_of(final, timeout)

    async def _given(self, request: ApprovalRequest) -> Approval | None:
        """The answer a question of this session already has (a resumed run's), if any."""
        try:
            asked = await self.store.approvals(request.session)
        except OrchmodeError:
            return None
        return next(
            (a for a in asked if a.request.key == request.key and a.status != "pending"), None
        )

    async def answer(
        self, id: int, approved: bool, *, always: bool = False, reason: str = ""
    ) -> Approval | None:
        """Answer approval ``id`` (of any session); None if it is not pending.

        An agent of this process waiting for it goes on at once. "Always" with a yes
        remembers the rule for the directory it was asked in (raising
        :class:`~orchmode.OrchmodeError` if that cannot be written: the answer stands).
        """
        answered = await record_answer(self.store, id, approved, always=always, reason=reason)
        if answered is None:
            return None
        self._wake_waiters(answered)
        if answered.always:
            remember_rule(answered, self.config_dir)
        return answered

    async def close(self) -> None:
        """Stop the poller (the waiting agents are cancelled with their run)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None

    async def _wait(self, id: int, session: str, timeout: float) -> Approval:
        """The approval once answered, here or elsewhere; timed out after ``timeout`` s."""
        future: asyncio.Future[Approval] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(id, (session, []))[1].append(future)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="orchmode-approvals")
        try:
            try:
                return await asyncio.wait_for(future, timeout)
            except TimeoutError:
                pass
            late = await self.store.time_out_approval(id)
            if late is not None:
                log.info("approval %d timed out after %g s", id, timeout)
                return late
            # answered elsewhere between the last poll and the deadline
            answered = await self.store.approval(id)
            if answered is None or answered.status == "pending":
                raise OrchmodeError(f"approval {id} vanished from {self.store.location}")
            return answered
        finally:
            self._forget(id, future)

    def _forget(self, id: int, future: asyncio.Future[Approval]) -> None:
        entry = self._waiting.get(id)
        if entry is None:
            return
        with contextlib.suppress(ValueError):
            entry[1].remove(future)
        if not entry[1]:
            del self._waiting[id]

    def _wake_waiters(self, approval: Approval) -> None:
        """Wake every agent of this process waiting for ``approval``."""
        entry = self._waiting.pop(approval.id, None)
        for future in entry[1] if entry else ():
            if not future.done():
                future.set_result(approval)

    async def _poll(self) -> None:
        """While anything waits: every interval, one look per waiting session at its pending
        approvals; an id no longer among them was answered elsewhere."""
        while self._waiting:
            await asyncio.sleep(self.poll_interval)
            sessions = {session for session, _ in self._waiting.values()}
            try:
                still: set[int] = set()
                for session in sessions:
                    still.update(a.id for a in await self.store.approvals(session, pending=True))
                for id in [i for i in self._waiting if i not in still]:
                    approval = await self.store.approval(id)
                    if approval is not None and approval.status != "pending":
                        self._wake_waiters(approval)
            except OrchmodeError as exc:  # tried again next time; the timeout still holds
                log.debug("could not look for answers to approvals: %s", exc)
