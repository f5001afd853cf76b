"""The library API: open a session from Python, run turns and runs, switch the mode, see
events and totals.

``orchmode run``, ``resume`` and ``chat`` open their sessions with :func:`open_session` too,
their views subscribed, so a session opened here is listed, shown, reported and resumed by
the CLI like any other. Settings are built in code and credentials passed in, so no command
line, environment variable or ``orchmode.toml`` is needed. Opening builds the parts
(:mod:`.wiring`), claims the session so no two processes drive it, takes a recorded
conversation up again by its name, and records every event from then on.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar, cast, overload

from ..core.errors import OrchmodeError
from ..core.events import Event
from ..core.settings import Settings
from ..model.context import turn_starts
from ..model.providers import Credentials
from ..records.recorder import EventRecorder
from ..records.totals import SessionTotals, Totals, session_totals
from ..store import Approval
from ..store.claims import Claim
from .agent import Conversation, SessionBusy, TurnResult, open_conversation
from .failures import unless_the_store_fails
from .ledger import BudgetReport, budget_report
from .resume import CannotResume, interrupted
from .runs import OnAnswer, RunAnswer, RunResult, finish_run, run_task
from .stored import not_pending, recorded_run

__all__ = [
    "EventStream",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "TurnResult",
    "open_session",
]

log = logging.getLogger("orchmode")
#: Seconds an interrupted session waits for the API to take its batches' cancels.
CANCEL_WAIT = 15.0

#: An event class, for a subscription or a stream of one kind of event only.
E = TypeVar("E", bound=Event)
T = TypeVar("T")

#: What :meth:`Session.subscribe` returns: call it to stop the callback.
Unsubscribe = Callable[[], None]


class SessionClosed(OrchmodeError):
    """The session was used after its ``async with`` block ended: open it again by its id."""


class EventStream(Generic[E]):
    """The session's events as they happen, for ``async for``; see :meth:`Session.events`.

    Events queue up from the moment the stream is made, so none are missed between making
    it and starting to iterate. It ends when :meth:`close` is called or the session closes,
    once the events queued by then are delivered. ``async with`` closes it on the way out.
    """

    def __init__(self, kind: type[E] | None, detach: Callable[[EventStream[E]], None]) -> None:
        self._kind = kind
        self._detach = detach
        self._queue: asyncio.Queue[E | None] = asyncio.Queue()
        self._open = True
        self._ended = False

    def _put(self, event: Event) -> None:
        if self._open and (self._kind is None or isinstance(event, self._kind)):
            self._queue.put_nowait(cast("E", event))

    def close(self) -> None:
        """Take no more events; the iteration ends after those already queued."""
        if self._open:
            self._open = False
            self._detach(self)
            self._queue.put_nowait(None)

    def __aiter__(self) -> EventStream[E]:
        return self

    async def __anext__(self) -> E:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            self._ended = True
            raise StopAsyncIteration
        return event

    async def __aenter__(self) -> EventStream[E]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Session:
    """An open conversation with the main agent; made by :func:`open_session`, never directly.

    One turn runs at a time. Events reach subscribers in the order they happen: callbacks
    synchronously, in the event loop, as each event is emitted; streams through a queue.
    """

    def __init__(
        self,
        engine: Conversation,
        totals: SessionTotals,
        recorder: EventRecorder,
        *,
        resumed: bool,
    ) -> None:
        self._engine = engine
        self._totals = totals
        self._recorder = recorder
        self._resumed = resumed
        self._callbacks: list[Callable[[Event], object]] = []
        self._streams: list[EventStream[Any]] = []
        self._turning = False
        self._closed = False
        self._launched = 0
        self._final: Totals | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"mode {'on' if self.mode else 'off'}"
        return f"<orchmode.Session {self.id} ({state})>"

    @property
    def id(self) -> str:
        """The session's name in the store: pass it as ``session=`` to take it up again."""
        return self._engine.session_id

    @property
    def workdir(self) -> Path:
        """The directory the agents' bash commands run in."""
        return self._engine.workdir

    @property
    def resumed(self) -> bool:
        """True if this took up a recorded conversation (its history and mode) by its name."""
        return self._resumed

    @property
    def mode(self) -> bool:
        """Whether orchestration mode is on for the next turn."""
        return self._engine.mode.mode_on

    @property
    def closed(self) -> bool:
        """True once the ``async with`` block has ended: no more turns."""
        return self._closed

    @property
    def conversation(self) -> Conversation:
        """The conversation underneath: its history, store, budget ledger and saved state.

        For a test or a tool that needs more than turns; change it only between turns.
        """
        return self._engine

    @property
    def user_turns(self) -> int:
        """User turns in the conversation so far, a resumed one's included."""
        return len(turn_starts(self._engine.history))

    @property
    def running_totals(self) -> SessionTotals:
        """The tally :meth:`totals` is read from, counted before any subscriber sees an
        event: for a view that draws it as it changes (the live view's footer)."""
        return self._totals

    def set_mode(self, on: bool) -> None:
        """Switch orchestration mode on or off; the model is told with the next turn, not before.

        Switching twice between two turns tells it nothing, and a switch to the mode it
        already has is no switch.
        """
        self._check_open("switch its mode")
        self._engine.set_mode(on)

    async def turn(self, text: str) -> TurnResult:
        """Send one user turn and run it to its answer: scouting, fan-outs and all.

        A turn that fails part-way is a result, not an exception: ``ok`` is false and
        ``error`` says why, and the conversation stays valid for the next turn. Raises
        :class:`SessionClosed` after the session closed, :class:`~orchmode.AuthError` for a
        rejected key, and :class:`~orchmode.OrchmodeError` for an empty text or a turn
        started while another one runs.
        """
        return await self._one_turn(lambda: self._engine.turn(text))

    async def resume_turn(self) -> TurnResult:
        """Finish a resumed session's interrupted turn from its last recorded step.

        No new plan is asked for: a Workflow call that was cut off runs again from its
        recorded input (finished agents come from the journal), a bash command that was
        cut off is not run again (its result says so). A turn whose answer was recorded
        is returned as it was. Raises as :meth:`turn` does, and
        :class:`~orchmode.OrchmodeError` for a session with no turn.
        """
        return await self._one_turn(self._engine.resume_turn)

    async def run(self, task: str, on_answer: OnAnswer | None = None) -> RunResult:
        """Run ``task`` as ``orchmode run`` does: one turn with orchestration mode on, then
        (the mode off) a brief summary of its answer.

        ``on_answer`` is called with each answer as soon as it is known, the task's and then
        the summary's (only those that came without an error). The run is recorded with the
        session, so :meth:`resume` finishes it if it is interrupted. No summary follows a
        failed turn or a refused task. Raises as :meth:`turn` does.
        """
        return await self._one_turn(lambda: run_task(self._engine, task, on_answer or _ignore))

    async def resume(self, on_answer: OnAnswer | None = None) -> RunResult:
        """Finish what was interrupted: a run's remaining turns, with the answers the whole
        run would have given, or a chat's interrupted turn (as :meth:`resume_turn`).

        Raises :class:`CannotResume` when its last turn ended meanwhile (another process
        finished it), and as :meth:`turn` does.
        """
        if not await self.interrupted():
            raise CannotResume(
                f"session {self.id!r} was finished by another orchmode process meanwhile — "
                f"`orchmode show {self.id}` prints it"
            )
        if self._engine.run is not None:
            return await self._one_turn(lambda: finish_run(self._engine, on_answer or _ignore))
        turn = await self.resume_turn()
        if turn.error is None and on_answer is not None:
            on_answer(RunAnswer(turn))
        return RunResult(turn, None)

    async def interrupted(self) -> bool:
        """True if the session's last turn (or run) never ended: :meth:`resume` finishes it."""
        await self._recorder.flush()  # the turns as they stand, not as last written
        return await interrupted(self._engine.store, self.id) is not None

    async def budget(self) -> BudgetReport:
        """The session's budget ledger: subagents, tokens and dollars against their caps
        (what its requests used is settled first: without caps that happens in the
        background)."""
        self._check_open("read its budget")
        await self._engine.budget.flush()
        return await budget_report(self._engine.store, self.id, self._engine.settings)

    async def _one_turn(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``work`` as the session's one running turn, stopped if the store fails in a
        way no run can go on through."""
        self._check_open("run a turn")
        if self._turning:
            raise OrchmodeError(
                f"session {self.id!r} is already running a turn — await it before the next one"
            )
        self._turning = True
        try:
            return await unless_the_store_fails(self._engine, work())
        finally:
            self._turning = False

    @overload
    def subscribe(self, callback: Callable[[Event], object]) -> Unsubscribe: ...

    @overload
    def subscribe(self, callback: Callable[[E], object], kind: type[E]) -> Unsubscribe: ...

    def subscribe(
        self, callback: Callable[[Any], object], kind: type[Any] | None = None
    ) -> Unsubscribe:
        """Call ``callback`` with every event (or every event of class ``kind``) from now on.

        Callbacks run synchronously in the event loop, so they must be quick; one that
        raises is logged and skipped, never the end of the turn. Returns a function that
        unsubscribes it.
        """

        def target(event: Event) -> object:
            return callback(event) if kind is None or isinstance(event, kind) else None

        self._callbacks.append(target)

        def unsubscribe() -> None:
            if target in self._callbacks:
                self._callbacks.remove(target)

        return unsubscribe

    @overload
    def events(self) -> EventStream[Event]: ...

    @overload
    def events(self, kind: type[E]) -> EventStream[E]: ...

    def events(self, kind: type[Any] | None = None) -> EventStream[Any]:
        """A stream of the events from now on (or only those of class ``kind``).

        Iterate it while the turn runs in a task of its own::

            async with session.events() as stream:
                turn = asyncio.create_task(session.turn("Review this"))
                async for event in stream:
                    print(event)
                    if isinstance(event, orchmode.TurnDone):
                        break
            result = await turn
        """
        stream: EventStream[Any] = EventStream(kind, self._detach)
        if self._closed:
            stream.close()
        else:
            self._streams.append(stream)
        return stream

    async def totals(self) -> Totals:
        """Requests, tokens, dollars and subagents so far; the final totals once closed."""
        if self._final is not None:
            return self._final
        self._launched = (await self._engine.store.budget(self.id)).subagents
        return self._snapshot()

    async def approvals(self, *, pending: bool = True) -> list[Approval]:
        """This session's approvals, oldest first: those waiting for an answer, or
        (``pending=False``) every one asked."""
        return await self._engine.store.approvals(self.id, pending=pending)

    async def approve(self, id: int, always: bool = False, *, reason: str = "") -> Approval:
        """Say yes to approval ``id`` (of this session or another in its store); the agent
        waiting for it goes on at once. ``always`` remembers its rule for the directory it
        was asked in, in your own configuration, so the next run there does not ask.

        Raises :class:`ApprovalNotPending` for an id with no pending approval.
        """
        return await self._answer(id, True, always=always, reason=reason)

    async def deny(self, id: int, reason: str = "") -> Approval:
        """Say no to approval ``id``; ``reason`` reaches the agent with the refusal.

        Raises :class:`ApprovalNotPending` for an id with no pending approval.
        """
        return await self._answer(id, False, reason=reason)

    async def _answer(
        self, id: int, approved: bool, *, always: bool = False, reason: str
    ) -> Approval:
        answered = await self._engine.approvals.answer(id, approved, always=always, reason=reason)
        if answered is None:
            raise await not_pending(self._engine.store, id)
        return answered

    def _snapshot(self) -> Totals:
        t = self._totals
        return t.snapshot(self._launched)

    def _detach(self, stream: EventStream[Any]) -> None:
        if stream in self._streams:
            self._streams.remove(stream)

    def _deliver(self, event: Event) -> None:
        """What the session's bus calls with each event: the totals, the recorder, then the
        caller's callbacks and streams, in that order."""
        self._totals(event)
        self._recorder(event)
        for callback in tuple(self._callbacks):
            try:
                callback(event)
            except Exception:  # a display bug must never stop a run
                log.exception("event callback failed on %s", type(event).__name__)
        for stream in tuple(self._streams):
            stream._put(event)

    def _check_open(self, doing: str) -> None:
        if self._closed:
            raise SessionClosed(
                f"session {self.id!r} is closed and cannot {doing} — open it again with "
                f"orchmode.open_session(..., session={self.id!r}) to go on with it"
            )

    async def _close(self) -> None:
        """Record the mode as last set, take the final totals and write the last records,
        while the store is still open."""
        self._closed = True
        if self._engine.history:  # a mode switched after the last turn is kept for a resume
            await self._engine.save()
        try:
            await self._engine.budget.flush()
            self._final = await self.totals()
        except OrchmodeError as exc:
            log.warning("could not read the totals of session %s: %s", self.id, exc)
            self._final = self._snapshot()
        await self._recorder.flush()
        for stream in tuple(self._streams):
            stream.close()


@asynccontextmanager
async def open_session(
    settings: Settings | None = None,
    *,
    workdir: str | os.PathLike[str] | None = None,
    credentials: Credentials | None = None,
    session: str | None = None,
    subscribers: Iterable[Callable[[Event], object]] = (),
    on_warning: Callable[[str], object] | None = None,
) -> AsyncIterator[Session]:
    """Open a session for ``async with``; everything it started is closed on the way out.

    - ``settings``: built in code, ``Settings(model=..., max_cost=...)``; the defaults when
      left out. No ``ORCHMODE_*`` variable or ``orchmode.toml`` is read; the standard
      ``OTEL_EXPORTER_OTLP_*`` variables switch traces on, as in any OpenTelemetry program.
    - ``workdir``: where bash runs and the store lives (default ``settings.workdir``, else
      the current directory).
    - ``credentials``: ``Credentials(api_key=...)`` or ``Credentials(auth_token=...)``;
      when left out, ``ANTHROPIC_API_KEY`` (then ``ANTHROPIC_AUTH_TOKEN``), as the SDK does,
      or for ``provider="bedrock"``/``"vertex"`` that platform's own chain.
    - ``session``: a name. A session recorded under it is taken up again — its history
      and mode — and one that is not starts under that name. Left out: a new session, under
      ``settings.session`` if that is set. A run resumed so keeps its recorded batch
      mode, unless ``settings`` set ``batch`` themselves.
    - ``subscribers``: callbacks for every event, in this order, as if passed to
      :meth:`Session.subscribe` as soon as the session is open.
    - ``on_warning``: where the start-up's warnings go (the sandbox is off, a limit cannot
      be enforced, a file in ``.claude/agents/`` is not an agent definition); the
      ``orchmode`` logger when left out.

    Raises :class:`~orchmode.ConfigError` for a missing directory or a cost cap without a
    price, a ``SandboxError`` when bash cannot be sandboxed as configured (before anything
    is spent), and :class:`~orchmode.SessionBusy` while another process drives the session.
    """
    settings = settings or Settings()
    if named := session or settings.session:  # a resumed run keeps its batch mode
        run = await recorded_run(settings, workdir=workdir, session=named)
        settings = settings if run is None else run.settings_for_resume(settings)
    async with (
        open_conversation(
            settings, credentials, workdir=workdir, session=session, warn=on_warning
        ) as engine,
        _claimed(engine),
    ):
        resumed = await engine.restore()
        store = engine.store
        # a resumed session's totals so far, as `orchmode budget` counts them
        totals = session_totals(await store.events(engine.session_id)) if resumed else None
        recorder = await EventRecorder.start(store, engine.session_id)
        opened = Session(engine, totals or SessionTotals(), recorder, resumed=resumed)
        for subscriber in subscribers:
            opened.subscribe(subscriber)
        engine.events.subscribe(opened._deliver)
        try:
            yield opened
        except (asyncio.CancelledError, KeyboardInterrupt):
            await _cancel_batches(engine)
            raise
        finally:
            await opened._close()


async def _cancel_batches(engine: Conversation) -> None:
    """An interrupted session's batches in flight canceled at the API, so what they have not
    answered yet is not paid for; a resume asks those requests again."""
    try:
        await asyncio.wait_for(engine.gateway.cancel_batches(), CANCEL_WAIT)
    except (TimeoutError, OrchmodeError) as exc:
        log.warning("could not cancel the batches of session %s: %s", engine.session_id, exc)


@asynccontextmanager
async def _claimed(engine: Conversation) -> AsyncIterator[None]:
    """The session claimed in the store for as long as it is open, its executor started.

    No two processes drive one conversation at once. A process that died leaves a claim
    that lapses within ``claim_lease``: it is waited for that long (and a little), then
    the session is busy.
    """
    store, lease = engine.store, engine.settings.claim_lease
    key = session_key(engine.session_id)
    claim = await Claim.within(store, key, engine.holder, lease, lease * 1.2)
    if claim is None:
        raise _busy(engine.session_id, lease)
    async with claim:
        await engine.executor.start()
        yield


def session_key(session_id: str) -> str:
    """The claim that says which process drives a session (journal keys are hex digests)."""
    return f"session:{session_id}"


def _busy(session_id: str, lease: float) -> SessionBusy:
    return SessionBusy(
        f"session {session_id!r} is in use by another orchmode process (or one stopped "
        f"less than {lease:g} s ago, --claim-lease) — wait for it to finish, or try again "
        f"in {lease:g} s"
    )


def _ignore(_: RunAnswer) -> None:
    """What a run does with its answers when the caller does not ask for them."""
