"""What a responder answers to make a batched request end errored, expired or canceled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["BatchFate", "FateKind"]

FateKind = Literal["errored", "expired", "canceled"]
_FATE_KINDS = frozenset(get_args(FateKind))


@dataclass(frozen=True)
class BatchFate:
    """A batched request's result other than ``succeeded``, as the batch reports it.

    The Message Batches API reports these per request rather than as HTTP errors, so a
    client's retry paths can only be tested if a script can pick them. ``error_type`` and
    ``message`` fill an ``errored`` result's error; the other kinds carry nothing. A
    responder that answers an interactive request with a fate gets a 500, as for any other
    answer the server cannot send. ``delay`` is waited before the result is settled, as a
    reply's is, so a test can cancel a batch while the request is still processing.
    """

    kind: FateKind
    error_type: str = "api_error"
    message: str = "Internal server error"
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in _FATE_KINDS:
            raise ValueError(f"BatchFate.kind must be one of {sorted(_FATE_KINDS)}")

    @classmethod
    def errored(
        cls, error_type: str = "api_error", message: str = "Internal server error"
    ) -> BatchFate:
        return cls("errored", error_type, message)

    @classmethod
    def expired(cls) -> BatchFate:
        return cls("expired")

    @classmethod
    def canceled(cls) -> BatchFate:
        return cls("canceled")
