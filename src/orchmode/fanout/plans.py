"""What a Workflow call asks for, read from the model's input: form, subtasks, isolation.

And how a verifier's verdict is read back from its result. Pure functions, no I/O, so the
hypothesis tests can throw any input at them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.agents import AgentDefinition
from ..core.results import summary_of
from ..core.schemas import check_schema
from ..core.wire import JsonSchema, ToolInput
from ..model.allowance import AgentLimits

#: The keys an object subtask may have.
SUBTASK_KEYS = ("prompt", "agent", "schema", "budget")
#: The keys of a subtask's budget, and what each must be.
BUDGET_KEYS = {"tokens": "a whole number", "usd": "a number of dollars", "turns": "a whole number"}


def normalise_subtasks(raw: object) -> list[str]:
    """Subtask prompts from whatever shape the model sent, as non-empty trimmed strings.

    Accepts a list, a JSON-encoded list in one string, a newline-separated string or a
    single string. A list item that is not a string is kept as its JSON text rather than
    silently dropped.
    """
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                decoded = json.loads(text)
            except ValueError:
                decoded = None
            if isinstance(decoded, list):
                return normalise_subtasks(decoded)
        return [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(raw, list | tuple):
        items = (
            item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
            for item in raw
            if item is not None
        )
        return [item.strip() for item in items if item.strip()]
    return []


@dataclass(frozen=True)
class Subtask:
    """One subtask as an object gives it: its prompt, its result's schema, its role."""

    prompt: str
    schema: JsonSchema | None = None
    agent: AgentDefinition | None = None
    #: What its worker may spend and how many turns it may take (None: the settings').
    budget: AgentLimits | None = None


@dataclass(frozen=True)
class Plan:
    subtasks: list[str]
    not_run: int
    #: Each subtask's report schema (None: an untyped report), in the same order.
    schemas: list[JsonSchema | None] = field(default_factory=list)
    #: Each subtask's role (None: a plain worker), in the same order.
    agents: list[AgentDefinition | None] = field(default_factory=list)
    #: Each subtask's budget (None: the settings'), in the same order.
    budgets: list[AgentLimits | None] = field(default_factory=list)

    def schema_of(self, index: int) -> JsonSchema | None:
        """Subtask ``index``'s schema (0-based); None when it has none."""
        return self.schemas[index] if index < len(self.schemas) else None

    def agent_of(self, index: int) -> AgentDefinition | None:
        """Subtask ``index``'s role (0-based); None when it names none."""
        return self.agents[index] if index < len(self.agents) else None

    def budget_of(self, index: int) -> AgentLimits | None:
        """Subtask ``index``'s budget (0-based); None when it gives none."""
        return self.budgets[index] if index < len(self.budgets) else None

    @property
    def note(self) -> str:
        if not self.not_run:
            return ""
        first = len(self.subtasks) + 1
        last = len(self.subtasks) + self.not_run
        return (
            f"[orchmode: {len(self.subtasks) + self.not_run} subtasks were given but at most "
            f"{len(self.subtasks)} run per call; {self.not_run} were not run (numbers "
            f"{first}–{last}). Call Workflow again with them to run them.]"
        )


#: The two forms of a Workflow call; exactly one of them is given.
FORMS = ("subtasks", "script")


def workflow_form(tool_input: object) -> str:
    """``subtasks`` or ``script``, or an error message when not exactly one of them is given.

    A key whose value is null counts as absent: models sometimes send the unused one so.
    """
    if not isinstance(tool_input, dict):
        return "subtasks"  # plan_subtasks words the error
    given = [form for form in FORMS if tool_input.get(form) is not None]
    if len(given) == 1:
        return given[0]
    if given:
        return (
            "error: give Workflow either subtasks or a script, not both — "
            '{"subtasks": ["...", "..."]} for independent agents, {"script": "..."} for a '
            "program that sequences them"
        )
    return (
        'error: Workflow needs exactly one of {"subtasks": ["first subtask prompt", ...]} '
        'or {"script": "a short Python program"}'
    )


def isolation_of(tool_input: object, default: str) -> str | None:
    """The call's ``isolation`` (``worktree`` or ``shared``), ``default`` when not given,
    or None when it is given but is neither."""
    value = tool_input.get("isolation") if isinstance(tool_input, dict) else None
    if value is None:
        return default
    if isinstance(value, str) and value.strip().lower() in ("worktree", "shared"):
        return value.strip().lower()
    return None


BAD_ISOLATION = (
    'error: "isolation" must be "worktree" (each agent in its own copy of the tree) or '
    '"shared" (all agents in the one working directory)'
)


def plan_subtasks(
    tool_input: object, cap: int, roles: Mapping[str, AgentDefinition] | None = None
) -> Plan | str:
    """The subtasks to run, or an error message when there are none (or one is wrong);
    ``roles`` are the agent definitions an object subtask may name."""
    if not isinstance(tool_input, dict) or "subtasks" not in tool_input:
        return 'error: Workflow needs {"subtasks": ["first subtask prompt", ...]}'
    raw = _decoded(tool_input["subtasks"])
    if isinstance(raw, list | tuple) and any(isinstance(item, dict) for item in raw):
        return _plan_objects(raw, cap, roles or {})
    subtasks = normalise_subtasks(tool_input["subtasks"])
    if not subtasks:
        return (
            "error: no usable subtasks — pass a non-empty list of subtask prompts as "
            '{"subtasks": ["...", "..."]}'
        )
    return Plan(subtasks[:cap], max(0, len(subtasks) - cap))


def _decoded(raw: object) -> object:
    """A JSON-encoded list sent as one string, decoded; anything else as it is."""
    if isinstance(raw, str) and raw.strip().startswith("["):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _plan_objects(
    raw: list[Any] | tuple[Any, ...], cap: int, roles: Mapping[str, AgentDefinition]
) -> Plan | str:
    """A plan from a list holding object subtasks (strings may be mixed in), or the first
    error, naming the subtask's number: nothing runs when one subtask is wrong."""
    subtasks: list[Subtask] = []
    for number, item in enumerate((i for i in raw if i is not None), start=1):
        if not isinstance(item, dict):
            kept = normalise_subtasks([item])
            if kept:
                subtasks.append(Subtask(kept[0]))
            continue
        subtask = subtask_object(item, roles)
        if isinstance(subtask, str):
            return f"error: subtask {number}: {subtask}; nothing was run"
        subtasks.append(subtask)
    if not subtasks:
        return (
            "error: no usable subtasks — pass a non-empty list of subtask prompts as "
            '{"subtasks": ["...", "..."]}'
        )
    running = subtasks[:cap]
    return Plan(
        [s.prompt for s in running],
        max(0, len(subtasks) - cap),
        [s.schema for s in running],
        [s.agent for s in running],
        [s.budget for s in running],
    )


def subtask_object(
    item: ToolInput, roles: Mapping[str, AgentDefinition] | None = None
) -> Subtask | str:
    """An object subtask, or what is wrong with it: ``agent`` must name one of ``roles``."""
    extra = sorted(str(k) for k in item if k not in SUBTASK_KEYS)
    if extra:
        return (
            f"unknown key {', '.join(json.dumps(k) for k in extra)} — an object subtask "
            'takes "prompt" and optionally "agent", "schema" and "budget"'
        )
    prompt = item.get("prompt")
    if not isinstance(prompt, str):
        what = "missing" if prompt is None else f"a {type(prompt).__name__}, not a string"
        return f'"prompt" is {what}: give the subtask\'s prompt as a string'
    if not prompt.strip():
        return '"prompt" is empty'
    agent = item.get("agent")
    if agent is not None and not isinstance(agent, str):
        return (
            f'"agent" is a {type(agent).__name__}, not a string: it names an agent (a schema '
            'goes in "schema")'
        )
    role = None
    if agent is not None:
        role = (roles or {}).get(agent.strip())
        if role is None:
            return unknown_agent(agent, roles or {})
    budget = budget_of(item.get("budget"))
    if isinstance(budget, str):
        return budget
    schema = item.get("schema")
    if schema is None:
        return Subtask(prompt.strip(), None, role, budget)
    problem = check_schema(schema)
    if problem is not None:
        return f'"schema" is not usable: {problem}'
    return Subtask(prompt.strip(), schema, role, budget)


def budget_of(raw: object) -> AgentLimits | str | None:
    """A subtask's ``budget`` object as limits (None when not given), or what is wrong
    with it: every value a positive number, tokens and turns whole ones."""
    if raw is None:
        return None
    usage = '"budget" takes {"tokens": 20000, "usd": 0.5, "turns": 10}, any of them'
    if not isinstance(raw, dict) or not raw:
        return f"{usage}, not {json.dumps(raw, ensure_ascii=False, default=str)}"
    extra = sorted(str(k) for k in raw if k not in BUDGET_KEYS)
    if extra:
        return f'unknown key {", ".join(json.dumps(k) for k in extra)} in "budget": {usage}'
    values: dict[str, Any] = {}
    for key, what in BUDGET_KEYS.items():
        value = raw.get(key)
        if value is None:
            continue
        whole = key != "usd"
        number = isinstance(value, int) if whole else isinstance(value, int | float)
        if isinstance(value, bool) or not number or not 0 < value < math.inf:
            shown = json.dumps(value, ensure_ascii=False, default=str)
            return f'"budget" {key} must be {what} above 0, not {shown}'
        values[key] = value if whole else float(value)
    return AgentLimits(**values)


def unknown_agent(name: object, roles: Mapping[str, AgentDefinition]) -> str:
    """The error for an agent name no definition has, listing the names there are."""
    shown = json.dumps(name, ensure_ascii=False, default=str)
    if not roles:
        return (
            f"unknown agent {shown}: this session has no agent definitions (none were found "
            'in .claude/agents/, ~/.claude/agents/ or agents_dir) — leave out "agent"'
        )
    return f"unknown agent {shown} — known agents: {', '.join(sorted(roles))}"


def isolation_for(isolation: str, agent: AgentDefinition | None) -> str:
    """Where an agent works: its role's ``isolation`` over the call's. A role with no bash
    cannot touch the tree, so it needs no copy of it."""
    if agent is None:
        return isolation
    if agent.shell == "none":
        return "shared"
    return agent.isolation or isolation


def title(subtask: str, width: int = 120) -> str:
    line = subtask.strip().splitlines()[0] if subtask.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def verdict_of(result_text: str) -> str:
    """``confirmed``, ``refuted`` or ``unclear``, read from a verifier's result."""
    head = summary_of(result_text).strip().lower()
    for verdict in ("confirmed", "refuted"):
        if head.startswith(verdict):
            return verdict
    return "unclear"
