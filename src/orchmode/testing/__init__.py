"""Test doubles for orchmode: a scripted Anthropic Messages API server over real HTTP."""

from .faults import MIXED, FaultSchedule
from .server import (
    Fault,
    FaultKind,
    LoggedRequest,
    Reply,
    Responder,
    ScriptedRequest,
    ScriptedServer,
    StopReason,
)
from .validate import InvalidRequest, validate_request

__all__ = [
    "MIXED",
    "Fault",
    "FaultKind",
    "FaultSchedule",
    "InvalidRequest",
    "LoggedRequest",
    "Reply",
    "Responder",
    "ScriptedRequest",
    "ScriptedServer",
    "StopReason",
    "validate_request",
]
