"""How a historic batch's work ends, decided without the manager (``sync.batch_end``): an
exchange's outcome and a batch's residual, judged from a relay's state and batches in, what
was queued, moved, recorded and asked for (``sync.plan_actions``) out. One test per
decision; through the manager and on real relays they are in tests/test_manager_decisions.py,
test_unservable_decisions.py, test_result_caps.py, test_threads_ahead.py and
test_negentropy_sync.py."""
from __future__ import annotations

from gsync.io.inbox import NegentropyFinished
from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.protocol.filters import Filter
from gsync.protocol.nip11 import RelayLimits
from gsync.sync import batch_end, start_queue
from gsync.sync import plan_actions as act
from gsync.sync.batch_phase import BatchPhase
from gsync.sync.pending import BatchKind, PageCap, SyncMethod
from gsync.sync.start_queue import ExchangeToken, ReqId
from gsync.sync.targets import PendingItems

from .test_planner import ISSUES, LAYER2, NOW, PATCHES, REPO, THREAD, World, queued, repo_items

A, B = "wss://a.example", "wss://b.example"
IDS = [f"{i:064x}" for i in range(10)]


def served(need=(), **kwargs):
    return NegentropyOutcome(True, need_ids=list(need), rounds=1, **kwargs)


def finished(w, state, batch, token, flt, result, now=NOW):
    """The exchange ``token`` of ``batch`` for ``flt`` answers ``result``."""
    answer = NegentropyFinished(state.url, state.session, batch.batch_id, token, flt, result)
    return batch_end.exchange_finished(w.plan, state, answer, w.plan.own_held.forgotten, now)


def exchange_of(w, state, flt=ISSUES, items=None, kind=BatchKind.SYNC):
    """A batch with one exchange for ``flt``, started."""
    batch = w.batch(state, flt, kind=kind, items=items or repo_items())
    batch.method = SyncMethod.NEGENTROPY
    token = w.plan.queue.add_exchange(state, batch, flt, [])
    start_queue.next_start(w.plan, state, False, 0, NOW)
    w.take()
    return batch, token


def started(w, batch):
    """The batch's REQs all started and answered."""
    state = w.relays[batch_relay(w, batch)]
    while state.current.historic_queue:
        start = start_queue.next_start(w.plan, state, False, 0, NOW)
        w.plan.queue.ended(state, start.sub_id)
        start_queue.finish_subscription(batch, start.sub_id)


def batch_relay(w, batch):
    return next(url for url, s in w.relays.items() if batch.batch_id in s.current.pending)


# -- an exchange's outcome ------------------------------------------------------------------

def test_what_an_exchange_finds_missing_is_claimed_then_fetched_by_id_first_in_the_queue():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state)
    w.plan.queue.add_reqs(state, w.batch(state, PATCHES), [PATCHES])  # newer work
    finished(w, state, batch, token, ISSUES, served(IDS[:3]), NOW)
    assert w.take(act.Served) == [act.Served(state)]
    assert batch.advertised_ids == set(IDS[:3]) and batch.found_by[IDS[0]] == ISSUES
    (first, [by_id]), _ = state.current.historic_queue
    assert isinstance(first, ReqId) and by_id.ids == frozenset(IDS[:3])
    assert w.plan.claims.claim(B, 99, IDS[:3]) == set()  # claimed: another batch does not fetch them


def test_an_exchange_that_lacks_most_of_its_filter_fetches_it_by_its_pages():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state)
    many = [f"{i:064x}" for i in range(2000)]
    finished(w, state, batch, token, ISSUES, served(many), NOW)
    assert queued(state) == [(ReqId, [ISSUES])] and not batch.advertised_ids


def test_where_other_relays_list_the_repository_the_missing_go_by_id_whatever_their_number():
    from .test_planner import Repos
    w = World(repos=Repos({REPO: [A, B]}))
    state = w.relay()
    batch, token = exchange_of(w, state)
    many = [f"{i:064x}" for i in range(2000)]
    finished(w, state, batch, token, ISSUES, served(many), NOW)
    assert len(batch.advertised_ids) == 2000 and all(f.ids for _, [f] in queued(state))


def test_a_failed_exchange_turns_nip77_off_and_its_filter_and_the_queued_exchanges_go_by_req():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state)
    waiting = w.plan.queue.add_exchange(state, batch, PATCHES, [])
    failed = NegentropyOutcome(False, reason="blocked: no negentropy here")
    finished(w, state, batch, token, ISSUES, failed, NOW)
    assert not state.current.negentropy_ok and not w.plan.health.negentropy_allowed(A)
    assert queued(state) == [(ReqId, [ISSUES, PATCHES])] and waiting not in batch.outstanding_subs
    assert [a.event for a in w.take(act.Log)] == ["negentropy_unsupported"]
    assert state.nip77_failed_at is None  # a NEG-ERR where 77 was never advertised: this session only


def test_an_advertised_nip77_refused_rests_for_a_day_and_a_rate_limit_is_told():
    w = World()
    state = w.relay(limits=RelayLimits(supported_nips=frozenset({77})))
    batch, token = exchange_of(w, state)
    finished(w, state, batch, token, ISSUES, NegentropyOutcome(False, reason="error"), NOW)
    assert state.nip77_failed_at == NOW
    other = w.relay(B)
    batch, token = exchange_of(w, other)
    limited = NegentropyOutcome(False, reason="rate-limited: slow down")
    finished(w, other, batch, token, ISSUES, limited, NOW)
    assert w.take(act.RateLimited) == [act.RateLimited(other, "rate-limited: slow down")]


def test_an_own_relay_failure_keeps_nip77_on():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state)
    failed = NegentropyOutcome(False, reason="own relay query failed", own_relay_failed=True)
    finished(w, state, batch, token, ISSUES, failed, NOW)
    assert state.current.negentropy_ok and queued(state) == [(ReqId, [ISSUES])]


def test_an_exchange_past_the_result_cap_is_cut_into_windows_first_in_the_queue():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state)
    w.plan.own_held.learn(ISSUES, [], NOW)  # (known: the own relay holds none of it)
    refused = NegentropyOutcome(False, reason="too many", failure="too-many-results", cap=100)
    finished(w, state, batch, token, ISSUES, refused, NOW)
    assert state.current.negentropy_ok and state.result_cap.limit() == 100
    assert state.current.historic_queue and [a.event for a in w.take(act.Log)] == ["negentropy_filter_split"]


def test_on_a_relay_ignoring_until_an_exchange_past_the_result_cap_is_cut_by_what_it_enumerates_not_by_time():
    """Seed 407 of a stress world: windows by time do not shrink what a relay ignoring
    ``until`` counts (each reads to the newest); cut into windows, refused again, halved to
    one second, it stepped through seconds from 1970, a start each. Cut by its kinds (then
    values, authors) instead; what nothing cuts is left incomplete, the batch failed."""
    w = World()
    state = w.relay()
    state.current.page_cap = PageCap(until_ignored=True)
    two_kinds = Filter.make(kinds=[1621, 1617], tags={"a": [REPO]})
    batch, token = exchange_of(w, state, two_kinds)
    refused = NegentropyOutcome(False, reason="too many", failure="too-many-results", cap=100)
    finished(w, state, batch, token, two_kinds, refused, NOW)
    pieces = [group for t, group in state.current.historic_queue if isinstance(t, ExchangeToken)]
    assert pieces == [[two_kinds.replace(kinds=frozenset({1617}))], [two_kinds.replace(kinds=frozenset({1621}))]]
    assert all(f.until is None and f.since is None for [f] in pieces)
    one = pieces[0][0]
    token = next(t for t, group in state.current.historic_queue if group == [one])
    state.current.historic_queue = [e for e in state.current.historic_queue if e[0] != token]
    finished(w, state, batch, token, one, refused, NOW)
    assert batch.failed and "unpaged_incomplete" in [a.event for a in w.take(act.Log)]


def test_on_a_relay_found_to_ignore_until_a_refused_window_takes_its_queued_siblings_with_it():
    """Seed 38 of the stress mix with --neg-silent-caps: an exchange past the result cap was
    cut into windows by time before the relay showed it ignores ``until``; each window, which
    it counts from its ``since`` on, was refused and cut by values in turn (2,339 refused in
    an hour). Once it is known, the first refused window takes its queued siblings with it,
    and one filter from the earliest ``since`` is cut by what it enumerates."""
    w = World()
    state = w.relay()
    two_kinds = Filter.make(kinds=[1621, 1617], tags={"a": [REPO]})
    first = two_kinds.replace(since=100, until=199)
    batch, token = exchange_of(w, state, first)
    siblings = [w.plan.queue.add_exchange(state, batch, two_kinds.replace(since=since, until=since + 99), [])
                for since in (200, 300)]
    other = w.plan.queue.add_exchange(state, batch, THREAD, [])  # (another filter's exchange stays)
    state.current.page_cap = PageCap(until_ignored=True)
    refused = NegentropyOutcome(False, reason="too many", failure="too-many-results", cap=100)
    finished(w, state, batch, token, first, refused, NOW)
    queued_now = [(t, group) for t, group in state.current.historic_queue]
    assert not any(t in siblings for t, _ in queued_now) and not set(siblings) & set(batch.outstanding_subs)
    assert any(t == other for t, _ in queued_now)
    pieces = [group[0] for t, group in queued_now if t != other]
    assert pieces == [two_kinds.replace(kinds=frozenset({1617}), since=100),
                      two_kinds.replace(kinds=frozenset({1621}), since=100)]


def test_an_id_whose_filter_a_relay_ignoring_until_left_unpaged_is_recovered_not_judged():
    """Seed 4 of a world of relays ignoring ``until``: a filter whose pages stopped at the
    first (``PendingBatch.unpaged``) is no witness that the relay does not serve an id it
    did not bring; one that answered whole is."""
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    batch.expect_ids(IDS[:2], found_by=ISSUES)
    batch.unpaged.add(ISSUES)
    assert batch_end.filter_unanswered(w.plan, state, batch, set(IDS[:2])) == set(IDS[:2])
    batch.unpaged.clear()
    assert batch_end.filter_unanswered(w.plan, state, batch, set(IDS[:2])) == set()


def test_on_a_relay_ignoring_until_ids_are_fetched_no_more_to_a_filter_than_it_served_a_filter():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    ids = [f"{i:064x}" for i in range(50)]
    state.current.page_cap = PageCap(filter_served=20)
    w.plan.queue.add_id_fetches(state, batch, ids)
    assert [len(group[0].ids) for _, group in state.current.historic_queue] == [50]  # (one relay reading until)
    state.current.historic_queue.clear()
    state.current.page_cap = PageCap(filter_served=20, until_ignored=True)
    w.plan.queue.add_id_fetches(state, batch, ids)
    assert [len(group[0].ids) for _, group in state.current.historic_queue] == [20, 20, 10]


def test_roots_a_layer2_exchange_finds_join_the_batchs_thread_exchange_and_are_covered_live():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state, LAYER2)
    thread = w.plan.queue.add_exchange(state, batch, THREAD, [])
    w.plan.queue.add_reqs(state, batch, [Filter.make(tags={"e": ["cd" * 32]})])  # room for the other shapes
    finished(w, state, batch, token, LAYER2, served(IDS[:2]), NOW)
    [(joined, [merged])] = [(t, g) for t, g in state.current.historic_queue if isinstance(t, ExchangeToken)]
    assert joined == thread and merged.tags[0][1] == {"cd" * 32, *IDS[:2]}
    assert batch.read_also[thread].tags[0][1] == set(IDS[:2])  # read when it starts
    [live] = w.take(act.CoverLive)
    assert live.items.root_events == set(IDS[:2])
    assert state.current.threads_ahead.roots(NOW) == set(IDS[:2])


def test_the_last_exchange_fetches_what_all_found_leaving_out_what_arrived_meanwhile():
    w = World()
    state = w.relay()
    batch, token = exchange_of(w, state)
    batch.expect_ids(IDS[:4])
    w.plan.seen[IDS[0]] = NOW  # fetched elsewhere meanwhile
    batch_end.fetch_what_the_exchanges_found(w.plan, state, batch)
    assert batch.advertised_ids == set(IDS[1:4])
    [(_, [flt])] = state.current.historic_queue
    assert flt.ids == frozenset(IDS[1:4])


# -- a batch's end --------------------------------------------------------------------------

def test_a_batch_with_nothing_missing_is_confirmed_and_its_relay_checked_for_completion():
    w = World(negentropy=False)
    state = w.relay()
    batch, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.LAYER1, False, (), False, NOW)
    started(w, batch)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert batch.phase is BatchPhase.DONE and batch.batch_id not in state.current.pending
    assert REPO in state.confirmed.repos and state.announcements_synced and not state.batch_failures
    assert w.take(act.Confirmed) == [act.Confirmed(state, batch, None)]
    batch_end.finish(w.plan, state, batch, NOW)  # once
    assert not w.take(act.Confirmed)


def test_a_small_residual_is_asked_by_id_once_more():
    w = World()
    state = w.relay()
    batch, _ = exchange_of(w, state)
    batch.expect_ids(IDS)
    batch.received_ids |= set(IDS[:9])
    batch_end.finish(w.plan, state, batch, NOW)
    assert batch.phase is BatchPhase.IDS_RETRIED and w.take(act.Pump) == [act.Pump(state)]
    [(_, [flt])] = state.current.historic_queue
    assert flt.ids == {IDS[9]}


def test_ids_not_served_by_id_are_asked_by_the_filters_that_found_them():
    w = World()
    state = w.relay()
    batch, _ = exchange_of(w, state)
    batch.expect_ids(IDS, found_by=ISSUES)  # none served by id
    batch_end.finish(w.plan, state, batch, NOW)
    assert batch.phase is BatchPhase.BY_FILTER and batch.residual_asked == set(IDS)
    assert queued(state) == [(ReqId, [ISSUES])]
    assert w.take(act.Advance) == [act.Advance(state, batch, pump=True)]


def test_ids_that_arrived_elsewhere_while_asked_by_filter_do_not_count_against_the_relay():
    """Seed 575 of the stress mix: a relay judged not to serve ids, "delivered=-55" (388
    asked by filter of 333 advertised): ids asked by filter that arrived from another relay
    meanwhile left the advertised set, and still counted as not served by id. 100
    advertised, 2 served by id, the other 98 asked by filter; 60 of them came from
    elsewhere, the filter brought 38; a later exchange advertised 30 more, all served by
    id: 32 of 70 served by id, not "at most a tenth"."""
    w = World()
    state = w.relay()
    batch, _ = exchange_of(w, state)
    ids = [f"{i:064x}" for i in range(130)]
    batch.expect_ids(ids[:100], found_by=ISSUES)
    batch.fetching_by_id |= set(ids[:100])  # (asked by id first)
    batch.received_ids |= set(ids[:2])
    batch_end.finish(w.plan, state, batch, NOW)  # the other 98 asked by filter
    assert batch.residual_asked == set(ids[2:100])
    w.plan.seen.update((i, NOW) for i in ids[2:62])  # from another relay meanwhile
    batch.expect_ids(ids[100:], found_by=ISSUES)  # (an exchange of the batch, later)
    batch.fetching_by_id |= set(ids[100:])
    batch.received_ids |= set(ids[62:])  # by the filter, and by id
    started(w, batch)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert state.serves_ids(NOW) and "relay_ids_not_served" not in [a.event for a in w.take(act.Log)]


def test_ids_a_batch_did_not_ask_by_id_are_no_witness_that_the_relay_serves_none():
    """Seed 268 of the stress mix with ``--per-filter 0.5 --ahead 0.3 --own-full 0.3``
    (ids_judged_unserved, day 3.63): two ids asked by id and not served earlier that day (on
    their way to their filter since: ``asked_today``) were advertised again; the batch asked
    them by filter only, which brought both, and the relay was judged not to serve ids (0 of
    2 by id) though it served every id it was asked. Only what a batch asked by id judges."""
    w = World()
    state = w.relay()
    batch, _ = exchange_of(w, state)
    state.unservable.asked_by_id(IDS[:2], unserved=True)
    batch.expect_ids(IDS[:2], found_by=ISSUES)
    batch_end.fetch_what_the_exchanges_found(w.plan, state, batch)
    assert not batch.fetching_by_id  # not by id again today
    batch_end.finish(w.plan, state, batch, NOW)  # by their filter
    assert batch.residual_asked == set(IDS[:2])
    batch.received_ids |= set(IDS[:2])  # the filter brought both
    started(w, batch)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert state.serves_ids(NOW) and "relay_ids_not_served" not in [a.event for a in w.take(act.Log)]


def test_what_neither_id_nor_filter_brought_is_unservable_here_and_asked_by_id_elsewhere():
    from .test_planner import Repos
    w = World(repos=Repos({REPO: [A, B]}))
    state, other = w.relay(A), w.relay(B)
    batch, _ = exchange_of(w, state)
    batch.expect_ids(IDS[:2], found_by=ISSUES)
    batch_end.finish(w.plan, state, batch, NOW)  # asked by filter
    started(w, batch)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert all(i in state.unservable for i in IDS[:2]) and batch.phase is BatchPhase.DONE
    assert [c.metric for c in w.take(act.Count)] == ["EVENTS_UNSERVABLE"]
    assert set(w.plan.recovery.next_attempt(B, NOW + 10**6)) == set(IDS[:2])
    assert w.plan.recovery.is_fully_recovered(A)
    assert other.serves_ids(NOW)


def test_an_id_neither_id_nor_filter_brought_that_arrived_otherwise_is_unservable_here_all_the_same():
    """Seed 706 of ``--fault-scale 2 --own-full 1``: an exchange against an own relay away
    advertised a hidden announcement the own relay held; asked by id, again, then by its
    filter, which answered without it, it was shown by the own relay meanwhile, left the
    residual unmarked, and was asked by id twice again at the next daily fresh start. It is
    unservable here (asked once by id at that start, then by filter), and not recovered
    elsewhere: it is held. One the filter brought is not."""
    from .test_planner import Repos
    w = World(repos=Repos({REPO: [A, B]}))
    state = w.relay(A)
    batch, _ = exchange_of(w, state)
    batch.expect_ids(IDS[:2], found_by=ISSUES)
    batch_end.finish(w.plan, state, batch, NOW)  # asked by filter
    assert batch.residual_asked == set(IDS[:2])
    started(w, batch)
    w.take()
    w.plan.seen.update((i, NOW) for i in IDS[:2])  # shown by the own relay meanwhile
    batch.received_ids.add(IDS[1])  # (the filter brought this one)
    batch_end.finish(w.plan, state, batch, NOW)
    assert IDS[0] in state.unservable and IDS[1] not in state.unservable
    assert w.plan.recovery.is_fully_recovered(B) and batch.phase is BatchPhase.DONE


def test_ids_asked_by_id_then_by_a_filter_left_unpaged_are_recovered_by_that_filter_at_once():
    """Seed 268 of the default world: a relay ignoring ``until`` left the filter unpaged (no
    witness), so the ids its batch asked by id, then by that filter, went to recovery; its
    first attempt asked them by id once more, then by the filter: nine asks of a hidden id in
    23.4 h. They go by the filter at once; an id its batch never asked by id, by id first."""
    w = World()
    state = w.relay()
    batch, _ = exchange_of(w, state)
    batch.expect_ids(IDS[:2], found_by=ISSUES)
    batch_end.finish(w.plan, state, batch, NOW)  # asked by filter
    started(w, batch)
    batch.unpaged.add(ISSUES)  # (its pages stopped at the first)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert not any(i in state.unservable for i in IDS[:2]) and batch.phase is BatchPhase.DONE
    assert w.plan.recovery.next_attempt(A, NOW + 10**6) == []  # no id asked by id again
    assert w.plan.recovery.attempt_filters(A) == [ISSUES]
    other = Filter.make(kinds=[1617], tags={"a": [REPO]})
    batch_end.recover_ids(w.plan, B, {IDS[2]: other}, NOW)
    assert w.plan.recovery.next_attempt(B, NOW + 10**6) == [IDS[2]]


def test_a_recovery_attempt_ends_by_recording_what_it_brought():
    w = World(negentropy=False)
    state = w.relay()
    w.plan.recovery.add_missing(A, IDS[:2], NOW)
    ids = w.plan.recovery.next_attempt(A, NOW + 10**6)
    batch, _ = w.plan.start(state, PendingItems(), [Filter.make(ids=ids)], BatchKind.RECOVERY, False, (),
                            False, NOW)
    batch.expect_ids(IDS[:2])
    started(w, batch)
    batch.received_ids.add(IDS[0])
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert w.take(act.RecoveryFinished) == [act.RecoveryFinished(state)]
    assert w.plan.recovery.is_missing(IDS[1]) and not w.plan.recovery.is_missing(IDS[0])
    assert batch.phase is BatchPhase.DONE


def test_ids_a_recovery_attempts_exchange_found_and_the_relay_did_not_serve_by_id_are_not_asked_so_again():
    """Seed 290 of the per-filter stress mix (``unservable_asked_again``): a filter in
    recovery (left unpaged by a relay ignoring ``until``) went by NIP-77 at each attempt,
    whose exchange advertised an id the relay hides; it was fetched by id at every attempt,
    9 times in 16 h (a recovery attempt judges no residual). Not served by id, it is not
    asked so again before the relay's next daily fresh start."""
    w = World()
    state = w.relay()
    for attempt in range(2):
        batch, token = exchange_of(w, state, kind=BatchKind.RECOVERY, items=PendingItems())
        finished(w, state, batch, token, ISSUES, served(IDS[:2]))
        fetched = [flt.ids for _, flts in state.current.historic_queue for flt in flts if flt.ids]
        assert fetched == ([frozenset(IDS[:2])] if attempt == 0 else [])
        started(w, batch)
        w.take()
        batch_end.finish(w.plan, state, batch, NOW)
        assert batch.phase is BatchPhase.DONE and w.take(act.RecoveryFinished)
    assert all(state.unservable.asked_today(i) for i in IDS[:2])


def test_a_probe_batch_confirmed_answers_its_probe():
    w = World(negentropy=False)
    state = w.relay()
    batch, _ = w.plan.start(state, PendingItems(), [ISSUES], BatchKind.PROBE, False, (), False, NOW)
    state.current.probes[batch.batch_id] = "key"
    started(w, batch)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert w.take(act.Confirmed) == [act.Confirmed(state, batch, "key")] and not state.current.probes


def test_when_a_relay_is_found_to_ignore_until_what_its_filters_bring_of_ids_asked_again_judges_nothing():
    """Seed 412 of the stress mix with ``--notice-refusals 0.5 --oldest-first 0.3`` (and 309
    of the per-filter mix; ids_judged_unserved): a relay serving 20 a filter cut a batch's
    id fetch at 40 of 493; the 453 went to their filter; then its pages showed it ignores
    ``until``, and the 453 were asked by id again (20 a filter), served whole, and counted
    as brought by that filter: 0 by id, and the relay lost its NIP-77 for a day. Found to
    ignore ``until``, a batch's residual asked by filter is no witness any more."""
    w, state, batch = _residual_by_filter_answered(past_until=3, served_by_id=1)  # 3 newer than its until
    assert state.current.page_cap.until_ignored
    batch_end.fetch_what_the_exchanges_found(w.plan, state, batch)  # by id once more
    assert set(IDS[1:]) <= batch.fetching_by_id
    batch.received_ids |= set(IDS)
    started(w, batch)
    w.take()
    batch_end.finish(w.plan, state, batch, NOW)
    assert state.serves_ids(NOW) and "relay_ids_not_served" not in [a.event for a in w.take(act.Log)]


def test_one_event_past_a_pages_until_is_no_sign_that_the_relay_ignores_it():
    """A relay ignoring ``until`` sends the filter's newest page again, as many as its cap:
    one stray event newer than the page's ``until`` (a relay's junk: an unrequested event
    that matches but for its time) is no sign. Taken for one, an honest relay had its filters
    left unpaged for its session (the simulator's seed 1601 of --slow-unbounded 0.4: what the
    own relay lost was not refilled from it in 6 h)."""
    for past, ignored in ((1, False), (2, True)):
        _, state, _ = _residual_by_filter_answered(past_until=past)
        assert state.current.page_cap.until_ignored is ignored


def _residual_by_filter_answered(past_until: int, served_by_id: int = 0):
    """A batch whose exchange found ``IDS``, ``served_by_id`` of them served by id on a relay
    serving 20 a filter, the rest asked by their filter, whose page came back with
    ``past_until`` events newer than its ``until``: (world, relay state, batch)."""
    w = World()
    state = w.relay()
    state.current.page_cap = PageCap(filter_served=20)
    batch, _ = exchange_of(w, state)
    batch.expect_ids(IDS, found_by=ISSUES)
    batch.fetching_by_id |= set(IDS)
    batch.received_ids |= set(IDS[:served_by_id])
    batch_end.finish(w.plan, state, batch, NOW)  # the rest by their filter
    assert batch.residual_asked == set(IDS[served_by_id:])
    sub_id = state.current.historic_queue[0][0]
    start_queue.next_start(w.plan, state, False, 0, NOW)
    w.plan.on_eose(state, batch, sub_id, None, NOW, past_until=(past_until,))
    return w, state, batch

