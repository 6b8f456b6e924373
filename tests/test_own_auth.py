"""NIP-42 on the reads of the own relay (``gsync/io/own_auth.py``): a read refused for want
of AUTH is answered with the configured key and asked once more; the live subscription's
REQs go again once the relay took our AUTH. A scripted connection plays the relay (the
socket side: tests/test_engine_policies.py)."""
import json

import pytest

from gsync import constants
from gsync.io import own_query
from gsync.io.own_auth import AuthTags, ReadAuth
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
    None: none, as nostr_relay). ``known_as``: the URL it takes in an AUTH's ``relay`` tag
    (an AUTH naming another is refused, as go-nostr's relays do)."""

    def __init__(self, challenge_at="refusal", ok=True, refuse_after_auth=False,
                 refusal="auth-required: you must auth", in_notice=False, known_as=URL):
        self.challenge_at, self.ok, self.refuse_after_auth = challenge_at, ok, refuse_after_auth
        self.known_as = known_as
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
            assert ["challenge", "c1"] in tags
            ok = self.ok if ["relay", self.known_as] in tags else False
            self.authed = ok is not False
            if ok is not None:
                self.queue.append(json.dumps(["OK", msg[1]["id"], ok, "" if ok else "restricted: no"]))
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


def read(relay, secret=KEY, auth=None):
    return own_query._one_page(relay, Filter.make(kinds=[1621]), auth=auth or ReadAuth(URL, secret))

def auth_tags_named(relay) -> list[str]:
    return [dict((t[0], t[1]) for t in m[1]["tags"])["relay"] for m in relay.sent if m[0] == "AUTH"]


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


def _live(relay, secret=KEY, tags=None):
    live = {"gsync-self": wire.req("gsync-self", [Filter.make(kinds=[1621], limit=0)]),
            "gsync-landed": wire.req("gsync-landed", [Filter.make(limit=0)])}
    for req in live.values():
        relay.send(req)
    return _LiveAuth(ReadAuth(URL, secret, tags=tags), relay, live)


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



# -- the URL an AUTH names the own relay by (``AuthTags``) ----------------------------------


def test_the_candidates_are_the_url_dialled_then_each_domain_over_wss_and_ws():
    tags = AuthTags(URL, ["relay.example.org", "own.example:7777", "Git.Example.ORG:8443"])
    assert tags.tags == (URL, "wss://relay.example.org", "ws://relay.example.org", "wss://own.example:7777",
                         "wss://git.example.org:8443", "ws://git.example.org:8443")  # the URL dialled once
    assert tags.next_tag(set()) == URL and tags.next_tag(set(tags.tags)) is None
    assert tags.next_tag({URL, "wss://relay.example.org"}) == "ws://relay.example.org"


def test_the_tag_taken_is_named_first_by_every_connection_and_said_once(capsys):
    tags = AuthTags(URL, ["relay.example.org"])
    tags.refused(URL, {URL})
    assert tags.current == "wss://relay.example.org"  # the next connection starts there
    assert tags.next_tag(set()) == "wss://relay.example.org"
    tags.refused("wss://relay.example.org", {URL, "wss://relay.example.org"})
    tags.taken("ws://relay.example.org")
    tags.taken("ws://relay.example.org")
    assert tags.next_tag(set()) == "ws://relay.example.org"
    tags.refused(URL, {URL})  # a late refusal naming what is not first any more moves nothing
    assert tags.current == "ws://relay.example.org"
    said = capsys.readouterr().out
    assert said.count("own_relay_auth_tag") == 1 and "own_relay_auth_refused" not in said


def test_an_auth_refused_naming_every_candidate_is_said_once_until_one_is_taken(capsys):
    tags = AuthTags(URL, ["relay.example.org"])
    for _ in range(2):  # two connections, each refused naming all three
        tried = set()
        while (tag := tags.next_tag(tried)) is not None:
            tried.add(tag)
            tags.refused(tag, tried)
    assert capsys.readouterr().out.count("own_relay_auth_refused") == 1


def test_a_read_refused_naming_the_url_dialled_is_answered_naming_the_domain():
    tags = AuthTags(URL, ["relay.example.org"])
    relay = Relay(known_as="ws://relay.example.org")
    assert len(read(relay, auth=ReadAuth(URL, KEY, tags=tags))) == 1
    assert relay.sent_kinds() == ["REQ", "AUTH", "AUTH", "AUTH", "REQ", "CLOSE"]
    assert auth_tags_named(relay) == [URL, "wss://relay.example.org", "ws://relay.example.org"]
    again = Relay(known_as="ws://relay.example.org")  # the next connection names it first
    assert len(read(again, auth=ReadAuth(URL, KEY, tags=tags))) == 1
    assert auth_tags_named(again) == ["ws://relay.example.org"]


def test_a_read_refused_naming_every_candidate_fails_having_named_each_once():
    relay = Relay(known_as="wss://elsewhere.example")
    with pytest.raises(ConnectionError, match="refused the history query"):
        read(relay, auth=ReadAuth(URL, KEY, tags=AuthTags(URL, ["relay.example.org"])))
    assert auth_tags_named(relay) == [URL, "wss://relay.example.org", "ws://relay.example.org"]
    assert relay.sent_kinds().count("REQ") == 1


def test_the_live_subscription_names_the_next_candidate_when_our_auth_is_refused():
    relay = Relay(known_as="wss://relay.example.org")
    live = _live(relay, tags=AuthTags(URL, ["relay.example.org"]))
    _drain(relay, live)
    assert relay.sent_kinds() == ["REQ", "REQ", "AUTH", "AUTH", "REQ", "REQ"]
    assert auth_tags_named(relay) == [URL, "wss://relay.example.org"]
    refused = Relay(known_as="wss://elsewhere.example")
    with pytest.raises(SubscriptionClosed, match="refused our AUTH"):
        _drain(refused, _live(refused, tags=AuthTags(URL, ["relay.example.org"])))
    assert len(auth_tags_named(refused)) == 3
