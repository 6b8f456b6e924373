"""Relay URL canonical form and the SSRF guard (SPEC §3, §6)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol.urls import (
    AddressPolicy,
    SsrfRefused,
    UrlError,
    clone_url_to_relay_url,
    host_port,
    normalize_domain,
    normalize_relay_url,
    numeric_host_ips,
)

# -- canonical form --------------------------------------------------------------------

CANONICAL = [
    ("wss://relay.example.com", "wss://relay.example.com"),
    ("wss://relay.example.com/", "wss://relay.example.com"),
    ("WSS://Relay.Example.COM", "wss://relay.example.com"),
    ("  wss://relay.example.com  ", "wss://relay.example.com"),
    ("wss://relay.example.com:443", "wss://relay.example.com"),
    ("ws://relay.example.com:80/", "ws://relay.example.com"),
    ("ws://relay.example.com:443", "ws://relay.example.com:443"),
    ("wss://relay.example.com:80", "wss://relay.example.com:80"),
    ("wss://relay.example.com:0443", "wss://relay.example.com"),
    ("wss://relay.example.com:", "wss://relay.example.com"),
    ("wss://relay.example.com.", "wss://relay.example.com"),
    ("wss://relay.example.com/nostr", "wss://relay.example.com/nostr"),
    ("wss://relay.example.com/nostr/", "wss://relay.example.com/nostr"),
    ("wss://relay.example.com/Nostr//", "wss://relay.example.com/Nostr"),
    ("wss://relay.example.com/?token=a", "wss://relay.example.com?token=a"),
    ("wss://relay.example.com/x?", "wss://relay.example.com/x"),
    ("wss://relay.example.com/#frag", "wss://relay.example.com"),
    ("wss://relay.example.com/p?q=1#frag", "wss://relay.example.com/p?q=1"),
    ("wss://relay.example.com/ä", "wss://relay.example.com/%C3%A4"),
    ("wss://bücher.example/", "wss://xn--bcher-kva.example"),
    ("wss://XN--BCHER-KVA.example", "wss://xn--bcher-kva.example"),
    ("wss://[::1]:7000/", "wss://[::1]:7000"),
    ("wss://[2001:DB8:0:0::1]", "wss://[2001:db8::1]"),
    ("ws://[::1]:80", "ws://[::1]"),
    ("ws://2130706433", "ws://127.0.0.1"),
    ("ws://0177.0.0.1:7000", "ws://127.0.0.1:7000"),
    ("ws://0x7f.1", "ws://127.0.0.1"),
    ("ws://127.1", "ws://127.0.0.1"),
    ("wss://１２７.０.０.１", "wss://127.0.0.1"),
    ("wss://under_score.example.com", "wss://under_score.example.com"),
]


@pytest.mark.parametrize("given_url, canonical", CANONICAL)
def test_normalize_relay_url_gives_one_canonical_form(given_url, canonical):
    assert normalize_relay_url(given_url) == canonical
    assert normalize_relay_url(canonical) == canonical


REFUSED = [
    ("http://relay.example.com", "scheme"),
    ("https://relay.example.com", "scheme"),
    ("relay.example.com", "no scheme"),
    ("wss:relay.example.com", "no scheme"),
    ("wss://user@relay.example.com", "user information"),
    ("wss://user:pw@relay.example.com", "user information"),
    ("wss://", "empty host"),
    ("wss:///path", "empty host"),
    ("wss://relay.example.com:0", "out of range"),
    ("wss://relay.example.com:65536", "out of range"),
    ("wss://relay.example.com:https", "bad port"),
    ("wss://relay.example.com:+1", "bad port"),
    ("wss://::1", "brackets"),
    ("wss://[::1", "unclosed"),
    ("wss://[::1]x", "after IPv6"),
    ("wss://[fe80::1%25eth0]", "zone"),
    ("wss://[not-ipv6]", "bad IPv6"),
    ("wss://a..b", "bad host name"),
    ("wss://-bad.example.com", "bad host name"),
    ("wss://bad host.example.com", "whitespace"),
    ("wss://relay.example.com/\x00", "control"),
    ("wss://" + "a" * 64 + ".com", "bad host name"),
    ("wss://" + ".".join(["a" * 60] * 5), "longer than 253"),
    ("wss://relay.example.com/" + "a" * 3000, "longer than"),
    ("wss://relay.example.com/\ud800", "unicode"),
    (None, "not a string"),
    (b"wss://relay.example.com", "not a string"),
]


@pytest.mark.parametrize("given_url, reason", REFUSED)
def test_normalize_relay_url_refuses_with_a_clear_reason(given_url, reason):
    with pytest.raises(UrlError, match=reason):
        normalize_relay_url(given_url)


@pytest.mark.parametrize("clone, relay", [
    ("https://relay.example.com/npub1abc/repo.git", "wss://relay.example.com"),
    ("http://relay.example.com/npub1abc/repo.git", "ws://relay.example.com"),
    ("HTTPS://Relay.Example.com:443/x", "wss://relay.example.com"),
    ("https://relay.example.com:8443/x?y#z", "wss://relay.example.com:8443"),
    ("http://relay.example.com:443/x", "ws://relay.example.com:443"),
    ("https://[::1]:7000/x", "wss://[::1]:7000"),
    ("wss://relay.example.com", None),
    ("git@relay.example.com:repo.git", None),
    ("https://user@relay.example.com/x", None),
    ("nostr://npub1abc/relay.example.com/repo", None),
    ("", None),
    (42, None),
])
def test_clone_url_to_relay_url_keeps_only_host_and_port(clone, relay):
    assert clone_url_to_relay_url(clone) == relay


@pytest.mark.parametrize("url, expected", [
    ("wss://Relay.Example.com/", "relay.example.com"),
    ("wss://relay.example.com:443", "relay.example.com"),
    ("https://relay.example.com:443/x.git", "relay.example.com"),
    ("http://relay.example.com:80/x.git", "relay.example.com"),
    ("wss://relay.example.com:8443", "relay.example.com:8443"),
    ("ws://relay.example.com:443", "relay.example.com:443"),
    ("wss://[::1]:7000", "[::1]:7000"),
])
def test_host_port_is_what_a_configured_domain_is_compared_with(url, expected):
    assert host_port(url) == expected


@pytest.mark.parametrize("domain, expected", [
    ("Relay.Example.com", "relay.example.com"),
    ("relay.example.com:443", "relay.example.com"),
    ("relay.example.com:8443", "relay.example.com:8443"),
    ("[::1]:7000", "[::1]:7000"),
])
def test_normalize_domain_matches_host_port(domain, expected):
    assert normalize_domain(domain) == expected


@pytest.mark.parametrize("domain", ["", "https://relay.example.com", "a@b", "relay..example"])
def test_normalize_domain_refuses_what_is_not_host_port(domain):
    with pytest.raises(UrlError):
        normalize_domain(domain)


# -- never anything but UrlError -------------------------------------------------------

url_like = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda scheme, rest: f"{scheme}://{rest}",
        st.sampled_from(["ws", "wss", "WSS", "http", "https", "ftp", ""]),
        st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(list("[]:@/?#%.0x")), max_size=60),
    ),
)


@settings(max_examples=1000, deadline=None)
@given(url_like)
def test_url_functions_raise_nothing_but_url_error(text):
    for convert in (normalize_relay_url, host_port, normalize_domain):
        try:
            result = convert(text)
        except UrlError:
            continue
        if convert is normalize_relay_url:
            assert normalize_relay_url(result) == result  # canonical form is a fixed point
    relay = clone_url_to_relay_url(text)
    assert relay is None or normalize_relay_url(relay) == relay
    numeric_host_ips(text)


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=40), st.integers(min_value=1, max_value=65535))
def test_policy_check_raises_nothing_but_ssrf_refused(host, port):
    try:
        AddressPolicy().check(host, port, ["8.8.8.8"])
    except SsrfRefused:
        pass


# -- SSRF guard ------------------------------------------------------------------------

FORBIDDEN_LITERALS = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("2130706433", "loopback"),  # decimal
    ("0177.0.0.1", "loopback"),  # octal
    ("0x7f.1", "loopback"),  # hex, short
    ("0x7f000001", "loopback"),
    ("127.1", "loopback"),  # short
    ("127.0.0.1.", "loopback"),
    ("[::1]", "loopback"),
    ("::1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("0", "unspecified"),
    ("::", "unspecified"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("169.254.169.254", "link-local"),  # cloud metadata
    ("fe80::1", "link-local"),
    ("100.64.0.1", "shared-address-space"),
    ("100.127.255.255", "shared-address-space"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("192.0.2.1", "reserved"),  # documentation
    ("198.18.0.1", "reserved"),  # benchmarking
    ("fec0::1", "private"),  # site-local
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "link-local"),
    ("::127.0.0.1", "loopback"),  # IPv4-compatible
    ("::10.0.0.1", "private"),
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of 169.254.169.254
    ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
    ("64:ff9b::a00:1", "private"),  # NAT64 of 10.0.0.1
    ("64:ff9b:1::1", "private"),  # local-use NAT64
    ("2001:db8::1", "reserved"),
]


@pytest.mark.parametrize("host, reason", FORBIDDEN_LITERALS)
def test_forbidden_literal_hosts_are_refused_however_written(host, reason):
    with pytest.raises(SsrfRefused, match=reason):
        AddressPolicy().check(host, 443, [])


@pytest.mark.parametrize("ip", ["127.0.0.1", "10.0.0.5", "::1", "::ffff:192.168.0.1", "fe80::1%eth0"])
def test_a_name_resolving_to_a_forbidden_address_is_refused(ip):
    with pytest.raises(SsrfRefused):
        AddressPolicy().check("relay.example.com", 443, [ip])


def test_every_resolved_address_must_be_allowed():
    with pytest.raises(SsrfRefused, match="192.168.1.1"):
        AddressPolicy().check("relay.example.com", 443, ["93.184.216.34", "192.168.1.1"])


@pytest.mark.parametrize("resolved", [[], ["not-an-ip"]])
def test_unresolved_or_garbage_addresses_are_refused(resolved):
    with pytest.raises(SsrfRefused):
        AddressPolicy().check("relay.example.com", 443, resolved)


@pytest.mark.parametrize("host, resolved", [
    ("relay.example.com", ["93.184.216.34"]),
    ("relay.example.com", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]),
    ("8.8.8.8", []),
    ("134744072", []),  # decimal 8.8.8.8
    ("[2606:4700::1111]", []),
    ("::ffff:8.8.8.8", []),  # IPv4-mapped public
    ("2002:808:808::1", []),  # 6to4 of a public address
    ("64:ff9b::808:808", []),  # NAT64 of a public address
])
def test_public_destinations_are_allowed(host, resolved):
    AddressPolicy().check(host, 443, resolved)


def test_host_port_entries_allow_exactly_that_port():
    policy = AddressPolicy.parse("127.0.0.1:7001, 127.0.0.1:7002, [::1]:7001")
    policy.check("127.0.0.1", 7001, [])
    policy.check("127.0.0.1", 7002, [])
    policy.check("0x7f.1", 7001, [])  # the same address, another spelling
    policy.check("[::1]", 7001, [])
    policy.check("::ffff:127.0.0.1", 7001, [])
    policy.check("localhost", 7001, ["127.0.0.1", "::1"])
    for host, port in [("127.0.0.1", 7003), ("127.0.0.1", 22), ("[::1]", 7002), ("127.0.0.2", 7001)]:
        with pytest.raises(SsrfRefused):
            policy.check(host, port, [])
    with pytest.raises(SsrfRefused):  # one allowed address does not let another through
        policy.check("twohomes.example", 7001, ["127.0.0.1", "10.0.0.1"])


def test_host_port_entries_may_name_a_host():
    policy = AddressPolicy.parse("relay.internal:7777")
    policy.check("Relay.Internal", 7777, ["10.1.1.1"])
    with pytest.raises(SsrfRefused):
        policy.check("relay.internal", 7778, ["10.1.1.1"])


def test_cidr_entries_allow_every_port_in_the_range():
    policy = AddressPolicy.parse("10.0.0.0/8, fd00::/8")
    policy.check("10.9.8.7", 1, [])
    policy.check("relay.lan", 65535, ["10.0.0.1"])
    policy.check("[fd00::5]", 7000, [])
    policy.check("::ffff:10.1.1.1", 7000, [])
    with pytest.raises(SsrfRefused):
        policy.check("127.0.0.1", 7000, [])
    with pytest.raises(SsrfRefused):
        policy.check("192.168.0.1", 7000, [])


def test_true_allows_everything_and_false_nothing():
    AddressPolicy.parse("true").check("127.0.0.1", 22, [])
    AddressPolicy.parse("TRUE").check("relay.lan", 22, ["10.0.0.1"])
    for text in ("false", "", "  "):
        with pytest.raises(SsrfRefused):
            AddressPolicy.parse(text).check("127.0.0.1", 22, [])


@pytest.mark.parametrize("text, canonical", [
    ("false", "false"),
    ("true", "true"),
    ("127.0.0.1:7001, [::1]:7001, 10.0.0.0/8", "10.0.0.0/8, 127.0.0.1:7001, [::1]:7001"),
    ("10.1.2.3/8", "10.0.0.0/8"),
])
def test_policy_prints_back_as_ini_text(text, canonical):
    assert str(AddressPolicy.parse(text)) == canonical
    assert AddressPolicy.parse(str(AddressPolicy.parse(text))) == AddressPolicy.parse(text)


@pytest.mark.parametrize("text", ["127.0.0.1", "10.0.0.0/33", "::1:7001", "127.0.0.1:99999", "yes"])
def test_policy_refuses_bad_entries(text):
    with pytest.raises(UrlError):
        AddressPolicy.parse(text)


@pytest.mark.parametrize("host, ips", [
    ("127.0.0.1", ["127.0.0.1"]),
    ("0x7f.0.0.1", ["127.0.0.1"]),
    ("017700000001", ["127.0.0.1"]),
    ("1.2.3", ["1.2.0.3"]),
    ("[::1]", ["::1"]),
    ("::FFFF:7f00:1", ["::ffff:7f00:1"]),
    ("relay.example.com", None),
    ("08.0.0.1", None),  # 8 is not octal: inet_aton refuses, so it is a name
    ("1.2.3.4.5", None),
    ("256.1.1.1", None),
    ("1.16777216", None),
    ("", None),
])
def test_numeric_host_ips_reads_hosts_like_inet_aton(host, ips):
    assert numeric_host_ips(host) == ips


def test_invalid_names_never_resolve_and_nothing_else_is_judged_so():
    from gsync.protocol.urls import never_resolves

    assert never_resolves("nonexistent.invalid") and never_resolves("A.INVALID.") and never_resolves("invalid")
    assert not never_resolves("invalid.example") and not never_resolves("relay.damus.io")
    assert not never_resolves("127.0.0.1")
