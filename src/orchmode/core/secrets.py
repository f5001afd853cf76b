"""Secrets kept from the model: which files hold them, and masking their values in text.

Two lines of defence, one for each way a secret leaks:

- **Secret files** (``secret_files``: ``.env``, ``*.pem``, ``id_rsa*`` …) are withheld: the
  sandbox shows every agent a short note in their place, snapshots leave them out, and a
  change that writes one is refused. :class:`SecretFiles` says which paths match, and
  :func:`find_secret_files` finds them in a working directory.
- **Secret values** are masked (``***``) in everything on its way to the model or the
  records: the values of orchmode's own credential variables, and the values read from
  the withheld files, so that ``git show HEAD:.env`` on a committed secret leaks nothing
  either. :class:`Masker` does it, in one pass over the text for all of them.
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import os
import re
import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ahocorasick_rs import AhoCorasick, MatchKind

from .programs import program

__all__ = [
    "DEFAULT_SECRET_FILES",
    "MASK",
    "WITHHELD_NOTE",
    "Masker",
    "SecretFiles",
    "Secrets",
    "environment_secrets",
    "find_secret_files",
    "is_secret_name",
    "values_in",
]

#: What ``secret_files`` holds unless ``orchmode.toml`` says otherwise.
DEFAULT_SECRET_FILES: tuple[str, ...] = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ed25519*",
    ".npmrc",
    ".pypirc",
    ".netrc",
    "credentials.json",
    "*.p12",
    ".git-credentials",
)
#: What a masked value becomes.
MASK = "***"
#: What an agent reads in place of a withheld file.
WITHHELD_NOTE = (
    "[orchmode: this file is withheld from agents: it matches the secret_files setting]\n"
)

#: A value read from a ``KEY=VALUE`` file is masked from this length, a line of any other
#: file from the next: shorter ones are settings (``1``, ``true``, ``info``), and masking
#: them would blank ordinary words all over the output.
MIN_VALUE = 6
MIN_LINE = 8
#: Secret files larger than this are not read for values (a key is a few KB at most).
MAX_READ = 1024 * 1024

_SECRET_PART = re.compile(r"PASSWORD|PASSWD|SECRET|CREDENTIAL|TOKEN(?!IZER)", re.IGNORECASE)
_SECRET_WORD = re.compile(r"(^|_)(API_?KEY|KEY|AUTH|PASS|PRIVATE|SESSION)(_|$)", re.IGNORECASE)
#: Named outright, whatever the pattern says.
_ALWAYS = {"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "SSH_AUTH_SOCK", "GPG_AGENT_INFO"}
#: Directories never searched for secret files: git's own, and orchmode's state.
_SKIPPED_DIRS = {".git", ".orchmode"}
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*[=:]\s*(.*?)\s*$")

T = TypeVar("T")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name marks its value as a credential."""
    return name in _ALWAYS or bool(_SECRET_PART.search(name) or _SECRET_WORD.search(name))


def environment_secrets(env: Mapping[str, str]) -> list[str]:
    """The values of ``env``'s credential variables that are long enough to mask."""
    return [v for k, v in env.items() if is_secret_name(k) and len(v.strip()) >= MIN_LINE]


def _glob_regex(pattern: str) -> str:
    """A gitignore-style glob as a regex: ``*`` and ``?`` stay within one path component,
    ``**`` crosses them, ``[...]`` is a class."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class SecretFiles:
    """The ``secret_files`` patterns, matched as ``.gitignore`` matches files.

    A pattern without a ``/`` matches a file's name in any directory (``.env`` matches
    ``config/.env``); one with a ``/`` matches its path from the working directory's root
    (``deploy/*.json``). Matching is case-sensitive, as git's is on Linux.
    """

    patterns: tuple[str, ...] = DEFAULT_SECRET_FILES

    def __post_init__(self) -> None:
        names = [p for p in self.patterns if "/" not in p.strip("/")]
        paths = [p.strip("/") for p in self.patterns if "/" in p.strip("/")]
        object.__setattr__(self, "_names", _compiled(names))
        object.__setattr__(self, "_paths", _compiled(paths))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def name_matches(self, name: str) -> bool:
        found: re.Pattern[str] | None = self._names  # type: ignore[attr-defined]
        return found is not None and found.fullmatch(name) is not None

    def path_matches(self, path: str) -> bool:
        """Whether a pattern with a ``/`` matches ``path`` (no leading or trailing ``/``)."""
        found: re.Pattern[str] | None = self._paths  # type: ignore[attr-defined]
        return found is not None and found.fullmatch(path) is not None

    def matches(self, path: str) -> bool:
        """Whether ``path`` (relative to the working directory, ``/``-separated) is secret."""
        path = path.strip("/")
        if not path:
            return False
        return self.name_matches(path.rsplit("/", 1)[-1]) or self.path_matches(path)


def _compiled(globs: Sequence[str]) -> re.Pattern[str] | None:
    if not globs:
        return None
    return re.compile("|".join(f"(?:{_glob_regex(g)})" for g in globs), re.DOTALL)


def find_secret_files(workdir: Path, secret: SecretFiles) -> tuple[str, ...]:
    """The files (and symbolic links) under ``workdir`` that ``secret`` matches, relative
    to it and sorted; tracked, untracked and ignored alike. ``.git`` and ``.orchmode`` are
    not searched, nor are directories behind symbolic links.

    One ``scandir`` per directory, whose entries know their kind without a ``stat``: this
    runs at every user turn, over trees of 100,000 files."""
    if not secret:
        return ()
    found: list[str] = []
    pending = [(str(workdir), "")]
    while pending:
        top, prefix = pending.pop()
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    name = entry.name
                    try:
                        directory = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        directory = False
                    if directory:
                        if name not in _SKIPPED_DIRS:
                            pending.append((entry.path, f"{prefix}{name}/"))
                    elif secret.name_matches(name) or secret.path_matches(prefix + name):
                        found.append(prefix + name)
        except OSError:  # gone, or unreadable: nothing in it is shown either
            continue
    return tuple(sorted(found))


def values_in(data: bytes) -> list[str]:
    """The secrets a withheld file holds: each value of a ``KEY=VALUE`` file (``.env``,
    ``.npmrc``), every line of any other text file (a key, a token file). A binary file
    (``.p12``) gives none: its bytes never reach a tool's text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    lines = [line.strip() for line in text.splitlines()]
    meaningful = [line for line in lines if line and not line.startswith(("#", ";"))]
    assignments = [_ASSIGNMENT.match(line) for line in meaningful]
    if meaningful and all(assignments):
        values = [_unquoted(m.group(2)) for m in assignments if m is not None]
        return [v for v in values if len(v) >= MIN_VALUE]
    found = [line for line in lines if len(line) >= MIN_LINE]
    for line in meaningful:
        # what follows the last `=` (``//registry/:_authToken=…`` in an .npmrc), and the
        # word after a credential's keyword (``password …`` in a .netrc)
        if "=" in line and len(value := _unquoted(line.rsplit("=", 1)[1].strip())) >= MIN_VALUE:
            found.append(value)
        words = line.split()
        found += [
            word
            for key, word in itertools.pairwise(words)
            if is_secret_name(key) and len(word) >= MIN_VALUE
        ]
    return found


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if " #" in value:  # a comment after an unquoted value
        value = value.split(" #", 1)[0].rstrip()
    return value


#: The shortest value whose encoded forms are masked too: a shorter one's would be a few
#: characters that ordinary text holds by chance.
MIN_ENCODED = 8


def encodings(value: str) -> tuple[str, ...]:
    """What ``value`` looks like after ``base64``, ``xxd -p``/``od``-style hex or ``rev``:
    masked as the value is, so that a command that passes a secret through one of them does
    not carry it out. Base64 depends on where the value starts in the encoded stream (three
    alignments); each form keeps only the characters the value alone decides, so it is
    found wherever the value sat. What no mask can catch: a value split across outputs,
    or changed by a transform not listed here (``docs/sandbox.md`` says which)."""
    if len(value) < MIN_ENCODED:
        return ()
    raw = value.encode("utf-8", "surrogateescape")
    forms = [raw.hex(), raw.hex().upper(), value[::-1]]
    for pad in range(3):
        encoded = base64.b64encode(bytes(pad) + raw).decode("ascii")
        first = -(-8 * pad // 6)  # the first character made of the value's bits alone
        last = 8 * (pad + len(raw)) // 6  # one past the last such character
        forms.append(encoded[first:last])
    return tuple(f for f in forms if len(f) >= MIN_ENCODED and f != value)


class Masker:
    """Replaces every known secret with ``***``, leftmost-longest, so a secret that contains
    another is masked whole. One Aho-Corasick automaton finds them all in a single pass
    over the text, however many there are (a regex alternation of a few hundred random
    tokens costs milliseconds per command's output). Safe to share between threads."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: frozenset[str] = frozenset()
        #: The longest secret's length: how far past a cut text must be kept to mask it.
        self.longest = 0
        self._pattern: AhoCorasick | None = None
        self._lock = threading.Lock()
        self.add(secrets)

    def __bool__(self) -> bool:
        return self._pattern is not None

    @property
    def secrets(self) -> frozenset[str]:
        return self._secrets

    def add(self, secrets: Iterable[str]) -> None:
        """Mask ``secrets`` too (blank ones and the mask itself are left out), and the forms
        a command turns a value into without trying to hide it (see :func:`encodings`)."""
        new = {s for s in secrets if s.strip() and s != MASK}
        with self._lock:
            if new <= self._secrets:
                return
            merged = self._secrets | new
            shown = {form for value in merged for form in (value, *encodings(value))}
            self._pattern = AhoCorasick(sorted(shown), matchkind=MatchKind.LeftmostLongest)
            self._secrets = frozenset(merged)
            self.longest = max(map(len, shown))

    def add_files(self, workdir: Path, paths: Iterable[str]) -> None:
        """Mask the values held by the files ``paths`` (relative to ``workdir``)."""
        values: list[str] = []
        for relative in paths:
            path = workdir / relative
            try:
                if not path.is_file() or path.stat().st_size > MAX_READ:
                    continue
                values.extend(values_in(path.read_bytes()))
            except OSError:
                continue
        self.add(values)

    def holds(self, text: str) -> bool:
        """Whether ``text`` has a secret in it."""
        pattern = self._pattern
        return pattern is not None and bool(text) and bool(pattern.find_matches_as_indexes(text))

    def mask(self, text: str) -> str:
        pattern = self._pattern
        if pattern is None or not text:
            return text
        found = pattern.find_matches_as_indexes(text)
        if not found:
            return text
        pieces: list[str] = []
        last = 0
        for _, start, end in found:
            pieces += (text[last:start], MASK)
            last = end
        pieces.append(text[last:])
        return "".join(pieces)

    def _masked(self, data: Any) -> Any:
        if isinstance(data, str):
            return self.mask(data)
        if isinstance(data, dict):
            return {k: self._masked(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self._masked(v) for v in data]
        if isinstance(data, tuple):
            return tuple(self._masked(v) for v in data)
        return data

    def mask_event(self, event: T) -> T:
        """A dataclass event with its text fields masked; itself when nothing is secret.

        Nearly every event holds no secret: its texts are looked through in one pass (one
        scan of them joined), and only an event where that finds one is copied, masked."""
        pattern = self._pattern
        if pattern is None or not dataclasses.is_dataclass(event):
            return event
        names = _FIELD_NAMES.get(type(event))
        if names is None:  # the fields of each event type, asked once
            names = _FIELD_NAMES[type(event)] = tuple(f.name for f in dataclasses.fields(event))
        texts: list[str] = []
        for name in names:
            _gather_texts(getattr(event, name), texts)
        # Each text whole in the joined one: a secret in any of them is found (one spanning
        # two of them, a false alarm, only sends the event the slow way).
        if not texts or not pattern.find_matches_as_indexes("\0".join(texts)):
            return event
        changes: dict[str, object] = {}
        for name in names:
            value = getattr(event, name)
            if isinstance(value, str | tuple | list | dict):
                masked = self._masked(value)
                if masked != value:
                    changes[name] = masked
        if not changes:
            return event
        return dataclasses.replace(event, **changes)  # type: ignore[type-var]


#: Each event type's fields, by name.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _gather_texts(data: object, texts: list[str]) -> None:
    """Append to ``texts`` every string in ``data``: the values :meth:`Masker._masked` masks."""
    if isinstance(data, str):
        if data:
            texts.append(data)
    elif isinstance(data, dict):
        for value in data.values():
            _gather_texts(value, texts)
    elif isinstance(data, list | tuple):
        for value in data:
            _gather_texts(value, texts)


class Secrets:
    """A session's secrets: the patterns, the files they match in the working directory
    (looked for again at each user turn and each snapshot), and the masker that knows
    every value."""

    def __init__(self, files: SecretFiles, workdir: Path, masker: Masker | None = None) -> None:
        self.files = files
        self.workdir = workdir
        self.masker = masker if masker is not None else Masker()
        #: The secret files found at the last look, relative to the working directory.
        self.found: tuple[str, ...] = ()
        #: The secret files git holds, found at the start (see :meth:`committed`).
        self.in_git: tuple[str, ...] = ()

    @classmethod
    def start(
        cls,
        patterns: Sequence[str],
        workdir: Path,
        env: Mapping[str, str],
        known: Iterable[str] = (),
    ) -> Secrets:
        """The secrets of a session starting in ``workdir``: its credentials ``known``, the
        credential variables of ``env``, and the values of the secret files there now."""
        secrets = cls(SecretFiles(tuple(patterns)), Path(os.path.realpath(workdir)))
        secrets.masker.add([*known, *environment_secrets(env)])
        secrets.look()
        secrets.in_git = secrets.committed()
        return secrets

    def committed(self) -> tuple[str, ...]:
        """The secret files git holds (in the index, as at ``HEAD`` or staged since), whose
        values are learnt here too: withholding hides a file, not git's copy of it, which an
        agent reads with ``git show``. Older commits are not read (a walk of the history
        would cost seconds in a large repository); the docs say so."""
        try:
            listed = subprocess.run(
                [program("git"), "-C", str(self.workdir), "ls-files", "-z", "--cached"],
                capture_output=True,
                timeout=60,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return ()  # not a repository, or no git: nothing committed to read
        names = [n for n in listed.decode("utf-8", "surrogateescape").split("\0") if n]
        tracked = tuple(n for n in names if self.files.matches(n))
        if not tracked:
            return ()
        wanted = "".join(f":{name}\n" for name in tracked if "\n" not in name)
        try:
            blobs = subprocess.run(
                [program("git"), "-C", str(self.workdir), "cat-file", "--batch"],
                input=wanted.encode("utf-8", "surrogateescape"),
                capture_output=True,
                timeout=60,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return tracked
        self.masker.add(value for content in _batch_contents(blobs) for value in values_in(content))
        return tracked

    def look(self) -> tuple[str, ...]:
        """Find the secret files again (a turn starts, or a snapshot is about to be taken)
        and learn their values; the files found."""
        found = find_secret_files(self.workdir, self.files)
        self.masker.add_files(self.workdir, found)  # read again: a value may have changed
        self.found = found
        return found


def _batch_contents(output: bytes) -> Iterator[bytes]:
    """The objects' contents in ``git cat-file --batch`` output (headers, then bodies)."""
    at = 0
    while at < len(output):
        end = output.find(b"\n", at)
        if end < 0:
            return
        header = output[at:end].split()
        at = end + 1
        if len(header) != 3 or not header[2].isdigit():
            continue  # "<name> missing", and the like
        size = int(header[2])
        if size <= MAX_READ:
            yield output[at : at + size]
        at += size + 1


def committed_secrets_warning(paths: Sequence[str]) -> str:
    """The start's one line when git holds secret files: what withholding cannot cover."""
    from .wording import listed

    return (
        f"git holds secret files ({listed(list(paths))}): agents are shown a note in their "
        f"place, but can read git's copy (`git show HEAD:{paths[0]}`); their values are masked, "
        "verbatim and as base64, hex or reversed, but not split or otherwise transformed — "
        "rotate those secrets and take the files out of git"
    )
