"""The progress of a sync round (gsync/sync/progress.py): what is complete, the time left,
the operator's line; and, in process, that the manager feeds it from its tables for a first
sync and for a daily fresh start."""
import pytest

from gsync.io.inbox import NegentropyFinished, RemoteEvent, RemoteEvents
from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.protocol import messages as wire
from gsync.protocol.nip11 import RelayLimits
from gsync.sync.progress import (
    RelayWork,
    duration,
    progress_line,
    repos_complete,
    sync_progress,
)
from gsync.sync.repos import SyncLevel
from gsync.sync.status import ConnectionStatus
from gsync.sync.targets import SyncItems

from .factory import Author, announcement, issue
from .manager_harness import ManagerHarness

S = ConnectionStatus
A, B = "wss://a.example", "wss://b.example"


def syncing(url, queued=0, pages=0, gate=1.0, wait=0.0, delivered=0):
    return RelayWork(url, S.SYNCING, starts_queued=queued, pages_expected=pages, gate_secs=gate,
                     wait_secs=wait, events_delivered=delivered)


# -- the time left ----------------------------------------------------------------------------


def test_the_time_left_is_the_slowest_relays_queued_and_expected_starts_times_its_gate():
    p = sync_progress([syncing(A, queued=30, pages=10), syncing(B, queued=50, gate=0.5, wait=0.4)], 0, 0)
    assert p.secs_left == pytest.approx(40.0)  # A: 40 starts at 1 s; B: 0.4 + 50 × 0.5 = 25.4
    assert p.slowest == A
    assert p.starts_queued == 80


def test_a_relay_waiting_for_a_cooldown_adds_the_wait():
    p = sync_progress([syncing(A, queued=5, wait=120.0)], 0, 0)
    assert p.secs_left == pytest.approx(125.0)


def test_starts_slower_than_the_gate_count_at_the_pace_they_went():
    slow = RelayWork(A, S.SYNCING, starts_queued=10, gate_secs=1.0, pace_secs=2.5)
    assert sync_progress([slow], 0, 0).secs_left == pytest.approx(25.0)
    fast = RelayWork(A, S.SYNCING, starts_queued=10, gate_secs=1.0, pace_secs=0.2)  # never under the gate
    assert sync_progress([fast], 0, 0).secs_left == pytest.approx(10.0)
    gate_off = RelayWork(A, S.SYNCING, starts_queued=10, gate_secs=0.0, pace_secs=0.3)
    assert sync_progress([gate_off], 0, 0).secs_left == pytest.approx(3.0)


def test_the_pace_of_a_relays_starts_is_a_moving_average_of_their_gaps_without_idle_ones():
    from gsync.sync.health import PACE_IDLE_SECS, PACE_WEIGHT, RelayHealthTracker

    health = RelayHealthTracker(proactive_gap=1.0)
    health.record_success(A, 0.0)
    assert health.start_pace(A) is None and health.start_pace(B) is None
    for at in (10.0, 11.0, 12.0):
        health.record_start(A, at, background=True)
    assert health.start_pace(A) == pytest.approx(1.0)
    health.record_start(A, 12.5, background=False)  # a live REQ: not paced, not counted
    health.record_start(A, 15.0, background=True)
    assert health.start_pace(A) == pytest.approx(1.0 + PACE_WEIGHT * (3.0 - 1.0))
    health.record_start(A, 15.0 + PACE_IDLE_SECS + 1, background=True)  # nothing to start meanwhile
    assert health.start_pace(A) == pytest.approx(1.0 + PACE_WEIGHT * (3.0 - 1.0))
    health.record_success(A, 100.0)  # a new session: its own pace
    assert health.start_pace(A) is None


def test_a_syncing_relay_has_the_completion_checks_wait_left_even_with_nothing_queued():
    settling = RelayWork(A, S.SYNCING, gate_secs=1.0, settle_secs=1.5)
    assert sync_progress([settling], 0, 0).secs_left == pytest.approx(1.5)
    busy = RelayWork(A, S.SYNCING, starts_queued=4, gate_secs=1.0, settle_secs=1.5)
    assert sync_progress([busy], 0, 0).secs_left == pytest.approx(5.5)


def test_relays_not_syncing_leave_nothing_and_a_synced_world_has_no_time_left():
    done = RelayWork(A, S.CONNECTED, starts_queued=7, gate_secs=1.0)  # upkeep: not the round's
    gone = RelayWork(B, S.DISCONNECTED, starts_queued=0, gate_secs=1.0)
    p = sync_progress([done, gone], 3, 3)
    assert p.secs_left == 0.0 and p.slowest is None
    assert (p.relays_synced, p.relays_total, p.relays_syncing) == (1, 2, 0)


def test_with_the_gate_off_the_time_left_is_unknown_not_zero():
    p = sync_progress([syncing(A, queued=3, gate=0.0), syncing(B, queued=1)], 0, 0)
    assert p.secs_left is None
    assert "time left unknown" in progress_line(p.as_dict())
    # with nothing left to start, the gate does not matter
    assert sync_progress([syncing(A, gate=0.0)], 0, 0).secs_left == 0.0


def test_events_delivered_and_unreachable_relays_are_summed():
    parked = RelayWork("wss://c.example", S.DISCONNECTED, unreachable=True, events_delivered=4)
    p = sync_progress([syncing(A, delivered=10), syncing(B, delivered=5), parked], 0, 0)
    assert (p.events_delivered, p.relays_unreachable) == (19, 1)


# -- repositories complete ------------------------------------------------------------------------


def test_a_repository_is_complete_once_every_counted_relay_listing_it_confirmed_it():
    full, state_only = SyncLevel.FULL, SyncLevel.STATE_ONLY
    repos = [("30617:x:one", full, {A, B}), ("30617:x:two", full, {A}),
             ("30617:x:three", state_only, {B}), ("30617:x:four", full, {B})]
    confirmed = {A: SyncItems({"30617:x:one": full, "30617:x:two": full}),
                 B: SyncItems({"30617:x:three": state_only, "30617:x:four": state_only})}
    # one: B has not confirmed it; four: B confirmed it at StateOnly, it is Full now
    assert repos_complete(repos, confirmed, {A, B}) == 2
    # B unreachable (or another shard's): it holds nothing back
    assert repos_complete(repos, confirmed, {A}) == 4
    assert repos_complete(repos, {}, {A, B}) == 0


# -- the operator's line --------------------------------------------------------------------------


def test_the_progress_line_reads_at_a_glance():
    p = sync_progress([syncing(A, queued=42, pages=28, delivered=9000),
                       RelayWork(B, S.CONNECTED, events_delivered=12)], 30, 12)
    assert progress_line(p.as_dict()) == (
        f"syncing: 12/30 repos complete, 1/2 relays synced, 9,012 events delivered, "
        f"42 starts queued, about 1 min 10 s left (slowest: {A})")
    one = sync_progress([syncing(A, queued=1, wait=0.5)], 1, 0)
    assert progress_line(one.as_dict()).endswith(f"1 start queued, about 2 s left (slowest: {A})")
    done = sync_progress([RelayWork(A, S.CONNECTED, events_delivered=3),
                          RelayWork(B, S.DISCONNECTED, unreachable=True)], 2, 2)
    assert progress_line(done.as_dict()) == (
        "synced: 2/2 repos complete, 1/2 relays synced (1 unreachable), 3 events delivered")


@pytest.mark.parametrize(("secs", "text"), [(0, "0 s"), (59.4, "59 s"), (70, "1 min 10 s"),
                                            (3600, "1 h 0 min"), (12_345, "3 h 25 min")])
def test_durations_are_as_precise_as_a_glance_needs(secs, text):
    assert duration(secs) == text


# -- fed by the manager (in process, fake clock) ----------------------------------------------------


def listed_on(url, n):
    return [announcement(Author.named(f"p{i}"), f"r{i}", relays=[url]) for i in range(n)]


def page_of(h, url, sub_id, events):
    """``url`` sends ``events`` on its historic ``sub_id``, matched as its connection would."""
    state = h.state(url)
    filters = state.current.pending[state.current.sub_to_batch[sub_id]].pagination[sub_id].page_filters
    h.feed(RemoteEvents(url, state.session, [
        RemoteEvent(url, state.session, sub_id, e, matched=tuple(i for i, f in enumerate(filters) if f.matches(e)))
        for e in events]))


def nothing_missing(h, url):
    """``url``'s NIP-77 exchanges under way conclude, finding nothing missing."""
    state = h.state(url)
    for g in [g for g in h.effects.spawned if g.name == "reconcile_filter" and g.args[0] is h.conn(url)]:
        h.effects.spawned.remove(g)
        h.feed(NegentropyFinished(url, state.session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2],
                                  NegentropyOutcome(True, need_ids=[], rounds=1)))


def progress(h):
    return h.manager.status_snapshot()["progress"]


def test_a_first_sync_and_a_daily_fresh_start_show_their_progress(tmp_path):
    h = ManagerHarness(tmp_path)  # the default gate: a start a second
    repos = listed_on(A, 3)
    h.own_relay_holds(*repos)
    h.connect(A, limits=RelayLimits(max_filters=2))  # two filters a REQ: starts wait for the gate
    h.answer_own_reads()  # it holds nothing: REQ pages
    first = progress(h)
    assert (first["repos_complete"], first["repos_total"]) == (0, 3)
    assert (first["relays_synced"], first["relays_total"], first["relays_syncing"]) == (0, 1, 1)
    assert first["starts_queued"] >= 1
    settle = h.config.sync.batch_window_ms / 1000 + 1  # the Syncing → Connected check's wait
    expected = first["starts_queued"] + h.manager.status_snapshot()["relays"][0]["pages_expected"]
    assert first["secs_left"] == pytest.approx(expected + settle, abs=1.0)
    # A full page of repository events: that filter has more pages, and their roots threads.
    h.advance(3)
    layer2 = next(r for r in h.historic_reqs(A) if any("#a" in flt for flt in r[2:]))
    bob = Author.named("bob")
    page_of(h, A, layer2[1], [issue(bob, repos[0], subject=f"bug {i}") for i in range(500)])
    h.relay_says(A, wire.Eose(layer2[1]))
    relay = h.manager.status_snapshot()["relays"][0]
    assert relay["pages_expected"] == 2  # one page taken: one more expected, and a start for its roots
    assert progress(h)["secs_left"] >= relay["starts_queued"] + 2
    h.settle(A)
    done = progress(h)
    assert (done["repos_complete"], done["relays_synced"], done["relays_syncing"]) == (3, 1, 0)
    assert done["secs_left"] == 0
    # the daily fresh start: the relay's repositories are to be synced again
    h.state(A).next_daily_at = h.clock.now
    h.tick()
    daily = progress(h)
    assert (daily["repos_complete"], daily["relays_synced"], daily["relays_syncing"]) == (0, 0, 1)
    assert daily["secs_left"] > 0
    h.settle(A)
    nothing_missing(h, A)  # the 500 issues it now holds: that filter goes by NIP-77
    h.settle(A)
    assert progress(h)["repos_complete"] == 3


def test_filters_waiting_for_the_own_relays_holdings_count_a_start_each_until_their_methods_are_chosen(tmp_path):
    """A read of loopback takes a second, or seconds on a loaded machine (CI: 7 s of a 38 s
    first sync, while the queue alone said 2 s were left): what waits for it is work to come."""
    h = ManagerHarness(tmp_path)
    repos = listed_on(A, 3)
    h.own_relay_holds(*repos)
    h.connect(A)
    relay = h.manager.status_snapshot()["relays"][0]
    reading = relay["starts_reading_own"]
    assert reading >= 1  # the first sync's filters, before their holdings are read
    settle = h.config.sync.batch_window_ms / 1000 + 1
    assert progress(h)["secs_left"] == pytest.approx(relay["starts_queued"] + reading + settle, abs=1.0)
    h.answer_own_reads()
    relay = h.manager.status_snapshot()["relays"][0]
    assert relay["starts_reading_own"] == 0  # their methods chosen: their starts queued, or gone


def test_the_gauges_follow_the_progress_and_keep_one_series_per_relay_in_the_table(tmp_path):
    from gsync.ops import metrics

    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 2))
    h.connect(A, limits=RelayLimits(max_filters=2))  # two filters a REQ: starts wait for the gate
    h.answer_own_reads()
    h.manager.update_metrics(h.clock.now)
    assert metrics.SYNC_SECONDS_LEFT._value.get() > 0
    assert metrics.STARTS_QUEUED.labels(A)._value.get() >= 1
    h.settle(A)
    h.manager.update_metrics(h.clock.now)
    assert metrics.SYNC_REPOS_COMPLETE._value.get() == 2
    assert metrics.SYNC_RELAYS_SYNCED._value.get() == 1
    assert metrics.SYNC_SECONDS_LEFT._value.get() == 0
    metrics.forget_relay(A)
    relays = {s.labels.get("relay") for fam in metrics.STARTS_QUEUED.collect() for s in fam.samples}
    assert A not in relays


def test_a_relays_gauges_follow_each_change_across_scrapes(tmp_path):
    """update_metrics sets a relay's gauges only when their value changed (issue 41: most
    scrapes find them as they were): each scrape still reads the relay as it is now, back
    and forth."""
    from gsync.io.inbox import RelayDisconnected
    from gsync.ops import metrics

    def scrape():
        h.manager.update_metrics(h.clock.now)
        return (metrics.RELAY_CONNECTED.labels(A)._value.get(), metrics.RELAY_FAILURES.labels(A)._value.get(),
                metrics.STARTS_QUEUED.labels(A)._value.get())

    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 2))
    h.connect(A, limits=RelayLimits(max_filters=2))
    h.answer_own_reads()
    syncing_now = scrape()
    assert syncing_now[0] == int(ConnectionStatus.SYNCING) and syncing_now[2] >= 1
    assert scrape() == syncing_now  # nothing changed: the same values
    h.settle(A)
    assert scrape()[2] == 0
    h.feed(RelayDisconnected(A, h.state(A).session, "connection closed"))
    connected, failures, queued = scrape()
    assert (connected, failures, queued) == (int(h.state(A).status), 1, 0) and connected != syncing_now[0]
    h.advance(3600)
    h.connect(A)
    assert scrape()[0] == int(h.state(A).status) != connected


def test_each_page_of_a_filter_counts_the_pages_before_it_and_its_split_pieces_keep_the_count():
    from gsync.protocol.filters import Filter
    from gsync.sync.pending import FilterPaginationState, PageCap

    repos = [f"30617:{'a' * 64}:r{i}" for i in range(4)]
    cap, bob = PageCap.per_filter(80), Author.named("bob")
    state = FilterPaginationState.start(Filter.make(tags={"a": repos}))
    for n in range(3):
        assert state.pages == n
        for i in range(80):
            state.record(issue(bob, repos[i % 4], created_at=1_700_000_000 - 100 * n - i), own=True)
        state = state.next_page(cap)
    assert state.pages == 3
    assert [piece.pages for piece in state.split(2)] == [3, 3]


def test_a_relay_whose_answers_are_slower_than_the_gate_is_counted_at_the_pace_it_goes(tmp_path):
    """One filter a REQ, one historic REQ open at once, answers after 4 s: the starts go 4 s
    apart, not 1 s, and so does the time left."""
    from gsync.protocol.nip11 import RelayLimits

    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 3))
    h.connect(A, limits=RelayLimits(max_subscriptions=4, max_filters=1))
    h.answer_own_reads()
    for _ in range(3):
        h.advance(4)
        for sub_id in set(h.conn(A).subscriptions) - set(h.state(A).current.live_subs):
            h.relay_says(A, wire.Eose(sub_id))
    relay = h.manager.status_snapshot()["relays"][0]
    assert relay["starts_queued"] >= 1
    pace = h.manager.health.start_pace(A)
    assert pace > 3.0
    expected = relay["starts_queued"] + relay["pages_expected"]
    wait = max(0.0, h.manager.health.may_start_background(A, h.clock.now))
    settle = h.config.sync.batch_window_ms / 1000 + 1
    assert progress(h)["secs_left"] == pytest.approx(wait + expected * pace + settle, abs=0.1)


def test_a_scrape_of_metrics_reads_the_progress_of_now_without_a_tick(tmp_path):
    """The gauges read from the manager's tables are set when /metrics is scraped (the tick
    no longer sets them every 2 s): a scrape shows the round as it is."""
    from gsync.ops import metrics
    from gsync.ops.http import make_app

    def scrape(name: str, relay: str | None = None) -> float:
        body = b"".join(make_app(h.manager)({"PATH_INFO": "/metrics"}, lambda status, headers: None)).decode()
        label = "" if relay is None else f'{{relay="{relay}"}}'
        return next(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(name + label + " "))

    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 2))
    h.connect(A, limits=RelayLimits(max_filters=2))  # two filters a REQ: starts wait for the gate
    h.answer_own_reads()
    assert scrape("gsync_starts_queued", A) >= 1
    assert scrape("gsync_sync_seconds_left") > 0
    assert scrape("ngit_sync_relays_connected_total") == 1
    h.settle(A)  # no tick between the scrapes: what /metrics shows is read at the scrape
    assert scrape("gsync_sync_repositories_complete") == 2
    assert scrape("gsync_sync_seconds_left") == 0
    metrics.forget_relay(A)


def test_a_relays_status_gauge_shows_the_health_of_now_after_the_refusals_set_it(tmp_path):
    """A scrape sets a relay's status only when it changed since that relay's last; the
    refusals set it too (a rate limit begins, a probe is served): a scrape after them
    compares with what they set, so the health of now is what shows."""
    from gsync import constants
    from gsync.ops import metrics

    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 1))
    h.connect(A)
    h.answer_own_reads()
    m, state = h.manager, h.manager.relays[A]
    gauge = metrics.RELAY_STATUS.labels(A)
    now = m.clock()
    m.update_metrics(now)
    healthy = gauge._value.get()
    m.health.record_rate_limited(A, now)
    m.refusals.update_health_metric(state, now)  # as note_rate_limited does
    limited = gauge._value.get()
    assert limited != healthy  # (no scrape while it lasts)
    later = now + constants.RATE_LIMIT_COOLDOWN_SECS + 1
    m.health.record_request_succeeded(A, later)  # the probe served: healthy again, and no refusal said so
    m.update_metrics(later)
    assert gauge._value.get() == healthy
    metrics.forget_relay(A)
