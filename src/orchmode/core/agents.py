"""Agent definitions (roles): Markdown files with YAML front matter, in Claude Code's format.

A definition names a role (``name``, ``description``), the tools it may use (``tools``: a
comma list or a YAML list, shell patterns allowed; absent means all), its model (``model``:
an alias, an ID or ``inherit``) and orchmode's own optional keys ``effort``, ``isolation``
and ``verify``. The body is the role's instructions, given to the agent *besides*
orchmode's own subagent rules, never instead of them.

Definitions are read from three directories, each only its ``*.md`` files directly inside
(not recursively), in sorted order. On a name clash the later one wins:

1. ``~/.claude/agents/`` (the user's),
2. ``.claude/agents/`` in the working directory (the project's, as in Claude Code),
3. ``agents_dir`` when set, since the user named it for this run.

Bad files are normal (other tools write these directories too): each one is a one-line
warning naming the file and the line, and is skipped; the others still load. Front matter
that YAML refuses is no bad file by itself: collections written for Claude Code hold
one-line descriptions such as ``Triggers on: 'x'``, which YAML reads as a mapping. It is
read again by its ``key: value`` lines (:mod:`.front_matter`), with a warning that says so,
and only if that reading is no definition either is the file skipped, for the YAML error.

``tools`` is read the way a Claude Code user means it. orchmode's agents have ``bash``,
``report_findings`` (always) and the user's MCP tools; Claude Code's file tools are all
done with bash here, so they choose the role's shell:

- ``Bash``, ``Edit``, ``Write``, ``MultiEdit``, ``NotebookEdit`` (or no ``tools``): bash, as
  every agent has it;
- only reading tools (``Read``, ``Grep``, ``Glob``, ``LS``) or ``Bash(<command pattern>)``:
  bash that cannot write the tree (a read-only sandbox; in a copy, a read-only copy), since
  orchmode cannot hold a shell to some commands;
- none of them: no bash at all.

``WebSearch`` and ``WebFetch`` are Anthropic's server-side web tools (see
:mod:`.web_tools`): a role is offered them only when its ``tools`` name them, since each
search is billed. Any other name (``Task``) is a tool orchmode does not have: a warning. Everything
here is pure apart from reading the files, so a session reads them once and its Workflow
tool's description (see :func:`describe_roles`) stays the same for the whole session.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal, cast, get_args

import yaml

from .errors import ConfigError
from .front_matter import LineError, read_front_matter
from .pricing import model_id
from .settings import Effort, Isolation, Settings
from .web_tools import WEB_TOOLS
from .wire import ToolSchema

#: Where a project's and a user's definitions live, as in Claude Code.
AGENTS_SUBDIR = Path(".claude") / "agents"
#: A role's name: lowercase letters and digits in words joined by hyphens, as Claude Code
#: asks, or by dots, as names with a version in them do (``powershell-5.1-expert``).
NAME = re.compile(r"[a-z0-9]+(?:[-.][a-z0-9]+)*")
#: The front matter's fence: a line of three hyphens (trailing blanks allowed).
FENCE = "---"
#: Always allowed, whatever ``tools`` says: it is how a subagent hands back its result.
ALWAYS_ALLOWED = "report_findings"
#: A comma in a ``tools`` string separates names, except inside parentheses (``Bash(a, b)``).
TOOL_SEPARATOR = re.compile(r",(?![^(]*\))")
#: Claude Code's tools that change files: here, bash does that.
WRITING_TOOLS = frozenset({"bash", "edit", "write", "multiedit", "notebookedit"})
#: Claude Code's tools that only read files: here, bash that cannot write the tree.
READING_TOOLS = frozenset({"read", "grep", "glob", "ls", "notebookread"})
#: The API's web tools by their names there, to Claude Code's names for them (lower-cased).
WEB_TOOL_NAMES = {api: claude for claude, api in WEB_TOOLS.items()}
#: A Claude Code entry that allows some bash commands only: ``Bash(git diff:*)``.
BASH_COMMANDS = re.compile(r"bash\(.*\)", re.IGNORECASE | re.DOTALL)

#: What a role's shell may do: write the tree, only read it, or there is no shell.
ShellAccess = Literal["write", "read", "none"]

EFFORTS: tuple[str, ...] = get_args(Effort)
ISOLATIONS: tuple[str, ...] = get_args(Isolation)


@dataclass(frozen=True)
class AgentDefinition:
    """One role, normalised: what a subtask naming it runs with."""

    name: str
    description: str
    #: The tools (names or shell patterns) the role may use; None means every tool.
    tools: tuple[str, ...] | None
    #: The model ID; None means the worker's own (``inherit``, or no ``model`` key).
    model: str | None
    effort: Effort | None
    isolation: Isolation | None
    instructions: str
    path: Path
    #: False: no verifier checks this role's results.
    verify: bool = True

    @property
    def digest(self) -> str:
        """A sha256 over what changes an agent's behaviour, for the journal key.

        The description is left out (it is what the main agent reads, not the worker), and
        so are the path and any keys orchmode does not read, so moving a file or recolouring
        it in Claude Code does not run its agents again.
        """
        normalised = {
            "name": self.name,
            "tools": list(self.tools) if self.tools is not None else None,
            "model": self.model,
            "effort": self.effort,
            "isolation": self.isolation,
            "verify": self.verify,
            "instructions": self.instructions,
        }
        text = json.dumps(normalised, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def shell(self) -> ShellAccess:
        """What the role's bash may do, read from ``tools`` (see the module's docstring)."""
        if self.tools is None or any(
            fnmatchcase(tool, entry.lower()) for entry in self.tools for tool in WRITING_TOOLS
        ):
            return "write"
        for entry in self.tools:
            lowered = entry.lower()
            if BASH_COMMANDS.fullmatch(lowered) or any(
                fnmatchcase(tool, lowered) for tool in READING_TOOLS
            ):
                return "read"
        return "none"

    def unknown_tools(self) -> list[str]:
        """The entries of ``tools`` that name nothing orchmode has, in the order written."""
        return [entry for entry in self.tools or () if not _known(entry)]

    def offered(self, tools: Sequence[ToolSchema]) -> list[ToolSchema]:
        """The tools, of those a subagent has, that this role's agents are given."""
        access = self.shell
        return [
            tool
            for tool in tools
            if (tool["name"] == "bash" and access != "none")
            or (tool["name"] != "bash" and self.allows(str(tool["name"])))
        ]

    def allows(self, tool: str) -> bool:
        """Whether this role may use ``tool``.

        Entries are shell patterns (``mcp__github__*``). orchmode's own tools are matched
        without regard to case, since Claude Code writes ``Bash`` for what orchmode calls
        ``bash``; MCP tools (``mcp__server__tool``) are their servers' names and match exactly.
        The web tools (``web_search``) go by Claude Code's names (``WebSearch``) and only to a
        role whose ``tools`` name them.
        """
        if tool in WEB_TOOL_NAMES:
            claude = WEB_TOOL_NAMES[tool]
            return any(fnmatchcase(claude, entry.lower()) for entry in self.tools or ())
        if self.tools is None or tool == ALWAYS_ALLOWED:
            return True
        if tool.startswith("mcp__"):
            return any(fnmatchcase(tool, entry) for entry in self.tools)
        return any(fnmatchcase(tool.lower(), entry.lower()) for entry in self.tools)


def _known(entry: str) -> bool:
    """Whether a ``tools`` entry names (or matches) something orchmode has or reads."""
    lowered = entry.lower()
    if lowered == ALWAYS_ALLOWED or lowered.startswith("mcp__") or BASH_COMMANDS.fullmatch(lowered):
        return True
    known = (*WRITING_TOOLS, *READING_TOOLS, *WEB_TOOLS)
    return any(fnmatchcase(tool, lowered) for tool in known)


class _Bad(Exception):
    """A file that cannot be a definition: what is wrong and the 1-based line of the file."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(what)
        self.line = line
        self.what = what


def load_definitions(
    workdir: Path, home: Path | None = None, extra: Path | None = None
) -> tuple[dict[str, AgentDefinition], list[str]]:
    """Every definition by name, and a one-line warning for each file that is not one.

    ``home`` defaults to the user's home directory; ``extra`` is ``agents_dir``, taken
    relative to ``workdir``. Precedence on a name clash: ``extra`` over the working
    directory's ``.claude/agents/`` over ``~/.claude/agents/``. Within one directory a
    second file with a name already used is a warning, and the first (in sorted order) stays.
    """
    home = Path.home() if home is None else home
    directories = [home / AGENTS_SUBDIR, workdir / AGENTS_SUBDIR]
    warnings: list[str] = []
    if extra is not None:
        extra = workdir / extra
        if extra.is_dir():
            directories.append(extra)
        else:
            shown = _shown(extra, workdir, home)
            warnings.append(f"agents_dir {shown}: not a directory")
    definitions: dict[str, AgentDefinition] = {}
    seen: set[Path] = set()
    for directory in directories:
        if not directory.is_dir():  # also a link that leads nowhere, so resolve() is safe
            continue
        resolved = directory.resolve()
        if resolved in seen:
            continue
        seen.add(resolved)
        found, found_warnings = _load_directory(directory, workdir, home)
        definitions.update(found)
        warnings.extend(found_warnings)
    return definitions, warnings


def describe_roles(definitions: Mapping[str, AgentDefinition]) -> str:
    """The roles as the Workflow tool's description lists them: ``name: description`` lines.

    Sorted by name, so the text (and with it the prompt cache) is the same however the
    files were found; "" when there are none.
    """
    return "\n".join(f"{name}: {definitions[name].description}" for name in sorted(definitions))


def _parse(
    text: str, path: Path, notes: list[str]
) -> tuple[AgentDefinition, dict[str, int], _Bad | None]:
    """One file's text as a definition, the lines of its ``name`` and ``tools``, and the
    YAML error its front matter was read line by line past (None when YAML read it);
    :class:`_Bad` if it is not a definition. What it lacked and was given is added to
    ``notes``."""
    # Lines as an editor numbers them; Windows line ends do not make another definition.
    lines = text.replace("\r\n", "\n").split("\n")
    if not lines or lines[0].rstrip() != FENCE:
        raise _Bad(1, "no front matter: the file must begin with a line '---'")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == FENCE), None)
    if end is None:
        raise _Bad(1, "front matter not closed: no line '---' after this one")
    front = "\n".join(lines[1:end])
    try:
        data, key_lines = _front_matter(front)
        forgiven = None
    except _Bad as yaml_error:
        forgiven = yaml_error
        data, key_lines = _line_by_line(front, yaml_error)
    if data is None:
        raise _Bad(1, "empty front matter: a definition needs a name or a description")
    if not isinstance(data, dict):
        raise _Bad(2, "front matter is not a mapping of keys to values")
    instructions = "\n".join(lines[end + 1 :]).strip()
    try:
        definition = _definition(data, key_lines, instructions, path, notes)
    except _Bad as bad:
        if forgiven is None:
            raise
        raise _still_bad(forgiven, bad.line, bad.what) from None
    return (
        definition,
        {"name": key_lines.get("name", 1), "tools": key_lines.get("tools", 1)},
        forgiven,
    )


def _definition(
    data: Mapping[str, Any],
    key_lines: Mapping[str, int],
    instructions: str,
    path: Path,
    notes: list[str],
) -> AgentDefinition:
    """The front matter's keys checked and normalised; :class:`_Bad` names the first bad one.
    A missing name is the file's, a missing description the instructions' first line (each
    said in ``notes``): only a file with neither is no definition."""

    def line_of(key: str) -> int:
        return key_lines.get(key, 1)

    name, description = data.get("name"), data.get("description")
    if name is None and _blank(description):
        raise _Bad(1, "no name and no description: nothing to call it by or choose it for")
    if name is None:
        name = _name_of_file(path)
        notes.append(f"line 1: no name, so it is named after its file: {name}")
    if not isinstance(name, str) or not NAME.fullmatch(name.strip()):
        raise _Bad(
            line_of("name"),
            f"name {name!r} is not lowercase letters, digits, hyphens and dots "
            "(like code-reviewer or dotnet-4.8-expert)",
        )
    if _blank(description):
        description = _first_line(instructions) or f"the {name.strip()} role"
        notes.append(
            f"line {line_of('description')}: no description, so "
            + ("its instructions' first line" if instructions else "its name")
            + " stands for it"
        )
    if not isinstance(description, str):
        raise _Bad(line_of("description"), "description must be a text")
    return AgentDefinition(
        name=name.strip(),
        description=" ".join(description.split()),
        tools=_tools(data.get("tools"), line_of("tools")),
        model=_model(data.get("model"), line_of("model")),
        effort=cast(Effort | None, _choice(data, "effort", EFFORTS, line_of("effort"))),
        isolation=cast(
            Isolation | None, _choice(data, "isolation", ISOLATIONS, line_of("isolation"))
        ),
        verify=_verify(data.get("verify", True), line_of("verify")),
        instructions=instructions,
        path=path,
    )


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _name_of_file(path: Path) -> str:
    """A role's name made of its file's: ``Security Reviewer.md`` is ``security-reviewer``."""
    return "-".join(re.findall(r"[a-z0-9]+(?:\.[a-z0-9]+)*", path.stem.lower())) or "unnamed"


def _first_line(text: str) -> str:
    """The first line of ``text`` that says something, headings' marks dropped, in short."""
    for line in text.splitlines():
        words = " ".join(line.strip().lstrip("#").split())
        if words:
            return words if len(words) <= 200 else words[:199] + "…"
    return ""


def _line_by_line(front: str, yaml_error: _Bad) -> tuple[dict[str, Any], dict[str, int]]:
    """The front matter read by its ``key: value`` lines, as its author meant them, after
    YAML refused it; :class:`_Bad` (the YAML error, and why this failed too) if it cannot be."""
    try:
        values, key_lines = read_front_matter(front)
    except LineError as error:
        # the front matter starts on the file's second line
        raise _still_bad(yaml_error, error.line + 1, error.what) from None
    return dict(values), {key: line + 1 for key, line in key_lines.items()}


def _still_bad(yaml_error: _Bad, line: int, what: str) -> _Bad:
    """A file that read line by line is no definition either: skipped for its YAML error,
    the first cause, with what the line-by-line reading found at ``line``."""
    return _Bad(yaml_error.line, f"{yaml_error.what}; read line by line, line {line}: {what}")


def _front_matter(front: str) -> tuple[Any, dict[str, int]]:
    """The parsed front matter and the file line of each top-level key.

    The front matter starts on the file's second line, so a YAML mark's 0-based line is
    the file's line minus 2.
    """
    try:
        loader = yaml.SafeLoader(front)  # it checks the characters at once
    except yaml.reader.ReaderError as error:
        line = front[: error.position].count("\n") + 2
        raise _Bad(line, f"front matter is not valid YAML: {error.reason}") from None
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = 1 if mark is None else mark.line + 2
        what = " ".join(str(error.problem or error.context or "not valid YAML").split())
        raise _Bad(line, f"front matter is not valid YAML: {what}") from None
    except yaml.YAMLError as error:
        raise _Bad(1, f"front matter is not valid YAML: {' '.join(str(error).split())}") from None
    finally:
        loader.dispose()
    key_lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode):
                key_lines.setdefault(str(key.value), key.start_mark.line + 2)
    return data, key_lines


def _tools(value: object, line: int) -> tuple[str, ...] | None:
    """``tools`` as a tuple of names in the order written, each once; None for all."""
    if value is None:
        return None
    if isinstance(value, str):
        names = [name.strip() for name in TOOL_SEPARATOR.split(value)]
    elif isinstance(value, list) and all(isinstance(name, str) for name in value):
        names = [name.strip() for name in value]
    else:
        raise _Bad(line, "tools must be a comma-separated list or a YAML list of tool names")
    return tuple(dict.fromkeys(name for name in names if name))


def _model(value: object, line: int) -> str | None:
    """``model`` as a model ID: aliases resolved, ``inherit`` (or no key) as None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _Bad(line, "model must be an alias (opus, sonnet, haiku), a model ID or inherit")
    if value.strip().lower() == "inherit":
        return None
    return model_id(value)


def _choice(data: Mapping[str, object], key: str, allowed: tuple[str, ...], line: int) -> Any:
    value = data.get(key)
    if value is None or (isinstance(value, str) and value in allowed):
        return value
    raise _Bad(line, f"{key} must be one of {', '.join(allowed)}, not {value!r}")


def _verify(value: object, line: int) -> bool:
    if isinstance(value, bool):
        return value
    raise _Bad(line, f"verify must be true or false, not {value!r}")


def _load_directory(
    directory: Path, workdir: Path, home: Path
) -> tuple[dict[str, AgentDefinition], list[str]]:
    """One directory's definitions by name, and its warnings; a name used twice keeps the first."""
    definitions: dict[str, AgentDefinition] = {}
    warnings: list[str] = []
    try:
        files = sorted(path for path in directory.glob("*.md") if path.is_file())
    except OSError as error:
        shown = _shown(directory, workdir, home)
        return {}, [f"{shown}: cannot be read: {error.strerror or error}"]
    for path in files:
        shown = _shown(path, workdir, home)
        try:
            notes: list[str] = []
            definition, lines, forgiven = _parse(_read(path), path, notes)
            if definition.name in definitions:
                first = _shown(definitions[definition.name].path, workdir, home)
                raise _Bad(lines["name"], f"name {definition.name!r} is already defined in {first}")
        except _Bad as bad:
            warnings.append(f"{shown} line {bad.line}: {bad.what}")
            continue
        definitions[definition.name] = definition
        warnings.extend(f"{shown} {note}" for note in notes)
        if forgiven is not None:
            warnings.append(
                f"{shown} line {forgiven.line}: {forgiven.what}, so it was read line by line"
            )
        note = _tools_note(definition)
        if note:
            warnings.append(f"{shown} line {lines['tools']}: {note}")
    return definitions, warnings


def _tools_note(definition: AgentDefinition) -> str:
    """What a loaded role's ``tools`` ask for that orchmode cannot give as asked; "" if none."""
    notes = []
    unknown = definition.unknown_tools()
    if unknown:
        notes.append(
            f"{', '.join(unknown)} {'is not a tool' if len(unknown) == 1 else 'are not tools'} "
            "orchmode has, so its agents go without"
        )
    patterns = [entry for entry in definition.tools or () if BASH_COMMANDS.fullmatch(entry)]
    if patterns and definition.shell == "read":
        notes.append(
            f"{', '.join(patterns)}: orchmode cannot hold bash to some commands, so this "
            "role's bash cannot write the tree"
        )
    return "; ".join(notes)


def _read(path: Path) -> str:
    """The file as text (a byte-order mark dropped); unreadable or non-UTF-8 is :class:`_Bad`."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise _Bad(1, f"cannot be read: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise _Bad(line, "not UTF-8 text") from None


def _shown(path: Path, workdir: Path, home: Path) -> str:
    """A path as the user thinks of it: relative to the working directory, or under ``~``."""
    for base, prefix in ((workdir, ""), (home, "~/")):
        try:
            return prefix + path.relative_to(base).as_posix()
        except ValueError:
            continue
    return str(path)


def check_role_prices(roles: Mapping[str, AgentDefinition], settings: Settings) -> None:
    """Under a cost cap, a role whose model has no price is an error before anything runs,
    as the settings' own models are."""
    if settings.max_cost is None:
        return
    for role in roles.values():
        if role.model is not None and settings.price(role.model) is None:
            raise ConfigError(
                f"max_cost needs a price for {role.model}, the model of agent "
                f"{role.name!r} ({role.path}) — add one to the prices setting"
            )
