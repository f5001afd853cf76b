"""Which domains a sandboxed command may reach through the proxy: patterns, presets, addresses.

INTERFACE STUB (issue 32): the ``proxy`` helper implements it; ``permissions.Rules``
builds on it (adding ``WebFetch(domain:…)`` rules to the patterns).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .permissions import Verdict
from .settings import Settings

__all__ = ["PRESETS", "DomainRules", "Pattern"]

#: Named sets of domains for common needs, written ``@name`` in a rule.
PRESETS: Mapping[str, tuple[str, ...]] = {}


@dataclass(frozen=True)
class Pattern:
    """One domain pattern (``pypi.org``, ``*.pythonhosted.org``, ``@python``, an address)
    and where it was written (a setting's name, a file)."""

    text: str
    source: str


class DomainRules:
    """Deny wins, then ask, then allow; a name no rule names is denied."""

    def __init__(
        self, allow: Iterable[Pattern], ask: Iterable[Pattern], deny: Iterable[Pattern]
    ) -> None:
        raise NotImplementedError

    @classmethod
    def from_settings(cls, settings: Settings) -> DomainRules:
        """``network_allow``, ``network_ask`` and ``network_deny``."""
        raise NotImplementedError

    def problems(self) -> list[str]:
        """A line per pattern that cannot be used (an unknown preset, a malformed name)."""
        raise NotImplementedError

    def decide(self, host: str, port: int) -> Verdict:
        """A name or IP literal asked for: allow, ask or deny, with the rule that decided."""
        raise NotImplementedError

    def address(self, host: str, address: str) -> Verdict:
        """Whether ``host`` may be reached at ``address``, what it resolved to: loopback,
        link-local and private addresses only when the name or the address is named."""
        raise NotImplementedError
