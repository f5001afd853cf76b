"""The store's schema and queries, written once for both backends.

Queries use ``?`` placeholders; the PostgreSQL backend turns them into ``%s``. Schema
changes are numbered migrations applied in order and recorded in ``schema_migrations``, so
an old database always upgrades and a newer one is refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import StoreError
from ..core.events import TokenUsage
from ..core.results import AgentResult, Change, Status
from .base import Approval, ApprovalRequest

if TYPE_CHECKING:
    from .base import BudgetCaps

#: Larger than any real cap; stands in for "no limit" so the SQL needs no NULL tests.
NO_LIMIT_TOKENS = 2**62
NO_LIMIT_COST = 1e300

MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)

MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "journal of subagent results and attempts",
        [
            """CREATE TABLE results (
                key TEXT PRIMARY KEY,
                role TEXT NOT NULL,
                prompt TEXT NOT NULL,
                result TEXT NOT NULL,
                turns INTEGER NOT NULL,
                input_tokens BIGINT NOT NULL,
                output_tokens BIGINT NOT NULL,
                cache_read_tokens BIGINT NOT NULL,
                cache_write_tokens BIGINT NOT NULL,
                recorded_at DOUBLE PRECISION NOT NULL
            )""",
            """CREATE TABLE attempts (
                key TEXT NOT NULL,
                role TEXT NOT NULL,
                status TEXT NOT NULL,
                detail TEXT NOT NULL,
                recorded_at DOUBLE PRECISION NOT NULL
            )""",
            "CREATE INDEX attempts_by_key ON attempts (key)",
        ],
    ),
    (
        "single-flight claims and the session budget ledger",
        [
            """CREATE TABLE claims (
                key TEXT PRIMARY KEY,
                holder TEXT NOT NULL,
                expires_at DOUBLE PRECISION NOT NULL
            )""",
            """CREATE TABLE budgets (
                session TEXT PRIMARY KEY,
                subagents BIGINT NOT NULL,
                tokens BIGINT NOT NULL,
                cost DOUBLE PRECISION NOT NULL
            )""",
        ],
    ),
    (
        "sessions and their event records",
        [
            """CREATE TABLE sessions (
                id TEXT PRIMARY KEY,
                workdir TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                state TEXT NOT NULL
            )""",
            """CREATE TABLE events (
                session TEXT NOT NULL,
                seq BIGINT NOT NULL,
                at DOUBLE PRECISION NOT NULL,
                kind TEXT NOT NULL,
                data TEXT NOT NULL,
                PRIMARY KEY (session, seq)
            )""",
        ],
    ),
    (
        "checkpoints of a session's main conversation",
        [
            # seq is the message's index in the conversation, from 0; NOT NULL matters:
            # INSERT_MESSAGE relies on it to refuse a message that would leave a gap.
            """CREATE TABLE session_messages (
                session TEXT NOT NULL,
                seq BIGINT NOT NULL,
                message TEXT NOT NULL,
                PRIMARY KEY (session, seq)
            )""",
        ],
    ),
    (
        "a worker's change to the tree, recorded with its result",
        # JSON {"base": snapshot commit, "patch": git patch text}, "" for no change.
        ["ALTER TABLE results ADD COLUMN tree_change TEXT NOT NULL DEFAULT ''"],
    ),
    (
        "approvals asked of the user, and their answers",
        [
            # id: small, store-wide, what users type (`orchmode approve 3`); given by
            # REQUEST_APPROVAL as the largest so far plus one, never reused (no row is
            # deleted). status: pending, approved, denied or timed out. always: 0 or 1.
            """CREATE TABLE approvals (
                id BIGINT PRIMARY KEY,
                session TEXT NOT NULL,
                key TEXT NOT NULL,
                agent TEXT NOT NULL,
                workdir TEXT NOT NULL,
                kind TEXT NOT NULL,
                what TEXT NOT NULL,
                why TEXT NOT NULL,
                rule TEXT NOT NULL,
                status TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                answered_at DOUBLE PRECISION,
                always INTEGER NOT NULL DEFAULT 0,
                reason TEXT NOT NULL DEFAULT '',
                UNIQUE (session, key)
            )""",
            "CREATE INDEX approvals_by_status ON approvals (status, id)",
        ],
    ),
    (
        "requests sent through the Message Batches API, and the batch holding each",
        [
            # custom_id: the request's id in its batch, a digest of what it asks (see
            # model/batch_ids.py), so the same request is never sent twice. batch_id: ''
            # from just before the batch is created until the API has given its id.
            """CREATE TABLE batch_requests (
                custom_id TEXT PRIMARY KEY,
                session TEXT NOT NULL,
                batch_id TEXT NOT NULL,
                recorded_at DOUBLE PRECISION NOT NULL
            )""",
        ],
    ),
]

APPLIED_VERSIONS = "SELECT version FROM schema_migrations"
RECORD_MIGRATION = "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)"

LOOKUP = (
    "SELECT result, turns, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, "
    "tree_change FROM results WHERE key = ?"
)
INSERT_ATTEMPT = (
    "INSERT INTO attempts (key, role, status, detail, recorded_at) VALUES (?, ?, ?, ?, ?)"
)
UPSERT_RESULT = (
    "INSERT INTO results (key, role, prompt, result, turns, input_tokens, output_tokens, "
    "cache_read_tokens, cache_write_tokens, recorded_at, tree_change) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET role = excluded.role, prompt = excluded.prompt, "
    "result = excluded.result, turns = excluded.turns, input_tokens = excluded.input_tokens, "
    "output_tokens = excluded.output_tokens, cache_read_tokens = excluded.cache_read_tokens, "
    "cache_write_tokens = excluded.cache_write_tokens, recorded_at = excluded.recorded_at, "
    "tree_change = excluded.tree_change"
)


def result_row(
    key: str, role: str, prompt: str, result: AgentResult, now: float
) -> tuple[object, ...]:
    """UPSERT_RESULT's parameters for ``result``."""
    u = result.usage
    change = result.change
    encoded = ""
    if change is not None:
        fields: dict[str, object] = {"base": change.base, "patch": change.patch}
        if change.left_out:
            fields["left_out"] = list(change.left_out)
        encoded = json.dumps(fields)
    return (
        key, role, prompt, result.text, result.turns, u.input_tokens, u.output_tokens,
        u.cache_read_tokens, u.cache_write_tokens, now, encoded,
    )  # fmt: skip


def result_of(row: Sequence[Any]) -> AgentResult:
    """A recorded result from its LOOKUP row; a change that cannot be read is dropped."""
    change: Change | None = None
    if row[6]:
        try:
            value = json.loads(row[6])
            left_out = tuple(str(n) for n in value.get("left_out", ()))
            change = Change(str(value["base"]), str(value["patch"]), left_out)
        except (ValueError, KeyError, TypeError):
            change = None
    return AgentResult(row[0], Status.FINISHED, row[1], TokenUsage(*row[2:6]), change=change)


#: Parameters: key, holder, expires_at, now. Changes one row when the claim is ours.
CLAIM = (
    "INSERT INTO claims (key, holder, expires_at) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
    "WHERE claims.expires_at < ? OR claims.holder = excluded.holder"
)
#: Parameters: expires_at, key, holder.
RENEW = "UPDATE claims SET expires_at = ? WHERE key = ? AND holder = ?"
RELEASE = "DELETE FROM claims WHERE key = ? AND holder = ?"
#: Parameters: key, now. Who holds a claim that has not lapsed.
HOLDER = "SELECT holder FROM claims WHERE key = ? AND expires_at >= ?"

ENSURE_BUDGET = (
    "INSERT INTO budgets (session, subagents, tokens, cost) VALUES (?, 0, 0, 0) "
    "ON CONFLICT (session) DO NOTHING"
)
#: Parameters: subagents, tokens, cost, session, subagents, max_subagents, tokens,
#: max_tokens, cost, max_cost. Changes one row when every cap still holds.
RESERVE = (
    "UPDATE budgets SET subagents = subagents + ?, tokens = tokens + ?, cost = cost + ? "
    "WHERE session = ? AND subagents + ? <= ? AND tokens + ? <= ? AND cost + ? <= ?"
)
#: Parameters: tokens, cost, session.
SETTLE = "UPDATE budgets SET tokens = tokens + ?, cost = cost + ? WHERE session = ?"
BUDGET = "SELECT subagents, tokens, cost FROM budgets WHERE session = ?"

#: Parameters: id, workdir, created_at, updated_at, state.
SAVE_SESSION = (
    "INSERT INTO sessions (id, workdir, created_at, updated_at, state) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET workdir = excluded.workdir, "
    "updated_at = excluded.updated_at, state = excluded.state"
)
LOAD_SESSION = "SELECT workdir, state FROM sessions WHERE id = ?"
LATEST_SESSION = "SELECT id FROM sessions ORDER BY updated_at DESC LIMIT 1"
#: Saved sessions, and sessions known only from their events (killed before the first save).
LIST_SESSIONS = (
    "SELECT id, workdir, created_at, updated_at FROM sessions "
    "UNION ALL "
    "SELECT session, '', MIN(at), MAX(at) FROM events "
    "WHERE session NOT IN (SELECT id FROM sessions) GROUP BY session "
    "ORDER BY 4 DESC, 1 DESC"
)
NEXT_EVENT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE session = ?"
#: Parameters: session, seq, at, kind, data.
INSERT_EVENT = "INSERT INTO events (session, seq, at, kind, data) VALUES (?, ?, ?, ?, ?)"
EVENTS = "SELECT seq, at, kind, data FROM events WHERE session = ? ORDER BY seq"

#: Parameters: session, start. Drops the tail a checkpoint replaces (normally nothing).
TRUNCATE_MESSAGES = "DELETE FROM session_messages WHERE session = ? AND seq >= ?"
#: Parameters: session, session, seq - 1, seq, message (see :func:`message_rows`). The seq
#: becomes NULL, which its NOT NULL refuses, unless the message directly follows the last one
#: recorded: a wrong ``start`` fails loudly instead of leaving a gap that a resumed
#: conversation would silently lack, and the check costs no extra round trip.
INSERT_MESSAGE = (
    "INSERT INTO session_messages (session, seq, message) VALUES (?, "
    "CASE WHEN COALESCE((SELECT MAX(seq) FROM session_messages WHERE session = ?), -1) = ? "
    "THEN ? END, ?)"
)
LOAD_MESSAGES = "SELECT message FROM session_messages WHERE session = ? ORDER BY seq"

APPROVAL_COLUMNS = (
    "id, session, agent, workdir, kind, what, why, rule, key, status, created_at, "
    "answered_at, always, reason"
)
#: Parameters: session, key, agent, workdir, kind, what, why, rule, created_at. Asking
#: twice (the same session and key) records nothing the second time: :data:`APPROVAL_BY_KEY`
#: then reads the one recorded. The id is the store's largest plus one; writers are one at
#: a time (SQLite's write lock, PostgreSQL's advisory lock), so no two get the same.
REQUEST_APPROVAL = (
    "INSERT INTO approvals (id, session, key, agent, workdir, kind, what, why, rule, status, "
    "created_at) VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM approvals), "
    "?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?) ON CONFLICT (session, key) DO NOTHING"
)
APPROVAL_BY_KEY = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE session = ? AND key = ?"
APPROVAL = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = ?"
#: Parameters: status, answered_at, always, reason, id. Only a pending approval is
#: answered: of two answers at once, the second finds it answered and changes nothing.
ANSWER_APPROVAL = (
    "UPDATE approvals SET status = ?, answered_at = ?, always = ?, reason = ? "
    f"WHERE id = ? AND status = 'pending' RETURNING {APPROVAL_COLUMNS}"
)
#: Every approval, or only pending ones, of every session or of one (its parameter).
APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals ORDER BY id"
PENDING_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE status = 'pending' ORDER BY id"
SESSION_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE session = ? ORDER BY id"
SESSION_PENDING_APPROVALS = (
    f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE session = ? AND status = 'pending' ORDER BY id"
)


def approvals_query(session: str | None, pending: bool) -> tuple[str, tuple[object, ...]]:
    """The query (and its parameters) for :meth:`~orchmode.store.base.Store.approvals`."""
    if session is None:
        return (PENDING_APPROVALS if pending else APPROVALS), ()
    return (SESSION_PENDING_APPROVALS if pending else SESSION_APPROVALS), (session,)


def request_params(request: ApprovalRequest, now: float) -> tuple[object, ...]:
    """:data:`REQUEST_APPROVAL`'s parameters for ``request``."""
    r = request
    return (r.session, r.key, r.agent, r.workdir, r.kind, r.what, r.why, r.rule, now)


def answer_params(
    id: int, approved: bool, *, always: bool, reason: str, now: float
) -> tuple[object, ...]:
    """:data:`ANSWER_APPROVAL`'s parameters for a user's answer."""
    return ("approved" if approved else "denied", now, int(always), reason, id)


def timed_out_params(id: int, now: float) -> tuple[object, ...]:
    """:data:`ANSWER_APPROVAL`'s parameters for an approval nobody answered in time."""
    return ("timed out", now, 0, "", id)


def approval_of(row: Sequence[Any]) -> Approval:
    """An approval from a row of :data:`APPROVAL_COLUMNS`."""
    request = ApprovalRequest(
        session=str(row[1]),
        agent=str(row[2]),
        workdir=str(row[3]),
        kind=row[4],
        what=str(row[5]),
        why=str(row[6]),
        rule=str(row[7]),
        key=str(row[8]),
    )
    return Approval(
        id=int(row[0]),
        request=request,
        status=row[9],
        created_at=float(row[10]),
        answered_at=None if row[11] is None else float(row[11]),
        always=bool(row[12]),
        reason=str(row[13]),
    )


#: Parameters: custom_id, session, batch_id, recorded_at. A request already recorded keeps
#: its time; it takes the batch id once one is known, and never loses it.
RECORD_BATCH_REQUEST = (
    "INSERT INTO batch_requests (custom_id, session, batch_id, recorded_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (custom_id) DO UPDATE SET batch_id = excluded.batch_id "
    "WHERE excluded.batch_id <> ''"
)
BATCH_REQUEST = "SELECT batch_id, recorded_at FROM batch_requests WHERE custom_id = ?"


def pending_migrations(
    applied: set[int], migrations: Sequence[tuple[str, list[str]]], location: object
) -> list[tuple[int, str, list[str]]]:
    """The migrations still to apply, in order; a store from a newer orchmode is refused."""
    newest = max(applied, default=0)
    if newest > len(migrations):
        raise StoreError(
            f"the store {location} was written by a newer orchmode (schema {newest}, this "
            f"version knows {len(migrations)}) — upgrade orchmode or use another --store"
        )
    return [
        (version, name, statements)
        for version, (name, statements) in enumerate(migrations, start=1)
        if version not in applied
    ]


def reserve_params(
    session: str, caps: BudgetCaps, *, subagents: int, tokens: int, cost: float
) -> tuple[object, ...]:
    """The parameters of :data:`RESERVE`, with absent caps as effectively infinite."""
    token_cap = NO_LIMIT_TOKENS if caps.max_tokens is None else caps.max_tokens
    cost_cap = NO_LIMIT_COST if caps.max_cost is None else caps.max_cost
    return (
        subagents, tokens, cost, session,
        subagents, caps.max_subagents, tokens, token_cap, cost, cost_cap,
    )  # fmt: skip


def message_rows(session: str, start: int, messages: Sequence[str]) -> list[tuple[object, ...]]:
    """The parameters of :data:`INSERT_MESSAGE` for ``messages`` placed from index ``start``.

    A negative ``start`` is a caller's bug, refused before anything is written.
    """
    if start < 0:
        raise ValueError(f"a conversation's messages start at index 0, not {start}")
    return [
        (session, session, seq - 1, seq, message)
        for seq, message in enumerate(messages, start=start)
    ]


def gap_error(location: object, session: str, start: int) -> StoreError:
    """The error for a checkpoint whose first message would not follow the recorded ones."""
    return StoreError(
        f"could not checkpoint the conversation in {location}: session {session!r} has fewer "
        f"than {start} messages recorded, so messages from index {start} would leave a gap"
    )
