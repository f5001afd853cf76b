"""What of the working directory ships to Ray nodes: git's idea of the project, size-checked."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from orchmode.core.errors import ConfigError
from orchmode.core.secrets import SecretFiles
from orchmode.executors.upload import package_workdir


def make_project(root: Path) -> Path:
    (root / "src" / "deep").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / "src" / "deep" / "data.bin").write_bytes(bytes(range(256)))
    (root / "src" / "deep" / ".gitignore").write_text("*.tmp\n")
    (root / "src" / "deep" / "scratch.tmp").write_text("nested ignore\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_text("object\n")
    (root / "app.log").write_text("log\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / ".orchmode").mkdir()
    (root / ".orchmode" / "journal.db").write_text("local state\n")
    return root


def shipped(package: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(package) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


EXPECTED = {".gitignore", "src/main.py", "src/deep/data.bin", "src/deep/.gitignore"}


def test_outside_a_repository_the_gitignore_files_still_decide(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    out = tmp_path / "out"
    out.mkdir()
    package = package_workdir(project, 10, out)
    files = shipped(package.path)
    assert set(files) == EXPECTED
    assert files["src/deep/data.bin"] == bytes(range(256))
    assert package.files == len(EXPECTED)
    assert package.size == sum(len(v) for v in files.values())


def test_in_a_repository_git_decides_and_its_database_never_ships(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    (project / ".git" / "info" / "exclude").write_text("src/main.py\n")
    subprocess.run([*git, "add", "src/deep/data.bin"], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=project, check=True)
    out = tmp_path / "out"
    out.mkdir()
    files = shipped(package_workdir(project, 10, out).path)
    # excluded by .git/info/exclude; the .git directory itself never ships
    assert set(files) == EXPECTED - {"src/main.py"}


def test_a_directory_over_the_limit_is_refused_naming_its_largest_parts(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"x" * 1_500_000)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError) as refused:
        package_workdir(project, 1, out)
    message = str(refused.value)
    assert "1.5 MB" in message and "--ray-max-upload-mb 1" in message
    assert "data/ 1.5 MB" in message
    assert list(out.iterdir()) == []  # nothing was written
    assert package_workdir(project, 2, out).size > 1_500_000  # and the limit is the line


def test_links_out_of_the_directory_stay_behind_and_links_within_ship_their_file(
    tmp_path: Path,
) -> None:
    project = make_project(tmp_path / "p")
    secret = tmp_path / "outside.txt"
    secret.write_text("not the project's\n")
    (project / "escape").symlink_to(secret)
    (project / "alias.py").symlink_to(project / "src" / "main.py")
    out = tmp_path / "out"
    out.mkdir()
    package = package_workdir(project, 10, out)
    files = shipped(package.path)
    assert "escape" not in files
    assert files["alias.py"] == b"print('hi')\n"
    assert package.skipped_links == 1


def test_secret_files_never_ship_to_the_nodes_tracked_or_not(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p")
    (project / ".env").write_text("DB_PASSWORD=hunter2-secret\n")
    (project / "src" / "deploy.pem").write_text("-----BEGIN KEY-----\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", ".env"], cwd=project, check=True)  # even a tracked one
    subprocess.run([*git, "commit", "-qm", "one"], cwd=project, check=True)
    out = tmp_path / "out"
    out.mkdir()
    assert {".env", "src/deploy.pem"} <= set(shipped(package_workdir(project, 10, out).path))
    files = shipped(package_workdir(project, 10, out, SecretFiles()).path)
    assert set(files) == EXPECTED
