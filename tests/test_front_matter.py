"""The line-by-line front matter reader: values as their authors wrote them, where YAML refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from orchmode.core.agents import load_definitions
from orchmode.core.front_matter import LineError, read_front_matter

KEY = st.from_regex(r"[a-z][a-z_-]{0,11}", fullmatch=True)
#: Words of a value, with the colons and quotes that make YAML refuse a one-line description.
WORD = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.,;:!?()'\"<>/-]{0,11}", fullmatch=True)
WORDS = st.lists(WORD, min_size=1, max_size=8).map(" ".join)
ITEM = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,15}(\([a-z ,:*]{0,10}\))?", fullmatch=True)


def plain(value: str) -> bool:
    """Whether a value is read as the text itself: no wrapping quotes, no boolean or null word."""
    wrapped = len(value) > 1 and value[0] == value[-1] and value[0] in "'\""
    return not wrapped and value not in {"true", "false", "True", "False", "null", "Null"}


@given(st.dictionaries(KEY, WORDS, min_size=1, max_size=6))
def test_one_line_values_are_taken_as_written(front: dict[str, str]) -> None:
    assume(all(plain(value) for value in front.values()))
    text = "".join(f"{key}: {value}\n" for key, value in front.items())
    values, lines = read_front_matter(text)
    assert values == front
    assert list(lines.values()) == list(range(1, len(front) + 1))


@given(st.dictionaries(KEY, st.from_regex(r"[A-Za-z][A-Za-z0-9 .,()-]{0,30}", fullmatch=True)))
def test_where_yaml_reads_a_plain_value_both_readers_agree(front: dict[str, str]) -> None:
    text = "".join(f"{key}: {value}\n" for key, value in front.items())
    expected = yaml.safe_load(text) or {}
    # YAML 1.1 reads yes/no/on/off as booleans, keys too: only plain text on both sides
    assume(all(isinstance(key, str) and isinstance(value, str) for key, value in expected.items()))
    assert read_front_matter(text)[0] == expected


@given(WORDS, st.sampled_from(["'", '"']))
def test_quotes_are_stripped_only_when_they_wrap_the_whole_value(value: str, quote: str) -> None:
    assume(quote not in value)
    assert read_front_matter(f"d: {quote}{value}{quote}\n")[0] == {"d": value}
    half = f"{quote}{value}{quote} and more"
    assert read_front_matter(f"d: {half}\n")[0] == {"d": half}


@given(st.lists(WORDS, min_size=1, max_size=5), st.integers(1, 6))
def test_indented_lines_continue_the_key_above(lines: list[str], indent: int) -> None:
    assume(plain(lines[0]))
    text = "description: " + f"\n{' ' * indent}".join(lines) + "\nname: x"
    values, key_lines = read_front_matter(text)
    assert values == {"description": " ".join(lines), "name": "x"}
    assert key_lines == {"description": 1, "name": len(lines) + 1}


@given(st.lists(ITEM, min_size=1, max_size=6), st.integers(0, 4))
def test_a_comma_list_a_flow_list_and_dash_items_give_the_same_names(
    items: list[str], indent: int
) -> None:
    dashes = "tools:\n" + "".join(f"{' ' * indent}- {item}\n" for item in items)
    flow = f"tools: [{', '.join(items)}]\n"
    assert read_front_matter(dashes)[0] == read_front_matter(flow)[0] == {"tools": items}
    assert read_front_matter(f"tools: {', '.join(items)}\n")[0] == {"tools": ", ".join(items)}


@given(st.lists(WORDS, min_size=1, max_size=5), st.integers(1, 6))
def test_a_kept_block_keeps_its_lines_and_a_folded_one_joins_them(
    lines: list[str], indent: int
) -> None:
    body = "".join(f"{' ' * indent}{line}\n" for line in lines)
    kept = read_front_matter(f"d: |\n{body}e: 1")[0]
    folded = read_front_matter(f"d: >-\n{body}e: 1")[0]
    assert kept == {"d": "\n".join(lines) + "\n", "e": "1"}
    assert folded == {"d": " ".join(lines), "e": "1"}


@given(st.text(st.characters(codec="utf-8", exclude_characters="\r"), max_size=200))
def test_any_text_is_values_or_a_line_error(text: str) -> None:
    try:
        values, lines = read_front_matter(text)
    except LineError as error:
        assert 1 <= error.line <= text.count("\n") + 1
        assert "\n" not in error.what
    else:
        assert set(values) == set(lines)
        assert all(1 <= line <= text.count("\n") + 1 for line in lines.values())


def test_a_description_with_an_example_block_and_a_triggers_list() -> None:
    text = (
        "name: api-designer\n"
        "# a comment between keys\n"
        "description: Use this agent for APIs. Triggers on: 'rest', \"graphql\"\n"
        "  <example>\n"
        "  Context: the user wants an endpoint\n"
        "  user: 'Add GET /items'\n"
        "  assistant: I'll use the api-designer agent.\n"
        "  </example>\n"
        "tools: Read, mcp__github__create_issue, Bash(git diff:*)\n"
        "verify: false\n"
        "color:\n"
    )
    values, lines = read_front_matter(text)
    assert values == {
        "name": "api-designer",
        "description": "Use this agent for APIs. Triggers on: 'rest', \"graphql\" <example> "
        "Context: the user wants an endpoint user: 'Add GET /items' assistant: I'll use the "
        "api-designer agent. </example>",
        "tools": "Read, mcp__github__create_issue, Bash(git diff:*)",
        "verify": False,
        "color": None,
    }
    assert lines == {"name": 1, "description": 3, "tools": 9, "verify": 10, "color": 11}


def test_a_blank_line_inside_a_continued_value_is_a_line_break() -> None:
    values, _ = read_front_matter("d: one\n  two\n\n  three\n")
    assert values == {"d": "one two\nthree"}


def test_words_at_the_margin_that_start_no_key_go_on_from_the_line_above() -> None:
    text = "description: Use it for APIs. Examples:\n<example>\nuser: add an endpoint\n</example>\n"
    values, lines = read_front_matter(text)
    assert values == {
        "description": "Use it for APIs. Examples: <example>",
        "user": "add an endpoint </example>",
    }
    assert lines == {"description": 1, "user": 3}


def test_a_key_written_twice_keeps_its_last_value_and_first_line() -> None:
    assert read_front_matter("a: 1\nb: 2\na: 3\n") == ({"a": "3", "b": "2"}, {"a": 1, "b": 2})


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("name: x\n\tmodel: opus\n", 2, "tab"),
        ("tools: [Read, Bash\n", 1, "not closed"),
        ("tools: [Read,\n  Bash]\n", 1, "not closed"),
        ("tools: {a: 1}\n", 1, "mapping"),
        ("  name: x\n", 1, "no 'key: value' line above"),
        ("just words\nname: x\n", 1, "no 'key: value' line above"),
    ],
)
def test_what_cannot_be_read_as_meant_is_a_line_error(text: str, line: int, words: str) -> None:
    with pytest.raises(LineError) as raised:
        read_front_matter(text)
    assert raised.value.line == line
    assert words in raised.value.what


# --- As load_definitions uses it ------------------------------------------------------------


def test_a_file_yaml_refuses_loads_with_one_warning_naming_the_yaml_error(tmp_path: Path) -> None:
    agents = tmp_path / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "helm.md").write_text(
        "---\nname: helm-3.14-expert\ndescription: Charts. Triggers on: 'helm'\n"
        "tools:\n- Read\n- mcp__k8s__apply\nverify: false\neffort: low\n---\nChart it.\n"
    )
    definitions, warnings = load_definitions(tmp_path, home=tmp_path / "nobody")
    helm = definitions["helm-3.14-expert"]
    assert helm.description == "Charts. Triggers on: 'helm'"
    assert (helm.tools, helm.verify, helm.effort) == (("Read", "mcp__k8s__apply"), False, "low")
    assert helm.instructions == "Chart it."
    assert warnings == [
        ".claude/agents/helm.md line 3: front matter is not valid YAML: mapping values are not "
        "allowed here, so it was read line by line"
    ]


@pytest.mark.parametrize(
    ("front", "line", "after"),
    [
        ("summary: Triggers on: 'x'\n", 2, "no name and no description"),
        ("name: X Y\ndescription: Triggers on: 'x'\n", 3, "name 'X Y' is not lowercase"),
        ("name: x\ndescription: Triggers on: 'x'\n\tmodel: opus\n", 3, "a tab"),
        ("name: x\ndescription: Triggers on: 'x'\neffort: extreme\n", 3, "effort must be"),
    ],
)
def test_a_file_no_reading_makes_a_definition_of_is_skipped_for_its_yaml_error(
    tmp_path: Path, front: str, line: int, after: str
) -> None:
    agents = tmp_path / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "bad.md").write_text(f"---\n{front}---\nBody.\n")
    definitions, warnings = load_definitions(tmp_path, home=tmp_path / "nobody")
    assert definitions == {}
    (warning,) = warnings
    prefix = f".claude/agents/bad.md line {line}: front matter is not valid YAML: "
    assert warning.startswith(prefix) and "; read line by line, line " in warning
    assert after in warning and "\n" not in warning
