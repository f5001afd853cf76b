"""The rules the user allowed with ``--always``, kept by directory in their own ``rules.toml``.

Kept in the user's configuration directory, never in the repository, so a repository cannot
plant answers; they count only in the directory they were given for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .rule_syntax import REMEMBERED, parse_rule, shown
from .trust import directory_entries, locked, real_directory, replace_file, toml_string

#: The answers given with ``--always``, by directory, in the user's configuration directory.
RULES_FILE = "rules.toml"

_RULES_HEADER = (
    "# Rules you allowed with `--always`, by directory: written by orchmode.\n"
    "# They count only in that directory; delete a line (or the file) to be asked again.\n"
)


@dataclass
class _Remembered:
    path: str
    allow: list[str] = field(default_factory=list)


def _read_remembered(config_dir: Path) -> dict[str, _Remembered]:
    path = config_dir / RULES_FILE
    found: dict[str, _Remembered] = {}
    for entry in directory_entries(path):
        where = entry.get("path") if isinstance(entry, dict) else None
        allow = entry.get("allow", []) if isinstance(entry, dict) else None
        if not isinstance(where, str) or not isinstance(allow, list):
            raise ConfigError(f"{path}: an entry without a path or allow list — fix or delete it")
        kept = found.setdefault(where, _Remembered(where))
        kept.allow.extend(str(rule) for rule in allow if str(rule) not in kept.allow)
    return found


def _render_remembered(entries: Iterable[_Remembered]) -> str:
    parts = [_RULES_HEADER]
    for entry in sorted(entries, key=lambda e: e.path):
        listed = "".join(f"    {toml_string(rule)},\n" for rule in entry.allow)
        parts.append(f"\n[[directory]]\npath = {toml_string(entry.path)}\nallow = [\n{listed}]\n")
    return "".join(parts)


def remembered_rules(config_dir: Path, directory: Path) -> list[str]:
    """The rules allowed with ``--always`` in ``directory`` (its real path)."""
    entry = _read_remembered(config_dir).get(str(real_directory(directory)))
    return list(entry.allow) if entry else []


def remember(config_dir: Path, directory: Path, rule: str) -> None:
    """Record ``rule`` as allowed for ``directory`` in the user's own configuration (never a
    file of the repository): the next run there does not ask again."""
    parsed = parse_rule(rule, "allow", REMEMBERED)
    if isinstance(parsed, str):
        raise ConfigError(f"the rule {shown(rule)} cannot be remembered: {parsed}")
    where = str(real_directory(directory))
    with locked(config_dir, RULES_FILE):
        entries = _read_remembered(config_dir)
        entry = entries.setdefault(where, _Remembered(where))
        if rule in entry.allow:
            return
        entry.allow.append(rule)
        try:
            text = _render_remembered(entries.values()).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError("a rule or path that is not valid UTF-8 cannot be recorded") from exc
        replace_file(config_dir, RULES_FILE, text)
