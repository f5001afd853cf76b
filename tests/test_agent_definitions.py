"""Agent definitions: Claude Code's files read as roles; a bad file is one warning, not a crash."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmode.core.agents import AgentDefinition, describe_roles, load_definitions
from orchmode.core.settings import Settings

REVIEWER = """\
---
name: code-reviewer
description: Reviews a change for bugs. Use after every edit.
tools: Read, Grep, Bash, mcp__github__*
model: sonnet
color: blue
---

You are a careful reviewer.

Report every bug you find.
"""


def write(directory: Path, filename: str, text: str | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def agent_file(name: str = "worker", body: str = "Do the work.", **keys: str) -> str:
    front = {"name": name, "description": f"The {name}.", **keys}
    return "---\n" + "".join(f"{k}: {v}\n" for k, v in front.items()) + "---\n" + body + "\n"


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A working directory and a home directory, both empty."""
    (tmp_path / "work").mkdir()
    (tmp_path / "home").mkdir()
    return tmp_path / "work", tmp_path / "home"


def load(workdir: Path, home: Path, extra: Path | None = None) -> dict[str, AgentDefinition]:
    definitions, warnings = load_definitions(workdir, home=home, extra=extra)
    assert warnings == []
    return definitions


def project(workdir: Path) -> Path:
    return workdir / ".claude" / "agents"


# --- Claude Code's format -------------------------------------------------------------------


def test_a_claude_code_file_is_read_with_a_comma_list_of_tools(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    path = write(project(workdir), "code-reviewer.md", REVIEWER)
    (reviewer,) = load(workdir, home).values()
    assert reviewer == AgentDefinition(
        name="code-reviewer",
        description="Reviews a change for bugs. Use after every edit.",
        tools=("Read", "Grep", "Bash", "mcp__github__*"),
        model="claude-sonnet-5-5",
        effort=None,
        isolation=None,
        instructions="You are a careful reviewer.\n\nReport every bug you find.",
        path=path,
        verify=True,
    )


def test_a_yaml_list_of_tools_and_orchmodes_own_keys(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(
        project(workdir),
        "tester.md",
        "---\nname: tester\ndescription: Runs the tests.\ntools:\n  - Bash\n  - mcp__ci__run\n"
        "model: claude-haiku-4-5\neffort: low\nisolation: shared\nverify: false\n---\nRun them.\n",
    )
    tester = load(workdir, home)["tester"]
    assert tester.tools == ("Bash", "mcp__ci__run")
    assert (tester.model, tester.effort, tester.isolation, tester.verify) == (
        "claude-haiku-4-5",
        "low",
        "shared",
        False,
    )


def test_no_tools_key_means_every_tool_and_an_empty_one_none(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(project(workdir), "a.md", agent_file("all-tools"))
    write(project(workdir), "b.md", agent_file("no-tools", tools="[]"))
    roles = load(workdir, home)
    assert roles["all-tools"].tools is None and roles["all-tools"].allows("mcp__x__y")
    assert roles["no-tools"].tools == ()
    assert not roles["no-tools"].allows("bash")
    assert roles["no-tools"].allows("report_findings")


@pytest.mark.parametrize(
    ("written", "model"),
    [
        ("inherit", None),
        ("Inherit", None),
        ("opus", "claude-opus-5-5"),
        ("haiku", "claude-haiku-4-5"),
        ("claude-sonnet-5", "claude-sonnet-5"),
        (None, None),
    ],
)
def test_model_inherit_an_alias_or_a_full_id(
    dirs: tuple[Path, Path], written: str | None, model: str | None
) -> None:
    workdir, home = dirs
    keys = {} if written is None else {"model": written}
    write(project(workdir), "w.md", agent_file(**keys))
    assert load(workdir, home)["worker"].model == model


def test_only_md_files_directly_in_the_directory_are_read(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(project(workdir), "top.md", agent_file("top"))
    write(project(workdir) / "nested", "deep.md", agent_file("deep"))
    write(project(workdir), "notes.txt", agent_file("text"))
    assert set(load(workdir, home)) == {"top"}


def test_windows_line_ends_and_a_byte_order_mark_read_the_same(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(project(workdir), "a.md", b"\xef\xbb\xbf" + REVIEWER.replace("\n", "\r\n").encode())
    crlf = load(workdir, home)["code-reviewer"]
    write(project(workdir), "a.md", REVIEWER)
    assert crlf == load(workdir, home)["code-reviewer"]


# --- Where they are read from ---------------------------------------------------------------


def test_the_working_directory_beats_home_and_agents_dir_beats_both(
    dirs: tuple[Path, Path],
) -> None:
    workdir, home = dirs
    write(home / ".claude" / "agents", "r.md", agent_file("reviewer", "home's"))
    write(home / ".claude" / "agents", "h.md", agent_file("home-only"))
    assert load(workdir, home)["reviewer"].instructions == "home's"
    write(project(workdir), "r.md", agent_file("reviewer", "project's"))
    roles = load(workdir, home)
    assert roles["reviewer"].instructions == "project's"
    assert set(roles) == {"reviewer", "home-only"}
    write(workdir / "roles", "r.md", agent_file("reviewer", "agents_dir's"))
    assert load(workdir, home, Path("roles"))["reviewer"].instructions == "agents_dir's"
    assert load(workdir, home, workdir / "roles")["reviewer"].instructions == "agents_dir's"


def test_a_missing_agents_dir_is_a_warning(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(project(workdir), "w.md", agent_file())
    definitions, warnings = load_definitions(workdir, home=home, extra=Path("nowhere"))
    assert set(definitions) == {"worker"}
    assert warnings == ["agents_dir nowhere: not a directory"]


def test_one_directory_named_twice_is_read_once(dirs: tuple[Path, Path]) -> None:
    workdir, _ = dirs
    write(project(workdir), "w.md", agent_file())
    assert set(load(workdir, workdir, project(workdir))) == {"worker"}


def test_no_directories_no_definitions(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    assert load_definitions(workdir, home=home) == ({}, [])


def test_agents_dir_is_a_setting() -> None:
    assert Settings().agents_dir is None
    assert Settings(agents_dir=Path("roles")).agents_dir == Path("roles")


# --- Bad files ------------------------------------------------------------------------------

GOOD = agent_file("good")

BAD: dict[str, tuple[str | bytes, int, str]] = {
    # file text, the line the warning names, and words it says
    "no-front-matter": ("Just instructions.\n", 1, "no front matter"),
    "empty-file": ("", 1, "no front matter"),
    "unterminated": ("---\nname: x\ndescription: y\nBody.\n", 1, "not closed"),
    "bad-yaml": ("---\nname: x\ndescription: y\ntools: [Read, Bash\n---\n", 4, "not valid YAML"),
    "bad-indent": ("---\nname: x\n  description: y\n---\n", 3, "not valid YAML"),
    "tab": ("---\nname: x\ndescription: y\n\tmodel: opus\n---\n", 4, "not valid YAML"),
    "empty-front-matter": ("---\n---\nBody.\n", 1, "empty front matter"),
    "a-list": ("---\n- name\n- description\n---\n", 2, "not a mapping"),
    "a-string": ("---\njust words\n---\n", 2, "not a mapping"),
    "no-name-nor-description": ("---\ncolor: red\n---\nBody.\n", 1, "no name and no description"),
    "list-description": ("---\nname: x\ndescription: [a, b]\n---\n", 3, "description"),
    "empty-name": ("---\ndescription: y\nname: ''\n---\n", 3, "name ''"),
    "upper-name": ("---\ndescription: y\nname: Code_Reviewer\n---\n", 3, "lowercase"),
    "number-name": ("---\ncolor: red\nname: 42\ndescription: y\n---\n", 3, "name 42"),
    "bad-tools": ("---\nname: x\ndescription: y\ntools: {a: 1}\n---\n", 4, "tools"),
    "number-tool": ("---\nname: x\ndescription: y\ntools: [Bash, 3]\n---\n", 4, "tools"),
    "bad-model": ("---\nname: x\ndescription: y\nmodel: [opus]\n---\n", 4, "model"),
    "empty-model": ("---\nname: x\ndescription: y\nmodel: ''\n---\n", 4, "model"),
    "bad-effort": ("---\nname: x\ndescription: y\n\neffort: extreme\n---\n", 5, "effort"),
    "bad-isolation": ("---\nname: x\ndescription: y\nisolation: docker\n---\n", 4, "isolation"),
    "string-verify": ("---\nname: x\ndescription: y\nverify: 'no'\n---\n", 4, "verify"),
    "number-verify": ("---\nname: x\ndescription: y\nverify: 0\n---\n", 4, "verify"),
    "not-utf8": (b"---\nname: x\ndescription: caf\xe9\n---\n", 3, "not UTF-8"),
    "duplicate": (agent_file("good").replace("name: good", "name:   good"), 2, "already defined"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_file_is_one_warning_naming_file_and_line(
    dirs: tuple[Path, Path], case: str
) -> None:
    workdir, home = dirs
    text, line, words = BAD[case]
    write(project(workdir), "a-good.md", GOOD)
    write(project(workdir), f"{case}.md", text)
    write(project(workdir), "z-other.md", agent_file("other"))
    definitions, warnings = load_definitions(workdir, home=home)
    assert set(definitions) == {"good", "other"}
    assert definitions["good"].path.name == "a-good.md"
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning.startswith(f".claude/agents/{case}.md line {line}: ")
    assert words in warning
    assert "\n" not in warning


def test_a_file_without_a_name_or_a_description_loads_with_one_made_and_a_line_saying_so(
    dirs: tuple[Path, Path],
) -> None:
    workdir, home = dirs
    write(project(workdir), "Security Reviewer.md", "---\ndescription: Finds holes\n---\nLook.\n")
    write(project(workdir), "terse.md", "---\nname: terse\n---\n\n# Reviews   the tests\nMore.\n")
    write(project(workdir), "bare.md", "---\nname: bare\ndescription: ''\n---\n")
    definitions, warnings = load_definitions(workdir, home=home)
    assert set(definitions) == {"security-reviewer", "terse", "bare"}
    assert definitions["security-reviewer"].description == "Finds holes"
    assert definitions["terse"].description == "Reviews the tests"
    assert definitions["bare"].description == "the bare role"
    assert warnings == [
        ".claude/agents/Security Reviewer.md line 1: no name, so it is named after its file: "
        "security-reviewer",
        ".claude/agents/bare.md line 3: no description, so its name stands for it",
        ".claude/agents/terse.md line 1: no description, so its instructions' first line "
        "stands for it",
    ]


def test_a_warning_names_a_home_file_under_tilde(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(home / ".claude" / "agents", "broken.md", "no front matter\n")
    _, warnings = load_definitions(workdir, home=home)
    assert warnings == [
        "~/.claude/agents/broken.md line 1: no front matter: the file must begin with a line '---'"
    ]


def test_an_unreadable_file_is_a_warning(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir, home = dirs
    write(project(workdir), "good.md", agent_file("good"))
    locked = write(project(workdir), "locked.md", agent_file("locked"))
    (project(workdir) / "dangling.md").symlink_to(workdir / "nowhere.md")
    read_bytes = Path.read_bytes

    def refuse(path: Path) -> bytes:
        if path == locked:  # tests may run as root, who can read a file without permissions
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    definitions, warnings = load_definitions(workdir, home=home)
    assert set(definitions) == {"good"}
    # A dangling link is no file, and passed over like a directory would be.
    assert warnings == [".claude/agents/locked.md line 1: cannot be read: Permission denied"]


def test_a_same_name_in_another_directory_is_no_warning(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(home / ".claude" / "agents", "a.md", agent_file("same"))
    write(project(workdir), "b.md", agent_file("same"))
    assert set(load(workdir, home)) == {"same"}


# --- Tools ----------------------------------------------------------------------------------


def role(tools: tuple[str, ...] | None) -> AgentDefinition:
    return AgentDefinition(
        name="r",
        description="d",
        tools=tools,
        model=None,
        effort=None,
        isolation=None,
        instructions="",
        path=Path("r.md"),
    )


def test_allows_matches_patterns_and_bash_in_any_case() -> None:
    reviewer = role(("Bash", "mcp__github__*", "mcp__ci__run"))
    assert reviewer.allows("bash")
    assert reviewer.allows("mcp__github__create_issue")
    assert reviewer.allows("mcp__ci__run")
    assert not reviewer.allows("mcp__ci__deploy")
    assert not reviewer.allows("mcp__GitHub__create_issue")
    assert not reviewer.allows("Workflow")
    assert reviewer.allows("report_findings")
    assert role(("bash",)).allows("bash") and role(("BASH",)).allows("bash")
    assert not role(("Read", "Grep")).allows("bash")
    assert not role(("MCP__github__*",)).allows("mcp__github__x")
    assert role(None).allows("anything") and role(()).allows("report_findings")


@pytest.mark.parametrize(
    ("tools", "shell"),
    [
        (None, "write"),
        (("Bash",), "write"),
        (("Read", "Edit"), "write"),
        (("Write",), "write"),
        (("*",), "write"),
        (("Read", "Grep", "Glob"), "read"),
        (("LS", "mcp__github__*"), "read"),
        (("Bash(git diff:*)",), "read"),
        (("bash(npm test, npm run lint)",), "read"),
        (("mcp__docs__*",), "none"),
        (("WebSearch", "Task"), "none"),
        ((), "none"),
    ],
)
def test_claude_codes_file_tools_choose_the_roles_shell(
    tools: tuple[str, ...] | None, shell: str
) -> None:
    assert role(tools).shell == shell


def test_a_role_is_offered_bash_as_its_shell_says_and_mcp_tools_as_written() -> None:
    tools = [{"name": "bash"}, {"name": "report_findings"}, {"name": "mcp__docs__search"}]
    tools += [{"name": "mcp__ci__deploy"}]

    def names(entries: tuple[str, ...] | None) -> list[str]:
        return [str(t["name"]) for t in role(entries).offered(tools)]

    assert names(None) == ["bash", "report_findings", "mcp__docs__search", "mcp__ci__deploy"]
    assert names(("Read", "mcp__docs__*")) == ["bash", "report_findings", "mcp__docs__search"]
    assert names(("mcp__ci__deploy",)) == ["report_findings", "mcp__ci__deploy"]
    assert names(()) == ["report_findings"]


def test_tools_orchmode_lacks_or_cannot_hold_to_are_one_warning(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(
        project(workdir),
        "a.md",
        agent_file("looker", tools="Read, Task, Bash(git diff:*), TodoWrite"),
    )
    write(project(workdir), "b.md", agent_file("fine", tools="Read, Grep, mcp__x__*"))
    definitions, warnings = load_definitions(workdir, home=home)
    assert set(definitions) == {"looker", "fine"}  # loaded all the same
    assert warnings == [
        ".claude/agents/a.md line 4: Task, TodoWrite are not tools orchmode has, so its "
        "agents go without; Bash(git diff:*): orchmode cannot hold bash to some commands, so "
        "this role's bash cannot write the tree"
    ]


# --- The Workflow tool's description --------------------------------------------------------


def test_describe_roles_is_sorted_by_name_whatever_the_order_found(
    dirs: tuple[Path, Path],
) -> None:
    workdir, home = dirs
    write(project(workdir), "1.md", agent_file("zeta"))
    write(project(workdir), "2.md", agent_file("alpha"))
    write(home / ".claude" / "agents", "0.md", agent_file("mid"))
    roles = load(workdir, home)
    text = describe_roles(roles)
    assert text == "alpha: The alpha.\nmid: The mid.\nzeta: The zeta."
    assert describe_roles(dict(reversed(list(roles.items())))) == text
    assert describe_roles({}) == ""


def test_a_multi_line_description_is_one_line_of_the_list(dirs: tuple[Path, Path]) -> None:
    workdir, home = dirs
    write(project(workdir), "a.md", "---\nname: a\ndescription: >\n  one\n  two\n\n  three\n---\n")
    assert describe_roles(load(workdir, home)) == "a: one two three"


# --- The digest -----------------------------------------------------------------------------


def digest_of(workdir: Path, home: Path, text: str) -> str:
    write(project(workdir), "a.md", text)
    (definition,) = load(workdir, home).values()
    return definition.digest


def test_the_digest_follows_what_the_agent_runs_with_and_nothing_else(
    dirs: tuple[Path, Path],
) -> None:
    workdir, home = dirs
    base = digest_of(workdir, home, agent_file())
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    changed = {
        "name": agent_file("other"),
        "body": agent_file(body="Do other work."),
        "tools": agent_file(tools="Bash"),
        "no tools": agent_file(tools="[]"),
        "model": agent_file(model="haiku"),
        "effort": agent_file(effort="high"),
        "isolation": agent_file(isolation="shared"),
        "verify": agent_file(verify="false"),
    }
    digests = {key: digest_of(workdir, home, text) for key, text in changed.items()}
    assert base not in digests.values()
    assert len(set(digests.values())) == len(digests)
    same = [
        agent_file(color="red"),
        agent_file(permissionMode="plan", maxTurns="3"),
        agent_file(model="inherit"),
        agent_file(verify="true"),
        agent_file(body="\n\nDo the work.\n\n"),
        agent_file().replace("description: The worker.", "description: Anything else."),
    ]
    assert {digest_of(workdir, home, text) for text in same} == {base}
    assert digest_of(workdir, home, agent_file(model="opus")) == digest_of(
        workdir, home, agent_file(model="claude-opus-5-5")
    )


# --- Properties -----------------------------------------------------------------------------

#: Words YAML reads as something other than text in a list (``- on`` is true), not tool names.
YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "y", "n"}
TOOL_NAME = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}(\*)?", fullmatch=True).filter(
    lambda name: name.lower() not in YAML_WORDS
)


def load_text(text: str | bytes) -> tuple[dict[str, AgentDefinition], list[str]]:
    with tempfile.TemporaryDirectory() as temp:
        workdir = Path(temp)
        write(project(workdir), "a.md", text)
        return load_definitions(workdir, home=workdir / "no-home")


@settings(max_examples=60, deadline=None)
@given(st.lists(TOOL_NAME, max_size=8))
def test_tools_as_a_comma_string_or_a_yaml_list_are_the_same_tuple(names: list[str]) -> None:
    comma = agent_file(tools=", ".join(names)) if names else agent_file(tools="''")
    flow = agent_file(tools="[" + ", ".join(names) + "]")
    block = agent_file(tools="\n" + "\n".join(f"  - {n}" for n in names) if names else "[]")
    read = [load_text(text)[0]["worker"].tools for text in (comma, flow, block)]
    assert read == [tuple(dict.fromkeys(names))] * 3


BODY = st.text(st.characters(exclude_categories=("Cs",)), max_size=200)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        BODY,
        st.builds(lambda front, body: f"---\n{front}\n---\n{body}", BODY, BODY),
        st.binary(max_size=100),
        st.builds(lambda body: f"---\n{body}", BODY),
    )
)
def test_any_file_is_a_definition_or_one_warning(text: str | bytes) -> None:
    definitions, warnings = load_text(text)
    assert len(definitions) + len(warnings) == 1
    for warning in warnings:
        assert re.match(r"\.claude/agents/a\.md line [1-9]\d*: \S", warning)
        assert "\n" not in warning


@settings(max_examples=100, deadline=None)
@given(BODY)
def test_any_body_loads_as_the_instructions(body: str) -> None:
    definitions, warnings = load_text(agent_file(body=body))
    assert warnings == []
    assert definitions["worker"].instructions == body.replace("\r\n", "\n").strip()
