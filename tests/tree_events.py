"""Event sequences of nested runs, in any order a run can send them, for the tree views' tests.

A planned tree of Workflow calls (each worker may make calls of its own) is played out one
event at a time; at each step any event the run could send next may come: a nested call
starts only while the worker that makes it runs, a worker ends only after its calls, a
verifier starts only after its worker. Each agent asks the model once, then ends.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchmode.core.events import (
    Event,
    FanoutDone,
    FanoutStarted,
    ModelRequestDone,
    Role,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
)

USAGE = TokenUsage(100, 20, 0, 0)


@dataclass
class PlannedCall:
    """A Workflow call: its maker (``"3.2"``, or "" for the main agent), depth and workers."""

    call: int
    parent: str
    depth: int
    workers: int
    #: what each agent costs, by (index, role)
    costs: dict[tuple[int, Role], float] = field(default_factory=dict)


def plan_tree(shape: Sequence[Sequence[int]]) -> list[PlannedCall]:
    """Calls from a shape: ``shape[n]`` lists, for the ``n``-th call made, how many workers it
    has; its workers make calls in turn, depth first, while shape lasts. Costs are distinct
    powers of two in cents, so any wrong sum is a different sum."""
    calls: list[PlannedCall] = []
    cost = iter(2.0**n / 100 for n in range(1000))

    def make(parent: str, depth: int, todo: list[Sequence[int]]) -> None:
        spec = todo.pop(0)
        call = PlannedCall(len(calls) + 1, parent, depth, max(1, spec[0]))
        calls.append(call)
        for index in range(1, call.workers + 1):
            call.costs[(index, "worker")] = next(cost)
            call.costs[(index, "verifier")] = next(cost)
        for index, made in zip(range(1, call.workers + 1), spec[1:], strict=False):
            for _ in range(made):
                if todo and depth < 3:
                    make(f"{call.call}.{index}", depth + 1, todo)

    todo = list(shape)
    while todo:
        make("", 1, todo)
    return calls


def play(calls: Sequence[PlannedCall], choose: Callable[[list[Event]], Event]) -> list[Event]:
    """A turn that runs ``calls``, every next event picked by ``choose`` among those possible."""
    started: set[int] = set()
    done_calls: set[int] = set()
    agents: dict[tuple[int, int, Role], str] = {}  # "" started, "asked", "done"
    events: list[Event] = [TurnStarted("fan out", ())]

    def possible() -> list[Event]:
        out: list[Event] = []
        for planned in calls:
            c = planned.call
            maker = tuple(int(n) for n in planned.parent.split(".")) if planned.parent else None
            if c not in started:
                if maker is None or agents.get((*maker, "worker")) in ("", "asked"):
                    out.append(FanoutStarted(c, planned.workers, 0, planned.parent, planned.depth))
                continue
            if c in done_calls:
                continue
            mine = [k for k in agents if k[0] == c]
            if len(mine) == 2 * planned.workers and all(agents[k] == "done" for k in mine):
                out.append(FanoutDone(c, 1.0))
            for (index, role), cost in planned.costs.items():
                key = (c, index, role)
                state = agents.get(key)
                if state is None and (
                    role == "worker" or agents.get((c, index, "worker")) == "done"
                ):
                    out.append(SubagentStarted(c, index, role, f"{role} {c}.{index}"))
                elif state == "":
                    out.append(
                        ModelRequestDone(f"{role} {c}.{index}", "msg", "end_turn", USAGE, 1.0, cost)
                    )
                elif state == "asked" and not _open_children(calls, c, index, done_calls):
                    out.append(SubagentDone(c, index, role, "finished", 1, USAGE, 1.0, cost=cost))
        return out

    while options := possible():
        event = choose(options)
        events.append(event)
        match event:
            case FanoutStarted(call=c):
                started.add(c)
            case FanoutDone(call=c):
                done_calls.add(c)
            case SubagentStarted(call=c, index=i, role=role):
                agents[(c, i, role)] = ""
            case ModelRequestDone(agent=name):
                role, _, place = name.partition(" ")
                c, _, i = place.partition(".")
                agents[(int(c), int(i), role)] = "asked"  # type: ignore[index]
            case SubagentDone(call=c, index=i, role=role):
                agents[(c, i, role)] = "done"
    events.append(TurnDone("end_turn", 1))
    return events


def _open_children(calls: Sequence[PlannedCall], call: int, index: int, done: set[int]) -> bool:
    """Whether worker ``call.index`` still waits on a call it makes (or has yet to make)."""
    return any(p.parent == f"{call}.{index}" and p.call not in done for p in calls)


def in_order(options: list[Event]) -> Event:
    """The first possible event: a run that does one thing at a time."""
    return options[0]


def shuffled(seed: int) -> Callable[[list[Event]], Event]:
    rng = random.Random(seed)
    return lambda options: rng.choice(options)


def subtree_cost(
    calls: Sequence[PlannedCall], call: int, index: int, spent: Callable[[int, int, Role], bool]
) -> float:
    """Worker ``call.index``'s own cost and every agent's below it, counting those that
    ``spent`` says have paid for their request: the sum a roll-up must give."""
    total = calls[call - 1].costs[(index, "worker")] if spent(call, index, "worker") else 0.0
    for planned in calls:
        if planned.parent == f"{call}.{index}":
            for (i, role), cost in planned.costs.items():
                if role == "worker":
                    total += subtree_cost(calls, planned.call, i, spent)
                elif spent(planned.call, i, role):
                    total += cost
    return total
