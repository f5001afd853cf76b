"""orchmode: run Claude as an orchestrator of parallel, verified subagents.

From Python::

    async with orchmode.open_session(settings, credentials=orchmode.Credentials(api_key=key)) as s:
        s.set_mode(True)
        result = await s.turn("Review this repository")

:func:`open_session` opens a :class:`Session`; its events are the classes exported here
(:class:`BashDone`, :class:`SubagentDone`, …), its totals a :class:`Totals`, and every error
it raises an :class:`OrchmodeError` (their tree opens ``core/errors.py``). See
docs/library.md. Heavy parts are imported on first use, so the command line
(and ``import orchmode``) starts quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core import events as _events
from .core.errors import (
    AllowanceSpent,
    AuthError,
    BatchFailed,
    BudgetExhausted,
    ClusterError,
    ConfigError,
    EndpointError,
    ModelRequestError,
    OrchmodeError,
    Overloaded,
    PromptTooLong,
    SandboxError,
    StoreError,
    StreamInterrupted,
    TransientFailure,
    TreeError,
    UnreadableRecord,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .core.events import *  # noqa: F403  (every event class, Event and TokenUsage)
    from .core.settings import Settings
    from .model.gateway import ModelGateway
    from .model.providers import Credentials
    from .records.totals import RequestTotals, Totals
    from .session.agent import SessionBusy, TurnResult
    from .session.api import EventStream, Session, SessionClosed, open_session
    from .session.ledger import BudgetReport
    from .session.resume import CannotResume, Interrupted
    from .session.run_record import RunRecord
    from .session.runs import RunAnswer, RunResult
    from .session.stored import (
        ApprovalNotPending,
        approvals,
        approve,
        budget,
        deny,
        interrupted_run,
        resumable,
    )
    from .store.base import Approval, ApprovalRequest

#: The events' public names, derived from their one declaration (``core/events.py`` is small:
#: dataclasses only, no SDK and no pydantic).
_EVENTS = ("Event", "TokenUsage", *(cls.__name__ for cls in _events.EVENTS))

#: Public name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "open_session": "session.api",
    "Session": "session.api",
    "SessionClosed": "session.api",
    "EventStream": "session.api",
    "Totals": "records.totals",
    "RequestTotals": "records.totals",
    "RunResult": "session.runs",
    "RunAnswer": "session.runs",
    "RunRecord": "session.run_record",
    "BudgetReport": "session.ledger",
    "Interrupted": "session.resume",
    "CannotResume": "session.resume",
    "approvals": "session.stored",
    "approve": "session.stored",
    "budget": "session.stored",
    "deny": "session.stored",
    "interrupted_run": "session.stored",
    "resumable": "session.stored",
    "ApprovalNotPending": "session.stored",
    "Approval": "store.base",
    "ApprovalRequest": "store.base",
    "TurnResult": "session.agent",
    "SessionBusy": "session.agent",
    "Credentials": "model.providers",
    "ModelGateway": "model.gateway",
    "Settings": "core.settings",
    **dict.fromkeys(_EVENTS, "core.events"),
}

__all__ = [
    "AllowanceSpent",
    "Approval",
    "ApprovalNotPending",
    "ApprovalRequest",
    "AuthError",
    "BatchFailed",
    "BudgetExhausted",
    "BudgetReport",
    "CannotResume",
    "ClusterError",
    "ConfigError",
    "Credentials",
    "EndpointError",
    "EventStream",
    "Interrupted",
    "ModelGateway",
    "ModelRequestError",
    "OrchmodeError",
    "Overloaded",
    "PromptTooLong",
    "RequestTotals",
    "RunAnswer",
    "RunRecord",
    "RunResult",
    "SandboxError",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "Settings",
    "StoreError",
    "StreamInterrupted",
    "Totals",
    "TransientFailure",
    "TreeError",
    "TurnResult",
    "UnreadableRecord",
    "__version__",
    "approvals",
    "approve",
    "budget",
    "deny",
    "interrupted_run",
    "open_session",
    "resumable",
]
__all__ += _EVENTS


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module 'orchmode' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
