"""Handshake workers: DNS, the SSRF guard, TCP/TLS, the websocket handshake and NIP-11.

A fixed pool (``gevent.pool.Pool``, eight by default) takes attempts from a queue, so at most
that many handshakes are ever in flight and a queued attempt does not start its backoff clock
until a worker takes it (the worker posts ``HandshakeStarted`` first). Workers never touch an
index: they post ``HandshakeDone`` and only the manager applies it.

The socket is connected to the address the guard checked (no second DNS lookup that a
rebinding name could answer differently), then handed to websocket-client, which follows no
redirect. The NIP-11 GET goes to the same address the websocket reached (``same_address``).
"""
from __future__ import annotations

import socket
import ssl
import time
from urllib.parse import urlsplit

import gevent
import gevent.pool
import websocket
from gevent.queue import Queue

from .. import constants
from ..ops import metrics
from ..protocol.urls import AddressPolicy, SsrfRefused, UrlError, never_resolves, split_host_port
from ..sync.health import permanent_http_status, retry_after_secs
from .inbox import HandshakeDone, HandshakeStarted
from .nip11_fetch import fetch_relay_limits
from .ws import HandshakeAnswerTooLarge
from .ws import connect as ws_connect

NIP11_TIMEOUT_SECS = 5.0


def open_websocket(url: str, policy: AddressPolicy, timeout: float):
    """Resolve, check every address, connect to a checked one, and do the websocket handshake."""
    parts = urlsplit(url)
    host, port = split_host_port(parts.netloc)
    port = port or (443 if parts.scheme == "wss" else 80)
    if never_resolves(host):  # RFC 6761: answered here, as a resolver would, without a query
        raise socket.gaierror(socket.EAI_NONAME, f"{host} never resolves (RFC 6761 .invalid)")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    policy.check(host, port, addresses)
    last_error: Exception | None = None
    for info in infos:
        family, _, _, _, sockaddr = info
        sock = socket.socket(family, socket.SOCK_STREAM)
        # As websocket-client does for the sockets it opens itself: a small frame (a REQ,
        # a CLOSE) must not wait for the peer's delayed ACK (Nagle: ~40 ms a time).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
            if parts.scheme == "wss":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            return ws_connect(url, timeout, socket=sock)
        except Exception as exc:
            last_error = exc
            sock.close()
        except BaseException:  # the handshake deadline (gevent.Timeout): close, then go on
            sock.close()
            raise
    raise last_error or OSError(f"no address for {host}")


def _status_answer(relay: str, attempt: int, status: int | None, headers: dict,
                   note: str = "") -> HandshakeDone:
    """The relay answered the upgrade with something other than 101. A 429, or a 503 that
    says when to come back (``Retry-After``), is the relay limiting us: a cooldown before
    the next attempt, at least as long as it asked. Anything else is a failed attempt."""
    retry_after = retry_after_secs(headers.get("retry-after"), time.time())
    rate_limited = status == 429 or (status == 503 and retry_after is not None)
    error = f"HTTP {status} to the websocket upgrade" + (f" ({note})" if note else "")
    permanent = f"http {status}" if not rate_limited and permanent_http_status(status) else ""
    return HandshakeDone(relay, attempt, error=error, rate_limited=rate_limited,
                         retry_after=retry_after if rate_limited else None, permanent=permanent)


# getaddrinfo's answers that the name does not exist (not "try again": EAI_AGAIN)
_NO_SUCH_NAME = frozenset(getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA")
                          if hasattr(socket, name))


def permanent_kind(exc: BaseException) -> str:
    """``"dns"`` for a name that does not resolve, ``"tls"`` for a TLS failure that is not
    a connection cut short; "" for what a retry may fix."""
    if isinstance(exc, socket.gaierror) and exc.errno in _NO_SUCH_NAME:
        return "dns"
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return "tls"
    return ""


def same_address(ws):
    """A ``connect(timeout)`` for NIP-11 that dials the address ``ws`` is connected to: one
    the guard checked, whatever the relay's name resolves to now."""
    family, sockaddr = ws.peer

    def connect(timeout: float) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(sockaddr)
        except BaseException:
            sock.close()
            raise
        return sock

    return connect


class HandshakePool:
    def __init__(self, post, policy: AddressPolicy, *, workers: int = 8, fetch_limits=fetch_relay_limits):
        self._post = post
        self._policy = policy
        self._fetch_limits = fetch_limits
        self._requests: Queue = Queue()
        self.pool = gevent.pool.Pool(workers)
        self.size = workers
        self.busy = 0
        self.peak = 0  # the most handshakes in flight at once (at most ``size``)
        self.queued: set[str] = set()

    def start(self) -> None:
        for _ in range(self.size):
            self.pool.spawn(self._work)

    def stop(self) -> None:
        self.pool.kill(block=False)

    def request(self, relay: str, attempt: int) -> None:
        """Queue an attempt; never blocks the caller."""
        self.queued.add(relay)
        self._requests.put((relay, attempt))

    def _work(self) -> None:
        while True:
            relay, attempt = self._requests.get()
            self.queued.discard(relay)
            self.busy += 1
            self.peak = max(self.peak, self.busy)
            metrics.HANDSHAKES_IN_FLIGHT.set(self.busy)
            try:
                self._post(HandshakeStarted(relay, attempt))
                self._post(self._attempt(relay, attempt))
            finally:
                self.busy -= 1
                metrics.HANDSHAKES_IN_FLIGHT.set(self.busy)

    def _attempt(self, relay: str, attempt: int) -> HandshakeDone:
        ws = None
        try:
            with gevent.Timeout(constants.HANDSHAKE_TIMEOUT_SECS):
                ws = open_websocket(relay, self._policy, constants.HANDSHAKE_TIMEOUT_SECS)
                limits = self._fetch_limits(relay, same_address(ws), timeout=NIP11_TIMEOUT_SECS)
            return HandshakeDone(relay, attempt, ws=ws, limits=limits)
        except (SsrfRefused, UrlError) as exc:
            return HandshakeDone(relay, attempt, error=f"refused: {exc}", refused=True)
        except websocket.WebSocketBadStatusException as exc:
            return _status_answer(relay, attempt, exc.status_code, exc.resp_headers or {})
        except HandshakeAnswerTooLarge as exc:
            return _status_answer(relay, attempt, exc.status, exc.headers, str(exc))
        except gevent.Timeout:
            error, permanent = "handshake timed out", ""
        except Exception as exc:
            error, permanent = f"{type(exc).__name__}: {exc}"[:200], permanent_kind(exc)
        if ws is not None:
            try:
                ws.close(timeout=1)
            except Exception:
                pass
        return HandshakeDone(relay, attempt, error=error, permanent=permanent)
