"""The layout table of docs/architecture.md, made from the layer contract and docstrings.

``python scripts/layout.py`` prints the table; ``--write`` puts it into docs/architecture.md
between its markers; ``--check`` exits 1 (saying what differs) when the page's copy is
stale. The order is the layer order written in pyproject.toml's ``[tool.importlinter]``
contract, so the table, the contract and the folders cannot drift apart.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import page_block

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "orchmode"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- layout: made by scripts/layout.py from the layer contract and docstrings -->"
END = "<!-- /layout -->"


def layers() -> list[list[str]]:
    """The layers, top to bottom, each a list of sibling packages (``cli``, ``views``, …)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            return [
                [name.strip().removeprefix("orchmode.") for name in layer.split("|")]
                for layer in contract["layers"]
            ]
    raise SystemExit("pyproject.toml has no layers contract")


def summary(path: Path) -> str:
    """A module's job: its docstring's first paragraph, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    first = doc.strip().split("\n\n")[0]
    text = " ".join(first.split()).replace("``", "`")
    if not text:
        raise SystemExit(f"{path.relative_to(ROOT)} has no docstring to say what it is for")
    return text.replace("|", "\\|")


def package_rows(package: str, layer: str) -> list[str]:
    folder = PACKAGE / package
    rows = [f"| {layer} | **`{package}/`** | {summary(folder / '__init__.py')} |"]
    for module in sorted(folder.glob("*.py")):
        if module.name != "__init__.py":
            rows.append(f"| | `{package}/{module.name}` | {summary(module)} |")
    return rows


def table() -> str:
    rows = ["| layer | module | its one job |", "| --- | --- | --- |"]
    for name in ("__init__.py", "__main__.py"):
        rows.append(f"| | `{name}` | {summary(PACKAGE / name)} |")
    placed: set[str] = set()
    for number, layer in enumerate(layers(), start=1):
        for package in layer:
            rows.extend(package_rows(package, str(number)))
            placed.add(package)
    beside = sorted(
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name not in placed
    )
    for package in beside:
        rows.extend(package_rows(package, "beside"))
    loose = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    if loose:
        raise SystemExit(f"modules outside every layer's package: {', '.join(loose)}")
    return "\n".join(rows)


def main() -> int:
    return page_block.main(__doc__.split("\n\n")[0], PAGE, BEGIN, END, table(), "scripts/layout.py")


if __name__ == "__main__":
    sys.exit(main())
