"""What an overlay mount is made of, and the command that mounts one in a namespace of its own.

An agent's workspace under ``worktree`` isolation is a kernel overlayfs: read-only lower
layers (the call's snapshot of the tree at the bottom, perhaps a worker's change above it)
and, for an agent that may write, an upper layer that takes its writes. It is mounted in a
fresh user and mount namespace (``unshare -Urm``), so no root is needed and nothing is ever
mounted on the host; ``userxattr`` keeps overlayfs's own markers (opaque directories) in
the ``user.`` attributes, which a user namespace may write.

Pure data and argv: the sandbox (:mod:`orchmode.shell`) puts the wrapper before bubblewrap,
and the trees (:mod:`orchmode.trees`) before git when they must see the merged view.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .programs import program

#: With mount(8) as $1, mounts the overlay given as $2 (options) on $3, goes there, then
#: becomes the rest of the command line.
_MOUNT_SCRIPT = (
    '"$1" -t overlay overlay -o "$2" "$3" || { echo "orchmode: the agent\'s workspace '
    'could not be mounted" >&2; exit 125; }; cd "$3" || exit 125; shift 3; exec "$@"'
)
#: Characters the mount options cannot carry unescaped: a path holding one is not layered.
UNSAFE = frozenset(",:\\\n\t \"'=")


@dataclass(frozen=True)
class Overlay:
    """One overlay mount: its lower layers (top first), and its upper one if writable."""

    lowers: tuple[Path, ...]
    #: Where it is mounted (in the namespace only; on the host it stays an empty directory).
    target: Path
    upper: Path | None = None
    #: overlayfs's scratch directory, on the upper layer's file system.
    work: Path | None = None

    @property
    def writable(self) -> bool:
        return self.upper is not None

    def paths(self) -> tuple[Path, ...]:
        extra = (self.upper, self.work) if self.upper is not None and self.work else ()
        return (*self.lowers, self.target, *extra)

    def options(self) -> str:
        """The mount options: ``lowerdir=…[,upperdir=…,workdir=…],userxattr``."""
        options = ["lowerdir=" + ":".join(str(p) for p in self.lowers)]
        if self.upper is not None and self.work is not None:
            options += [f"upperdir={self.upper}", f"workdir={self.work}"]
        options.append("userxattr")
        if self.upper is None:
            options.append("ro")
        return ",".join(options)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in a new user and mount namespace with this overlay mounted.

        Inside, the caller is root of that namespace (its own user outside): a sandbox that
        follows maps it back to the user's own ids.
        """
        return [
            program("unshare"),
            "--user",
            "--map-root-user",
            "--mount",
            "/bin/sh",
            "-c",
            _MOUNT_SCRIPT,
            "orchmode-overlay",
            program("mount"),
            self.options(),
            str(self.target),
            *argv,
        ]


def unsafe_path(path: Path) -> bool:
    """Whether ``path`` cannot be named in overlay mount options as it is."""
    return any(c in UNSAFE for c in str(path))
