"""What an agent may do past its sandbox's walls: the permission rules, and the user when they ask.

One :class:`Permits` per process holds the rules in force and the approvals broker; each
agent gets an :class:`AgentPermits` that its shell (every command), its MCP calls and its
shell's seat at the network proxy (every connection) ask. An ``ask`` waits for the user
with the agent parked (:mod:`.parking`): its slot goes to the next agent, and the command
waiting on it has its time limit stand still.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.events import Event
from ..core.permissions import Rules, Verdict
from ..core.secrets import Masker
from ..store.base import ApprovalKind, ApprovalRequest
from .parking import Parking, current, parked

if TYPE_CHECKING:
    from ..shell.bash import BashSession
    from ..shell.proxy import Proxy
    from .approvals import Approvals

__all__ = ["AgentPermits", "Permits"]

#: Characters past which a command's parse runs on a thread (a 50 KB one takes ~0.5 s).
_LONG_COMMAND = 4000


@dataclass
class Permits:
    """The session's permission rules and whom an ``ask`` goes to (None: nobody, denied)."""

    rules: Rules
    session: str
    workdir: Path
    approvals: Approvals | None = None
    #: Masks the session's secrets in what a question records (a command may hold one).
    masker: Masker | None = None
    #: Rules answered "always" in this run: they hold for every agent from then on.
    remembered: set[str] = field(default_factory=set)

    def for_agent(self, agent: str, emit: Callable[[Event], None] | None = None) -> AgentPermits:
        """``agent``'s permits, parked (when it asks) with the parking it runs under now."""
        return AgentPermits(self, agent, current(), emit)

    def allow_always(self, rule: str) -> None:
        if rule and rule not in self.remembered:
            self.remembered.add(rule)
            self.rules = self.rules.allowing(rule)

    def guard(self, proxy: Proxy) -> None:
        """Make the network proxy decide by these rules (``WebFetch`` rules and answers
        given "always" included), as they stand at each connection."""
        proxy.decide = lambda host, port: self.rules.domain(host, port)
        proxy.address = lambda host, address: self.rules.address(host, address)

    def attach(self, shell: BashSession, agent: str, emit: Callable[[Event], None]) -> None:
        """Make ``shell`` ask for ``agent``: each command first, and each connection its
        commands make through the proxy (held meanwhile, its time limit standing still)."""
        permits = self.for_agent(agent, emit)
        shell.permit = permits.command

        async def ask(host: str, port: int, verdict: Verdict) -> bool:
            async with shell.held():
                return await permits.domain(host, port, verdict)

        shell.seat.ask = ask  # (the seat's agent and events are set by whoever hands the shell on)


@dataclass
class AgentPermits:
    """One agent's questions: answered by the rules, or by the user for an ``ask``."""

    permits: Permits
    agent: str
    parking: Parking | None
    emit: Callable[[Event], None] | None = None

    async def command(self, command: str) -> str | None:
        """None if ``command`` may run, else why not (the tool result the agent gets)."""
        rules = self.permits.rules
        if len(command) > _LONG_COMMAND:  # parsing a long one takes a while: not on the loop
            verdict = await asyncio.to_thread(rules.command, command)
        else:
            verdict = rules.command(command)
        if verdict.decision == "allow":
            return None
        if verdict.decision == "ask":
            approved, reason = await self._ask("command", command, verdict, rules.always(verdict))
            if approved:
                return None
            return f"orchmode: the command was not run — {reason}"
        return (
            f"orchmode: the command was not run — {verdict.why()} denies it; "
            "use another way, or ask the user to change the rule"
        )

    async def mcp(
        self, server: str, tool: str, annotations: Mapping[str, Any] | None
    ) -> str | None:
        """None if the MCP tool may be called, else why not."""
        verdict = self.permits.rules.mcp(server, tool, annotations)
        if verdict.decision == "allow":
            return None
        what = f"{server}/{tool}"
        if verdict.decision == "ask":
            rule = self.permits.rules.always(verdict, server=server, tool=tool)
            approved, reason = await self._ask("mcp", what, verdict, rule)
            if approved:
                return None
            return f"orchmode: {what} was not called — {reason}"
        return f"orchmode: {what} was not called — {verdict.why()} denies it"

    async def domain(self, host: str, port: int, verdict: Verdict) -> bool:
        """The answer to an ``ask`` for a connection the proxy holds meanwhile."""
        rule = self.permits.rules.always(verdict, host=host)
        approved, _ = await self._ask("domain", f"{host}:{port}", verdict, rule)
        return approved

    async def _ask(
        self, kind: ApprovalKind, what: str, verdict: Verdict, rule: str
    ) -> tuple[bool, str]:
        """Ask the user (parked meanwhile): whether approved, and a reason when not."""
        permits = self.permits
        if rule and rule in permits.remembered:
            return True, ""
        broker = permits.approvals
        if broker is None:
            return False, f"{verdict.why()} asks for approval, and nobody can answer here"
        mask = permits.masker.mask if permits.masker is not None else str
        what = mask(what)
        request = ApprovalRequest(
            session=permits.session,
            agent=self.agent,
            workdir=str(permits.workdir),
            kind=kind,
            what=what,
            why=mask(verdict.why()),
            rule=rule,
            key=_key(self.agent, kind, what),
        )
        answer = await broker.ask(request, park=lambda: parked(self.parking))
        if answer.approved:
            if answer.always and rule:
                permits.allow_always(rule)
            return True, ""
        reason = answer.reason or answer.status
        return False, f"the user's approval was asked for ({verdict.why()}): {reason}"


def _key(agent: str, kind: str, what: str) -> str:
    """What makes two questions the same one, so that a resumed run finds its answer."""
    text = json.dumps([agent, kind, what], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
