"""The README's promises that code can check: its test command is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert block, "the README must open with a bash block of commands"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_the_readme_opens_with_the_main_job_and_the_test_command() -> None:
    main_job, tests = readme_commands()
    assert "orchmode run" in main_job
    assert tests == "scripts/test"
    assert "python -m pytest" in (ROOT / "scripts" / "test").read_text(encoding="utf-8")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, tests = readme_commands()
    assert tests in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
