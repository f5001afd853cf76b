"""The environment model-written commands run with: the user's, minus anything that is a secret.

Whatever a command prints goes to the model, into the conversation and the journal, so a
credential in the shell's environment would leak with a single ``env``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SECRET_PART = re.compile(r"PASSWORD|PASSWD|SECRET|CREDENTIAL|TOKEN(?!IZER)", re.IGNORECASE)
_SECRET_WORD = re.compile(r"(^|_)(API_?KEY|KEY|AUTH|PASS|PRIVATE|SESSION)(_|$)", re.IGNORECASE)
#: Named outright, whatever the pattern says.
_ALWAYS = {"ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "SSH_AUTH_SOCK", "GPG_AGENT_INFO"}


def is_secret_name(name: str) -> bool:
    return name in _ALWAYS or bool(_SECRET_PART.search(name) or _SECRET_WORD.search(name))


def command_environment(env: Mapping[str, str], secrets: tuple[str, ...] = ()) -> dict[str, str]:
    """``env`` without credential variables, nor any variable whose value is a known secret."""
    known = {s for s in secrets if s}
    return {
        name: value
        for name, value in env.items()
        if not is_secret_name(name) and value not in known
    }
