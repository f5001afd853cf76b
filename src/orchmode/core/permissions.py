"""Permission rules for commands, domains and MCP tools, in Claude Code's format.

INTERFACE STUB (issue 32): the ``rules`` helper implements it; the names and signatures
below are what the proxy, the approvals and the agents' loops call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .settings import Settings

__all__ = ["Decision", "Rules", "Verdict"]

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


class Rules:
    """Every rule in force for one working directory, read once at a session's start."""

    @classmethod
    def load(
        cls, settings: Settings, workdir: Path, env: Mapping[str, str]
    ) -> tuple[Rules, list[str]]:
        """The rules from settings, ``.claude/settings*.json`` (the project's allow rules only
        when trusted), ``~/.claude/settings.json`` and the remembered ``--always`` answers;
        with a warning per rule that could not be used (unknown kind, bad pattern)."""
        raise NotImplementedError

    def command(self, command: str) -> Verdict:
        """A bash command as the shell will run it: every simple command in it must pass."""
        raise NotImplementedError

    def domain(self, host: str, port: int) -> Verdict:
        """A name (or an IP literal) a sandboxed command connects to through the proxy."""
        raise NotImplementedError

    def address(self, host: str, address: str) -> Verdict:
        """Whether ``host``, allowed by :meth:`domain`, may be reached at ``address`` (what
        it resolved to): loopback, link-local and private only when named."""
        raise NotImplementedError

    def mcp(self, server: str, tool: str, annotations: Mapping[str, Any] | None) -> Verdict:
        """An MCP tool: a rule naming it, else its annotations' default."""
        raise NotImplementedError

    def allowing(self, rule: str) -> Rules:
        """These rules with ``rule`` allowed too (an ``--always`` answer, in this process)."""
        raise NotImplementedError


def remember(config_dir: Path, directory: Path, rule: str) -> None:
    """Record ``rule`` as allowed for ``directory`` in the user's own configuration (never a
    file of the repository): the next run there does not ask again."""
    raise NotImplementedError
