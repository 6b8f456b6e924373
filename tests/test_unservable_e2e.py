"""One event a relay advertises through NIP-77 and never serves (hidden on read, expired or
deleted between the exchange and the fetch), end to end: scripted NIP-77 remotes
(tests/scripted_relay.py) and a LocalRelay own relay. The relay keeps its NIP-77 (a later
repository the own relay mostly holds moves only what it lacks), the event costs it one ask
by id and one by its filter, and it comes from another relay listing its repository, asked
there by id, once. (The decisions, in one process: tests/test_unservable_decisions.py.)"""
from __future__ import annotations

import pytest

from gsync.sim.relay import filter_from_json

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, is_values_proof, our_announcement
from .scripted_relay import Nip77Serve
from .test_negentropy_fallbacks import Withholding, _remote_status

bob = f.Author.named("bob")
HELD, MISSING = 190, 10  # the later repository: 95 % already on the own relay


def asks_of(remote, event) -> tuple[int, int]:
    """(REQs asking ``event`` by id, REQs whose filters match it otherwise) ``remote`` got;
    live subscriptions (``limit: 0``) aside."""
    by_id = by_filter = 0
    for _, raw_filters in remote.reqs():
        if all(flt.get("limit") == 0 for flt in raw_filters) or any(is_values_proof(flt) for flt in raw_filters):
            continue  # (live, or the daily proof of how wide a list the relay reads: its seed by id)
        filters = [filter_from_json(flt) for flt in raw_filters]
        if any(flt.ids is not None and event.id in flt.ids for flt in filters):
            by_id += 1
        elif any(flt.matches(event) for flt in filters):
            by_filter += 1
    return by_id, by_filter


def served_by_id_only(relay, event) -> None:
    """``relay`` serves ``event`` to REQs by id, and to no filter REQ (with a NIP-77 that
    does not list it: ``Nip77Serve(unlisted=…)``): its index lags, so only an ask by id finds
    it there (or gsync's sync of that relay would have brought it first)."""
    answer = relay.answer

    def answer_by_id(filters):
        events = answer(filters)
        if all(flt.ids is not None for flt in filters):
            return events
        return [e for e in events if e["id"] != event.id]

    relay.answer = answer_by_id


@pytest.mark.slow
def test_an_event_a_relay_never_serves_leaves_it_its_nip77_and_comes_from_another_relay(
        relay_factory, gsync_factory, scripted):
    own = relay_factory()
    nip77 = Nip77Serve()
    remote = scripted(negentropy=nip77, page_size=500)
    other_nip77 = Nip77Serve()
    other = scripted(negentropy=other_nip77, page_size=500)  # lists the repository
    first = our_announcement(own, [remote, other], d="first")
    issues = [f.issue(bob, first, subject=f"first {i}") for i in range(5)]
    hidden = f.issue(bob, first, subject="advertised, never served")
    remote.add(first, *issues, hidden)
    # the other relay has the event, found there by id only
    other.add(first, *issues, hidden)
    other_nip77.unlisted.add(hidden.id)
    served_by_id_only(other, hidden)
    Withholding([hidden.id], everywhere=True).install(remote)  # by id nor by filter
    publish(own.url, [first, *issues])  # all but the hidden one: NIP-77 advertises it alone
    gsync = gsync_factory(own, [remote, other], extra={"sync": {"recovery_base_secs": "1", "base_backoff_secs": "0.5"}},
                          timers={"RECOVERY_MAX_SECS": 4, "QUICK_RECONNECT_SECS": 0})  # every reconnect a fresh start

    def unservable_noted():
        return [e for e in gsync.log_events() if e["event"] == "events_unservable"]

    wait_until(lambda: unservable_noted(), timeout=60, what="the hidden event noted unservable")
    wait_until(lambda: {_remote_status(gsync, r.url) for r in (remote, other)} == {"connected"}, timeout=60,
               what="both relays Connected (what is not there is no failure)")
    assert [(e["relay"], e["ids"]) for e in unservable_noted()] == [(remote.url, 1)]
    assert gsync.metric("gsync_events_unservable_total", relay=remote.url) == 1
    assert not [e for e in gsync.log_events() if e["event"] == "relay_ids_not_served"]

    # A later repository on that relay, 95 % held by the own relay: by NIP-77, only what
    # the own relay lacks comes (it came by REQ pages, 201 events for 10, when the hidden
    # event had cost the relay its NIP-77 for a day).
    second = our_announcement(own, [remote], d="second")
    later = [f.issue(bob, second, subject=f"second {i}") for i in range(HELD + MISSING)]
    remote.add(second, *later)
    publish(own.url, later[:HELD])
    opened_before = len(nip77.filters)
    publish(own.url, [second])
    assert_arrives(own, later, timeout=60, what="the later repository's missing issues")
    wait_until(lambda: _remote_status(gsync, remote.url) == "connected", timeout=60, what="its batch done")
    second_opens = [flt for flt in nip77.filters[opened_before:] if any(flt.matches(e) for e in later)]
    assert second_opens, "the later repository went by NIP-77"
    downloaded = sum(remote.sent_count(e.id) for e in later)
    assert downloaded <= 2 * MISSING, f"{downloaded} events came for {MISSING} missing"

    # All this while (recovery's attempts come every 1 to 4 s here), the hidden event was
    # asked once by id and once by its filter, and not again.
    assert asks_of(remote, hidden) == (1, 1)
    # Nor by a fresh start that is not the daily one (a reconnect; in one process, where its
    # NIP-77 finds the event missing again: test_unservable_decisions).
    def found_again():
        return sum(1 for flt in nip77.filters if flt.matches(hidden))

    def synced(url):
        return sum(1 for e in gsync.log_events() if e["event"] == "historic_sync_complete" and e["relay"] == url)

    exchanged, completed = found_again(), synced(remote.url)
    remote.drop_all()
    wait_until(lambda: found_again() > exchanged and synced(remote.url) > completed, timeout=60,
               what="the relay's next session synced by NIP-77")
    assert asks_of(remote, hidden) == (1, 1)
    # The other relay listing its repository gave it: asked there by id, once (one that
    # did not serve it either would have been asked no more that day).
    assert_arrives(own, [hidden], timeout=30, what="the hidden event, from the other relay")
    assert asks_of(other, hidden)[0] == 1
    assert asks_of(remote, hidden) == (1, 1)
    print(f"\nnip77 opens for the later repository: {len(second_opens)}; downloaded {downloaded} "
          f"for {MISSING} missing; hidden asked {asks_of(remote, hidden)} (id, filter) on its relay")
