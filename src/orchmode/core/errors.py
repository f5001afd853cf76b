"""One exception hierarchy whose messages are written for the person at the terminal.

The CLI prints ``orchmode: <message>`` and exits non-zero; tracebacks only with ``--debug``.
"""

from __future__ import annotations


class OrchmodeError(Exception):
    """A problem the user can act on; ``str(err)`` is the whole explanation."""

    exit_code = 1


class ConfigError(OrchmodeError):
    """A bad flag, environment variable or ``orchmode.toml`` entry."""

    exit_code = 2


class AuthError(OrchmodeError):
    """Missing or rejected credentials: retrying cannot help."""

    exit_code = 3


class EndpointError(OrchmodeError):
    """The Messages API could not be reached or kept failing."""

    exit_code = 4


class StreamInterrupted(EndpointError):
    """A response stream broke off or reported an error part-way: safe to send again."""


class Overloaded(EndpointError):
    """429 or 529: the API wants fewer requests; wait (``retry_after`` if it said) and retry."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TransientFailure(EndpointError):
    """A 5xx, a timeout or a lost connection: worth a few more tries."""


class ModelRequestError(OrchmodeError):
    """The API refused a request (a 4xx other than authentication)."""

    exit_code = 5


class PromptTooLong(ModelRequestError):
    """400 "prompt is too long": the request passed the context window (``tokens`` if said)."""

    def __init__(self, message: str, tokens: int | None = None) -> None:
        super().__init__(message)
        self.tokens = tokens


class StoreError(OrchmodeError):
    """The store (journal, claims, budget) cannot be opened, read or written."""

    exit_code = 6


class SandboxError(OrchmodeError):
    """bash cannot be sandboxed here, and the user did not opt out with ``--sandbox off``."""

    exit_code = 8


class ClusterError(OrchmodeError):
    """The Ray cluster cannot be used: Ray missing, the cluster unreachable, no live node."""

    exit_code = 9
