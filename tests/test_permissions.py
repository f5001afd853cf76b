"""Permission rules in Claude Code's format: read from real settings files, applied to bash
commands as bash runs them, to domains and to MCP tools; ``--always`` answers remembered."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmode.core import trust
from orchmode.core.errors import ConfigError
from orchmode.core.permissions import (
    RULES_FILE,
    Decision,
    Rules,
    Verdict,
    parse_rule,
    remember,
    remembered_rules,
)
from orchmode.core.settings import Settings


def rules(deny: Iterable[str] = (), ask: Iterable[str] = (), allow: Iterable[str] = ()) -> Rules:
    """Rules as if read from one file, ``test``."""
    parsed = []
    for decision, texts in (("deny", deny), ("ask", ask), ("allow", allow)):
        for text in texts:
            rule = parse_rule(text, decision, "test")  # type: ignore[arg-type]
            assert not isinstance(rule, str), rule
            parsed.append(rule)
    return Rules(parsed)


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A project directory, a home directory, and an environment naming them."""
    project = tmp_path / "project"
    home = tmp_path / "home"
    (project / ".claude").mkdir(parents=True)
    (home / ".claude").mkdir(parents=True)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    return project, home, env


def write_claude(path: Path, **permissions: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"model": "opus", "permissions": permissions}))


def config_dir(env: dict[str, str]) -> Path:
    return Path(env["XDG_CONFIG_HOME"]) / "orchmode"


# --------------------------------------------------------------------------- rule forms


def test_a_bare_bash_rule_names_every_command() -> None:
    for text in ("Bash", "Bash(*)"):
        assert rules(ask=[text]).command("ls -l").decision == "ask"


def test_an_exact_rule_names_only_that_command() -> None:
    found = rules(deny=["Bash(npm test)"])
    assert found.command("npm test") == Verdict("deny", "Bash(npm test)", "test")
    assert found.command("npm  'test'").decision == "deny"  # as bash reads it
    assert found.command("npm test -x").decision == "allow"


def test_a_prefix_rule_stops_at_a_word_boundary() -> None:
    found = rules(deny=["Bash(npm test:*)"])
    assert found.command("npm test").decision == "deny"
    assert found.command("npm test -- -x").decision == "deny"
    assert found.command("npm testing").decision == "allow"
    assert found.command("npm").decision == "allow"


def test_the_wildcard_form_matches_as_claude_code_documents() -> None:
    spaced = rules(deny=["Bash(ls *)"])
    assert spaced.command("ls").decision == "deny"  # a lone trailing ` *` is optional
    assert spaced.command("ls -la").decision == "deny"
    assert spaced.command("lsof").decision == "allow"
    glued = rules(deny=["Bash(ls*)"])
    assert glued.command("lsof").decision == "deny"
    middle = rules(deny=["Bash(git * main)"])
    assert middle.command("git checkout main").decision == "deny"
    assert middle.command("git checkout dev").decision == "allow"


def test_rule_kinds_parse_as_documented() -> None:
    fetch = parse_rule(" WebFetch(domain: pypi.org) ", "allow", "s")
    assert not isinstance(fetch, str)
    assert (fetch.kind, fetch.value, fetch.text) == (
        "domain",
        "pypi.org",
        "WebFetch(domain: pypi.org)",
    )
    for text in ("mcp__github", "mcp__github__*", "mcp__github__get_issue"):
        mcp = parse_rule(text, "deny", "s")
        assert not isinstance(mcp, str) and mcp.kind == "mcp"
    for text in ("Read(./.env)", "Edit", "WebSearch", "NotebookEdit", "Frobnicate(x)"):
        assert isinstance(parse_rule(text, "deny", "s"), str)
    for text in ("Bash(", "Bash(echo 'open)", "Bash()x", "mcp__", "mcp__x(y)", "WebFetch(x.org)"):
        assert isinstance(parse_rule(text, "deny", "s"), str), text
    assert isinstance(parse_rule("WebFetch", "allow", "s"), str)  # would open every domain
    assert not isinstance(parse_rule("WebFetch", "deny", "s"), str)


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./=", min_size=1, max_size=8)


@given(
    program=st.from_regex(r"[a-z][a-z0-9_.-]{0,7}", fullmatch=True),
    words=st.lists(_WORD, max_size=4),
    suffix=st.sampled_from(["", ":*", " *"]),
)
def test_a_rule_reads_back_as_written(program: str, words: list[str], suffix: str) -> None:
    words = [program, *words]
    text = f"Bash({' '.join(words)}{suffix})"
    rule = parse_rule(text, "ask", "s")
    assert not isinstance(rule, str)
    assert rule.text == text
    assert rule.value == " ".join(words) + (" *" if suffix == " *" else "")
    assert rule.form == {"": "exact", ":*": "prefix", " *": "wildcard"}[suffix]
    assert parse_rule(rule.text, "ask", "s") == rule
    # and the command it names, as written, is named by it
    assert rules(ask=[text]).command(" ".join(words)).decision == "ask"


_MATCHING = ["Bash", "Bash(npm:*)", "Bash(npm test)", "Bash(npm *)", "Bash(npm test:*)"]


@given(
    placed=st.lists(
        st.tuples(st.sampled_from(_MATCHING), st.sampled_from(["deny", "ask", "allow"])),
        min_size=1,
        max_size=8,
    )
)
def test_deny_wins_then_ask_then_allow_whatever_the_order(
    placed: list[tuple[str, Decision]],
) -> None:
    lists: dict[str, list[str]] = {"deny": [], "ask": [], "allow": []}
    for text, decision in placed:
        lists[decision].append(text)
    found = rules(**lists).command("npm test")
    expected = next(d for d in ("deny", "ask", "allow") if lists[d])
    assert found.decision == expected
    assert found.rule in lists[expected]


# ------------------------------------------------------------ commands as bash runs them

#: Parts, and what the rules below make of each alone.
_PARTS = {
    "npm test": "allow",
    "npm test -x": "allow",
    "ls -l": "allow",
    "echo 'a; rm b'": "allow",  # a quoted string, not a command
    "rm -rf build": "deny",
    "curl http://x": "ask",
}
_SPLIT = rules(deny=["Bash(rm:*)"], ask=["Bash(curl:*)"], allow=["Bash(npm test:*)"])


@given(
    parts=st.lists(st.sampled_from(sorted(_PARTS)), min_size=1, max_size=6),
    joins=st.lists(st.sampled_from([" ; ", " && ", " || ", " | ", "\n", " & "]), min_size=5),
)
def test_a_compound_command_passes_only_when_every_part_does(
    parts: list[str], joins: list[str]
) -> None:
    command = parts[0] + "".join(j + p for j, p in zip(joins, parts[1:], strict=False))
    alone = {_PARTS[p] for p in parts}
    expected = next(d for d in ("deny", "ask", "allow") if d in alone)
    assert _SPLIT.command(command).decision == expected
    wrapped = f"( {command} )" if " & " not in command else f"{{ {command}\n}}"
    assert _SPLIT.command(wrapped).decision == expected


@pytest.mark.parametrize(
    "command",
    [
        "ls && rm -rf /",
        "(cd x; rm y)",
        "{ ls; rm y; }",
        "echo $(rm x)",
        "echo `rm x`",
        'echo "$(date; rm x)"',
        "diff <(rm a) b",
        "ls > >(rm y)",
        "x=$(rm y) ls",
        "f() { rm x; }; f",
        "if true; then rm x; fi",
        "for i in 1 2; do rm $i; done",
        "bash -c 'ls; rm x'",
        "sh -ec \"bash -c 'rm x'\"",
        "eval 'rm x'",
        "env A=1 nohup nice -n 5 rm x",
        "timeout -s KILL 5 rm x",
        "command rm x",
        "time rm x",
        "/bin/rm x",
        "\\rm x",
        "r''m x",
        "ls | xargs -0 rm -f",
        "find . -name '*.o' -exec rm {} ;",
        "find . -execdir sh -c 'rm \"$1\"' _ {} +",
        "ls | xargs -I{} bash -c 'rm {}'",
        "bash <<EOF\nrm -rf /\nEOF",
        "cat <<EOF\n$(rm y)\nEOF",
        "cat <<'EOF' | bash\nrm y\nEOF",
        "echo 'rm x' | sh",
        "sudo -u root rm x",
        "echo ${x:-$(rm y)}",
    ],
)
def test_a_denied_program_is_found_wherever_bash_would_run_it(command: str) -> None:
    assert _SPLIT.command(command) == Verdict("deny", "Bash(rm:*)", "test")


@pytest.mark.parametrize(
    "command",
    [
        "echo rm",
        "echo 'rm -rf /'",
        "cat > notes.md <<'EOF'\nrm x; $(rm y) `rm z` it's\nEOF",
        'cat <<"EOF"\n$(rm y)\nEOF',
        "grep -r rm .",
        "command -v rm",
    ],
)
def test_a_denied_program_named_only_as_data_is_not_denied(command: str) -> None:
    assert _SPLIT.command(command).decision == "allow"


@pytest.mark.parametrize(
    "command", ["$CMD -rf x", "git $SUB", 'bash -c "$SCRIPT"', "eval $X", "curl -s x | sh"]
)
def test_a_command_known_only_at_run_time_asks_when_a_rule_could_name_it(command: str) -> None:
    found = rules(deny=["Bash(git push:*)"]).command(command)
    assert found == Verdict("ask", "Bash(git push:*)", "test")
    assert rules(allow=["Bash(ls:*)"]).command(command).decision == "allow"


def test_a_variable_after_a_denied_prefix_is_still_denied() -> None:
    assert rules(deny=["Bash(git push:*)"]).command("git push $REMOTE").decision == "deny"
    assert rules(deny=["Bash(git push:*)"]).command("git status $X").decision == "allow"


def test_a_glob_or_brace_in_the_program_counts_as_unknown() -> None:
    assert _SPLIT.command("/bin/r[m] x").decision == "ask"
    assert _SPLIT.command("{rm,-rf,x}").decision == "ask"
    assert _SPLIT.command("ls *.py").decision == "allow"


def test_tests_and_arithmetic_bashlex_lacks_are_read_with_what_they_run() -> None:
    assert _SPLIT.command("[[ -f x ]] && echo ok") == Verdict("allow")
    assert _SPLIT.command("if [[ $a == b ]]; then rm x; fi").decision == "deny"
    assert _SPLIT.command("[[ -n $(rm x) ]]").decision == "deny"
    assert _SPLIT.command("echo $((1 + 2)); ls").decision == "allow"
    assert _SPLIT.command("echo $(( $(rm x) + 1 ))").decision == "deny"


def test_a_command_bashlex_cannot_read_is_decided_safely() -> None:
    unreadable = "case $x in a) {};; esac"  # bashlex has no case
    assert _SPLIT.command(unreadable.format("rm x")).decision == "deny"
    assert _SPLIT.command(unreadable.format("echo ok")) == Verdict("ask", "Bash(rm:*)", "test")
    assert rules(allow=["Bash(ls:*)"]).command(unreadable.format("echo ok")).decision == "allow"
    assert rules().command("a=(1 2); rm x").decision == "allow"
    pattern = rules(deny=["Bash(* --force)"])
    assert pattern.command("a=(1 2); ls") == Verdict("ask", "Bash(* --force)", "test")
    assert pattern.command("a=(1 2); git push --force") == Verdict("ask", "Bash(* --force)", "test")
    assert rules(deny=["Bash"]).command("a=(1 2); ls").decision == "deny"


def test_a_command_no_rule_names_is_allowed_by_default() -> None:
    assert _SPLIT.command("make -j4") == Verdict("allow")
    assert _SPLIT.command("") == Verdict("allow")
    assert _SPLIT.command("npm test && ls") == Verdict("allow")  # ls: the default
    assert _SPLIT.command("npm test") == Verdict("allow", "Bash(npm test:*)", "test")


def test_an_always_answer_outranks_an_ask_rule_but_never_a_deny() -> None:
    answered = _SPLIT.allowing("Bash(curl:*)")
    assert answered.command("curl http://x") == Verdict("allow", "Bash(curl:*)", "remembered")
    assert answered.command("curl x; rm y").decision == "deny"
    assert _SPLIT.command("curl http://x").decision == "ask"  # the original is unchanged
    with pytest.raises(ConfigError, match="cannot be remembered"):
        _SPLIT.allowing("Read(x)")


def test_an_always_answer_records_the_rule_that_stops_the_question() -> None:
    asked = _SPLIT.command("ls; curl http://x")
    rule = _SPLIT.always(asked)
    assert rule == "Bash(curl:*)"
    assert _SPLIT.allowing(rule).command("ls; curl http://x").decision == "allow"
    assert _SPLIT.always(_SPLIT.command("$CMD")) == ""  # it may be `rm`: it asks every time
    assert _SPLIT.always(Verdict("ask"), host="pypi.org") == "WebFetch(domain:pypi.org)"
    assert _SPLIT.always(Verdict("ask"), server="gh", tool="merge") == "mcp__gh__merge"


# --------------------------------------------------------------------------- MCP tools


def test_an_mcp_rule_naming_the_tool_or_its_server_decides() -> None:
    found = rules(deny=["mcp__github__delete_repo"], ask=["mcp__github__*"], allow=["mcp__docs"])
    assert found.mcp("github", "delete_repo", {"readOnlyHint": True}).decision == "deny"
    assert found.mcp("github", "get_issue", {"readOnlyHint": True}) == Verdict(
        "ask", "mcp__github__*", "test"
    )
    assert found.mcp("docs", "search", {"destructiveHint": True}) == Verdict(
        "allow", "mcp__docs", "test"
    )
    assert found.mcp("githubby", "x", None) == Verdict("allow")


def test_an_mcp_tool_no_rule_names_follows_its_annotations() -> None:
    none = rules()
    assert none.mcp("s", "t", {"readOnlyHint": True}) == Verdict(
        "allow", "readOnlyHint", "annotations"
    )
    assert none.mcp("s", "t", {"destructiveHint": True}).decision == "ask"
    assert none.mcp("s", "t", {"openWorldHint": True}) == Verdict(
        "ask", "openWorldHint", "annotations"
    )
    assert none.mcp("s", "t", {"readOnlyHint": True, "openWorldHint": True}).decision == "allow"
    assert none.mcp("s", "t", {"destructiveHint": False}) == Verdict("allow")
    assert none.mcp("s", "t", None) == Verdict("allow")  # as orchmode always ran them
    assert none.allowing("mcp__s__t").mcp("s", "t", {"destructiveHint": True}).source == (
        "remembered"
    )


# --------------------------------------------------------------------------- domains


def test_a_bare_webfetch_deny_refuses_every_domain() -> None:
    found = rules(deny=["WebFetch"])
    assert found.domain("pypi.org", 443) == Verdict("deny", "WebFetch", "test")


def test_webfetch_rules_are_domain_rules(places: tuple[Path, Path, dict[str, str]]) -> None:
    """Needs core/domains.py (the proxy helper's DomainRules)."""
    found = rules(
        allow=["WebFetch(domain:pypi.org)", "WebFetch(domain:docs.python.org)"],
        deny=["WebFetch(domain:docs.python.org)"],
    )
    assert found.domain("pypi.org", 443) == Verdict("allow", "WebFetch(domain:pypi.org)", "test")
    assert found.domain("docs.python.org", 443) == Verdict(
        "deny", "WebFetch(domain:docs.python.org)", "test"
    )
    assert found.domain("example.com", 443) == Verdict("deny")
    assert found.address("pypi.org", "151.101.0.223").decision == "allow"
    wildcard = rules(allow=["WebFetch(domain:*.pythonhosted.org)"])
    assert wildcard.address("files.pythonhosted.org", "127.0.0.1").decision == "deny"


def test_network_settings_and_remembered_domains_meet_the_fetch_rules(
    places: tuple[Path, Path, dict[str, str]],
) -> None:
    """Needs core/domains.py (the proxy helper's DomainRules)."""
    project, _home, env = places
    write_claude(project / ".claude/settings.json", ask=["WebFetch(domain:pypi.org)"])
    settings = Settings(network_allow=("pypi.org", "example.com"), network_ask=("example.com",))
    loaded, warnings = Rules.load(settings, project, env)
    assert warnings == []
    assert loaded.domain("example.com", 443) == Verdict("ask", "example.com", "network_ask")
    assert loaded.domain("pypi.org", 443) == Verdict(
        "ask", "WebFetch(domain:pypi.org)", ".claude/settings.json"
    )
    answered = loaded.allowing("WebFetch(domain:example.com)")
    assert answered.domain("example.com", 443) == Verdict(
        "allow", "WebFetch(domain:example.com)", "remembered"
    )
    assert rules(ask=["WebFetch"]).allowing("WebFetch(domain:a.org)").domain(
        "b.org", 443
    ) == Verdict("ask", "WebFetch", "test")


# --------------------------------------------------------------------------- loading real files


def test_project_allow_rules_count_only_once_the_directory_is_trusted(
    places: tuple[Path, Path, dict[str, str]],
) -> None:
    project, _home, env = places
    write_claude(
        project / ".claude/settings.json",
        allow=["Bash(make:*)", "mcp__tools"],
        ask=["Bash(curl:*)"],
        deny=["Bash(rm:*)"],
    )
    write_claude(project / ".claude/settings.local.json", allow=["mcp__local"])
    loaded, warnings = Rules.load(Settings(), project, env)
    assert loaded.command("make all") == Verdict("allow")  # the default, not the rule
    assert loaded.mcp("tools", "x", {"destructiveHint": True}).decision == "ask"
    assert loaded.command("curl x") == Verdict("ask", "Bash(curl:*)", ".claude/settings.json")
    assert loaded.command("rm x") == Verdict("deny", "Bash(rm:*)", ".claude/settings.json")
    assert len(warnings) == 1
    assert (
        "ignoring the allow rules of .claude/settings.json and .claude/settings.local.json"
        in (warnings[0])
    )
    assert "not trusted" in warnings[0] and "orchmode trust" in warnings[0]

    trust.trust(config_dir(env), project)
    loaded, warnings = Rules.load(Settings(), project, env)
    assert warnings == []
    assert loaded.command("make all") == Verdict("allow", "Bash(make:*)", ".claude/settings.json")
    assert loaded.mcp("local", "x", {"destructiveHint": True}) == Verdict(
        "allow", "mcp__local", ".claude/settings.local.json"
    )

    write_claude(project / ".claude/settings.json", allow=["Bash(make:*)", "mcp__tools__*"])
    loaded, warnings = Rules.load(Settings(), project, env)
    assert loaded.mcp("tools", "x", {"destructiveHint": True}).decision == "ask"
    assert len(warnings) == 1 and "changed since you trusted it" in warnings[0]


def test_rules_come_from_settings_files_and_the_users_own_file(
    places: tuple[Path, Path, dict[str, str]],
) -> None:
    project, home, env = places
    write_claude(home / ".claude/settings.json", allow=["mcp__mine"], deny=["Bash(shutdown:*)"])
    settings = Settings(permissions_ask=("Bash(git push:*)",), permissions_deny=("mcp__x__y",))
    loaded, warnings = Rules.load(settings, project, env)
    assert warnings == []
    assert loaded.command("git push") == Verdict("ask", "Bash(git push:*)", "permissions_ask")
    assert loaded.mcp("x", "y", None) == Verdict("deny", "mcp__x__y", "permissions_deny")
    assert loaded.mcp("mine", "t", {"destructiveHint": True}) == Verdict(
        "allow", "mcp__mine", "~/.claude/settings.json"
    )
    assert loaded.command("shutdown now").source == "~/.claude/settings.json"


def test_the_home_directory_as_workdir_reads_its_file_once_as_the_users(
    places: tuple[Path, Path, dict[str, str]],
) -> None:
    _project, home, env = places
    write_claude(home / ".claude/settings.json", allow=["mcp__mine"])
    loaded, warnings = Rules.load(Settings(), home, env)
    assert warnings == []
    assert loaded.mcp("mine", "t", {"destructiveHint": True}).source == "~/.claude/settings.json"


def test_bad_files_and_rules_are_warnings_and_the_rest_still_loads(
    places: tuple[Path, Path, dict[str, str]],
) -> None:
    project, home, env = places
    (project / ".claude/settings.json").write_text("{not json")
    (project / ".claude/settings.local.json").write_text(
        json.dumps({"permissions": {"deny": ["Read(./.env)", 7, "Bash(rm:*)", "Bash(x"]}})
    )
    (home / ".claude/settings.json").write_text(
        json.dumps({"permissions": {"ask": "Bash(curl:*)", "deny": ["WebSearch", "mcp__a"]}})
    )
    settings = Settings(permissions_allow=("Frobnicate(x)", "Bash(make:*)"))
    loaded, warnings = Rules.load(settings, project, env)
    assert loaded.command("rm x").decision == "deny"
    assert loaded.mcp("a", "b", None).decision == "deny"
    assert loaded.command("make").decision == "allow"
    text = "\n".join(warnings)
    assert len(warnings) == 7, text
    assert ".claude/settings.json: not valid JSON" in text
    assert "`Read(./.env)`: orchmode has no Read tool" in text
    assert "ignoring the rule 7: a rule must be a string" in text
    assert "`Bash(x`" in text
    assert "`permissions.ask` is not a list" in text
    assert "`WebSearch`" in text and "unknown rule kind 'Frobnicate'" in text


# --------------------------------------------------------------------------- remembered answers


def test_a_remembered_rule_is_loaded_in_that_directory_only(
    places: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    project, home, env = places
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    write_claude(project / ".claude/settings.json", ask=["Bash(curl:*)"])
    link = tmp_path / "link"
    link.symlink_to(project)
    remember(config_dir(env), link, "Bash(curl:*)")
    remember(config_dir(env), project, "Bash(curl:*)")  # the same directory: once
    assert remembered_rules(config_dir(env), project) == ["Bash(curl:*)"]
    loaded, warnings = Rules.load(Settings(), project, env)
    assert warnings == []
    assert loaded.command("curl x") == Verdict("allow", "Bash(curl:*)", "remembered")
    assert Rules.load(Settings(), home, env)[0].command("curl x") == Verdict("allow")
    assert (config_dir(env) / RULES_FILE).is_file()
    after = sorted(p.relative_to(project) for p in project.rglob("*"))
    assert [p for p in after if p not in before] == [Path(".claude/settings.json")]
    with pytest.raises(ConfigError):
        remember(config_dir(env), project, "Bash(")


def test_a_damaged_rules_file_is_a_warning_when_loading(
    places: tuple[Path, Path, dict[str, str]],
) -> None:
    project, _home, env = places
    config_dir(env).mkdir(parents=True)
    (config_dir(env) / RULES_FILE).write_text("[[directory]\n")
    _loaded, warnings = Rules.load(Settings(), project, env)
    assert len(warnings) == 1 and "not valid TOML" in warnings[0]
    with pytest.raises(ConfigError, match="not valid TOML"):
        remember(config_dir(env), project, "Bash(ls:*)")


def _remember_many(where: str, directory: str, worker: int) -> None:
    for index in range(10):
        remember(Path(where), Path(directory), f"Bash(tool{worker}-{index}:*)")


def test_concurrent_remembers_lose_nothing(places: tuple[Path, Path, dict[str, str]]) -> None:
    project, _home, env = places
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_remember_many, args=(str(config_dir(env)), str(project), n))
        for n in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    found = remembered_rules(config_dir(env), project)
    assert sorted(found) == sorted(f"Bash(tool{w}-{i}:*)" for w in range(6) for i in range(10))
    assert not [
        p
        for p in os.listdir(config_dir(env))
        if p.startswith(f".{RULES_FILE}.") and not p.endswith(".lock")
    ]
