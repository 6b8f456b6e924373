"""NIP-11 limits: parsing untrusted documents, and the bounded fetch against a real HTTP server."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gsync.constants import DEFAULT_MAX_SUBSCRIPTIONS
from gsync.io.nip11_fetch import fetch_relay_limits, nip11_http_url
from gsync.protocol.nip11 import RelayLimits, parse_nip11
from gsync.protocol.urls import split_host_port

DEFAULTS = RelayLimits()

GOOD_DOC = {
    "name": "test relay",
    "supported_nips": [1, 11, 42, 77, "x", -1, True],
    "limitation": {
        "max_subscriptions": 50,
        "max_message_length": 131072,
        "max_limit": 500,
        "max_subid_length": 64,
        "max_filters": 10,
        "auth_required": True,
    },
}
GOOD_LIMITS = RelayLimits(
    max_subscriptions=50,
    max_message_length=131072,
    max_limit=500,
    max_subid_length=64,
    max_filters=10,
    auth_required=True,
    supported_nips=frozenset({1, 11, 42, 77}),
)


@pytest.mark.parametrize("document, expected", [
    (json.dumps(GOOD_DOC), GOOD_LIMITS),
    (json.dumps(GOOD_DOC).encode(), GOOD_LIMITS),
    ("{}", DEFAULTS),
    ('{"limitation": {}}', DEFAULTS),
    ('{"limitation": {"max_limit": 100}}', RelayLimits(max_limit=100)),
    ('{"limitation": {"max_subscriptions": 5}}', RelayLimits(max_subscriptions=5)),
    ('{"limitation": {"max_subscriptions": -5, "max_limit": 0}}', DEFAULTS),
    # numbers written as strings ("max_limit": "500") are read; a fraction is no limit
    ('{"limitation": {"max_subscriptions": "50", "max_limit": 1.5}}', RelayLimits(max_subscriptions=50)),
    ('{"limitation": {"max_subscriptions": true, "max_filters": null}}', DEFAULTS),
    ('{"limitation": {"auth_required": "yes"}}', DEFAULTS),
    ('{"limitation": [1, 2]}', DEFAULTS),
    ('{"supported_nips": "1,11"}', DEFAULTS),
    ('{"supported_nips": [11, 11, 77]}', RelayLimits(supported_nips=frozenset({11, 77}))),
    ("", DEFAULTS),
    (b"", DEFAULTS),
    (None, DEFAULTS),
    ("not json", DEFAULTS),
    ("[1, 2, 3]", DEFAULTS),
    ('"a string"', DEFAULTS),
    ("null", DEFAULTS),
    (b"\xff\xfe garbage", DEFAULTS),
    ('{"limitation": {"max_limit": 1' + "0" * 5000 + "}}", DEFAULTS),  # past int digit cap
    ("[" * 100_000 + "]" * 100_000, DEFAULTS),  # recursion bomb
])
def test_parse_nip11_tolerates_anything(document, expected):
    assert parse_nip11(document) == expected


def test_defaults_assume_twenty_subscriptions_and_no_other_limit():
    assert DEFAULTS.max_subscriptions == DEFAULT_MAX_SUBSCRIPTIONS == 20
    assert (DEFAULTS.max_message_length, DEFAULTS.max_limit, DEFAULTS.max_filters) == (None, None, None)
    assert not DEFAULTS.auth_required


@pytest.mark.parametrize("ws, http", [
    ("wss://relay.example.com", "https://relay.example.com"),
    ("ws://127.0.0.1:7000/nostr", "http://127.0.0.1:7000/nostr"),
])
def test_nip11_is_fetched_from_the_http_form_of_the_relay_url(ws, http):
    assert nip11_http_url(ws) == http


# -- fetch against a real local HTTP server ---------------------------------------------


def fetch(url: str, **bounds):
    """The fetch as a handshake worker runs it, over a socket dialled to the URL's own
    (literal, loopback) address: the one the guard would have checked."""
    host, port = split_host_port(url.split("://", 1)[1].split("/", 1)[0])
    return fetch_relay_limits(url, lambda timeout: socket.create_connection((host, port), timeout), **bounds)


HUGE = b'{"limitation": {"max_limit": 7}, "pad": "' + b"x" * (1024 * 1024) + b'"}'


class _Nip11Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, *args):
        pass

    def _reply(self, status: int, body: bytes, length: bool = True, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", "application/nostr+json")
        if length:
            self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path
        if path == "/good":
            if self.headers.get("Accept") != "application/nostr+json":
                return self._reply(200, b"<html>a web page</html>")
            return self._reply(200, json.dumps(GOOD_DOC).encode())
        if path == "/huge":
            return self._reply(200, HUGE)
        if path == "/huge-unannounced":
            return self._reply(200, HUGE, length=False)
        if path == "/redirect":
            return self._reply(302, b"", headers=[("Location", "/good")])
        if path == "/empty-200":
            return self._reply(200, b"")
        if path == "/no-reply":
            # What nostr-sdk's LocalRelay does (PEERS.md): the connection closes, no response.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return None
        if path == "/slow":
            time.sleep(3)
            return self._reply(200, json.dumps(GOOD_DOC).encode())
        if path == "/trickle":
            self.send_response(200)
            self.end_headers()
            for _ in range(30):  # each byte well inside the read timeout, all of them not
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
            return None
        return self._reply(404, b"not found")


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address):
        pass  # clients that gave up (the point of the timeout tests) break the pipe


@pytest.fixture(scope="module")
def nip11_server():
    server = _QuietServer(("127.0.0.1", 0), _Nip11Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"ws://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_reads_a_good_document(nip11_server):
    assert fetch(f"{nip11_server}/good") == GOOD_LIMITS


@pytest.mark.parametrize("path", ["/huge", "/huge-unannounced"])
def test_fetch_refuses_documents_over_the_size_cap(nip11_server, path):
    assert fetch(f"{nip11_server}{path}", max_bytes=64 * 1024) == DEFAULTS
    # The same document under a cap it fits is read: the cap, not the document, refused it.
    assert fetch(f"{nip11_server}{path}", max_bytes=2 * 1024 * 1024).max_limit == 7


@pytest.mark.parametrize("path", ["/missing", "/empty-200", "/no-reply", "/redirect"])
def test_fetch_falls_back_to_defaults(nip11_server, path):
    assert fetch(f"{nip11_server}{path}") == DEFAULTS


@pytest.mark.parametrize("path", ["/slow", "/trickle"])
def test_fetch_gives_up_at_the_timeout(nip11_server, path):
    started = time.monotonic()
    assert fetch(f"{nip11_server}{path}", timeout=0.5) == DEFAULTS
    assert time.monotonic() - started < 1.5


def test_fetch_of_a_closed_port_gives_defaults():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert fetch(f"ws://127.0.0.1:{port}", timeout=1.0) == DEFAULTS


def test_fetch_of_a_non_ws_url_gives_defaults():
    assert fetch("ftp://127.0.0.1/x") == DEFAULTS


def test_numbers_written_as_strings_are_read_as_numbers():
    """Relays publish ``"max_limit": "500"`` and ``"supported_nips": ["1", "77"]``."""
    limits = parse_nip11(json.dumps({
        "supported_nips": ["1", "11", " 77 ", "x", "-1", "7.5", 42.0],
        "limitation": {"max_limit": "500", "max_message_length": "65536", "max_subscriptions": "12",
                       "max_filters": "１０", "auth_required": "true"},
    }))
    assert limits.supported_nips == frozenset({1, 11, 77, 42})
    assert (limits.max_limit, limits.max_message_length, limits.max_subscriptions) == (500, 65536, 12)
    assert limits.max_filters is None  # full-width digits are not a number here
    assert limits.auth_required
