"""A bash command split into the simple commands bash would run, for permission rules to match.

``bashlex`` reads the command; what it cannot read (and what only exists when the command
runs: variables, substitutions) stays visible as such, so a rule is never matched against
words the shell will not run.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import bashlex

#: How deep ``bash -c`` / ``eval`` strings are followed before a command counts as unreadable.
_MAX_DEPTH = 6
#: A command longer than this is not parsed (it counts as unreadable).
_MAX_PARSED = 100_000


@dataclass(frozen=True)
class SimpleCommand:
    """One simple command as it will run: its words (``None``: known only at run time)."""

    words: tuple[str | None, ...]


@dataclass(frozen=True)
class Unreadable:
    """Text that runs as commands orchmode could not parse (a construct ``bashlex`` does not
    know, a heredoc's substitutions, a nested string too deep)."""

    text: str


CommandPart = SimpleCommand | Unreadable

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


def simple_commands(command: str, depth: int = 0) -> list[CommandPart]:
    """Every simple command ``command`` runs, in order, as bash would split it: lists, pipes,
    subshells, groups, functions' bodies, substitutions, ``bash -c`` and ``eval`` strings."""
    if not command.strip() or all(
        not line.strip() or line.lstrip().startswith("#") for line in command.splitlines()
    ):
        return []
    if depth > _MAX_DEPTH or len(command) > _MAX_PARSED:
        return [Unreadable(command)]
    text = _TIME.sub(lambda m: m.group(1) + m.group(2) + " " * (4 + len(m.group(3))), command)
    quoted: set[str] = set()

    def unquoted(found: re.Match[str]) -> str:
        name = found.group(2) or found.group(3) or found.group(4)
        quoted.add(name)
        return f"<<{found.group(1)}{name}"

    text = _QUOTED_HEREDOC.sub(unquoted, text)
    parts: list[CommandPart] = []

    def stands_for(value: str) -> Callable[[re.Match[str]], str]:
        def replaced(found: re.Match[str]) -> str:
            if "$(" in found.group(1) or "`" in found.group(1):
                parts.append(Unreadable(found.group(1)))
            return value.ljust(len(found.group(0)))

        return replaced

    text = _ARITHMETIC.sub(stands_for("0"), _TEST.sub(stands_for("true"), text))
    try:
        trees = bashlex.parse(text)
    except Exception:  # bashlex raises many kinds; any means "not readable"
        return [Unreadable(command)]
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
    parts: list[CommandPart]

    def walk(self, node: Any) -> None:
        kind = getattr(node, "kind", None)
        if kind == "command":
            self.command(node)
        elif kind in ("commandsubstitution", "processsubstitution"):
            self.walk(node.command)
        elif kind == "parameter":
            value = str(getattr(node, "value", ""))
            if "$(" in value or "`" in value:
                self.parts.append(Unreadable(value))
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
            if not words or not any(_reads_script(form) for form in command_forms(tuple(words))):
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
                self.parts.append(SimpleCommand((None,)))
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
                self.parts.append(Unreadable(body))  # an unquoted heredoc's substitutions run
        if not words:
            return
        simple = tuple(words)
        self.parts.append(SimpleCommand(simple))
        for form in command_forms(simple):
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


def command_forms(words: tuple[str | None, ...]) -> list[tuple[str | None, ...]]:
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
) -> list[CommandPart]:
    """The commands a command runs from a string: ``bash -c '…'``, ``eval …``, a shell fed a
    heredoc, ``env -S '…'``, ``find … -exec cmd {} ;``."""
    program = words[0]
    if program is None:
        return []
    name = os.path.basename(program)
    if name in _SHELLS:
        script, reads_stdin = _shell_script(words)
        if script is not None:
            return simple_commands(script, depth + 1) if script else [SimpleCommand((None,))]
        if reads_stdin:
            return [p for _, body in heredocs for p in simple_commands(body, depth + 1)]
        return []
    if name == "eval":
        if any(w is None for w in words[1:]):
            return [SimpleCommand((None,))]
        return simple_commands(" ".join(w for w in words[1:] if w is not None), depth + 1)
    if name == "env":
        for index, word in enumerate(words[1:-1], start=1):
            if word in ("-S", "--split-string"):
                after = words[index + 1 :]
                if any(w is None for w in after):
                    return [SimpleCommand((None,))]
                return simple_commands(" ".join(w for w in after if w is not None), depth + 1)
    if name == "find":
        found = _find_exec(words)
        for inner in list(found):
            if isinstance(inner, SimpleCommand):
                forms = command_forms(inner.words)
                found += [p for form in forms for p in _nested(form, depth, ())]
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


def _find_exec(words: tuple[str | None, ...]) -> list[CommandPart]:
    found: list[CommandPart] = []
    index = 1
    while index < len(words):
        if words[index] in ("-exec", "-execdir", "-ok", "-okdir"):
            end = index + 1
            while end < len(words) and words[end] not in (";", "+"):
                end += 1
            if end > index + 1:
                found.append(SimpleCommand(words[index + 1 : end]))
            index = end
        index += 1
    return found


def words_name(text: str, program: str) -> bool:
    """Whether ``program`` (or its last path part) appears in ``text`` as a word."""
    names = {program, os.path.basename(program)} - {""}
    return any(re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w.-])", text) for n in names)
