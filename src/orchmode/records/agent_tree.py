"""Which worker made each nested Workflow call, and what a worker's whole subtree cost.

A nested call's ``FanoutStarted`` names its maker as ``"3.2"`` (worker 2 of call 3); calls
are numbered across the session, so a call number names one call. The plain lines, the
live view, ``show`` and the report all read the tree and its costs from here, so they agree
on who sits under whom and on what a subtree cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.events import Event, FanoutStarted, ModelRequestDone, ScriptStarted, SubagentDone

#: A worker as ``(call, index)``: the maker of the calls nested under it.
AgentKey = tuple[int, int]


def parent_key(parent: str) -> AgentKey | None:
    """``"3.2"`` as ``(3, 2)``; the main agent's ``""`` (or an unreadable mark) is None."""
    call, dot, index = parent.partition(".")
    if not dot or not call.isdigit() or not index.isdigit():
        return None
    return int(call), int(index)


@dataclass
class CallTree:
    """The calls each worker made, learnt from ``FanoutStarted.parent`` in any order."""

    _maker: dict[int, AgentKey] = field(default_factory=dict)
    _made: dict[AgentKey, list[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self._maker)

    def link(self, call: int, parent: str) -> None:
        """Note that ``parent`` made ``call``. A call started again (a resume) keeps its
        first link, and a link that would make a call its own ancestor is left out (only a
        damaged record can say so): the call is then drawn at the top level."""
        maker = parent_key(parent)
        if maker is None or call in self._maker or call in self._ancestry(maker[0]):
            return
        self._maker[call] = maker
        self._made.setdefault(maker, []).append(call)
        self._made[maker].sort()

    def maker(self, call: int) -> AgentKey | None:
        """The worker that made ``call``; None for the main agent's calls."""
        return self._maker.get(call)

    def calls_by(self, worker: AgentKey) -> list[int]:
        """The calls ``worker`` made itself, in their order."""
        return list(self._made.get(worker, ()))

    def below(self, worker: AgentKey) -> list[int]:
        """Every call in ``worker``'s subtree, each before the calls nested in it."""
        found: list[int] = []
        waiting = self.calls_by(worker)
        while waiting:
            call = waiting.pop(0)
            found.append(call)
            waiting.extend(sorted(c for c, maker in self._maker.items() if maker[0] == call))
        return found

    def path(self, call: int) -> str:
        """Where ``call`` sits: ``worker 1.1 › worker 2.2 › `` for a call worker 2.2 made
        (itself made by worker 1.1); "" for the main agent's."""
        makers = []
        while (maker := self._maker.get(call)) is not None:
            makers.append(maker)
            call = maker[0]
        return "".join(f"worker {c}.{i} › " for c, i in reversed(makers))

    def depth(self, call: int) -> int:
        """1 for the main agent's calls, 2 for the calls their workers made, and so on."""
        return len(self._ancestry(call))

    def subtree_cost(self, worker: AgentKey, own: float, call_costs: Mapping[int, float]) -> float:
        """``own`` plus what every agent of every call below ``worker`` spent.

        ``call_costs`` is what each call's own agents spent (workers, verifiers, resolvers),
        each without its descendants, so nothing is counted twice."""
        return own + sum(call_costs.get(call, 0.0) for call in self.below(worker))

    def _ancestry(self, call: int) -> list[int]:
        """``call`` and the calls above it, nearest first."""
        chain = [call]
        while (maker := self._maker.get(chain[-1])) is not None:
            chain.append(maker[0])
        return chain


@dataclass
class CostRollUp:
    """What each call's agents have spent so far, followed from events as a run sends them.

    A running agent counts what its requests cost; once ended, what its end records. The
    live views ask it for a subtree's cost while the tree is still growing."""

    tree: CallTree = field(default_factory=CallTree)
    #: each call's ended agents' costs, summed
    _ended: dict[int, float] = field(default_factory=dict)
    #: each running agent's requests' costs so far, by its name (``worker 7.1``)
    _running: dict[str, float] = field(default_factory=dict)

    def follow(self, event: Event) -> None:
        match event:
            case FanoutStarted(call=call, parent=parent) | ScriptStarted(call=call, parent=parent):
                self.tree.link(call, parent)
            case ModelRequestDone(agent=name, cost=cost):
                self._running[name] = self._running.get(name, 0.0) + cost
            case SubagentDone(call=call, index=index, role=role, cost=cost):
                self._running.pop(f"{role} {call}.{index}", None)
                self._ended[call] = self._ended.get(call, 0.0) + cost

    def subtree_cost(self, worker: AgentKey, own: float) -> float:
        """``own`` plus what every agent below ``worker`` has spent so far."""
        costs = dict(self._ended)
        for name, cost in self._running.items():
            call = _call_of(name)
            if call is not None:
                costs[call] = costs.get(call, 0.0) + cost
        return self.tree.subtree_cost(worker, own, costs)


def _call_of(name: str) -> int | None:
    """The call of a subagent named like ``worker 7.1``; None for the main agent."""
    place = name.rpartition(" ")[2]
    key = parent_key(place)
    return key[0] if key is not None and " " in name else None
