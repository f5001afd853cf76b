"""The programs orchmode runs for its own work are found by absolute path only."""

from __future__ import annotations

import contextlib
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


def test_finding_libseccomp_where_ldconfig_does_not_know_it_runs_no_compiler_of_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the ldconfig cache does not know libseccomp, ctypes looks for it with gcc, cc,
    objdump and ld, by name: under a PATH whose first entry is empty, the repository's own
    would run. orchmode imports pyseccomp with the relative entries left out."""
    import ctypes.util
    import sys

    from orchmode.shell import seccomp

    marks = tmp_path / "marks"
    marks.mkdir()
    repository = tmp_path / "repository"
    repository.mkdir()
    for name in ("gcc", "cc", "objdump", "ld"):
        fake = repository / name
        fake.write_text(f"#!/bin/sh\necho {name} >> {marks}/{name}\nexit 1\n")
        fake.chmod(0o755)
    monkeypatch.chdir(repository)
    monkeypatch.setenv("PATH", os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(ctypes.util, "_findSoname_ldconfig", lambda name: None)
    monkeypatch.delitem(sys.modules, "pyseccomp", raising=False)  # imported as on a first start
    with contextlib.suppress(seccomp.SeccompUnavailable):
        seccomp._libseccomp()
    assert sorted(p.name for p in marks.iterdir()) == []
    assert os.environ["PATH"].startswith(os.pathsep)  # the user's PATH is left as it was


def test_the_sandboxs_bash_is_one_the_sandbox_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bash found only under the home (which every sandbox hides) is taken where it
    really is, as a Nix profile's link into the store; one on a PATH directory outside the
    home comes first."""
    home, store = tmp_path / "home", tmp_path / "store" / "bash-5.2" / "bin"
    store.mkdir(parents=True)
    (store / "bash").write_text("#!/bin/sh\n")
    (store / "bash").chmod(0o755)
    profile = home / ".nix-profile" / "bin"
    profile.mkdir(parents=True)
    (profile / "bash").symlink_to(store / "bash")
    monkeypatch.setattr(programs, "SYSTEM_DIRS", ())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{profile}{os.pathsep}/nowhere")
    programs.system_program.cache_clear()
    try:
        assert programs.system_program("bash") == str(store / "bash")
        other = tmp_path / "opt" / "bin"
        other.mkdir(parents=True)
        (other / "bash").write_text("#!/bin/sh\n")
        (other / "bash").chmod(0o755)
        programs.system_program.cache_clear()
        monkeypatch.setenv("PATH", f"{profile}{os.pathsep}{other}")
        assert programs.system_program("bash") == str(other / "bash")
    finally:
        programs.system_program.cache_clear()
