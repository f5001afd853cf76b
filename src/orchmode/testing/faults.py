"""Fault schedules: which scripted requests fail, and how, decided per request.

A schedule wraps any responder. It can name requests by their position among those that
reach the responder (``at``: ``{2: Fault("overloaded")}`` gives the third a 529), or pick
a share of them (``rate``) deterministically from the request's bytes, so the same request
always meets the same fate however the client's requests interleave. With
``first_try_only`` (the default) a request body that failed is answered normally when it
is sent again, which is what a run that can be finished needs; without it, a failing body
fails every time (a permanent fault).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .replies import Answer, Fault, Responder, ScriptedRequest

#: Every way the API fails, once each: what ``mixed`` cycles through.
MIXED: tuple[Fault, ...] = (
    Fault("overloaded"),
    Fault("rate_limit", retry_after=0.05),
    Fault("server_error"),
    Fault("drop", after_events=4),
    Fault("sse_error", after_events=4),
    Fault("drop", after_events=0),  # an empty response: headers, then nothing
)


@dataclass
class FaultSchedule:
    """A responder that fails the requests its schedule names and passes the rest on."""

    responder: Responder
    at: Mapping[int, Fault] = field(default_factory=dict)
    rate: float = 0.0
    kinds: Sequence[Fault] = MIXED
    seed: str = ""
    first_try_only: bool = True
    #: The kinds injected so far, in order (for a test to check what really happened).
    injected: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError("FaultSchedule.rate must be between 0 and 1")
        if self.rate and not self.kinds:
            raise ValueError("FaultSchedule.kinds must name at least one fault")
        self._failed: set[str] = set()
        self._lock = threading.Lock()

    def fault_for(self, request: ScriptedRequest) -> Fault | None:
        if request.index in self.at:
            return self._inject(self.at[request.index])
        if not self.rate:
            return None
        body = json.dumps(request.body, sort_keys=True, default=str)
        digest = hashlib.sha256((self.seed + body).encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        if draw >= self.rate:
            return None
        key = digest.hex()
        with self._lock:
            if self.first_try_only and key in self._failed:
                return None
            self._failed.add(key)
        return self._inject(self.kinds[digest[8] % len(self.kinds)])

    def _inject(self, fault: Fault) -> Fault:
        with self._lock:
            self.injected.append(fault.kind)
        return fault

    async def __call__(self, request: ScriptedRequest) -> Answer:
        fault = self.fault_for(request)
        if fault is not None:
            return fault
        answer = self.responder(request)
        if inspect.isawaitable(answer):
            answer = await answer
        return answer
