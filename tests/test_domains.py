"""Domain rules: patterns, presets, the order of deny/ask/allow, and which addresses a name
allowed by a rule may be reached at. Pure logic: hypothesis, and the cases that matter named."""

from __future__ import annotations

import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from orchmode.core.domains import (
    PRESETS,
    DomainRules,
    Pattern,
    normalise_host,
    special_address,
)
from orchmode.core.settings import Settings

LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
TLD = st.from_regex(r"[a-z]{2,6}", fullmatch=True)
NAME = st.builds(
    lambda labels, tld: ".".join([*labels, tld]), st.lists(LABEL, min_size=1, max_size=3), TLD
)
PUBLIC_V4 = st.sampled_from(["93.184.216.34", "151.101.0.223", "140.82.112.3", "8.8.8.8"])
SPECIAL = st.sampled_from(
    [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "10.1.2.3",
        "172.16.0.9",
        "192.168.1.1",
        "169.254.169.254",
        "fe80::1",
        "fd00::1",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "ff02::1",
        "240.0.0.1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "100.64.0.1",
    ]
)


def rules(
    allow: tuple[str, ...] = (), ask: tuple[str, ...] = (), deny: tuple[str, ...] = ()
) -> DomainRules:
    return DomainRules(
        [Pattern(p, "network_allow") for p in allow],
        [Pattern(p, "network_ask") for p in ask],
        [Pattern(p, "network_deny") for p in deny],
    )


# ---------------------------------------------------------------------------- matching


@given(NAME)
def test_a_name_matches_itself_in_any_case_and_with_a_trailing_dot(name: str) -> None:
    r = rules(allow=(name,))
    for asked in (name, name.upper(), name + "."):
        verdict = r.decide(asked, 443)
        assert (verdict.decision, verdict.rule, verdict.source) == ("allow", name, "network_allow")


@given(NAME, LABEL)
def test_a_name_does_not_match_its_subdomains_nor_its_parent(name: str, label: str) -> None:
    r = rules(allow=(name,))
    assert r.decide(f"{label}.{name}", 443).decision == "deny"
    assert r.decide(name.split(".", 1)[1], 443).decision == "deny"


@given(NAME, st.lists(LABEL, min_size=1, max_size=3).map(".".join))
def test_a_wildcard_matches_any_subdomain_but_not_the_bare_name(name: str, below: str) -> None:
    r = rules(allow=(f"*.{name}",))
    assert r.decide(f"{below}.{name}", 443).decision == "allow"
    assert r.decide(name, 443).decision == "deny"
    # nor a name that merely ends with the same letters
    assert r.decide(f"x{name}", 443).decision == "deny"


@given(NAME, st.sampled_from(["allow", "ask", "deny"]), st.sampled_from(["allow", "ask", "deny"]))
def test_deny_wins_then_ask_then_allow(name: str, first: str, second: str) -> None:
    lists: dict[str, tuple[str, ...]] = {"allow": (), "ask": (), "deny": ()}
    lists[first] += (name,)
    lists[second] += (f"*.{name.split('.', 1)[1]}",) if name.count(".") > 1 else (name,)
    order = ["deny", "ask", "allow"]
    expected = min(first, second, key=order.index)
    assert rules(**lists).decide(name, 80).decision == expected


@given(NAME)
def test_a_name_no_rule_names_is_denied_by_default(name: str) -> None:
    verdict = rules(allow=("pypi.org",)).decide(name, 443)
    if name != "pypi.org":
        assert (verdict.decision, verdict.rule, verdict.source) == ("deny", "", "default")
        assert verdict.why() == "no rule names it"


def test_unicode_names_are_compared_in_their_idna_form() -> None:
    r = rules(allow=("Bücher.example",))
    assert r.decide("xn--bcher-kva.example", 443).decision == "allow"
    assert r.decide("BÜCHER.example.", 443).decision == "allow"
    assert normalise_host("bücher.example") == "xn--bcher-kva.example"


def test_presets_name_the_hosts_the_package_tools_use() -> None:
    r = rules(allow=("@python", "@npm", "@github", "@rust", "@go"))
    for host in (
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "registry.yarnpkg.com",
        "github.com",
        "api.github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
        "raw.githubusercontent.com",
        "crates.io",
        "index.crates.io",
        "static.crates.io",
        "proxy.golang.org",
        "sum.golang.org",
    ):
        verdict = r.decide(host, 443)
        assert verdict.decision == "allow", host
        assert verdict.rule.startswith("@")
    assert r.decide("evil.org", 443).decision == "deny"
    assert set(PRESETS) == {"python", "npm", "github", "rust", "go"}


# ---------------------------------------------------------------------------- addresses


@given(NAME, PUBLIC_V4)
def test_an_allowed_name_is_reached_at_any_public_address(name: str, address: str) -> None:
    for r in (rules(allow=(name,)), rules(allow=(f"*.{name.split('.', 1)[1]}",))):
        assert r.address(name, address).decision == "allow"


@given(NAME, SPECIAL)
def test_special_addresses_only_when_the_name_is_named_exactly(name: str, address: str) -> None:
    parent = name.split(".", 1)[1]
    assert special_address(address) is not None
    # through a wildcard: refused (a public name made to resolve to the host's loopback)
    assert rules(allow=(f"*.{parent}",)).address(name, address).decision == "deny"
    # named exactly: reached
    assert rules(allow=(name,)).address(name, address).decision == "allow"
    # or the address itself named
    named = rules(allow=(f"*.{parent}", address))
    assert named.address(name, address).decision == "allow"


def test_a_preset_never_opens_the_hosts_loopback() -> None:
    r = rules(allow=("@python",))
    assert r.address("files.pythonhosted.org", "127.0.0.1").decision == "deny"
    assert r.address("pypi.org", "::ffff:192.168.0.1").decision == "deny"
    assert r.address("pypi.org", "151.101.0.223").decision == "allow"


@given(SPECIAL | PUBLIC_V4)
def test_an_ip_literal_is_refused_unless_it_is_named(address: str) -> None:
    assert rules(allow=("@python", "*.example.org")).decide(address, 80).decision == "deny"
    named = rules(allow=(address,))
    assert named.decide(address, 80).decision == "allow"
    assert named.address(address, address).decision == "allow"


@given(st.integers(0, 2**24 - 1))
def test_a_network_names_every_address_in_it(low: int) -> None:
    address = str(ipaddress.IPv4Address((10 << 24) | low))
    r = rules(allow=("10.0.0.0/8",))
    assert r.decide(address, 80).decision == "allow"
    assert r.decide(f"::ffff:{address}", 80).decision == "allow"
    assert r.decide("11.0.0.1", 80).decision == "deny"


def test_a_denied_address_is_refused_even_for_a_name_named_exactly() -> None:
    r = rules(allow=("metadata.example",), deny=("169.254.0.0/16",))
    verdict = r.address("metadata.example", "169.254.169.254")
    assert (verdict.decision, verdict.rule) == ("deny", "169.254.0.0/16")


def test_v4_mapped_and_wrapped_v6_addresses_count_as_what_they_wrap() -> None:
    for wrapped in ("::ffff:127.0.0.1", "2002:7f00:1::", "64:ff9b::a00:1"):
        assert special_address(wrapped) is not None, wrapped
    assert special_address("::ffff:8.8.8.8") is None
    assert special_address("2606:4700::1111") is None


# ---------------------------------------------------------------------------- bad input


@given(st.text(max_size=80))
def test_any_pattern_either_parses_or_yields_a_problem_line_never_an_exception(text: str) -> None:
    r = rules(allow=(text,), ask=(text,), deny=(text,))
    for problem in r.problems():
        assert problem.startswith("orchmode: ") and " — " in problem
        assert "\n" not in problem


@given(st.text(max_size=80), st.integers(-5, 70000))
def test_any_host_asked_for_gets_a_verdict_never_an_exception(host: str, port: int) -> None:
    r = rules(allow=("*.example.org", "10.0.0.0/8", "@python"))
    assert r.decide(host, port).decision in {"allow", "deny"}
    assert r.address(host, host).decision in {"allow", "deny"}


def test_malformed_patterns_are_named_with_what_to_write() -> None:
    r = rules(allow=("@pyhton", "*.", "a..b", "exa mple.org", "10.0.0.0/33", "*.*.org", ""))
    problems = r.problems()
    assert len(problems) == 7
    assert "`@pyhton` in network_allow is no preset — use one of @python" in problems[0]
    assert all("network_allow" in p for p in problems)
    # what did parse still works
    assert r.decide("pypi.org", 443).decision == "deny"


def test_rules_come_from_the_three_settings() -> None:
    settings = Settings(
        network_allow=("@python",), network_ask=("example.org",), network_deny=("bad.pypi.org",)
    )
    r = DomainRules.from_settings(settings)
    assert r.decide("pypi.org", 443).source == "network_allow"
    assert r.decide("example.org", 443).decision == "ask"
    denied = r.decide("bad.pypi.org", 443)
    assert (denied.decision, denied.source) == ("deny", "network_deny")
    assert denied.why() == "the rule `bad.pypi.org` in network_deny"


@given(st.text(max_size=60) | NAME)
def test_normalising_a_host_twice_changes_nothing(text: str) -> None:
    once = normalise_host(text)
    if once is not None:
        assert normalise_host(once) == once
        assert once == once.lower() and once.isascii() and not once.endswith(".")
