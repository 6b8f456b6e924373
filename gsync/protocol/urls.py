"""Relay URLs: one canonical spelling per relay, and the SSRF guard for where we may connect.

Relay URLs arrive in untrusted events, so everything here accepts arbitrary text and fails
only with ``UrlError`` (bad URL) or ``SsrfRefused`` (forbidden destination). Pure: no
sockets, no DNS — the I/O layer resolves names and hands the addresses to
``AddressPolicy.check``.

Canonical form (``normalize_relay_url``): ``ws``/``wss`` only; scheme and host lower-case;
unicode hosts IDNA-encoded; one trailing dot of the host dropped; numeric IPv4 spellings
(``2130706433``, ``0x7f.1``) written as dotted quads; IPv6 compressed, in brackets; default
port (80/443) dropped; trailing slashes of the path dropped (so ``wss://h/`` is
``wss://h``); query kept; fragment dropped; userinfo refused.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

# Longer URLs are junk from a hostile announcement, not a relay anyone runs.
MAX_URL_LENGTH = 2048
# URLs split lately and kept (``_split_text``): far more than a network's relays and hosts.
_SPLIT_CACHE = 4096

_DEFAULT_PORTS = {"ws": 80, "wss": 443, "http": 80, "https": 443}
_RELAY_SCHEME_FOR = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_AUTHORITY = re.compile(r"([^/?]*)(.*)", re.DOTALL)
# What ``str.isspace`` calls space (``\s`` is the same test), C0 controls and DEL: one regex
# search, not a Python test per character (clone URLs differ per repository: no cache helps).
_SPACE_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f]")
# inet_aton's number syntax: hex, octal (leading 0), decimal.
_ATON_NUMBER = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
# Printable ASCII except space; anything else in a path or query is percent-encoded.
_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class UrlError(ValueError):
    """Text that is not a usable relay URL (or host, or address-policy entry)."""


class SsrfRefused(ValueError):
    """A destination the address policy forbids. ``reason`` is a sentence for the log (it
    names the address, so it is not a metric label)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# -- parsing ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Parts:
    scheme: str
    host: str  # canonical; IPv6 without brackets
    port: int | None  # None when absent or the scheme's default
    rest: str  # canonical path + query


def _split(url: object, schemes: frozenset[str]) -> _Parts:
    if not isinstance(url, str):
        raise UrlError(f"not a string: {type(url).__name__}")
    return _split_text(url, schemes)


@lru_cache(maxsize=_SPLIT_CACHE)
def _split_text(url: str, schemes: frozenset[str]) -> _Parts:
    # Cached: every announcement names its relays and clone hosts, and every instance (one
    # per shard) reads every announcement, so the same few hundred URLs are split again
    # and again (a fifth of applying an announcement). A URL that fails is not cached.
    text = url.strip()
    if len(text) > MAX_URL_LENGTH:
        raise UrlError(f"longer than {MAX_URL_LENGTH} characters")
    if _SPACE_OR_CONTROL.search(text):
        raise UrlError("contains whitespace or control characters")
    m = _SCHEME.match(text)
    if not m:
        raise UrlError(f"no scheme in {text!r}")
    scheme = m.group(1).lower()
    if scheme not in schemes:
        raise UrlError(f"scheme {scheme!r} is not one of {', '.join(sorted(schemes))}")
    without_fragment = text[m.end():].split("#", 1)[0]
    authority, rest = _AUTHORITY.match(without_fragment).groups()
    if "@" in authority:
        raise UrlError("user information (user@host) is not allowed")
    host, port = split_host_port(authority)
    if port == _DEFAULT_PORTS[scheme]:
        port = None
    return _Parts(scheme, host, port, _canonical_rest(rest))


def split_host_port(authority: str) -> tuple[str, int | None]:
    """``host[:port]`` → (canonical host, port or None). IPv6 must be bracketed."""
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise UrlError(f"unclosed '[' in {authority!r}")
        raw_host, after = authority[1:close], authority[close + 1:]
        if after and not after.startswith(":"):
            raise UrlError(f"unexpected {after!r} after IPv6 address")
        port_text = after[1:] if after else ""
        host = _canonical_ipv6(raw_host)
    else:
        raw_host, _, port_text = authority.partition(":")
        if ":" in port_text:
            raise UrlError(f"IPv6 address must be in brackets: {authority!r}")
        host = canonical_host(raw_host)
    return host, _parse_port(port_text)


def _parse_port(text: str) -> int | None:
    if text == "":
        return None  # RFC 3986 allows an empty port: it means the default
    if not text.isascii() or not text.isdigit() or len(text) > 5:
        raise UrlError(f"bad port {text!r}")
    port = int(text)
    if not 1 <= port <= 65535:
        raise UrlError(f"port {port} out of range 1-65535")
    return port


def _canonical_ipv6(text: str) -> str:
    if "%" in text:
        raise UrlError("IPv6 zone identifiers are not allowed")
    try:
        return ipaddress.IPv6Address(text).compressed
    except ValueError:
        raise UrlError(f"bad IPv6 address {text!r}") from None


def canonical_host(text: str) -> str:
    """A host name or IPv4 literal in its one canonical spelling (see module docstring)."""
    host = text[:-1] if text.endswith(".") else text
    if not host:
        raise UrlError("empty host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise UrlError(f"host {text!r} cannot be IDNA-encoded: {exc}") from None
    # After IDNA: nameprep turns full-width digits into ASCII ones, making an IPv4 literal.
    ipv4 = _parse_inet_aton(host)
    if ipv4 is not None:
        return str(ipv4)
    host = host.lower()
    if len(host) > 253:
        raise UrlError("host name longer than 253 characters")
    for label in host.split("."):
        if not _LABEL.match(label):
            raise UrlError(f"bad host name {text!r}")
    return host


def _canonical_rest(rest: str) -> str:
    path, sep, query = rest.partition("?")
    try:
        path = quote(path, safe=_URL_SAFE).rstrip("/")
        query = quote(query, safe=_URL_SAFE)
    except UnicodeEncodeError:
        raise UrlError("path or query is not valid unicode") from None
    return path + (f"?{query}" if sep and query else "")


def format_host_port(host: str, port: int | None) -> str:
    """``host[:port]``, with an IPv6 host in brackets."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


# -- public URL functions --------------------------------------------------------------

_RELAY_SCHEMES = frozenset({"ws", "wss"})
_ANY_SCHEME = frozenset(_DEFAULT_PORTS)


def normalize_relay_url(url: object) -> str:
    """The canonical ``ws(s)://`` spelling of a relay URL; ``UrlError`` if it is not one."""
    p = _split(url, _RELAY_SCHEMES)
    return f"{p.scheme}://{format_host_port(p.host, p.port)}{p.rest}"


def clone_url_to_relay_url(http_url: object) -> str | None:
    """``https://h[:p]/anything`` → ``wss://h[:p]`` (http → ws); None if not an http(s) URL.

    A GRASP server answers git and Nostr on the same host, so a clone URL names a relay.
    """
    try:
        p = _split(http_url, frozenset({"http", "https"}))
    except UrlError:
        return None
    return f"{_RELAY_SCHEME_FOR[p.scheme]}://{format_host_port(p.host, p.port)}"


def host_port(url: object) -> str:
    """``host[:port]`` of an http(s) or ws(s) URL, port only when not the scheme's default.

    This is the form a configured ``domain`` is compared with, so it is canonical too.
    """
    p = _split(url, _ANY_SCHEME)
    return format_host_port(p.host, p.port)


def normalize_domain(text: object) -> str:
    """A configured public name ``host[:port]`` in the form ``host_port`` returns.

    Ports 80 and 443 are dropped: they are the defaults of the schemes clone and relay URLs
    use, so a domain written with them could otherwise never match.
    """
    if not isinstance(text, str) or not text.strip():
        raise UrlError("empty domain")
    if "/" in text or "@" in text:
        raise UrlError(f"a domain is host[:port], not a URL: {text!r}")
    host, port = split_host_port(text.strip())
    return format_host_port(host, None if port in (80, 443) else port)


# -- numeric hosts ---------------------------------------------------------------------


def never_resolves(host: str) -> bool:
    """A name under ``.invalid`` (RFC 6761 §6.4: resolvers answer it negatively at once):
    no query need leave the machine to know it has no address."""
    return host.rstrip(".").lower().endswith(".invalid") or host.rstrip(".").lower() == "invalid"


def _parse_inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """Read a host the way C ``inet_aton`` (and so getaddrinfo) does, or None if not numeric.

    Accepts 1-4 parts, each decimal, octal (leading 0) or hex (0x); the last part fills the
    remaining bytes, so ``127.1`` is 127.0.0.1 and ``2130706433`` is too.
    """
    parts = host.split(".")
    if len(parts) > 4:
        return None
    values = []
    for part in parts:
        value = _parse_aton_number(part)
        if value is None:
            return None
        values.append(value)
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (24 - 8 * i)
    return ipaddress.IPv4Address(number)


def _parse_aton_number(part: str) -> int | None:
    if not _ATON_NUMBER.fullmatch(part):
        return None
    digits, base = (part[2:], 16) if part[1:2] in ("x", "X") else (part, 8 if part[0] == "0" else 10)
    # Leading zeros never change the value; without them a long string is an overflow.
    digits = digits.lstrip("0") or "0"
    return int(digits, base) if len(digits) <= 11 else None


def numeric_host_ips(host: object) -> list[str] | None:
    """The address a literal host means to the OS resolver, or None for a name to resolve."""
    if not isinstance(host, str):
        return None
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in text:
        try:
            return [_canonical_ipv6(text)]
        except UrlError:
            return None
    ipv4 = _parse_inet_aton(text[:-1] if text.endswith(".") else text)
    return [str(ipv4)] if ipv4 is not None else None


# -- SSRF guard (SPEC §6) --------------------------------------------------------------

_SHARED_ADDRESS_SPACE = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
# RFC 1918, unique-local and (deprecated, still routed inside some sites) site-local.
_PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "fec0::/10")
)
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries to the network, if it carries one.

    IPv4-mapped, IPv4-compatible, 6to4 and NAT64 addresses all end up at that IPv4 host,
    so they must be judged as it: ``::ffff:127.0.0.1`` is loopback.
    """
    if ip.version == 4:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why connecting to ``ip`` could reach something private, or None for a public address."""
    if ip.version == 6 and ip in _LOCAL_NAT64:
        return "private"
    inner = embedded_ipv4(ip)
    if inner is not None:
        ip = inner
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("shared-address-space", ip.version == 4 and ip in _SHARED_ADDRESS_SPACE),
        ("private", any(ip.version == n.version and ip in n for n in _PRIVATE_NETWORKS)),
        # The special-purpose rest (documentation, benchmarking, 240/4, …) as Python knows it.
        ("reserved", ip.is_reserved or ip.is_private or not ip.is_global),
    )
    return next((name for name, hit in checks if hit), None)


def _parse_ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which otherwise forbidden destinations the operator allows (``allow_private_addresses``).

    ``false``: none. ``true``: all. Otherwise CIDRs (any port on those addresses) and
    ``host:port`` entries (exactly that port: the tests' relays are allowed, the other
    services on the same loopback are not).
    """

    allow_all: bool = False
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    endpoints: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def parse(cls, value: str) -> AddressPolicy:
        text = value.strip()
        if text.lower() in ("", "false"):
            return cls()
        if text.lower() == "true":
            return cls(allow_all=True)
        networks, endpoints = [], []
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            if "/" in entry:
                try:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                except ValueError:
                    raise UrlError(f"bad CIDR {entry!r}") from None
                continue
            host, port = split_host_port(entry)
            if port is None:
                raise UrlError(f"{entry!r} needs a port (host:port) or a prefix (CIDR)")
            endpoints.append((host, port))
        return cls(networks=tuple(networks), endpoints=frozenset(endpoints))

    def __str__(self) -> str:
        if self.allow_all:
            return "true"
        entries = [str(n) for n in self.networks]
        entries += [format_host_port(h, p) for h, p in sorted(self.endpoints)]
        return ", ".join(entries) or "false"

    def check(self, host: str, port: int, resolved_ips: list[str]) -> None:
        """Raise ``SsrfRefused`` unless every address ``host`` reaches may be connected to.

        Every address counts, not just the first: the connector may try any of them.
        """
        if not isinstance(host, str):
            raise SsrfRefused(f"bad host {host!r}")
        literal = numeric_host_ips(host)
        try:
            host_key = literal[0] if literal else canonical_host(host)
        except UrlError:
            raise SsrfRefused(f"bad host {host!r}") from None
        addresses = list(dict.fromkeys((literal or []) + list(resolved_ips)))
        if not addresses:
            raise SsrfRefused(f"{host} resolved to no address")
        if self.allow_all or (host_key, port) in self.endpoints:
            return
        for text in addresses:
            ip = _parse_ip(text)
            if ip is None:
                raise SsrfRefused(f"{host} resolved to unparseable address {text!r}")
            reason = forbidden_reason(ip)
            if reason is not None and not self._allows(ip, port):
                where = format_host_port(host_key, port)
                raise SsrfRefused(f"{where} resolves to {reason} address {ip}")

    def _allows(self, ip: IPAddress, port: int) -> bool:
        candidates = [ip] + [a for a in (embedded_ipv4(ip),) if a is not None]
        for candidate in candidates:
            unscoped = str(candidate).split("%", 1)[0]
            if (unscoped, port) in self.endpoints:
                return True
            if any(candidate.version == n.version and candidate in n for n in self.networks):
                return True
        return False
