"""The architecture page's layout table and the layer contract describe the folders as they are."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "layout.py"
PACKAGE = ROOT / "src" / "orchmode"


def layout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )


def test_the_architecture_page_layout_table_is_the_one_the_code_makes() -> None:
    checked = layout("--check")
    assert checked.returncode == 0, checked.stderr


def test_a_stale_table_is_caught_and_rewritten(tmp_path: Path) -> None:
    page = tmp_path / "architecture.md"
    current = (ROOT / "docs" / "architecture.md").read_text()
    stale = current.replace("| `core/results.py` |", "| `core/outcomes.py` |")
    assert stale != current
    page.write_text(stale)
    checked = layout("--check", "--page", str(page))
    assert checked.returncode == 1
    assert "core/outcomes.py" in checked.stderr and "core/results.py" in checked.stderr
    assert layout("--write", "--page", str(page)).returncode == 0
    assert page.read_text() == current


def test_every_folder_is_a_layer_except_the_test_doubles() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = (c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    in_layers = {
        name.strip().removeprefix("orchmode.")
        for layer in contract["layers"]
        for name in layer.split("|")
    }
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders - in_layers == {"testing"}
    assert in_layers <= folders
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]
