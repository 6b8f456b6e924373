"""The planner's actions carried out by the manager (``io.manager.historic.HistoricSync.
execute``), in one process (tests/manager_harness.py): what the pure tests of
tests/test_planner*.py assert was asked is done."""
from gsync import constants
from gsync.io.inbox import NegentropyFinished
from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.protocol import messages as wire
from gsync.sync.filter_plan import layer1_filter
from gsync.sync.health import HealthState
from gsync.sync.policy import coverage_key
from gsync.sync.relay_state import ConnectionStatus
from gsync.sync.start_queue import ExchangeToken

from .factory import Author, announcement, issue
from .manager_harness import ManagerHarness, resync_holdings
from .test_manager_decisions import listed_on

A, B = "wss://a.example", "wss://b.example"
LAYER1 = layer1_filter()


def test_a_historic_req_is_closed_on_the_relay_once_its_eose_came(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 2))
    h.connect(A)
    h.answer_own_reads()  # the own relay holds nothing: REQ pages
    h.advance(1.1)
    [first, *_] = h.historic_reqs(A)
    h.relay_says(A, wire.Eose(first[1]))
    assert ["CLOSE", first[1]] in h.frames(A, "CLOSE")
    assert first[1] not in h.conn(A).subscriptions


def test_an_exchange_the_relay_serves_lifts_it_out_of_probing_after_a_rate_limit(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 1))
    h.connect(A)
    h.answer_own_reads(held=resync_holdings())  # a re-sync: every filter by NIP-77
    h.advance(1.1)
    [g, *_] = [g for g in h.effects.spawned if g.name == "reconcile_filter"]
    h.relay_says(A, wire.Notice("rate-limited: slow down"))
    h.advance(constants.RATE_LIMIT_COOLDOWN_SECS + 1)
    assert h.manager.health.state(A, h.clock.now) is HealthState.PROBING
    h.feed(NegentropyFinished(A, h.state(A).session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2],
                              NegentropyOutcome(True, rounds=1)))
    assert h.manager.health.state(A, h.clock.now) is not HealthState.PROBING


def test_a_probe_the_relay_serves_restores_the_shape_it_probed(tmp_path):
    paused, shape = _probed(tmp_path)
    assert not paused.is_filter_paused(shape)


def _probed(tmp_path, failed: bool = False, unreached: bool = False):
    """A layer-1 shape paused, probed a day later, the relay's EOSE its answer; ``failed``:
    its probe's batch marked failed before (only ``unreached``: pages no REQ reaches there;
    or otherwise). (the pauses, the shape)"""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 1))
    h.connect(A)
    h.settle(A)
    state = h.state(A)
    shape = next(f for f in h.manager.refusals.coverage_filters(state, coverage_key(LAYER1)))
    h.manager.refusals.pause_coverage(state, shape, "blocked: not now")
    h.advance(constants.POLICY_PROBE_SECS + 1)
    h.manager.refusals.run_policy_probes(h.clock.now)
    h.advance(1.1)
    probe = h.historic_reqs(A)[-1]
    if failed:
        state.current.pending[state.current.sub_to_batch[probe[1]]].mark_failed(unreached=unreached)
    h.relay_says(A, wire.Eose(probe[1]))
    return state.paused, shape


def test_a_probe_the_relay_served_and_left_unpaged_restores_the_shape(tmp_path):
    """Seed 239 of the stress mix with ``--per-filter 0.5 --ahead 0.3 --own-full 0.3``
    (left_behind, day 19.04): relay1, ignoring ``until``, served the probe of #a a day
    after refusing it, and its batch failed as unreached (a page it left unpaged); taken as
    no answer, #a stayed paused a day more, and an issue of a repository only relay1 listed
    with it. Served, the shape is restored; what no REQ reaches there is NIP-77's."""
    paused, shape = _probed(tmp_path, failed=True, unreached=True)
    assert not paused.is_filter_paused(shape)


def test_a_probe_whose_batch_failed_otherwise_pauses_the_shape_another_day(tmp_path):
    paused, shape = _probed(tmp_path, failed=True)
    assert paused.is_filter_paused(shape)


def test_a_nip77_refusal_for_rate_starts_the_cooldown(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 1))
    h.connect(A)
    h.answer_own_reads(held=resync_holdings())
    h.advance(1.1)
    [g, *_] = [g for g in h.effects.spawned if g.name == "reconcile_filter"]
    h.feed(NegentropyFinished(A, h.state(A).session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2],
                              NegentropyOutcome(False, reason="rate-limited: slow down")))
    assert h.manager.health.is_rate_limited(A, h.clock.now)


def test_a_small_residual_is_asked_by_id_again_at_once_where_the_gate_is_open(tmp_path):
    h = ManagerHarness(tmp_path)
    owner = Author.named("owner")
    repo = announcement(owner, "r", relays=[A])
    h.own_relay_holds(repo)
    h.connect(A)
    h.answer_own_reads(held=resync_holdings())
    issues = [issue(owner, repo, subject=f"i{i}") for i in range(10)]
    told = False  # the first exchange to answer finds the ten issues missing, the others nothing
    for _ in range(30):
        h.advance(1.1)
        for g in [g for g in h.effects.spawned if g.name == "reconcile_filter"]:
            h.effects.spawned.remove(g)
            found, told = ([] if told else [e.id for e in issues]), True
            h.feed(NegentropyFinished(A, h.state(A).session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2],
                                      NegentropyOutcome(True, need_ids=found, rounds=1)))
        session = h.state(A).current
        if not session.neg_running and not session.historic_queue and any("ids" in r[2] for r in h.historic_reqs(A)):
            break  # every exchange answered, what they found asked by id
    [fetch] = [r for r in h.historic_reqs(A) if "ids" in r[2]]
    h.advance(1.1)  # the gate is open
    h.relay_sends(A, fetch[1], *issues[:9])  # one short
    h.relay_says(A, wire.Eose(fetch[1]))
    again = [r for r in h.historic_reqs(A) if "ids" in r[2]][1:]
    assert [r[2]["ids"] for r in again] == [[issues[9].id]]


def test_a_batch_needing_what_a_read_under_way_reads_waits_for_it_and_goes_once_it_lands(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 1), *listed_on(B, 1, name="v"))
    h.connect(A)
    h.close_own_read_window()
    assert h.own_reads()  # layer 1 among what it reads
    h.connect(B)  # B's layer 1: the same filter, under way
    assert h.manager.own_reads.awaited
    h.answer_own_reads()
    h.advance(1.1)
    assert any("#d" not in flt and flt.get("kinds") for r in h.historic_reqs(B) for flt in r[2:])
    assert not h.manager.own_reads.awaited


def test_a_rate_limit_turns_the_queued_exchanges_into_reqs(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 2))
    h.connect(A)
    h.answer_own_reads(held=resync_holdings())  # a re-sync: every filter by NIP-77
    assert any(isinstance(sub_id, ExchangeToken) for sub_id, _ in h.state(A).current.historic_queue)
    h.relay_says(A, wire.Notice("rate-limited: slow down"))
    assert h.state(A).current.historic_queue
    assert not any(isinstance(sub_id, ExchangeToken) for sub_id, _ in h.state(A).current.historic_queue)


def test_a_recovery_attempt_that_brings_everything_moves_the_relay_back_to_connected(tmp_path):
    h = ManagerHarness(tmp_path)
    owner = Author.named("owner")
    repo = announcement(owner, "r", relays=[A])
    h.own_relay_holds(repo)
    h.connect(A)
    lost = issue(owner, repo)
    h.state(A).batch_failures = True  # a batch failed: its missing event goes to recovery
    h.manager.recovery.add_missing(A, [lost.id], h.clock.now)
    h.settle(A)
    assert h.state(A).status is ConnectionStatus.CONNECTED_HISTORIC_SYNC_FAILURES
    for _ in range(20):
        h.advance(constants.RECOVERY_BASE_SECS)
        h.tick()
        h.advance(1.1)
        fetches = [r for r in h.historic_reqs(A) if lost.id in r[2].get("ids", ())]
        if fetches:
            break
    h.relay_sends(A, fetches[0][1], lost)
    h.relay_says(A, wire.Eose(fetches[0][1]))
    assert h.state(A).status is ConnectionStatus.CONNECTED
