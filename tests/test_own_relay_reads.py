"""The own relay is read once per filter and session (``sync.own_held``): it is the
operator's production relay, and NIP-77 needs its holdings for every filter on every remote.

A remote that comes later asks for filters another remote's sync already read: known, not
read again. After an own-relay outage nothing known is trusted (a relay in memory comes
back empty): the next exchange reads again. Which events the own relay refused is kept
apart (the rejected index), never as held: delivery reports as held only what it answered
``OK true`` to, ``purgatory:`` excluded.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gsync.io.delivery import OwnRelayDelivery, _Lane
from gsync.io.inbox import OwnHeldConfirmed
from gsync.io.negentropy_sync import give_way
from gsync.protocol import messages as wire

from . import factory as f
from .relays import free_port, publish, wait_until
from .scenario import assert_arrives, our_announcement
from .scripted_relay import Nip77Serve

alice, bob = f.Author.named("alice"), f.Author.named("bob")


def _later(port):
    """A relay the announcement lists before it listens (started later by the test)."""
    return SimpleNamespace(url=f"ws://127.0.0.1:{port}", port=port)


def _first_holdings(gsync, url):
    """known/read of the first holdings answer of ``url``'s session (layer 1 and AddFilters)."""
    lines = [e for e in gsync.log_events() if e["event"] == "own_holdings" and e["relay"] == url]
    return lines[0] if lines else None


@pytest.mark.slow
def test_filters_read_once_are_known_to_later_remotes_until_an_own_relay_outage(
        relay_factory, gsync_factory, scripted):
    own = relay_factory()
    first = scripted(negentropy=Nip77Serve(), page_size=500)
    late, after_outage = _later(free_port()), _later(free_port())
    repo = our_announcement(own, [first, late, after_outage], d="read-once")
    issues = [f.issue(bob, repo, subject=f"read once {i}") for i in range(12)]
    first.add(repo, *issues[:10])
    publish(own.url, [repo, issues[0]])  # held: NIP-77 on every remote
    gsync = gsync_factory(own, [first, late, after_outage],
                          extra={"sync": {"base_backoff_secs": "0.5", "max_backoff_secs": "1"}})
    assert_arrives(own, issues[:10], timeout=30, what="the first remote's issues")

    later = scripted(negentropy=Nip77Serve(), page_size=500, port=late.port)
    later.add(repo, *issues[:11])
    assert_arrives(own, issues[:11], timeout=30, what="the later remote's issue")
    seen = wait_until(lambda: _first_holdings(gsync, late.url), timeout=10, what="its holdings")
    assert seen["known"] >= 1 and seen["read"] == 0, f"the later remote read the own relay again: {seen}"

    own.restart()  # in memory: it comes back empty
    wait_until(lambda: any(e["event"] == "own_relay_up" for e in gsync.log_events()),
               timeout=30, what="the own relay back")
    publish(own.url, [repo, issues[0]])  # the operator restores what it hosts
    last = scripted(negentropy=Nip77Serve(), page_size=500, port=after_outage.port)
    last.add(repo, *issues)
    assert_arrives(own, issues[11:], timeout=60, what="the issue only the last remote holds")
    wait_until(lambda: _first_holdings(gsync, after_outage.url), timeout=10, what="its holdings")
    # (the own relay came back without what it stored: every relay connected starts fresh,
    # ``sync.own_witness``, and the first of them to ask reads it again)
    events = gsync.log_events()
    back = max(i for i, e in enumerate(events) if e["event"] == "own_relay_up")
    seen = next(e for e in events[back:] if e["event"] == "own_holdings")
    assert seen["read"] >= 1, f"after the outage, what was known was trusted: {seen}"


def test_the_thread_of_a_root_gsync_stored_is_known_without_a_read(gsync_factory, scripted):
    """A root the own relay stored anew from gsync had no thread there but what gsync
    delivers after it: the root's own batch (its replies by #e, #E and #q) reads nothing of
    the own relay. A root the own relay held already is read."""
    own = scripted(page_size=None)  # stores what it is sent; its REQs are on the record
    remote = scripted(negentropy=Nip77Serve(), page_size=500)
    repo = our_announcement(own, [remote], d="new-root")
    fresh, old = f.issue(bob, repo, subject="new root"), f.issue(bob, repo, subject="held root")
    replies = [f.comment(alice, root, content=f"on {root.id[:8]}") for root in (fresh, old)]
    remote.add(repo, fresh, old, *replies)
    own.add(repo, old)
    gsync_factory(own, [remote])
    assert_arrives(own, [fresh, *replies], timeout=30, what="the new root and both threads")

    def read_for(root) -> list:
        return [flt for sub, filters in own.reqs() if sub.startswith("own-") for flt in filters
                if any(root.id in flt.get(f"#{tag}", ()) for tag in ("e", "E", "q"))]

    assert read_for(fresh) == [], "the new root's thread was read from the own relay"
    assert read_for(old), "the thread of a root the own relay held already was not read"


def test_delivery_reports_as_held_only_what_the_own_relay_stored():
    posted = []
    delivery = OwnRelayDelivery("ws://127.0.0.1:1", posted.append)
    lane = _Lane(0)
    stored, duplicate, held_back, refused = (f.issue(bob, f.repo_addr(alice, "d"), subject=s)
                                            for s in ("stored", "duplicate", "purgatory", "refused"))
    answers = [(stored, True, ""), (duplicate, True, "duplicate: have it"),
               (held_back, True, "purgatory: waiting for git data"), (refused, False, "blocked: no")]
    for event, accepted, text in answers:
        delivery.submit(event)
        lane.in_flight[event.id] = (event, 0.0)
        delivery._on_ok(lane, wire.parse_relay_message(f'["OK","{event.id}",{str(accepted).lower()},"{text}"]'))
    delivery._count_delivered()
    confirmed = [e for msg in posted if isinstance(msg, OwnHeldConfirmed) for e in msg.entries]
    assert sorted(event_id for event_id, _ in confirmed) == sorted([stored.id, duplicate.id])


def test_reads_give_way_while_the_own_relay_is_slow_to_answer_deliveries():
    now = [0.0]
    answers = iter([True, True, True, False])
    waited = give_way(lambda: next(answers), sleep=lambda s: now.__setitem__(0, now[0] + s),
                      clock=lambda: now[0], step=0.1, most=10.0)
    assert waited == pytest.approx(0.3)
    forever = give_way(lambda: True, sleep=lambda s: now.__setitem__(0, now[0] + s),
                       clock=lambda: now[0], step=0.5, most=2.0)
    assert 2.0 <= forever <= 2.5 + 1e-9, "a relay slow for good is still read"
    assert give_way(None) == 0.0


def test_how_long_the_oldest_delivery_has_waited_for_its_answer():
    clock = [100.0]
    delivery = OwnRelayDelivery("ws://127.0.0.1:1", lambda msg: None, clock=lambda: clock[0])
    assert delivery.oldest_answer_wait() == 0.0
    old, new = (f.issue(bob, f.repo_addr(alice, "d"), subject=s) for s in ("old", "new"))
    delivery._lanes[0].in_flight[old.id] = (old, 97.0)
    delivery._lanes[0].in_flight[new.id] = (new, 99.5)
    assert delivery.oldest_answer_wait() == pytest.approx(3.0)


def test_an_event_the_own_relay_refused_is_not_held_when_another_relay_has_it_later(
        relay_factory, gsync_factory, tmp_path):
    """A status names two repositories: ours (its remote brings it, the own relay refuses it
    for now) and one the own relay accepts only later. That acceptance releases the refusal
    (``sync.rejected``); the refused event's first relay is gone by then, so only the new
    repository's relay can bring it, and that relay's first sync of the new repository asks
    the session's held index what the own relay has of it: a refusal counted as held would
    be claimed in its NIP-77 have-set and never fetched."""
    refused_ids = tmp_path / "refused-ids"
    own = relay_factory(reject={"ids_file": str(refused_ids), "message": "not now"})
    first, later = relay_factory(), relay_factory()
    repo = our_announcement(own, [first], d="refused-first")
    other = our_announcement(own, [later], d="accepted-later")
    bug = f.issue(bob, repo)  # on no relay: only the status's reference
    status = f.status(alice, bug, extra_tags=[["a", other.address]])
    refused_ids.write_text(status.id + "\n")
    publish(first.url, [repo, status])
    publish(later.url, [other, status])
    publish(own.url, [repo])
    # released refusals are fetched again from where they came (the hot tier is over at once)
    gsync = gsync_factory(own, [first, later], timers={"REJECTED_HOT_SECS": 0})

    def logged(event: str, **fields) -> bool:
        return any(e["event"] == event and all(e.get(k) == v for k, v in fields.items())
                   for e in gsync.log_events())

    wait_until(lambda: logged("event_rejected", event_id=status.id), timeout=30, what="the refusal")
    refused_ids.write_text("")  # the own relay would take it now
    first.kill()
    wait_until(lambda: logged("relay_disconnected", relay=first.url), timeout=30, what="the first relay gone")
    publish(own.url, [other])  # accepted: the refusal is released, the later relay synced
    assert_arrives(own, [status], timeout=20, what="the released status, from the later relay")
    assert logged("refused_released", refetched=1)
