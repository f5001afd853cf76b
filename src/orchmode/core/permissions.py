"""The permission rules in force for a directory: commands, domains and MCP tools asked about.

A rule is written as Claude Code writes it: ``Bash(npm test:*)``, ``WebFetch(domain:pypi.org)``,
``mcp__github__get_issue``. Rules come from orchmode's settings (``permissions_allow``, ``_ask``,
``_deny``), from Claude Code's settings files (the project's ``.claude/settings.json`` and
``.claude/settings.local.json``, the user's ``~/.claude/settings.json``) and from the answers
the user gave with ``--always`` (``rules.toml`` in the user's own configuration directory).
A project's files may always ask or deny more; what they allow counts only once the user
trusts the directory, for a repository under review must not be able to wave its own
commands through.

Deny wins, then ask, then allow, whatever the order the rules were written in; an answer
given with ``--always`` outranks an ``ask`` rule (it is the answer to that very question)
but never a ``deny``. A bash command is split as bash would run it (``bashlex``) and every
simple command in it must pass. These rules decide what orchmode asks about; the sandbox,
not them, is what holds a command in (see docs/permissions.md for what they cannot see).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .bash_commands import CommandPart, Unreadable, command_forms, simple_commands, words_name
from .errors import ConfigError
from .remembered import RULES_FILE, remember, remembered_rules
from .rule_syntax import REMEMBERED, Match, Rule, parse_rule, shown
from .settings import Settings, project_settings, project_verdict, user_config_dir
from .trust import real_directory
from .verdicts import Decision, Verdict

if TYPE_CHECKING:
    from .domains import DomainRules, Pattern

__all__ = [
    "RULES_FILE",
    "Decision",
    "Rules",
    "Verdict",
    "parse_rule",
    "remember",
    "remembered_rules",
]

#: Claude Code's own settings files in a project, and the user's, as sources are named.
PROJECT_FILES = (".claude/settings.json", ".claude/settings.local.json")
USER_FILE = "~/.claude/settings.json"
_DECISIONS: tuple[Decision, ...] = ("deny", "ask", "allow")
_MCP_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class _Set:
    deny: tuple[Rule, ...] = ()
    ask: tuple[Rule, ...] = ()
    allow: tuple[Rule, ...] = ()
    #: Allow rules from ``--always`` answers: they outrank ``ask`` rules, never ``deny``.
    remembered: tuple[Rule, ...] = ()

    def of(self, kind: str) -> _Set:
        def keep(rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
            return tuple(r for r in rules if r.kind == kind)

        return _Set(keep(self.deny), keep(self.ask), keep(self.allow), keep(self.remembered))


class Rules:
    """Every rule in force for one working directory, read once at a session's start."""

    def __init__(
        self,
        rules: Iterable[Rule] = (),
        network: Mapping[Decision, Sequence[str]] | None = None,
    ) -> None:
        kept = list(rules)
        by: dict[str, list[Rule]] = {d: [] for d in (*_DECISIONS, REMEMBERED)}
        for rule in kept:
            by[REMEMBERED if rule.source == REMEMBERED else rule.decision].append(rule)
        self._rules = kept
        self._network: dict[Decision, tuple[str, ...]] = {
            d: tuple((network or {}).get(d, ())) for d in _DECISIONS
        }
        everything = _Set(*(tuple(by[d]) for d in (*_DECISIONS, REMEMBERED)))
        self._commands = everything.of("command")
        self._mcp = everything.of("mcp")
        self._domains_set = everything.of("domain")
        #: A fetch rule's domain, as the domain rules name it, back to the rule as written.
        self._written = {(r.value, r.source): r.text for r in kept if r.kind == "domain"}
        self._domain_rules: DomainRules | None = None
        self._remembered_domains: DomainRules | None = None

    def __repr__(self) -> str:
        return f"Rules({[r.text for r in self._rules]!r}, network={self._network!r})"

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls, settings: Settings, workdir: Path, env: Mapping[str, str]
    ) -> tuple[Rules, list[str]]:
        """The rules from settings, ``.claude/settings*.json`` (the project's allow rules only
        when trusted), ``~/.claude/settings.json`` and the remembered ``--always`` answers;
        with a warning per rule that could not be used (unknown kind, bad pattern)."""
        warnings: list[str] = []
        rules: list[Rule] = []

        def add(texts: Iterable[object], decision: Decision, source: str) -> None:
            for text in texts:
                parsed = parse_rule(text, decision, source)
                if isinstance(parsed, str):
                    warnings.append(f"{source}: ignoring the rule {shown(text)}: {parsed}")
                else:
                    rules.append(parsed)

        for decision in _DECISIONS:
            add(getattr(settings, f"permissions_{decision}"), decision, f"permissions_{decision}")

        directory = real_directory(workdir)
        home = env.get("HOME", "")
        user_file = Path(home) / ".claude" / "settings.json" if home else None
        project: list[tuple[str, dict[Decision, list[object]]]] = []
        for name in PROJECT_FILES:
            path = directory / name
            if user_file is not None and _same_file(path, user_file):
                continue  # the working directory is the home directory: the user's file
            found = _permissions(path, name, warnings)
            if found is not None:
                project.append((name, found))
        allowing = [name for name, found in project if found.get("allow")]
        trusted = not allowing or _trusted(directory, env, allowing, warnings)
        for name, found in project:
            for decision in _DECISIONS:
                if decision != "allow" or trusted:
                    add(found.get(decision, ()), decision, name)
        if user_file is not None:
            found = _permissions(user_file, USER_FILE, warnings)
            for decision in _DECISIONS:
                add((found or {}).get(decision, ()), decision, USER_FILE)
        try:
            remembered = remembered_rules(user_config_dir(env), directory)
        except ConfigError as exc:
            warnings.append(f"{exc} (the rules you allowed with --always are not used)")
            remembered = []
        add(remembered, "allow", REMEMBERED)

        network: dict[Decision, Sequence[str]] = {
            d: getattr(settings, f"network_{d}") for d in _DECISIONS
        }
        loaded = cls(rules, network)
        if any(r.kind == "domain" and r.value != "*" for r in rules):
            warnings.extend(loaded._fetch_rules_problems())
        return loaded, warnings

    def allowing(self, rule: str) -> Rules:
        """These rules with ``rule`` allowed too (an ``--always`` answer, in this process)."""
        parsed = parse_rule(rule, "allow", REMEMBERED)
        if isinstance(parsed, str):
            raise ConfigError(f"the rule {shown(rule)} cannot be remembered: {parsed}")
        return Rules([*self._rules, parsed], self._network)

    def always(self, verdict: Verdict, *, host: str = "", server: str = "", tool: str = "") -> str:
        """The rule an ``--always`` answer to ``verdict`` (an ``ask``) records: the domain or
        MCP tool asked about, or the ``Bash`` ask rule that asked ('' when no rule would
        stop the question: a command that may be a denied one asks every time)."""
        if host:
            return f"WebFetch(domain:{host})"
        if server and tool:
            return f"mcp__{server}__{tool}"
        asked = (
            r for r in self._commands.ask if (r.text, r.source) == (verdict.rule, verdict.source)
        )
        return next((r.text for r in asked), "")

    # ------------------------------------------------------------------ commands

    def command(self, command: str) -> Verdict:
        """A bash command as the shell will run it: every simple command in it must pass."""
        rules = self._commands
        if not (rules.deny or rules.ask or rules.allow or rules.remembered):
            return Verdict("allow")
        verdicts = [self._part(part) for part in simple_commands(command)]
        for decision in ("deny", "ask"):
            for verdict in verdicts:
                if verdict.decision == decision:
                    return verdict
        if verdicts and all(v.rule for v in verdicts):
            return verdicts[0]
        return Verdict("allow")

    def _part(self, part: CommandPart) -> Verdict:
        rules = self._commands
        if isinstance(part, Unreadable):
            # Not parsed: deny when a denied program is named anywhere in it, ask when any
            # deny or ask rule could apply, else the default.
            for rule in rules.deny:
                if rule.form == "all" or (rule.program and words_name(part.text, rule.program)):
                    return rule.verdict()
            could = next(iter((*rules.deny, *rules.ask)), None)
            return could.verdict("ask") if could else Verdict("allow")
        forms = command_forms(part.words)

        def first(candidates: Iterable[Rule], wanted: Match) -> Rule | None:
            for rule in candidates:
                if any(rule.matches(form) == wanted for form in forms):
                    return rule
            return None

        if found := first(rules.deny, "yes"):
            return found.verdict()
        if found := first(rules.deny, "maybe"):
            return found.verdict("ask")  # it may be the denied command: the user decides
        if found := first(rules.remembered, "yes"):
            return found.verdict()
        if (found := first(rules.ask, "yes")) or (found := first(rules.ask, "maybe")):
            return found.verdict()
        if found := first(rules.allow, "yes"):
            return found.verdict()
        return Verdict("allow")

    # ------------------------------------------------------------------ domains

    def _patterns(self, decision: Decision, remembered: bool = False) -> list[Any]:
        from .domains import Pattern

        if remembered:
            return [Pattern(r.value, REMEMBERED) for r in self._domains_set.remembered]
        rules = getattr(self._domains_set, decision)
        found = [Pattern(text, f"network_{decision}") for text in self._network[decision]]
        found += [Pattern(r.value, r.source) for r in rules if r.value != "*"]
        if decision == "allow":
            found += self._patterns("allow", remembered=True)
        return found

    def fetching_withheld(self) -> bool:
        """Whether a bare ``WebFetch`` deny or ask rule is in force: no domain is fetched
        without asking, so the API's web fetch (which cannot ask) is not offered."""
        every = self._domains_set
        return any(r.value == "*" for r in (*every.deny, *every.ask))

    def domain_patterns(self, decision: Decision) -> list[Pattern]:
        """The domain patterns that ``decision`` holds for: ``network_<decision>`` and the
        ``WebFetch(domain:...)`` rules (for ``allow``, the ``--always`` answers too)."""
        return self._patterns(decision)

    def _domains(self) -> DomainRules:
        from .domains import DomainRules

        if self._domain_rules is None:
            self._domain_rules = DomainRules(
                allow=self._patterns("allow"),
                ask=self._patterns("ask"),
                deny=self._patterns("deny"),
            )
        return self._domain_rules

    def _fetch_rules_problems(self) -> list[str]:
        from .domains import DomainRules, Pattern

        fetched = [
            Pattern(r.value, r.source)
            for group in (self._domains_set.deny, self._domains_set.ask, self._domains_set.allow)
            for r in group
            if r.value != "*"
        ]
        return DomainRules(allow=fetched, ask=(), deny=()).problems()

    def domain(self, host: str, port: int) -> Verdict:
        """A name (or an IP literal) a sandboxed command connects to through the proxy."""
        every = self._domains_set
        for rule in every.deny:
            if rule.value == "*":
                return rule.verdict()
        verdict = self._as_written(self._domains().decide(host, port))
        if verdict.decision == "deny" and verdict.rule:
            return verdict
        if every.remembered:
            from .domains import DomainRules

            if self._remembered_domains is None:
                self._remembered_domains = DomainRules(
                    allow=self._patterns("allow", remembered=True), ask=(), deny=()
                )
            answered = self._remembered_domains.decide(host, port)
            if answered.decision == "allow":
                return self._as_written(answered)
        for rule in every.ask:
            if rule.value == "*":
                return rule.verdict()
        return verdict

    def address(self, host: str, address: str) -> Verdict:
        """Whether ``host``, allowed by :meth:`domain`, may be reached at ``address`` (what
        it resolved to): loopback, link-local and private only when named."""
        return self._as_written(self._domains().address(host, address))

    def _as_written(self, verdict: Verdict) -> Verdict:
        written = self._written.get((verdict.rule, verdict.source))
        return Verdict(verdict.decision, written, verdict.source) if written else verdict

    # ------------------------------------------------------------------ MCP

    def mcp(self, server: str, tool: str, annotations: Mapping[str, Any] | None) -> Verdict:
        """An MCP tool: a rule naming it, else its annotations' default."""
        names = {f"mcp__{server}__{tool}", f"mcp__{server}__{_MCP_UNSAFE.sub('_', tool)}"}
        whole = {f"mcp__{server}", f"mcp__{_MCP_UNSAFE.sub('_', server)}"}

        def first(rules: Iterable[Rule]) -> Rule | None:
            return next((r for r in rules if r.value in names or r.value in whole), None)

        rules = self._mcp
        for group in (rules.deny, rules.remembered, rules.ask, rules.allow):
            if found := first(group):
                return found.verdict()
        hints = annotations or {}
        if hints.get("readOnlyHint") is True:
            return Verdict("allow", "readOnlyHint", "annotations")
        for hint in ("destructiveHint", "openWorldHint"):
            if hints.get(hint) is True:
                return Verdict("ask", hint, "annotations")
        return Verdict("allow")


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.is_file() and other.is_file() and os.path.samefile(one, other)
    except OSError:
        return False


def _permissions(
    path: Path, shown: str, warnings: list[str]
) -> dict[Decision, list[object]] | None:
    """A Claude Code settings file's ``permissions`` lists (None without the file); a file
    or list that cannot be read is a warning, and what can be read still counts."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.append(f"{shown}: cannot read it ({exc.strerror or exc}); its rules are ignored")
        return None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        warnings.append(f"{shown}: not valid JSON ({exc}); its rules are ignored — fix it")
        return None
    permissions = data.get("permissions") if isinstance(data, dict) else None
    if permissions is None:
        if not isinstance(data, dict):
            warnings.append(f"{shown}: not a JSON object; its rules are ignored — fix it")
        return {}
    if not isinstance(permissions, dict):
        warnings.append(f"{shown}: `permissions` is not an object; its rules are ignored")
        return {}
    found: dict[Decision, list[object]] = {}
    for decision in _DECISIONS:
        listed = permissions.get(decision, [])
        if not isinstance(listed, list):
            warnings.append(f"{shown}: `permissions.{decision}` is not a list; it is ignored")
            continue
        found[decision] = listed
    return found


def _trusted(
    directory: Path, env: Mapping[str, str], files: list[str], warnings: list[str]
) -> bool:
    """Whether the user trusts ``directory``'s settings files; a warning when not."""
    command = f"`orchmode trust {shlex.quote(str(directory))}`"
    named = " and ".join(files)
    try:
        found = project_verdict(directory, project_settings(directory), user_config_dir(env))
    except ConfigError as exc:
        warnings.append(f"ignoring the allow rules of {named}: {exc}")
        return False
    if found.trusted:
        return True
    if found.known:
        warnings.append(
            f"ignoring the allow rules of {named}: this directory's settings files changed "
            f"since you trusted it ({', '.join(found.changed)}) — review them and run {command} "
            "again if you trust them (their ask and deny rules count)"
        )
    else:
        warnings.append(
            f"ignoring the allow rules of {named}: this directory is not trusted — run "
            f"{command} if you trust its settings (their ask and deny rules count)"
        )
    return False
