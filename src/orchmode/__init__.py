"""orchmode: run Claude as an orchestrator of parallel, verified subagents.

Heavy parts are imported on first use, so the command line starts quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AuthError, ConfigError, EndpointError, OrchmodeError

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .agent import Session, TurnResult
    from .model import Credentials, ModelGateway
    from .settings import Settings

_LAZY = {
    "Session": "agent",
    "TurnResult": "agent",
    "Credentials": "model",
    "ModelGateway": "model",
    "Settings": "settings",
}

__all__ = [
    "AuthError",
    "ConfigError",
    "Credentials",
    "EndpointError",
    "ModelGateway",
    "OrchmodeError",
    "Session",
    "Settings",
    "TurnResult",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'orchmode' has no attribute {name!r}")
