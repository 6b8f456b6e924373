"""A NIP-77 exchange on a NIP-42 relay whose NEG-OPEN the relay read before our AUTH.

nostr-sdk's LocalRelay (``nip42="read"``) challenges when it refuses a read, not at connect,
and refuses a NEG-OPEN that comes before AUTH with ``AUTH`` + ``["NEG-ERR", sub,
"auth-required: you must auth"]``. gsync's live REQs go first and bring the challenge, so its
NEG-OPEN, a fraction of a second later, normally comes after its AUTH; on a loaded machine the
relay may read it first. The scripted relay here makes that order certain: it holds its
refusals of the REQs until it has read the NEG-OPEN, then challenges and refuses them all,
the NEG-OPEN the ways a relay can (NEG-ERR, CLOSED naming it, a NOTICE, silence). After
AUTH it serves REQs and NIP-77 from its store.
"""
from __future__ import annotations

import pytest

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, bob, our_announcement
from .scripted_relay import Nip77Serve
from .test_engine_policies import _key_file
from .test_engine_public_relays import status_of

REFUSED = "auth-required: you must auth"
LAYER1_KINDS = [10317, 30617]


class ReadsAfterAuth:
    """``on_message`` for a scripted relay: reads refused until AUTH (any AUTH is accepted),
    each refusal with a new challenge; the REQs' refusals held until the first NEG-OPEN is
    read. ``how`` the NEG-OPEN is refused: ``NEG-ERR``, ``CLOSED``, ``NOTICE`` or
    ``silence``."""

    def __init__(self, how: str):
        self.how = how
        self.serve = Nip77Serve()
        self.challenges = 0

    def challenge(self) -> list:
        self.challenges += 1
        return ["AUTH", f"challenge-{self.challenges}"]

    def __call__(self, relay, conn, message):
        if not isinstance(message, list) or not message:
            return None
        kind = message[0]
        if kind == "AUTH":
            conn.authed = True
            return [["OK", message[1].get("id", ""), True, ""]]
        if getattr(conn, "authed", False):
            return self.serve(relay, conn, message) if kind.startswith("NEG-") else None
        held = conn.__dict__.setdefault("held", [])
        if kind == "REQ" and not getattr(conn, "neg_read", False):
            held.append(["CLOSED", message[1], REFUSED])  # answered once the NEG-OPEN is read
            return []
        if kind == "REQ":
            return [self.challenge(), ["CLOSED", message[1], REFUSED]]
        if kind != "NEG-OPEN":
            return []
        conn.neg_read = True
        frames = [self.challenge(), *held]
        held.clear()
        sub = message[1]
        frames += {"NEG-ERR": [["NEG-ERR", sub, REFUSED]], "CLOSED": [["CLOSED", sub, REFUSED]],
                   "NOTICE": [["NOTICE", REFUSED]], "silence": []}[self.how]
        return frames


def sync_from(how, relay_factory, gsync_factory, scripted, tmp_path, keyed=True):
    own = relay_factory()
    remote = scripted(page_size=500, on_message=ReadsAfterAuth(how))
    repo = our_announcement(own, [remote], d=f"authed-{how.lower()}")
    bugs = [f.issue(bob, repo, subject=f"bug {i}") for i in range(3)]
    remote.add(repo, *bugs)
    publish(own.url, [repo])  # held: layer 1 goes by NIP-77, the repository by REQ pages
    extra = {"auth": {"key_file": _key_file(tmp_path)}} if keyed else {}
    return own, remote, bugs, gsync_factory(own, [remote], extra=extra)


def neg_opens(remote) -> list[tuple[float, list]]:
    return [(t, m) for t, _, m in remote.received_with_times() if m[0] == "NEG-OPEN"]


def remote_times(remote, verb: str) -> list[float]:
    return [t for t, _, m in remote.received_with_times() if m[0] == verb]


def layer1_reqs(remote) -> list[tuple[float, list]]:
    """Historic REQs for layer 1 (the NIP-77 filter's fallback): not the live ``limit: 0``."""
    return [(t, m) for t, _, m in remote.received_with_times()
            if m[0] == "REQ" and any(flt.get("kinds") == LAYER1_KINDS and flt.get("limit") != 0
                                     for flt in m[2:])]


@pytest.mark.parametrize("how", ["NEG-ERR", "CLOSED", "NOTICE"])
def test_a_neg_open_read_before_our_auth_is_sent_again_after_it_and_nip77_stays_on(
        how, relay_factory, gsync_factory, scripted, tmp_path):
    """Refused ``auth-required:`` (NEG-ERR, as LocalRelay does, CLOSED naming it, or a NOTICE
    naming nothing): the NEG-OPEN goes again after our AUTH, as a refused REQ does, and the
    exchange concludes. Before, NEG-ERR and the NOTICE turned NIP-77 off for the session
    (layer 1 by REQ pages), and CLOSED was dropped as about no subscription: the exchange
    waited out its 15 s deadline, and NIP-77 was off for a day."""
    own, remote, bugs, gsync = sync_from(how, relay_factory, gsync_factory, scripted, tmp_path)
    assert_arrives(own, bugs, timeout=20, what="history")
    wait_until(lambda: status_of(gsync, remote.url).get("status") == "connected", timeout=10,
               what="historic sync complete well before an exchange's 15 s deadline")
    opens = [m for _, m in neg_opens(remote)]
    assert len(opens) == 2 and opens[0] == opens[1]  # the same NEG-OPEN, sent again once
    order = [m[0] for m in remote.messages() if m[0] in ("AUTH", "NEG-OPEN")]
    assert order[:3] == ["NEG-OPEN", "AUTH", "NEG-OPEN"]  # again after our AUTH, not before
    assert layer1_reqs(remote) == []  # NIP-77 moved layer 1: no REQ pages for it


@pytest.mark.parametrize("how", ["NEG-ERR", "CLOSED", "NOTICE"])
def test_without_a_key_a_neg_open_refused_for_auth_ends_its_exchange_at_once(
        how, relay_factory, gsync_factory, scripted, tmp_path):
    """No key: nothing to authenticate with, so the refusal is the exchange's, at once: it
    ends (its NEG-CLOSE) and is not sent again. (Its filter's REQ is a policy refusal then,
    as every read of this relay is.) CLOSED naming the exchange used to be dropped as about
    no subscription, and the exchange waited out its 15 s deadline."""
    _own, remote, _bugs, _gsync = sync_from(how, relay_factory, gsync_factory, scripted, tmp_path,
                                            keyed=False)
    closed = wait_until(lambda: remote_times(remote, "NEG-CLOSE"), timeout=20, what="the exchange's end")
    (opened_at, _), = neg_opens(remote)  # once: not sent again
    assert closed[0] - opened_at < 5  # not the exchange's 15 s deadline
    assert remote.messages("AUTH") == []


@pytest.mark.slow
def test_a_neg_open_the_relay_never_answers_ends_at_the_exchange_deadline_in_req_pages(
        relay_factory, gsync_factory, scripted, tmp_path):
    """Silence (a relay that drops reads before AUTH): nothing tells the exchange, which
    ends at its own deadline (NEGENTROPY_DEADLINE_SECS) — a result, never a batch left
    pending — and layer 1 goes by REQ pages. (Sending NEG-OPENs again on our AUTH's OK
    would give a relay that is only slow two answers to one exchange.)"""
    from gsync.constants import NEGENTROPY_DEADLINE_SECS

    own, remote, bugs, gsync = sync_from("silence", relay_factory, gsync_factory, scripted, tmp_path)
    assert_arrives(own, bugs, timeout=20, what="history")
    wait_until(lambda: status_of(gsync, remote.url).get("status") == "connected",
               timeout=NEGENTROPY_DEADLINE_SECS + 20, what="historic sync complete")
    (opened_at, _), = neg_opens(remote)
    waited = layer1_reqs(remote)[0][0] - opened_at
    assert NEGENTROPY_DEADLINE_SECS - 1 < waited < NEGENTROPY_DEADLINE_SECS + 10
