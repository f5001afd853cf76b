"""Every agent's full result as a file, so nothing condensed away is lost to the main agent.

One directory per session, ``.orchmode/results/<session>/`` in the working directory. It
holds a JSON file per agent (named by the agent's content key, so a journal rerun names the
same file), the whole text of each Workflow result, and the saved copy of every tool result
a compaction took out of the conversation. Files are written atomically (a temporary file,
then a rename) and made read-only; the sandbox shows the directory read-only to every
agent, so the main agent can ``cat``, ``grep`` or ``jq`` it and no agent can change it.
Known credentials are masked before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..core.pids import pid_alive
from ..core.secrets import Masker
from ..core.wire import JsonRecord

log = logging.getLogger("orchmode")

RESULTS_DIR = Path(".orchmode") / "results"
#: A name that is safe as one path component.
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def results_dir(workdir: Path, session: str) -> Path:
    return Path(os.path.realpath(workdir)) / RESULTS_DIR / _SAFE.sub("_", session)


class ResultFiles:
    """Writes one session's result files; a failure to write is logged, never raised."""

    def __init__(self, directory: Path, masker: Masker | None = None) -> None:
        self.directory = directory
        self._masker = masker if masker is not None else Masker()
        #: Told (from any thread) of a file not written because the disk is full: that stops
        #: a run (see :class:`orchmode.store.base.Failure`), which a resume writes again.
        self.on_full: Callable[[Path], None] | None = None

    def make_directory(self) -> bool:
        """Make the directory (before any sandbox mounts it); False if it cannot be made.
        The temporary files a killed process left here (named by its pid) go."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot make the results directory %s: %s", self.directory, exc)
            return False
        for left in self.directory.glob(".tmp-*-*"):
            pid = left.name.split("-")[1]
            if pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    left.unlink()
        return True

    def agent_path(self, role: str, key: str) -> Path:
        return self.directory / f"{role}-{key[:12]}.json"

    def write_agent(self, role: str, key: str, record: JsonRecord) -> str:
        """Write an agent's record; its path (even if writing failed, the name is stable)."""
        path = self.agent_path(role, key)
        self._write(path, json.dumps(record, ensure_ascii=False, indent=2) + "\n")
        return str(path)

    def write_text(self, kind: str, identity: str, text: str) -> str | None:
        """Save ``text`` under a name made from ``identity``; its path, or None on failure."""
        digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
        path = self.directory / f"{kind}-{digest}.txt"
        return str(path) if self._write(path, text) else None

    def write_patch(self, key: str, patch: str) -> str:
        """Save a worker's patch, named by its agent's key; its path, or "" on failure."""
        path = self.directory / f"patch-{key[:12]}.patch"
        return str(path) if self._write(path, patch) else ""

    def _write(self, path: Path, text: str) -> bool:
        data = self._masker.mask(text)
        try:
            if path.is_file() and path.read_text(encoding="utf-8") == data:
                return True  # the same bytes are there already (a rerun)
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".tmp-{os.getpid()}-")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(data)
                os.chmod(tmp, 0o444)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except (OSError, UnicodeDecodeError) as exc:
            full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
            if full and self.on_full is not None:
                self.on_full(path)  # said once, by whoever stops the run
                return False
            log.warning("could not save %s: %s", path, exc)
            return False
        return True
