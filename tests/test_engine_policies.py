"""Relays that ask for NIP-42 authentication, and an own relay that refuses events for good."""
import os
import threading
import time

import pytest

from gsync.protocol.event import generate_secret

from . import factory as f
from .relays import ids_on, publish, wait_until
from .scenario import alice, assert_arrives, our_announcement

bob = f.Author.named("bob")


def _key_file(tmp_path) -> str:
    path = os.path.join(tmp_path, "gsync.key")
    with open(path, "w") as fh:
        fh.write(generate_secret() + "\n")
    return path


@pytest.mark.slow
def test_nip42_on_the_own_relay_and_on_a_remote(relay_factory, gsync_factory, tmp_path):
    own = relay_factory(nip42="write")  # EVENT → OK false "auth-required: …" until AUTH
    remote = relay_factory(nip42="read")  # REQ → CLOSED "auth-required: …" until AUTH
    repo = our_announcement(own, [remote], d="authed")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(5)]
    publish(remote.url, [repo, *issues])  # LocalRelay's READ mode does not gate writes
    gsync_factory(own, [], bootstrap=[remote], extra={"auth": {"key_file": _key_file(tmp_path)}})
    assert_arrives(own, [repo, *issues], what="events through two NIP-42 relays")


@pytest.mark.slow
def test_an_own_relay_asking_for_auth_to_read_is_read_with_our_key(relay_factory, gsync_factory, tmp_path):
    """An own relay asking for NIP-42 AUTH to read as well as to write (LocalRelay's BOTH):
    the self-subscription, its history reads and the NIP-77 holdings reads answer it with the
    configured key. (They did not: every read was refused, gsync learnt nothing the own relay
    accepted, and synced nothing.)"""
    own = relay_factory(nip42="both")
    remote = relay_factory()
    reader = generate_secret()  # the test's own key: LocalRelay lets any authenticated key read
    repo = our_announcement(own, [remote], d="read-authed")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(5)]
    publish(remote.url, [repo, *issues])
    publish(own.url, [repo], secret=reader)  # only the own relay tells gsync of this repository
    gsync = gsync_factory(own, [remote], extra={"auth": {"key_file": _key_file(tmp_path)}})
    wanted = {e.id for e in issues}
    wait_until(lambda: ids_on(own.url, {"ids": sorted(wanted)}, secret=reader) == wanted, timeout=60,
               what="the issues, on an own relay asking for AUTH to read")

    # A repository the own relay accepts now: the live self-subscription (its REQ sent again
    # once our AUTH was taken) shows it, not the next session's history read.
    later = our_announcement(own, [remote], d="read-authed-later")
    bug = f.issue(bob, later, subject="later")
    publish(remote.url, [later, bug])
    publish(own.url, [later], secret=reader)
    wait_until(lambda: ids_on(own.url, {"ids": [bug.id]}, secret=reader) == {bug.id}, timeout=60,
               what="the later repository's issue")
    logged = [e["event"] for e in gsync.log_events()]
    assert "self_subscription_lost" not in logged and "self_history_failed" not in logged
    assert "negentropy_own_relay_unavailable" not in logged  # the holdings reads were answered


@pytest.mark.parametrize("nip42", ["both", "write"])  # (write: delivery is the first to AUTH)
def test_an_own_relay_dialled_by_another_name_than_its_own_is_authenticated_by_its_own(
        relay_factory, gsync_factory, tmp_path, nip42):
    """An own relay dialled at an address it does not know itself by (a local address; here
    ``localhost`` for LocalRelay on 127.0.0.1, which refuses an AUTH naming any other URL,
    as go-nostr's relays do naming anything but their ``ServiceURL``): its AUTH is answered
    naming the configured domain (``ws://`` after ``wss://``), for reads and for delivery.
    (It named the URL dialled, was refused, and nothing was read or delivered.)"""
    own = relay_factory(nip42=nip42)
    remote = relay_factory()
    reader = generate_secret()
    repo = our_announcement(own, [remote], d="named-by-domain")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(5)]
    publish(remote.url, [repo, *issues])
    publish(own.url, [repo], secret=reader)
    gsync = gsync_factory(own, [remote], extra={
        "auth": {"key_file": _key_file(tmp_path)},
        "service": {"own_relay": f"ws://localhost:{own.port}"},  # domain: 127.0.0.1:<port>
    })
    wanted = {e.id for e in issues}
    wait_until(lambda: ids_on(own.url, {"ids": sorted(wanted)}, secret=reader) == wanted, timeout=60,
               what="the issues, on an own relay knowing itself by its domain")
    events = gsync.log_events()
    assert [e["tag"] for e in events if e["event"] == "own_relay_auth_tag"] == [f"ws://127.0.0.1:{own.port}"]
    logged = {e["event"] for e in events}
    assert not logged & {"self_subscription_lost", "self_history_failed", "negentropy_own_relay_unavailable",
                         "own_relay_auth_refused", "event_rejected"}


@pytest.mark.slow
def test_refused_events_are_counted_remembered_and_not_fetched_again(relay_factory, gsync_factory,
                                                                       tmp_path):
    own = relay_factory(reject={"kinds": [1], "message": "no notes here"})
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="picky")
    bug = f.issue(bob, repo)
    quotes = [f.quote(bob, bug, content=f"look {i}") for i in range(3)]
    publish(remote.url, [repo, bug, *quotes])
    publish(own.url, [repo])
    state_dir = os.path.join(tmp_path, "state")
    settings = {"service": {"state_dir": state_dir}}
    first = gsync_factory(own, [remote], extra=settings)
    assert_arrives(own, [bug], what="the issue")
    wait_until(lambda: first.metric("gsync_deliveries_total", outcome="rejected") == 3, timeout=60,
               what="three refusals")
    rejected = [e for e in first.log_events() if e["event"] == "event_rejected"]
    assert {e["event_id"] for e in rejected} == {q.id for q in quotes}
    assert all("blocked: no notes here" in e["reason"] for e in rejected)
    assert not ids_on(own.url, {"kinds": [1]})
    first.terminate()  # the cold tier of the rejected index is saved in state_dir

    second = gsync_factory(own, [remote], extra=settings)
    wait_until(lambda: [r["status"] for r in second.status()["relays"]] == ["connected"],
               timeout=60, what="the second run's historic sync")
    # NIP-77 counted the refused ids as held: nothing was downloaded again.
    assert second.metric("gsync_remote_events_total", relay=remote.url) == 0
    assert second.metric("gsync_deliveries_total", outcome="rejected") == 0


@pytest.mark.slow
def test_announcement_in_purgatory_gets_state_only(relay_factory, gsync_factory, scripted):
    """A GRASP own relay holds an announcement in purgatory until its git data arrives
    (``OK true "purgatory: …"``): gsync then syncs that repository's state, nothing more."""
    remote = relay_factory()
    held: list[str] = []

    def purgatory(relay, conn, message):
        if (isinstance(message, list) and message[:1] == ["EVENT"] and isinstance(message[1], dict)
                and message[1].get("kind") == 30617):
            held.append(message[1]["id"])
            return [["OK", message[1]["id"], True, "purgatory: waiting for git data"]]
        return None  # everything else: an ordinary relay

    own = scripted(page_size=None, on_message=purgatory)
    repo = our_announcement(own, [remote], d="in-purgatory")
    state = f.state(f.Author.named("alice"), "in-purgatory")
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, state, bug])
    gsync = gsync_factory(own, [], bootstrap=[remote])  # found through layer 1 on the remote
    wait_until(lambda: repo.id in held, timeout=30, what="the announcement delivered")
    wait_until(lambda: any(e["id"] == state.id for e in own.events), timeout=30,
               what="the state event (StateOnly sync)")
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"],
               timeout=30, what="historic sync complete")
    assert not any(e["id"] == bug.id for e in own.events), "layer 2 is not synced for StateOnly"
    assert gsync.metric("gsync_deliveries_total", outcome="purgatory") >= 1


def _batches_processed(gsync) -> int:
    return sum(1 for e in gsync.log_events() if e["event"] == "self_batch_processed")


def _live_on(remote, root_id: str) -> bool:
    """Is a live (``limit: 0``) subscription open on ``remote`` for replies to ``root_id``?"""
    return any(flt.limit == 0 and root_id in (flt.tag("e") or ())
               for conn in remote.open_connections for filters in list(conn.subs.values())
               for flt in filters)


@pytest.mark.slow
def test_subscription_budget_is_kept_by_consolidating(relay_factory, gsync_factory, scripted):
    """A relay allowing 6 subscriptions (NIP-11): new roots keep adding live coverage, gsync
    consolidates instead of exceeding the budget, and live events still arrive. An event
    stored while the live subscriptions are swapped (after our CLOSE, before the new REQ)
    reaches no live subscription: the catch-up after the consolidation must fetch it."""
    peak = {"open": 0}
    lock = threading.Lock()
    in_the_gap = []

    def count_open(relay, conn, message):
        if isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 1:
            with lock:
                peak["open"] = max(peak["open"], len(set(conn.subs) | {message[1]}))
        if (isinstance(message, list) and message[:1] == ["CLOSE"] and len(message) > 1
                and str(message[1]).startswith("live-") and roots and not in_the_gap):
            gap = f.comment(f.Author.named("dave"), roots[0], content="stored during the swap",
                            created_at=int(time.time()))
            in_the_gap.append(gap)
            relay.add(gap)  # stored only: no open subscription is sent it
        return None

    own = relay_factory()
    remote = scripted(nip11={"limitation": {"max_subscriptions": 6}}, page_size=500,
                      on_message=count_open)
    repo = our_announcement(own, [remote], d="budgeted")
    remote.add(repo)
    publish(own.url, [repo])
    roots = []
    # consolidations at most every 5 s (60 in production: the next test)
    gsync = gsync_factory(own, [remote], timers={"CONSOLIDATION_MIN_SECS": 5})
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"],
               timeout=40, what="first sync")
    for round_ in range(6):  # each round: new roots on the own relay → new live coverage
        batch = [f.issue(bob, repo, subject=f"round {round_} issue {i}") for i in range(2)]
        seen = _batches_processed(gsync)
        publish(own.url, batch)
        roots += batch
        # its own self-subscription batch window: one AddFilters per round
        wait_until(lambda seen=seen: _batches_processed(gsync) > seen, timeout=10, what="the round's batch")
    wait_until(lambda: any(e["event"] == "consolidated" for e in gsync.log_events()),
               timeout=30, what="a consolidation")
    wait_until(lambda: _live_on(remote, roots[-1].id) and _live_on(remote, roots[0].id), timeout=30,
               what="live coverage of the first and last roots after consolidating")
    late = f.comment(f.Author.named("carol"), roots[-1], content="live, after consolidating")
    early = f.comment(f.Author.named("carol"), roots[0], content="live, on the first root")
    remote.broadcast(late)
    remote.broadcast(early)
    assert_arrives(own, [late, early], timeout=30, what="live comments after consolidation")
    assert 4 <= peak["open"] <= 6, peak  # the budget was used, never exceeded
    assert in_the_gap, "no live subscription was closed"
    assert_arrives(own, in_the_gap, timeout=30, what="the comment stored during the swap")


@pytest.mark.slow
def test_new_roots_faster_than_the_budget_allows_do_not_rebuild_it_each_time(relay_factory, gsync_factory,
                                                                             scripted):
    """A relay allowing 6 subscriptions (3 for live coverage), new roots every batch window:
    each would break the budget, and each consolidation closes every live REQ, opens them
    again and fetches the last 15 minutes of all of it again. So a full budget is rebuilt at
    most once a CONSOLIDATION_MIN_SECS (8 s here); meanwhile the new roots are polled, and
    their replies still arrive."""
    own = relay_factory()
    remote = scripted(nip11={"limitation": {"max_subscriptions": 6}}, page_size=500)
    repo = our_announcement(own, [remote], d="fast-roots")
    remote.add(repo)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], timers={"CONSOLIDATION_MIN_SECS": 8})
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"],
               timeout=40, what="first sync")
    roots, started = [], time.monotonic()
    for round_ in range(10):  # ten AddFilters, each new live coverage, within a few seconds
        batch = [f.issue(bob, repo, subject=f"round {round_} issue {i}") for i in range(2)]
        seen = _batches_processed(gsync)
        publish(own.url, batch)
        roots += batch
        wait_until(lambda seen=seen: _batches_processed(gsync) > seen, timeout=10, what="the round's batch")
    took = time.monotonic() - started
    replies = [f.comment(f.Author.named("carol"), root, content="a reply", created_at=int(time.time()))
               for root in roots]
    for reply in replies:
        remote.broadcast(reply)
        remote.add(reply)
    assert_arrives(own, replies, timeout=60, what="a reply to every new root")
    consolidations = sum(1 for e in gsync.log_events() if e["event"] == "consolidated")
    assert 1 <= consolidations <= 2 + took / 8, (consolidations, took)


@pytest.mark.slow
def test_quick_reconnect_catches_up_what_was_published_while_away(relay_factory, gsync_factory,
                                                                  tmp_path):
    own = relay_factory()
    remote = relay_factory(lmdb=str(tmp_path / "remote-db"))
    repo = our_announcement(own, [remote], d="comes-back")
    publish(remote.url, [repo])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"base_backoff_secs": "3"}})
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"],
               timeout=40, what="first sync")
    remote.kill()
    remote.start()  # same port and database, back before gsync's backoff has run out
    # Written now (the factory's default timestamps are from 2023, older than since).
    missed = f.issue(bob, repo, subject="published while gsync was away",
                     created_at=int(time.time()))
    publish(remote.url, [missed])
    assert_arrives(own, [missed], timeout=40, what="the catch-up after a quick reconnect")
    connects = [e for e in gsync.log_events() if e["event"] == "relay_connected"]
    assert [e["fresh_start"] for e in connects] == [True, False]


@pytest.mark.slow
def test_addfilters_waiting_for_the_pacing_gate_share_their_reqs(relay_factory, gsync_factory, scripted):
    """Roots arriving in two self-subscription batches while the relay's pacing gate holds
    the first batch's REQ: the second joins it, and one historic REQ carries both."""
    own = relay_factory()
    remote = scripted(page_size=500)
    repo = our_announcement(own, [remote], d="coalesce")
    remote.add(repo)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"background_start_interval_ms": "6000",
                                                         "negentropy": "false"}})
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"],
               timeout=60, what="first sync")
    rounds = []
    for round_ in range(3):  # the first starts at once and closes the gate for 6 s
        batch = [f.issue(bob, repo, subject=f"round {round_} issue {i}") for i in range(3)]
        seen = _batches_processed(gsync)
        publish(own.url, batch)
        rounds.append({e.id for e in batch})
        # its own self-subscription batch window: one AddFilters per round
        wait_until(lambda seen=seen: _batches_processed(gsync) > seen, timeout=10, what="the round's batch")
    late = rounds[1] | rounds[2]

    def historic_reqs_with_late_roots():
        found = []
        for _, filters in remote.reqs():
            values = {v for flt in filters if flt.get("limit") != 0 for v in flt.get("#e", [])}
            if values & late:
                found.append(values)
        return found

    wait_until(lambda: historic_reqs_with_late_roots(), timeout=30, what="a historic REQ for the later roots")
    assert any(late <= values for values in historic_reqs_with_late_roots()), \
        "the second and third batch did not share the REQ that waited for the gate"


def test_a_fresh_start_sends_layer_1_in_one_req_with_the_repositories_filters(relay_factory, gsync_factory,
                                                                             scripted):
    """A connection's first batches are built before anything starts: layer 1 (every
    announcement) and the AddFilters for the repositories the relay lists go out in one
    REQ, not one paced start for layer 1 alone and another for the rest."""
    own = relay_factory()
    remote = scripted(page_size=500)
    repo = our_announcement(own, [remote], d="one-start")
    remote.add(repo, f.issue(bob, repo))
    publish(own.url, [repo])
    gsync_factory(own, [remote], extra={"sync": {"negentropy": "false"}})
    historic = lambda: [flts for _, flts in remote.reqs() if all(x.get("limit") != 0 for x in flts)]  # noqa: E731
    wait_until(historic, timeout=30, what="a historic REQ")
    first = historic()[0]
    assert any(30617 in x.get("kinds", []) and x.keys() == {"kinds", "limit"} for x in first), first  # layer 1
    assert any(repo.address in x.get("#a", []) for x in first), f"layer 2 waited for a start of its own: {first}"


def test_a_full_page_over_many_repositories_is_split_to_fill_its_next_req(relay_factory, gsync_factory,
                                                                       scripted):
    """A relay capping each filter at 50 and 240 issues in 12 repositories: page after page
    of one `#a` filter would take five REQs; split by repository into the next REQ's free
    slots, the rest comes in one more (and at most one confirming)."""
    own = relay_factory()
    remote = scripted(page_size=50)
    repos = [our_announcement(own, [remote], d=f"split-{i}") for i in range(12)]
    issues = [f.issue(bob, repo, subject=f"issue {n}") for repo in repos for n in range(20)]
    remote.add(*repos, *issues)
    publish(own.url, repos)
    gsync_factory(own, [remote], extra={"sync": {"negentropy": "false"}})
    assert_arrives(own, issues, what="every issue")
    pages = [flts for _, flts in remote.reqs()
             if any("#a" in x and x.get("limit") != 0 and "since" not in x for x in flts)]
    assert len(pages) <= 3, f"{len(pages)} REQs for the issues: {[len(p) for p in pages]}"
    assert max(len(p) for p in pages) == 10, "no REQ was filled by splitting"


@pytest.mark.slow
def test_next_pages_and_a_later_batchs_first_pages_share_a_start(relay_factory, gsync_factory, scripted):
    """While the pacing gate holds them, the queued pages of a batch are packed filter by
    filter: the issues' next pages (`#a` with `until`) and the first pages of the replies to
    the issues found meanwhile (`#e`, a later AddFilters joining the batch) go out in one
    REQ, where REQ by REQ each would have had a start of its own."""
    own = relay_factory()
    remote = scripted(page_size=50)
    repos = [our_announcement(own, [remote], d=f"shared-{i}") for i in range(12)]
    issues = [f.issue(bob, repo, subject=f"issue {n}") for repo in repos for n in range(40)]
    replies = [f.comment(alice, issue) for issue in issues[::40]]
    remote.add(*repos, *issues, *replies)
    publish(own.url, repos)
    gsync_factory(own, [remote], extra={"sync": {"negentropy": "false",
                                                 "background_start_interval_ms": "700"}})
    assert_arrives(own, issues + replies, what="every issue and reply")

    def shared(flts):
        return (any("#a" in x and "until" in x for x in flts)
                and any("#e" in x and "until" not in x and x.get("limit") != 0 for x in flts))
    assert any(shared(flts) for _, flts in remote.reqs()), [
        [sorted(k for k in x if k.startswith("#") or k == "until") for x in flts] for _, flts in remote.reqs()]
