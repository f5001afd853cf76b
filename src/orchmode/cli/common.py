"""What every command shares: its settings, its working directory, a line for the user."""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path

from ..core.settings import Settings, flag_names, load_settings
from ..views.escape import visible


def say(text: str, stream: typing.TextIO | None = None) -> None:
    """One line for the user (stdout unless told): whatever it quotes — a session's name, a
    model's words in an error — its control characters are shown, never obeyed."""
    print(visible(text), file=stream or sys.stdout)


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings of this command; a project's settings that need trust and were ignored
    are said in one line on stderr."""
    flags = {name: getattr(args, name, None) for name in flag_names()}
    return load_settings(
        flags, env=os.environ, cwd=Path.cwd(), config_file=args.config, warn=_settings_warning
    )


def _settings_warning(line: str) -> None:
    say(f"orchmode: {line}", sys.stderr)


def workdir_of(settings: Settings) -> Path:
    return (settings.workdir or Path.cwd()).resolve()
