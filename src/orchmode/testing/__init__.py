"""Test doubles for orchmode: a scripted Anthropic Messages API server over real HTTP."""

from .batch_fate import BatchFate
from .batch_store import BatchSettings
from .faults import MIXED, FaultSchedule
from .replies import (
    Fault,
    FaultKind,
    LoggedRequest,
    Recorded,
    Reply,
    Responder,
    ScriptedRequest,
    StopReason,
)
from .server import ScriptedServer
from .validate import InvalidRequest, validate_request

__all__ = [
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
]
