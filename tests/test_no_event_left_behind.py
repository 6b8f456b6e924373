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


def test_a_crowded_second_of_several_repositories_is_split_by_repository(relay_factory,
                                                                       gsync_factory):
    """NIP-77 off: 700 issues of two repositories in one second, 500 served per filter. The
    filter naming both repositories is split until each page comes back short."""
    own, remote = relay_factory(), relay_factory()
    _, issues = _crowded_world(own, remote, ["bulk-a", "bulk-b"], 350, f.next_created_at())
    gsync = gsync_factory(own, [remote], extra={"sync": {"negentropy": "false"}})
    assert_arrives(own, issues, timeout=60, what="all 700 issues of the crowded second")
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
