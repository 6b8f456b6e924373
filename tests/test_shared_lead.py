"""Repositories several relays list, on a first sync: the first relay's batch leads by REQ
pages, the others wait for it while that pays, then spend a NEG-OPEN where the leader brought
enough of a filter (``gsync.sync.lead``, ``gsync.sync.method``). Against scripted relays serving NIP-77 over their stores, so that the
test sees every NEG-OPEN and REQ on the wire."""
from __future__ import annotations

import threading
import time

import pytest

from . import factory as f
from .gsync_proc import PRODUCTION_PRICES
from .relays import publish, wait_until
from .scenario import assert_arrives, our_announcement
from .scripted_relay import Nip77Serve

alice, bob = f.Author.named("alice"), f.Author.named("bob")


def _synced(gsync) -> bool:
    relays = gsync.status()["relays"]
    return bool(relays) and all(r["status"] == "connected" for r in relays)


def _shared_world(own, relays, issues=25, only_second=2, repos=8):
    """``repos`` repositories listing ``relays`` (enough that a follower's wait pays:
    ``sync.method.follower_wait``): ``issues`` issues with a comment each on every relay, and
    ``only_second`` more issues on the second relay alone, in each."""
    anns, history, extra = [], [], []
    for r in range(repos):
        repo = our_announcement(own, relays, d=f"shared{r}")
        anns.append(repo)
        for i in range(issues):
            bug = f.issue(bob, repo, subject=f"shared {r}.{i}")
            history += [bug, f.comment(alice, bug, content=f"on {r}.{i}")]
        extra += [f.issue(bob, repo, subject=f"only on the second {r}.{i}") for i in range(only_second)]
    return anns, history, extra


def test_a_follower_fetches_only_what_its_leader_did_not_bring(relay_factory, gsync_factory, scripted):
    """The own relay holds only the announcements. One relay leads by REQ pages; the other
    waits, then takes NIP-77 where the leader brought more than its starts are worth (here,
    the repositories' filters: 400 issues, 400 comments): few events come from both relays,
    and what only the second relay holds arrives from it."""
    own = relay_factory()
    neg = [Nip77Serve(), Nip77Serve()]
    relays = [scripted(negentropy=n, page_size=500) for n in neg]
    anns, history, extra = _shared_world(own, relays, issues=50)  # NIP-77 pays for every filter
    for relay in relays:
        relay.add(*anns, *history)
    relays[1].add(*extra)
    publish(own.url, anns)
    # A second of the operator's wait priced at a quarter of production's: the follower's
    # wait is bounded by what it saves (about 7 s here at production's price), and under the
    # suite's ten workers the leader's 800 events once took longer than that to land, so the
    # follower went by itself (400 of 800 from both). What this test watches is what a
    # follower fetches after its wait; how long it waits has its own test below.
    gsync = gsync_factory(own, relays, timers={**PRODUCTION_PRICES, "WAIT_BYTES_PER_SEC": 20_000})
    assert_arrives(own, history + extra, timeout=30, what="the whole history, from both relays")
    wait_until(lambda: _synced(gsync), timeout=30, what="both relays synced")
    waited = [e for e in gsync.log_events() if e["event"] == "historic_waits_for_lead"]
    assert waited, "no batch waited for the other relay's lead"
    twice = [e for e in history if relays[0].sent_count(e.id) and relays[1].sent_count(e.id)]
    # a small later batch (a few roots' threads) may go by pages: a copy of a few events
    # costs less than its exchanges (``sync.method``)
    assert len(twice) <= len(history) // 10, f"{len(twice)} of {len(history)} events came from both relays"


def test_a_follower_waits_for_a_stalled_leader_only_so_long(relay_factory, gsync_factory, scripted):
    """The leader's first history REQ is never answered. Its follower does not wait for it
    for ever: once its wait is worth no more than the pages it saves (well before the
    FOLLOWER_WAIT_MAX_SECS cap), it goes by itself and brings the history."""
    own = relay_factory()
    hung = threading.Event()  # the first layer-2 REQ of either relay: the leader's

    def hang_first_history_req(relay, conn, message):
        if (isinstance(message, list) and message[:1] == ["REQ"] and not hung.is_set()
                and any("#a" in flt and flt.get("limit") != 0 for flt in message[2:])):
            hung.set()
            return []  # no events, no EOSE
        return None

    relays = [scripted(negentropy=Nip77Serve(), page_size=500, on_message=hang_first_history_req)
              for _ in range(2)]
    anns, history, extra = _shared_world(own, relays, only_second=0)
    for relay in relays:
        relay.add(*anns, *history)
    publish(own.url, anns)
    gsync = gsync_factory(own, relays, timers={**PRODUCTION_PRICES, "FOLLOWER_WAIT_MAX_SECS": 30, "MAINTENANCE_TICK_SECS": 0.2})
    began = time.monotonic()
    assert_arrives(own, history, timeout=30, what="the history, from the follower")
    assert time.monotonic() - began < 20, "the follower waited out the cap"
    assert hung.is_set()
    late = [e for e in gsync.log_events() if e["event"] == "historic_lead_waited_too_long"]
    assert late, "the follower went before its wait was over: the test did not test the wait"


@pytest.mark.slow
def test_a_follower_goes_when_the_leaders_pages_for_its_items_are_done(
        relay_factory, gsync_factory, scripted):
    """The leader's batch takes in its next AddFilters (the roots its issues brought) and
    goes on, their REQ answered only 6 s later. Its follower needs none of that: it goes
    once no open page of the leader asks for its repository, not when the batch ends."""

    own = relay_factory()
    held = {"confirm": None, "roots": None}  # when each held answer went out
    lock = threading.Lock()

    def hold(relay, conn, message):
        if not (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 2):
            return None
        filters = message[2:]
        if any(flt.get("limit") == 0 or "since" in flt for flt in filters):
            return None
        with lock:
            if any("#a" in flt and "until" in flt for flt in filters) and "confirm" not in held["taken"]:
                which, secs = "confirm", 1.5  # the leader's page confirming its repository
            elif any("#e" in flt for flt in filters) and "roots" not in held["taken"]:
                which, secs = "roots", 6.0  # the roots it took in after
            else:
                return None
            held["taken"].add(which)

        def answer():
            time.sleep(secs)
            from gsync.sim.relay import filter_from_json
            for raw in relay.answer([filter_from_json(flt) for flt in filters]):
                conn.send("EVENT", message[1], raw)
            held[which] = time.monotonic()
            conn.send("EOSE", message[1])
        threading.Thread(target=answer, daemon=True).start()
        return []

    held["taken"] = set()
    relays = [scripted(negentropy=Nip77Serve(), page_size=500, on_message=hold) for _ in range(2)]
    anns, history, _ = _shared_world(own, relays, only_second=0)
    for relay in relays:
        relay.add(*anns, *history)
    publish(own.url, anns)
    gsync = gsync_factory(own, relays, timers={**PRODUCTION_PRICES, "FOLLOWER_WAIT_MAX_SECS": 30})
    assert_arrives(own, history, timeout=30, what="the history")
    wait_until(lambda: held["roots"] is not None, timeout=30, what="the held roots answered")
    assert held["confirm"] is not None, "no confirming page was held: the test did not test"
    waited = {e["relay"]: e for e in gsync.log_events() if e["event"] == "historic_waits_for_lead"}
    assert waited, "no batch waited for the other relay's lead"
    follower = next(r for r in relays if r.url in waited)
    asked = [t for t, _, m in follower.received_with_times()
             if isinstance(m, list) and m[:1] in (["REQ"], ["NEG-OPEN"])
             and any("#a" in flt and flt.get("limit") != 0 for flt in m[2:] if isinstance(flt, dict))]
    assert asked, "the follower never asked for its repository"
    assert asked[0] < held["roots"], "the follower waited for the leader's whole batch"
