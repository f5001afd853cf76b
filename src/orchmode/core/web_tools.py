"""Anthropic's server-side web search and fetch, offered as Claude Code's WebSearch and WebFetch.

The two tools run on the API's side: a search or a fetch never leaves the sandbox, and its
result comes back in the reply as ``server_tool_use`` and ``web_search_tool_result`` /
``web_fetch_tool_result`` blocks, sent back to the API as they came. Their domains follow
the rules the sandbox's network follows (``network_allow`` / ``network_ask`` /
``network_deny`` and the ``WebFetch(domain:...)`` permission rules):

- deny rules (and ask rules: a server tool cannot wait for an answer) become the tools'
  ``blocked_domains``;
- allow rules, where there are any, become their ``allowed_domains`` instead, since the API
  takes only one of the two lists: an allowed domain that a deny rule names, lies under or
  holds is left out, so a denied name is never reached;
- no rules at all: the tools are offered without domain limits;
- a bare ``WebFetch`` deny or ask rule: web fetch is not offered at all.

The API takes names, a name standing for itself and every name below it. A wildcard
(``*.example.com``) is sent as ``example.com`` (so it covers ``example.com`` too), a
preset as its names; an address or a network names no domain and is left out with a note
(the tools fetch from Anthropic's servers, which reach no address of your networks).
Amazon Bedrock and Google Vertex AI are sent neither tool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .domains import NamedDomain, Pattern, named_domains
from .errors import ConfigError
from .permissions import Rules
from .settings import Settings
from .verdicts import Decision
from .wire import ToolSchema

#: Claude Code's names for the tools (lower-cased), and the API's.
WEB_TOOLS = {"websearch": "web_search", "webfetch": "web_fetch"}
#: The API's versions of the tools that orchmode offers.
TOOL_TYPES = {"web_search": "web_search_20250305", "web_fetch": "web_fetch_20250910"}
#: The providers that offer the tools: Bedrock and Vertex AI do not.
OFFERING_PROVIDERS = frozenset({"anthropic"})


@dataclass(frozen=True)
class WebDomains:
    """The domain limits the web tools are sent with, and what could not be sent as written."""

    allowed: tuple[str, ...] | None = None
    blocked: tuple[str, ...] | None = None
    notes: tuple[str, ...] = ()


def web_domains(allow: Sequence[Pattern], deny: Sequence[Pattern]) -> WebDomains:
    """The limits for allow and deny (ask included) patterns: see the module's docstring."""
    allowed, allow_problems = named_domains(allow)
    blocked, deny_problems = named_domains(deny)
    problems = (*allow_problems, *deny_problems)
    notes = [f"{line}: the web tools take names only, so it is left out" for line in problems]
    notes += [_widened(name) for name in allowed if name.wildcard]
    blocked_names = _unique(name.name for name in blocked)
    if not allow:
        return WebDomains(blocked=blocked_names or None, notes=tuple(notes))
    kept = []
    for name in _unique(name.name for name in allowed):
        clash = next((b for b in blocked_names if _overlap(name, b)), None)
        if clash is None:
            kept.append(name)
        else:
            notes.append(
                f"{name} is allowed but {clash} is denied, and the web tools take allowed or "
                f"blocked domains, not both: {name} is left out of their allowed domains"
            )
    if not kept:
        notes.append("no domain is left to allow, so the web tools are not offered")
    return WebDomains(allowed=tuple(kept), notes=tuple(notes))


def session_web_tools(
    settings: Settings, rules: Rules | None
) -> tuple[list[ToolSchema], WebDomains]:
    """The web tools as the session's rules limit them (the settings' network rules alone,
    when it has no permission rules), and the limits with their notes."""
    if rules is None:
        network: dict[Decision, Sequence[str]] = {
            "allow": settings.network_allow,
            "ask": settings.network_ask,
            "deny": settings.network_deny,
        }
        rules = Rules(network=network)
    allow = rules.domain_patterns("allow")
    deny = [*rules.domain_patterns("deny"), *rules.domain_patterns("ask")]
    domains = web_domains(allow, deny)
    offered = web_tool_schemas(settings, domains)
    if rules.fetching_withheld():
        offered = [tool for tool in offered if tool["name"] != "web_fetch"]
    return offered, domains


def web_tool_schemas(settings: Settings, domains: WebDomains) -> list[ToolSchema]:
    """Both web tools as a request offers them, with ``domains`` applied; none where the
    provider does not offer them."""
    if settings.provider not in OFFERING_PROVIDERS or domains.allowed == ():
        return []
    limits: dict[str, object] = {"max_uses": settings.web_max_uses}
    if domains.allowed is not None:
        limits["allowed_domains"] = list(domains.allowed)
    if domains.blocked is not None:
        limits["blocked_domains"] = list(domains.blocked)
    return [
        cast(ToolSchema, {"type": kind, "name": name, **limits})
        for name, kind in TOOL_TYPES.items()
    ]


def provider_note(settings: Settings) -> str | None:
    """The one line that says a provider gives no web tools; None where it does."""
    if settings.provider in OFFERING_PROVIDERS:
        return None
    return (
        f"{settings.provider} does not offer Anthropic's web search and web fetch tools, so "
        "WebSearch and WebFetch are not offered"
    )


def web_tool_notes(settings: Settings, rules: Rules | None) -> list[str]:
    """What a session whose agents ask for the web tools is told once: that its provider has
    none, or what of its domain rules the tools could not take as written."""
    note = provider_note(settings)
    if note is not None:
        return [note]
    _, domains = session_web_tools(settings, rules)
    return [f"web tools: {line}" for line in domains.notes]


def main_web_tool_names(settings: Settings) -> tuple[str, ...]:
    """The API's names of the web tools ``main_web_tools`` asks for; a ``ConfigError`` for a
    name that is not one."""
    names = []
    for entry in settings.main_web_tools:
        name = WEB_TOOLS.get(entry.strip().lower())
        if name is None:
            raise ConfigError(
                f"main_web_tools: {entry!r} is no web tool — use WebSearch, WebFetch or both"
            )
        names.append(name)
    return tuple(dict.fromkeys(names))


def most_searches(tools: Sequence[Any]) -> int:
    """The most web searches a request offering ``tools`` can make (each is billed)."""
    return sum(
        int(tool.get("max_uses") or 0)
        for tool in tools
        if isinstance(tool, dict) and str(tool.get("type", "")).startswith("web_search_")
    )


def _widened(name: NamedDomain) -> str:
    return (
        f"{name.written} in {name.source}: the web tools are sent {name.name}, which covers "
        f"{name.name} itself as well as the names below it"
    )


def _overlap(one: str, other: str) -> bool:
    """Whether one domain is the other or lies under it (either way round)."""
    return one == other or one.endswith("." + other) or other.endswith("." + one)


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))
