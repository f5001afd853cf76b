"""The programs orchmode runs for its own work are found by absolute path only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmode.core import programs

entries = st.lists(
    st.one_of(
        st.just(""),
        st.just("."),
        st.text(alphabet="abc/.", max_size=8).filter(lambda d: ":" not in d),
    ),
    max_size=6,
)


@given(entries)
def test_only_absolute_directories_are_kept_in_order(dirs: list[str]) -> None:
    kept = programs.absolute_path_dirs(os.pathsep.join(dirs))
    assert kept == [d for d in dirs if d.startswith("/")]


def test_a_program_in_the_current_directory_is_never_found_through_a_relative_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "git"
    fake.write_text("#!/bin/sh\nexit 97\n")
    fake.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for path in (os.pathsep + "/usr/bin", ".:/usr/bin", "/usr/bin" + os.pathsep):
        monkeypatch.setenv("PATH", path)
        found = programs.find("git")
        assert found is not None and os.path.isabs(found) and Path(found) != fake
    monkeypatch.setenv("PATH", str(tmp_path))  # named by its absolute path: the user's choice
    assert programs.find("git") == str(fake)


def test_a_program_found_nowhere_is_named_by_an_absolute_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "")
    assert programs.find("no-such-program-anywhere") is None
    programs.program.cache_clear()
    try:
        assert programs.program("no-such-program-anywhere") == "/usr/bin/no-such-program-anywhere"
    finally:
        programs.program.cache_clear()
