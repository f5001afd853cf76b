"""Who is behind a sandboxed shell's connections, and what each connection's event will say."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..core.events import Event
from ..core.permissions import Verdict


@dataclass
class Seat:
    """Who is behind one sandboxed shell's connections: mutable, because shells are started
    ahead of need before the agent that takes one is known."""

    agent: str = "main"
    #: An ask verdict's answer: True approved. None: an ask is denied (nobody to ask).
    ask: Callable[[str, int, Verdict], Awaitable[bool]] | None = None
    #: Where this shell's NetworkConnection events go (None: the proxy's default emit).
    emit: Callable[[Event], None] | None = None


@dataclass
class Connection:
    """What one client connection's event will say."""

    seat: Seat
    started: float
    host: str = ""
    port: int = 0
    decision: str = "failed"
    rule: str = ""
    sent: int = 0
    received: int = 0
