"""Permission rules for commands, domains and MCP tools, in Claude Code's format.

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

import itertools
import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import bashlex

from .errors import ConfigError
from .settings import Settings, project_settings, project_verdict, user_config_dir
from .trust import directory_entries, locked, real_directory, replace_file, toml_string
from .verdicts import Decision, Verdict

if TYPE_CHECKING:
    from .domains import DomainRules

__all__ = ["Decision", "Rules", "Verdict", "remember"]

#: The answers given with ``--always``, by directory, in the user's configuration directory.
RULES_FILE = "rules.toml"
REMEMBERED = "remembered"
#: Claude Code's own settings files in a project, and the user's, as sources are named.
PROJECT_FILES = (".claude/settings.json", ".claude/settings.local.json")
USER_FILE = "~/.claude/settings.json"
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
_DECISIONS: tuple[Decision, ...] = ("deny", "ask", "allow")
_RULE = re.compile(r"(?s)^([A-Za-z_][A-Za-z0-9_-]*\*?)(?:\((.*)\))?$")
_MCP_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: How deep ``bash -c`` / ``eval`` strings are followed before a command counts as unreadable.
_MAX_DEPTH = 6
#: A command longer than this is not parsed (it counts as unreadable).
_MAX_PARSED = 100_000


# --------------------------------------------------------------------------- one rule

Form = Literal["all", "exact", "prefix", "wildcard"]
Match = Literal["yes", "maybe", "no"]


@dataclass(frozen=True)
class _Rule:
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


def parse_rule(text: object, decision: Decision, source: str) -> _Rule | str:
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
            return _Rule(written, source, decision, "domain", "*")
        domain = inner.strip()
        if not domain.startswith("domain:") or not domain[len("domain:") :].strip():
            return "orchmode reads only `WebFetch(domain:NAME)` rules"
        return _Rule(written, source, decision, "domain", domain[len("domain:") :].strip())
    if tool.startswith("mcp__"):
        if inner is not None:
            return "an MCP rule is `mcp__server`, `mcp__server__*` or `mcp__server__tool`"
        name = tool.removesuffix("__*")
        if not name[len("mcp__") :]:
            return "it names no MCP server"
        return _Rule(written, source, decision, "mcp", name)
    if tool in OTHER_TOOLS:
        return (
            f"orchmode has no {tool} tool to check (it reads Bash, WebFetch(domain:…) and mcp__ "
            "rules; the sandbox decides what commands may read and write)"
        )
    return f"unknown rule kind {tool!r} (orchmode reads Bash, WebFetch(domain:…) and mcp__ rules)"


def _command_rule(written: str, inner: str | None, decision: Decision, source: str) -> _Rule | str:
    if inner is None or inner.strip() in ("", "*"):
        return _Rule(written, source, decision, "command", "", "all")
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
    return _Rule(written, source, decision, "command", " ".join(words), form)


# ------------------------------------------------------------ commands as bash runs them


@dataclass(frozen=True)
class _Simple:
    """One simple command as it will run: its words (``None``: known only at run time)."""

    words: tuple[str | None, ...]


@dataclass(frozen=True)
class _Unreadable:
    """Text that runs as commands orchmode could not parse (a construct ``bashlex`` does not
    know, a heredoc's substitutions, a nested string too deep)."""

    text: str


_Part = _Simple | _Unreadable

_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
_SHELL_OPTIONS_WITH_ARGUMENT = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})
_DYNAMIC_KINDS = frozenset({"parameter", "commandsubstitution", "processsubstitution"})
# `time` is a keyword bashlex does not parse: blanked at a command's start (its words kept
# in place, so positions hold), the command after it is what is checked.
_TIME = re.compile(r"(?m)(^|[;&|(){}!]|\bthen|\bdo|\belse)(\s*)time((?:\s+-p)?\s)")
# bashlex reads no quoted heredoc delimiter (`<<'EOF'`, which agents use to write files): it
# is given the bare name, and the heredoc is remembered as quoted (its body is plain text).
# Nor `[[ … ]]` or `$(( … ))`: each is read as `true` or `0` (padded, so positions hold), and
# the substitutions inside it, which run, are checked as text.
_TEST = re.compile(r"\[\[(?=\s)(.*?)(?<=\s)\]\]")
_ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")
_QUOTED_HEREDOC = re.compile(r"<<(-?)[ \t]*(?:'(\w+)'|\"(\w+)\"|\\(\w+))")


def simple_commands(command: str, depth: int = 0) -> list[_Part]:
    """Every simple command ``command`` runs, in order, as bash would split it: lists, pipes,
    subshells, groups, functions' bodies, substitutions, ``bash -c`` and ``eval`` strings."""
    if not command.strip() or all(
        not line.strip() or line.lstrip().startswith("#") for line in command.splitlines()
    ):
        return []
    if depth > _MAX_DEPTH or len(command) > _MAX_PARSED:
        return [_Unreadable(command)]
    text = _TIME.sub(lambda m: m.group(1) + m.group(2) + " " * (4 + len(m.group(3))), command)
    quoted: set[str] = set()

    def unquoted(found: re.Match[str]) -> str:
        name = found.group(2) or found.group(3) or found.group(4)
        quoted.add(name)
        return f"<<{found.group(1)}{name}"

    text = _QUOTED_HEREDOC.sub(unquoted, text)
    parts: list[_Part] = []

    def stands_for(value: str) -> Callable[[re.Match[str]], str]:
        def replaced(found: re.Match[str]) -> str:
            if "$(" in found.group(1) or "`" in found.group(1):
                parts.append(_Unreadable(found.group(1)))
            return value.ljust(len(found.group(0)))

        return replaced

    text = _ARITHMETIC.sub(stands_for("0"), _TEST.sub(stands_for("true"), text))
    try:
        trees = bashlex.parse(text)
    except Exception:  # bashlex raises many kinds; any means "not readable"
        return [_Unreadable(command)]
    walker = _Walker(text, depth, frozenset(quoted), parts)
    for tree in trees:
        walker.walk(tree)
    return parts


@dataclass
class _Walker:
    """Collects the simple commands of one parsed text."""

    text: str
    depth: int
    #: Heredoc delimiters written quoted: their bodies are text, never substituted.
    quoted: frozenset[str]
    parts: list[_Part]

    def walk(self, node: Any) -> None:
        kind = getattr(node, "kind", None)
        if kind == "command":
            self.command(node)
        elif kind in ("commandsubstitution", "processsubstitution"):
            self.walk(node.command)
        elif kind == "parameter":
            value = str(getattr(node, "value", ""))
            if "$(" in value or "`" in value:
                self.parts.append(_Unreadable(value))
        else:
            for child in _children(node):
                self.walk(child)
            if kind == "pipeline":
                self.piped(node)

    def piped(self, node: Any) -> None:
        """``… | bash``: what the command before a shell that reads stdin writes is a script
        (a heredoc, ``echo``'s words; anything else is known only at run time)."""
        commands = [p for p in node.parts if getattr(p, "kind", None) == "command"]
        for before, after in itertools.pairwise(commands):
            words, _ = self.read(after)
            if not words or not any(_reads_script(form) for form in _forms(tuple(words))):
                continue
            feeding, heredocs = self.read(before)
            bodies = [body for _, body in heredocs]
            program = os.path.basename(feeding[0] or "") if feeding else ""
            if bodies:
                script: str | None = "\n".join(bodies)
            elif program in ("echo", "printf") and all(w is not None for w in feeding[1:]):
                script = " ".join(w for w in feeding[1:] if w is not None)
            else:
                script = None
            if script is None:
                self.parts.append(_Simple((None,)))
            else:
                self.parts.extend(simple_commands(script, self.depth + 1))

    def read(self, node: Any) -> tuple[list[str | None], list[tuple[str, str]]]:
        """A command node's words and its heredocs (delimiter, body)."""
        words: list[str | None] = []
        heredocs: list[tuple[str, str]] = []
        for part in node.parts:
            if part.kind == "word":
                words.append(None if _dynamic(part, self.text) else part.word)
            elif part.kind == "redirect" and getattr(part, "heredoc", None) is not None:
                heredocs.append((str(part.output.word), str(part.heredoc.value)))
        return words, heredocs

    def command(self, node: Any) -> None:
        words, heredocs = self.read(node)
        for part in node.parts:
            # an assignment before the program is no word of it (its substitutions run)
            for child in getattr(part, "parts", None) or ():
                self.walk(child)
            if part.kind == "redirect" and hasattr(part.output, "kind"):
                self.walk(part.output)
        for delimiter, body in heredocs:
            if delimiter not in self.quoted and ("$(" in body or "`" in body):
                self.parts.append(_Unreadable(body))  # an unquoted heredoc's substitutions run
        if not words:
            return
        simple = tuple(words)
        self.parts.append(_Simple(simple))
        for form in _forms(simple):
            self.parts.extend(_nested(form, self.depth, heredocs))


def _children(node: Any) -> Iterator[Any]:
    for name in ("parts", "list"):
        yield from getattr(node, name, None) or ()
    for name in ("command", "output"):
        child = getattr(node, name, None)
        if child is not None and hasattr(child, "kind"):
            yield child
    yield from getattr(node, "redirects", None) or ()


def _dynamic(word: Any, text: str) -> bool:
    """Whether a word is known only at run time: a parameter, a substitution, or a glob or
    brace expansion outside quotes."""
    if any(getattr(p, "kind", None) in _DYNAMIC_KINDS for p in getattr(word, "parts", ())):
        return True
    return _expands(text[word.pos[0] : word.pos[1]])


def _expands(raw: str) -> bool:
    quote = ""
    index = 0
    while index < len(raw):
        char = raw[index]
        if quote == "'":
            quote = "" if char == "'" else quote
        elif quote == '"':
            if char == "\\":
                index += 1
            elif char == '"':
                quote = ""
        elif char == "\\":
            index += 1
        elif char in "'\"":
            quote = char
        elif (
            char in "*?"
            or (char == "[" and "]" in raw[index + 1 :])
            or (char == "{" and ("," in raw[index:] or ".." in raw[index:]))
        ):
            return True
        index += 1
    return False


def _forms(words: tuple[str | None, ...]) -> list[tuple[str | None, ...]]:
    """A simple command as written, then as each wrapper runs it (``env X=1 nohup rm x``:
    also ``nohup rm x`` and ``rm x``), then each with its program's directory left off."""
    forms = [words]
    current: tuple[str | None, ...] | None = words
    while current is not None and len(forms) < 16:
        current = _unwrapped(current)
        if current:
            forms.append(current)
    for form in list(forms):
        program = form[0]
        if program is not None and "/" in program and os.path.basename(program):
            forms.append((os.path.basename(program), *form[1:]))
    return forms


def _options(words: tuple[str | None, ...], start: int, with_argument: Iterable[str] = ()) -> int:
    """The index of the first word after a wrapper's options (``-x``, ``-n 5``, ``--a=b``)."""
    takes = set(with_argument)
    index = start
    while index < len(words):
        word = words[index]
        if word is None or not word.startswith("-") or word == "-":
            break
        index += 1
        if word == "--":
            break
        if word in takes:
            index += 1
    return index


def _unwrapped(words: tuple[str | None, ...]) -> tuple[str | None, ...] | None:
    """The command a wrapper runs (``env``, ``command``, ``nohup``, ``timeout`` …), or None."""
    program = words[0]
    if program is None:
        return None
    name = os.path.basename(program)
    rest: int
    if name == "env":
        rest = _options(words, 1, ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"))
        while rest < len(words) and (word := words[rest]) is not None and "=" in word:
            rest += 1
    elif name == "command":
        if any(w in ("-v", "-V") for w in words[1:2]):
            return None  # `command -v x` looks x up, it does not run it
        rest = _options(words, 1)
    elif name in ("builtin", "nohup", "setsid", "unbuffer"):
        rest = _options(words, 1)
    elif name == "exec":
        rest = _options(words, 1, ("-a",))
    elif name == "time":
        rest = _options(words, 1, ("-f", "--format", "-o", "--output"))
    elif name == "nice":
        rest = _options(words, 1, ("-n", "--adjustment"))
    elif name == "ionice":
        rest = _options(words, 1, ("-c", "-n", "-p", "-P", "-u"))
    elif name == "stdbuf":
        rest = _options(words, 1, ("-i", "-o", "-e"))
    elif name == "timeout":
        rest = _options(words, 1, ("-s", "--signal", "-k", "--kill-after")) + 1  # duration
    elif name in ("sudo", "doas"):  # no use in the sandbox, but what it would run is named
        rest = _options(words, 1, ("-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T"))
    elif name == "xargs":
        rest = _options(
            words, 1, ("-a", "-d", "-E", "-e", "-I", "-i", "-L", "-l", "-n", "-P", "-s")
        )
    else:
        return None
    return words[rest:] or None


def _nested(
    words: tuple[str | None, ...], depth: int, heredocs: Sequence[tuple[str, str]]
) -> list[_Part]:
    """The commands a command runs from a string: ``bash -c '…'``, ``eval …``, a shell fed a
    heredoc, ``env -S '…'``, ``find … -exec cmd {} ;``."""
    program = words[0]
    if program is None:
        return []
    name = os.path.basename(program)
    if name in _SHELLS:
        script, reads_stdin = _shell_script(words)
        if script is not None:
            return simple_commands(script, depth + 1) if script else [_Simple((None,))]
        if reads_stdin:
            return [p for _, body in heredocs for p in simple_commands(body, depth + 1)]
        return []
    if name == "eval":
        if any(w is None for w in words[1:]):
            return [_Simple((None,))]
        return simple_commands(" ".join(w for w in words[1:] if w is not None), depth + 1)
    if name == "env":
        for index, word in enumerate(words[1:-1], start=1):
            if word in ("-S", "--split-string"):
                after = words[index + 1 :]
                if any(w is None for w in after):
                    return [_Simple((None,))]
                return simple_commands(" ".join(w for w in after if w is not None), depth + 1)
    if name == "find":
        found = _find_exec(words)
        for inner in list(found):
            if isinstance(inner, _Simple):
                found += [p for form in _forms(inner.words) for p in _nested(form, depth, ())]
        return found
    return []


def _shell_script(words: tuple[str | None, ...]) -> tuple[str | None, bool]:
    """A shell's ``-c`` string ('' when only known at run time; None without ``-c``), and
    whether it reads its commands from stdin (no script file named)."""
    wants_string = False
    index = 1
    while index < len(words):
        word = words[index]
        if word is None:
            return ("" if wants_string else None), False
        if word in _SHELL_OPTIONS_WITH_ARGUMENT:
            index += 2
            continue
        if word.startswith("-") and word != "-" and word != "--":
            if not word.startswith("--") and "c" in word[1:]:
                wants_string = True
            index += 1
            continue
        if word == "--":
            index += 1
            continue
        return (word if wants_string else None), False
    return None, not wants_string


def _reads_script(words: tuple[str | None, ...]) -> bool:
    """Whether a command is a shell reading its commands from stdin (``bash``, ``sh -s``)."""
    program = words[0]
    if program is None or os.path.basename(program) not in _SHELLS:
        return False
    return _shell_script(words)[1]


def _find_exec(words: tuple[str | None, ...]) -> list[_Part]:
    found: list[_Part] = []
    index = 1
    while index < len(words):
        if words[index] in ("-exec", "-execdir", "-ok", "-okdir"):
            end = index + 1
            while end < len(words) and words[end] not in (";", "+"):
                end += 1
            if end > index + 1:
                found.append(_Simple(words[index + 1 : end]))
            index = end
        index += 1
    return found


def _words_in(text: str, program: str) -> bool:
    """Whether ``program`` (or its last path part) appears in ``text`` as a word."""
    names = {program, os.path.basename(program)} - {""}
    return any(re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", text) for n in names)


# --------------------------------------------------------------------------- the rules


@dataclass(frozen=True)
class _Set:
    deny: tuple[_Rule, ...] = ()
    ask: tuple[_Rule, ...] = ()
    allow: tuple[_Rule, ...] = ()
    #: Allow rules from ``--always`` answers: they outrank ``ask`` rules, never ``deny``.
    remembered: tuple[_Rule, ...] = ()

    def of(self, kind: str) -> _Set:
        def keep(rules: tuple[_Rule, ...]) -> tuple[_Rule, ...]:
            return tuple(r for r in rules if r.kind == kind)

        return _Set(keep(self.deny), keep(self.ask), keep(self.allow), keep(self.remembered))


class Rules:
    """Every rule in force for one working directory, read once at a session's start."""

    def __init__(
        self,
        rules: Iterable[_Rule] = (),
        network: Mapping[Decision, Sequence[str]] | None = None,
    ) -> None:
        kept = list(rules)
        by: dict[str, list[_Rule]] = {d: [] for d in (*_DECISIONS, REMEMBERED)}
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
        rules: list[_Rule] = []

        def add(texts: Iterable[object], decision: Decision, source: str) -> None:
            for text in texts:
                parsed = parse_rule(text, decision, source)
                if isinstance(parsed, str):
                    warnings.append(f"{source}: ignoring the rule {_shown(text)}: {parsed}")
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
            raise ConfigError(f"the rule {_shown(rule)} cannot be remembered: {parsed}")
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

    def _part(self, part: _Part) -> Verdict:
        rules = self._commands
        if isinstance(part, _Unreadable):
            # Not parsed: deny when a denied program is named anywhere in it, ask when any
            # deny or ask rule could apply, else the default.
            for rule in rules.deny:
                if rule.form == "all" or (rule.program and _words_in(part.text, rule.program)):
                    return rule.verdict()
            could = next(iter((*rules.deny, *rules.ask)), None)
            return could.verdict("ask") if could else Verdict("allow")
        forms = _forms(part.words)

        def first(candidates: Iterable[_Rule], wanted: Match) -> _Rule | None:
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

        def first(rules: Iterable[_Rule]) -> _Rule | None:
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


def _shown(text: object) -> str:
    return f"`{text}`" if isinstance(text, str) else repr(text)


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


# --------------------------------------------------------------------------- remembered answers

_RULES_HEADER = (
    "# Rules you allowed with `--always`, by directory: written by orchmode.\n"
    "# They count only in that directory; delete a line (or the file) to be asked again.\n"
)


@dataclass
class _Remembered:
    path: str
    allow: list[str] = field(default_factory=list)


def _read_remembered(config_dir: Path) -> dict[str, _Remembered]:
    path = config_dir / RULES_FILE
    found: dict[str, _Remembered] = {}
    for entry in directory_entries(path):
        where = entry.get("path") if isinstance(entry, dict) else None
        allow = entry.get("allow", []) if isinstance(entry, dict) else None
        if not isinstance(where, str) or not isinstance(allow, list):
            raise ConfigError(f"{path}: an entry without a path or allow list — fix or delete it")
        kept = found.setdefault(where, _Remembered(where))
        kept.allow.extend(str(rule) for rule in allow if str(rule) not in kept.allow)
    return found


def _render_remembered(entries: Iterable[_Remembered]) -> str:
    parts = [_RULES_HEADER]
    for entry in sorted(entries, key=lambda e: e.path):
        listed = "".join(f"    {toml_string(rule)},\n" for rule in entry.allow)
        parts.append(f"\n[[directory]]\npath = {toml_string(entry.path)}\nallow = [\n{listed}]\n")
    return "".join(parts)


def remembered_rules(config_dir: Path, directory: Path) -> list[str]:
    """The rules allowed with ``--always`` in ``directory`` (its real path)."""
    entry = _read_remembered(config_dir).get(str(real_directory(directory)))
    return list(entry.allow) if entry else []


def remember(config_dir: Path, directory: Path, rule: str) -> None:
    """Record ``rule`` as allowed for ``directory`` in the user's own configuration (never a
    file of the repository): the next run there does not ask again."""
    parsed = parse_rule(rule, "allow", REMEMBERED)
    if isinstance(parsed, str):
        raise ConfigError(f"the rule {_shown(rule)} cannot be remembered: {parsed}")
    where = str(real_directory(directory))
    with locked(config_dir, RULES_FILE):
        entries = _read_remembered(config_dir)
        entry = entries.setdefault(where, _Remembered(where))
        if rule in entry.allow:
            return
        entry.allow.append(rule)
        try:
            text = _render_remembered(entries.values()).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError("a rule or path that is not valid UTF-8 cannot be recorded") from exc
        replace_file(config_dir, RULES_FILE, text)
