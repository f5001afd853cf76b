"""The user's MCP servers, offered to the agents as tools ``mcp__<server>__<tool>``.

One :class:`McpHub` per orchmode process (and one per Ray actor). A server is started the
first time an agent that is offered its tools needs the tool list, and is then shared by
every agent: MCP sessions take concurrent calls. Each server lives in a task of its own,
because the SDK's transports are task-scoped context managers that must be left in the
task that entered them.

Nothing a server does can stop a run: a server that cannot start offers no tools (one
warning), a call that hangs ends at its timeout, a server that crashed answers every later
call with an error. Every value the config gives a server (env, headers) is masked in
whatever comes back, since servers are known to echo their tokens in error messages.
MCP servers run with the user's own rights, outside the bash sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..core.events import EventBus, McpCallDone, McpCallStarted, McpServerFailed, Role
from ..core.programs import resolved
from ..core.secrets import Masker
from ..core.settings import Settings
from ..core.wire import ToolInput, ToolResultBlock, ToolSchema, ToolUseBlock
from ..shell.processes import use_pidfd_child_watcher
from .calls import tool_result
from .mcpconfig import HttpServer, McpConfig, StdioServer, load, tool_name

log = logging.getLogger("orchmode")

#: Characters of a failed server's stderr quoted in its warning.
STDERR_TAIL = 600
#: Seconds a server is given to stop when orchmode closes (the SDK's own shutdown is
#: bounded: stdin closed, then SIGTERM, then SIGKILL).
CLOSE_WAIT = 10.0


#: Asks whether an agent may call ``server``'s ``tool`` (its annotations given): None if
#: it may, else the refusal the agent is given.
McpPermit = Callable[[str, str, Mapping[str, Any] | None], Awaitable[str | None]]


def _annotations(listed: Any) -> Mapping[str, Any] | None:
    """A listed tool's annotations as a plain mapping (None when the server gave none)."""
    annotations = getattr(listed, "annotations", None)
    if annotations is None:
        return None
    if hasattr(annotations, "model_dump"):
        dumped = annotations.model_dump(by_alias=True, exclude_none=True)
        return dumped if isinstance(dumped, dict) else None
    return annotations if isinstance(annotations, Mapping) else None


@dataclass(frozen=True)
class McpTool:
    """One tool as the agents see it, and where its calls go."""

    api_name: str
    server: str
    name: str
    schema: ToolSchema
    #: The server's hints about the tool (``readOnlyHint``, ``destructiveHint``,
    #: ``openWorldHint``): its permission default when no rule names it.
    annotations: Mapping[str, Any] | None = None


class _Server:
    """One configured server: started once, in a task of its own, until the hub closes."""

    def __init__(self, name: str, entry: StdioServer | HttpServer, workdir: Path, timeout: float):
        self.name = name
        self.entry = entry
        self.workdir = workdir
        self.timeout = entry.timeout or timeout
        self.session: Any = None
        self.tools: list[Any] = []
        #: Why the server cannot be used (it did not start, or it went away), once known.
        self.failure: str | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stderr: IO[str] | None = None

    async def start(self) -> None:
        """Start the server if nobody has, and wait until it is up or has failed.

        A server that does not answer is not cancelled (cancelling the SDK's transport
        mid-handshake can leave it waiting on the child forever); its session's own read
        timeout ends the handshake, and the transport then shuts the child down in order.
        """
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._serve(), name=f"mcp server {self.name}")
        limit = self.entry.start_timeout
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), limit + 5)
        except TimeoutError:
            self._fail(f"it did not answer within {limit:g} s of starting")

    async def _serve(self) -> None:
        from mcp.client.session import ClientSession

        limit = self.entry.start_timeout
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                read, write = streams[0], streams[1]
                session = await stack.enter_async_context(
                    ClientSession(read, write, read_timeout_seconds=limit)
                )
                await session.initialize()
                self.tools = await _list_tools(session)
                self.session = session
                self._resolve()
                await self._stop.wait()
        except Exception as exc:
            why = _reason(exc)
            if "timed out" in why:
                why = f"it did not answer within {limit:g} s of starting"
            self._fail(why if self.session is None else f"it stopped ({why})")
        finally:
            self.session = None
            self._resolve()

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        entry = self.entry
        if isinstance(entry, HttpServer):
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=dict(entry.headers))
            client.event_hooks["request"].append(_traceparent_header)
            return _closing_client(client, streamable_http_client(entry.url, http_client=client))
        from mcp.client.stdio import StdioServerParameters, stdio_client

        use_pidfd_child_watcher()  # else its exit goes unseen in a second event loop
        cwd = Path(entry.cwd) if entry.cwd else self.workdir
        if not cwd.is_absolute():
            cwd = self.workdir / cwd
        # Its stderr is kept aside, not shown (it would break the live view), and quoted
        # when the server fails.
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        params = StdioServerParameters(
            command=_command(entry.command, entry.env),
            args=list(entry.args),
            env=dict(entry.env),
            cwd=cwd,
        )
        return stdio_client(params, errlog=self._stderr)

    def _resolve(self) -> None:
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def _fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why

    def stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - STDERR_TAIL * 4))
            return self._stderr.read()[-STDERR_TAIL:].strip()
        except (OSError, ValueError):
            return ""

    async def close(self) -> None:
        """Ask the server to stop, and wait a while for it (never forever)."""
        self._stop.set()
        if self._task is not None:
            _, pending = await asyncio.wait({self._task}, timeout=CLOSE_WAIT)
            for task in pending:
                log.info("MCP server %r did not stop in %g s; leaving it", self.name, CLOSE_WAIT)
                task.cancel()
        if self._stderr is not None:
            self._stderr.close()


def _reason(exc: BaseException) -> str:
    """What went wrong, in words: the first real error inside the SDK's task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}" if isinstance(exc, OSError) else text


@contextlib.asynccontextmanager
async def _closing_client(client: Any, transport: Any) -> Any:
    async with client, transport as streams:
        yield streams


async def _list_tools(session: Any) -> list[Any]:
    """Every tool the server lists, across its pages."""
    from mcp_types import PaginatedRequestParams

    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever is cut off
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


@dataclass
class McpHub:
    """The configured servers of one process, their tools per role, and the calls to them."""

    config: McpConfig
    workdir: Path
    events: EventBus
    timeout: float = 120.0
    output_limit: int = 8000
    _servers: dict[str, _Server] = field(default_factory=dict)
    _tools: dict[Role, list[McpTool]] = field(default_factory=dict)
    _by_name: dict[str, McpTool] = field(default_factory=dict)
    #: The same tools by (server, tool name): each is named once, whichever role lists it.
    _by_origin: dict[tuple[str, str], McpTool] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Every value the config gives a server, longest first; worked out once.
    secrets: tuple[str, ...] = field(init=False)
    #: With traces on: the W3C ``traceparent`` of an agent's tool call in flight, sent
    #: with the call (``_meta``, and an HTTP server's request header) so a server that
    #: traces too continues the run's trace.
    traceparent: Callable[[str], str | None] | None = None
    #: Masks every secret in results and errors: the config's values, and the session's
    #: own once the session gives it its masker (which learns the config's values too).
    masker: Masker = field(default_factory=Masker)

    def __post_init__(self) -> None:
        self.secrets = self.config.secrets
        self.masker.add(self.secrets)

    @classmethod
    def from_settings(
        cls, settings: Settings, workdir: Path, events: EventBus, env: Mapping[str, str]
    ) -> McpHub | None:
        """The hub for ``mcp_config``, or None when no servers are configured."""
        if settings.mcp_config is None:
            return None
        return cls.of(load(settings.mcp_config, env), settings, workdir, events)

    @classmethod
    def of(
        cls, config: McpConfig, settings: Settings, workdir: Path, events: EventBus
    ) -> McpHub | None:
        if not config.servers:
            return None
        return cls(config, workdir, events, settings.mcp_timeout, settings.output_limit)

    def mask(self, text: str) -> str:
        return self.masker.mask(text)

    async def tools_for(self, role: Role) -> list[ToolSchema]:
        """The tool definitions ``role`` is offered, starting their servers if need be.

        The list is made once per role and never changes after (a server that dies keeps
        its tools, whose calls then fail), so every request of an agent sends the same
        bytes and the prompt cache keeps hitting.
        """
        return [t.schema for t in await self.listed(role)]

    async def listed(self, role: Role) -> list[McpTool]:
        async with self._lock:
            if role in self._tools:
                return self._tools[role]
            names = self.config.for_role(role)
            servers = [self._server(n) for n in names]
            await asyncio.gather(*(s.start() for s in servers))
            offered: list[McpTool] = []
            for server in servers:
                if server.failure is not None:
                    self._warn(server, f"could not start: {server.failure}")
                    continue
                offered.extend(self._offered(server))
            self._tools[role] = offered
            return offered

    def names(self, role: Role) -> list[str]:
        return [t.api_name for t in self._tools.get(role, [])]

    def _offers(self, role: Role, tool: McpTool) -> bool:
        return any(t is tool for t in self._tools.get(role, ()))

    async def call(
        self, tool_use: ToolUseBlock, *, agent: str, role: Role, permit: McpPermit | None = None
    ) -> ToolResultBlock:
        """Run one call; whatever goes wrong comes back as an error result, never raised.

        ``permit`` asks the permission rules first (and the user, for an ``ask``): the text it
        returns is the refusal the agent is given instead of a call.
        """
        name = str(tool_use.get("name"))
        tool = self._by_name.get(name)
        if tool is None or not self._offers(role, tool):
            return tool_result(tool_use["id"], self._unknown(name, role), is_error=True)
        arguments = tool_use.get("input")
        if not isinstance(arguments, dict) or "_unparsed_input" in arguments:
            return tool_result(
                tool_use["id"],
                f"error: the input of {name} must be a JSON object matching its schema",
                is_error=True,
            )
        if permit is not None:
            refusal = await permit(tool.server, tool.name, tool.annotations)
            if refusal is not None:
                return tool_result(tool_use["id"], refusal, is_error=True)
        server = self._servers[tool.server]
        self.events.emit(McpCallStarted(agent=agent, server=tool.server, tool=tool.name))
        started = time.monotonic()
        parent = self.traceparent(agent) if self.traceparent is not None else None
        text, ok, error = await self._call(server, tool, arguments, parent)
        text = self.mask(text)
        self.events.emit(
            McpCallDone(
                agent=agent,
                server=tool.server,
                tool=tool.name,
                duration=time.monotonic() - started,
                ok=ok,
                error=self.mask(error)[:200],
            )
        )
        return tool_result(tool_use["id"], _cut(text, self.output_limit), is_error=not ok)

    async def _call(
        self, server: _Server, tool: McpTool, arguments: ToolInput, parent: str | None = None
    ) -> tuple[str, bool, str]:
        """The result's text, whether it succeeded, and the error in a few words."""
        session = server.session
        if session is None or server.failure is not None:
            why = server.failure or "it is not running"
            return f"error: the MCP server {server.name!r} is unavailable: {why}", False, why
        try:
            # The SDK's read timeout ends the call; ours is the backstop, and costs no task.
            async with asyncio.timeout(server.timeout + 1):
                result = await session.call_tool(
                    tool.name,
                    arguments,
                    read_timeout_seconds=server.timeout,
                    meta={"traceparent": parent} if parent else None,
                )
        except TimeoutError:
            why = f"no answer within {server.timeout:g} s"
            return f"error: {tool.api_name} timed out: {why}", False, why
        except Exception as exc:
            why = _reason(exc)
            if "timed out" in why:  # the SDK's own read timeout
                why = f"no answer within {server.timeout:g} s"
                return f"error: {tool.api_name} timed out: {why}", False, why
            if "closed" in why.lower() or server.session is None:
                server._fail(f"it stopped ({why})")
                self._warn(server, f"stopped answering: {why}")
            return f"error: {tool.api_name} failed: {why}", False, why
        text = content_text(result.content, result.structured_content)
        if result.is_error:
            first = text.splitlines()[0] if text else "the tool reported an error"
            return text or "error: the tool reported an error", False, first
        return text, True, ""

    def _server(self, name: str) -> _Server:
        if name not in self._servers:
            entry = self.config.servers[name]
            self._servers[name] = _Server(name, entry, self.workdir, self.timeout)
        return self._servers[name]

    def _offered(self, server: _Server) -> list[McpTool]:
        tools: list[McpTool] = []
        for listed in server.tools:
            if not server.entry.offers(listed.name):
                continue
            known = self._by_origin.get((server.name, listed.name))
            if known is None:
                api_name = tool_name(server.name, listed.name, set(self._by_name))
                schema = listed.input_schema if isinstance(listed.input_schema, dict) else {}
                description = (listed.description or "").strip()
                known = McpTool(
                    api_name,
                    server.name,
                    listed.name,
                    {
                        "name": api_name,
                        "description": f"[MCP server {server.name}] {description}".strip(),
                        "input_schema": schema or {"type": "object", "properties": {}},
                    },
                    _annotations(listed),
                )
                self._by_name[api_name] = known
                self._by_origin[(server.name, listed.name)] = known
            tools.append(known)
        return tools

    def _unknown(self, name: str, role: Role) -> str:
        _, _, rest = name.partition("mcp__")
        server_name = rest.partition("__")[0]
        server = self._servers.get(server_name)
        if server is not None and server.failure is not None:
            return f"error: the MCP server {server_name!r} is unavailable: {server.failure}"
        offered = ", ".join(self.names(role)) or "none"
        return f"error: there is no MCP tool named {name!r} for this agent; offered: {offered}"

    def _warn(self, server: _Server, what: str) -> None:
        """One warning line per server, however often it fails."""
        if server.name in self._warned:
            return
        self._warned.add(server.name)
        tail = server.stderr_tail()
        message = self.mask(f"MCP server {server.name!r} {what}")
        if tail:
            message += " — its stderr ends: " + self.mask(tail.splitlines()[-1])[:200]
        log.warning("%s", message)
        self.events.emit(McpServerFailed(server=server.name, message=message))

    async def close(self) -> None:
        """Stop every server that was started."""
        await asyncio.gather(*(s.close() for s in self._servers.values()))
        self._servers.clear()


async def with_mcp_tools(
    base: Sequence[ToolSchema], mcp: McpHub | None, role: Role
) -> list[ToolSchema]:
    """``base`` and, after it, the MCP tools ``role`` is offered: what an agent is given."""
    if mcp is None:
        return list(base)
    return [*base, *await mcp.tools_for(role)]


def content_text(content: Sequence[Any], structured: Any = None) -> str:
    """A tool result's content as text: non-text parts become a short description."""
    parts: list[str] = []
    for block in content:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4
            parts.append(f"[{kind} content: {block.mime_type}, about {size:,} bytes, not shown]")
        elif kind == "resource_link":
            mime = f", {block.mime_type}" if getattr(block, "mime_type", None) else ""
            parts.append(f"[resource link: {block.uri}{mime}]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            mime = getattr(resource, "mime_type", None) or "unknown type"
            if isinstance(text, str):
                parts.append(f"[resource {resource.uri}]\n{text}")
            else:
                parts.append(f"[resource {resource.uri}: {mime}, binary, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _cut(text: str, limit: int) -> str:
    """At most ``limit`` characters, saying so when cut, as bash output is."""
    text = text.strip()
    if len(text) <= limit:
        return text or "(no output)"
    return f"{text[:limit]}\n… [output truncated: {limit} of {len(text)} characters shown]"


async def _traceparent_header(request: Any) -> None:
    """A tool call's ``traceparent`` (in its JSON-RPC ``_meta``) as the HTTP header too,
    where tracing servers and proxies look for it."""
    try:
        body = json.loads(request.content or b"null")
        parent = body["params"]["_meta"]["traceparent"]
    except (ValueError, TypeError, KeyError, RuntimeError):
        return  # not a call with one (or a streamed body): nothing to add
    if isinstance(parent, str):
        request.headers["traceparent"] = parent


def _command(command: str, env: Mapping[str, str]) -> str:
    """A command given by name, found on the absolute directories of the server's PATH:
    started in the working directory, it would otherwise be the repository's own program
    of that name wherever PATH has an empty or relative entry (see
    :mod:`orchmode.core.programs`). One found nowhere is named by an absolute path, so its
    failure to start says where it was looked for."""
    if os.sep in command:
        return command
    return resolved(command, env.get("PATH", os.environ.get("PATH")))
