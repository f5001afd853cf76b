"""The environment model-written commands run with: the user's, minus anything that is a secret.

Whatever a command prints goes to the model, into the conversation and the journal, so a
credential in the shell's environment would leak with a single ``env``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.secrets import is_secret_name

__all__ = ["command_environment", "is_secret_name"]


def command_environment(env: Mapping[str, str], secrets: tuple[str, ...] = ()) -> dict[str, str]:
    """``env`` without credential variables, nor any variable whose value is a known secret."""
    known = {s for s in secrets if s}
    return {
        name: value
        for name, value in env.items()
        if not is_secret_name(name) and value not in known
    }
