"""The documentation site: a page per command with real output, every page in the nav, links
that lead somewhere, generated tables that match the code, and a README that is a front page.

CI builds the site with ``mkdocs build --strict`` too (``.ci/run``); these checks need no
MkDocs, so they run with the rest of the suite.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SETTINGS_SCRIPT = ROOT / "scripts" / "settings_table.py"

#: The commands with a page each (a new one fails test_every_command_listed_by_orchmode_has_a_page).
COMMANDS = ["run", "resume", "chat", "show", "report", "budget", "runs", "demo"]
#: A Markdown link's target: ``[text](target)``, not an image and not inside code.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def commands() -> list[str]:
    """The commands ``orchmode --help`` lists, as a user sees them."""
    shown = subprocess.run(
        [sys.executable, "-m", "orchmode", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert shown.returncode == 0, shown.stderr
    listed = shown.stdout.split("COMMAND\n", 2)[-1].split("\n\n")[0]
    names = re.findall(r"^    (\w+)\s", listed, flags=re.M)
    assert names, shown.stdout
    return names


def nav_pages() -> list[str]:
    """Every page mkdocs.yml's nav names (read without YAML: the docs extra is optional)."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = config.split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", nav, flags=re.M)


def pages() -> list[str]:
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code taken out, so examples are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def broken_links(page: Path) -> list[str]:
    """The relative links of a page whose file does not exist."""
    broken = []
    for target in LINK.findall(without_code(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    return broken


def test_orchmode_lists_the_eight_commands_the_pages_below_describe() -> None:
    assert set(COMMANDS) <= set(commands())


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_a_page_with_its_real_output(name: str) -> None:
    page = DOCS / "commands" / f"{name}.md"
    assert page.is_file(), f"orchmode {name} has no page at {page.relative_to(ROOT)}"
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# orchmode {name}\n")
    real = text.split("\n## Real output\n", 1)
    assert len(real) == 2, f"{page.name} has no '## Real output' section"
    assert re.search(rf"^\$ (.* \| )?orchmode {name}\b", real[1], flags=re.M), (
        f"the real output of {page.name} does not show the command it ran"
    )
    assert "```text\n" in real[1]


def test_the_demo_page_shows_its_banner_so_no_one_takes_it_for_claude() -> None:
    text = (DOCS / "commands" / "demo.md").read_text(encoding="utf-8")
    assert "$ orchmode demo" in text
    assert "the model here is orchmode's scripted test server, not Claude" in text


def test_every_command_listed_by_orchmode_has_a_page() -> None:
    missing = [n for n in commands() if not (DOCS / "commands" / f"{n}.md").is_file()]
    assert not missing, f"commands without a page in docs/commands/: {missing}"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    nav = nav_pages()
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    assert sorted(nav) == pages()


def test_the_nav_starts_at_home_then_getting_started() -> None:
    assert nav_pages()[:2] == ["index.md", "getting-started.md"]


@pytest.mark.parametrize("page", ["../README.md", *pages()])
def test_relative_links_lead_to_files_that_exist(page: str) -> None:
    assert not broken_links(DOCS / page)


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](nowhere.md#x) `[code](x.md)` [web](https://a.b)\n")
    assert broken_links(page) == ["nowhere.md#x"]


def test_the_readme_is_a_front_page_that_links_into_the_site() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    linked = {t.split("#")[0] for t in LINK.findall(without_code(text))}
    assert "docs/getting-started.md" in linked
    not_linked = sorted(p for p in pages() if f"docs/{p}" not in linked)
    assert not_linked == [], f"the README links to no {not_linked}"


def settings_table(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SETTINGS_SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_the_configuration_page_table_is_the_one_settings_makes() -> None:
    checked = settings_table("--check")
    assert checked.returncode == 0, checked.stderr


def test_a_stale_settings_table_is_caught_and_rewritten(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    current = (DOCS / "configuration.md").read_text(encoding="utf-8")
    stale = current.replace(
        "| `max_concurrent` | `--max-concurrent` |", "| `max_parallel` | `-p` |"
    )
    assert stale != current
    page.write_text(stale, encoding="utf-8")
    checked = settings_table("--check", "--page", str(page))
    assert checked.returncode == 1
    assert "max_parallel" in checked.stderr and "max_concurrent" in checked.stderr
    assert settings_table("--write", "--page", str(page)).returncode == 0
    assert page.read_text(encoding="utf-8") == current


def test_the_site_has_its_extra_and_ci_builds_it_strictly() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    docs = project["optional-dependencies"]["docs"]
    assert {re.split(r"[<>=]", d)[0] for d in docs} == {"mkdocs", "mkdocs-material"}
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ".venv/bin/pip install -q -e '.[docs]'" in ci
    assert re.search(r"^\.venv/bin/mkdocs build --strict\b", ci, flags=re.M)
    assert "name: material" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
