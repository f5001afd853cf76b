"""What agents reached over the network and what they asked the user, folded from events.

A sandboxed ``pip install`` makes dozens of connections, so no view lists them one by one:
each agent's connections are summed per domain, port, decision and rule (a :class:`Reach`),
and an approval is one record from its request to its answer (:class:`ApprovalRecord`). The
live view folds the events as they come, ``show`` and the report fold the recorded rows; all
of them through :class:`NetworkLog`, so they count and word alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.events import ApprovalAnswered, ApprovalRequested, Event, NetworkConnection
from .wording import seconds

#: The decisions a connection can end with, in the order the views list them.
DECISIONS = ("allowed", "approved", "failed", "denied")

#: Decisions that let a connection out (``failed``: allowed, but nothing answered there).
LET_THROUGH = frozenset({"allowed", "approved", "failed"})


def size(count: int) -> str:
    """Bytes as a reader sees them: ``512 B``, ``14.2 kB``, ``3.1 MB``, ``1.20 GB``."""
    if count < 1000:
        return f"{count} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6)):
        if count < scale * 1000:
            return f"{count / scale:.1f} {unit}"
    return f"{count / 1e9:.2f} GB"


@dataclass
class Reach:
    """One agent's connections to one ``domain:port`` that the same rule decided alike."""

    agent: str
    domain: str
    port: int
    decision: str
    rule: str
    connections: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    #: Seconds the connections were open, summed.
    duration: float = 0.0
    first_at: float = 0.0
    last_at: float = 0.0

    @property
    def where(self) -> str:
        return f"{self.domain}:{self.port}"

    @property
    def rule_text(self) -> str:
        """The rule that decided, or what decides when none is named."""
        if self.rule:
            return self.rule
        return "named by no rule" if self.decision == "denied" else ""

    def add(self, event: NetworkConnection, at: float) -> None:
        if not self.connections:
            self.first_at = at
        self.connections += 1
        self.bytes_sent += event.bytes_sent
        self.bytes_received += event.bytes_received
        self.duration += event.duration
        self.last_at = max(self.last_at, at)


@dataclass
class ApprovalRecord:
    """One question to the user: what an agent asked, and the answer once there is one."""

    id: int
    agent: str
    kind: str
    what: str
    why: str
    asked_at: float
    #: ``approved``, ``denied`` or ``timed out``; None while the agent is still parked.
    answer: str | None = None
    always: bool = False
    reason: str = ""
    answered_at: float | None = None

    @property
    def pending(self) -> bool:
        return self.answer is None

    def waited(self, now: float | None = None) -> float | None:
        """Seconds the agent was parked: until the answer, or until ``now`` while pending."""
        end = self.answered_at if self.answered_at is not None else now
        return None if end is None else max(0.0, end - self.asked_at)

    @property
    def answered_by(self) -> str:
        """Who settled it, as far as the records tell: the timeout, or the user's answer."""
        if self.answer is None:
            return ""
        if self.answer == "timed out":
            return "approval_timeout"
        return "user, remembered for this directory" if self.always else "user, this once"

    def outcome(self) -> str:
        """``approved after 12.0 s (remembered for this directory)``, or ``waiting``."""
        if self.answer is None:
            return "no answer recorded"
        line = self.answer
        waited = self.waited()
        if waited is not None:
            line += f" after {seconds(waited)}"
        if self.always:
            line += " (remembered for this directory)"
        if self.reason:
            line += f": {self.reason}"
        return line


def hint(id: int) -> str:
    """How to answer approval ``id``: in ``orchmode chat``, or from another terminal."""
    return f"/approve {id} or /deny {id} · from another terminal: orchmode approve {id}"


def question_text(approval: ApprovalRecord | ApprovalRequested) -> str:
    """What an agent asks, and why: ``domain pypi.org:443 (ask: pypi.org in network_ask)``."""
    what = f"{approval.kind} {approval.what}".strip()
    return what + (f" ({approval.why})" if approval.why else "")


def connection_text(reach: Reach) -> str:
    """``denied evil.example:443 (rule) ×3``: one line for an agent's connections to a domain."""
    line = f"{reach.decision} {reach.where}"
    if reach.rule_text:
        line += f" ({reach.rule_text})"
    if reach.connections > 1:
        line += f" ×{reach.connections}"
    return line


@dataclass
class AgentTraffic:
    """One agent's connections, summed: what it reached and what was refused."""

    agent: str
    reaches: list[Reach] = field(default_factory=list)

    def count(self, *decisions: str) -> int:
        return sum(r.connections for r in self.reaches if r.decision in decisions)

    @property
    def domains(self) -> int:
        """The domains it reached (connections let through)."""
        return len({r.domain for r in self.reaches if r.decision in LET_THROUGH})

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.reaches)

    @property
    def bytes_received(self) -> int:
        return sum(r.bytes_received for r in self.reaches)

    def summary(self) -> str:
        """``34 allowed, 2 approved to 3 domains · 1.2 MB in, 40.0 kB out · 1 denied``."""
        counts = [
            f"{n} {decision}"
            for decision in DECISIONS
            if decision != "denied" and (n := self.count(decision))
        ]
        parts = []
        if counts:
            domains = self.domains
            parts.append(", ".join(counts) + f" to {domains} domain{'s' if domains != 1 else ''}")
            parts.append(f"{size(self.bytes_received)} in, {size(self.bytes_sent)} out")
        if denied := self.count("denied"):
            parts.append(f"{denied} denied")
        return " · ".join(parts)


@dataclass
class NetworkLog:
    """A turn's connections and approvals, folded from its events in order."""

    reaches: dict[tuple[str, str, int, str, str], Reach] = field(default_factory=dict)
    approvals: dict[int, ApprovalRecord] = field(default_factory=dict)

    def follow(self, event: Event, at: float) -> bool:
        """Fold ``event`` in (recorded or heard at ``at``); whether it was one of ours."""
        match event:
            case NetworkConnection():
                key = (event.agent, event.domain, event.port, event.decision, event.rule)
                reach = self.reaches.get(key)
                if reach is None:
                    reach = self.reaches[key] = Reach(*key)
                reach.add(event, at)
            case ApprovalRequested():
                if event.id not in self.approvals:  # a resumed run may ask the same again
                    self.approvals[event.id] = ApprovalRecord(
                        event.id, event.agent, event.kind, event.what, event.why, at
                    )
            case ApprovalAnswered():
                found = self.approvals.get(event.id)
                if found is None:  # its request was recorded before this turn: still shown
                    found = self.approvals[event.id] = ApprovalRecord(
                        event.id, event.agent, "", "", "", at
                    )
                found.answer, found.always, found.reason = event.answer, event.always, event.reason
                found.answered_at = at
            case _:
                return False
        return True

    def __bool__(self) -> bool:
        return bool(self.reaches or self.approvals)

    @property
    def pending(self) -> list[ApprovalRecord]:
        return [a for a in self.approvals.values() if a.pending]

    def traffic(self) -> list[AgentTraffic]:
        """Each agent's connections, agents in the order first heard of, the most used
        domains first."""
        agents: dict[str, AgentTraffic] = {}
        for reach in self.reaches.values():
            agents.setdefault(reach.agent, AgentTraffic(reach.agent)).reaches.append(reach)
        for traffic in agents.values():
            traffic.reaches.sort(key=lambda r: (DECISIONS.index(r.decision)
                                                if r.decision in DECISIONS else 9,
                                                -r.connections, r.domain))  # fmt: skip
        return list(agents.values())

    def denials(self) -> list[Reach]:
        """Every refused ``domain`` once per agent, however many times it was tried, in the
        order first refused (the ports and rules of one domain's refusals are merged)."""
        merged: dict[tuple[str, str], Reach] = {}
        for reach in self.reaches.values():
            if reach.decision != "denied":
                continue
            key = (reach.agent, reach.domain)
            seen = merged.get(key)
            if seen is None:
                merged[key] = Reach(reach.agent, reach.domain, reach.port, "denied", reach.rule,
                                    reach.connections, reach.bytes_sent, reach.bytes_received,
                                    reach.duration, reach.first_at, reach.last_at)  # fmt: skip
            else:
                seen.connections += reach.connections
                seen.first_at = min(seen.first_at, reach.first_at)
                seen.last_at = max(seen.last_at, reach.last_at)
        return sorted(merged.values(), key=lambda r: r.first_at)
