"""The working directory as the Ray nodes get it: the files git would keep, in one zip.

git decides what is ignored (every ``.gitignore``, ``.git/info/exclude`` and the user's
global excludes), so what ships is what the user's own tools treat as the project. We
build the zip ourselves rather than let Ray walk the directory, so the size that is
checked against the limit is exactly the size that is sent.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core.programs import program
from ..core.secrets import SecretFiles

#: Never shipped: the local journal and state, and git's own database.
NEVER = (".orchmode", ".git")
_MB = 1_000_000


@dataclass(frozen=True)
class Package:
    path: Path
    files: int
    size: int
    #: Symbolic links left out because they point outside the working directory.
    skipped_links: int


def shipped_files(workdir: Path, secret: SecretFiles | None = None) -> list[Path]:
    """The files under ``workdir`` that git does not ignore, relative to it; never a file
    ``secret`` matches (``secret_files``), which no agent may read on any machine."""
    inside = _git(workdir, "rev-parse", "--is-inside-work-tree").strip() == "true"
    if inside:
        listing = _git(workdir, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    else:  # not a repository: an empty one of our own reads the ignore files all the same
        with tempfile.TemporaryDirectory(prefix="orchmode-git-") as git_dir:
            _git(workdir, "init", "-q", "--bare", git_dir)
            listing = _git(
                workdir,
                f"--git-dir={git_dir}",
                f"--work-tree={workdir}",
                "ls-files",
                "-z",
                "--others",
                "--exclude-standard",
            )
    names = [name for name in listing.split("\0") if name]
    return [
        Path(name)
        for name in names
        if Path(name).parts
        and Path(name).parts[0] not in NEVER
        and not (secret and secret.matches(name))
        and (workdir / name).exists()
    ]


def package_workdir(
    workdir: Path, limit_mb: float, into: Path, secret: SecretFiles | None = None
) -> Package:
    """Zip what ships of ``workdir`` into the directory ``into``; refuse past ``limit_mb``."""
    workdir = workdir.resolve()
    files: list[tuple[Path, Path]] = []
    skipped = 0
    for relative in shipped_files(workdir, secret):
        source = workdir / relative
        if source.is_symlink() and not _within(source.resolve(), workdir):
            skipped += 1
            continue
        if source.is_file():
            files.append((relative, source))
    size = sum(source.stat().st_size for _, source in files)
    if size > limit_mb * _MB:
        raise ConfigError(
            f"the working directory is {size / _MB:.1f} MB to ship to the Ray nodes, over "
            f"--ray-max-upload-mb {limit_mb:g} (largest: {_largest(files)}) — add what the "
            "agents do not need to .gitignore, or raise --ray-max-upload-mb"
        )
    target = into / "workdir.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for relative, source in files:
            archive.write(source, relative.as_posix())
    return Package(target, len(files), size, skipped)


def _largest(files: list[tuple[Path, Path]], count: int = 3) -> str:
    """The biggest top-level entries, so the user knows what to ignore."""
    sizes: Counter[str] = Counter()
    for relative, source in files:
        top = relative.parts[0] + ("/" if len(relative.parts) > 1 else "")
        sizes[top] += source.stat().st_size
    return ", ".join(f"{name} {size / _MB:.1f} MB" for name, size in sizes.most_common(count))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _git(workdir: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            [program("git"), *args],
            cwd=workdir,
            capture_output=True,
            text=True,
            env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"},
            check=False,
        )
    except FileNotFoundError:
        raise ConfigError(
            "shipping the working directory to Ray needs git, to honour .gitignore — install git"
        ) from None
    if args[:2] == ("rev-parse", "--is-inside-work-tree"):
        return done.stdout  # "true", or an error outside a repository: both are answers
    if done.returncode != 0:
        raise ConfigError(
            f"could not list the working directory's files with git: {done.stderr.strip()}"
        )
    return done.stdout
