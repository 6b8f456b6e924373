"""The public network as other sync clients meet it (issue #29): relays that say one thing
and do another. Each test is a scripted relay behaving exactly as reported (PEERS.md, "The
public network"), and judges gsync by what lands on the own relay and what goes on the wire.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from gsync.sim.relay import filter_from_json

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, our_announcement
from .scripted_relay import Nip77Serve

alice, bob = f.Author.named("alice"), f.Author.named("bob")


def events_named(gsync, name, relay=None) -> list[dict]:
    return [e for e in gsync.log_events()
            if e.get("event") == name and (relay is None or e.get("relay") == relay)]


def neg_opens(remote) -> list[list]:
    return [m for m in remote.messages("NEG-OPEN")]


def test_a_nip77_query_past_the_relays_result_cap_is_split_and_stays_on_nip77(
        relay_factory, gsync_factory, scripted):
    """strfry past its maxSyncEvents: ``["NEG-ERR", sub, "blocked: too many query results",
    50]``. One repository's 120 issues (an hour apart) match one filter, of which the own
    relay holds every other one: gsync reads the four-element NEG-ERR, cuts that filter into
    time windows around what the own relay holds (``result_caps``), and reconciles every
    window by NIP-77; REQ pages ask only the stretches where the own relay holds nothing
    (no held issue comes again), and NIP-77 is never turned off."""
    own = relay_factory()
    nip77 = Nip77Serve(max_results=50)
    remote = scripted(negentropy=nip77, page_size=500)
    repo = our_announcement(own, [remote], d="crowded")
    issues = [f.issue(bob, repo, subject=f"crowded {i}", created_at=f.BASE_CREATED_AT + 3600 * i)
              for i in range(120)]
    remote.add(repo, *issues)
    held = issues[::2]
    publish(own.url, [repo, *held])  # held: the issues' filter goes by NIP-77
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=30, what="the 120 issues")
    assert nip77.refused >= 1, "the relay's cap was reached"
    by_a = [filter_from_json(flt) for _, filters in remote.reqs() for flt in filters
            if "#a" in flt and "ids" not in flt and flt.get("limit") != 0]
    again = [flt for flt in by_a if any(flt.matches(issue) for issue in held)]
    assert again == [], f"REQ pages asked for held issues: {again}"
    assert not events_named(gsync, "negentropy_unsupported"), "NIP-77 stayed on"
    assert events_named(gsync, "negentropy_filter_split", remote.url)
    opened = [m[2] for m in remote.messages("NEG-OPEN")]
    print(f"NEG-OPEN {nip77.opened} (refused {nip77.refused}), REQ {len(remote.reqs())}, "
          f"NEG-OPEN with #a {sum('#a' in flt for flt in opened)}")
    assert nip77.refused <= 3, "cut by the holdings: about one refusal per level, not per part"


def _time_to_sync(own, gsync_factory, remote, d, **kw):
    repo = our_announcement(own, [remote], d=d)
    issues = [f.issue(bob, repo, subject=f"{d} {i}") for i in range(20)]
    remote.add(repo, *issues)
    publish(own.url, [repo, issues[0]])  # something held: NIP-77 is tried
    started = time.monotonic()
    gsync = gsync_factory(own, [remote], **kw)
    assert_arrives(own, issues, timeout=40, what="the issues")
    return gsync, time.monotonic() - started


def test_nip77_refused_by_a_notice_in_the_relays_own_words_falls_back_at_once(
        relay_factory, gsync_factory, scripted):
    """primal.net and purplepag.es answer NEG-OPEN with a NOTICE that need not mention
    negentropy: it is that exchange's refusal, so REQ+EOSE starts at once instead of after
    the NIP-77 deadline (15 s by default; 60 s here, so that a loaded machine cannot blur
    the two)."""
    own = relay_factory()
    remote = scripted(negentropy="plain-notice", neg_err_reason="ERROR: bad msg: unknown command",
                      page_size=500)
    gsync, secs = _time_to_sync(own, gsync_factory, remote, "notice-refusal",
                                timers={"NEGENTROPY_DEADLINE_SECS": 60})
    print(f"synced in {secs:.1f} s")
    assert remote.messages("NEG-OPEN"), "NIP-77 was tried"
    assert secs < 30, f"{secs:.1f} s: the NOTICE was not read as the refusal"
    unsupported = events_named(gsync, "negentropy_unsupported", remote.url)
    assert len(unsupported) == 1 and unsupported[0]["reason"].startswith("notice")


def test_nip77_advertised_and_never_answered_is_not_asked_again_after_a_quick_reconnect(
        relay_factory, gsync_factory, scripted):
    """nos.lol, nostr.wine, nostr.mom list 77 in supported_nips and never answer NEG-OPEN.
    After the first exchange times out, the relay is remembered (over sessions): a quick
    reconnect, then a new repository whose filter the own relay holds some of (NIP-77
    otherwise), and still no NEG-OPEN: REQ+EOSE brings it."""
    own = relay_factory()
    remote = scripted(negentropy="ignore", page_size=500,
                      nip11={"supported_nips": [1, 11, 77], "limitation": {}})
    first = our_announcement(own, [remote], d="advertised-1")
    first_issues = [f.issue(bob, first, subject=f"one {i}") for i in range(5)]
    remote.add(first, *first_issues)
    publish(own.url, [first, first_issues[0]])
    gsync = gsync_factory(own, [remote], extra={"sync": {"base_backoff_secs": "0.2"}},
                          timers={"NEGENTROPY_DEADLINE_SECS": 1.5})
    assert_arrives(own, first_issues, timeout=30, what="the first repository via REQ+EOSE")
    opened_first = len(remote.messages("NEG-OPEN"))
    assert opened_first >= 1, "NIP-77 was tried once"
    remote.drop_all()
    wait_until(lambda: len(events_named(gsync, "relay_connected", remote.url)) >= 2, timeout=20,
               what="the reconnect")
    assert events_named(gsync, "relay_connected", remote.url)[-1]["fresh_start"] is False
    second = our_announcement(own, [remote], d="advertised-2")
    second_issues = [f.issue(bob, second, subject=f"two {i}") for i in range(5)]
    remote.add(second, *second_issues)
    publish(own.url, [second, second_issues[0]])
    assert_arrives(own, second_issues, timeout=30, what="the second repository")
    assert len(remote.messages("NEG-OPEN")) == opened_first, "NEG-OPEN sent again after the reconnect"
    assert len(events_named(gsync, "negentropy_advertised_not_served", remote.url)) == 1


@pytest.mark.slow
def test_a_relay_answering_the_upgrade_with_404_is_parked_and_says_so(relay_factory, gsync_factory,
                                                                       scripted):
    """An HTTP 404 to the websocket upgrade is no websocket there: no retry in 0.2 s (the
    backoff set here) but after the park (4 s here, 12 h in production), shown in
    ``gsync status`` and /metrics meanwhile; the relay serving websockets by then is synced."""
    from gsync.ops.status import render

    own = relay_factory()
    remote = scripted(refuse_upgrades=[(404, {"Content-Type": "text/html"}, b"<h1>Not Found</h1>")])
    repo = our_announcement(own, [remote], d="parked-404")
    bug = f.issue(bob, repo)
    remote.add(repo, bug)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"base_backoff_secs": "0.2"}},
                          timers={"PERMANENT_FAILURE_PARK_SECS": 4, "MAINTENANCE_TICK_SECS": 0.5})

    def relay_status():
        return next((r for r in gsync.status()["relays"] if r["relay"] == remote.url), {})

    wait_until(lambda: relay_status().get("parked") == "http 404", timeout=20, what="parked in status")
    assert "parked" in render(gsync.status()) and "http 404" in render(gsync.status())
    wait_until(lambda: gsync.metric("gsync_relay_parked_seconds", relay=remote.url) > 0, timeout=5,
               what="parked in /metrics")
    assert_arrives(own, [bug], timeout=30, what="the issue once the park is over")
    first, second = remote.upgrade_times[:2]
    assert second - first >= 3.9, remote.upgrade_times
    wait_until(lambda: gsync.metric("gsync_relay_parked_seconds", relay=remote.url) == 0, timeout=5,
               what="no longer parked")
    assert "parked" not in relay_status()


def _asks_q(flt) -> bool:
    return isinstance(flt, dict) and "#q" in flt


def test_a_policy_refusal_is_found_by_shape_and_the_refused_shape_asked_once_more_per_mode(
        relay_factory, gsync_factory, scripted):
    """A relay refusing every REQ that holds a ``#q`` filter with ``CLOSED "blocked: ..."``
    (naming no filter). Each refused REQ is sent again as one REQ per shape, so ``#q`` is
    asked once more, alone, live and historic, then paused: not asked again through a
    consolidation (a relay of 8 subscriptions and new roots one after another) and a quick
    reconnect; everything packed beside it completes, and live coverage still works."""
    refused = []

    def refuse_q(relay, conn, message):
        if message[0] == "REQ" and any(_asks_q(flt) for flt in message[2:]):
            refused.append(message)
            return [["CLOSED", message[1], "blocked: we do not serve that here"]]
        return None

    own = relay_factory()
    remote = scripted(on_message=refuse_q, page_size=500,
                      nip11={"limitation": {"max_subscriptions": 8}})
    repo = our_announcement(own, [remote], d="no-quotes")
    bugs = [f.issue(bob, repo, subject=f"bug {i}") for i in range(3)]
    replies = [f.comment(alice, bug, content="seen it") for bug in bugs]
    state = f.state(alice, "no-quotes")
    remote.add(repo, state, *bugs, *replies)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"batch_window_ms": "100", "base_backoff_secs": "0.2",
                                                        "negentropy": "false"}})
    assert_arrives(own, [state, *bugs, *replies], timeout=30, what="everything but the #q coverage")
    news = []
    while not events_named(gsync, "consolidated", remote.url) and len(news) < 20:
        news.append(f.issue(bob, repo, subject=f"new {len(news)}", created_at=int(time.time())))
        publish(own.url, news[-1:])
        time.sleep(0.1)
    assert events_named(gsync, "consolidated", remote.url), "no consolidation"
    remote.drop_all()
    wait_until(lambda: [e["fresh_start"] for e in events_named(gsync, "relay_connected", remote.url)]
               == [True, False], timeout=20, what="a quick reconnect")
    late = f.comment(alice, news[-1], content="after the reconnect", created_at=int(time.time()))
    remote.broadcast(late)
    assert_arrives(own, [late], timeout=20, what="live coverage after all that")
    live = [m for m in refused if all(isinstance(flt, dict) and flt.get("limit") == 0 for flt in m[2:])]
    historic = [m for m in refused if m not in live]
    print(f"#q asked live {len(live)}, historic {len(historic)}")
    assert 1 <= len(live) <= 2, [m[2:] for m in live]
    assert 1 <= len(historic) <= 2, [m[2:] for m in historic]
    assert {e["coverage"] for e in events_named(gsync, "coverage_paused")} == {"#q"}


class Sloppy:
    """A relay that reads every rule loosely: each REQ's EOSE comes twice, followed by a
    CLOSED for a subscription it never had; our CLOSE is answered with CLOSED and then the
    subscription's events again (``replays`` times each)."""

    def __init__(self, replays: int):
        self.replays = replays
        self.late = 0
        self.n = 0

    def __call__(self, relay, conn, message):
        if message[0] == "REQ":
            relay._on_req(conn, message)
            self.n += 1
            return [["EOSE", message[1]], ["CLOSED", f"never-had-{self.n}", "error: shutting down"]]
        if message[0] == "CLOSE" and len(message) > 1 and message[1] in conn.subs:
            filters = conn.subs.pop(message[1])
            late = [["EVENT", message[1], raw] for raw in relay.answer(filters)] * self.replays
            self.late += len(late)
            return [["CLOSED", message[1], ""], *late]
        return None


def test_a_relay_that_reads_the_rules_loosely_is_synced_without_a_hang_up(relay_factory, gsync_factory,
                                                                          scripted):
    """EOSE twice, CLOSED for a subscription never had, events after its CLOSED for a
    subscription closed (more than the misbehaviour budget), and a NIP-11 document with
    strings for numbers: what is harmless is accepted (the late events match what was
    asked; "77" missing from ``["1", "11", "42"]`` means no NEG-OPEN and no 15 s wait), the
    rest dropped and counted; the relay is synced and never hung up on."""
    own = relay_factory()
    sloppy = Sloppy(replays=40)
    remote = scripted(on_message=sloppy, negentropy="ignore", page_size=500,
                      nip11={"supported_nips": ["1", "11", "42"],
                             "limitation": {"max_limit": "500", "max_subscriptions": "20"}})
    repo = our_announcement(own, [remote], d="sloppy")
    issues = [f.issue(bob, repo, subject=f"sloppy {i}") for i in range(40)]
    remote.add(repo, *issues)
    publish(own.url, [repo, issues[0]])  # something held: NIP-77 would be tried if 77 were listed
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=30, what="the issues")
    wait_until(lambda: sloppy.late > 1_000, timeout=20, what="late events past the budget")
    wait_until(lambda: next((r for r in gsync.status()["relays"] if r["relay"] == remote.url), {})
               .get("status") == "connected", timeout=20, what="the relay synced")
    assert not remote.messages("NEG-OPEN"), "supported_nips as strings was not read"
    assert gsync.metric("gsync_relay_hangups_total") == 0
    assert len(events_named(gsync, "relay_connected", remote.url)) == 1, "one session throughout"
    assert gsync.metric("gsync_events_dropped_total", reason="unknown_subscription") >= 1


class PlainHttpOnly:
    """A loopback server speaking plain HTTP where TLS is expected: every connection gets a
    400 at once (as a web server on the wrong port does); ``accepted`` counts them."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    def close(self):
        self.sock.close()


def test_a_relay_whose_tls_fails_is_parked(relay_factory, gsync_factory):
    """``wss://`` to a server that answers in plain HTTP: the TLS handshake fails, which no
    retry in seconds fixes: parked, and dialled once (backoff 0.2 s here)."""
    own = relay_factory()
    server = PlainHttpOnly()
    url = f"wss://127.0.0.1:{server.port}"
    repo = f.announcement(alice, "tls-fails", clone=[f"http://127.0.0.1:{own.port}/{alice.pubkey}/tls-fails.git"],
                          relays=[f"ws://127.0.0.1:{own.port}", url])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [server], extra={"sync": {"base_backoff_secs": "0.2"}})
    try:
        def relay_status():
            return next((r for r in gsync.status()["relays"] if r["relay"] == url), {})

        wait_until(lambda: relay_status().get("parked") == "tls", timeout=20, what="parked for TLS")
        parked = events_named(gsync, "relay_parked", url)
        assert parked and "SSL" in parked[0]["reason"], parked
        wait_until(lambda: gsync.metric("gsync_relay_parked_seconds", relay=url) > 0, timeout=10,
                   what="parked in /metrics (a maintenance tick later: past the 0.2 s backoff)")
        assert server.accepted == 1, "dialled again within the park"
    finally:
        server.close()


def test_a_relay_whose_name_does_not_resolve_is_parked(relay_factory, gsync_factory):
    """``ws://nonexistent.invalid``: no such name (RFC 6761: gsync answers ``.invalid``
    itself, so no DNS query leaves the machine): parked, not redialled every few seconds."""
    own = relay_factory()
    url = "ws://nonexistent.invalid:7447"
    repo = f.announcement(alice, "no-dns", clone=[f"http://127.0.0.1:{own.port}/{alice.pubkey}/no-dns.git"],
                          relays=[f"ws://127.0.0.1:{own.port}", url])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [], extra={"sync": {"base_backoff_secs": "0.2"}})
    wait_until(lambda: next((r for r in gsync.status()["relays"] if r["relay"] == url), {}).get("parked") == "dns",
               timeout=20, what="parked for DNS")
    wait_until(lambda: gsync.metric("gsync_relay_parked_seconds", relay=url) > 0, timeout=10,
               what="parked in /metrics (a maintenance tick later: past the 0.2 s backoff)")
    assert gsync.metric("ngit_sync_connection_attempts_total", relay=url, result="failure") == 1


@pytest.mark.slow
def test_a_shape_refused_once_goes_alone_after_its_probe_restored_it(relay_factory, gsync_factory, scripted):
    """A relay that refused ``#q`` and then serves it again (its probe, 2 s here, passes):
    ``#q`` is restored, and every later REQ carrying it carries nothing else, so that a new
    refusal would take nothing else down; what a new root's ``#q`` finds arrives."""
    refusing = [True]

    def refuse_q_for_a_while(relay, conn, message):
        if refusing[0] and message[0] == "REQ" and any(_asks_q(flt) for flt in message[2:]):
            return [["CLOSED", message[1], "blocked: not now"]]
        return None

    own = relay_factory()
    remote = scripted(on_message=refuse_q_for_a_while, page_size=500)
    repo = our_announcement(own, [remote], d="q-again")
    bug = f.issue(bob, repo, subject="first")
    remote.add(repo, bug)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"batch_window_ms": "100", "negentropy": "false"}},
                          timers={"POLICY_PROBE_SECS": 2})
    assert_arrives(own, [bug], timeout=30, what="the issue")
    wait_until(lambda: events_named(gsync, "coverage_paused", remote.url), timeout=10, what="#q paused")
    refusing[0] = False
    wait_until(lambda: events_named(gsync, "coverage_restored", remote.url), timeout=20, what="#q restored")
    restored_at = len(remote.messages("REQ"))
    later = f.issue(bob, repo, subject="later", created_at=int(time.time()))
    quote = f.quote(alice, later, content="quoting the later issue")
    remote.add(later, quote)
    publish(own.url, [later])
    assert_arrives(own, [quote], timeout=20, what="the quote of the new issue, by #q")
    mixed = [m[2:] for m in remote.messages("REQ")[restored_at:]
             if any(_asks_q(flt) for flt in m[2:]) and not all(_asks_q(flt) for flt in m[2:])]
    assert mixed == [], f"#q went with other filters after its refusal: {mixed}"
    assert not events_named(gsync, "handler_failed")
