"""Faults of the store, for the fault suite and benchmarks: a PostgreSQL server stopped and
started again, a full disk under ``.orchmode/``, a damaged SQLite journal.

Each helper does one fault to a real thing (a real server, a real file system, a real file)
and waits on observable conditions only, each with a deadline.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from support.postgres import PostgresServer

#: The ways :func:`damage_journal` damages a journal.
DAMAGES = ("truncated", "scribbled", "header", "wal", "empty")


class FaultUnavailable(RuntimeError):
    """This machine cannot stage the fault (not root, mount refused, no PostgreSQL…)."""


def wait_for(condition: Callable[[], bool], what: str, *, timeout: float = 60.0) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Raises TimeoutError past
    ``timeout`` (naming ``what``)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(0.02)  # polling a condition another process changes
    return time.monotonic() - started


def restart_postgres_during(
    server: PostgresServer,
    ready: Callable[[], bool],
    *,
    noticed: Callable[[], bool] | None = None,
    down_at_least: float = 0.0,
    timeout: float = 60.0,
) -> float:
    """Once ``ready()`` holds, stop ``server`` (``pg_ctl stop -m fast``: its clients' sessions
    are cut), keep it down until ``noticed()`` holds (the client saw the outage) and at
    least ``down_at_least`` seconds, then start it again on the same port and data. The
    seconds it was down."""
    wait_for(ready, "the moment to stop PostgreSQL", timeout=timeout)
    stopped = time.monotonic()
    server.stop("fast")
    try:
        if noticed is not None:
            wait_for(noticed, "the client noticing the outage", timeout=timeout)
        left = down_at_least - (time.monotonic() - stopped)
        if left > 0:
            time.sleep(left)  # the outage's length is the fault itself
    finally:
        server.start()
    return time.monotonic() - stopped


def stop_postgres_when(
    server: PostgresServer, ready: Callable[[], bool], *, timeout: float = 60.0
) -> float:
    """Once ``ready()`` holds, stop ``server`` (fast) and leave it down; when it stopped
    (``time.monotonic()``). ``server.start()`` brings it back."""
    wait_for(ready, "the moment to stop PostgreSQL", timeout=timeout)
    server.stop("fast")
    return time.monotonic()


@contextmanager
def tmpfs(directory: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes on ``directory`` (made if missing) for the block.

    Needs root (or CAP_SYS_ADMIN); :class:`FaultUnavailable` says why it cannot.
    """
    mount = shutil.which("mount")
    if mount is None or os.geteuid() != 0:
        raise FaultUnavailable("mounting a tmpfs needs root and mount(8)")
    directory.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise FaultUnavailable(f"mount -t tmpfs refused: {done.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def fill_disk(directory: Path, leave: int) -> Path:
    """Write a filler file in ``directory`` so that about ``leave`` bytes stay free; its
    path (delete it to free the space again)."""
    filler = directory / "filler"
    size = max(0, free_bytes(directory) - leave)
    with filler.open("wb") as handle:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            size -= handle.write(chunk[: min(size, len(chunk))])
    return filler


def damage_journal(path: Path, how: str, *, seed: int = 0) -> Path:
    """Damage the SQLite journal at ``path`` one way of :data:`DAMAGES`; the damaged file.

    ``truncated``: cut to half its size; ``scribbled``: 8 KiB of random bytes written in
    its middle; ``header``: its first 100 bytes zeroed; ``wal``: a write-ahead log of
    random bytes beside it; ``empty``: cut to zero bytes.
    """
    rng = random.Random(seed)
    size = path.stat().st_size
    if how == "truncated":
        os.truncate(path, size // 2)
    elif how == "scribbled":
        with path.open("r+b") as handle:
            handle.seek(max(0, size // 2 - 4096))
            handle.write(rng.randbytes(8192))
    elif how == "header":
        with path.open("r+b") as handle:
            handle.write(bytes(100))
    elif how == "wal":
        wal = path.with_name(path.name + "-wal")
        wal.write_bytes(rng.randbytes(20_000))
        return wal
    elif how == "empty":
        os.truncate(path, 0)
    else:
        raise ValueError(f"unknown damage {how!r}; one of {', '.join(DAMAGES)}")
    return path
