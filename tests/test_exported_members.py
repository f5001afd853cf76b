"""The public surface, pinned: a refactor cannot drop, rename or leak a public name unnoticed.

A change to these lists is a change to the API: make it on purpose, in docs/library.md too.
"""

from __future__ import annotations

import importlib
import pkgutil

import orchmode
import orchmode.testing
from orchmode.core.errors import OrchmodeError

EVENTS = {
    "ApprovalAnswered",
    "ApprovalRequested",
    "BashDone",
    "BashStarted",
    "BatchEnded",
    "BatchSent",
    "BatchWaiting",
    "BudgetStatus",
    "ChangeSettled",
    "ContextCompacted",
    "Event",
    "FanoutDone",
    "FanoutStarted",
    "McpCallDone",
    "McpCallStarted",
    "McpServerFailed",
    "ModelRefused",
    "ModelRequestDone",
    "ModelRequestFailed",
    "ModelRequestRetried",
    "NetworkConnection",
    "ResultCondensed",
    "ScriptDone",
    "ScriptStarted",
    "SubagentDone",
    "SubagentStarted",
    "TokenUsage",
    "TurnDone",
    "TurnResumed",
    "TurnStarted",
    "WorkspacesChosen",
}

ERRORS = {
    "AllowanceSpent",
    "ApprovalNotPending",
    "AuthError",
    "BatchFailed",
    "BudgetExhausted",
    "CannotResume",
    "ClusterError",
    "ConfigError",
    "EndpointError",
    "ModelRequestError",
    "OrchmodeError",
    "Overloaded",
    "PromptTooLong",
    "SandboxError",
    "SessionBusy",
    "SessionClosed",
    "StoreError",
    "StreamInterrupted",
    "TransientFailure",
    "TreeError",
    "UnreadableRecord",
}

API = {
    "Approval",
    "ApprovalRequest",
    "BudgetReport",
    "Credentials",
    "EventStream",
    "Interrupted",
    "ModelGateway",
    "RequestTotals",
    "RunAnswer",
    "RunRecord",
    "RunResult",
    "Session",
    "Settings",
    "Totals",
    "TurnResult",
    "__version__",
    "approvals",
    "approve",
    "budget",
    "deny",
    "interrupted_run",
    "open_session",
    "resumable",
}

TESTING = {
    "MIXED",
    "BatchFate",
    "BatchSettings",
    "Fault",
    "FaultKind",
    "FaultSchedule",
    "InvalidRequest",
    "LoggedRequest",
    "Recorded",
    "Reply",
    "Responder",
    "ScriptedRequest",
    "ScriptedServer",
    "StopReason",
    "validate_request",
}

#: Errors raised only inside orchmode and caught there (as their exported parent, or, the
#: console's, turned into the message its page shows): no caller of the library sees them.
CAUGHT_AS_PARENT = {"TooMuchUntracked": "TreeError", "ControlError": "OrchmodeError"}


def test_orchmode_exports_exactly_the_written_names() -> None:
    assert set(orchmode.__all__) == API | ERRORS | EVENTS
    assert len(orchmode.__all__) == len(set(orchmode.__all__))


def test_every_exported_name_of_orchmode_resolves() -> None:
    for name in orchmode.__all__:
        assert getattr(orchmode, name) is not None, name


def test_orchmode_testing_exports_exactly_the_written_names() -> None:
    assert set(orchmode.testing.__all__) == TESTING
    for name in orchmode.testing.__all__:
        assert getattr(orchmode.testing, name) is not None, name


def test_every_error_orchmode_declares_is_exported_or_caught_as_its_exported_parent() -> None:
    for module in pkgutil.walk_packages(orchmode.__path__, "orchmode."):
        if module.name.endswith("__main__"):  # runs the command line when imported
            continue
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional extra (Ray, PostgreSQL) not installed here
            continue
    declared = _subclasses(OrchmodeError) | {OrchmodeError}
    public = {cls for cls in declared if not cls.__name__.startswith("_")}
    for cls in public:
        if cls.__name__ in CAUGHT_AS_PARENT:
            assert getattr(orchmode, CAUGHT_AS_PARENT[cls.__name__]) in cls.__mro__
        else:
            assert getattr(orchmode, cls.__name__, None) is cls, f"{cls.__module__}.{cls.__name__}"


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found
