"""Live coverage polled for want of subscription room, beside live subscriptions that
fragmented as coverage came a little at a time (thread members, one small REQ a tick), in
one process (tests/manager_harness.py): one consolidation packs it live, and the polls stop.
Found by the simulator (seed 4's year, day 244: a relay allowing 10 subscriptions, its
members' coverage polled every 5 s for hours, ``busy_loop``)."""
import pytest

from gsync import constants
from gsync.io.inbox import NegentropyFinished
from gsync.io.manager.coverage import member_filters
from gsync.io.manager.live import LIVE_SUB_PREFIX, LiveCoverage
from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter
from gsync.protocol.nip11 import RelayLimits
from gsync.sync.policy import coverage_key

from .factory import Author, announcement, issue
from .manager_harness import ManagerHarness

A = "wss://a.example"
owner = Author.named("owner")


pytestmark = pytest.mark.usefixtures("answers_are_prompt")  # (conftest.py: the loop answers late)


def polls_sent(h, since: float) -> int:
    return sum(1 for at, _ in h.historic_reqs(A, times=True) if at >= since)


def test_polled_coverage_beside_fragmented_subscriptions_is_consolidated_and_no_longer_polled(tmp_path, monkeypatch):
    # (every historic REQ of the second half hour counts as a poll here: not the hourly live
    # audit's, which has tests of its own)
    monkeypatch.setattr(constants, "LIVE_AUDIT_SECS", 10.0 ** 9)
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "r", relays=[A]))
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    state, live = h.state(A), h.manager.live
    for n in range(12):  # thread members one at a time, as descendants.run opens them
        ids = {f"{n + 1:064x}"}
        state.current.members |= ids
        live.open_members(state, member_filters(state, ids), fresh=True)
    assert state.fresh_polled.filters, "past the budget: polled"
    assert state.current.data_live_subs() == 7, "the budget full of one-member REQs"
    start = h.clock.now
    for _ in range(360):  # an hour, its polls answered with nothing
        h.advance(10)
        h.tick()
        h.eose_all(A)
    assert not (state.fresh_polled.filters or state.polled.filters), "all of it live"
    assert state.current.data_live_subs() < 7, "packed"
    assert polls_sent(h, start + 1800) == 0, "no polls the second half hour"
    assert polls_sent(h, start) < 150


def live_reqs_with(h, value: str) -> list:
    """The live REQs (``limit: 0``) sent this session that ask ``value`` of some tag."""
    return [f for f in h.reqs(A) if all(flt.get("limit") == 0 for flt in f[2:])
            and any(value in vals for flt in f[2:] for key, vals in flt.items() if key.startswith("#"))]


def _polled_beside_room(tmp_path):
    """Seven members' live REQs fill a relay's seven live slots; it refuses ``#e``: the
    first REQ closed is split by shape with no room (its other shapes polled), the next,
    ``#e`` alone, pauses the shape and frees its slot."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "r", relays=[A]))
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    state, live = h.state(A), h.manager.live
    for n in range(7):  # thread members one at a time: the seven slots full
        ids = {f"{n + 1:064x}"}
        state.current.members |= ids
        live.open_members(state, member_filters(state, ids), fresh=True)
    members = [s for s, sub in state.current.live_subs.items() if sub.descendants]
    h.relay_says(A, wire.Closed(members[0], wire.Prefix.BLOCKED, "#e queries are not allowed here"))
    alone = [s for s, sub in state.current.live_subs.items() if [f.tags[0][0] for f in sub.filters if f.tags] == ["e"]]
    h.relay_says(A, wire.Closed(alone[0], wire.Prefix.BLOCKED, "#e queries are not allowed here"))
    polled = {v for f in state.paused.allowed(state.fresh_polled.filters + state.polled.filters)
              for _, vals in f.tags for v in vals}
    assert polled and state.current.data_live_subs() < 7, "polled beside a free slot"
    return h, state, polled


def test_coverage_polled_for_want_of_room_goes_live_once_a_refusal_frees_room(tmp_path):
    """Seed 74's 60 days (the simulator's, day 47.01; no invariant broke): relay3 refused
    ``#e`` by policy. The first live REQ it closed was split by shape with no room left, so
    its other shapes were polled; the next, ``#e`` alone, paused the shape and freed its
    slot, and more went as the paused shape left the open REQs. Polled coverage with room
    beside it was polled every 6.2 s for the 14 hours the run had left (consolidation looks
    only at a full budget). Once there is room, polled coverage goes live, one last poll
    fetching what came since the previous one, and the polls stop."""
    h, state, polled = _polled_beside_room(tmp_path)
    start = h.clock.now
    for _ in range(90):  # a quarter of an hour, its polls answered with nothing
        h.advance(10)
        h.tick()
        h.eose_all(A)
    assert not state.paused.allowed(state.fresh_polled.filters + state.polled.filters), "all of it live"
    assert all(live_reqs_with(h, v) for v in polled), "each polled value asked live"
    assert polls_sent(h, start + 700) == 0, "no polls once live"




def test_a_poll_of_shapes_that_go_alone_is_spaced_by_the_reqs_it_takes(tmp_path):
    """Seed 515's year (day 58.42, ``busy_loop``): relay5 allows 5 subscriptions, its two
    live slots full; it had refused ``#e`` and ``#q`` once, so they go alone since, even
    restored by their probes. Its polled thread coverage went as three REQs, each a
    subscription and one of its paced starts; spaced by its bytes alone, it was asked every
    5 s for the rest of the session. Spaced 5 s for every REQ it takes, it is asked at most
    every 15 s."""
    reqs = polls_in_half_an_hour(ManagerHarness(tmp_path))  # 29 minutes; a poll is three REQs (#E; #e; #q)
    assert 174 <= reqs <= 351, f"{reqs} REQs: 116 polls 15 s apart take 348 (5 s apart: 870)"


def test_a_poll_of_a_relay_paced_by_its_refusals_takes_half_its_pace(tmp_path):
    """Seed 983 of the 30-relay world: relay24, whose query-rate refusals taught a start
    every 10 s, had 117 filters polled, 5 s a REQ: each poll began as the last ended, a REQ
    every 10 s all day, every other start waiting behind them. Spaced twice its pace a REQ,
    polls take half of it."""
    h = ManagerHarness(tmp_path)
    h.manager.health.restore(A, {"learned_gap": 10.0, "learned_at": h.clock.now})  # (a week's pace, saved)
    reqs = polls_in_half_an_hour(h)
    assert 60 <= reqs <= 90, f"{reqs} REQs: a poll of three every 60 s takes 87 (as fast as the pace allows: 174)"


def polls_in_half_an_hour(h) -> int:
    """Polled thread coverage of six members on a relay of two live slots, ``#e`` and ``#q``
    going alone (three REQs a poll): the poll REQs of half an hour but its first minute, each
    answered with nothing."""
    h.own_relay_holds(announcement(owner, "r", relays=[A]))
    h.connect(A, limits=RelayLimits(max_subscriptions=5))
    h.settle(A)
    state, live = h.state(A), h.manager.live
    for shape in ("e", "q"):  # refused once, restored by the probe: alone from then on
        state.paused.pause(coverage_key(Filter.make(tags={shape: ["0" * 64]})), h.clock.now)
    for key in state.paused.due_probes(float("inf")):
        state.paused.probe_passed(key)
    for n in range(6):  # thread members one at a time, as descendants.run opens them
        ids = {f"{n + 1:064x}"}
        state.current.members |= ids
        live.open_members(state, member_filters(state, ids), fresh=True)
    polled = state.fresh_polled.filters + state.polled.filters
    assert {f.tags[0][0] for f in polled} == {"e", "E", "q"}, "polled, its #e and #q alone"
    start = h.clock.now
    for _ in range(900):  # half an hour, polls answered with nothing
        h.advance(2)
        h.tick()
        h.eose_all(A)
    return polls_sent(h, start + 60)


def test_coverage_whose_shapes_go_alone_is_packed_once_not_every_ten_minutes(tmp_path):
    """Seed 983 of the simulator's 30-relay world (left_behind, day 5.9): relay24 takes 3
    filters a REQ and 20 values a list; two thread shapes went alone after a refusal. Its
    coverage was packed three shapes a REQ and split by shape when opened, so the count of
    live REQs a consolidation reads (a third of what opening took) said packing anew would
    free room: consolidated every ten minutes for days, each time to the same
    subscriptions, each time with a catch-up of about a hundred REQs of one filter; its
    queue grew by a hundred an hour, its sync never ended, and an import there waited for the
    next day. Packed apart by shape (``CoveragePauses.pack_key``), what is counted is what
    opening takes: one consolidation, then none."""
    h, start = _shapes_alone_past_the_budget(tmp_path)
    assert live_rebuilds(h, start) == [], "consolidated again"


def _shapes_alone_past_the_budget(tmp_path):
    """Coverage past a relay's seven live slots (3 filters a REQ, 5 values a list), #e and
    #q going alone, rebuilt as they go; then an hour, every REQ answered with nothing.
    (The harness, and when the hour began.)"""
    h = ManagerHarness(tmp_path)
    repos = [announcement(owner, f"r{n}", relays=[A]) for n in range(12)]
    h.own_relay_holds(*repos, *[issue(owner, r, subject=f"issue {i}") for r in repos for i in range(8)])
    h.connect(A, limits=RelayLimits(max_subscriptions=10, max_filters=3, max_values=5))
    state = h.state(A)
    for shape in ("e", "q"):  # refused once, restored by the probe: alone from then on
        state.paused.pause(coverage_key(Filter.make(tags={shape: ["0" * 64]})), h.clock.now)
    for key in state.paused.due_probes(float("inf")):
        state.paused.probe_passed(key)
    h.settle(A)
    h.manager.live.consolidate(state)  # (a rebuild: every shape as it goes now)
    h.settle(A)
    assert state.polled.filters or state.fresh_polled.filters, "past the budget: polled"
    start = h.clock.now
    for _ in range(1800):
        h.advance(2)
        h.tick()
        h.eose_all(A)
    return h, start


def live_rebuilds(h, since: float) -> list[float]:
    """When live REQs were closed since ``since`` (a consolidation closes every one), a time
    per rebuild."""
    conn = h.conn(A)
    return sorted({at for at, f in zip(conn.sent_at, conn.frames, strict=True)
                   if at > since and f[0] == "CLOSE" and f[1].startswith(LIVE_SUB_PREFIX)})


def test_a_consolidation_that_takes_more_than_counted_is_not_repeated_for_the_same_coverage(tmp_path, monkeypatch):
    """Whatever else may make a count of live REQs miss what opening takes (seed 983's was
    a shape going alone): a consolidation for fragmentation that takes more than it was
    counted to has later counts corrected by as much, so the same subscriptions are not
    rebuilt every ten minutes. Here the count says packing anew takes one REQ."""
    monkeypatch.setattr(LiveCoverage, "baseline", lambda self, state, adding=None: 1)
    h, start = _shapes_alone_past_the_budget(tmp_path)
    assert len(live_rebuilds(h, start)) <= 1, "rebuilt every ten minutes"


def close_live_subs(h) -> int:
    """The relay closes every open live REQ (no reason), as one that keeps none does after
    its EOSE. How many it closed."""
    state = h.state(A)
    closed = list(state.current.live_subs)
    for sub_id in closed:
        h.relay_says(A, wire.Eose(sub_id))
        h.relay_says(A, wire.parse_relay_message('["CLOSED","' + sub_id + '",""]'))
    return len(closed)


def test_a_relay_that_keeps_no_live_req_is_polled_every_5_minutes_and_not_asked_live_again(tmp_path):
    """A relay closing every subscription after its EOSE (PEERS.md), live ones too: each
    live REQ is rebuilt once, closed again within the minute, and its coverage polled. Found
    by the simulator with every relay so: polled three REQs every 16 s for good (the cadence
    of coverage that does not fit), and asked live again every 10 minutes. Now every 5 minutes
    at most, and polled for the rest of the session (a poll is one REQ a filter here: nothing
    proves this relay answers several filters of a REQ, ``sync.one_filter``)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "r", relays=[A]))
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    state = h.state(A)
    assert close_live_subs(h) > 0  # rebuilt once
    h.advance(5)
    assert close_live_subs(h) > 0  # closed again within the minute: polled
    assert state.polled.filters and not state.current.live_subs
    start = h.clock.now
    for _ in range(1800):  # an hour, polls answered with nothing, then closed
        h.advance(2)
        h.tick()
        for sub_id in list(h.conn(A).subscriptions):
            h.relay_says(A, wire.Eose(sub_id))
            h.relay_says(A, wire.parse_relay_message('["CLOSED","' + sub_id + '",""]'))
    conn = h.conn(A)
    live_again = [f for at, f in zip(conn.sent_at, conn.frames, strict=True) if at > start and f[0] == "REQ"
                  and all(flt.get("limit") == 0 for flt in f[2:])]
    assert not live_again, "not asked live again"
    polls = polls_sent(h, start + 60)
    per_poll = len(state.polled.filters)
    assert 8 * per_poll <= polls <= 12 * per_poll, \
        f"{polls} REQs in 59 minutes: a poll ({per_poll} REQs) every 5 minutes"
    # new coverage there (a repository announced) is polled too, not asked live first
    later = h.clock.now
    h.own_relay_holds(announcement(owner, "r2", relays=[A]))
    for _ in range(30):
        h.advance(2)
        h.tick()
        h.eose_all(A)
    assert not [f for at, f in zip(conn.sent_at, conn.frames, strict=True) if at > later and f[0] == "REQ"
                and all(flt.get("limit") == 0 for flt in f[2:])], "asked live"
    assert any("r2" in flt.to_json() for flt in state.fresh_polled.filters + state.polled.filters)


def test_a_rebuilt_live_req_held_by_the_relays_pace_counts_its_minute_from_when_it_went(tmp_path, monkeypatch):
    """Seed 260 of the stress mix with ``--per-filter 0.5`` (left_behind, day 19.88): a relay
    closing every subscription after its EOSE, whose learned pace spaced gsync's starts; its
    eight rebuilt live REQs went one by one, each more than a minute after its rebuild, so
    each close looked like the first: rebuilt again, for ever, 7,700 live REQs a day, and
    never a poll (an issue published there waited for the daily sync). A rebuild's minute now
    counts from when its REQ goes."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "r", relays=[A]))
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    state = h.state(A)
    held_until = [h.clock.now + 90]  # the relay's pace holds live starts a minute and a half
    real = h.manager.health.may_start_live
    monkeypatch.setattr(h.manager.health, "may_start_live",
                        lambda url, now: max(0.0, held_until[0] - now) or real(url, now))
    assert close_live_subs(h) > 0  # rebuilt, waiting for the pace
    assert not any(sub in h.conn(A).subscriptions for sub in state.current.live_subs)
    h.advance(91)
    assert all(sub in h.conn(A).subscriptions for sub in state.current.live_subs)  # gone now
    assert close_live_subs(h) > 0  # closed after their EOSE, as soon as they went: polled
    assert state.current.live_not_kept and state.polled.filters and not state.current.live_subs


def test_a_relay_that_keeps_no_live_req_and_is_not_proven_to_answer_several_filters_is_polled_one_a_req(tmp_path):
    """Seed 803 of an every-behaviour world (left_behind): relay13 answers a REQ's first
    filter alone and closes every subscription after its EOSE; it held little of ours, so no
    answer ever needed two filters and its probes found nothing: never proven either way. Its
    polls of 8 and 3 filters left a state event published to it for its next daily sync. Such
    a relay's polls ask one filter a REQ (each is then the first, and the last); proven to
    answer several (an answer needing two filters), they are packed again."""
    h = ManagerHarness(tmp_path)
    repo = announcement(owner, "r", relays=[A])
    h.own_relay_holds(repo)
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    state = h.state(A)
    close_live_subs(h)
    h.advance(5)
    close_live_subs(h)
    assert state.current.live_not_kept and not state.filters_answered

    def next_poll():
        start = h.clock.now
        for _ in range(200):
            h.advance(2)
            h.tick()
            sent = [f for at, f in h.historic_reqs(A, times=True) if at > start]
            for sub_id in list(h.conn(A).subscriptions):
                h.relay_says(A, wire.Eose(sub_id))
                h.relay_says(A, wire.parse_relay_message('["CLOSED","' + sub_id + '",""]'))
            if sent and h.clock.now - start > 60:
                return sent
        raise AssertionError("no poll")

    polled = state.polled.filters + state.fresh_polled.filters
    assert len(polled) >= 2
    poll = next_poll()
    assert all(len(req) == 3 for req in poll), [len(req) - 2 for req in poll]  # ["REQ", id, one filter]
    assert any(req[2].get("kinds") == [30618] for req in poll)  # the state filter, alone

    state.filters_answered = True  # (an answer needed two filters)
    poll = next_poll()
    assert any(len(req) > 3 for req in poll), [len(req) - 2 for req in poll]


def _polled_one_a_req(tmp_path):
    """A relay keeping no live REQ, nothing it held ever needing two filters of a REQ: its
    polls ask one filter a REQ (the test above)."""
    h = ManagerHarness(tmp_path)
    repo = announcement(owner, "r", relays=[A])
    h.own_relay_holds(repo)
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    close_live_subs(h)
    h.advance(5)
    close_live_subs(h)
    state = h.state(A)
    assert state.current.live_not_kept and not state.filters_answered and not state.proof_ids
    return h, repo, state


def _answer_open_reqs(h, serve) -> None:
    """Every open REQ on A answered (``serve(filters)``: the events sent first, those of
    them its filters match), ended and closed, as a relay keeping no subscription does."""
    for sub_id, filters in list(h.conn(A).subscriptions.items()):
        events = [e for e in serve(filters) if filters.matching(e)]
        if events:
            h.relay_sends(A, sub_id, *events)
        h.relay_says(A, wire.Eose(sub_id))
        h.relay_says(A, wire.parse_relay_message('["CLOSED","' + sub_id + '",""]'))


def _until_reqs(h, serve, done, rounds=400) -> list:
    """Ticks of 2 s, every open REQ answered (``_answer_open_reqs``), until ``done(sent)``
    of the historic REQs sent meanwhile. Those REQs."""
    start = h.clock.now
    for _ in range(rounds):
        h.advance(2)
        h.tick()
        _answer_open_reqs(h, serve)
        sent = [f for at, f in h.historic_reqs(A, times=True) if at > start]
        if done(sent):
            return sent
    raise AssertionError(f"not done: {sent}")


def _proof_reqs(sent) -> list:
    return [r for r in sent if len(r) == 4 and all(set(f) == {"ids"} and len(f["ids"]) == 1 for f in r[2:])]


def test_a_relay_polled_one_filter_a_req_is_proven_to_answer_several_by_two_events_it_served(tmp_path):
    """The simulator, seeds 1004 and 1006 of the default world: a relay closing every
    subscription after its EOSE and syncing by NIP-77 (no REQ of several filters ever
    answered) was polled one filter a REQ all month, 15-17 REQs every 5 minutes, 30 times
    another relay's messages. Once it has served two events, they are asked back in one REQ
    of two filters (``{"ids": [a]}``, ``{"ids": [b]}``); both served prove it answers several,
    and its polls are packed again."""
    h, repo, state = _polled_one_a_req(tmp_path)
    bugs = [issue(Author.named("reporter"), repo, subject=f"bug {n}", created_at=int(h.clock.now) + 60 + n)
            for n in range(2)]
    sent = _until_reqs(h, lambda filters: bugs, _proof_reqs)
    (proof,) = _proof_reqs(sent)
    assert {f["ids"][0] for f in proof[2:]} == {b.id for b in bugs}
    assert all(len(r) == 3 for r in sent if r is not proof)  # the poll: one filter a REQ
    assert not state.filters_answered
    _answer_open_reqs(h, lambda filters: bugs)
    assert state.filters_answered  # both served, each by its own filter
    poll = _until_reqs(h, lambda filters: (), lambda sent: len(sent) > 0)
    assert any(len(req) > 3 for req in poll), [len(req) - 2 for req in poll]  # packed again


def test_a_relay_serving_one_filter_of_the_proof_is_learnt_to_answer_one_filter_a_req(tmp_path):
    """The proof's answer with one of the two events (a relay reading ``filters[0]`` alone) is
    a suspect answer: the other filter is probed alone, and served so, the relay is learnt to
    answer one filter a REQ (``max_filters`` 1, kept). Not asked again before its next daily
    fresh start."""
    h, repo, state = _polled_one_a_req(tmp_path)
    bugs = [issue(Author.named("reporter"), repo, subject=f"bug {n}", created_at=int(h.clock.now) + 60 + n)
            for n in range(2)]

    def first_filter_only(filters):
        ids = filters.filters[0].ids
        return [b for b in bugs if b.id in ids] if ids else bugs

    _until_reqs(h, first_filter_only, lambda sent: state.max_filters_learned == 1)
    assert len(_proof_reqs(h.historic_reqs(A))) == 1 and not state.filters_answered
    later = _until_reqs(h, lambda filters: (), lambda sent: len(sent) >= 20)  # four polls and more
    assert not _proof_reqs(later), "asked again the same day"
    # the next day (its daily fresh start), nothing to prove of a relay learnt to answer one
    # filter a REQ (the proof's one-filter answer would start its sync again, every day)
    state.filters_proof_asked = False
    more = [issue(Author.named("reporter"), repo, subject=f"bug {n}", created_at=int(h.clock.now) - 60 + n)
            for n in range(2, 4)]
    later = _until_reqs(h, lambda filters: more, lambda sent: len(sent) >= 10)  # two polls
    assert not _proof_reqs(later) and set(state.proof_ids) == {e.id for e in more}



def test_a_relay_syncing_by_nip77_and_serving_nothing_is_proven_by_two_events_found_on_both_sides(tmp_path):
    """The simulator, seed 1020 of the default world: relay6 closes every subscription after
    its EOSE and syncs by NIP-77, holding nothing the own relay lacks; quiet, its polls bring
    nothing. No event it served could give the proof, and it was polled one filter a REQ all
    month (6-7 REQs every 5 minutes, a third of the seed's messages). Two events its
    exchanges found on both sides (the own relay's, not lacked by the relay) are the proof's;
    both served, its polls are packed again."""
    h = ManagerHarness(tmp_path)
    repo = announcement(owner, "r", relays=[A])
    start = int(h.clock.now) - 86400
    bugs = [issue(owner, repo, subject=f"bug {n}", created_at=start + n) for n in range(150)]
    h.own_relay_holds(repo)
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    state = h.state(A)
    lacked = bugs[-1]  # the newest: the relay lacks it
    found: list[tuple] = []
    for _ in range(60):
        # enough held of the repository's filter that it goes by NIP-77 (sync.method)
        h.answer_own_reads(held=lambda flt: [(e.created_at, e.id) for e in bugs if flt.matches(e)])
        h.advance(1.1)
        close_live_subs(h)
        for g in [g for g in h.effects.spawned if g.name == "reconcile_filter"]:
            h.effects.spawned.remove(g)
            items = g.kwargs["held"]
            outcome = NegentropyOutcome(True, have_ids=[lacked.id] if items else [], rounds=1)
            outcome.note_held_both(items)
            found.append(outcome.held_both)
            h.feed(NegentropyFinished(A, state.session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2], outcome))
        if _proof_reqs(h.historic_reqs(A)):
            break
        _answer_open_reqs(h, lambda filters: ())
    else:
        raise AssertionError(f"no proof asked: {found}")
    assert (bugs[-2].id, bugs[-3].id) in found, "the newest two held on both sides"
    assert state.current.live_not_kept and not state.filters_answered
    (proof,) = _proof_reqs(h.historic_reqs(A))
    assert {f["ids"][0] for f in proof[2:]} == {bugs[-2].id, bugs[-3].id}
    _answer_open_reqs(h, lambda filters: bugs)
    assert state.filters_answered  # both served, each by its own filter
    poll = _until_reqs(h, lambda filters: (), lambda sent: len(sent) > 0)
    assert any(len(req) > 3 for req in poll), [len(req) - 2 for req in poll]  # packed again


def test_a_rebuild_while_the_last_rebuilds_catch_up_waits_queues_only_what_of_it_went(tmp_path):
    """A relay whose pace spaces its starts 10 s apart takes minutes over a catch-up of
    dozens of REQs, and a full budget may be rebuilt once a minute, each rebuild with a
    catch-up of its swap (the last 15 minutes of all its coverage): the queue grew by a
    whole catch-up a rebuild (seed 983's relay24, a hundred REQs an hour). A filter an
    earlier catch-up still has queued, from an earlier time, is asked by that one after
    this swap too: only what went already is queued again."""
    h = ManagerHarness(tmp_path)
    h.manager.health.restore(A, {"learned_gap": 10.0, "learned_at": h.clock.now})
    repos = [announcement(owner, f"r{n}", relays=[A]) for n in range(12)]
    h.own_relay_holds(*repos, *[issue(owner, r, subject=f"issue {i}") for r in repos for i in range(8)])
    h.connect(A, limits=RelayLimits(max_subscriptions=10, max_filters=3, max_values=5))
    state = h.state(A)
    for _ in range(300):  # its sync, at its pace
        h.answer_own_reads()
        h.advance(2)
        h.eose_all(A)
    assert not state.current.historic_queue and state.historic_sync_completed_at is not None
    queued, sent = [], []
    for _ in range(4):
        before = len(h.historic_reqs(A))
        h.manager.live.consolidate(state)
        queued.append(len(state.current.historic_queue))
        for _ in range(30):  # a minute, every REQ answered with nothing
            h.advance(2)
            h.eose_all(A)
        sent.append(len(h.historic_reqs(A)) - before)
    assert queued[0] > 20 and all(n > 0 for n in sent), (queued, sent)
    assert max(queued) < 1.5 * queued[0], f"{queued}: a whole catch-up a rebuild"
