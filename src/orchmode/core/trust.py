"""Which directories' own settings the user trusts, kept with their settings files' hashes.

A repository under review must not be able to loosen orchmode's safety by shipping settings,
so a project's settings that weaken it are taken only from a directory the user trusted
(``orchmode trust``). What is recorded is the directory's real path and the SHA-256 of each of
its settings files — ``orchmode.toml``, the ``.claude/`` settings, and the files those settings
name that orchmode reads or runs — so a ``git pull`` that changes any of them, or adds one,
asks again. The record is its own file, ``trusted.toml``, rather than a table in the user's
``config.toml``: orchmode rewrites it, and a file the user edits by hand keeps its comments.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .errors import ConfigError

#: The files of a directory that hold its own settings, always hashed (when present).
SETTINGS_FILES = ("orchmode.toml", ".claude/settings.json", ".claude/settings.local.json")
#: The record of trusted directories, in the user's configuration directory.
TRUST_FILE = "trusted.toml"
_HEADER = (
    "# Directories whose own settings orchmode takes in full: written by `orchmode trust`.\n"
    "# A directory stays trusted while each of its settings files has the hash recorded here;\n"
    "# `orchmode trust --revoke DIR` removes one.\n"
)


@dataclass(frozen=True)
class TrustRecord:
    """One trusted directory: its real path, when it was trusted, and its files' hashes."""

    path: str
    trusted_at: str
    #: file (relative to the directory when inside it, else absolute) -> ``sha256:<hex>``
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    """Whether a directory's settings are trusted now, and if not, what changed."""

    directory: Path
    trusted: bool
    #: Files whose hash differs from the one recorded, or that appeared or went since
    #: (empty when the directory was never trusted).
    changed: tuple[str, ...] = ()
    #: The directory was trusted once (so the files changed since).
    known: bool = False


def real_directory(directory: Path) -> Path:
    """The directory's real path (links resolved), which is what trust is keyed by."""
    return Path(os.path.realpath(directory))


def file_key(directory: Path, path: Path) -> str:
    """How a file is named in a record: relative to the directory when inside it."""
    where = Path(os.path.normpath(directory / path))
    try:
        return where.relative_to(directory).as_posix()
    except ValueError:
        return str(where)


def fingerprint(
    directory: Path, named: Iterable[Path] = (), *, seen: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The SHA-256 of each settings file the directory holds, and of each file in ``named``
    (the files its settings name that orchmode reads or runs; relative to the directory).

    A file that is absent is left out, so one that appears later changes the fingerprint.
    ``seen`` gives the hash of a file already read (by its key), so the hash checked is that
    of the very bytes used, not of the file as it is a moment later.
    """
    directory = real_directory(directory)
    found: dict[str, str] = dict(seen or {})
    for path in (*(Path(name) for name in SETTINGS_FILES), *named):
        full = Path(os.path.normpath(directory / path))
        key = file_key(directory, path)
        if key not in found and full.is_file():
            found[key] = _sha256(full)
    return dict(sorted(found.items()))


def digest(content: bytes) -> str:
    """How a file's content is recorded: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(content).hexdigest()


def _sha256(path: Path) -> str:
    hashed = hashlib.sha256()
    try:
        with path.open("rb") as stream:
            while chunk := stream.read(1 << 16):
                hashed.update(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} to check it is unchanged: {exc}") from exc
    return "sha256:" + hashed.hexdigest()


def verdict(records: Mapping[str, TrustRecord], directory: Path, now: Mapping[str, str]) -> Verdict:
    """Whether ``directory``, whose settings files hash to ``now``, is trusted by ``records``."""
    directory = real_directory(directory)
    record = records.get(str(directory))
    if record is None:
        return Verdict(directory, trusted=False)
    changed = sorted(
        name for name in {*record.files, *now} if record.files.get(name) != now.get(name)
    )
    return Verdict(directory, trusted=not changed, changed=tuple(changed), known=True)


# --------------------------------------------------------------------------- the record


def trust_file(config_dir: Path) -> Path:
    return config_dir / TRUST_FILE


def directory_entries(path: Path) -> list[Any]:
    """The ``[[directory]]`` tables of one of orchmode's own files in the user's config
    directory (none when it does not exist yet); a broken one is a ConfigError saying so."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc} — fix or delete it") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc} — fix or delete it") from exc
    entries = data.get("directory", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: `directory` must be a list of tables — fix or delete it")
    return entries


def read_records(config_dir: Path) -> dict[str, TrustRecord]:
    """Every trusted directory, by real path (none when the file does not exist yet)."""
    path = trust_file(config_dir)
    entries = directory_entries(path)
    records: dict[str, TrustRecord] = {}
    for entry in entries:
        files = entry.get("files", {}) if isinstance(entry, dict) else None
        where = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(where, str) or not isinstance(files, dict):
            raise ConfigError(f"{path}: an entry without a path or files — fix or delete it")
        records[where] = TrustRecord(
            path=where,
            trusted_at=str(entry.get("trusted_at", "")),
            files={str(k): str(v) for k, v in files.items()},
        )
    return records


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and control characters escaped."""
    out = ['"']
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def render_records(records: Iterable[TrustRecord]) -> str:
    """The text of ``trusted.toml`` holding ``records``, sorted by path."""
    parts = [_HEADER]
    for record in sorted(records, key=lambda r: r.path):
        parts.append(
            f"\n[[directory]]\npath = {toml_string(record.path)}\n"
            f"trusted_at = {toml_string(record.trusted_at)}\n\n[directory.files]\n"
        )
        parts.extend(f"{toml_string(k)} = {toml_string(v)}\n" for k, v in record.files.items())
    return "".join(parts)


@contextmanager
def locked(config_dir: Path, name: str = TRUST_FILE) -> Iterator[None]:
    """One process at a time rewrites the record ``name`` in ``config_dir`` (a read, a
    change, a write): ``orchmode trust`` for ``trusted.toml``, ``--always`` for the rules."""
    try:
        config_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = (config_dir / f".{name}.lock").open("a")
    except OSError as exc:
        raise ConfigError(
            f"cannot write to {config_dir}: {exc.strerror or exc} — "
            "set XDG_CONFIG_HOME to a writable directory"
        ) from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write(config_dir: Path, records: Iterable[TrustRecord]) -> None:
    try:
        text = render_records(records).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError("a path that is not valid UTF-8 cannot be recorded as trusted") from exc
    replace_file(config_dir, TRUST_FILE, text)


def replace_file(config_dir: Path, name: str, text: bytes) -> None:
    """Replace the record ``name`` at once: a reader sees the old file or the new, never
    half of one."""
    path = config_dir / name
    handle, partial = tempfile.mkstemp(prefix=f".{name}.", dir=config_dir)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(partial, path)
    except OSError as exc:
        Path(partial).unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from exc


def trust(config_dir: Path, directory: Path, named: Iterable[Path] = ()) -> TrustRecord:
    """Record ``directory`` as trusted with its settings files as they are now."""
    directory = real_directory(directory)
    record = TrustRecord(
        path=str(directory),
        trusted_at=datetime.now(UTC).isoformat(timespec="seconds"),
        files=fingerprint(directory, named),
    )
    with locked(config_dir):
        records = read_records(config_dir)
        records[record.path] = record
        _write(config_dir, records.values())
    return record


def revoke(config_dir: Path, directory: Path) -> bool:
    """Forget ``directory`` (its real path, or the path as recorded); whether it was trusted."""
    wanted = {str(real_directory(directory)), str(directory)}
    with locked(config_dir):
        records = read_records(config_dir)
        kept = {path: record for path, record in records.items() if path not in wanted}
        if len(kept) == len(records):
            return False
        _write(config_dir, kept.values())
    return True
