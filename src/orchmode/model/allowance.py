"""A budget per agent and per subtree: what an agent, and the agents under it, may spend.

Every running subagent has an :class:`Allowance`, held in the context variable
:data:`ALLOWANCE` while it runs; a fan-out started inside an agent's run makes its agents'
allowances children of that agent's. Before each model request the gateway reserves the
request's worst case on the running agent's allowance and on every ancestor's, and after it
settles each to what the request really used. The check and the reservation happen with no
``await`` between them, so agents in flight together on one event loop can never together
reserve past a limit: a subtree never spends more than its root was given.

A request that finds too little room while others under the same budget are in flight waits
for one of them to settle, as they may give room back. With nothing in flight, its output is
cut to the room there is (the gateway sends that as ``max_tokens``); once there is not room
for :data:`MIN_OUTPUT` tokens of output, the request is not sent and :class:`AllowanceSpent`
says whose budget ran out.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ..core.errors import AllowanceSpent
from ..core.pricing import ModelPrice
from ..core.settings import Settings

T = TypeVar("T", int, float)

#: The least output a request is sent for: an agent with less room left than this (after
#: its input) has spent its budget, as a reply cut shorter would end its run anyway.
MIN_OUTPUT = 1024


@dataclass(frozen=True)
class AgentLimits:
    """What one agent may use; None is no limit. Plain data: a job carries it to any node."""

    tokens: int | None = None
    usd: float | None = None
    #: Model turns; the agent's own, never drawn on by the agents under it.
    turns: int | None = None

    @property
    def bounds_spending(self) -> bool:
        """Whether it limits tokens or dollars (turns are counted by the loop, not here)."""
        return self.tokens is not None or self.usd is not None

    def over(self, defaults: AgentLimits) -> AgentLimits:
        """These limits, each one not given taken from ``defaults``."""
        return AgentLimits(
            self.tokens if self.tokens is not None else defaults.tokens,
            self.usd if self.usd is not None else defaults.usd,
            self.turns if self.turns is not None else defaults.turns,
        )

    def describe(self) -> str:
        """``20,000 tokens, $0.50, 10 turns``; ``no limits`` when none is set."""
        parts = []
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        if self.usd is not None:
            parts.append(f"${self.usd:.2f}")
        if self.turns is not None:
            parts.append(f"{self.turns} turns")
        return ", ".join(parts) or "no limits"


@dataclass(frozen=True)
class Hold:
    """What one request reserved, on every allowance of its chain."""

    levels: tuple[Allowance, ...]
    tokens: int
    usd: float
    #: The output the request may ask for (at most what was asked: ``max_tokens``).
    output_tokens: int
    #: True when the budget left less output than was asked for.
    cut: bool = False

    def settle(self, tokens: int, usd: float) -> None:
        """Replace this reservation with what its request really used (0 if it failed)."""
        for level in self.levels:
            level.reserved_tokens -= self.tokens
            level.reserved_usd -= self.usd
            level.spent_tokens += tokens
            level.spent_usd += usd
            level.in_flight -= 1
            if not level.in_flight:
                level.reserved_usd = 0.0  # no rounding left over from the sums
            level._wake()


@dataclass(eq=False)
class Allowance:
    """A live budget: its limits, what was spent and is reserved now, and its parent's."""

    limits: AgentLimits = field(default_factory=AgentLimits)
    parent: Allowance | None = None
    #: Whom it belongs to (``worker 3.2``), as an exhausted budget is named; "" for a
    #: budget given to a whole run.
    name: str = ""
    spent_tokens: int = 0
    spent_usd: float = 0.0
    reserved_tokens: int = 0
    reserved_usd: float = 0.0
    #: Requests reserved here and not yet settled.
    in_flight: int = 0
    #: Its agent's last request was given less output than asked for.
    cut: bool = False
    #: Set when a request reserved here settles (made when someone waits for room).
    _settled: asyncio.Event | None = field(default=None, repr=False)

    def child(self, limits: AgentLimits, name: str = "") -> Allowance:
        """An allowance under this one: its own limits, each never more than this chain has
        left now (one it was not given stays unset: every request under it is reserved here
        too, so the chain bounds it anyway)."""
        tokens, usd = self.left()
        if limits.tokens is not None:
            limits = replace(limits, tokens=_least(limits.tokens, tokens))
        if limits.usd is not None:
            limits = replace(limits, usd=_least(limits.usd, usd))
        return Allowance(limits, self, name)

    def chain(self) -> Iterator[Allowance]:
        """This allowance and its ancestors, nearest first."""
        level: Allowance | None = self
        while level is not None:
            yield level
            level = level.parent

    @property
    def limited(self) -> bool:
        """Whether any level of the chain limits tokens or dollars (if none does, there is
        nothing to reserve)."""
        return any(level.limits.bounds_spending for level in self.chain())

    def left(self) -> tuple[int | None, float | None]:
        """Tokens and dollars the whole chain leaves room for (None: unlimited)."""
        tokens: int | None = None
        usd: float | None = None
        for level in self.chain():
            tokens = _least(tokens, level.tokens_left)
            usd = _least(usd, level.usd_left)
        return tokens, usd

    @property
    def tokens_left(self) -> int | None:
        if self.limits.tokens is None:
            return None
        return max(0, self.limits.tokens - self.spent_tokens - self.reserved_tokens)

    @property
    def usd_left(self) -> float | None:
        if self.limits.usd is None:
            return None
        return max(0.0, self.limits.usd - self.spent_usd - self.reserved_usd)

    async def reserve(
        self,
        input_tokens: int,
        output_tokens: int,
        price: ModelPrice | None = None,
        *,
        hour_writes: bool = False,
        searches: int = 0,
    ) -> Hold:
        """Reserve a request of ``input_tokens`` (estimated high) and up to ``output_tokens``
        on every level, or raise :class:`AllowanceSpent`.

        Where a level lacks room while other requests under it are in flight, this waits
        for one of them to settle (they may give room back) and looks again; where nothing
        is in flight, the output is cut to the room there is, and under
        :data:`MIN_OUTPUT` the budget is spent. ``searches``: the most web searches the
        request may make, each billed."""
        while True:
            taken = self._try(input_tokens, output_tokens, price, hour_writes, searches)
            if isinstance(taken, Hold):
                return taken
            await taken.settled()

    def _try(
        self,
        input_tokens: int,
        output_tokens: int,
        price: ModelPrice | None,
        hour_writes: bool,
        searches: int = 0,
    ) -> Hold | Allowance:
        """The hold, or the level to wait on: checked and reserved with no ``await`` between,
        so no other request can take the same room."""
        output = output_tokens
        floor = min(MIN_OUTPUT, output_tokens)
        for level in self.chain():
            for measure, room in level._rooms(input_tokens, price, hour_writes, searches).items():
                if room >= output:
                    continue
                if level.in_flight:
                    return level
                if room < floor:
                    raise level._spent(self, measure)
                output = room
        usd = (
            price.worst_case(input_tokens, output, hour_writes=hour_writes)
            + price.searches(searches)
            if price
            else 0.0
        )
        hold = Hold(tuple(self.chain()), input_tokens + output, usd, output, output < output_tokens)
        for level in hold.levels:
            level.reserved_tokens += hold.tokens
            level.reserved_usd += hold.usd
            level.in_flight += 1
        self.cut = hold.cut
        return hold

    async def settled(self) -> None:
        """Wait until a request reserved here settles."""
        if self._settled is None:
            self._settled = asyncio.Event()
        await self._settled.wait()

    def _wake(self) -> None:
        """A request settled: whoever waits for room here looks again."""
        if self._settled is not None:
            self._settled.set()
            self._settled = None

    def _rooms(
        self, input_tokens: int, price: ModelPrice | None, hour_writes: bool, searches: int = 0
    ) -> dict[str, int]:
        """The most output this level can pay for after the input (and the searches), by
        what it limits."""
        rooms: dict[str, int] = {}
        if self.tokens_left is not None:
            rooms["tokens"] = self.tokens_left - input_tokens
        usd_left = self.usd_left
        if usd_left is not None and price is not None and price.output > 0:
            input_cost = price.worst_case(input_tokens, 0, hour_writes=hour_writes)
            input_cost += price.searches(searches)
            # a token under the exact figure, so the worst case never rounds past the limit
            rooms["usd"] = math.floor((usd_left - input_cost) * 1_000_000 / price.output) - 1
        return rooms

    def _spent(self, running: Allowance, measure: str) -> AllowanceSpent:
        """The error for this level's ``measure`` (tokens or usd), as ``running`` meets it."""
        if measure == "tokens":
            used = self.spent_tokens + self.reserved_tokens
            size, spent = f"{self.limits.tokens:,} tokens", f"{used:,} used"
        else:
            used_usd = self.spent_usd + self.reserved_usd
            size, spent = f"${self.limits.usd:.2f}", f"${used_usd:.2f} used"
        whose = "its budget" if self is running else _subtree(self.name)
        reason = f"{whose} of {size} was spent ({spent})"
        who = running.name or "the agent"
        return AllowanceSpent(f"{who}: {reason}; its next model request was not sent", reason)


def _least(a: T | None, b: T | None) -> T | None:
    """The smaller of two limits, None being no limit."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _subtree(name: str) -> str:
    return f"the budget of its subtree (under {name})" if name else "the budget of its subtree"


#: The running agent's allowance; None where no agent's budget applies.
ALLOWANCE: ContextVar[Allowance | None] = ContextVar("orchmode_allowance", default=None)


@contextmanager
def running(allowance: Allowance | None) -> Iterator[Allowance | None]:
    """Make ``allowance`` the running agent's for the block (and the tasks started in it)."""
    token = ALLOWANCE.set(allowance)
    try:
        yield allowance
    finally:
        ALLOWANCE.reset(token)


def allowance_for(limits: AgentLimits | None, name: str) -> Allowance:
    """An agent's allowance, about to run: under the running agent's when there is one (a
    nested fan-out), else a root of its own."""
    limits = limits or AgentLimits()
    parent = ALLOWANCE.get()
    if parent is not None:
        return parent.child(limits, name)
    return Allowance(limits, name=name)


def agent_limits(settings: Settings, given: AgentLimits | None = None) -> AgentLimits:
    """A subagent's budget: what its subtask gave (``given``), and for what it did not,
    ``agent_max_tokens``, ``agent_max_cost`` and ``subagent_turns``."""
    defaults = AgentLimits(
        settings.agent_max_tokens, settings.agent_max_cost, settings.subagent_turns
    )
    return (given or AgentLimits()).over(defaults)


def allowance_here(limits: AgentLimits | None, name: str) -> Allowance:
    """The allowance of the agent about to run here: the one its fan-out set, or where that
    does not reach (a cluster's node) one of its own limits alone."""
    return ALLOWANCE.get() or Allowance(limits or AgentLimits(), name=name)
