"""The console's Jinja2 templates, escaping everything they are given unless marked safe."""

from __future__ import annotations

import time
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from ..views.formatting import money, when

#: What an approval of each kind lets the agent do, as a verb.
_DOING = {"command": "run", "domain": "connect to", "mcp": "call"}


def _age(at: float) -> str:
    """How long ago, in the largest whole unit: ``42 s``, ``5 min``, ``3 h``, ``2 d``."""
    seconds = max(0.0, time.time() - at)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("orchmode.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, money=money, age=_age, doing=lambda kind: _DOING.get(kind, "do"))
    return env


def render(env: Environment, name: str, **values: Any) -> str:
    return env.get_template(name).render(**values)
