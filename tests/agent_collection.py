"""A made-up collection of 157 Claude Code agent definitions, in the shapes public ones have.

Public collections are written by many hands for Claude Code, and their front matter is
whatever Claude Code accepted at the time: one-line descriptions with ``Triggers on: 'x'``
in them, ``<example>`` blocks with ``Context:``/``user:``/``assistant:`` lines, ``|`` and
``>`` blocks, tools as a comma string or a YAML list (with MCP tool names, ``WebSearch`` and
``WebFetch``), names with a version in them, ``color`` keys, Windows line ends and a
byte-order mark. Each file here says what orchmode should read from it, so a test can check
every one; ``shapes`` names what is awkward about it, so a sample can cover every shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SIZE = 157
STEMS = (
    "python", "typescript", "rust", "golang", "java", "kotlin", "swift", "react", "vue",
    "angular", "django", "rails", "laravel", "spring", "graphql", "postgres", "redis", "kafka",
    "terraform", "kubernetes", "docker", "ansible", "aws", "azure", "gcp", "security",
    "performance", "accessibility", "i18n", "seo", "data", "ml", "llm", "mobile", "embedded",
    "blockchain", "game", "docs", "api", "qa",
)  # fmt: skip
KINDS = ("expert", "reviewer", "architect", "specialist")
#: Names with a version in them, as some collections have: index in the collection -> name.
DOTTED = {50: "dotnet-framework-4.8-expert", 51: "powershell-5.1-expert", 120: "python-3.12-pro"}
#: Descriptions that say ``Triggers on: '…'`` on their one line: YAML reads a mapping there.
TRIGGERS = (3, 21, 40, 58, 77, 96, 115)
#: The same, with a quoted word first, which YAML also refuses.
QUOTED_FIRST = (134,)
#: Descriptions whose ``<example>`` lines are indented under the key, not in a block.
INDENTED_EXAMPLES = (12, 49, 88, 140)
CRLF = (8, 40, 66, 101, 149)
BOM = 30
MODELS = ("sonnet", "opus", "haiku", "inherit", None)
COLORS = ("red", "blue", "green", "purple", "orange", "cyan", "yellow")
FILE_TOOLS = ("Read", "Write", "Edit", "Bash", "Glob", "Grep")
MCP_TOOLS = ("mcp__github__create_issue", "mcp__github__get_pull_request")
WEB_TOOLS = (("WebSearch",), ("WebFetch",), ("WebSearch", "WebFetch"))


@dataclass(frozen=True)
class CollectionFile:
    """One definition file and what orchmode should read from it."""

    filename: str
    content: bytes
    name: str
    #: As orchmode keeps it: the words of the text meant, one space between them.
    description: str
    tools: tuple[str, ...] | None
    #: As written (an alias, or ``inherit``); None when there is no ``model`` key.
    model: str | None
    instructions: str
    shapes: frozenset[str]
    #: Whether YAML refuses the front matter, so that orchmode reads it line by line.
    yaml_refuses: bool


def collection() -> list[CollectionFile]:
    """The 157 files, the same every time."""
    return [_file(index) for index in range(SIZE)]


def write_collection(directory: Path) -> list[CollectionFile]:
    """The collection's files written into ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = collection()
    for item in files:
        (directory / item.filename).write_bytes(item.content)
    return files


def sample(files: list[CollectionFile]) -> list[CollectionFile]:
    """A few files that between them have every shape of the collection, in its order."""
    chosen: dict[str, CollectionFile] = {}
    for item in files:
        for shape in sorted(item.shapes):
            chosen.setdefault(shape, item)
    return sorted(set(chosen.values()), key=files.index)


def _file(index: int) -> CollectionFile:
    stem, kind = STEMS[index % len(STEMS)], KINDS[index // len(STEMS)]
    name = DOTTED.get(index, f"{stem}-{kind}")
    shapes = {"dotted name"} if index in DOTTED else set()
    description, description_lines, refuses = _description(index, name, stem, kind, shapes)
    tools, tools_lines = _tools(index, shapes)
    model = MODELS[(index // 2) % len(MODELS)]
    front = [f"name: {name}", *description_lines, *tools_lines]
    if model is not None:
        front.append(f"model: {model}")
        shapes.add(f"model {model}")
    if index % 8 != 3:
        front.append(f"color: {COLORS[index % len(COLORS)]}")
    if index % 23 == 4:
        front.insert(1, "# kept in sync with the team's handbook")
        shapes.add("comment")
    instructions = (
        f"You are {name}, the {kind} for {stem} work.\n\n"
        f"## How you work\n\n1. Read the {stem} code the task touches.\n"
        f"2. Say what you would change, and why: one line each.\n\n"
        f"Sign every report with {name}/{index}."
    )
    text = "---\n" + "\n".join(front) + "\n---\n\n" + instructions + "\n"
    content = text.encode()
    if index in CRLF:
        content = text.replace("\n", "\r\n").encode()
        shapes.add("windows line ends" + (", read line by line" if refuses else ""))
    if index == BOM:
        content = b"\xef\xbb\xbf" + content
        shapes.add("byte-order mark")
    return CollectionFile(
        filename=f"{name}.md",
        content=content,
        name=name,
        description=" ".join(description.split()),
        tools=tools,
        model=model,
        instructions=instructions,
        shapes=frozenset(shapes),
        yaml_refuses=refuses,
    )


def _description(
    index: int, name: str, stem: str, kind: str, shapes: set[str]
) -> tuple[str, list[str], bool]:
    """The description meant, its front matter lines, and whether YAML refuses them."""
    lead = f"Use this agent as the {kind} for {stem}: design, review and fixes."
    example = [
        "<example>",
        f"Context: The user's {stem} service fails under load.",
        f'user: "Why does the {stem} service time out?"',
        f"assistant: I'll use the {name} agent to find out: it knows {stem}.",
        f"<commentary>A question about {stem}, so this agent answers it.</commentary>",
        "</example>",
    ]
    if index in TRIGGERS:
        shapes.add("triggers on")
        text = f"Use when working on {stem}. Triggers on: '{stem}', '{kind}', 'fix {stem}'"
        return text, [f"description: {text}"], True
    if index in QUOTED_FIRST:
        shapes.add("quoted word first")
        text = f"\"{stem.title()}\" {kind} for hard cases. Triggers on: '{stem}'"
        return text, [f"description: {text}"], True
    if index in INDENTED_EXAMPLES:
        shapes.add("indented example")
        lines = [f"description: {lead} Examples:", *(f"  {line}" for line in example)]
        return " ".join([lead, "Examples:", *example]), lines, True
    if index % 9 == 5:
        shapes.add("example in escapes")
        text = lead + " Examples:\n\n" + "\n".join(example)
        return text, [f"description: {json.dumps(text, ensure_ascii=False)}"], False
    if index % 11 == 7:
        shapes.add("kept block")
        lines = ["description: |", f"  {lead}", "", *(f"  {line}" for line in example)]
        return " ".join([lead, *example]), lines, False
    if index % 13 == 2:
        shapes.add("folded block")
        text = [f"Use this agent as the {kind} for {stem}.", "It knows the tools and the traps."]
        return " ".join(text), ["description: >", *(f"  {line}" for line in text)], False
    if index % 17 == 10:
        shapes.add("single quotes")
        text = f"The {stem} {kind}: it doesn't guess, it measures."
        return text, [f"description: '{text.replace(chr(39), chr(39) * 2)}'"], False
    text = f"Expert {stem} {kind}. Masters the {stem} ecosystem end to end."
    return text, [f"description: {text}"], False


def _tools(index: int, shapes: set[str]) -> tuple[tuple[str, ...] | None, list[str]]:
    """The tools meant and their front matter lines, in one of the ways people write them."""
    style = index % 6
    web = WEB_TOOLS[index // 5 % 3] if index % 5 == 2 and index != 152 else ()
    if style == 4 and not web:
        shapes.add("every tool")
        return None, []
    names = FILE_TOOLS[: 3 + index % 4] + (MCP_TOOLS[: 1 + index % 2] if style in (2, 5) else ())
    names += web
    if web:
        shapes.add("web tools")
    if style in (2, 5):
        shapes.add("mcp tools")
    if style == 1:
        shapes.add("tools as a yaml list")
        return names, ["tools:", *(f"  - {tool}" for tool in names)]
    if style == 5:
        shapes.add("tools as an unindented yaml list")
        return names, ["tools:", *(f"- {tool}" for tool in names)]
    if style == 3:
        shapes.add("tools as a flow list")
        return names, [f"tools: [{', '.join(names)}]"]
    return names, [f"tools: {', '.join(names)}"]
