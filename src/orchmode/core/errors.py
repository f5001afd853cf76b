"""Every error orchmode raises on purpose, with messages written for the person at the terminal.

The CLI prints ``orchmode: <message>`` and exits with the class's ``exit_code``; tracebacks
only with ``--debug``. Catch :class:`OrchmodeError` for all of them, or a branch for one kind
of trouble. Every class below is exported from ``orchmode``::

    OrchmodeError                 exit 1
    ├── ConfigError               exit 2: a flag, variable or orchmode.toml entry
    ├── AuthError                 exit 3: credentials missing or refused
    ├── EndpointError             exit 4: the Messages API unreachable or failing
    │   ├── StreamInterrupted       a response stream broke off
    │   ├── Overloaded              429/529 for longer than overload_patience
    │   └── TransientFailure        a 5xx, timeout or lost connection, retries spent
    ├── ModelRequestError         exit 5: the API refused a request (a 4xx)
    │   ├── PromptTooLong           the request passed the context window
    │   └── BatchFailed             the API refused to create a message batch
    ├── StoreError                exit 6: the store cannot be opened, read or written
    ├── BudgetExhausted           exit 7: a cap of the session's budget would be crossed
    │   └── AllowanceSpent          an agent's own budget, or its subtree's, is spent
    ├── SandboxError              exit 8: bash cannot be sandboxed here
    ├── ClusterError              exit 9: the Ray cluster cannot be used
    ├── TreeError                 a git step of the workspaces failed
    ├── UnreadableRecord          a recorded event its declaration does not accept
    ├── SessionBusy               another process drives the session     (session/agent.py)
    ├── SessionClosed             the session was used after it closed   (session/api.py)
    ├── ApprovalNotPending        no approval waits under that id         (session/api.py)
    └── CannotResume              the session cannot be resumed           (session/resume.py)

The last four belong to the session layer and are declared there, since this module sits in
the lowest layer; the rest are here so that a lower layer can raise them.
"""

from __future__ import annotations

from typing import Any


class OrchmodeError(Exception):
    """A problem the user can act on; ``str(err)`` is the whole explanation."""

    #: What the command line exits with; a subclass names its own in its class line.
    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code


class ConfigError(OrchmodeError, exit_code=2):
    """A bad flag, environment variable or ``orchmode.toml`` entry."""


class AuthError(OrchmodeError, exit_code=3):
    """Missing or rejected credentials: retrying cannot help."""


class EndpointError(OrchmodeError, exit_code=4):
    """The Messages API could not be reached or kept failing."""


class StreamInterrupted(EndpointError):
    """A response stream broke off or reported an error part-way: safe to send again."""


class Overloaded(EndpointError):
    """429 or 529: the API wants fewer requests; wait (``retry_after`` if it said) and retry."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TransientFailure(EndpointError):
    """A 5xx, a timeout or a lost connection: worth a few more tries."""


class ModelRequestError(OrchmodeError, exit_code=5):
    """The API refused a request (a 4xx other than authentication)."""


class PromptTooLong(ModelRequestError):
    """400 "prompt is too long": the request passed the context window (``tokens`` if said)."""

    def __init__(self, message: str, tokens: int | None = None) -> None:
        super().__init__(message)
        self.tokens = tokens


class BatchFailed(ModelRequestError):
    """The API refused to create a message batch (see :mod:`orchmode.model.batches`)."""


class StoreError(OrchmodeError, exit_code=6):
    """The store (journal, claims, budget) cannot be opened, read or written."""


class BudgetExhausted(OrchmodeError, exit_code=7):
    """A cap of the session's budget would be crossed."""


class AllowanceSpent(BudgetExhausted):
    """An agent's own budget, or the budget of the subtree it runs in, cannot pay for its
    next model request (see :mod:`orchmode.model.allowance`); ``reason`` says whose, and
    how much was spent, in words an agent's result can carry."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SandboxError(OrchmodeError, exit_code=8):
    """bash cannot be sandboxed here, and the user did not opt out with ``--sandbox off``."""


class ClusterError(OrchmodeError, exit_code=9):
    """The Ray cluster cannot be used: Ray missing, the cluster unreachable, no live node."""


class TreeError(OrchmodeError):
    """A git step of isolation failed; the message says which and why."""


class UnreadableRecord(OrchmodeError):
    """A recorded row that its event's declaration does not accept."""
