"""What a rule decided about one action (allow, ask or deny), and which rule decided it.

Its own module so that the permission rules (``permissions.py``) and the domain patterns
they build on (``domains.py``) can both use it without importing each other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Decision", "Verdict"]

Decision = Literal["allow", "ask", "deny"]


@dataclass(frozen=True)
class Verdict:
    """What the rules say about one action, and why."""

    decision: Decision
    #: The rule that decided, as written (``Bash(npm test:*)``, ``*.pythonhosted.org``);
    #: empty when no rule named it and the default decided.
    rule: str = ""
    #: Where that rule came from: a setting's name (``network_allow``), a file
    #: (``.claude/settings.json``), ``remembered`` (an ``--always`` answer) or ``default``.
    source: str = "default"

    def why(self) -> str:
        """A few words for a tool result, an approval or a 403: the rule and where it is."""
        if not self.rule:
            return "no rule names it" if self.source == "default" else f"the {self.source}"
        return f"the rule `{self.rule}` in {self.source}"
