"""The API's web search and fetch tools in the scripted server: their checks and their replies.

A request offering ``web_search_*`` or ``web_fetch_*`` is held to the tool's declaration in
the installed SDK (its fields, its ``name``), and to what the API refuses besides: both
``allowed_domains`` and ``blocked_domains``, a ``max_uses`` below one, a domain with a
scheme. A scripted reply that uses a tool holds a ``server_tool_use`` block and its result
block, as the API's reply does; :func:`web_search` and :func:`web_fetch` make the pair.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from typing import Any, cast

import typing_extensions
from anthropic.types.tool_union_param import ToolUnionParam

from ..core.wire import ApiObject
from .replies import Reply, ScriptedBlock, ScriptedRequest

#: The server tools' names, by the prefix of their ``type``.
WEB_TOOL_NAMES = {"web_search_": "web_search", "web_fetch_": "web_fetch"}
#: The result block of each tool.
RESULT_TYPES = {"web_search": "web_search_tool_result", "web_fetch": "web_fetch_tool_result"}


class InvalidWebTool(ValueError):
    """A web tool the API would refuse with a 400: the message names the field."""


@cache
def web_tool_fields() -> dict[str, frozenset[str]]:
    """The fields of every web tool version the installed SDK declares, by its ``type``."""
    fields: dict[str, frozenset[str]] = {}
    for param in typing.get_args(ToolUnionParam):
        if not typing_extensions.is_typeddict(param):
            continue
        hints = typing_extensions.get_type_hints(param)
        kinds = typing.get_args(hints.get("type"))
        kind = kinds[0] if kinds else None
        if isinstance(kind, str) and kind.startswith(tuple(WEB_TOOL_NAMES)):
            fields[kind] = frozenset(hints)
    return fields


def web_tool_name(kind: object) -> str | None:
    """``web_search`` or ``web_fetch`` for a ``type`` of either tool; None for any other."""
    if not isinstance(kind, str):
        return None
    return next((name for prefix, name in WEB_TOOL_NAMES.items() if kind.startswith(prefix)), None)


def check_web_tool(tool: Mapping[str, Any], path: str) -> None:
    """Raise :class:`InvalidWebTool` for a web tool the API would refuse."""
    kind = str(tool.get("type"))
    fields = web_tool_fields().get(kind)
    if fields is None:
        known = ", ".join(sorted(web_tool_fields()))
        raise InvalidWebTool(f"{path}.type: {kind!r} is no web tool version (known: {known})")
    expected = web_tool_name(kind)
    if tool.get("name") != expected:
        raise InvalidWebTool(f"{path}.name: Input should be {expected!r}")
    for key in tool:
        if key not in fields:
            raise InvalidWebTool(f"{path}.{key}: Extra inputs are not permitted")
    if tool.get("allowed_domains") is not None and tool.get("blocked_domains") is not None:
        raise InvalidWebTool(f"{path}: cannot specify both allowed_domains and blocked_domains")
    uses = tool.get("max_uses")
    if uses is not None and (not isinstance(uses, int) or isinstance(uses, bool) or uses < 1):
        raise InvalidWebTool(f"{path}.max_uses: Input should be greater than or equal to 1")
    for key in ("allowed_domains", "blocked_domains"):
        _check_domains(tool.get(key), f"{path}.{key}")


def _check_domains(domains: object, path: str) -> None:
    if domains is None:
        return
    if not isinstance(domains, list):
        raise InvalidWebTool(f"{path}: Input should be a valid list")
    for i, domain in enumerate(domains):
        if not isinstance(domain, str) or not domain.strip():
            raise InvalidWebTool(f"{path}.{i}: Input should be a non-empty string")
        if "://" in domain or domain.startswith("*"):
            raise InvalidWebTool(
                f"{path}.{i}: {domain!r} is no domain: write it without a scheme or a leading "
                "wildcard (example.com covers its subdomains)"
            )


def web_search(query: str, results: list[tuple[str, str]] | None = None) -> list[ApiObject]:
    """A search and its result, as a reply's blocks: ``results`` are (title, url) pairs."""
    found = results if results is not None else [(f"About {query}", "https://example.com/")]
    return [
        {"type": "server_tool_use", "name": "web_search", "input": {"query": query}},
        {
            "type": "web_search_tool_result",
            "content": [
                {
                    "type": "web_search_result",
                    "title": title,
                    "url": url,
                    "encrypted_content": f"enc:{url}",
                    "page_age": None,
                }
                for title, url in found
            ],
        },
    ]


def web_fetch(url: str, text: str = "The page's text.") -> list[ApiObject]:
    """A fetch and the page it brought, as a reply's blocks."""
    return [
        {"type": "server_tool_use", "name": "web_fetch", "input": {"url": url}},
        {
            "type": "web_fetch_tool_result",
            "content": {
                "type": "web_fetch_result",
                "url": url,
                "retrieved_at": "2026-01-01T00:00:00Z",
                "content": {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": text},
                    "title": url,
                },
            },
        },
    ]


def with_web(reply: Reply, request: ScriptedRequest, web: list[ApiObject]) -> Reply:
    """``reply`` opened with the web tool uses in ``web`` (each use with the result after
    it), on an agent's first step, for the web tools its request offers."""
    if any(m.get("role") == "assistant" for m in request.messages):
        return reply
    offered = request.tool_names
    blocks, used = [], ""
    for block in web:
        if block.get("type") == "server_tool_use":
            used = str(block.get("name"))
        if used in offered:
            blocks.append(cast(ScriptedBlock, block))
    return replace(reply, content=[*blocks, *reply.content]) if blocks else reply
