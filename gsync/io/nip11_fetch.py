"""Bounded NIP-11 fetch: one HTTP GET for a relay's limits, run by a handshake worker.

Whatever goes wrong — refused, slow, huge, not JSON, a redirect — the relay gets default
limits: a missing NIP-11 document must never keep a relay from syncing.
"""
from __future__ import annotations

import time

import requests

from ..ops.logging import get_logger
from ..protocol.nip11 import RelayLimits, parse_nip11

log = get_logger(__name__)

_HTTP_SCHEME = {"ws": "http", "wss": "https"}


def nip11_http_url(ws_url: str) -> str:
    """The http(s) form of a relay URL: NIP-11 is served on the same URI."""
    scheme, sep, rest = ws_url.partition("://")
    if not sep or scheme.lower() not in _HTTP_SCHEME:
        raise ValueError(f"not a ws(s) URL: {ws_url!r}")
    return f"{_HTTP_SCHEME[scheme.lower()]}://{rest}"


def fetch_relay_limits(ws_url: str, timeout: float = 5.0, max_bytes: int = 64 * 1024) -> RelayLimits:
    """The relay's NIP-11 limits, or defaults when they cannot be had within the bounds.

    ``timeout`` bounds connecting, each read, and the whole body, so a relay that trickles
    bytes cannot hold a handshake worker. (Headers trickled byte by byte are bounded only
    per read; the caller's own handshake deadline covers that.)
    """
    try:
        body = _fetch_body(nip11_http_url(ws_url), timeout, max_bytes)
    except (requests.RequestException, ValueError, OSError) as exc:
        log.debug("nip11_unavailable", relay=ws_url, reason=type(exc).__name__, detail=str(exc))
        return RelayLimits()
    return parse_nip11(body)


def _fetch_body(url: str, timeout: float, max_bytes: int) -> bytes:
    deadline = time.monotonic() + timeout
    # No redirects: the URL passed the SSRF check, a Location header has not.
    with requests.get(
        url,
        headers={"Accept": "application/nostr+json"},
        timeout=timeout,
        stream=True,
        allow_redirects=False,
    ) as response:
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}")
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ValueError(f"document of {declared} bytes exceeds {max_bytes}")
        # read1 returns what has arrived, so the deadline is checked between trickled bytes;
        # read (urllib3 < 2.3) waits for a full chunk and only the per-read timeout applies.
        read_some = getattr(response.raw, "read1", None) or response.raw.read
        body = bytearray()
        while chunk := read_some(8192, decode_content=True):
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"document exceeds {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise ValueError(f"document not received within {timeout} s")
        return bytes(body)
