"""NIP-77 historic sync against relays that advertise more than they serve, or never answer.

The remotes are scripted relays (tests/scripted_relay.py) that speak real NIP-77 with gsync's
own negentropy server over their stored events, and can withhold ids from exact-id REQs while
still serving them to semantic REQs — a relay whose index and id lookup disagree. The own
relay holds one issue of each repository besides its announcement: gsync uses NIP-77 only
for filters the own relay holds something of (nothing held: REQ pages, fewer starts).
"""
from __future__ import annotations

import threading
import time

import pytest

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, on_own, our_announcement
from .scripted_relay import Nip77Serve as Nip77Server  # NIP-77 over a scripted relay's store

alice, bob = f.Author.named("alice"), f.Author.named("bob")


class Withholding:
    """Exact-id REQs do not return ``withheld`` ids (until ``release()``); semantic REQs do,
    unless ``everywhere`` (advertised through NIP-77, served to no REQ: an index that lags)."""

    def __init__(self, ids, everywhere=False):
        self.withheld = set(ids)
        self.everywhere = everywhere
        self.id_reqs = 0
        self._lock = threading.Lock()

    def release(self):
        with self._lock:
            self.withheld.clear()

    def install(self, relay):
        answer = relay.answer

        def answer_hiding(filters):
            if self.everywhere or all(flt.ids is not None for flt in filters):
                with self._lock:
                    self.id_reqs += 1
                    hidden = set(self.withheld)
                return [e for e in answer(filters) if e["id"] not in hidden]
            return answer(filters)

        relay.answer = answer_hiding


def _repo_with_issues(own, remote_stub, n, d):
    repo = our_announcement(own, [remote_stub], d=d)
    return repo, [f.issue(bob, repo, subject=f"{d} {i}") for i in range(n)]


def _remote_status(gsync, url):
    return next((r for r in gsync.status()["relays"] if r["relay"] == url), {}).get("status")


def test_ids_advertised_but_not_served_fall_back_to_semantic_req(relay_factory, gsync_factory,
                                                                   scripted):
    own = relay_factory()
    nip77 = Nip77Server()
    remote = scripted(negentropy=nip77, page_size=500)
    repo, issues = _repo_with_issues(own, remote, 40, "hidden-by-id")
    remote.add(repo, *issues)
    # 38 of 40 withheld from id lookups: 5 % delivered, well under the 10 % threshold.
    Withholding(e.id for e in issues[2:]).install(remote)
    publish(own.url, [repo, issues[0]])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=90, what="every issue through the semantic fallback")
    wait_until(lambda: _remote_status(gsync, remote.url) == "connected", timeout=30,
               what="the batch completing (Connected, not failed)")
    assert nip77.opened > 0
    assert any(e["event"] == "relay_ids_not_served" for e in gsync.log_events())


def test_a_small_residual_its_filter_does_not_bring_either_is_unservable_there(relay_factory, gsync_factory,
                                                                              scripted):
    """Three of 30 advertised, served neither by id (asked twice: a residual is retried) nor
    by their filter: not there. The relay stays Connected and keeps its NIP-77; the three are
    counted, and recovery does not ask that relay for them (tests/test_unservable_e2e.py:
    another relay listing the repository is asked instead)."""
    own = relay_factory()
    nip77 = Nip77Server()
    remote = scripted(negentropy=nip77, page_size=500)
    repo, issues = _repo_with_issues(own, remote, 30, "small-residual")
    remote.add(repo, *issues)
    withheld = issues[:3]  # 10 % missing: a residual, not an incompatibility
    Withholding((e.id for e in withheld), everywhere=True).install(remote)  # nor by their filter
    publish(own.url, [repo, issues[3]])
    gsync = gsync_factory(own, [remote], extra={"sync": {"recovery_base_secs": "1"}})
    assert_arrives(own, issues[3:], timeout=90, what="the served issues")
    wait_until(lambda: _remote_status(gsync, remote.url) == "connected", timeout=60, what="Connected")
    assert not on_own(own, withheld)
    noted = [e for e in gsync.log_events() if e["event"] == "events_unservable"]
    assert [(e["relay"], e["ids"]) for e in noted] == [(remote.url, 3)]
    assert gsync.metric("gsync_events_unservable_total", relay=remote.url) == 3
    events = {e["event"] for e in gsync.log_events()}
    assert not events & {"relay_ids_not_served", "recovery_attempt", "negentropy_unsupported"}


@pytest.mark.slow
def test_relay_that_never_answers_neg_open_falls_back_at_the_deadline(relay_factory, gsync_factory,
                                                                      scripted):
    """SPEC §4: a NEG-OPEN with no answer within 15 s in total (3 s here) marks the relay as
    not supporting NIP-77; REQ+EOSE brings the history."""
    deadline = 3.0
    own = relay_factory()
    remote = scripted(negentropy="ignore", page_size=500)
    repo, issues = _repo_with_issues(own, remote, 20, "silent-nip77")
    remote.add(repo, *issues)
    publish(own.url, [repo, issues[0]])
    started = time.monotonic()
    gsync = gsync_factory(own, [remote], timers={"NEGENTROPY_DEADLINE_SECS": deadline})
    assert_arrives(own, issues, timeout=60, what="the issues via REQ+EOSE")
    assert deadline <= time.monotonic() - started < deadline + 20
    unsupported = [e for e in gsync.log_events() if e["event"] == "negentropy_unsupported"]
    assert len(unsupported) == 1 and "timeout" in unsupported[0]["reason"]
    assert remote.reqs(), "the fallback used plain REQs"


def test_a_first_sync_opens_nip77_only_for_filters_the_own_relay_holds_something_of(
        relay_factory, gsync_factory, scripted):
    """Issues with statuses and comments, and state: the own relay holds the announcements
    and one issue. Layer 1 and the issues' filter go by NIP-77; every filter it held nothing
    of (state, the other repository tags, every thread filter) goes by REQ pages, ten to a
    start, even the one that matches the statuses gsync has just delivered with the issues."""
    own = relay_factory()
    nip77 = Nip77Server()
    remote = scripted(negentropy=nip77, page_size=500)
    repos = [our_announcement(own, [remote], d=f"first-sync-{i}") for i in range(2)]
    issues = [f.issue(bob, repo, subject=f"{repo.address} {i}") for repo in repos for i in range(5)]
    statuses = [f.status(alice, bug) for bug in issues]  # `a` and `e`: layer 2 brings them
    comments = [f.comment(alice, bug, content="me too") for bug in issues]
    states = [f.state(alice, f"first-sync-{i}") for i in range(2)]
    remote.add(*repos, *issues, *statuses, *comments, *states)
    held = [*repos, issues[0]]
    publish(own.url, held)
    gsync_factory(own, [remote])
    assert_arrives(own, issues + statuses + comments + states, timeout=60, what="the whole history")
    assert nip77.opened >= 2  # layer 1 and the issues' #a filter
    unheld = [flt for flt in nip77.filters if not any(flt.matches(e) for e in held)]
    assert unheld == [], f"NEG-OPEN for filters the own relay held nothing of: {unheld}"
    req_filters = [flt for _, filters in remote.reqs() for flt in filters]
    assert any("#e" in flt or "#E" in flt for flt in req_filters), "comments came by REQ"


@pytest.mark.slow
def test_a_nip77_verdict_lasts_one_session(relay_factory, gsync_factory, scripted):
    """SPEC §4: a NEG-ERR marks the relay as not supporting NIP-77 *for this session*. The
    next session (here a fresh start) tries NIP-77 again, and it works."""
    nip77 = Nip77Server()
    first_session = []

    def err_then_serve(relay, conn, message):
        if not first_session:
            first_session.append(conn)
        if conn is first_session[0]:
            return [["NEG-ERR", message[1], "error: not today"]] if message[0] == "NEG-OPEN" else []
        return nip77(relay, conn, message)

    own = relay_factory()
    remote = scripted(negentropy=err_then_serve, page_size=500)
    repo, issues = _repo_with_issues(own, remote, 5, "verdict")
    remote.add(repo, *issues)
    publish(own.url, [repo, issues[0]])
    gsync = gsync_factory(own, [remote], extra={"sync": {"base_backoff_secs": "0.5"}},
                          timers={"QUICK_RECONNECT_SECS": 0})  # every reconnect a fresh start
    assert_arrives(own, issues, timeout=30, what="the issues via REQ+EOSE")
    wait_until(lambda: _remote_status(gsync, remote.url) == "connected", timeout=30, what="synced")
    assert nip77.opened == 0
    remote.drop_all()
    wait_until(lambda: nip77.opened >= 1, timeout=30, what="a NEG-OPEN in the next session")
    unsupported = [e for e in gsync.log_events() if e["event"] == "negentropy_unsupported"]
    assert len(unsupported) == 1


class ClaimWorld:
    """Two relays hold the same 30 issues. The quicker one's NIP-77 claims them all (the
    other's exchanges answer a second later), holds its claim while its id fetch runs (2 s),
    and never serves three of them, by id or otherwise. (The own relay holds one issue:
    NIP-77 on both, side by side, as on any re-sync.)"""

    def __init__(self, own, scripted, d):
        self.quick, self.slow_nip77 = Nip77Server(), Nip77Server()

        def slow(relay, conn, message):
            time.sleep(1)  # its exchanges end after the quick relay's: the quick one claims first
            return self.slow_nip77(relay, conn, message)

        self.claimer = scripted(negentropy=self.quick, page_size=500)
        self.other = scripted(negentropy=slow, page_size=500)
        self.repo = our_announcement(own, [self.claimer, self.other], d=d)
        self.issues = [f.issue(bob, self.repo, subject=f"{d} {i}") for i in range(30)]
        for relay in (self.claimer, self.other):
            relay.add(self.repo, *self.issues)
        Withholding((e.id for e in self.issues[:3]), everywhere=True).install(self.claimer)
        answer = self.claimer.answer

        def slowly_by_id(filters):  # the claim is held (its fetch running) while the other ends
            if all(flt.ids is not None for flt in filters):
                time.sleep(2)
            return answer(filters)

        self.claimer.answer = slowly_by_id
        publish(own.url, [self.repo, self.issues[-1]])


@pytest.mark.slow
def test_what_one_relay_claimed_and_never_served_comes_from_the_other(relay_factory, gsync_factory,
                                                                      scripted):
    """The other relay skipped the three (someone was fetching them). When the first relay's
    batch fails, they go to recovery on the other relay too, which serves them: skipping
    never loses an event."""
    own = relay_factory()
    world = ClaimWorld(own, scripted, "claimed-elsewhere")
    gsync = gsync_factory(own, [world.claimer, world.other], extra={"sync": {"recovery_base_secs": "1"}})
    assert_arrives(own, world.issues, timeout=60, what="every issue, the withheld ones from the other relay")
    assert world.quick.opened and world.slow_nip77.opened, "NIP-77 on both relays"
    other_sent = gsync.metric("gsync_remote_events_total", relay=world.other.url)
    assert 3 <= other_sent <= 10, f"the other relay sent {other_sent}: only what the first could not"


@pytest.mark.slow
@pytest.mark.long
def test_what_one_relay_claimed_comes_by_its_filter_from_one_that_serves_nothing_by_id(
        relay_factory, gsync_factory, scripted):
    """As above, but the relay that skipped the claimed ids serves nothing by id (and,
    having fetched nothing by id itself, is not yet known for it): its recovery asks them by
    id once, then by the filter that found them there."""
    own = relay_factory()
    world = ClaimWorld(own, scripted, "claimed-elsewhere-by-filter")
    not_by_id = Withholding(e.id for e in world.issues)  # nothing by id, everything by filter
    not_by_id.install(world.other)
    gsync_factory(own, [world.claimer, world.other], extra={"sync": {"recovery_base_secs": "1"}})
    assert_arrives(own, world.issues, timeout=60, what="the withheld issues, by filter from the other relay")
    assert not_by_id.id_reqs, "the other relay was asked by id first (it skipped the claimed ids)"
