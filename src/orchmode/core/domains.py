"""Which domains a sandboxed command may reach through the proxy: patterns, presets, addresses.

A pattern is a name (``pypi.org``: that name only), a wildcard (``*.pythonhosted.org``: any
name below it, not the name itself), an IP address or network (``10.0.0.0/8``), or a preset
(``@python``). Names are compared case-insensitively, without a trailing dot, in their
IDNA (ASCII) form. Deny wins, then ask, then allow; a name no rule names is denied.

A name a rule allows is reached at whatever it resolves to, except the addresses that lead
back into the host or its networks (loopback, link-local, private, unspecified, multicast,
reserved, in IPv4 or IPv6, an IPv4 address wrapped in IPv6 included): those only when the
name itself is named exactly, or the address is. A wildcard or a preset never opens them,
so a public name made to resolve to 127.0.0.1 reaches nothing of the host's.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .settings import Settings
from .verdicts import Verdict

__all__ = [
    "PRESETS",
    "DomainRules",
    "NamedDomain",
    "Pattern",
    "named_domains",
    "normalise_host",
    "special_address",
]

#: Named sets of domains for common needs, written ``@name`` in a rule.
PRESETS: Mapping[str, tuple[str, ...]] = {
    # pip and uv: the index, and the files it links to.
    "python": ("pypi.org", "files.pythonhosted.org", "*.pythonhosted.org"),
    # npm, and yarn's registries (classic and berry).
    "npm": ("registry.npmjs.org", "*.npmjs.org", "registry.yarnpkg.com", "repo.yarnpkg.com"),
    # git over HTTPS, the API, archives, raw files and release assets.
    "github": ("github.com", "*.github.com", "codeload.github.com", "*.githubusercontent.com"),
    # cargo: the sparse index (index.crates.io) and the crates (static.crates.io).
    "rust": ("crates.io", "*.crates.io"),
    # the Go module proxy and checksum database.
    "go": ("proxy.golang.org", "sum.golang.org", "*.golang.org"),
}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(frozen=True)
class Pattern:
    """One domain pattern (``pypi.org``, ``*.pythonhosted.org``, ``@python``, an address)
    and where it was written (a setting's name, a file)."""

    text: str
    source: str


def normalise_host(host: str) -> str | None:
    """``host`` as rules compare it: lower case, no trailing dot, IDNA (ASCII); an IP
    literal in its compressed form (brackets dropped); None when it is no valid name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    address = _address(text)
    if address is not None:
        return str(address)
    text = text.rstrip(".") if text.endswith(".") and not text.endswith("..") else text
    if not text or len(text) > 253:
        return None
    try:
        ascii_name = text.lower() if text.isascii() else text.encode("idna").decode("ascii")
    except UnicodeError:
        return None
    ascii_name = ascii_name.lower()
    if len(ascii_name) > 253 or not all(_LABEL.match(label) for label in ascii_name.split(".")):
        return None
    return ascii_name


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _unwrapped(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv6 one that only wraps it (mapped, 6to4, NAT64)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def special_address(address: str) -> str | None:
    """What kind of address leads back into the host or its networks (``loopback``,
    ``private``…), or None for an ordinary public one (and for no address at all)."""
    parsed = _address(address.strip("[]"))
    if parsed is None:
        return None
    ip = _unwrapped(parsed)
    for kind, flag in (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return kind
    if not ip.is_global:
        return "non-public"
    return None


@dataclass(frozen=True)
class _Rule:
    """A pattern made ready to match: a name, a suffix (a wildcard) or a network."""

    written: str
    source: str
    name: str | None = None
    suffix: str | None = None
    network: IPNetwork | None = None
    #: Named exactly (not through a wildcard or a preset): opens special addresses.
    exact: bool = False

    def verdict(self, decision: str) -> Verdict:
        return Verdict(decision, self.written, self.source)  # type: ignore[arg-type]

    def names(self, host: str) -> bool:
        if self.name is not None:
            return host == self.name
        if self.suffix is not None:
            return host.endswith("." + self.suffix)
        return False

    def holds(self, address: IPAddress) -> bool:
        if self.network is None:
            return False
        ip = _unwrapped(address)
        return ip.version == self.network.version and ip in self.network


def _shown(text: str) -> str:
    """``text`` fit for one line of a message: control characters escaped, cut short."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= 80 else shown[:79] + "…"


def _parse(pattern: Pattern, problems: list[str]) -> list[_Rule]:
    """The rules one pattern stands for; a problem line for one that cannot be used."""
    text = pattern.text.strip() if isinstance(pattern.text, str) else ""
    where = f"in {_shown(pattern.source)}" if pattern.source else ""
    if not text:
        problems.append(f"orchmode: an empty domain pattern {where} — remove it")
        return []
    if text.startswith("@"):
        preset = PRESETS.get(text[1:].lower())
        if preset is None:
            known = ", ".join(f"@{name}" for name in PRESETS)
            problems.append(
                f"orchmode: `{_shown(text)}` {where} is no preset — use one of {known}, "
                "or name the domains"
            )
            return []
        rules: list[_Rule] = []
        for member in preset:
            for rule in _parse(Pattern(member, pattern.source), problems):
                rules.append(_Rule(text, rule.source, rule.name, rule.suffix, rule.network))
        return rules
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    if "/" in bare:
        try:
            network = ipaddress.ip_network(bare, strict=False)
        except ValueError:
            problems.append(
                f"orchmode: `{_shown(text)}` {where} is no address network — write one as "
                "10.0.0.0/8"
            )
            return []
        return [_Rule(text, pattern.source, network=network, exact=True)]
    address = _address(bare)
    if address is not None:
        network = ipaddress.ip_network(_unwrapped(address))
        return [_Rule(text, pattern.source, network=network, exact=True)]
    wildcard = bare.startswith("*.")
    name = normalise_host(bare[2:] if wildcard else bare)
    if name is None or "*" in bare[2 if wildcard else 0 :] or _address(name) is not None:
        problems.append(
            f"orchmode: `{_shown(text)}` {where} is no domain pattern — write a name (pypi.org), "
            "a wildcard (*.pythonhosted.org), an address, a network or a preset (@python)"
        )
        return []
    if wildcard:
        return [_Rule(text, pattern.source, suffix=name)]
    return [_Rule(text, pattern.source, name=name, exact=True)]


@dataclass
class _Rules:
    rules: list[_Rule] = field(default_factory=list)

    def naming(self, host: str, address: IPAddress | None) -> _Rule | None:
        for rule in self.rules:
            if rule.holds(address) if address is not None else rule.names(host):
                return rule
        return None


class DomainRules:
    """Deny wins, then ask, then allow; a name no rule names is denied."""

    def __init__(
        self, allow: Iterable[Pattern], ask: Iterable[Pattern], deny: Iterable[Pattern]
    ) -> None:
        self._problems: list[str] = []
        self._allow = _Rules([r for p in allow for r in _parse(p, self._problems)])
        self._ask = _Rules([r for p in ask for r in _parse(p, self._problems)])
        self._deny = _Rules([r for p in deny for r in _parse(p, self._problems)])

    @classmethod
    def from_settings(cls, settings: Settings) -> DomainRules:
        """``network_allow``, ``network_ask`` and ``network_deny``."""

        def patterns(name: str) -> list[Pattern]:
            return [Pattern(text, name) for text in getattr(settings, name)]

        return cls(patterns("network_allow"), patterns("network_ask"), patterns("network_deny"))

    def problems(self) -> list[str]:
        """A line per pattern that cannot be used (an unknown preset, a malformed name)."""
        return list(self._problems)

    def decide(self, host: str, port: int) -> Verdict:
        """A name or IP literal asked for: allow, ask or deny, with the rule that decided."""
        name = normalise_host(host) if isinstance(host, str) else None
        if name is None:
            return Verdict("deny")
        address = _address(name)
        for decision, rules in (("deny", self._deny), ("ask", self._ask), ("allow", self._allow)):
            rule = rules.naming(name, address)
            if rule is not None:
                return rule.verdict(decision)
        return Verdict("deny")

    def address(self, host: str, address: str) -> Verdict:
        """Whether ``host`` may be reached at ``address``, what it resolved to: loopback,
        link-local and private addresses only when the name or the address is named."""
        ip = _address(address.strip("[]")) if isinstance(address, str) else None
        if ip is None:
            return Verdict("deny")
        denied = self._deny.naming("", ip)
        if denied is not None:
            return denied.verdict("deny")
        named = self._allow.naming("", ip) or self._ask.naming("", ip)
        if named is not None:
            return named.verdict("allow")
        name = normalise_host(host) if isinstance(host, str) else None
        if name is None:
            return Verdict("deny")
        if _address(name) is not None:
            # An IP literal is reached only where a rule names that address.
            return Verdict("deny")
        if special_address(str(ip)) is None:
            return Verdict("allow")
        for rules in (self._allow, self._ask):
            for rule in rules.rules:
                if rule.exact and rule.name == name:
                    return rule.verdict("allow")
        return Verdict("deny")


@dataclass(frozen=True)
class NamedDomain:
    """A pattern's domain name, for lists that take names only (the API's web tools)."""

    #: The name in its normalised (IDNA, lower-case) form.
    name: str
    #: Written as a wildcard (``*.name``): the names below ``name``, not ``name`` itself.
    wildcard: bool
    written: str
    source: str


def named_domains(patterns: Iterable[Pattern]) -> tuple[list[NamedDomain], list[str]]:
    """The domain names ``patterns`` stand for (presets opened), and a line per pattern that
    names no domain: an address or a network, or one that cannot be read at all."""
    names: list[NamedDomain] = []
    problems: list[str] = []
    for pattern in patterns:
        for rule in _parse(pattern, problems):
            name = rule.name or rule.suffix
            if name is None:
                problems.append(
                    f"`{_shown(rule.written)}` in {_shown(rule.source)} is an address, not a name"
                )
                continue
            names.append(NamedDomain(name, rule.suffix is not None, rule.written, rule.source))
    return names, problems
