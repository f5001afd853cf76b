"""Recorded event rows read back into typed events, skipping any row that cannot be understood.

Every reader of a run (its history, ``orchmode budget``, a resumed session's totals) starts
from these rows. A row that cannot be understood (bad JSON, an unknown kind, a missing or
mistyped field) gives None, never an error: an older or newer orchmode may have written it,
and one bad row must not hide the rest of a run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core.events import (
    BashDone,
    BashStarted,
    BudgetStatus,
    ChangeSettled,
    ContextCompacted,
    Event,
    FanoutDone,
    FanoutStarted,
    McpCallDone,
    ModelRequestDone,
    ResultCondensed,
    Role,
    ScriptDone,
    ScriptStarted,
    SubagentDone,
    SubagentStarted,
    TokenUsage,
    TurnDone,
    TurnStarted,
    WorkspacesChosen,
)
from ..store import EventRow
from .totals import SessionTotals


class _Bad(Exception):
    """A row field is missing or has the wrong type."""


_REQUIRED: Any = object()


def _value(data: Mapping[str, Any], key: str, default: Any) -> Any:
    value = data.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _Bad(key)
        return default
    return value


def _int(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> int:
    value = _value(data, key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(key)
    return value


def _float(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> float:
    value = _value(data, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad(key)
    return float(value)


def _str(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> str:
    value = _value(data, key, default)
    if not isinstance(value, str):
        raise _Bad(key)
    return value


def _optional_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise _Bad(key)
    return value


def _bool(data: Mapping[str, Any], key: str) -> bool:
    value = _value(data, key, False)
    if not isinstance(value, bool):
        raise _Bad(key)
    return value


def _usage(data: Mapping[str, Any], key: str, default: Any = _REQUIRED) -> TokenUsage:
    value = _value(data, key, default)
    if isinstance(value, TokenUsage):
        return value
    if not isinstance(value, dict):
        raise _Bad(key)
    return TokenUsage(
        input_tokens=_int(value, "input_tokens", 0),
        output_tokens=_int(value, "output_tokens", 0),
        cache_read_tokens=_int(value, "cache_read_tokens", 0),
        cache_write_tokens=_int(value, "cache_write_tokens", 0),
    )


def _role(data: Mapping[str, Any]) -> Role:
    value = data.get("role")
    if value == "worker":
        return "worker"
    if value == "verifier":
        return "verifier"
    if value == "resolver":
        return "resolver"
    raise _Bad("role")


def _notices(data: Mapping[str, Any]) -> tuple[str, ...]:
    value = _value(data, "notices", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Bad("notices")
    return tuple(value)


_PARSERS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    "TurnStarted": lambda d: TurnStarted(text=_str(d, "text"), notices=_notices(d)),
    "TurnDone": lambda d: TurnDone(stop=_str(d, "stop"), model_calls=_int(d, "model_calls", 0)),
    "ModelRequestDone": lambda d: ModelRequestDone(
        agent=_str(d, "agent"),
        message_id=_str(d, "message_id", ""),
        stop_reason=_optional_str(d, "stop_reason"),
        usage=_usage(d, "usage"),
        duration=_float(d, "duration", 0.0),
        cost=_float(d, "cost", 0.0),
        cache_miss=_optional_str(d, "cache_miss"),
        cache_missed_tokens=_int(d, "cache_missed_tokens", 0),
    ),
    "BudgetStatus": lambda d: BudgetStatus(
        line=_str(d, "line"), subagents_left=_int(d, "subagents_left", 0)
    ),
    "BashStarted": lambda d: BashStarted(agent=_str(d, "agent"), command=_str(d, "command")),
    "BashDone": lambda d: BashDone(
        agent=_str(d, "agent"),
        command=_str(d, "command"),
        exit_code=None if d.get("exit_code") is None else _int(d, "exit_code"),
        timed_out=_bool(d, "timed_out"),
        duration=_float(d, "duration", 0.0),
        sandbox=_str(d, "sandbox", ""),
    ),
    "McpCallDone": lambda d: McpCallDone(
        agent=_str(d, "agent"),
        server=_str(d, "server"),
        tool=_str(d, "tool"),
        duration=_float(d, "duration", 0.0),
        ok=_bool(d, "ok"),
        error=_str(d, "error", ""),
    ),
    "FanoutStarted": lambda d: FanoutStarted(
        call=_int(d, "call"), subtasks=_int(d, "subtasks", 0), not_run=_int(d, "not_run", 0)
    ),
    "FanoutDone": lambda d: FanoutDone(call=_int(d, "call"), duration=_float(d, "duration", 0.0)),
    "ScriptStarted": lambda d: ScriptStarted(call=_int(d, "call"), lines=_int(d, "lines", 0)),
    "ScriptDone": lambda d: ScriptDone(
        call=_int(d, "call"),
        duration=_float(d, "duration", 0.0),
        agents=_int(d, "agents", 0),
        error=_optional_str(d, "error"),
    ),
    "SubagentStarted": lambda d: SubagentStarted(
        call=_int(d, "call"),
        index=_int(d, "index"),
        role=_role(d),
        title=_str(d, "title", ""),
        prompt=_str(d, "prompt", ""),
        node=_str(d, "node", ""),
    ),
    "SubagentDone": lambda d: SubagentDone(
        call=_int(d, "call"),
        index=_int(d, "index"),
        role=_role(d),
        status=_str(d, "status"),
        turns=_int(d, "turns", 0),
        usage=_usage(d, "usage", TokenUsage()),
        duration=_float(d, "duration", 0.0),
        from_journal=_bool(d, "from_journal"),
        verdict=_optional_str(d, "verdict"),
        result=_str(d, "result", ""),
        cost=_float(d, "cost", 0.0),
        node=_str(d, "node", ""),
        report_path=_str(d, "report_path", ""),  # absent in records older than result files
    ),
    "ContextCompacted": lambda d: ContextCompacted(
        agent=_str(d, "agent"),
        how=_str(d, "how"),
        tokens_before=_int(d, "tokens_before", 0),
        tokens_after=_int(d, "tokens_after", 0),
        detail=_str(d, "detail", ""),
        refused=_bool(d, "refused"),
    ),
    "ResultCondensed": lambda d: ResultCondensed(
        call=_int(d, "call"),
        tokens_full=_int(d, "tokens_full", 0),
        tokens_shown=_int(d, "tokens_shown", 0),
        budget=_int(d, "budget", 0),
        omitted=_str(d, "omitted", ""),
        path=_str(d, "path", ""),
    ),
    "ChangeSettled": lambda d: ChangeSettled(
        call=_int(d, "call"),
        index=_int(d, "index"),
        fate=_str(d, "fate"),
        files=_str(d, "files", ""),
        added=_int(d, "added", 0),
        removed=_int(d, "removed", 0),
        detail=_str(d, "detail", ""),
        path=_str(d, "path", ""),
    ),
    "WorkspacesChosen": lambda d: WorkspacesChosen(
        overlays=_bool(d, "overlays"), reason=_str(d, "reason", "")
    ),
}


def parse_row(row: EventRow) -> Event | None:
    """The event a recorded row holds, or None if the row cannot be understood."""
    parse = _PARSERS.get(row.kind)
    at = row.at
    if parse is None or isinstance(at, bool) or not isinstance(at, int | float):
        return None
    if not math.isfinite(at):
        return None
    try:
        data = json.loads(row.data)
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return parse(data)
    except (_Bad, ValueError, TypeError):
        return None


def session_totals(rows: Iterable[EventRow]) -> SessionTotals:
    """A session's totals rebuilt from its records (rows that cannot be read are skipped)."""
    totals = SessionTotals()
    for row in rows:
        event = parse_row(row)
        if event is not None:
            totals(event)
    return totals
