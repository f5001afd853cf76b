"""Starting ``orchmode run`` from the console and stopping a run the way Ctrl-C does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from ..core.errors import OrchmodeError


class ControlError(OrchmodeError):
    """A start or a stop the console refuses, said for the person who asked."""


class Runs:
    """The runs this server started, each in its own process group (so a stop reaches its
    shells too, as Ctrl-C on its terminal would)."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self._started: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, task: str, directory: str) -> int:
        """Start ``orchmode run TASK`` in ``directory``, recording to this console's store;
        its process id."""
        if not task.strip():
            raise ControlError("a run needs a task")
        where = Path(directory).expanduser()
        if not directory.strip() or not where.is_dir():
            raise ControlError(f"no directory {directory!r} — give one that exists")
        process = subprocess.Popen(
            [sys.executable, "-m", "orchmode", "run", task, "--store", self.store_url],
            cwd=where.resolve(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._started[process.pid] = process
        return process.pid

    def stop(self, pid: int) -> None:
        """SIGINT to the run's process (its whole group when this server started it): it
        stops as after Ctrl-C, recorded up to its last step and resumable."""
        try:
            if pid in self._started:
                os.killpg(pid, signal.SIGINT)
            else:
                os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            raise ControlError(f"process {pid} has ended already") from None
        except PermissionError:
            raise ControlError(f"process {pid} is not this server's to stop") from None

    def reap(self) -> None:
        """Forget the started runs that ended (and collect their exit status)."""
        for pid, process in list(self._started.items()):
            if process.poll() is not None:
                del self._started[pid]

    def close(self) -> None:
        """The server stops; its runs go on (they are recorded and their own processes)."""
        for process in self._started.values():
            with contextlib.suppress(OSError):
                process.poll()
        self._started.clear()
