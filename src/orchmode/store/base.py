"""What orchmode keeps durably, behind one small interface: journal, claims, budget, sessions.

Two backends implement it: SQLite (embedded, the default) and PostgreSQL (shared by several
machines). Both run the same SQL from :mod:`orchmode.store.schema` wherever they can.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from ..core.errors import StoreError
from ..core.events import Role
from ..core.kept import KeptByIdentity
from ..core.results import AgentResult


def content_key(
    *,
    role: Role,
    model: str,
    effort: str,
    system: str,
    tools: Sequence[Mapping[str, object]],
    prompt: str,
    isolation: str = "shared",
    agent: str | None = None,
) -> str:
    """SHA-256 over everything that determines a subagent's result: its journal address.

    An agent in a copy of the tree returns its change with its result, so it is a
    different agent from the same prompt run in the shared tree (whose keys stay as they
    were before isolation existed). ``agent`` is its role's definition's digest: what the
    rest does not show of it (its isolation, whether it is verified).
    """
    parts: dict[str, str] = {
        "role": canonical_json(role),
        "model": canonical_json(model),
        "effort": canonical_json(effort),
        "system": _kept_json(system),
        "tools": _tools_json(tools),
        "prompt": canonical_json(prompt),
    }
    if isolation != "shared":
        parts["isolation"] = canonical_json(isolation)
    if agent is not None:
        parts["agent"] = canonical_json(agent)
    # The text json.dumps(sort_keys=True) makes of the whole, put together from its parts.
    whole = ",".join(f"{canonical_json(name)}:{parts[name]}" for name in sorted(parts))
    return hashlib.sha256(("{" + whole + "}").encode("utf-8")).hexdigest()


def canonical_json(value: object) -> str:
    """``value`` as the journal's keys encode it: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _tools_json(tools: Sequence[Mapping[str, object]]) -> str:
    """``canonical_json(list(tools))``, each schema's part encoded once."""
    return "[" + ",".join(_kept_json(tool) for tool in tools) + "]"


#: The encodings of the tool schemas and system prompts seen last: a fan-out's agents share
#: them, and encoding them was most of a key's cost (0.15 ms an agent, paid by every agent
#: of a wave before the first of them could start).
_kept_json = KeptByIdentity(canonical_json)


@dataclass(frozen=True)
class SessionRecord:
    workdir: str
    state: str


@dataclass(frozen=True)
class SessionInfo:
    """A session as ``orchmode runs`` lists it: the id, where it ran, first and last activity."""

    id: str
    workdir: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class EventRow:
    """One recorded event: its number in the session, when, what kind, and its JSON data."""

    seq: int
    at: float
    kind: str
    data: str


ApprovalKind = Literal["command", "domain", "mcp"]
ApprovalStatus = Literal["pending", "approved", "denied", "timed out"]


@dataclass(frozen=True)
class ApprovalRequest:
    """What a parked agent asks the user (see :meth:`Store.request_approval`)."""

    session: str
    #: The agent's label (``worker 1.2``) and the working directory the session runs in.
    agent: str
    workdir: str
    kind: ApprovalKind
    #: The command, ``domain:port``, or ``server/tool``.
    what: str
    #: The rule that asked, and where it came from.
    why: str
    #: The rule ``--always`` records (``Bash(npm ci)``, ``WebFetch(domain:pypi.org)``).
    rule: str
    #: What makes two requests the same one (a resumed run finds its answer by it).
    key: str


@dataclass(frozen=True)
class Approval:
    """An approval as the store keeps it: the request, and its answer once there is one."""

    id: int
    request: ApprovalRequest
    status: ApprovalStatus
    created_at: float
    answered_at: float | None = None
    always: bool = False
    reason: str = ""


@dataclass(frozen=True)
class BatchRequest:
    """Where a request sent through the Message Batches API went: its batch ('' while the
    batch was being created, if the run stopped then) and when it was recorded."""

    custom_id: str
    batch_id: str
    recorded_at: float


@dataclass(frozen=True)
class BudgetCaps:
    """A session's hard limits; ``None`` means no limit on that measure."""

    max_subagents: int
    max_tokens: int | None = None
    max_cost: float | None = None


@dataclass(frozen=True)
class BudgetState:
    """What a session has launched and spent (reservations not yet settled included)."""

    subagents: int = 0
    tokens: int = 0
    cost: float = 0.0


class Failure:
    """A store failure that a run cannot go on through: the disk full, the server gone for
    longer than its outage limit.

    Most store failures are logged and the run goes on (a lost event, a checkpoint the next
    one makes up for). These are not: every later write would fail too, and a run that went
    on would spend tokens on work it cannot record. The first such failure is kept; the
    store refuses every later write with it (so nothing after it is half-recorded), and
    whoever drives the run is told (:meth:`listen`), stops the run and says so in one line.
    A resume once the cause is gone continues from the last recorded step.
    """

    def __init__(self) -> None:
        self.error: StoreError | None = None
        self._listeners: list[Callable[[StoreError], None]] = []
        self._lock = threading.Lock()  # result files are written on worker threads

    def trip(self, error: StoreError) -> StoreError:
        """Keep ``error`` (unless one is kept already) and tell the listeners; the kept one."""
        with self._lock:
            first = self.error is None
            if first:
                self.error = error
            listeners = list(self._listeners) if first else []
        for listener in listeners:
            listener(error)
        assert self.error is not None
        return self.error

    def listen(self, listener: Callable[[StoreError], None]) -> None:
        """Call ``listener`` (from the thread that trips it) with the failure; at once if
        it happened already."""
        with self._lock:
            self._listeners.append(listener)
            error = self.error
        if error is not None:
            listener(error)

    def forget(self, listener: Callable[[StoreError], None]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def check(self) -> None:
        """Raise the kept failure (a fresh exception of the same message), if there is one."""
        if self.error is not None:
            raise StoreError(str(self.error))


class Store(Protocol):
    """The durable truth of a run. Every method is safe under concurrent processes."""

    #: Where it lives, for messages; never contains a password.
    location: str
    #: A failure that stops the run (see :class:`Failure`); writes are refused after it.
    failure: Failure

    async def lookup(self, key: str) -> AgentResult | None:
        """The finished result recorded under ``key``; a read failure counts as a miss."""

    async def record(
        self, key: str, role: Role, prompt: str, result: AgentResult, *, holder: str = ""
    ) -> None:
        """Keep an attempt, and the result if finished. Logs a failure, never raises.

        With ``holder``, that holder's claim on ``key`` is let go in the same transaction.
        """

    async def claim(self, key: str, holder: str, lease: float) -> bool:
        """Take ``key`` for ``lease`` seconds: true if it was free, expired, or already ours."""

    async def holder(self, key: str) -> str | None:
        """Who holds ``key`` now (None if nobody, or the lease lapsed)."""

    async def renew(self, key: str, holder: str, lease: float) -> bool:
        """Extend our claim; false if it is no longer ours (it expired and was taken)."""

    async def release(self, key: str, holder: str) -> None:
        """Give up our claim on ``key`` (no-op if it is not ours)."""

    async def reserve(
        self, session: str, caps: BudgetCaps, *, subagents: int, tokens: int, cost: float
    ) -> bool:
        """Atomically add to the session's ledger if every cap still holds; false if not."""

    async def adjust_budget(self, session: str, *, tokens: int, cost: float) -> None:
        """Adjust the ledger by a (possibly negative) difference between reserved and real."""

    async def budget(self, session: str) -> BudgetState:
        """The session's ledger as it stands."""

    async def save_session(self, session: str, workdir: str, state: str) -> None:
        """Create or update a session's resumable state (JSON: history and mode)."""

    async def load_session(self, session: str) -> SessionRecord | None:
        """A recorded session's state, or None if there is no such session."""

    async def latest_session(self) -> str | None:
        """The most recently updated session's id."""

    async def sessions(self) -> list[SessionInfo]:
        """Every recorded session, most recently updated first.

        A session whose first turn was killed before its state was saved has events but no
        saved state; it is listed too (workdir empty, times from its events), because an
        interrupted run is exactly the one worth inspecting.
        """

    async def next_event_seq(self, session: str) -> int:
        """The sequence number the session's next event gets."""

    async def append_events(self, session: str, events: Sequence[EventRow]) -> None:
        """Record events (``seq`` numbered by the caller) in one transaction."""

    async def events(self, session: str) -> list[EventRow]:
        """The session's events in order."""

    async def record_messages(self, session: str, start: int, messages: Sequence[str]) -> None:
        """Checkpoint the main conversation: ``messages`` (JSON each) from index ``start`` on.

        One durable transaction drops the recorded messages from ``start`` on (normally none:
        a checkpoint appends; a compaction that rewrote earlier messages, or a dropped
        truncated reply, starts lower) and records these at ``start, start + 1, …``, so an
        interrupted run resumes from its last step. Empty ``messages`` just truncates. A
        ``start`` past the recorded messages (a gap) raises :class:`StoreError`, as does a
        failed write; a negative ``start`` raises ``ValueError``.
        """

    async def load_messages(self, session: str) -> list[str]:
        """The session's checkpointed conversation, in order; empty if none was recorded."""

    async def request_approval(self, request: ApprovalRequest) -> Approval:
        """Record ``request`` as pending, or return the one recorded under the same session
        and ``key`` (answered or not): asking twice is one question."""

    async def answer_approval(
        self, id: int, approved: bool, *, always: bool = False, reason: str = ""
    ) -> Approval | None:
        """Answer a pending approval; None when there is no such one or it is answered."""

    async def time_out_approval(self, id: int) -> Approval | None:
        """Mark a pending approval timed out (denied); None if it was answered meanwhile."""

    async def approval(self, id: int) -> Approval | None:
        """One approval by its id."""

    async def approvals(
        self, session: str | None = None, *, pending: bool = False
    ) -> list[Approval]:
        """Approvals, oldest first: of one session or all, only pending ones or every one."""

    async def record_batch_requests(
        self, session: str, custom_ids: Sequence[str], batch_id: str = ""
    ) -> None:
        """Record, flushed before it returns, that these requests are in batch ``batch_id``:
        with ``''`` before the batch is created (so a run stopped meanwhile knows to look for
        them), then with the id the API gave."""

    async def batch_request(self, custom_id: str) -> BatchRequest | None:
        """The record of one batched request, None if it was never sent."""

    async def close(self) -> None:
        """Release connections and threads."""
