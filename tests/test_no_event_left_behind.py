"""Relays whose history cannot be read the obvious way, and every event still arrives.

Two ways a relay used to lose events for good while gsync reported its history complete:
- it advertises ids through NIP-77 and then returns nothing for them by ``{ids: […]}``
  (azzamo.net and snort.social, found by ngit-grasp's maintainers): those ids are asked by
  the filter that found them, and the relay is remembered, so its next batches go by
  REQ+EOSE from the start;
- more events share one ``created_at`` second than it serves per filter (a bulk import):
  paging by ``until`` cannot go inside a second, so that second is asked by NIP-77 where
  the relay has it, else split on another dimension (tag values, kinds, authors), and what
  no split reaches is logged and counted.
"""
from __future__ import annotations

import threading
import time

import pytest

from gsync.sim.relay import filter_from_json

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, on_own, our_announcement
from .scripted_relay import Nip77Serve

alice, bob, carol = f.Author.named("alice"), f.Author.named("bob"), f.Author.named("carol")


class ServesNothingById:
    """A relay's exact-id REQs come back empty (EOSE alone); semantic REQs are served.
    Records every id it was asked for."""

    def __init__(self, relay):
        self.asked: set[str] = set()
        self._lock = threading.Lock()
        answer = relay.answer

        def answer_without_ids(filters):
            if all(flt.ids is not None for flt in filters):
                with self._lock:
                    for flt in filters:
                        self.asked |= flt.ids
                return []
            return answer(filters)

        relay.answer = answer_without_ids


def test_ids_a_relay_advertises_and_never_serves_by_id_arrive_by_their_filter(
        relay_factory, gsync_factory, scripted):
    own = relay_factory()
    hider = scripted(negentropy=Nip77Serve(), page_size=500)
    other = scripted(page_size=500)  # no NIP-77: REQ pages
    shared = our_announcement(own, [hider, other], d="shared")
    shared_issues = [f.issue(bob, shared, subject=f"shared {i}") for i in range(6)]
    # Only the hider holds this repository, its announcement included: it is found by the
    # hider's layer 1 (NIP-77, the own relay holds announcements) and by nothing else.
    lone = our_announcement(own, [hider], d="lone")
    lone_issues = [f.issue(carol, lone, subject=f"lone {i}") for i in range(8)]
    lone_replies = [f.comment(alice, issue) for issue in lone_issues[:4]]
    hider.add(shared, *shared_issues[:4], lone, *lone_issues, *lone_replies)
    other.add(shared, *shared_issues[4:])
    by_id = ServesNothingById(hider)
    publish(own.url, [shared, shared_issues[0]])  # held: NIP-77 pays on the hider
    gsync = gsync_factory(own, [hider, other])
    everything = [lone, *lone_issues, *lone_replies, *shared_issues]
    assert_arrives(own, everything, timeout=60, what="every event, none of them served by id")
    assert by_id.asked, "NIP-77 advertised ids and gsync asked for them by id first"
    # Remembered: a repository accepted later, of which the own relay already holds an
    # issue (NIP-77 would pay), goes by REQ+EOSE on the hider from the start.
    later = our_announcement(own, [hider], d="later")
    later_issues = [f.issue(carol, later, subject=f"later {i}") for i in range(6)]
    hider.add(later, *later_issues)
    publish(own.url, [later, later_issues[0]])
    assert_arrives(own, later_issues, timeout=30, what="the later repository's issues")
    assert not by_id.asked & {e.id for e in later_issues}
    events = gsync.log_events()
    assert [e["relay"] for e in events if e["event"] == "relay_ids_not_served"] == [hider.url]
    assert not any(e["event"] == "recovery_attempt" and e["relay"] == hider.url for e in events)


class ArrivesElsewhereMeanwhile:
    """NIP-77 over the relay's store; once an exchange advertised ``event`` (the own relay
    lacks it), the next NEG-OPEN is answered only after ``event`` reached the own relay
    another way (published there, as another relay's REQ pages would bring it)."""

    def __init__(self, own, event):
        self.serve, self.own, self.event = Nip77Serve(), own, event
        self.advertised = self.arrived = False

    def __call__(self, relay, conn, message):
        if message[0] == "NEG-OPEN":
            if self.advertised and not self.arrived:
                self.arrived = True
                publish(self.own.url, [self.event])
                time.sleep(1.5)  # the self-subscription hands it to gsync meanwhile
            elif filter_from_json(message[2]).matches(self.event):
                self.advertised = True
        return self.serve(relay, conn, message)


@pytest.mark.slow
def test_advertised_ids_that_arrive_from_elsewhere_first_say_nothing_of_serving_ids(
        relay_factory, gsync_factory, scripted):
    """An id NIP-77 advertised that reached the own relay another way before the batch's id
    fetch is not asked by id; it is not a sign that the relay does not serve ids (judged on
    those, a relay lost NIP-77 for a day, and its next batches brought everything again by
    REQ pages: a third of the relays of bench/scale's world, under load)."""
    own = relay_factory()
    remote = scripted(negentropy=ArrivesElsewhereMeanwhile(own, None), page_size=500)
    repo = our_announcement(own, [remote], d="elsewhere")
    held = f.comment(bob, repo)  # tags the repository by ``a`` and ``A``: NIP-77 for both
    issue = f.issue(carol, repo, subject="brought by another relay")
    remote.negentropy.event = issue
    remote.add(repo, held, issue)
    publish(own.url, [repo, held])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, [issue], timeout=30, what="the issue")
    wait_until(lambda: any(e["event"] == "historic_sync_complete" for e in gsync.log_events()),
               timeout=30, what="the first history synced")
    assert remote.negentropy.arrived, "no exchange came after the issue's"
    # a repository accepted later, of which the own relay holds some: NIP-77 again
    later = our_announcement(own, [remote], d="later")
    later_held = f.comment(bob, later)
    later_issue = f.issue(carol, later, subject="later")
    remote.add(later, later_held, later_issue)
    publish(own.url, [later, later_held])
    assert_arrives(own, [later_issue], timeout=30, what="the later repository's issue")
    assert any(flt.matches(later_issue) for flt in remote.negentropy.serve.filters), \
        "the relay lost NIP-77 over ids it was never asked for"
    assert not any(e["event"] == "relay_ids_not_served" for e in gsync.log_events())


def _crowded_world(own, remote, repos, per_repo, second):
    """``per_repo`` issues of each repository, all created in the same ``second``."""
    announcements, issues = [], []
    for d in repos:
        repo = our_announcement(own, [remote], d=d)
        announcements.append(repo)
        issues += [f.issue(bob, repo, subject=f"{d} {i}", created_at=second) for i in range(per_repo)]
    publish(remote.url, announcements + issues)
    publish(own.url, announcements)
    return announcements, issues


def test_a_relay_serving_a_filter_without_a_limit_its_oldest_events_first_is_synced_whole(
        relay_factory, gsync_factory, scripted):
    """nostream serves a filter without a ``limit`` its oldest 500 events, oldest first
    (``LIMIT 500 ORDER BY created_at ASC``; with a limit, its newest, as NIP-01 says). Paged
    by ``until`` from the oldest seen, everything past the first page was skipped, at every
    sync. Historic pages carry a limit: 250 issues over pages of 100, every one arrives."""
    own = relay_factory()
    remote = scripted(page_size=100, oldest_first=True)
    repo = our_announcement(own, [remote], d="oldest-first")
    base = int(time.time()) - 86_400
    issues = [f.issue(bob, repo, subject=f"issue {i}", created_at=base + 60 * i) for i in range(250)]
    remote.add(repo, *issues)
    publish(own.url, [repo])
    gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=30, what="every issue, the newest ones too")
    pages = [flt for _, flts in remote.reqs() for flt in flts if "#a" in flt and flt.get("limit") != 0]
    assert pages and all(flt.get("limit") for flt in pages), pages


def test_a_second_holding_more_events_than_a_page_is_synced_by_negentropy(relay_factory,
                                                                         gsync_factory):
    """700 issues of one repository in one second, on a relay that serves 500 per filter
    (LocalRelay): paging by ``until`` stops at 500, NIP-77 over that second brings the rest."""
    own, remote = relay_factory(), relay_factory()
    _, issues = _crowded_world(own, remote, ["bulk"], 700, f.next_created_at())
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=60, what="all 700 issues of the crowded second")
    assert gsync.metric("gsync_crowded_seconds_total", outcome="negentropy") >= 1
    assert gsync.metric("gsync_crowded_seconds_total", outcome="incomplete") == 0


def test_a_crowded_second_is_synced_by_negentropy_on_a_relay_reading_until_as_exclusive(
        relay_factory, gsync_factory, scripted):
    """The same on a relay that reads ``until`` as exclusive, in NEG-OPEN as in REQ
    (PEERS.md), serving 100 a page: the exchange over the crowded second asks it one second
    on, so that such a relay reads that second at all (and one second before: a relay may
    read ``since`` as exclusive too)."""
    own = relay_factory()
    serve = Nip77Serve()
    remote = scripted(negentropy=serve, page_size=100, until_exclusive=True)
    repo = our_announcement(own, [remote], d="crowded-exclusive")
    second = f.next_created_at()
    issues = [f.issue(bob, repo, subject=f"crowded {i}", created_at=second) for i in range(150)]
    remote.add(repo, *issues)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=60, what="all 150 issues of the crowded second")
    assert any((flt.since, flt.until) == (second - 1, second + 1) for flt in serve.filters), serve.filters
    assert gsync.metric("gsync_crowded_seconds_total", outcome="negentropy") >= 1


def test_a_crowded_second_is_synced_by_negentropy_on_a_relay_reading_both_bounds_as_exclusive(
        relay_factory, gsync_factory, scripted):
    """The same on a relay that reads ``since`` as exclusive as well (created_at > since and
    < until, in NEG-OPEN as in REQ): the exchange over the crowded second asks it one second
    either way, so that the relay reads that second at all (seed 8 of the simulator's
    ``--since-exclusive 1 --small-pages 1 --series 1``)."""
    own = relay_factory()
    serve = Nip77Serve()
    remote = scripted(negentropy=serve, page_size=100, until_exclusive=True, since_exclusive=True)
    repo = our_announcement(own, [remote], d="crowded-open-interval")
    second = f.next_created_at()
    issues = [f.issue(bob, repo, subject=f"crowded {i}", created_at=second) for i in range(150)]
    remote.add(repo, *issues)
    publish(own.url, [repo])
    gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=60, what="all 150 issues of the crowded second")


def test_a_crowded_second_of_several_repositories_is_split_by_repository(relay_factory,
                                                                       gsync_factory):
    """NIP-77 off: 700 issues of two repositories in one second, 500 served per filter. The
    filter naming both repositories is split until each page comes back short."""
    own, remote = relay_factory(), relay_factory()
    _, issues = _crowded_world(own, remote, ["bulk-a", "bulk-b"], 350, f.next_created_at())
    gsync = gsync_factory(own, [remote], extra={"sync": {"negentropy": "false"}})
    assert_arrives(own, issues, timeout=60, what="all 700 issues of the crowded second")
    assert gsync.metric("gsync_crowded_seconds_total", outcome="incomplete") == 0


def test_a_crowded_second_split_by_repository_on_a_relay_reading_since_as_exclusive(
        relay_factory, scripted, gsync_factory):
    """NIP-77 off, 160 issues of two repositories in one second, 100 served a filter, on a
    relay reading ``since`` as exclusive (``since`` < ``created_at``): a piece asked as that
    second alone (``since`` = ``until``) would read nothing there. The full page is split
    by repository before the second is found crowded, each piece bounded by ``until`` alone,
    which such a relay reads as NIP-01 says: every issue arrives, no second left incomplete."""
    own = relay_factory()
    remote = scripted(page_size=100, since_exclusive=True)
    second = f.next_created_at()
    issues = []
    for d in ("split-a", "split-b"):
        repo = our_announcement(own, [remote], d=d)
        pieces = [f.issue(bob, repo, subject=f"{d} {i}", created_at=second) for i in range(80)]
        remote.add(repo, *pieces)
        publish(own.url, [repo])
        issues += pieces
    gsync = gsync_factory(own, [remote], extra={"sync": {"negentropy": "false"}})
    assert_arrives(own, issues, timeout=60, what="all 160 issues of the crowded second")
    assert gsync.metric("gsync_crowded_seconds_total", outcome="incomplete") == 0


def test_a_crowded_second_no_dimension_splits_is_logged_and_counted(relay_factory, gsync_factory):
    """NIP-77 off and one repository: nothing splits the filter. What the relay serves
    arrives, and the second it leaves incomplete is said, not hidden."""
    own, remote = relay_factory(), relay_factory()
    second = f.next_created_at()
    _, issues = _crowded_world(own, remote, ["bulk-one"], 700, second)
    gsync = gsync_factory(own, [remote], extra={"sync": {"negentropy": "false"}})
    wait_until(lambda: gsync.metric("gsync_crowded_seconds_total", outcome="incomplete") >= 1,
               timeout=60, what="the incomplete second counted")
    wait_until(lambda: len(on_own(own, issues)) >= 500, timeout=30, what="the 500 served")
    logged = [e for e in gsync.log_events() if e["event"] == "crowded_second_incomplete"]
    assert logged and logged[0]["relay"] == remote.url and logged[0]["second"] == second
    assert logged[0]["seen"] >= 500


def test_an_own_relay_that_comes_back_empty_gets_the_catch_up_window_again(relay_factory,
                                                                           gsync_factory):
    """The own relay restarts in memory: what gsync delivered before is gone. The catch-up
    after the outage (since its start less 15 minutes) delivers it again, instead of
    skipping it as already delivered."""
    own, remote = relay_factory(), relay_factory()
    now = int(time.time())
    repo = our_announcement(own, [remote], d="comes-back-empty", created_at=now - 60)
    issues = [f.issue(bob, repo, subject=f"recent {i}", created_at=now - 30 + i) for i in range(5)]
    publish(remote.url, [repo, *issues])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=30, what="the issues")
    own.restart()
    wait_until(lambda: any(e["event"] == "own_relay_up" for e in gsync.log_events()),
               timeout=30, what="the own relay back")
    assert_arrives(own, [repo, *issues], timeout=30, what="the catch-up window delivered again")


def test_an_own_relay_that_comes_back_empty_gets_its_older_history_again_at_once(relay_factory,
                                                                                gsync_factory):
    """The own relay restarts in memory after gsync had synced a repository whose history
    is days old: the catch-up window (by ``created_at``) does not reach it. gsync asks the
    own relay for a sample of what it had stored, finds it gone, and syncs every relay from
    scratch, instead of leaving the own relay without that history until the next daily
    sync."""
    own, remote = relay_factory(), relay_factory()
    then = int(time.time()) - 3 * 86_400
    repo = our_announcement(own, [remote], d="old-history", created_at=then)
    issues = [f.issue(bob, repo, subject=f"old {i}", created_at=then + 60 + i) for i in range(5)]
    publish(remote.url, [repo, *issues])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=30, what="the issues")
    own.restart()
    assert_arrives(own, [repo, *issues], timeout=30, what="the older history delivered again")
    lost = [e for e in gsync.log_events() if e["event"] == "own_relay_lost_events"]
    assert lost and lost[0]["missing"] >= 1
    assert gsync.metric("gsync_own_relay_losses_total") >= 1


def test_an_own_relay_back_before_gsync_noticed_it_was_gone_gets_the_catch_up_too(
        relay_factory, gsync_factory, scripted):
    """The own relay restarts faster than a delivery connection is dialled again (it drops
    every connection and listens on as if nothing happened, empty): the outage is still
    noticed, and what it lost is delivered again."""
    own, remote = scripted(), relay_factory()
    now = int(time.time())
    repo = our_announcement(own, [remote], d="back-at-once", created_at=now - 60)
    issues = [f.issue(bob, repo, subject=f"recent {i}", created_at=now - 30 + i) for i in range(5)]
    publish(remote.url, [repo, *issues])
    own.add(repo)
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=30, what="the issues")
    own.forget(*issues)
    own.drop_all()
    assert_arrives(own, issues, timeout=30, what="the catch-up window delivered again")
    assert any(e["event"] == "own_relay_up" for e in gsync.log_events())
