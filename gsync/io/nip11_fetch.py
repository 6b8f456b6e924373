"""Bounded NIP-11 fetch: one HTTP GET for a relay's limits, run by a handshake worker.

The GET goes over a TCP connection the caller opens (``connect``): the handshake connects it
to the very address its websocket reached, which the SSRF guard checked. Nothing here
resolves a name, so a name that answers DNS differently the second time (rebinding) cannot
aim the GET at loopback or a metadata address; and no redirect is followed, since a
``Location`` header has not been checked. ``http.client`` (standard library) speaks the
HTTP/1.1 over that socket: Host header, chunked bodies, header limits.

Whatever goes wrong — refused, slow, huge, not JSON, a redirect — the relay gets default
limits: a missing NIP-11 document must never keep a relay from syncing.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from ..ops.logging import get_logger
from ..protocol.nip11 import RelayLimits, parse_nip11
from ..protocol.urls import UrlError, split_host_port

log = get_logger(__name__)

_HTTP_SCHEME = {"ws": "http", "wss": "https"}
MAX_DOCUMENT_BYTES = 64 * 1024

# connect(timeout) -> a TCP socket connected to an address the SSRF guard allowed
Connect = Callable[[float], socket.socket]


def nip11_http_url(ws_url: str) -> str:
    """The http(s) form of a relay URL: NIP-11 is served on the same URI."""
    scheme, sep, rest = ws_url.partition("://")
    if not sep or scheme.lower() not in _HTTP_SCHEME:
        raise ValueError(f"not a ws(s) URL: {ws_url!r}")
    return f"{_HTTP_SCHEME[scheme.lower()]}://{rest}"


def fetch_relay_limits(ws_url: str, connect: Connect, timeout: float = 5.0,
                       max_bytes: int = MAX_DOCUMENT_BYTES) -> RelayLimits:
    """The relay's NIP-11 limits, or defaults when they cannot be had within the bounds.

    ``timeout`` bounds connecting, each read, and the whole body, so a relay that trickles
    bytes cannot hold a handshake worker. (Headers trickled byte by byte are bounded only
    per read; the caller's own handshake deadline covers that.)
    """
    try:
        body = _fetch_body(ws_url, connect, timeout, max_bytes)
    except (http.client.HTTPException, ValueError, OSError) as exc:
        log.debug("nip11_unavailable", relay=ws_url, reason=type(exc).__name__, detail=str(exc))
        return RelayLimits()
    return parse_nip11(body)


class _CheckedConnection(http.client.HTTPConnection):
    """An HTTP(S) connection over a socket the caller connected: the request names the
    relay's host (Host header, TLS SNI and certificate check), the socket decides where it
    goes."""

    def __init__(self, host: str, port: int, connect: Connect, timeout: float, tls: bool):
        super().__init__(host, port, timeout=timeout)
        self._connect_checked = connect
        self._tls = ssl.create_default_context() if tls else None

    def connect(self) -> None:
        sock = self._connect_checked(self.timeout)
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self.sock = sock


def _fetch_body(ws_url: str, connect: Connect, timeout: float, max_bytes: int) -> bytes:
    deadline = time.monotonic() + timeout
    parts = urlsplit(nip11_http_url(ws_url))
    try:
        host, port = split_host_port(parts.netloc)
    except UrlError as exc:
        raise ValueError(str(exc)) from None
    tls = parts.scheme == "https"
    conn = _CheckedConnection(host, port or (443 if tls else 80), connect, timeout, tls)
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "application/nostr+json",
                                           "User-Agent": "gsync", "Connection": "close"})
        response = conn.getresponse()
        # A redirect is a failure too: its Location has not passed the SSRF check.
        if response.status != 200:
            raise ValueError(f"HTTP {response.status}")
        declared = response.getheader("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ValueError(f"document of {declared} bytes exceeds {max_bytes}")
        body = bytearray()
        # read1 returns what has arrived, so the deadline is checked between trickled bytes.
        while chunk := response.read1(8192):
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"document exceeds {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise ValueError(f"document not received within {timeout} s")
        return bytes(body)
    finally:
        conn.close()
