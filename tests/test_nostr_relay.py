"""gsync against a second real relay implementation, nostr_relay (``tests/nostr_relay_peer.py``):
a Python relay on SQLite that reads ``until`` as exclusive, clamps ``limit`` to its
``max_limit``, serves NIP-11 without NIP-77, and indexes every single-letter tag. What
LocalRelay alone cannot show: a relay of another make, as GRASP repositories list them."""
from __future__ import annotations

import time

import pytest

from gsync.protocol.event import public_key

from . import factory as f
from .nostr_relay_peer import NostrRelayProcess
from .relays import publish, wait_until
from .scenario import assert_arrives, our_announcement
from .test_engine_policies import _key_file
from .test_engine_sync import ROUTES, _route_event

alice, bob, carol = f.Author.named("alice"), f.Author.named("bob"), f.Author.named("carol")


@pytest.fixture
def nostr_relay():
    started: list[NostrRelayProcess] = []

    def start(**kw) -> NostrRelayProcess:
        relay = NostrRelayProcess(**kw)
        started.append(relay)
        return relay.start()

    try:
        yield start
    finally:
        for relay in started:
            relay.stop()


def crowded_thread(repo, comments: int, per_second: int):
    """An issue and ``comments`` replies, ``per_second`` of them in each second: a page cut
    by the relay's ``max_limit`` ends inside a second."""
    bug = f.issue(bob, repo, subject="a long discussion")
    start = f.next_created_at() + 1
    thread = [f.comment((alice, carol)[i % 2], bug, content=f"reply {i}",
                        created_at=start + i // per_second) for i in range(comments)]
    for _ in range(comments // per_second + 1):
        f.next_created_at()  # later events of this run stay later
    return [bug, *thread]


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_history_paged_past_a_limit_on_a_relay_reading_until_as_exclusive(relay_factory, gsync_factory,
                                                                          nostr_relay):
    """Pages of 50 with seven events to a second: each next page's ``until`` (its oldest
    second) read as exclusive would skip what that second still held. gsync finds out how
    the relay reads ``until`` and asks a second further on."""
    own, remote = relay_factory(), nostr_relay(max_limit=50)
    repo = our_announcement(own, [remote], d="paged")
    history = crowded_thread(repo, comments=400, per_second=7)
    publish(remote.url, [repo, *history])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, history, timeout=60, what="the whole thread, paged by 50")
    assert any(e.get("event") == "relay_until_exclusive" for e in gsync.log_events())


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_every_tag_route_and_live_events_beside_a_nip77_relay(relay_factory, gsync_factory, nostr_relay):
    """A repository on nostr_relay (REQ pages: its NIP-11 has no 77) and on a LocalRelay
    (NIP-77), each holding part of it: every tag route arrives from nostr_relay, and events
    published there after the sync arrive live."""
    own, plain, neg = relay_factory(), nostr_relay(), relay_factory()
    repo = our_announcement(own, [plain, neg], d="two-makes")
    root = f.issue(bob, repo)
    routed = [_route_event(route, repo, root) for route in ROUTES]
    elsewhere = [f.comment(alice, root, content="only on the NIP-77 relay"), f.state(alice, "two-makes")]
    publish(plain.url, [repo, root, *routed])
    publish(neg.url, [repo, root, *elsewhere])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [plain, neg])
    assert_arrives(own, [root, *routed, *elsewhere], timeout=60, what="both relays' history")
    wait_until(lambda: all(r["status"] == "connected" for r in gsync.status()["relays"]),
               timeout=60, what="both relays synced")
    late = [f.issue(carol, repo, subject="after the sync"), f.comment(alice, root, content="live")]
    publish(plain.url, late)
    assert_arrives(own, late, timeout=20, what="nostr_relay's live events")


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_reqs_refused_restricted_before_our_auth_go_again_after_it(relay_factory, gsync_factory, nostr_relay,
                                                                   tmp_path):
    """nostr_relay with NIP-42 on, gsync's key its only reader: it challenges at connect,
    and refuses each REQ it reads before our AUTH in a NOTICE ``restricted: permission
    denied`` (not ``auth-required:``) and sends no OK to the AUTH. Every REQ of the connect
    goes again after our AUTH: the history arrives, and so do the live events of both
    layers (a new announcement listing us; an issue), none paused for the day a final
    ``restricted:`` pauses them for."""
    key = _key_file(tmp_path)
    with open(key) as fh:
        reader = public_key(fh.read().strip())
    own, remote = relay_factory(), nostr_relay(readers=(reader,))
    repo = our_announcement(own, [remote], d="readers-only")
    history = [f.issue(bob, repo, subject=f"bug {i}") for i in range(5)]
    publish(remote.url, [repo, *history])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"auth": {"key_file": key}})
    assert_arrives(own, history, timeout=30, what="the history, read after our AUTH")
    wait_until(lambda: gsync.status()["relays"][0]["status"] == "connected", timeout=30,
               what="the relay synced")
    newcomer = our_announcement(own, [remote], d="announced-later", author=carol)
    late = f.issue(carol, repo, subject="after the sync")
    publish(remote.url, [newcomer, late])
    assert_arrives(own, [newcomer, late], timeout=20, what="both layers' live events")
    assert not [e for e in gsync.log_events() if e.get("event") == "coverage_paused"]


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_a_relay_holding_three_subscriptions_refusing_past_them_in_a_notice(relay_factory, gsync_factory,
                                                                            nostr_relay):
    """nostr_relay allowing three open REQs a connection, no NIP-11 limitation saying so,
    refusing past them in a NOTICE ``rejected: too many subscriptions`` naming none: eight
    repositories' history (layer 1, layers 2 and 3 live and historic want more than three)
    and their live events arrive."""
    own, remote = relay_factory(), nostr_relay(subscription_limit=3)
    repos = [our_announcement(own, [remote], d=f"narrow-{i}") for i in range(8)]
    history = []
    for repo in repos:
        for n in range(3):
            bug = f.issue(bob, repo, subject=f"bug {n}")
            history += [bug, f.comment(alice, bug, content="seen it too")]
    publish(remote.url, [*repos, *history])
    publish(own.url, repos)
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, history, timeout=60, what="eight repositories' history")
    wait_until(lambda: gsync.status()["relays"][0]["status"] == "connected", timeout=60,
               what="the relay synced")
    now = int(time.time())  # (live: a catch-up's since would not reach the factory's 2023)
    late = [carol.sign(f.KIND_ISSUE, [["a", repos[-1].address]], "after the sync", now),
            f.comment(carol, history[0], content="live", created_at=now)]
    publish(remote.url, late)
    assert_arrives(own, late, timeout=30, what="live events past three subscriptions")


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_replies_to_a_member_the_own_relay_holds_arrive_from_a_relay_without_nip77(relay_factory, gsync_factory,
                                                                                  nostr_relay):
    """A relay synced by REQ pages alone (nostr_relay: no NIP-77) reads nothing of the own
    relay for its batches; a thread member the own relay holds and that relay lacks (it was
    published to the own relay alone) is read for it all the same, and the replies to it
    that reached nostr_relay alone arrive, history and live."""
    own, remote = relay_factory(), nostr_relay()
    repo = our_announcement(own, [remote], d="members-no-nip77")
    bug = f.issue(bob, repo)
    member = f.comment(alice, bug, content="published to the own relay alone")
    reply = carol.sign(1, [["e", member.id]], "a reply that reached nostr_relay alone")
    publish(remote.url, [repo, bug, reply])
    publish(own.url, [repo, bug, member])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, [reply], timeout=30, what="the reply to a member the own relay held")
    wait_until(lambda: gsync.status()["relays"][0]["status"] == "connected", timeout=60, what="the relay synced")
    late = carol.sign(7, [["e", member.id]], "+", int(time.time()))
    publish(remote.url, [late])
    assert_arrives(own, [late], timeout=20, what="a live reaction to the member")
