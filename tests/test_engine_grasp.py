"""GRASP semantics end to end: what makes gsync right for a GRASP relay rather than a plain
event mirror. The own relay is ``GraspRelay`` (tests/grasp_relay.py): purgatory for new
announcements until the test says their git data arrived, refusals for events of
repositories it does not host and for announcements by non-maintainers."""
import os
import time

import pytest

from . import factory as f
from .grasp_relay import PURGATORY, GraspRelay
from .relays import publish, wait_until
from .scenario import alice, assert_arrives, bob, carol, our_announcement

dave = f.Author.named("dave")


def _connected(gsync) -> bool:
    return [r["status"] for r in gsync.status()["relays"]] == ["connected"]


@pytest.mark.slow
def test_a_repository_in_purgatory_gets_its_state_until_accepted_then_its_whole_history(
        relay_factory, gsync_factory, scripted):
    own = GraspRelay.start(scripted)
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="held")
    bug = f.issue(bob, repo)
    reply = f.comment(alice, bug)
    series = f.patch(bob, repo)
    state = f.state(alice, "held")
    publish(remote.url, [repo, state, bug, reply, series])
    gsync = gsync_factory(own, [], bootstrap=[remote], timers={"PURGATORY_TTL_SECS": 3})
    wait_until(lambda: own.answers.get(repo.id) == [(True, PURGATORY)], timeout=30,
               what="the announcement held in purgatory")
    wait_until(lambda: _connected(gsync), timeout=30, what="historic sync complete")
    wait_until(lambda: own.answers.get(state.id) == [(True, PURGATORY)], timeout=10,
               what="the state event (StateOnly sync), held with it")
    assert not any(own.offered(e) for e in (bug, reply, series)), "StateOnly syncs state only"

    # The relay keeps the repository while its state events keep arriving (each answered
    # purgatory: restarts its clock): gsync keeps it StateOnly past 3 s from the announcement.
    for i in range(4):
        newer = f.state(alice, "held", refs={"refs/heads/main": f"{i + 1:040x}"})
        publish(remote.url, [newer])
        wait_until(lambda newer=newer: own.offered(newer), timeout=10, what=f"state update {i}")
        time.sleep(1)
    assert gsync.status()["repos"] == 1, "still registered while the relay holds it"

    own.git_data_arrived(repo.address)  # accepted: stored, and seen by the self-subscription
    assert_arrives(own, [repo, bug, reply, series], timeout=30, what="the whole history once Full")


def id_fetches(relay, event_id: str) -> int:
    """REQs of one filter that ``relay`` was sent asking ``event_id`` by id."""
    return sum(1 for m in relay.messages("REQ") if len(m) == 3 and event_id in m[2].get("ids", ()))


@pytest.mark.parametrize("tier", ["hot", "cold"])
def test_a_co_maintainer_refused_first_is_delivered_once_the_owner_lists_them(
        tier, gsync_factory, scripted):
    """Carol's announcement (not listing us) and state for "proj", and her patch on her own
    repository, are refused: carol maintains nothing here yet. Alice's newer announcement
    makes her a maintainer; then her announcement, her state and (once her repository is
    accepted) her patch go to the own relay again: from the hot tier at once, or, when that
    has expired, fetched again by id from the relay they came from."""
    own = GraspRelay.start(scripted)
    remote, other = scripted(page_size=500), scripted(page_size=500)
    repo = our_announcement(own, [remote, other], d="proj")
    root = f.patch(alice, repo)
    own.host(repo, root)
    carols = f.announcement(carol, "proj", clone=["https://git.example.com/carol/proj.git"],
                            relays=[remote.url])
    carols_state = f.state(carol, "proj")
    carols_patch = f.patch(carol, f.repo_addr(carol, "proj"), reply_to=root)
    remote.add(repo, root, carols, carols_state, carols_patch)
    gsync = gsync_factory(own, [remote, other], timers={"REJECTED_HOT_SECS": 1 if tier == "cold" else 600})
    wait_until(lambda: gsync.status()["rejected"] == 3, timeout=30, what="carol's three refusals")
    assert own.refused(carols_state) and own.refused(carols_patch)
    assert not own.offered(carols)  # gsync's own layer-1 check refused it
    if tier == "cold":
        time.sleep(1.5)  # past the (test-scaled) hot tier: only the ids are left
    fetched_before = id_fetches(remote, carols.id)

    listed = our_announcement(own, [remote, other], d="proj", maintainers=[carol])
    remote.broadcast(listed)
    started = time.monotonic()
    wait_until(lambda: all(own.stores(e) for e in (listed, carols, carols_state, carols_patch)),
               timeout=30, interval=0.1, what="carol's events re-delivered")
    took = time.monotonic() - started
    if tier == "hot":
        assert id_fetches(remote, carols.id) == fetched_before, "re-delivered from the hot tier"
        assert took < 10, f"took {took:.1f}s"
    else:
        # (once: a REQ of one filter asking it by id; the relay's daily proof that it answers
        # every filter of a REQ may ask it too, an id a filter, and is not a fetch)
        assert id_fetches(remote, carols.id) == fetched_before + 1, "fetched again by id from its relay"
    refetches_elsewhere = [m for m in other.messages("REQ") if any("ids" in flt for flt in m[2:])]
    assert not refetches_elsewhere, "asked only the relay each refused event came from"
    assert gsync.status()["rejected"] == 0


@pytest.mark.slow
def test_a_refused_event_is_not_downloaded_again_by_a_fresh_start_nor_after_a_restart(
        gsync_factory, scripted, tmp_path):
    own = GraspRelay.start(scripted)
    remote = scripted(negentropy="serve", page_size=500)
    repo = our_announcement(own, [remote], d="proj")
    own.host(repo)
    bug = f.issue(bob, repo)
    intruder = f.state(carol, "proj")  # carol maintains nothing here: refused
    remote.add(repo, bug, intruder)
    settings = {"service": {"state_dir": os.path.join(tmp_path, "state")}}
    first = gsync_factory(own, [remote], extra=settings,
                          timers={"DAILY_MIN_SECS": 2, "DAILY_MAX_SECS": 2})
    wait_until(lambda: own.stores(bug) and own.refused(intruder), timeout=30, what="first sync")
    # What the first sync downloaded is not the subject (a page retried under a starved
    # machine may bring it twice); what it downloads after the refusal is.
    first_sync = remote.sent_count(intruder.id)
    assert first_sync >= 1 and own.offered(intruder) >= 1

    def fresh_start_done():
        names = [e["event"] for e in first.log_events()]
        return "daily_sync" in names and "historic_sync_complete" in names[names.index("daily_sync"):]

    wait_until(fresh_start_done, timeout=30, what="a daily fresh start completing")
    assert remote.sent_count(intruder.id) == first_sync, "downloaded again by the fresh start"
    first.terminate()  # the cold tier is saved in state_dir
    # (offered again meanwhile from the hot tier is allowed: a refusal read as maybe the own
    # relay's with everything waits for it to store anew, and the issue's store may be
    # confirmed after the refusal; offered again, not downloaded again)
    first_offers = own.offered(intruder)
    second = gsync_factory(own, [remote], extra=settings)
    wait_until(lambda: _connected(second), timeout=30, what="the second run's historic sync")
    assert remote.sent_count(intruder.id) == first_sync, "downloaded again"
    assert own.offered(intruder) == first_offers
    assert remote.sent_count(bug.id) >= 1


def _live_budget(limit: int):
    """A relay that keeps at most ``limit`` live (``limit: 0``) subscriptions per connection
    and says so, as LocalRelay does for its filter-size budget."""
    def refuse_past_budget(relay, conn, message):
        if not (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 2):
            return None
        if not all(isinstance(flt, dict) and flt.get("limit") == 0 for flt in message[2:]):
            return None
        live = sum(1 for sub, filters in conn.subs.items()
                   if sub != message[1] and all(flt.limit == 0 for flt in filters))
        if live >= limit:
            return [["CLOSED", message[1], f"blocked: active subscriptions exceed max size ({limit} live)"]]
        return None
    return refuse_past_budget


def _member_poll_since(message, member_id):
    """The ``since`` of a REQ polling for replies to ``member_id``, else None."""
    if not (isinstance(message, list) and message[:1] == ["REQ"]):
        return None
    for flt in message[2:]:
        if (isinstance(flt, dict) and member_id in flt.get("#e", ()) and "since" in flt
                and flt.get("limit") != 0):
            return flt["since"]
    return None


def _descendant_polls(remote, member_id):
    """(connection, since) of every REQ polling for replies to ``member_id``."""
    polls = [(conn, _member_poll_since(message, member_id)) for conn, message in list(remote.received)]
    return [(conn, since) for conn, since in polls if since is not None]


def _poll_times(remote, member_id):
    return [t for t, _, message in remote.received_with_times()
            if _member_poll_since(message, member_id) is not None]


def _remote_with_a_thread(scripted, own, d, max_subscriptions):
    """A remote that keeps two live REQs at most (as LocalRelay does for its filter-size
    budget): layer 1 and the thread's coverage; a live REQ for replies to the direct member
    does not fit and is polled. Returns the remote, repository, root and member."""
    remote = scripted(nip11={"limitation": {"max_subscriptions": max_subscriptions}}, page_size=500,
                      on_message=_live_budget(2))
    repo = our_announcement(own, [remote], d=d)
    bug = f.issue(bob, repo)
    own.host(repo, bug)
    member = f.comment(alice, bug, content="tags the root: a direct member")
    return remote, repo, bug, member


def _hold_history_of(event_id: str, secs: float, held: list):
    """``on_message`` for a scripted relay: the first historic REQ (no ``limit: 0``, no
    ``since``) that asks for what tags ``event_id`` is answered ``secs`` later, from
    another thread (the connection keeps reading meanwhile); ``held`` gets (start, end)."""
    import threading

    def hold(relay, conn, message):
        if held or not (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 2):
            return None
        filters = message[2:]
        if not any(event_id in flt.get("#e", ()) and "since" not in flt and flt.get("limit") != 0
                   for flt in filters):
            return None
        held.append([time.monotonic(), None])

        def answer():
            time.sleep(secs)
            from gsync.sim.relay import filter_from_json
            for raw in relay.answer([filter_from_json(flt) for flt in filters]):
                conn.send("EVENT", message[1], raw)
            held[0][1] = time.monotonic()
            conn.send("EOSE", message[1])
        threading.Thread(target=answer, daemon=True).start()
        return []
    return hold


def _hosted_issues(own, remote, d: str, count: int):
    """A repository hosted on ``own`` with ``count`` issues, on ``own`` and ``remote`` both."""
    repo = our_announcement(own, [remote], d=d)
    bugs = [f.issue(bob, repo, subject=f"bug {n}") for n in range(count)]
    own.host(repo, *bugs)
    remote.add(repo, *bugs)
    return repo, bugs


@pytest.mark.slow
def test_polls_are_spaced_by_what_they_send(gsync_factory, scripted):
    # 150 issues: their e/E/q coverage (about 30 kB) does not fit the relay's one live REQ
    # (layer 1 takes it) and is polled. Every poll sends it all again, so polls are spaced
    # by its size (here 0.05 s a KiB: about 1.5 s), not POLL_SECS (0.2 s) apart.
    own = GraspRelay.start(scripted)
    remote = scripted(page_size=500, on_message=_live_budget(1))
    repo, bugs = _hosted_issues(own, remote, "many-issues", 150)
    gsync = gsync_factory(own, [remote], timers={"POLL_SECS": 0.2, "POLL_SECS_PER_KIB": 0.05,
                                                 "MAINTENANCE_TICK_SECS": 0.1})

    def polls():
        return [t for t, _, message in remote.received_with_times()
                if _member_poll_since(message, bugs[0].id) is not None]
    wait_until(lambda: len(polls()) >= 3, timeout=30, what="the issues' coverage polled three times")
    times = polls()
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 1.2, gaps  # 0.2 s apart without the spacing
    cadence = [e for e in gsync.log_events() if e.get("event") == "live_coverage_poll_cadence"]
    assert cadence and 1 <= cadence[-1]["every_secs"] <= 2, cadence


def test_a_new_root_past_a_full_budget_is_polled_apart_from_the_old_coverage(gsync_factory, scripted):
    # No live room at all (three subscriptions: the reserved ones), so every root's coverage
    # is polled: 150 issues (about 30 kB, 30 s apart at a second a KiB) and, once they are
    # no longer new, one issue more. The new one is polled on its own cadence (0.3 s): its
    # comment arrives in seconds, not at the next poll of the old coverage.
    own = GraspRelay.start(scripted)
    remote = scripted(page_size=500, nip11={"limitation": {"max_subscriptions": 3}})
    repo, bugs = _hosted_issues(own, remote, "old-and-new", 150)
    gsync = gsync_factory(own, [remote], timers={"POLL_SECS": 0.3, "FRESH_POLL_SECS": 2,
                                                 "MAINTENANCE_TICK_SECS": 0.1})
    wait_until(lambda: any(e.get("coverage") == "settled" and e["every_secs"] >= 20
                           for e in gsync.log_events() if e.get("event") == "live_coverage_poll_cadence"),
               timeout=30, what="the old coverage polled on its slow cadence")
    late = f.issue(carol, repo, subject="a new issue")
    remote.add(late)
    own.host(late)
    publish(own.url, [late])
    wait_until(lambda: any(_member_poll_since(message, late.id) is not None for _, message in remote.received),
               timeout=30, what="the new issue's coverage polled")
    reply = f.comment(alice, late, created_at=int(time.time()))
    remote.add(reply)  # stored only: a poll must find it
    started = time.monotonic()
    assert_arrives(own, [reply], timeout=30, what="the comment on the new issue")
    assert time.monotonic() - started < 10  # the old coverage's next poll is 20 s or more away


def test_polled_tiers_due_together_share_one_poll(gsync_factory, scripted):
    # Old and new coverage, both polled on the same short cadence: each poll is one batch
    # (its REQs share a batch id) asking for both, not two batches taking turns for the
    # paced starts that historic sync needs.
    own = GraspRelay.start(scripted)
    remote = scripted(page_size=500, nip11={"limitation": {"max_subscriptions": 3}})
    repo, bugs = _hosted_issues(own, remote, "both-tiers", 20)
    gsync_factory(own, [remote], timers={"POLL_SECS": 0.3, "POLL_SECS_PER_KIB": 0.01, "FRESH_POLL_SECS": 1,
                                         "MAINTENANCE_TICK_SECS": 0.1})
    wait_until(lambda: any(_member_poll_since(m, bugs[0].id) is not None for _, m in remote.received),
               timeout=30, what="the old coverage polled")
    time.sleep(1.5)  # no longer fresh
    late = f.issue(carol, repo, subject="a new issue")
    remote.add(late)
    own.host(late)
    publish(own.url, [late])

    def poll_batches(event_id):
        return {m[1].rsplit("-", 1)[0] for _, m in list(remote.received)
                if _member_poll_since(m, event_id) is not None}
    wait_until(lambda: len(poll_batches(late.id)) >= 3, timeout=30, what="the new issue polled three times")
    both = poll_batches(late.id) & poll_batches(bugs[0].id)
    assert len(both) >= 2, (poll_batches(late.id), poll_batches(bugs[0].id))


@pytest.mark.slow
def test_polls_wait_while_the_relays_historic_sync_runs(gsync_factory, scripted):
    """Polled coverage is asked for again every POLL_SECS, but not while a historic batch
    of the relay is still fetching: that batch brings the same history, and the paced
    starts are its. Once it completes, the polls resume from their cursor."""
    own = GraspRelay.start(scripted)
    held: list = []
    # Room for historic REQs beside the held one (10 subscriptions); replies are polled.
    remote, repo, bug, member = _remote_with_a_thread(scripted, own, "busy", max_subscriptions=10)
    remote.add(repo, bug, member)
    gsync_factory(own, [remote], timers={"POLL_SECS": 0.5, "DESCENDANT_TICK_SECS": 0.5,
                                         "MAINTENANCE_TICK_SECS": 0.2, "POLL_DEFER_SECS": 30})
    wait_until(lambda: len(_descendant_polls(remote, member.id)) >= 2, timeout=30,
               what="replies to the member polled")
    late_bug = f.issue(carol, repo)  # a new root: a historic batch for what tags it
    own.host(late_bug)
    hold, budget = _hold_history_of(late_bug.id, 4.0, held), remote.on_message

    def hold_or_budget(*args):
        frames = hold(*args)
        return frames if frames is not None else budget(*args)
    remote.on_message = hold_or_budget
    remote.broadcast(late_bug)
    wait_until(lambda: held and held[0][1] is not None, timeout=30, what="the held history answered")
    start, end = held[0]
    during = [p for p in _poll_times(remote, member.id) if start + 0.3 < p < end]
    assert not during, f"{len(during)} polls while the batch was fetching"
    wait_until(lambda: any(p > end for p in _poll_times(remote, member.id)), timeout=30,
               what="polls resuming once the batch completed")


@pytest.mark.slow
def test_descendants_on_a_full_relay_are_polled_from_a_cursor_that_survives_a_reconnect(
        gsync_factory, scripted):
    own = GraspRelay.start(scripted)
    remote, repo, bug, member = _remote_with_a_thread(scripted, own, "threads", max_subscriptions=4)
    now = int(time.time())  # new replies: what polling (since the cursor) is for
    child = carol.sign(1, [["e", member.id]], "tags only the member: a descendant", now)
    grandchild = dave.sign(1, [["e", child.id]], "a reply to the reply: out of scope", now)
    remote.add(repo, bug, member, grandchild)
    gsync_factory(own, [remote], extra={"sync": {"base_backoff_secs": "2"}},
                  timers={"POLL_SECS": 1, "DESCENDANT_TICK_SECS": 1, "MAINTENANCE_TICK_SECS": 0.5})
    wait_until(lambda: own.stores(member), timeout=30, what="the direct member")
    wait_until(lambda: len(_descendant_polls(remote, member.id)) >= 2, timeout=30,
               what="replies to the member polled")
    remote.add(child)  # stored only: no live subscription is sent it, a poll must find it
    wait_until(lambda: own.stores(child), timeout=30, what="the descendant, by polling")

    before = _descendant_polls(remote, member.id)
    remote.drop_all()
    dropped_at = int(time.time())  # after the drop: a poll may end while it is under way
    wait_until(lambda: {c for c, _ in _descendant_polls(remote, member.id)} - {c for c, _ in before},
               timeout=30, what="polling again after the reconnect")
    after = [since for conn, since in _descendant_polls(remote, member.id)
             if conn not in {c for c, _ in before}]
    # From the last successful poll before the drop, 15 minutes back: not from the reconnect.
    assert max(since for _, since in before) <= after[0] <= dropped_at - 900
    assert not own.offered(grandchild) and remote.sent_count(grandchild.id) == 0


class _ShowsNoRootsLive(GraspRelay):
    """Stores the issues, patches and PRs it accepts, and answers them to history REQs,
    but sends them to no live subscription: what a relay does to a subscriber it dropped
    events for (LocalRelay, when a subscriber reads too slowly under load)."""

    def _stored(self, raw: dict) -> tuple[bool, str]:
        if raw.get("kind") in (1617, 1618, 1621):
            self.relay.add(raw)
            return True, ""
        return super()._stored(raw)


def _hosting_own_relay_that_shows_no_roots_live(scripted):
    """An own relay hosting "proj" (listing one remote) that never shows roots live."""
    own = _ShowsNoRootsLive.start(scripted)
    remote = scripted(page_size=500)
    repo = our_announcement(own, [remote], d="proj")
    own.host(repo)
    remote.add(repo)
    return own, remote, repo


def test_a_root_the_own_relay_accepts_but_never_shows_live_still_gets_its_thread(
        gsync_factory, scripted):
    # The comment is reachable only through its issue (layer 3: #e/#E of the issue's id).
    # The own relay's OK for the issue is what tells gsync it accepted it; the live
    # self-subscription never shows it.
    own, remote, repo = _hosting_own_relay_that_shows_no_roots_live(scripted)
    bug = f.issue(bob, repo)
    reply = f.comment(alice, bug)
    remote.add(bug, reply)
    gsync_factory(own, [remote])
    assert_arrives(own, [bug], timeout=30, what="the issue (layer 2)")
    assert_arrives(own, [reply], timeout=30, what="its comment, through the issue's id (layer 3)")


def test_a_root_published_to_the_own_relay_but_never_shown_live_is_read_again(
        gsync_factory, scripted):
    # Someone publishes an issue to the own relay itself, which never shows it live (it
    # dropped it for a slow subscriber). Its comment is on the remote, reachable only
    # through the issue's id. The self-subscription's periodic re-read finds the issue.
    own, remote, repo = _hosting_own_relay_that_shows_no_roots_live(scripted)
    gsync = gsync_factory(own, [remote], timers={"SELF_REREAD_SECS": 1})
    wait_until(lambda: _connected(gsync), timeout=30, what="historic sync complete")
    bug = f.issue(bob, repo, created_at=int(time.time()))  # published now: within the re-read
    reply = f.comment(alice, bug)
    publish(own.url, [bug])
    remote.add(reply)
    assert_arrives(own, [reply], timeout=30, what="the comment, once the issue is read again")


def test_the_self_subscriptions_rereads_keep_one_connection(gsync_factory, scripted):
    """The re-reads go over one connection kept for the session, not one each: every five
    minutes, a connection of its own was twelve an hour, all that ngit-relay (khatru's
    ConnectionRateLimiter: a burst of 100, then one per five minutes an address) gives back,
    so every other connection gsync opened drained it for good. One the own relay closes
    (idle) is replaced for the next read, which still comes."""
    own, remote, repo = _hosting_own_relay_that_shows_no_roots_live(scripted)
    gsync = gsync_factory(own, [remote], timers={"SELF_REREAD_SECS": 0.5})
    wait_until(lambda: _connected(gsync), timeout=30, what="historic sync complete")
    relay = own.relay

    def history_reqs() -> int:
        return sum(1 for _, m in relay.received if isinstance(m, list) and m[:1] == ["REQ"]
                   and str(m[1]).startswith("own-") and 30617 in m[2].get("kinds", ()))

    began, upgrades = history_reqs(), len(relay.upgrade_times)
    wait_until(lambda: history_reqs() >= began + 6, timeout=20, what="six re-reads")
    assert len(relay.upgrade_times) - upgrades <= 1  # (one at most: a holdings read, say)
    relay.drop_all()  # every connection closed by the own relay: the next read on a fresh one
    bug = f.issue(bob, repo, created_at=int(time.time()))
    reply = f.comment(alice, bug)
    own.relay.add(bug.to_dict())  # (stored, never shown live)
    remote.add(reply)
    assert_arrives(own, [reply], timeout=30, what="the comment, once the issue is read again")


@pytest.mark.slow
def test_a_backdated_root_published_to_the_own_relay_is_found_by_the_daily_full_reread(
        gsync_factory, scripted):
    # As above, but the issue says it was written two hours ago: older than the re-read's
    # 15 min overlap, so only the re-read of the whole history (daily; here every 3 s) finds it.
    own, remote, repo = _hosting_own_relay_that_shows_no_roots_live(scripted)
    gsync = gsync_factory(own, [remote], timers={"SELF_REREAD_SECS": 1, "SELF_FULL_REREAD_SECS": 3})
    wait_until(lambda: _connected(gsync), timeout=30, what="historic sync complete")
    bug = f.issue(bob, repo, created_at=int(time.time()) - 2 * 3600)
    reply = f.comment(alice, bug)
    publish(own.url, [bug])
    remote.add(reply)
    assert_arrives(own, [reply], timeout=30, what="the comment, once the whole history is read again")
    assert any(e["event"] == "self_full_reread" for e in gsync.log_events())
