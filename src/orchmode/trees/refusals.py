"""Whether a worker's patch may be applied to the user's tree: what no change may write.

No change writes outside the tree, inside ``.git``, into orchmode's own state or settings,
adds a submodule, or leaves a symbolic link that points out of the tree or into ``.git``.
Names are compared as a case-insensitive Windows or macOS file system would, since the
user's tree may live on one.
"""

from __future__ import annotations

import re

from ..core.secrets import SecretFiles
from .patches import S_IFLNK, FileChange, PatchSummary, file_type, printable

_S_IFGITLINK = 0o160000
#: Code points HFS+ ignores in names, so ``.g\u200cit`` is ``.git`` on a Mac (git's list).
_HFS_IGNORED = dict.fromkeys(
    [0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
_SEPARATORS = re.compile(r"[/\\]")
_DRIVE = re.compile(r"[A-Za-z]:")


def refusals(summary: PatchSummary, secret: SecretFiles | None = None) -> list[str]:
    """Why the patch must not be applied to the user's tree, one reason per offending file.

    Empty when it may be applied. Names are compared as case-insensitive Windows and macOS
    file systems would, since the user's tree may live on one. A file ``secret`` matches
    (``secret_files``) is never written, moved or deleted by an agent either.
    """
    reasons: list[str] = []
    for change in summary.files:
        reason = _refusal(change)
        if reason is None and secret:
            reason = _secret_refusal(change, secret)
        if reason is not None:
            reasons.append(reason)
    return reasons


def _secret_refusal(change: FileChange, secret: SecretFiles) -> str | None:
    for path in (change.path, change.old_path):
        if path is not None and secret.matches(path.replace("\\", "/")):
            return f"`{printable(path)}`: writes a secret file (secret_files)"
    return None


def _refusal(change: FileChange) -> str | None:
    for path in (change.path, change.old_path):
        if path is not None and (why := _path_refusal(path)) is not None:
            return f"`{printable(path)}`: {why}"
    shown = f"`{printable(change.path)}`"
    kind = file_type(change.new_mode) if change.new_mode is not None else None
    if kind == _S_IFGITLINK:
        return f"{shown}: {'adds' if change.kind == 'added' else 'changes'} a submodule"
    if kind == S_IFLNK:
        why = _link_refusal(change.path, change.symlink_target)
        if why is not None:
            return f"{shown}: {why}"
    return None


def _path_refusal(path: str) -> str | None:
    if path == "" or "\0" in path or "\n" in path or _is_absolute(path):
        return "leaves the tree"
    parts = _components(path)
    if parts is None:
        return "leaves the tree"
    if not parts:
        return "leaves the tree"  # names the tree's root itself
    if any(_is_dotgit(part) for part in parts):
        return "writes inside .git"
    if _fold(parts[0]) == ".orchmode":
        return "writes orchmode's own state"
    if len(parts) == 1 and _fold(parts[0]) == "orchmode.toml":
        return "changes orchmode's settings"
    return None


def _link_refusal(path: str, target: str | None) -> str | None:
    if target is None:
        return "is a symbolic link whose target the patch does not show"
    if _is_absolute(target):
        return "is a symbolic link that points outside the tree"
    where = _components(path) or []
    resolved = where[:-1]  # the link's own directory
    for part in _SEPARATORS.split(target):
        if _is_dotgit(part):
            return "is a symbolic link that points into .git"
        if _is_dotdot(part):
            if not resolved:
                return "is a symbolic link that points outside the tree"
            resolved.pop()
        elif not _is_dot(part):
            resolved.append(part)
    if resolved and _fold(resolved[0]) == ".orchmode":
        return "is a symbolic link that points into orchmode's own state"
    return None


def _components(path: str) -> list[str] | None:
    """The path's components without ``.`` and empty ones; ``None`` when one climbs (``..``)."""
    parts = _SEPARATORS.split(path)  # a backslash separates on Windows
    if any(_is_dotdot(part) for part in parts):
        return None
    return [part for part in parts if not _is_dot(part)]


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "\\")) or _DRIVE.match(path) is not None


def _is_dot(part: str) -> bool:
    """``""``, ``.``, and ``. `` (which Windows reads as ``.``)."""
    return set(part) <= {".", " "} and part.count(".") <= 1


def _is_dotdot(part: str) -> bool:
    """``..`` and the names Windows also reads as it (``.. ``, ``...``)."""
    return set(part) <= {".", " "} and part.count(".") >= 2


def _fold(part: str) -> str:
    """A name as a case-insensitive Windows or macOS file system compares it."""
    part = part.translate(_HFS_IGNORED).split(":", 1)[0]  # ``.git::$INDEX_ALLOCATION``
    return part.rstrip(" .").casefold()


def _is_dotgit(part: str) -> bool:
    folded = _fold(part)
    return folded in (".git", "git~1")  # git~1: the NTFS short name of .git
