"""What keeping secrets from the model costs: the snapshot's extra walk, and masking.

1. **A Workflow call's snapshot** of a git repository of ``--sizes`` files (with a
   committed ``.env``, an ignored ``config/.env.production`` and an untracked ``.pem``),
   with the default ``secret_files`` against none, in the same run: the secret files are
   looked for (a walk of the whole tree, ignored directories included) on a thread of
   their own while ``git status`` reads the tree, and the tracked ones are taken out of the
   snapshot's index. Target: <= 1.25x at 10,000 files.
2. **Masking one command's output** (``output_limit`` = 8,000 characters) with 200 secrets
   known, against running a ``true`` command in the same sandboxed shell: what masking adds
   to a command the model sees. Target: <= 0.10x.
3. **A user turn's look** for secret files made since the last one (the walk, and reading
   the values of those found), against the snapshot without secrets of item 1 in the same
   run: the cheapest read of the tree orchmode makes. Target: <= 0.5x at 10,000 files.

    .venv/bin/python bench/secret_files.py [--sizes 1000,10000,100000] [--repeats 10]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from orchmode.core.secrets import Masker, Secrets
from orchmode.core.settings import Settings
from orchmode.executors.host import ShellFactory
from orchmode.trees.trees import Trees

GIT = ["git", "-c", "user.name=b", "-c", "user.email=b@b", "-c", "gc.auto=0"]


def make_repo(root: Path, files: int) -> None:
    for i in range(files):
        path = root / f"src/d{i % 100}/e{i % 7}/m{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE_{i} = {i}\n" * 20)
    (root / ".env").write_text("DB_PASSWORD=hunter2-bench-secret\n")
    (root / ".gitignore").write_text("config/.env.production\n.venv/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "start"], cwd=root, check=True)
    (root / "config").mkdir()
    (root / "config" / ".env.production").write_text("TOKEN=prod-bench-token-42\n")
    (root / "service.pem").write_text("-----BEGIN KEY-----\nMIIbenchbenchbench\n")


async def snapshot_ms(root: Path, patterns: tuple[str, ...], repeats: int) -> float:
    found = Secrets.start(patterns, root, {})
    trees = Trees(root, secrets=found if patterns else None)
    try:
        await trees.snapshots.snapshot()  # the first one fills git's caches
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            await trees.snapshots.snapshot()
            times.append(time.perf_counter() - started)
    finally:
        trees.close()
    return statistics.median(times) * 1000


def look_ms(root: Path, patterns: tuple[str, ...], repeats: int) -> float:
    """Median milliseconds of one turn's look for the secret files under ``root``."""
    found = Secrets.start(patterns, root, {})
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        found.look()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def masking(root: Path, repeats: int) -> tuple[float, float]:
    """Milliseconds to mask an 8,000-character output with 200 secrets, and to run
    ``true`` in a sandboxed shell."""
    # random tokens, as keys and passwords are (shared prefixes would flatter any matcher)
    masker = Masker(secrets.token_urlsafe(18 + i % 12) for i in range(200))
    output = ("drwxr-xr-x 2 user user 4096 Dec  2 07:38 some/path/name.py\n" * 200)[:8000]
    started = time.perf_counter()
    for _ in range(repeats * 100):
        masker.mask(output)
    mask = (time.perf_counter() - started) / (repeats * 100) * 1000
    shell = ShellFactory.build(Settings(), root, ())()
    try:
        await shell.run("true")
        times = []
        for _ in range(repeats * 10):
            started = time.perf_counter()
            await shell.run("true")
            times.append(time.perf_counter() - started)
    finally:
        await shell.close()
    return mask, statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    defaults = Settings().secret_files
    print("snapshot of a repository, default secret_files against none (median ms)")
    with tempfile.TemporaryDirectory(prefix="orchmode-bench-secrets-") as scratch:
        for size in (int(s) for s in args.sizes.split(",")):
            root = Path(scratch) / f"repo-{size}"
            root.mkdir()
            make_repo(root, size)
            without = asyncio.run(snapshot_ms(root, (), args.repeats))
            with_secrets = asyncio.run(snapshot_ms(root, defaults, args.repeats))
            look = look_ms(root, defaults, args.repeats)
            print(
                f"  {size:>7,} files: {without:7.1f} ms without, {with_secrets:7.1f} ms with "
                f"= {with_secrets / without:.2f}x; a user turn's look {look:6.1f} ms "
                f"= {look / without:.2f}x the snapshot without"
            )
        mask, command = asyncio.run(masking(Path(scratch) / f"repo-{size}", args.repeats))
        print(
            f"masking an 8,000-character output with 200 secrets: {mask:.3f} ms; a `true` "
            f"command in the sandboxed shell: {command:.2f} ms = {mask / command:.3f}x"
        )


if __name__ == "__main__":
    main()
