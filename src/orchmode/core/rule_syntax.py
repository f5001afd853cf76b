"""One permission rule as Claude Code writes it (``Bash(npm test:*)``), parsed and matched.

A command rule is matched against a simple command's words; a domain or MCP rule keeps the
name it gives, for :class:`~orchmode.core.permissions.Rules` to look up.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from .verdicts import Decision, Verdict

#: The source of the rules the user allowed with ``--always``.
REMEMBERED = "remembered"
#: Claude Code's tools that orchmode has no rules for: their rules are skipped with a warning.
OTHER_TOOLS = frozenset(
    {
        "Read",
        "Edit",
        "Write",
        "MultiEdit",
        "NotebookEdit",
        "NotebookRead",
        "WebSearch",
        "Glob",
        "Grep",
        "LS",
        "Task",
        "Agent",
        "TodoWrite",
        "Skill",
        "SlashCommand",
        "BashOutput",
        "KillShell",
        "ExitPlanMode",
    }
)
_RULE = re.compile(r"(?s)^([A-Za-z_][A-Za-z0-9_-]*\*?)(?:\((.*)\))?$")

Form = Literal["all", "exact", "prefix", "wildcard"]
Match = Literal["yes", "maybe", "no"]


@dataclass(frozen=True)
class Rule:
    """One usable rule: what it names (a command matcher, a domain, an MCP name)."""

    text: str
    source: str
    decision: Decision
    kind: Literal["command", "domain", "mcp"]
    #: command: the pattern, words joined by one space; domain: the pattern (``*``: every
    #: domain); mcp: ``mcp__server`` or ``mcp__server__tool``.
    value: str = ""
    form: Form = "all"

    def verdict(self, decision: Decision | None = None) -> Verdict:
        return Verdict(decision or self.decision, self.text, self.source)

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        if self.value.endswith(" *") and self.value.count("*") == 1:
            # `npm test *`: a single trailing wildcard after a space also takes `npm test`
            return re.compile(f"{re.escape(self.value[:-2])}(?: .*)?", re.DOTALL)
        return re.compile(".*".join(re.escape(piece) for piece in self.value.split("*")), re.DOTALL)

    def matches(self, words: Sequence[str | None]) -> Match:
        """Whether this command rule names a simple command (its words; ``None``: a word
        known only when it runs, a variable or a substitution): surely, perhaps, or not."""
        if self.form == "all":
            return "yes"
        known = _known_prefix(words)
        text = " ".join(known)
        if len(known) == len(words):
            if self.form == "exact":
                return "yes" if text == self.value else "no"
            if self.form == "prefix":
                return "yes" if _at_boundary(text, self.value) else "no"
            return "yes" if self._regex.fullmatch(text) else "no"
        # some word is known only at run time: sure only when the rest is free anyway
        if self.form == "prefix" and _at_boundary(text, self.value):
            return "yes"
        if self.form == "wildcard" and self.value.endswith("*") and self.value.count("*") == 1:
            fixed = self.value[:-1]
            if fixed.endswith(" ") and _at_boundary(text, fixed[:-1]):
                return "yes"
            if not fixed.endswith(" ") and known and text.startswith(fixed):
                return "yes"
        fixed = self.value.split("*", 1)[0]
        started = text + " " if text else ""
        if fixed.startswith(started) or started.startswith(fixed) or fixed == text:
            return "maybe"
        return "no"

    @property
    def program(self) -> str:
        """The program a command rule names ('' when any: ``Bash``, ``Bash(*)``, ``*x``)."""
        first = self.value.split(" ", 1)[0]
        return "" if self.form == "all" or "*" in first else first


def _known_prefix(words: Sequence[str | None]) -> list[str]:
    known: list[str] = []
    for word in words:
        if word is None:
            break
        known.append(word)
    return known


def _at_boundary(text: str, prefix: str) -> bool:
    """``text`` is ``prefix`` or starts with it followed by a space (``npm test`` takes
    ``npm test -x``, not ``npm testing``)."""
    return text == prefix or text.startswith(prefix + " ")


def parse_rule(text: object, decision: Decision, source: str) -> Rule | str:
    """A rule as written, or why it cannot be used."""
    if not isinstance(text, str):
        return f"a rule must be a string, not {type(text).__name__} ({text!r})"
    written = text.strip()
    found = _RULE.match(written)
    if found is None:
        return "it is not `Tool` or `Tool(specifier)`"
    tool, inner = found.group(1), found.group(2)
    if tool == "Bash":
        return _command_rule(written, inner, decision, source)
    if tool == "WebFetch":
        if inner is None or inner.strip() in ("", "*"):
            if decision == "allow":
                return (
                    "a bare WebFetch would open every domain — name them "
                    "(`WebFetch(domain:pypi.org)`), or use --allow-network for everything"
                )
            return Rule(written, source, decision, "domain", "*")
        domain = inner.strip()
        if not domain.startswith("domain:") or not domain[len("domain:") :].strip():
            return "orchmode reads only `WebFetch(domain:NAME)` rules"
        return Rule(written, source, decision, "domain", domain[len("domain:") :].strip())
    if tool.startswith("mcp__"):
        if inner is not None:
            return "an MCP rule is `mcp__server`, `mcp__server__*` or `mcp__server__tool`"
        name = tool.removesuffix("__*")
        if not name[len("mcp__") :]:
            return "it names no MCP server"
        return Rule(written, source, decision, "mcp", name)
    if tool in OTHER_TOOLS:
        return (
            f"orchmode has no {tool} tool to check (it reads Bash, WebFetch(domain:…) and mcp__ "
            "rules; the sandbox decides what commands may read and write)"
        )
    return f"unknown rule kind {tool!r} (orchmode reads Bash, WebFetch(domain:…) and mcp__ rules)"


def _command_rule(written: str, inner: str | None, decision: Decision, source: str) -> Rule | str:
    if inner is None or inner.strip() in ("", "*"):
        return Rule(written, source, decision, "command", "", "all")
    body = inner.strip()
    form: Form = "exact"
    if body.endswith(":*"):
        body, form = body[:-2].rstrip(), "prefix"
    if "*" in body:
        if form == "prefix":
            return "`:*` ends a prefix rule and cannot follow another `*`"
        form = "wildcard"
    try:
        words = shlex.split(body)
    except ValueError as exc:
        return f"its command cannot be read ({exc})"
    if not words:
        return "it names no command"
    return Rule(written, source, decision, "command", " ".join(words), form)


def shown(text: object) -> str:
    """A rule as written, for a message."""
    return f"`{text}`" if isinstance(text, str) else repr(text)
