"""Roots a layer-2 exchange finds missing have their threads reconciled in the same batch
(``HistoricSync.cover_threads_ahead``), and need no round of their own once stored.

The record itself (``sync.threads_ahead``) is pure; the decisions are tested in process
(tests/manager_harness.py): what the manager queues, sends and confirms. The outcome end to
end, on real relays, is in tests/test_negentropy_sync.py
(``test_roots_found_missing_bring_their_threads_in_the_same_round``)."""
import json

from gsync.io.inbox import NegentropyFinished
from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.protocol.filters import Filter
from gsync.sync import filter_plan
from gsync.sync.threads_ahead import ThreadsAhead

from .factory import Author, announcement, comment, issue
from .manager_harness import ManagerHarness, held_items, resync_holdings

A = "wss://a.example"
HELD = (1_700_000_000, "ab" * 32)
# the own relay holds much of every filter: NIP-77 (``sync.method``)
HOLDINGS = resync_holdings()


# -- the record ------------------------------------------------------------------------------

def test_an_id_is_taken_once_within_its_time_and_never_after():
    ahead = ThreadsAhead(ttl=600, max_entries=10)
    ahead.note(["r1", "c1"], now=100, batch_id=7)
    ahead.note(["r2"], now=500, batch_id=8)
    assert ahead.roots(now=650) == {"r1", "c1", "r2"}
    assert ahead.take(["r1", "x"], now=650) == {"r1": 7}
    assert ahead.take(["r1"], now=651) == {}  # once
    assert ahead.take(["c1", "r2"], now=700) == {"r2": 8}  # c1 noted at 100: past its 600 s
    assert len(ahead) == 0


def test_it_holds_max_entries_at_most_and_a_failed_batch_takes_its_ids():
    ahead = ThreadsAhead(ttl=600, max_entries=3)
    ahead.note(["a", "b"], now=0, batch_id=1)
    assert ahead.room(now=0) == 1
    ahead.note(["c", "d"], now=1, batch_id=2)  # past the bound: the oldest goes
    assert ahead.roots(now=2) == {"b", "c", "d"}
    ahead.drop_batch(2)
    assert ahead.roots(now=2) == {"b"} and ahead.room(now=2) == 2


# -- the manager's decisions -----------------------------------------------------------------

def exchanges(h):
    return [g for g in h.effects.spawned if g.name == "reconcile_filter"]


def finish(h, g, need=()):
    """The exchange ``g`` ends: the relay has ``need`` the own relay lacks (and the own
    relay held nothing of the part of its filter it was to read)."""
    h.effects.spawned.remove(g)
    state = h.state(A)
    outcome = NegentropyOutcome(True, need_ids=list(need), rounds=1)
    if g.kwargs.get("read_also") is not None:
        outcome.read_also = (g.kwargs["read_also"], held_items(g.kwargs["read_also"], (), set()).entries)
    h.feed(NegentropyFinished(A, state.session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2], outcome))


def asks(flt_json: dict, event_id: str) -> bool:
    return any(event_id in flt_json.get(f"#{name}", ()) for name in "eEq")


def world(h):
    """A repository on A with one issue the own relay holds (so the batch has thread
    filters), and holdings for every filter (so every filter goes by NIP-77)."""
    owner = Author.named("owner")
    repo = announcement(owner, "r", relays=[A])
    known = issue(owner, repo)
    h.own_relay_holds(repo, known)
    h.connect(A)
    h.answer_own_reads(held=lambda f: [HELD, *HOLDINGS(f)])
    return repo, known


def run_until_layer2_found(h, found):
    """Exchanges start one a second; the first that asks by repository address finds
    ``found`` missing, the others nothing, until that one has answered."""
    for _ in range(20):
        h.advance(1.1)
        for g in exchanges(h):
            if filter_plan.asks_by_repo(g.args[2]) and g.args[2].tags[0][0] == "a":
                finish(h, g, [e.id for e in found])
                return
            finish(h, g)
    raise AssertionError("no #a exchange started")


def test_a_root_found_missing_joins_the_thread_exchanges_and_needs_no_round_of_its_own(tmp_path):
    h = ManagerHarness(tmp_path)
    repo, known = world(h)
    new_root = issue(Author.named("reporter"), repo, subject="found by #a")
    reply = comment(Author.named("reporter"), new_root)  # on the relay; not asked by #a
    run_until_layer2_found(h, [new_root])

    # Its thread is covered live at once (an exchange sees up to its start only) ...
    live = [r for r in h.reqs(A) if all(f.get("limit") == 0 for f in r[2:]) and any(asks(f, new_root.id) for f in r[2:])]
    assert {name for r in live for f in r[2:] for name in f if name.startswith("#")} == {"#e", "#E", "#q"}
    # ... and reconciled with the known root's thread, in the exchanges already queued: one
    # of each shape, what the own relay holds of the new value read when it starts.
    joined = []
    for _ in range(20):
        h.advance(1.1)
        for g in exchanges(h):
            flt = json.loads(g.args[2].to_json())
            if asks(flt, new_root.id):
                assert asks(flt, known.id)
                assert g.kwargs["read_also"] is not None and new_root.id in g.kwargs["read_also"].to_json()
                joined.append(g.args[2].tags[0][0])
            finish(h, g, [reply.id] if asks(flt, new_root.id) and flt.get("#E") else ())
        if not h.state(A).current.historic_queue and not exchanges(h):
            break
    assert sorted(joined) == ["E", "e", "q"]
    # What those exchanges read of the own relay for the new value is kept: not read again.
    thread = Filter.make(tags={"e": [new_root.id]})
    assert h.manager.own_held.missing(thread, h.clock.now) is None
    # One fetch by id for everything the batch's exchanges found: the root and its reply.
    fetches = [r for r in h.historic_reqs(A) if "ids" in r[2]]
    assert len(fetches) == 1 and set(fetches[0][2]["ids"]) == {new_root.id, reply.id}

    # The own relay stores the new root: no exchange, no REQ asks for its thread again.
    h.relay_sends(A, fetches[0][1], new_root, reply)
    h.relay_says(A, ["EOSE", fetches[0][1]])
    started, sent = len(h.effects.spawned), len(h.reqs(A))
    h.own_relay_holds(new_root)
    h.answer_own_reads(held=lambda f: [HELD, *HOLDINGS(f)])
    h.advance(5)
    assert not [g for g in h.effects.spawned[started:] if g.name == "reconcile_filter"]
    assert not [r for r in h.reqs(A)[sent:] if any(asks(f, new_root.id) for f in r[2:])]
    state = h.state(A)
    assert new_root.id in state.confirmed.root_events or any(
        new_root.id in b.items.root_events for b in state.current.pending.values())


def exchanges_without(h, root) -> None:
    """Ten seconds of the batch's exchanges, answered, none of them asking for ``root``'s thread."""
    for _ in range(10):
        h.advance(1.1)
        for g in exchanges(h):
            assert root.id not in g.args[2].to_json()
            finish(h, g)


def test_a_root_received_since_the_exchange_read_its_holdings_does_not_join(tmp_path):
    """Another relay's pages brought the new root after this batch read the own relay: the
    exchange still finds it missing, but it is no one's to fetch here, and its thread takes
    the usual round once stored (where another relay's lead is followed): its thread joins
    none of this batch's filters (bench/scale: followers' pages brought threads another
    relay was fetching)."""
    h = ManagerHarness(tmp_path)
    repo, known = world(h)
    new_root = issue(Author.named("reporter"), repo, subject="fetched elsewhere")
    h.manager.seen[new_root.id] = h.clock.now
    run_until_layer2_found(h, [new_root])
    assert not h.state(A).current.threads_ahead.roots(h.clock.now)
    exchanges_without(h, new_root)
    assert not [r for r in h.historic_reqs(A) if any(asks(f, new_root.id) for f in r[2:])]


def test_ids_too_many_to_join_leave_the_new_root_its_own_round(tmp_path):
    """The counterpart: the #a exchange finds more ids missing than one thread filter of
    each shape can take (600 and the new root: more than a filter's tag budget), so none
    joins, and the root, once stored, gets its thread reconciled then."""
    h = ManagerHarness(tmp_path)
    repo, known = world(h)
    new_root = issue(Author.named("reporter"), repo, subject="found among many")
    many = [type("Found", (), {"id": f"{n:064x}"})() for n in range(600)]
    run_until_layer2_found(h, [new_root, *many])
    assert not h.state(A).current.threads_ahead.roots(h.clock.now)
    exchanges_without(h, new_root)
    started = len(h.effects.spawned)
    h.own_relay_holds(new_root)
    h.answer_own_reads(held=lambda f: [HELD, *HOLDINGS(f)])
    h.advance(5)
    later = [g for g in h.effects.spawned[started:] if g.name == "reconcile_filter"]
    later_reqs = [r for r in h.historic_reqs(A) if any(asks(f, new_root.id) for f in r[2:])]
    assert later or later_reqs, "the new root's thread was never asked"


def test_a_batchs_thread_exchanges_wait_for_its_layer2_exchanges(tmp_path):
    """Gate off: the batch's thread exchanges do not start while its #a exchange runs
    (what it finds missing may be roots whose threads join them), then all go."""
    h = ManagerHarness(tmp_path, background_start_interval_ms=0)
    repo, known = world(h)
    layer2 = 0
    for _ in range(10):  # the others answer, the layer-2 ones once all have started
        h.advance(0.1)
        assert not any(filter_plan.asks_by_root(g.args[2]) for g in exchanges(h))
        for g in exchanges(h):
            if not filter_plan.asks_by_repo(g.args[2]):
                finish(h, g)
        layer2 = sum(filter_plan.asks_by_repo(g.args[2]) for g in exchanges(h))
        if layer2 == 3:  # #a, #A, #q
            break
    assert layer2 == 3
    for g in exchanges(h):
        finish(h, g)
    h.advance(0.1)
    assert sum(filter_plan.asks_by_root(g.args[2]) for g in exchanges(h)) == 3


def test_their_live_coverage_outlives_a_consolidation_until_it_expires(tmp_path):
    """A consolidation rebuilds every live subscription from what the relay is asked for:
    the ids noted ahead stay covered (a root among them may be stored any moment), for
    THREADS_AHEAD_SECS, after which the next one leaves them out."""
    from gsync import constants

    h = ManagerHarness(tmp_path)
    repo, _known = world(h)
    new_root = issue(Author.named("reporter"), repo, subject="covered live")
    run_until_layer2_found(h, [new_root])
    state = h.state(A)

    def live_asks() -> bool:
        return any(asks(f, new_root.id) for sub in state.current.live_subs.values() for f in (
            json.loads(flt.to_json()) for flt in sub.filters))

    h.manager.live.consolidate(state)
    assert live_asks()
    h.advance(constants.THREADS_AHEAD_SECS)
    h.manager.live.consolidate(state)
    assert not live_asks()


def test_what_an_exchange_read_before_an_own_relay_outage_is_not_kept(tmp_path):
    """The own relay went down while a merged exchange read the new values' holdings: it
    may have come back with less (a relay in memory: nothing), so that read is not kept and
    the values are read again when next asked."""
    from gsync.io.inbox import OwnRelayState

    h = ManagerHarness(tmp_path)
    repo, _known = world(h)
    new_root = issue(Author.named("reporter"), repo, subject="read across an outage")
    run_until_layer2_found(h, [new_root])
    merged = None
    for _ in range(20):
        h.advance(1.1)
        merged = next((g for g in exchanges(h) if g.kwargs.get("read_also") is not None), None)
        if merged is not None:
            break
        for g in exchanges(h):
            finish(h, g)
    assert merged is not None
    h.feed(OwnRelayState(False, h.clock.now))
    h.feed(OwnRelayState(True, h.clock.now + 1))
    finish(h, merged)
    assert h.manager.own_held.missing(merged.kwargs["read_also"], h.clock.now) is not None
