"""The environment model-written commands run with: the user's, minus anything that is a secret.

Whatever a command prints goes to the model, into the conversation and the journal, so a
credential in the shell's environment would leak with a single ``env``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.secrets import is_secret_name

__all__ = ["command_environment", "is_secret_name", "proxy_environment"]


def command_environment(env: Mapping[str, str], secrets: tuple[str, ...] = ()) -> dict[str, str]:
    """``env`` without credential variables, nor any variable whose value is a known secret."""
    known = {s for s in secrets if s}
    return {
        name: value
        for name, value in env.items()
        if not is_secret_name(name) and value not in known
    }


def proxy_environment(port: int) -> dict[str, str]:
    """The variables that send ``pip``, ``npm``, ``git``, ``curl`` and ``uv`` through the
    filtering proxy listening on ``port`` of the sandbox's own loopback: HTTP and HTTPS as
    an HTTP proxy, everything else as SOCKS5 with names resolved by the proxy."""
    http = f"http://127.0.0.1:{port}"
    env = {
        "HTTP_PROXY": http,
        "HTTPS_PROXY": http,
        "ALL_PROXY": f"socks5h://127.0.0.1:{port}",
        "NO_PROXY": "localhost,127.0.0.1,::1",
    }
    return {**env, **{name.lower(): value for name, value in env.items()}}
