"""The Monty sandbox a script runs in: what it may import, its limits, a clock that stands still.

A rerun asks the same questions only if the program is deterministic, so it is given
nothing that varies: ``random`` is seeded from the program's own text, the clock is frozen,
sleeps return at once, and there is nothing else to read.
"""

from __future__ import annotations

import ast
import hashlib
from datetime import UTC, datetime

from pydantic_monty import (
    AsyncFunctionSnapshot,
    MontyRuntimeError,
    MontySyntaxError,
    OSPolicy,
    ResourceLimits,
)

from ..core.settings import Settings

#: Modules a script may import: pure computation inside the sandbox, nothing that reaches out.
ALLOWED_MODULES = frozenset(
    {
        "bisect",
        "collections",
        "copy",
        "dataclasses",
        "decimal",
        "functools",
        "itertools",
        "json",
        "math",
        "random",
        "re",
        "typing",
    }
)
#: Host calls a script may make in all (each log line is one): a guard against a chatty loop.
HOST_CALL_LIMIT = 10_000
#: What the sandbox's clock always says, so a rerun sees the same time.
FROZEN_CLOCK = datetime(2000, 1, 1, tzinfo=UTC)
#: Seconds the pool waits past a script's compute limit before it kills a stuck worker.
WORKER_GRACE = 10.0
NO_ACCESS = "Workflow scripts have no file, network, environment or OS access"


class ScriptError(Exception):
    """Why a script stopped, worded for the model, with the line it stopped at when known."""

    def __init__(self, message: str, line: int | None = None, trace: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.trace = trace


def sandbox_rules(settings: Settings, source: str) -> tuple[ResourceLimits, OSPolicy]:
    """The resource limits a script runs under, and what its OS calls see."""
    limits: ResourceLimits = {
        "max_feed_duration_secs": settings.script_cpu_seconds,
        "max_memory": settings.script_memory_mb * 1024 * 1024,
        "max_recursion_depth": settings.script_recursion_limit,
        "max_suspensions": HOST_CALL_LIMIT,
    }
    policy: OSPolicy = {
        "random_start": {"seed": script_seed(source)},
        "datetime": FROZEN_CLOCK,
        "timezone": "utc",
        "sleep": "zero",
        "process_time": "zero",
    }
    return limits, policy


def check_imports(source: str) -> ScriptError | None:
    """The first import of a module outside :data:`ALLOWED_MODULES`, as an error.

    Monty has ``os``, ``pathlib`` and friends built in and would import them quietly (their
    calls are refused at run time anyway); refusing the import up front, wherever it is in
    the program, gives the model one clear message. Source that Python cannot parse is left
    to Monty, which reports the syntax error with its line.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ALLOWED_MODULES:
                return ScriptError(
                    f"the script may not import {name!r} — {NO_ACCESS}; it may import only "
                    f"{', '.join(sorted(ALLOWED_MODULES))}",
                    node.lineno,
                )
    return None


def script_seed(source: str) -> int:
    """The seed of the script's ``random``: the same program draws the same numbers."""
    return int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")


def monty_failure(
    what: str,
    exc: MontySyntaxError | MontyRuntimeError,
    cpu_seconds: float,
    last_line: int | None,
) -> ScriptError:
    """A Monty error, with its line (the innermost frame) and a short trace; ``last_line``
    (the last host call's) places an error Monty reports without a frame."""
    display = exc.display("msg" if isinstance(exc, MontySyntaxError) else "type-msg")
    lines = [frame.line for frame in exc.traceback()]
    if "cannot suspend in this synchronous context" in display:
        display += (
            " — a host function cannot be handed to map(), sorted() and the like; call it "
            "in a loop or a comprehension, or use parallel()"
        )
    if "suspension limit" in display:
        display += (
            f" — a script may make at most {HOST_CALL_LIMIT} host calls (agent, parallel, "
            "verify, budget and log calls all count)"
        )
    if not lines:
        # Monty stops a time limit from outside the running code, so there is no frame.
        if "time limit" in display:
            display += (
                f" — the script used up its {cpu_seconds:g} s of computing (script_cpu_seconds), "
                "time waiting on agents not counted; is there a loop that never ends?"
            )
        return ScriptError(f"{what}: {display}", None, _last_call_note(last_line))
    trace = ""
    if len(lines) > 1:
        shown = [str(n) for n in lines[:3]]
        if len(lines) > 6:
            shown.append(f"… {len(lines) - 6} more …")
        shown += [str(n) for n in lines[max(3, len(lines) - 3) :]]
        trace = f"(called through lines {' → '.join(shown)})"
    return ScriptError(f"{what}: {display}", lines[-1], trace)


def _last_call_note(last_line: int | None) -> str:
    if last_line is None:
        return "(no line number: it had made no host call yet)"
    return (
        f"(no line number: Monty reports none for this; the last host call was at line {last_line})"
    )


def refusal(snapshot: AsyncFunctionSnapshot) -> Exception:
    """The exception an OS call gets inside the sandbox: all of them are refused."""
    if snapshot.function_name == "import":
        module = snapshot.args[0] if snapshot.args else "?"
        return ImportError(f"no module named {module!r} can be imported: {NO_ACCESS}")
    return PermissionError(f"{snapshot.function_name} is not allowed: {NO_ACCESS}")
