"""MCP servers as the user configures them: the ``.mcp.json`` shape, checked and expanded.

The file is only ever read when the user names it (``--mcp-config``): a repository under
review must not be able to start processes by shipping a config of its own. Values may
name environment variables as ``${VAR}`` or ``${VAR:-default}``, as Claude Code's do, so
a token need not be written into the file. Everything here is pure but :func:`load`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.errors import ConfigError
from ..core.events import Role

#: The roles a server's tools can be offered to.
ROLES: tuple[Role, ...] = ("main", "worker", "verifier", "resolver")
#: Server names are part of tool names, which the API restricts to these characters.
SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
#: The API takes up to 128; 64 is the stricter limit other clients keep to.
MAX_TOOL_NAME = 64
#: The shortest env or header value taken for a secret (as saved results mask them).
MIN_SECRET = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Common(BaseModel):
    """What orchmode adds to a server's entry: who gets its tools, and which ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: list[Role] = Field(default_factory=lambda: list(ROLES))
    #: Tool names or shell-style patterns (``read_*``); empty means every tool.
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    #: Seconds one call may take; default ``mcp_timeout``.
    timeout: float | None = Field(None, gt=0)
    #: Seconds the server may take to start and list its tools.
    start_timeout: float = Field(30.0, gt=0)

    def offers(self, tool: str) -> bool:
        """Whether the allow and deny lists let ``tool`` through (deny wins)."""
        if any(fnmatch.fnmatchcase(tool, p) for p in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(tool, p) for p in self.allow)


class StdioServer(_Common):
    """A server orchmode starts as a child process and speaks to over stdin and stdout."""

    type: Literal["stdio"] = "stdio"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    #: Never shown: these are often tokens (see :attr:`McpConfig.secrets`).
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    cwd: str | None = None


class HttpServer(_Common):
    """A server reached over MCP's streamable HTTP transport."""

    type: Literal["http"]
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict, repr=False)


ServerEntry = Annotated[StdioServer | HttpServer, Field(discriminator="type")]


class McpConfig(BaseModel):
    """Every configured server, by name."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    servers: dict[str, ServerEntry] = Field(alias="mcpServers")

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never be shown: every env value and header a server is given."""
        found: set[str] = set()
        for server in self.servers.values():
            values = server.env.values() if isinstance(server, StdioServer) else ()
            headers = server.headers.values() if isinstance(server, HttpServer) else ()
            # Short values ("1", "info") are settings, not secrets, and masking them would
            # garble every result; known credentials are far longer.
            found.update(v for v in (*values, *headers) if len(v) >= MIN_SECRET)
        return tuple(sorted(found, key=len, reverse=True))

    def for_role(self, role: Role) -> list[str]:
        """The names of the servers whose tools ``role`` is offered, in a stable order."""
        return sorted(name for name, server in self.servers.items() if role in server.agents)


def expand(value: str, env: Mapping[str, str], where: str) -> str:
    """``value`` with ``${VAR}`` and ``${VAR:-default}`` filled from ``env``."""

    def fill(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = env.get(name)
        if found:
            return found
        if default is not None:
            return default
        raise ConfigError(f"{where} names ${{{name}}}, which is not set in the environment")

    return _VARIABLE.sub(fill, value)


def _expanded(raw: Any, env: Mapping[str, str], where: str) -> Any:
    if isinstance(raw, str):
        return expand(raw, env, where)
    if isinstance(raw, list):
        return [_expanded(v, env, f"{where}[{i}]") for i, v in enumerate(raw)]
    if isinstance(raw, dict):
        return {k: _expanded(v, env, f"{where}.{k}") for k, v in raw.items()}
    return raw


def parse(text: str, env: Mapping[str, str], source: str) -> McpConfig:
    """The config in ``text``; any problem is a :class:`ConfigError` naming where it is."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise ConfigError(
            f'{source} must be an object with "mcpServers": {{"<name>": {{...}}}}, as in .mcp.json'
        )
    servers = data["mcpServers"]
    for name, entry in servers.items():
        if not SERVER_NAME.match(name):
            raise ConfigError(
                f"{source}: server name {name!r} must be 1-32 letters, digits, '_' or '-' "
                "(it becomes part of each tool's name)"
            )
        if isinstance(entry, dict) and entry.get("type") == "sse":
            raise ConfigError(
                f"{source}: server {name!r} uses the old SSE transport, which orchmode does "
                'not speak; use "type": "http" (streamable HTTP)'
            )
        if isinstance(entry, dict) and "type" not in entry:  # as .mcp.json leaves it out
            entry["type"] = "http" if "url" in entry else "stdio"
    try:
        return McpConfig.model_validate(
            {"mcpServers": _expanded(servers, env, f"{source} mcpServers")}
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"][1:] if p not in ("stdio", "http"))
        raise ConfigError(f"{source}: mcpServers.{where}: {error['msg']}") from None


def load(path: Path, env: Mapping[str, str]) -> McpConfig:
    """Read and check the config file the user named."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the MCP config {path}: {exc}") from exc
    return parse(text, env, str(path))


def tool_name(server: str, tool: str, taken: set[str]) -> str:
    """The API name of a server's tool: ``mcp__<server>__<tool>``, made safe and unique.

    Characters the API refuses become ``_``; a name too long, or one already taken by
    another tool once made safe, keeps its start and ends in a short hash of the original.
    """
    wanted = f"mcp__{server}__{_UNSAFE.sub('_', tool)}"
    if len(wanted) <= MAX_TOOL_NAME and wanted not in taken:
        return wanted
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
    return f"{wanted[: MAX_TOOL_NAME - 9]}_{digest}"
