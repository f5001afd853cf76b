"""Which worker made each nested Workflow call, and what a worker's whole subtree cost.

A nested call's ``FanoutStarted`` names its maker as ``"3.2"`` (worker 2 of call 3); calls
are numbered across the session, so a call number names one call. Every view that draws
the tree of agents, and every roll-up of its costs, asks this one structure, so the live
lines, ``show``, the report and the traces agree on who sits under whom.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
