"""The host functions a script calls: their signatures, how arguments bind, what they return."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, NotRequired, TypedDict

from ..core.agents import AgentDefinition
from ..core.results import AgentResult
from ..core.wire import JsonRecord
from .plans import Subtask, subtask_object

#: The host functions by name, with their parameters (``log`` takes any number of values).
PARAMETERS: dict[str, tuple[str, ...]] = {
    "agent": ("prompt", "isolation"),
    "parallel": ("prompts", "isolation"),
    "verify": ("prompt", "result"),
    "budget": (),
}
#: Parameters taken by keyword only, after the positional ones: a schema or an agent's name
#: passed by position, as in a script written before they existed, is still a TypeError.
KEYWORD_ONLY: dict[str, tuple[str, ...]] = {
    "agent": ("agent", "schema", "budget"),
    "parallel": ("agent", "schema", "budget"),
}
#: Parameters that may be left out, and what they are then.
DEFAULTS: dict[str, dict[str, object]] = {
    "agent": {"agent": None, "schema": None, "budget": None, "isolation": None},
    "parallel": {"agent": None, "schema": None, "budget": None, "isolation": None},
}


class AgentLimit(RuntimeError):
    """Raised inside the script when it asks for more agents than ``script_max_agents``."""


def plain(value: object) -> Any:
    """``value`` as JSON-ready data: sandbox tuples, sets, bytes and objects included."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(plain(k)): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    attributes = getattr(value, "attributes", None)  # a sandbox object, as a MontyClassProxy
    if isinstance(attributes, dict):
        return plain(attributes)
    return repr(value)


class BudgetAnswer(TypedDict):
    """What ``budget()`` returns: what the session has used and has left."""

    subagents_launched: int
    subagents_left: int
    tokens_used: int
    cost_used: float
    script_agents_started: int
    script_agents_left: int
    tokens_left: NotRequired[int]
    cost_left: NotRequired[float]


def agent_answer(result: AgentResult) -> JsonRecord:
    """What ``agent()`` returns: the report as a dict, or an error dict."""
    if not result.finished:
        return {"error": result.text, "status": result.status.value}
    try:
        decoded = json.loads(result.text)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        return decoded
    return {"summary": result.text, "findings": []}  # it answered in text, not a report


def _stand_in_for(name: str) -> Callable[..., None]:
    """A stand-in the sandbox can hold when it names a host function without calling it."""

    def stand_in(*_args: object, **_kwargs: object) -> None:  # never called: calls suspend
        raise AssertionError("host functions are answered by the script runner")

    stand_in.__name__ = stand_in.__qualname__ = name
    return stand_in


STAND_INS = {name: _stand_in_for(name) for name in (*PARAMETERS, "log")}


def bind(
    name: str,
    parameters: tuple[str, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, object],
    keyword_only: tuple[str, ...] = (),
) -> list[Any]:
    """Arguments in parameter order, the keyword-only ones last, raising the TypeError
    Python would for a bad call."""
    if len(args) > len(parameters):
        raise TypeError(
            f"{name}() takes {len(parameters)} arguments ({len(args)} given): "
            f"{name}({', '.join(parameters)})"
        )
    values = {**DEFAULTS.get(name, {}), **dict(zip(parameters, args, strict=False))}
    given = set(parameters[: len(args)])
    for key, value in kwargs.items():
        if key not in (*parameters, *keyword_only) or key in given:
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
        values[key] = value
    missing = [p for p in (*parameters, *keyword_only) if p not in values]
    if missing:
        raise TypeError(f"{name}() is missing its argument {missing[0]!r}")
    return [values[p] for p in (*parameters, *keyword_only)]


def prompt_of(function: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{function}() takes prompts as strings, not {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{function}() was given an empty prompt")
    return value.strip()


def typed_subtask(
    function: str,
    value: object,
    agent: object,
    schema: object,
    roles: Mapping[str, AgentDefinition],
    budget: object = None,
) -> Subtask:
    """A subtask from a string or a ``{"prompt", "agent", "schema", "budget"}`` object;
    ``agent``, ``schema`` and ``budget`` are the call's own, which an object's keys override."""
    if isinstance(value, dict):
        item = {"agent": agent, "schema": schema, "budget": plain(budget), **plain(value)}
        taken = subtask_object({k: v for k, v in item.items() if v is not None}, roles)
        if isinstance(taken, str):
            raise ValueError(f"{function}: {taken}")
        return taken
    if not isinstance(value, str):
        raise TypeError(
            f"{function} takes a prompt as a string or a {{prompt, schema}} object, "
            f"not {type(value).__name__}"
        )
    if not value.strip():
        raise ValueError(f"{function} was given an empty prompt")
    prompt = value.strip()
    item = {"prompt": prompt, "agent": agent, "schema": plain(schema), "budget": plain(budget)}
    taken = subtask_object(item, roles)
    if isinstance(taken, str):
        raise ValueError(f"{function}: {taken}")
    return taken
