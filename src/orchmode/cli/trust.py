"""``orchmode trust``: record, list or revoke the directories whose own settings are taken."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..core.errors import ConfigError
from .common import say


def cmd_trust(args: argparse.Namespace) -> int:
    """``orchmode trust``: record, list or revoke the directories whose settings are taken."""
    from ..core import trust
    from ..core.settings import named_files, needs_trust, project_settings, user_config_dir

    config_dir = user_config_dir(os.environ)
    record_file = trust.trust_file(config_dir)
    if args.list:
        if args.directory is not None:
            raise ConfigError("--list takes no directory — `orchmode trust --list`")
        records = trust.read_records(config_dir)
        if not records:
            say(f"no directory is trusted (none recorded in {record_file})")
            return 0
        for path, record in sorted(records.items()):
            say(f"{path}  (trusted {record.trusted_at}): {_trust_state(path, config_dir)}")
        return 0
    directory = trust.real_directory(args.directory or Path.cwd())
    if args.revoke:
        if trust.revoke(config_dir, directory):
            say(f"no longer trusted: {directory} (removed from {record_file})")
        else:
            say(f"{directory} was not trusted; nothing to revoke")
        return 0
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory — name the one whose settings to trust")
    values = project_settings(directory)
    named = named_files(values)
    record = trust.trust(config_dir, directory, named.values())
    say(f"trusted {directory}, recorded in {record_file}:")
    if not record.files:
        say("  no settings files yet; one added later makes it untrusted again")
    protected = [name for name in values if needs_trust(name)]
    naming = {trust.file_key(directory, path): setting for setting, path in named.items()}
    width = max((len(name) for name in record.files), default=0)
    for name, digest in record.files.items():
        note = ""
        if name == "orchmode.toml" and protected:
            note = f"  sets {', '.join(protected)}"
        elif name in naming:
            note = f"  named by orchmode.toml's {naming[name]}"
        say(f"  {name:<{width}}  {digest[:19]}…{note}")
    say(
        "A change to any of these files, or a new settings file, makes the directory "
        "untrusted again until you run `orchmode trust` once more."
    )
    return 0


def _trust_state(path: str, config_dir: Path) -> str:
    """``trusted``, or why a recorded directory is no longer."""
    from ..core.settings import project_settings, project_verdict
    from ..core.wording import listed

    directory = Path(path)
    if not directory.is_dir():
        return "gone (the directory no longer exists)"
    try:
        found = project_verdict(directory, project_settings(directory), config_dir)
    except ConfigError as exc:
        return f"cannot be checked: {exc}"
    if found.trusted:
        return "trusted"
    return f"changed since ({listed(list(found.changed))}): not trusted until trusted again"
