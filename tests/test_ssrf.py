"""SSRF on every path (SPEC §6): relay URLs come from events anyone can publish, so gsync must
connect only to addresses the guard checked — for the websocket and for the NIP-11 GET alike,
with no second DNS answer and no redirect taking it elsewhere.

Every target below is a listening socket that counts what it accepts (a scripted relay with
a NIP-11 document, so a GET that reached it would succeed): "no connection" is what the
socket saw, not what gsync says it did.
"""
from __future__ import annotations

import socket

import pytest

from gsync.io.handshake import HandshakePool
from gsync.io.inbox import HandshakeDone
from gsync.protocol.urls import AddressPolicy

from . import factory as f
from .relays import publish, wait_until
from .scenario import alice
from .scripted_relay import ScriptedRelay

OUTCOMES = ("relay_refused", "relay_connected", "relay_connect_failed")
NIP11 = {"name": "trap", "limitation": {"max_limit": 123}}


def announcement_listing(own, urls, d="ssrf"):
    host = f"127.0.0.1:{own.port}"
    return f.announcement(alice, d, clone=[f"http://{host}/{alice.pubkey}/{d}.git"],
                          relays=[f"ws://{host}", *urls])


def outcome_of(gsync, url: str) -> str | None:
    for e in gsync.log_events():
        if e.get("event") in OUTCOMES and e.get("relay") == url:
            return e["event"]
    return None


def test_loopback_relays_names_and_redirects_get_no_connection(relay_factory, scripted, gsync_factory):
    own = relay_factory()
    literal = scripted(nip11=NIP11)  # ws://127.0.0.1:P, not in the allow list
    named = scripted(nip11=NIP11)  # the same, reached as ws://localhost:P
    ws_target, nip11_target = scripted(nip11=NIP11), scripted(nip11=NIP11)
    # Two relays the operator does allow, each pointing somewhere it does not.
    ws_redirect = scripted(redirect_to=ws_target.url)
    nip11_redirect = scripted(nip11_redirect_to=f"http://127.0.0.1:{nip11_target.port}/")
    named_url = f"ws://localhost:{named.port}"
    assert socket.gethostbyname("localhost") == "127.0.0.1"
    urls = [literal.url, named_url, ws_redirect.url, nip11_redirect.url]
    publish(own.url, [announcement_listing(own, urls)])
    gsync = gsync_factory(own, [ws_redirect, nip11_redirect])  # allows exactly those two

    wait_until(lambda: all(outcome_of(gsync, u) for u in urls), timeout=30,
               what="a handshake outcome for every listed relay")
    assert outcome_of(gsync, literal.url) == "relay_refused"
    assert outcome_of(gsync, named_url) == "relay_refused"
    assert outcome_of(gsync, ws_redirect.url) == "relay_connect_failed"  # a 301 is not followed
    assert outcome_of(gsync, nip11_redirect.url) == "relay_connected"
    # The NIP-11 GET was made (and answered with the redirect) before the relay counted as
    # connected: had the redirect been followed, its target would have seen it by now.
    assert any("upgrade" not in headers for _, headers in nip11_redirect.http_requests)
    assert ws_redirect.http_requests, "the redirecting relay was never dialled: vacuous"
    for trap in (literal, named, ws_target, nip11_target):
        assert trap.handshake_gauge.total == 0, f"{trap.url} got {trap.http_requests}"
    assert gsync.proc.poll() is None


@pytest.fixture
def rebinding_name(monkeypatch):
    """``rebind.example`` resolves to 127.0.0.2 the first time and to 127.0.0.1 ever after,
    as a hostile DNS server with a zero TTL would answer (this stand-in answers it: no
    query leaves the machine). Other names resolve as usual. (Not ``.invalid``: gsync
    answers those itself without asking, RFC 6761.)"""
    real = socket.getaddrinfo
    answers = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "rebind.example":
            return real(host, port, *args, **kwargs)
        address = "127.0.0.2" if not answers else "127.0.0.1"
        answers.append(address)
        return real(address, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def _relay_and_trap_on_one_port():
    """A relay on 127.0.0.2:P (allowed) and a trap on 127.0.0.1:P (forbidden)."""
    for _ in range(20):
        relay = ScriptedRelay(host="127.0.0.2", nip11={"limitation": {"max_limit": 77}}).start()
        try:
            return relay, ScriptedRelay(host="127.0.0.1", port=relay.port, nip11=NIP11).start()
        except OSError:  # that port is taken on 127.0.0.1: try another
            relay.stop()
    raise RuntimeError("no port free on both addresses")


def test_nip11_goes_to_the_checked_address_not_to_a_second_dns_answer(rebinding_name):
    relay, trap = _relay_and_trap_on_one_port()
    try:
        pool = HandshakePool(lambda msg: None, AddressPolicy.parse("127.0.0.2/32"))
        done = pool._attempt(f"ws://rebind.example:{relay.port}", 1)
        assert isinstance(done, HandshakeDone) and done.ws is not None, done.error
        done.ws.close()
        assert done.limits.max_limit == 77  # the checked relay's own document
        assert trap.handshake_gauge.total == 0, f"the trap got {trap.http_requests}"
        assert rebinding_name == ["127.0.0.2"]  # resolved once, checked, used for both
        assert [line for line, _ in relay.http_requests] == ["GET / HTTP/1.1"] * 2
    finally:
        relay.stop()
        trap.stop()


def test_a_name_that_rebinds_to_a_forbidden_address_is_refused_before_any_connection(rebinding_name):
    relay, trap = _relay_and_trap_on_one_port()
    try:
        rebinding_name.append("first answer used up")  # it now resolves to 127.0.0.1
        pool = HandshakePool(lambda msg: None, AddressPolicy.parse("127.0.0.2/32"))
        done = pool._attempt(f"ws://rebind.example:{relay.port}", 1)
        assert done.refused and "loopback" in done.error
        assert trap.handshake_gauge.total == 0 and relay.handshake_gauge.total == 0
    finally:
        relay.stop()
        trap.stop()


def test_a_name_that_does_not_resolve_is_a_permanent_failure(monkeypatch):
    """The resolver says no such name (answered here, in process, by a stand-in
    getaddrinfo: no query leaves the machine): the attempt is marked permanent ("dns"), so
    the manager parks the relay instead of redialling it every few seconds. A resolver
    that says "try again" (EAI_AGAIN) is not permanent. ``.invalid`` names are answered
    by gsync itself (RFC 6761), without asking the resolver at all."""
    asked = []

    def no_such_name(host, *args, **kw):
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    pool = HandshakePool(lambda msg: None, AddressPolicy.parse("127.0.0.0/8"))
    done = pool._attempt("ws://gone.example:7777", 1)
    assert done.permanent == "dns" and "Name or service not known" in done.error
    assert pool._attempt("ws://nonexistent.invalid:7777", 2).permanent == "dns"
    assert asked == ["gone.example"]

    def try_again(host, *args, **kw):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", try_again)
    assert pool._attempt("ws://flaky.example:7777", 3).permanent == ""
