"""NIP-42 on the reads of the own relay (``gsync/io/own_auth.py``): a read refused for want
of AUTH is answered with the configured key and asked once more; the live subscription's
REQs go again once the relay took our AUTH. A scripted connection plays the relay (the
socket side: tests/test_engine_policies.py)."""
import json

import pytest

from gsync import constants
from gsync.io import own_query
from gsync.io.own_auth import ReadAuth
from gsync.io.self_subscriber import SubscriptionClosed, _LiveAuth
from gsync.io.ws import Timeout
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter

from . import factory as f

URL = "ws://own.example:7777"
KEY = f.Author.named("gsync").secret
EVENT = f.Author.named("bob").sign(1621, [["subject", "x"]], created_at=1_700_000_000).to_dict()


class Relay:
    """A connection to an own relay asking for AUTH to read. ``challenge_at``: "connect"
    (before anything), "refusal" (with each refusal, as LocalRelay and khatru), "late"
    (after the refusal), or None (never). ``ok``: its answer to our AUTH (True, False,
    None: none, as nostr_relay)."""

    def __init__(self, challenge_at="refusal", ok=True, refuse_after_auth=False,
                 refusal="auth-required: you must auth", in_notice=False):
        self.challenge_at, self.ok, self.refuse_after_auth = challenge_at, ok, refuse_after_auth
        self.refusal, self.in_notice = refusal, in_notice  # nostr_relay: a NOTICE "restricted: …"
        self.sent: list = []
        self.queue: list[str] = []
        self.authed = False
        self.timeout = 30.0
        if challenge_at == "connect":
            self.queue.append(json.dumps(["AUTH", "c1"]))

    def settimeout(self, t):
        self.timeout = t

    def send(self, text):
        msg = json.loads(text)
        self.sent.append(msg)
        if msg[0] == "AUTH":
            tags = msg[1]["tags"]
            assert ["relay", URL] in tags and ["challenge", "c1"] in tags
            self.authed = self.ok is not False
            if self.ok is not None:
                self.queue.append(json.dumps(["OK", msg[1]["id"], self.ok, "" if self.ok else "restricted: no"]))
        elif msg[0] == "REQ" and (not self.authed or self.refuse_after_auth):
            if self.challenge_at == "refusal":
                self.queue.append(json.dumps(["AUTH", "c1"]))
            self.queue.append(json.dumps(["NOTICE", self.refusal] if self.in_notice
                                         else ["CLOSED", msg[1], self.refusal]))
            if self.challenge_at == "late":
                self.queue.append(json.dumps(["AUTH", "c1"]))
        elif msg[0] == "REQ":
            self.queue += [json.dumps(["EVENT", msg[1], EVENT]), json.dumps(["EOSE", msg[1]])]

    def recv(self):
        if not self.queue:
            raise Timeout("timed out")
        return self.queue.pop(0)

    def sent_kinds(self):
        return [m[0] for m in self.sent]


def read(relay, secret=KEY):
    return own_query._one_page(relay, Filter.make(kinds=[1621]), auth=ReadAuth(URL, secret))


@pytest.mark.parametrize("challenge_at", ["connect", "refusal", "late"])
def test_a_read_refused_for_want_of_auth_is_answered_and_asked_again(challenge_at):
    relay = Relay(challenge_at)
    assert [e["id"] for e in read(relay)] == [EVENT["id"]]
    assert relay.sent_kinds() == ["REQ", "AUTH", "REQ", "CLOSE"]
    assert relay.timeout == 30.0  # the wait for the OK left the read's timeout as it was


def test_a_restricted_notice_from_a_relay_that_challenged_at_connect_is_answered_as_nostr_relay_asks():
    """nostr_relay challenges at connect and says ``restricted: permission denied``, in a
    NOTICE naming nothing, to each REQ read before the AUTH; it sends no OK to the AUTH."""
    relay = Relay("connect", ok=None, refusal="restricted: permission denied", in_notice=True)
    assert len(read(relay)) == 1
    assert relay.sent_kinds() == ["REQ", "AUTH", "REQ", "CLOSE"]


def test_restricted_from_a_relay_that_never_challenged_is_a_refusal_not_a_want_of_auth():
    relay = Relay(None, refusal="restricted: not for you")
    with pytest.raises(ConnectionError, match="not for you"):
        read(relay)
    assert relay.sent_kinds() == ["REQ"]


def test_an_own_relay_sending_no_ok_to_our_auth_is_taken_at_its_word():
    relay = Relay(ok=None)
    assert len(read(relay)) == 1
    assert relay.sent_kinds() == ["REQ", "AUTH", "REQ", "CLOSE"]


@pytest.mark.parametrize("relay, secret, says", [
    (Relay(), None, "no [auth] key_file"),  # no key: the operator is told what is missing
    (Relay(ok=False), KEY, "you must auth"),  # our AUTH refused
    (Relay(refuse_after_auth=True), KEY, "you must auth"),  # refused again: once only
    (Relay(challenge_at=None), KEY, "you must auth"),  # nothing to answer
])
def test_a_read_refused_for_want_of_auth_fails_when_it_cannot_be_answered(relay, secret, says):
    with pytest.raises(ConnectionError, match="refused the history query") as failed:
        read(relay, secret)
    assert says in str(failed.value)
    assert relay.sent_kinds().count("REQ") <= 2 and relay.sent_kinds().count("AUTH") <= 1


def test_a_connection_answers_its_challenge_once():
    relay, auth = Relay(), ReadAuth(URL, KEY)
    own_query._one_page(relay, Filter.make(kinds=[1621]), auth=auth)
    assert not auth.can_answer(relay)  # answered: a later refusal on it is final
    assert auth.can_answer(Relay("connect")) is False  # (no challenge seen there yet)


def _live(relay, secret=KEY):
    live = {"gsync-self": wire.req("gsync-self", [Filter.make(kinds=[1621], limit=0)]),
            "gsync-landed": wire.req("gsync-landed", [Filter.make(limit=0)])}
    for req in live.values():
        relay.send(req)
    return _LiveAuth(ReadAuth(URL, secret), relay, live)


def _drain(relay, live):
    """What the live read does with each frame: hand it to ``_LiveAuth``; a timeout asks it."""
    handled = []
    for _ in range(20):
        try:
            msg = wire.parse_relay_message(relay.recv())
        except Timeout:
            if not live.settled():
                return handled
            continue
        handled.append((type(msg).__name__, live.handled(msg)))
    return handled


def test_the_live_subscriptions_reqs_go_again_once_our_auth_is_taken():
    relay = Relay()
    live = _live(relay)
    _drain(relay, live)
    assert relay.sent_kinds() == ["REQ", "REQ", "AUTH", "REQ", "REQ"]  # one AUTH for both refusals
    assert {m[1] for m in relay.sent[3:]} == {"gsync-self", "gsync-landed"}
    assert relay.timeout == constants.OWN_IDLE_PING_SECS  # back to the idle ping's


@pytest.mark.parametrize("relay", [
    Relay(ok=None),  # auth-required:, and no OK to our AUTH (nostr_relay sends none)
    # nostr_relay: a challenge at connect, ``restricted:`` in a NOTICE naming nothing to each
    # REQ read before the AUTH
    Relay("connect", ok=None, refusal="restricted: permission denied", in_notice=True),
])
def test_the_live_subscription_sends_again_after_a_silent_auth(monkeypatch, relay):
    clock = [100.0]
    monkeypatch.setattr("gsync.io.self_subscriber.time.monotonic", lambda: clock[0])
    live = _live(relay)
    for _ in range(4):
        try:
            live.handled(wire.parse_relay_message(relay.recv()))
        except Timeout:
            break
    assert relay.sent_kinds() == ["REQ", "REQ", "AUTH"]
    assert live.settled() and relay.sent_kinds() == ["REQ", "REQ", "AUTH"]  # waits its time
    assert relay.timeout == constants.AUTH_SETTLE_SECS
    clock[0] += constants.AUTH_SETTLE_SECS
    assert live.settled()
    assert relay.sent_kinds() == ["REQ", "REQ", "AUTH", "REQ", "REQ"]
    assert not live.settled()  # done: a later silence is the relay's


@pytest.mark.parametrize("relay, secret, says", [
    (Relay(), None, "no \\[auth\\] key_file"),
    (Relay(ok=False), KEY, "refused our AUTH"),
    (Relay(refuse_after_auth=True), KEY, "you must auth"),
])
def test_the_live_subscription_closes_when_auth_cannot_help(relay, secret, says):
    live = _live(relay, secret)
    with pytest.raises(SubscriptionClosed, match=says):
        _drain(relay, live)


def test_a_live_refusal_without_a_challenge_closes_the_subscription_after_the_wait(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("gsync.io.self_subscriber.time.monotonic", lambda: clock[0])
    relay = Relay(challenge_at=None)
    live = _live(relay)
    live.handled(wire.parse_relay_message(relay.recv()))
    assert live.settled()  # waiting for a challenge
    clock[0] += constants.AUTH_SETTLE_SECS
    with pytest.raises(SubscriptionClosed, match="no challenge"):
        live.settled()

