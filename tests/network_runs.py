"""A real orchestrated turn with the network proxy's and the approvals broker's events in it.

Shared by the view tests (live, show, report, traces, escapes). The turn is a real one: the
library API against the scripted server, recorded in a real store. Into it, on the session's
own bus and at the moments they would happen (while a worker runs its command), go the
events the proxy and the broker emit: connections allowed, refused and approved, and an
approval asked and answered. They are emitted by :class:`Splicer`, the session's last
subscriber, so every view subscribed before it sees them in the order the store records them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orchmode
from conftest import API_KEY
from orchmode.core.events import (
    ApprovalAnswered,
    ApprovalRequested,
    BashDone,
    BashStarted,
    Event,
    NetworkConnection,
)
from orchmode.core.settings import Settings
from orchmode.testing import ScriptedServer

#: A package index's name, reached many times by one worker (a ``pip install``).
INDEX = "pypi.org"
FILES = "files.pythonhosted.org"
#: What the rules refused, and the rule that refused it.
REFUSED = "tracker.example"
DENY_RULE = "WebFetch(domain:tracker.example) in .claude/settings.json (deny)"
#: What worker 1.2 asks the user for, and why.
ASKED = "downloads.example:443"
ASK_WHY = "network_ask: downloads.example (orchmode.toml)"
APPROVAL_ID = 7


@dataclass
class Splicer:
    """Emits, on the session's bus, what the proxy and the broker would during the turn.

    - worker 1.1's command: 30 connections to :data:`INDEX` and 2 to :data:`FILES`, all
      allowed, and 3 to :data:`REFUSED`, refused by :data:`DENY_RULE`;
    - worker 1.2's command: it asks for :data:`ASKED` (approval :data:`APPROVAL_ID`); the
      answer (``answer``, remembered with ``always``) comes when the command ends, and its
      connection goes through when approved.

    ``hostile`` is put into the domain, rule, what and why (escape sequences and the like).
    """

    emit: Callable[[Event], None] | None = None
    answer: str = "approved"
    always: bool = True
    hostile: str = ""
    seen: list[Event] = field(default_factory=list)

    def __call__(self, event: Event) -> None:
        assert self.emit is not None
        h = self.hostile
        match event:
            case BashStarted(agent="worker 1.1"):
                preset = "preset python-packages"
                for n in range(30):
                    self.emit(NetworkConnection("worker 1.1", INDEX, 443, "allowed", preset,
                                                900, 40_000 + n, 0.01))  # fmt: skip
                for _ in range(2):
                    self.emit(NetworkConnection("worker 1.1", FILES, 443, "allowed", preset,
                                                1200, 2_000_000, 0.2))  # fmt: skip
                for _ in range(3):
                    self.emit(NetworkConnection("worker 1.1", REFUSED + h, 443, "denied",
                                                DENY_RULE + h, 0, 0, 0.0))  # fmt: skip
            case BashStarted(agent="worker 1.2"):
                self.emit(ApprovalRequested(APPROVAL_ID, "worker 1.2", "domain", ASKED + h,
                                            ASK_WHY + h))  # fmt: skip
            case BashDone(agent="worker 1.2"):
                self.emit(ApprovalAnswered(APPROVAL_ID, "worker 1.2", self.answer, self.always,
                                           "the user said so" + h))  # fmt: skip
                decision = "approved" if self.answer == "approved" else "denied"
                domain, port = ASKED.split(":")
                self.emit(NetworkConnection("worker 1.2", domain + h, int(port), decision,
                                            ASK_WHY + h, 300, 5_000, 0.05))  # fmt: skip


def settings(server: ScriptedServer, workdir: Path, **overrides: Any) -> Settings:
    """The store in its usual place under ``workdir`` (so ``orchmode show`` finds it)."""
    values: dict[str, Any] = {"base_url": server.url, "max_retries": 0, "workdir": workdir}
    values.update(overrides)
    return Settings(**values)


async def networked_turn(
    server: ScriptedServer,
    workdir: Path,
    *views: Callable[[Event], object],
    splicer: Splicer | None = None,
    **overrides: Any,
) -> tuple[list[Event], str]:
    """One orchestrated turn with the splicer's events in it: every event in the order the
    views got them, and the session's id. ``views`` are subscribed before the splicer."""
    splicer = splicer or Splicer()
    seen: list[Event] = []
    async with orchmode.open_session(
        settings(server, workdir, **overrides),
        workdir=workdir,
        credentials=orchmode.Credentials(api_key=API_KEY),
        subscribers=[seen.append, *views, splicer],
    ) as session:
        splicer.emit = session.conversation.events.emit
        session.set_mode(True)
        await session.turn("review it")
    return seen, session.id
