"""The historic planner's decisions (``sync.planner``, ``sync.start_queue``), without the
manager: a relay's state and batches in, what the planner queued, moved and asked for
(``sync.plan_actions``) out. One test per decision; the same decisions end to end, through
the manager, are in tests/test_manager_decisions.py, test_method_choice.py,
test_shared_lead.py, test_result_caps.py and test_threads_ahead.py."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

from gsync.constants import MAX_OPEN_FILTER_BYTES
from gsync.io.inbox import OwnHoldingsRead
from gsync.protocol import messages as wire
from gsync.protocol.event import Event
from gsync.protocol.filters import Filter
from gsync.protocol.nip11 import RelayLimits
from gsync.sync import plan_actions as act
from gsync.sync import start_queue
from gsync.sync.batch_phase import BatchPhase, Step
from gsync.sync.claims import FetchClaims
from gsync.sync.health import RelayHealthTracker
from gsync.sync.lead import SharedLead
from gsync.sync.own_held import OwnHeld
from gsync.sync.pending import BatchKind, CrowdedSecond, PageCap, PendingBatch, SyncMethod
from gsync.sync.planner import HistoricPlanner
from gsync.sync.policy import coverage_key
from gsync.sync.recovery import MissingEventRecovery
from gsync.sync.relay_state import ConnectionStatus, RelaySession, RelayState, RunningExchange
from gsync.sync.repos import SyncLevel
from gsync.sync.start_queue import ExchangeToken, LeadWait, OwnReadToken, ReqId, StartQueue
from gsync.sync.targets import PendingItems

A, B = "wss://a.example", "wss://b.example"
NOW = 1_780_000_000.0
REPO = "30617:" + "ab" * 32 + ":repo"
ISSUES = Filter.make(kinds=[1621], tags={"a": [REPO]})
PATCHES = Filter.make(kinds=[1617], tags={"a": [REPO]})
THREAD = Filter.make(tags={"E": ["cd" * 32]})  # layer 3: a root's thread
LAYER2 = Filter.make(tags={"a": [REPO]})  # what refers to the repository


class Nothing:
    """The rejected index and delivery's in-flight index, both empty."""

    @staticmethod
    def items_matching(flt):
        return []

    tracked_matching = items_matching

    @staticmethod
    def any_may_match(flt):
        return False


class Repos:
    """Which relays list each repository (none, unless given)."""

    def __init__(self, listing=None):
        self.listing = listing or {}

    def __contains__(self, address):
        return address in self.listing

    def get(self, address):
        relays = self.listing.get(address)
        return None if relays is None else SimpleNamespace(relays=set(relays))

    def repos_listing(self, url):
        return {a for a, relays in self.listing.items() if url in relays}


class World:
    def __init__(self, negentropy=True, repos=None):
        self.moves = []
        self.relays = {}
        self.plan = HistoricPlanner(
            sync=SimpleNamespace(negentropy=negentropy, background_start_interval_ms=1000),
            queue=StartQueue(itertools.count(1)), relays=self.relays, repos=repos or Repos(),
            health=RelayHealthTracker(), lead=SharedLead(), claims=FetchClaims(), recovery=MissingEventRecovery(),
            own_held=OwnHeld(ttl=3600, max_entries=10_000), seen={}, rejected=Nothing(), delivery=Nothing(),
            move=self.move)

    def move(self, state, batch, step):
        self.moves.append((batch.batch_id, step))
        batch.move(step)

    def relay(self, url=A, limits=None) -> RelayState:
        state = RelayState(url)
        state.current = RelaySession(link=1, limits=limits or RelayLimits(), page_cap=None)
        state.status = ConnectionStatus.SYNCING
        self.relays[url] = state
        return state

    def batch(self, state, *filters, kind=BatchKind.SYNC, items=None) -> PendingBatch:
        batch = PendingBatch(self.plan.queue.batch_id(), items or PendingItems(), kind=kind)
        batch.semantic_filters = list(filters)
        state.current.pending[batch.batch_id] = batch
        return batch

    def take(self, kind=None):
        actions = self.plan.take()
        return actions if kind is None else [a for a in actions if isinstance(a, kind)]


def queued(state):
    return [(type(sub_id), filters) for sub_id, filters in state.current.historic_queue]


def answer(state, batch, filters, holdings):
    """The own relay's holdings of ``filters``, for the read ``batch`` waits on."""
    [token] = batch.outstanding_subs
    return OwnHoldingsRead(state.url, state.session, batch.batch_id, token, filters, holdings)


def test_an_own_relay_that_cannot_say_what_it_holds_is_read_as_holding_nothing():
    w = World()
    state = w.relay()
    batch, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    w.take()
    assert w.plan.holdings_read(state, batch, answer(state, batch, [ISSUES], None), NOW)
    assert queued(state) == [(ReqId, [ISSUES])]
    assert "negentropy_own_relay_unavailable" in [a.event for a in w.take(act.Log)]


def repo_items():
    return PendingItems(repos={REPO: SyncLevel.FULL})


# -- ids and the queue ----------------------------------------------------------------------

def test_ids_are_minted_in_one_place_typed_by_what_they_name_and_never_twice():
    q = StartQueue(itertools.count(1))
    ids = [q.req_id(), q.exchange_token(5), q.own_read_token(5), q.batch_id(), q.req_id()]
    assert [type(i) for i in ids[:3]] == [ReqId, ExchangeToken, OwnReadToken]
    assert ids[:3] == ["h1", "neg5-1", "own5-2"] and ids[3] == 3 and ids[4] == "h2"
    assert q.lead_wait(5) == "lead5" and isinstance(q.lead_wait(5), LeadWait)


def test_queued_reqs_and_exchanges_are_kept_in_step_with_their_batch():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES, PATCHES])
    token = w.plan.queue.add_exchange(state, batch, THREAD, [])
    assert queued(state) == [(ReqId, [ISSUES, PATCHES]), (ExchangeToken, [THREAD])]
    assert set(state.current.sub_to_batch) == batch.outstanding_subs
    w.plan.queue.exchanges_to_reqs(state)  # NIP-77 is off: it shares the queued REQ
    assert queued(state) == [(ReqId, [ISSUES, PATCHES, THREAD])]
    assert token not in batch.outstanding_subs and token not in batch.own_holdings
    assert set(state.current.sub_to_batch) == batch.outstanding_subs


def test_a_refused_page_goes_again_first_under_a_new_id_and_a_split_as_parts_first():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    by_id = Filter.make(ids=["ef" * 32])
    w.plan.queue.add_reqs(state, batch, [by_id])
    w.plan.queue.add_reqs(state, batch, [ISSUES, PATCHES])  # (an id fetch shares no REQ)
    (first, _), (second, _) = state.current.historic_queue
    w.plan.queue.drop_first(state)
    w.plan.queue.again_first(state, batch, first, [by_id])
    again = state.current.historic_queue[0][0]
    assert again != first and isinstance(again, ReqId) and again in batch.outstanding_subs
    assert first not in batch.outstanding_subs
    w.plan.queue.ended(state, second)
    w.plan.queue.split_first(state, batch, second, [[0], [1]])
    assert [g for _, g in state.current.historic_queue[:2]] == [[ISSUES], [PATCHES]]
    assert second not in batch.outstanding_subs


# -- a batch's start ------------------------------------------------------------------------

def test_without_nip77_a_batch_queues_its_reqs_at_once_and_leads_its_items():
    w = World(negentropy=False)
    state = w.relay()
    batch, new = w.plan.start(state, repo_items(), [ISSUES, PATCHES], BatchKind.SYNC, True, (), False, NOW)
    assert new and batch.coalescable and batch.phase is BatchPhase.QUEUED
    assert queued(state) == [(ReqId, [ISSUES, PATCHES])]
    assert w.plan.lead.split(B, repo_items())[1].repos  # another relay's batch follows it


def test_with_nip77_a_batch_first_reads_what_the_own_relay_holds():
    w = World()
    state = w.relay()
    batch, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    assert batch.phase is BatchPhase.READING_OWN and not state.current.historic_queue
    [token] = batch.outstanding_subs
    assert isinstance(token, OwnReadToken)
    [read] = w.take(act.ReadOwn)
    assert (read.token, read.filters, read.reads) == (token, [ISSUES], [ISSUES])


def test_holdings_known_answer_at_once_without_a_read():
    w = World()
    state = w.relay()
    w.plan.own_held.learn(ISSUES, [], NOW)
    batch, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    [known] = w.take(act.OwnKnown)
    assert known.holdings == [[]] and known.batch_id == batch.batch_id


def test_an_addfilters_joins_the_waiting_req_batch_and_their_filters_share_a_req():
    w = World(negentropy=False)
    state = w.relay()
    first, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, True, (), False, NOW)
    joined, new = w.plan.start(state, PendingItems(root_events={"cd" * 32}), [PATCHES], BatchKind.SYNC, True, (),
                               False, NOW)
    assert joined is first and not new
    assert queued(state) == [(ReqId, [ISSUES, PATCHES])]
    assert first.items.root_events == {"cd" * 32}
    assert [a.event for a in w.take(act.Log)] == ["batch_coalesced"]


def test_a_follower_waits_for_its_leader_and_reads_the_own_relay_once_released():
    w = World()
    leader_state, state = w.relay(B), w.relay(A)
    many = PendingItems(repos={f"30617:{'ab' * 32}:r{i}": SyncLevel.FULL for i in range(50)})
    leader, _ = w.plan.start(leader_state, many, [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    w.take()
    follower, _ = w.plan.start(state, many, [ISSUES], BatchKind.SYNC, False, {(B, leader.batch_id)}, False, NOW)
    assert follower.phase is BatchPhase.FOLLOWING and follower.outstanding_subs == {f"lead{follower.batch_id}"}
    assert isinstance(next(iter(follower.outstanding_subs)), LeadWait) and not w.take(act.ReadOwn)
    w.plan.stop_leading(leader_state, leader, NOW)
    assert follower.phase is BatchPhase.READING_OWN
    assert [r.batch_id for r in w.take(act.ReadOwn)] == [follower.batch_id]


def test_a_follower_whose_wait_would_not_pay_reads_at_once_and_shares_the_fetches():
    w = World()
    leader_state, state = w.relay(B), w.relay(A)
    leader, _ = w.plan.start(leader_state, repo_items(), [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    w.take()
    follower, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, False,
                               {(B, leader.batch_id)}, False, NOW)
    assert follower.phase is BatchPhase.READING_OWN and follower.share_all


def test_a_follower_waits_when_many_relays_sync_side_by_side():
    """Five repositories another relay leads, four filters: with two relays syncing, four
    checks at a gate interval each cost more than the pages they save, and it goes at once;
    with fifty syncing (bench/scale), the own relay's pace, not the gate, is what the
    operator waits for (``method.wait_bytes_per_sec``), and it waits for the lead."""
    five = PendingItems(repos={f"30617:{'ab' * 32}:r{i}": SyncLevel.FULL for i in range(5)})
    filters = [ISSUES, PATCHES, LAYER2, THREAD]
    for crowd, waits in ((0, False), (48, True)):
        w = World()
        for i in range(crowd):
            w.batch(w.relay(f"wss://r{i}.example"), LAYER2)  # syncing too
        leader_state, state = w.relay(B), w.relay(A)
        leader, _ = w.plan.start(leader_state, five, filters, BatchKind.SYNC, False, (), False, NOW)
        follower, _ = w.plan.start(state, five, filters, BatchKind.SYNC, False, {(B, leader.batch_id)}, False, NOW)
        assert (follower.phase is BatchPhase.FOLLOWING) is waits and follower.share_all is not waits


def test_a_follower_whose_leader_goes_on_by_nip77_prices_in_what_the_leader_fetches():
    """The leader's holdings read chose NIP-77: it leads no more, its follower reads the own
    relay at once, before the leader's events land. Priced as holding nothing it went by REQ
    pages and brought every event again (bench/scale: 0.28 copies per wanted event); it
    counts what the leader fetches as brought again and goes by NIP-77, the claims sharing
    the fetches out."""
    w = World()
    leader_state, state = w.relay(B), w.relay(A)
    many = PendingItems(repos={f"30617:{'ab' * 32}:r{i}": SyncLevel.FULL for i in range(50)})
    leader, _ = w.plan.start(leader_state, many, [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    follower, _ = w.plan.start(state, many, [ISSUES], BatchKind.SYNC, False, {(B, leader.batch_id)}, False, NOW)
    assert follower.phase is BatchPhase.FOLLOWING
    held = [(1_700_000_000 + i, f"{i:064x}") for i in range(3000)]
    w.plan.seen.update((event_id, None) for _, event_id in held)  # the leader's relay re-syncs
    assert w.plan.holdings_read(leader_state, leader, answer(leader_state, leader, [ISSUES], [held]), NOW)
    assert leader.method is SyncMethod.NEGENTROPY and follower.phase is BatchPhase.READING_OWN
    assert follower.share_all
    assert w.plan.holdings_read(state, follower, answer(state, follower, [ISSUES], [[]]), NOW)
    [(token, [flt])] = state.current.historic_queue
    assert isinstance(token, ExchangeToken) and follower.method is SyncMethod.NEGENTROPY


# -- the method per filter ------------------------------------------------------------------

def test_descendants_held_with_their_thread_go_by_nip77_where_a_new_thread_would_not():
    """A thread's members' replies mostly tag its root and came with the thread's pages: a
    descendants batch (no items of its own) lacks what a re-sync lacks, so the nested
    replies its ``#e`` holds go by NIP-77 (bench/scale: its pages brought 0.10 copies per
    wanted event). The same holdings of a new root's thread go by REQ pages: most of a new
    thread is missing, and NIP-77 would fetch it by id besides."""
    from gsync.sync import filter_plan

    members = [f"{i:064x}" for i in range(1, 4)]
    held = [(1_700_000_000 + i, f"{i + 100:064x}") for i in range(220)]
    outcomes = {}
    for name, items, filters in (
            ("descendants", PendingItems(), filter_plan.descendant_filters(members)),
            ("thread", PendingItems(root_events={members[0]}), filter_plan.root_event_filters([members[0]]))):
        w = World()
        state = w.relay()
        state.round_started_at = NOW - 10
        w.plan.seen.update((event_id, NOW - 1) for _, event_id in held)  # came this round
        batch, _ = w.plan.start(state, items, filters, BatchKind.SYNC, False, (), False, NOW)
        holdings = [held if flt.tags[0][0] == "e" else [] for flt in filters]
        assert w.plan.holdings_read(state, batch, answer(state, batch, filters, holdings), NOW)
        outcomes[name] = sorted(flt.tags[0][0] for token, [flt, *_] in state.current.historic_queue
                                if isinstance(token, ExchangeToken))
    assert outcomes == {"descendants": ["e"], "thread": []}


def test_a_first_syncs_start_costs_less_when_many_relays_sync_side_by_side():
    """A new root's thread whose statuses (100) came with its repository's pages: alone, a
    start is a gate interval of the operator's wait (90 KB), and the copies cost less than
    NIP-77's exchange and fetch; with fifty relays syncing (bench/scale), the own relay's
    pace is the wait, a start costs little more than the remote's work, and NIP-77 takes
    the ``#e`` that holds them."""
    from gsync.sync import filter_plan

    root = "cd" * 32
    held = [(1_700_000_000 + i, f"{i + 100:064x}") for i in range(100)]
    filters = filter_plan.root_event_filters([root])
    outcomes = {}
    for crowd in (0, 48):
        w = World()
        for i in range(crowd):
            w.batch(w.relay(f"wss://r{i}.example"), LAYER2)  # syncing too
        state = w.relay()
        state.round_started_at = NOW - 10
        w.plan.seen.update((event_id, NOW - 1) for _, event_id in held)  # came this round
        batch, _ = w.plan.start(state, PendingItems(root_events={root}), filters, BatchKind.SYNC, False, (), False, NOW)
        holdings = [held if flt.tags[0][0] == "e" else [] for flt in filters]
        assert w.plan.holdings_read(state, batch, answer(state, batch, filters, holdings), NOW)
        outcomes[crowd] = sorted(flt.tags[0][0] for token, [flt, *_] in state.current.historic_queue
                                 if isinstance(token, ExchangeToken))
    assert outcomes == {0: [], 48: ["e"]}


def test_what_the_own_relay_lacks_entirely_goes_by_req_pages_on_a_first_sync():
    w = World()
    state = w.relay()
    batch, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    assert w.plan.holdings_read(state, batch, answer(state, batch, [ISSUES], [[]]), NOW)
    assert not batch.outstanding_subs - set(state.current.sub_to_batch)  # the own read is answered
    assert queued(state) == [(ReqId, [ISSUES])] and batch.method is SyncMethod.REQ_EOSE


def test_what_the_own_relay_holds_much_of_goes_by_an_exchange_with_those_holdings():
    w = World()
    state = w.relay()
    held = [(1_700_000_000 + i, f"{i:064x}") for i in range(3000)]
    w.plan.seen.update((event_id, None) for _, event_id in held)  # held before this round
    batch, _ = w.plan.start(state, repo_items(), [ISSUES], BatchKind.SYNC, False, (), False, NOW)
    assert w.plan.holdings_read(state, batch, answer(state, batch, [ISSUES], [held]), NOW)
    [(token, [flt])] = state.current.historic_queue
    assert isinstance(token, ExchangeToken) and flt == ISSUES and batch.own_holdings[token] == held
    assert batch.method is SyncMethod.NEGENTROPY


def test_a_nip77_only_batch_merges_into_a_waiting_one_of_the_same_shape():
    w = World()
    state = w.relay()
    waiting = w.batch(state, THREAD)
    waiting.method = SyncMethod.NEGENTROPY
    token = w.plan.queue.add_exchange(state, waiting, THREAD, [(1, "a")])
    other = Filter.make(tags={"E": ["ef" * 32]})
    batch = w.batch(state, other, items=PendingItems(root_events={"ef" * 32}))
    assert w.plan.merge_into_waiting_negentropy(state, batch, [(other, [(2, "b")])], NOW)
    [(same, [merged])] = state.current.historic_queue
    assert same == token and merged.tags == (("E", frozenset({"cd" * 32, "ef" * 32})),)
    assert sorted(waiting.own_holdings[token]) == [(1, "a"), (2, "b")]
    assert batch.batch_id not in state.current.pending and waiting.items.root_events == {"ef" * 32}
    assert batch.phase is BatchPhase.JOINED


# -- the next start -------------------------------------------------------------------------

def test_the_first_queued_start_goes_and_the_batch_has_started():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES])
    start = start_queue.next_start(w.plan, state, False, 0, NOW)
    assert isinstance(start, act.Start) and start.filters == [ISSUES] and start.batch is batch
    assert batch.phase is BatchPhase.STARTED and not state.current.historic_queue
    assert start_queue.next_start(w.plan, state, False, 0, NOW) is None


def test_an_exchange_starts_with_what_its_batch_read_of_the_own_relay():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_exchange(state, batch, ISSUES, [(1, "a")])
    start = start_queue.next_start(w.plan, state, False, 0, NOW)
    assert start.holdings == ([(1, "a")], None) and not batch.own_holdings


def test_a_req_past_the_open_filters_bytes_waits_for_one_to_end():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES])
    assert start_queue.next_start(w.plan, state, True, 10**9, NOW) is None
    assert len(state.current.historic_queue) == 1
    assert start_queue.next_start(w.plan, state, False, 10**9, NOW) is not None  # alone it goes whatever its size


def test_the_open_filters_bytes_count_the_req_as_the_wire_sends_it():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES])
    size = len(wire.req(*state.current.historic_queue[0]).encode())
    assert start_queue.next_start(w.plan, state, True, MAX_OPEN_FILTER_BYTES - size + 1, NOW) is None
    start = start_queue.next_start(w.plan, state, True, MAX_OPEN_FILTER_BYTES - size, NOW)  # it just fits
    assert start is not None and start.filters == [ISSUES]


def test_thread_starts_wait_for_their_batchs_layer2_exchanges():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    state.current.neg_running["neg0-0"] = RunningExchange(None, batch.batch_id, LAYER2, NOW)
    w.plan.queue.add_reqs(state, batch, [THREAD])
    assert start_queue.next_start(w.plan, state, False, 0, NOW) is None
    other = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, other, [ISSUES])
    assert start_queue.next_start(w.plan, state, False, 0, NOW).batch is other  # not held behind them


def test_a_shape_refused_by_policy_leaves_a_queued_req_before_it_starts():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES, PATCHES])
    state.paused.pause(coverage_key(PATCHES), NOW)
    start = start_queue.next_start(w.plan, state, False, 0, NOW)
    assert start.filters == [ISSUES]


def test_a_batch_a_regroup_empties_is_finished_before_the_queue_is_asked_again():
    w = World()
    state = w.relay()
    batch = w.batch(state, PATCHES)
    w.plan.queue.add_reqs(state, batch, [PATCHES])
    state.paused.pause(coverage_key(PATCHES), NOW)
    assert start_queue.next_start(w.plan, state, False, 0, NOW) is act.AGAIN
    assert w.take(act.Advance) == [act.Advance(state, batch, pump=False)] and batch.is_complete


def test_an_exchange_over_the_known_result_cap_is_cut_before_it_starts():
    w = World()
    state = w.relay()
    state.result_cap.note_refused(100, 1000)  # the relay said: 100 results at most
    batch = w.batch(state, ISSUES)
    held = [(1_700_000_000 + i * 60, f"{i:064x}") for i in range(1000)]
    token = w.plan.queue.add_exchange(state, batch, ISSUES, held)
    start = start_queue.next_start(w.plan, state, False, 0, NOW)
    assert [a.event for a in w.take(act.Log)] == ["negentropy_filter_cut"]
    assert token not in batch.outstanding_subs
    assert start.filters[0].until is not None or start.filters[0].since is not None  # a window of it


def test_on_a_relay_ignoring_until_an_exchange_over_the_known_cap_goes_as_it_is():
    """Seed 277 of the default world: neither windows nor REQ pages shrink what a relay
    ignoring ``until`` counts. Cut before its start into a REQ page, the filter came back
    unpaged, went to NIP-77 again and was cut again: a start each, 2,000 an hour. There the
    exchange goes as it is; a refusal splits it by what it enumerates (test_planner_ends)."""
    w = World()
    state = w.relay()
    state.result_cap.note_refused(100, 1000)
    state.current.page_cap = PageCap(until_ignored=True)
    batch = w.batch(state, ISSUES)
    held = [(1_700_000_000 + i * 60, f"{i:064x}") for i in range(1000)]
    token = w.plan.queue.add_exchange(state, batch, ISSUES, held)
    start = start_queue.next_start(w.plan, state, False, 0, NOW)
    assert start.sub_id == token and start.filters == [ISSUES]
    assert "negentropy_filter_cut" not in [a.event for a in w.take(act.Log)]


# -- an EOSE --------------------------------------------------------------------------------

def test_an_eose_closes_the_req_and_queues_a_full_pages_next_page_first():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES])
    other = w.batch(state, PATCHES)
    w.plan.queue.add_reqs(state, other, [PATCHES])
    start = start_queue.next_start(w.plan, state, False, 0, NOW)
    for i in range(500):  # a full page: the relay's cap may have cut it
        event = Event(id=f"{i:064x}", pubkey="ab" * 32, created_at=1_700_000_000 + i, kind=1621,
                      tags=(("a", REPO),), content="", sig="00" * 64)
        batch.record_event(start.sub_id, event)
    w.plan.on_eose(state, batch, start.sub_id, 0.1, NOW)
    assert w.take(act.Close) == [act.Close(state, start.sub_id)]
    (first, [page]), _ = state.current.historic_queue
    assert state.current.sub_to_batch[first] == batch.batch_id and page.until == 1_700_000_000
    assert start.sub_id not in state.current.sub_to_batch


def test_a_crowded_second_goes_by_nip77_where_the_relay_has_it_else_split():
    w = World()
    state = w.relay()
    batch = w.batch(state, ISSUES)
    second = ISSUES.replace(since=1_700_000_000, until=1_700_000_000)
    w.plan.complete_crowded_second(state, batch, CrowdedSecond(second, 1_700_000_000, 600), NOW)
    assert queued(state) == [(ExchangeToken, [second])] and batch.method is SyncMethod.NEGENTROPY
    state.current.negentropy_ok = False
    two = Filter.make(kinds=[1621, 1617], tags={"a": [REPO]}, since=5, until=5)
    w.plan.complete_crowded_second(state, batch, CrowdedSecond(two, 5, 600), NOW)
    [(_, halves)] = queued(state)[:1]  # first: they finish what was started
    assert [f.kinds for f in halves] == [frozenset({1617}), frozenset({1621})]
    w.plan.complete_crowded_second(state, batch, CrowdedSecond(second, 1_700_000_000, 600, again=True), NOW)
    assert batch.failed
    assert [c.labels for c in w.take(act.Count)] == [("negentropy",), ("split",), ("incomplete",)]


def test_historic_slots_are_what_the_budget_leaves_beside_live_coverage():
    w = World()
    state = w.relay(limits=RelayLimits(max_subscriptions=3))
    batch = w.batch(state, ISSUES)
    w.plan.queue.add_reqs(state, batch, [ISSUES])
    sub_id = state.current.historic_queue[0][0]
    assert start_queue.slots(state, {sub_id}) == (2, 1)
    state.current.live_subs.update(a=None, b=None)
    assert start_queue.slots(state, set()) == (1, 0)  # never none
    assert Step.FIRST_START not in [s for _, s in w.moves]


def test_a_poll_failed_only_for_what_no_req_reaches_moves_on_and_leaves_the_relay_marked():
    """Seed 707 of the stress mix: a poll of a relay ignoring ``until``, NIP-77 resting,
    failed on an import its REQ pages could not reach; kept, its window was asked again at
    every poll, failing again, growing. It moves on, and the relay is marked ``unreached``
    for when NIP-77 comes back (``lifecycle.end_nip77_rests``). A poll whose subscription
    was closed before its EOSE keeps its window: asked again, it may be answered."""
    from gsync.sync import batch_end

    for unreached in (True, False):
        w = World()
        state = w.relay()
        state.current.negentropy_ok = False
        batch = w.batch(state, ISSUES, kind=BatchKind.POLL)
        tier = SimpleNamespace(cursor=NOW - 3600)
        batch.poll_tiers, batch.poll_started_at = [tier], NOW
        if unreached:
            second = ISSUES.replace(since=1_700_000_000, until=1_700_000_000)
            w.plan.complete_crowded_second(state, batch, CrowdedSecond(second, 1_700_000_000, 600, again=True), NOW)
        else:
            batch.mark_failed()  # (``start_queue.on_closed``)
        batch_end.confirm(w.plan, state, batch, NOW + 1)
        assert batch.failed
        assert (tier.cursor == NOW) is unreached
        assert state.unreached is unreached
