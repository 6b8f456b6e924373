"""The sync engine end to end: real LocalRelays (own + remotes) and gsync as a subprocess."""
import time

import pytest

from . import factory as f
from .gsync_proc import GsyncProcess
from .relays import count_on, ids_on, publish, wait_until
from .scenario import assert_arrives, our_announcement, two_remote_history

alice, bob, carol = f.Author.named("alice"), f.Author.named("bob"), f.Author.named("carol")


def test_announcement_brings_full_history_from_both_remotes(relay_factory, gsync_factory):
    own, a, b = relay_factory(), relay_factory(), relay_factory()
    repo, on_a, on_b = two_remote_history(own, a, b)
    publish(a.url, on_a)
    publish(b.url, on_b)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [a, b])
    assert_arrives(own, [e for e in on_a + on_b if e is not repo])
    status = gsync.status()
    assert {r["relay"] for r in status["relays"]} == {a.url, b.url}
    assert gsync.metric("ngit_sync_events_synced_total") >= 10


ROUTES = ("a", "A", "q-address", "e", "E", "q-id")


def _route_event(route: str, repo, root):
    """A kind-1 note reaching the repo by exactly one tag route, nothing else."""
    addr = repo.address
    tags = {
        "a": [["a", addr]],
        "A": [["A", addr]],
        "q-address": [["q", addr]],
        "e": [["e", root.id]],
        "E": [["E", root.id]],
        "q-id": [["q", root.id]],
    }[route]
    return carol.sign(1, tags, f"reaches the repo by {route}")


@pytest.mark.parametrize("route", ROUTES)
def test_each_tag_route_is_synced(route, relay_factory, gsync_factory):
    own, remote = relay_factory(), relay_factory()
    repo = our_announcement(own, [remote], d=f"route-{route}")
    root = f.issue(bob, repo)
    event = _route_event(route, repo, root)
    publish(remote.url, [repo, root, event])
    publish(own.url, [repo])
    gsync_factory(own, [remote])
    assert_arrives(own, [root, event], what=f"the {route} route")


def test_repository_found_through_layer1_is_delivered_then_synced(relay_factory, gsync_factory):
    own, remote = relay_factory(), relay_factory()
    # The own relay knows nothing yet; the remote (a bootstrap relay) has an announcement
    # listing us, and its issues.
    repo = our_announcement(own, [remote], d="found-on-remote")
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, bug])
    gsync_factory(own, [], bootstrap=[remote])
    assert_arrives(own, [repo, bug], what="layer-1 discovery then layer-2 sync")


def test_live_event_published_after_sync_arrives(relay_factory, gsync_factory):
    own, remote = relay_factory(), relay_factory()
    repo = our_announcement(own, [remote])
    publish(remote.url, [repo])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    wait_until(
        lambda: any(r["status"] in ("connected", "syncing") and r["subscriptions"] >= 2
                    for r in gsync.status()["relays"]),
        timeout=30, what="live subscriptions",
    )
    wait_until(lambda: gsync.status()["relays"][0]["status"] == "connected", timeout=120,
               what="historic sync complete")
    late = f.issue(bob, repo, subject="found after sync")
    publish(remote.url, [late])
    assert_arrives(own, [late], timeout=20, what="the live event")


@pytest.mark.slow
def test_announcement_not_listing_us_is_ignored(relay_factory, gsync_factory):
    own, remote, elsewhere = relay_factory(), relay_factory(), relay_factory()
    ours = our_announcement(own, [remote], d="ours")
    theirs = f.announcement(
        carol, "theirs", clone=["https://git.example.org/carol/theirs.git"],
        relays=["wss://relay.example.org", elsewhere.url],
    )
    publish(remote.url, [ours, theirs])
    publish(own.url, [ours])
    gsync = gsync_factory(own, [remote, elsewhere])
    wait_until(lambda: gsync.status()["relays"] and all(
        r["status"] == "connected" for r in gsync.status()["relays"]), timeout=40, what="sync done")
    assert theirs.id not in ids_on(own.url, {"kinds": [30617]})
    dialled = {r["relay"] for r in gsync.status()["relays"]}
    assert dialled == {remote.url}
    assert gsync.metric("gsync_events_dropped_total", reason="layer1_not_ours") >= 1


@pytest.mark.slow
def test_pagination_past_localrelay_500_event_cap(relay_factory, gsync_factory):
    own, remote = relay_factory(), relay_factory()
    repo = our_announcement(own, [remote], d="busy")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(1500)]
    publish(remote.url, [repo, *issues])
    publish(own.url, [repo])
    gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=90, what="1,500 issues through one #a filter")


@pytest.mark.slow
@pytest.mark.long
def test_own_relay_restart_mid_sync_loses_nothing(relay_factory, gsync_factory, tmp_path):
    own = relay_factory(lmdb=str(tmp_path / "own-db"))
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="restart")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(1500)]
    publish(remote.url, [repo, *issues])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    wait_until(lambda: count_on(own.url, {"kinds": [1621], "limit": 300}) >= 300, timeout=60,
               what="sync under way")
    own.kill()
    own.start()  # same port, same database
    assert_arrives(own, issues, timeout=120, what="every issue after the restart")
    assert gsync.proc.poll() is None


@pytest.mark.slow
@pytest.mark.long
def test_a_full_delivery_backlog_pushes_back_instead_of_dropping(relay_factory, gsync_factory):
    # An own relay slower than the remote and a backlog limit below one page. Historic
    # pages wait while delivery is behind; a live flood, which no start gates, must be held
    # by the connection itself: it stops reading at the limit (one read burst of at most
    # 256 KiB past it) until the own relay catches up. Nothing is dropped.
    own, remote = relay_factory(write_delay_ms=5), relay_factory()
    repo = our_announcement(own, [remote], d="backlog")
    history = [f.issue(bob, repo, subject=f"issue {i}") for i in range(700)]
    flood = [f.issue(carol, repo, subject=f"live issue {i}") for i in range(1000)]
    publish(remote.url, [repo, *history])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"delivery_max_backlog": "100",
                                                         "negentropy": "false"}})
    smallest = min(len(e.to_json()) for e in history + flood)
    bound = 100 + 256 * 1024 // smallest + 1
    peak = 0

    def delivered(count):
        def check():
            nonlocal peak
            status = gsync.status()
            peak = max(peak, status["delivery_backlog"])
            submitted = sum(r["events_delivered"] for r in status["relays"])
            return submitted >= count and status["delivery_backlog"] == 0
        return check

    wait_until(delivered(len(history)), timeout=120, interval=0.05, what="the history")
    assert peak <= bound, f"historic sync: the backlog reached {peak} (bound {bound})"
    wait_until(lambda: gsync.status()["relays"][0]["status"] == "connected", timeout=120,
               what="historic sync complete")
    peak = 0
    publish(remote.url, flood)
    wait_until(delivered(len(history) + len(flood)), timeout=120, interval=0.05, what="the flood")
    assert peak <= bound, f"live flood: the backlog reached {peak} (bound {bound})"
    assert_arrives(own, history + flood, timeout=30, what="every issue on the own relay")
    assert gsync.metric("gsync_events_dropped_total", reason="own_relay_backlog_full") == 0
    assert any(e.get("event") == "delivery_backlog_full" for e in gsync.log_events())


def test_replies_to_a_thread_member_are_synced_one_generation_deep(relay_factory, gsync_factory):
    own, remote = relay_factory(), relay_factory()
    repo = our_announcement(own, [remote], d="threads")
    bug = f.issue(bob, repo)
    member = f.comment(alice, bug, content="tags the root: layer 3 finds it")
    child = carol.sign(1, [["e", member.id]], "tags only the member: a descendant")
    grandchild = carol.sign(1, [["e", child.id]], "two generations down: out of scope")
    publish(remote.url, [repo, bug, member, child, grandchild])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, [bug, member, child], what="root, member and descendant")
    late = carol.sign(1, [["q", member.id]], "a live descendant")
    publish(remote.url, [late])
    assert_arrives(own, [late], timeout=20, what="the live descendant")
    assert grandchild.id not in ids_on(own.url, {"ids": [grandchild.id]})
    # the one member is watched on the one relay (the operator's gauge of that work)
    wait_until(lambda: gsync.metric("gsync_thread_members") == 1, timeout=10, what="one member counted")


def test_replies_to_members_the_own_relay_holds_arrive_from_every_relay_listing_the_repository(relay_factory,
                                                                                            gsync_factory):
    """A thread member published to the own relay directly (as to every relay a repository
    lists) never comes from a remote (NIP-77 fetches what the own relay lacks; a copy of an
    event already seen is not checked again), and a reply tagging only it (a reaction, a
    kind-1 reply, a quote) may have reached one of the relays alone. Its descendants are
    asked of every relay listing the repository: what each holds arrives, history and live,
    and each relay watches the member (found end to end: members were learnt only from the
    first checked copy, so none was watched here at all)."""
    own, a, b = relay_factory(), relay_factory(), relay_factory()
    repo = our_announcement(own, [a, b], d="members-held")
    bug = f.issue(bob, repo)
    member = f.comment(alice, bug, content="published everywhere, the own relay too")
    on_a = carol.sign(1, [["e", member.id]], "a reply that reached relay a alone")
    on_b = carol.sign(7, [["e", member.id]], "+")
    publish(a.url, [repo, bug, member, on_a])
    publish(b.url, [repo, bug, member, on_b])
    publish(own.url, [repo, bug, member])
    gsync = gsync_factory(own, [a, b])
    assert_arrives(own, [on_a, on_b], timeout=30, what="each relay's reply to a member the own relay held")
    wait_until(lambda: all(r["status"] == "connected" for r in gsync.status()["relays"]), timeout=60,
               what="both relays synced")
    now = int(time.time())  # (live: a catch-up's since would not reach the factory's 2023)
    late = [carol.sign(1, [["q", member.id]], "quoted on a", now), bob.sign(7, [["e", member.id]], "+", now)]
    publish(a.url, late[:1])
    publish(b.url, late[1:])
    assert_arrives(own, late, timeout=20, what="live replies on each relay")
    wait_until(lambda: gsync.metric("gsync_thread_members") == 2, timeout=10, what="the member watched on both")


def test_a_member_published_to_the_own_relay_alone_has_its_replies_asked_within_a_reread(relay_factory,
                                                                                        gsync_factory):
    """A comment published to the own relay directly, after its thread was read: the
    self-subscription's next reread (every five minutes; a second here) reads the kinds
    thread members are, so a reply tagging only it, published to a remote alone, is asked
    for there then, not after the next read of the thread (a day later: the simulator's
    seed 5107 of a per-filter stress mix)."""
    own, remote = relay_factory(), relay_factory()
    repo = our_announcement(own, [remote], d="member-on-own")
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, bug])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], timers={"SELF_REREAD_SECS": 1})
    assert_arrives(own, [bug], what="the issue")
    wait_until(lambda: all(r["status"] == "connected" for r in gsync.status()["relays"]), timeout=60,
               what="the relay synced")
    now = int(time.time())
    member = alice.sign(1111, [["E", bug.id, "", bug.pubkey], ["K", "1621"], ["P", bug.pubkey],
                               ["e", bug.id, "", bug.pubkey], ["k", "1621"], ["p", bug.pubkey]],
                        "published to the own relay alone", now)
    publish(own.url, [member])
    wait_until(lambda: gsync.metric("gsync_thread_members") == 1, timeout=20, what="the member known")
    reply = carol.sign(7, [["e", member.id, "", member.pubkey]], "+", now)
    publish(remote.url, [reply])
    assert_arrives(own, [reply], timeout=20, what="the reply to a member the own relay alone holds")


def test_a_member_seen_on_one_relay_is_watched_on_every_relay_listing_its_repository(relay_factory,
                                                                                   gsync_factory):
    """Relay a holds a member that relay b lacks (b was down when it was published); a reply
    tagging only the member reached b alone: b is asked for the member's descendants too."""
    own, a, b = relay_factory(), relay_factory(), relay_factory()
    repo = our_announcement(own, [a, b], d="member-on-a")
    bug = f.issue(bob, repo)
    member = f.comment(alice, bug, content="relay b was down")
    on_b = carol.sign(1, [["e", member.id]], "reached relay b alone")
    publish(a.url, [repo, bug, member])
    publish(b.url, [repo, bug, on_b])
    publish(own.url, [repo])
    gsync_factory(own, [a, b])
    assert_arrives(own, [bug, member, on_b], timeout=30, what="the member from a, its reply from b")


@pytest.mark.slow
def test_thread_members_arriving_one_by_one_stay_within_the_subscription_budget(relay_factory,
                                                                               gsync_factory):
    """Each new direct member gets descendant coverage on the next descendants tick: live while
    a slot is free, then consolidated or polled, never past the relay's 20 subscriptions."""
    own, remote = relay_factory(), relay_factory()
    repo = our_announcement(own, [remote], d="busy-threads")
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, bug])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], timers={"DESCENDANT_TICK_SECS": 0.1, "MAINTENANCE_TICK_SECS": 0.2,
                                                 "POLL_SECS": 1})
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"], timeout=60,
               what="historic sync complete")

    def batches():
        return sum(1 for e in gsync.log_events() if e.get("event") == "batch_confirmed")

    members = []
    for i in range(30):  # one member per descendants tick: one small live REQ each
        done = batches()
        members.append(f.comment(alice, bug, content=f"member {i}"))
        publish(remote.url, members[-1:])
        # the tick that takes the member in also starts its descendants' historic batch
        wait_until(lambda done=done: batches() > done, timeout=20, interval=0.1, what=f"member {i} taken in")
    # created now, as a live event is: polled coverage asks from the last poll, minus 15 min
    child = carol.sign(1, [["e", members[-1].id]], "replies to the newest member",
                       created_at=int(time.time()))
    publish(remote.url, [child])
    assert_arrives(own, [child], timeout=30, what="a descendant of the newest member")
    peak = gsync.status()["relays"][0]["subscriptions_peak"]
    assert peak <= 20, f"{peak} subscriptions open at once on a relay that allows 20"


def test_two_sharded_instances_split_the_relays_and_together_sync_everything(relay_factory,
                                                                             gsync_factory):
    """[cluster] shard = 0/2 and 1/2 on the same own relay: each instance dials only its
    relays, every relay is dialled by one of them, and the own relay gets everything."""
    from gsync.sync.shard import Shard

    own = relay_factory()
    remotes = [relay_factory() for _ in range(3)]
    while len({Shard(0, 2).owns(r.url) for r in remotes}) < 2:  # both shards get work
        remotes.append(relay_factory())
    events, repos = [], []
    for i, remote in enumerate(remotes):
        repo = our_announcement(own, [remote], d=f"sharded-{i}")
        bug = f.issue(bob, repo)
        publish(remote.url, [repo, bug, f.comment(alice, bug)])
        events += [bug]
        repos.append(repo)
    publish(own.url, repos)
    instances = [gsync_factory(own, remotes, extra={"cluster": {"shard": f"{i}/2"}}) for i in range(2)]
    assert_arrives(own, events, what="every relay's events, from one instance or the other")
    dialled = [{r["relay"] for r in g.status()["relays"]} for g in instances]
    assert dialled[0].isdisjoint(dialled[1])
    assert dialled[0] | dialled[1] == {r.url for r in remotes}
    assert all(dialled), "each instance has relays of its own"


@pytest.mark.slow
def test_shards_split_the_remotes_and_together_sync_everything(relay_factory):
    """``gsync run --shard 0-of-2`` and ``1-of-2``, as the template unit gsync@.service runs
    them: two instances beside one own relay each dial only the remotes their shard owns
    (rendezvous hashing of the URL); together they bring every repository's history, and no
    remote is read by both."""
    from gsync.protocol.urls import normalize_relay_url
    from gsync.sync.shard import shard_of

    own = relay_factory()
    remotes = [relay_factory() for _ in range(3)]
    while len({shard_of(normalize_relay_url(r.url), 2) for r in remotes}) < 2:  # both get some
        remotes.append(relay_factory())
    announcements, history = [], []
    for i, remote in enumerate(remotes):
        repo = our_announcement(own, [remote], d=f"sharded-{i}")
        issue = f.issue(bob, repo, subject=f"only on {remote.url}")
        reply = f.comment(alice, issue)
        publish(remote.url, [repo, issue, reply])
        announcements.append(repo)
        history += [issue, reply]
    publish(own.url, announcements)
    instances = []
    for i in range(2):
        g = GsyncProcess(own, remotes)
        # --shard serves metrics on the file's port + i; the test keeps each on a port it
        # knows is free, as a container would with --metrics-listen.
        g.args = ("--shard", f"{i}-of-2", "--metrics-listen", f"127.0.0.1:{g.metrics_port}")
        instances.append(g)
    try:
        for g in instances:
            g.start()
        for i, g in enumerate(instances):
            started = wait_until(lambda g=g: [e for e in g.log_events() if e.get("event") == "started"],
                                 timeout=10, what="the started line")
            assert started[0]["shard"] == f"{i}/2"
        _shards_sync_their_own_remotes(own, remotes, history, instances)
    finally:
        for g in instances:
            g.terminate()


@pytest.mark.slow
@pytest.mark.long
def test_a_repository_listed_on_both_shards_is_fetched_by_the_shard_that_leads_it(relay_factory,
                                                                                  gsync_factory):
    """Repositories listing a relay of each shard: the shard owning a repository's lead relay
    fetches its history, the other waits for it to reach the own relay and then asks only
    for what is missing (NIP-77), so the two together receive about what one instance
    receives, not once per shard. With the leading shard away, the other fetches it all
    after its wait."""
    from gsync.protocol.urls import normalize_relay_url
    from gsync.sync.shard import lead_relay, shard_of

    # queries answered after 0.3 s: both shards ask at about the same time, and neither
    # finds the other's events on the own relay yet unless it waits for them
    remotes = [relay_factory(query_delay_ms=300), relay_factory(query_delay_ms=300)]
    while len({shard_of(normalize_relay_url(r.url), 2) for r in remotes}) < 2:
        remotes.append(relay_factory(query_delay_ms=300))
    by_shard = {shard_of(normalize_relay_url(r.url), 2): r for r in remotes}
    pair = [by_shard[0], by_shard[1]]
    urls = [normalize_relay_url(r.url) for r in pair]
    # the remotes' announcements name no own relay; each own relay gets its own copies
    # (same addresses, so the same lead relays)
    ids, history, led = [], [], set()
    while len(ids) < 4 or led != {0, 1}:  # each shard leads some of them
        d = f"both-shards-{len(ids)}"
        repo = f.announcement(alice, d, relays=[r.url for r in pair])
        at = 1_700_000_000 + 100 * len(ids)  # one event a second: pages end cleanly
        bug = f.issue(bob, repo, subject=f"bug {d}", created_at=at)
        fix = f.patch(alice, repo, created_at=at + 1)
        history += [bug, fix] + [f.comment(carol, root, content=f"reply {k}", created_at=at + 2 + 2 * k + j)
                                 for j, root in enumerate((bug, fix)) for k in range(12)]
        ids.append(d)
        led.add(shard_of(lead_relay(repo.address, urls), 2))
    for remote in pair:
        publish(remote.url, history)

    def sync(shards):
        """A fresh own relay synced by ``shards`` (indices of 2; None: one instance): the
        events they received from the remotes once every batch was done."""
        own = relay_factory()
        publish(own.url, [our_announcement(own, pair, d=d) for d in ids])
        instances = [gsync_factory(own, pair, extra={"cluster": {"shard": f"{i}/2"}} if i is not None else {})
                     for i in shards]
        assert_arrives(own, history, timeout=90, what=f"every repository's history, shards {shards}")
        wait_until(lambda: all(r["status"] == "connected" for g in instances for r in g.status()["relays"]),
                   timeout=60, what="every first sync done (the followers asked after their wait)")
        received = [g.metric("gsync_remote_events_total") for g in instances]
        for g in instances:
            g.terminate()
        return received

    # The three worlds share only the remotes, which they read: they run side by side.
    one, both, alone = run_side_by_side(lambda: sum(sync([None])), lambda: sum(sync([0, 1])),
                                        lambda: sync([0])[0])
    # without the lead each shard fetched every repository: twice what one instance does
    assert both <= 1.25 * one, f"two shards received {both:.0f} events, one instance {one:.0f}"
    # the leading shard away: shard 0 waits for shard 1's lead, then fetches it all itself
    # (``sync`` asserts that everything arrives)
    assert alone >= len(history)


def run_side_by_side(*calls):
    """Each of ``calls`` in a thread of its own; their results in order, or the first
    exception raised."""
    import threading

    results: list = [None] * len(calls)
    errors: list = []

    def run(i, call):
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _shards_sync_their_own_remotes(own, remotes, history, instances):
    from gsync.protocol.urls import normalize_relay_url
    from gsync.sync.shard import shard_of

    assert_arrives(own, history, what="every remote's history, through one instance or the other")
    dialled = [{r["relay"] for r in g.status()["relays"]} for g in instances]
    assert dialled[0].isdisjoint(dialled[1]) and dialled[0] | dialled[1] == {r.url for r in remotes}
    for i, gsync in enumerate(instances):
        for remote in remotes:
            read = gsync.metric("gsync_remote_events_total", relay=remote.url)
            if shard_of(normalize_relay_url(remote.url), 2) == i:
                assert read >= 2, f"shard {i}/2 did not sync its remote {remote.url}"
            else:
                assert read == 0, f"shard {i}/2 read {read} events from another shard's {remote.url}"
