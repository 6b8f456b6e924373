"""An id a relay advertises through NIP-77 and serves neither by id nor by its filter, in one
process (tests/manager_harness.py): the relay keeps NIP-77, the id is not asked there again
before its next daily fresh start, and it is asked by id from another relay listing the
repository. (End to end, over real sockets: tests/test_unservable_e2e.py.)"""
import json

import pytest

from gsync import constants
from gsync.io.inbox import HandshakeDone, NegentropyFinished, RelayDisconnected
from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.ops import metrics
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter
from gsync.sim.relay import filter_from_json
from gsync.sync import filter_plan
from gsync.sync.policy import coverage_key
from gsync.sync.relay_state import ConnectionStatus
from gsync.sync.start_queue import is_exchange

from .factory import Author, announcement, issue
from .manager_harness import FakeWs, ManagerHarness, resync_holdings
from .scenario import is_values_proof

A, B = "wss://a.example", "wss://b.example"
# the own relay holds enough of every filter that NIP-77 pays at production prices (sync.method)
HELD = resync_holdings()
owner, bob = Author.named("owner"), Author.named("bob")


pytestmark = pytest.mark.usefixtures("answers_are_prompt")  # (conftest.py: the loop answers late)


def world(h, relays=(A,)):
    repo = announcement(owner, "r", relays=list(relays))
    hidden = issue(bob, repo, subject="advertised, never served")
    h.own_relay_holds(repo, issue(owner, repo))
    return repo, hidden


def run(h, url, advertised, by_id=False, by_filter=False, refused=lambda flt: False, silent=lambda filters: False,
        never=(), slow_by_id=False):
    """``url``'s exchanges find missing what of ``advertised`` their filter matches (those
    ``refused`` get a NEG-ERR); its historic REQs end (but those ``silent``: no word ever),
    with those events where they are served (``by_id``: to REQs of ids; ``by_filter``: to
    the others; those ``never`` not at all; ``slow_by_id``: REQs of ids answered two rounds
    later, over 2.2 s after they went). Until nothing is left to start, then the completion
    check's wait. Returns how many exchanges it answered."""
    exchanges = 0
    waited: dict[str, int] = {}
    for _ in range(40):
        h.answer_own_reads(held=HELD)
        h.advance(1.1)
        state = h.state(url)
        for g in [g for g in h.effects.spawned if g.name == "reconcile_filter" and g.args[0] is h.conn(url)]:
            h.effects.spawned.remove(g)
            exchanges += 1
            need = [e.id for e in advertised if g.args[2].matches(e)]
            outcome = (NegentropyOutcome(False, reason="error: not this one", failure="neg-err") if refused(g.args[2])
                       else NegentropyOutcome(True, need_ids=need, rounds=1))
            h.feed(NegentropyFinished(url, state.session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2], outcome))
        historic = [(sub_id, fs.filters) for sub_id, fs in h.conn(url).subscriptions.items()
                    if sub_id not in state.current.live_subs and not silent(fs.filters)]
        for sub_id, filters in historic:
            if slow_by_id and all(f.ids is not None for f in filters) and waited.get(sub_id, 0) < 2:
                waited[sub_id] = waited.get(sub_id, 0) + 1
                continue
            served = by_id if all(f.ids is not None for f in filters) else by_filter
            events = [e for e in advertised if served and e not in never and any(f.matches(e) for f in filters)]
            if events:
                h.relay_sends(url, sub_id, *events)
            h.relay_says(url, wire.Eose(sub_id))
        if not historic and not state.current.historic_queue and not state.current.neg_running and not h.own_reads():
            break
    h.advance(10)
    return exchanges


def sent(h, url) -> int:
    """Frames sent to ``url`` so far, all its sessions (``asks``' ``after``)."""
    return sum(len(conn.frames) for conn in h.effects.connections.get(url, []))


def asks(h, url, event, after: int = 0) -> tuple[int, int]:
    """(REQs asking ``event`` by id, REQs whose filters match it otherwise) sent to ``url``, all
    its sessions; ``after``: only those after that many frames (``sent``): a filter with no
    ``since`` sent before ``event`` was made matches it too."""
    by_id = by_filter = 0
    frames = [frame for conn in h.effects.connections.get(url, []) for frame in conn.frames]
    for frame in frames[after:]:
        if frame[0] != "REQ" or all(f.get("limit") == 0 for f in frame[2:]):
            continue
        if any(is_values_proof(f) for f in frame[2:]):
            continue  # (the daily proof of how wide a list the relay reads: tests/test_values_reach.py)
        filters = [filter_from_json(f) for f in frame[2:]]
        if any(f.ids is not None and event.id in f.ids for f in filters):
            by_id += 1
        elif any(f.matches(event) for f in filters):
            by_filter += 1
    return by_id, by_filter


def unservable_count(url) -> float:
    return metrics.REGISTRY.get_sample_value("gsync_events_unservable_total", {"relay": url}) or 0.0


def test_one_id_served_neither_by_id_nor_by_its_filter_is_unservable_there_and_costs_the_relay_nothing_else(tmp_path):
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    counted = unservable_count(A)
    h.connect(A)
    run(h, A, [hidden])
    state = h.state(A)
    assert state.serves_ids(h.clock.now) and state.ids_unserved_at is None, "the relay keeps its NIP-77"
    assert hidden.id in state.unservable
    assert unservable_count(A) == counted + 1
    assert state.status is ConnectionStatus.CONNECTED, "what is not there is not a failure"
    assert asks(h, A, hidden) == (1, 1), "once by id, once by the filter that found it"
    assert not h.recovering(A)
    for _ in range(60):  # recovery's attempts would come in this hour
        h.advance(60)
        h.tick()
    assert asks(h, A, hidden) == (1, 1)

    # A fresh start that is not the daily one (away for more than 15 minutes): its NIP-77
    # finds the id missing again, and it is not asked.
    h.feed(RelayDisconnected(A, state.session, "gone"))
    h.advance(16 * 60)
    h.tick()
    h.feed(HandshakeDone(A, state.attempt, ws=FakeWs()))
    run(h, A, [hidden])
    assert asks(h, A, hidden) == (1, 1)
    assert unservable_count(A) == counted + 1

    # The daily fresh start asks it again (it may be served now).
    h.advance(state.next_daily_at - h.clock.now + 1)
    h.tick()
    assert hidden.id not in state.unservable
    run(h, A, [hidden], by_id=True)
    assert asks(h, A, hidden) == (2, 1)


def test_an_id_unservable_the_day_before_is_asked_by_id_once_at_the_daily_fresh_start_not_retried(tmp_path):
    """Found by the simulator (seed 33): an id advertised with others the relay serves by id
    gets the residual's retry by id (lag), then its filter: unservable there. The next daily
    fresh start asks it again, by id, once, then by its filter: it was unservable the day
    before, not lag (it was asked by id four times in 23.6 h, two daily fresh starts)."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, hidden = world(h)
    h.connect(A)
    served = [issue(bob, repo, subject=f"served {i}") for i in range(2)]
    run(h, A, [hidden, *served], by_id=True, never=[hidden])
    state = h.state(A)
    assert hidden.id in state.unservable and state.serves_ids(h.clock.now)
    assert asks(h, A, hidden) == (2, 1), "by id, once more by id (lag), then by its filter"

    h.advance(state.next_daily_at - h.clock.now + 1)
    h.tick()
    assert hidden.id not in state.unservable
    more = [issue(bob, repo, subject=f"later {i}") for i in range(2)]
    run(h, A, [hidden, *more], by_id=True, never=[hidden])
    assert hidden.id in state.unservable
    assert asks(h, A, hidden) == (3, 2), "asked again by id once, then by its filter"


def test_a_filter_that_brings_what_the_id_fetch_did_not_says_the_relay_does_not_serve_ids(tmp_path):
    h = ManagerHarness(tmp_path)
    _, hidden = world(h)
    h.connect(A)
    run(h, A, [hidden], by_filter=True)
    state = h.state(A)
    assert state.ids_unserved_at is not None and not state.serves_ids(h.clock.now)
    assert hidden.id not in state.unservable
    assert asks(h, A, hidden) == (1, 1)


def test_an_id_fetch_answered_slowly_with_nothing_is_no_witness_that_the_relay_does_not_serve_ids(
        tmp_path, monkeypatch):
    """A relay stopping slow queries at its time budget may stop a fetch by id before its
    first event, the second ask too; its filter then brings the event. That says nothing of
    ids (the stress world's seed 2131: a relay judged not to serve ids for a day so)."""
    monkeypatch.setattr(constants, "TIME_CUT_SUSPECT_SECS", 2.0)  # (this test's subject: slowness)
    h = ManagerHarness(tmp_path)
    _, hidden = world(h)
    h.connect(A)
    run(h, A, [hidden], by_filter=True, slow_by_id=True)
    state = h.state(A)
    assert state.ids_unserved_at is None and state.serves_ids(h.clock.now), "the relay keeps its NIP-77"
    assert asks(h, A, hidden) == (2, 1), "by id, once more (slow and empty), then by its filter"


def test_an_id_unservable_on_one_relay_is_asked_by_id_from_another_listing_its_repository(tmp_path):
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h, relays=(A, B))
    h.connect(B)
    run(h, B, [])  # B lacks it (it comes to B later)
    h.connect(A)
    run(h, A, [hidden])
    assert hidden.id in h.state(A).unservable
    assert h.recovering(B) == {hidden.id}
    assert not h.recovering(A)
    for _ in range(5):
        h.advance(2)
        h.tick()
    by_id, by_filter = asks(h, B, hidden)
    assert by_id >= 1 and by_filter == 0, "asked by id, never by a whole filter"


def test_an_id_unservable_on_one_relay_is_asked_of_each_other_relay_once_a_day(tmp_path):
    """Found by the simulator (seeds 3 and 4, a year): the other relays listing the
    repository are asked the id by id once each; one that does not serve it either (lacks
    it, or hides it as the first does) is not asked again with recovery's backoff (that was
    4 asks within the hour, a dozen in 2.5 h, every day): it is unservable there too, until
    its next daily fresh start, and asks no one else."""
    C = "wss://c.example"
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h, relays=(A, B, C))
    for url in (B, C):
        h.connect(url)
        run(h, url, [])  # they lack it
    h.connect(A)
    run(h, A, [hidden])
    assert h.recovering(B) == h.recovering(C) == {hidden.id}
    counted = unservable_count(B)
    for _ in range(30):  # recovery's backoff would have asked a dozen times in these hours
        h.advance(300)
        h.tick()
        for url in (B, C):
            run(h, url, [])  # their REQs end, without it
    for url in (B, C):
        assert asks(h, url, hidden) == (1, 0), "asked by id once, never by a whole filter"
        assert hidden.id in h.state(url).unservable
        assert not h.recovering(url)
    assert unservable_count(B) == counted + 1
    assert asks(h, A, hidden) == (1, 1)


def test_recovery_asks_an_id_by_its_filter_once_and_then_it_is_unservable_there(tmp_path):
    """An id recovery holds for a relay (one it skipped while another relay fetched it, say):
    asked by id, then once by the filter that found it; that filter not bringing it either,
    it is unservable there, counted, and neither is asked again."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, hidden = world(h)
    h.connect(A)
    run(h, A, [])
    counted = unservable_count(A)
    found_by = Filter.make(tags={"a": [repo.address]})
    h.manager.recovery.add_missing(A, [hidden.id], h.clock.now, found_by={hidden.id: found_by})
    for _ in range(60):
        h.advance(2)
        h.tick()
        run(h, A, [hidden])  # its REQs end, without it
    assert asks(h, A, hidden) == (1, 1)
    assert hidden.id in h.state(A).unservable and unservable_count(A) == counted + 1
    assert not h.recovering(A)
    h.manager.historic.recover_ids(A, {hidden.id: found_by})  # a relay's claim released, say
    assert not h.recovering(A), "not asked there again"


def stall_out(h):
    """The silent REQs' stall deadline passes."""
    h.advance(constants.REQ_STALL_SECS + 1)
    h.tick()


def test_an_id_is_judged_by_its_filter_when_another_req_of_its_batch_never_finished(tmp_path):
    """The batch fails (its #E went by REQ pages, and they never ended), but the filter that
    found the id answered without it: unservable there, not asked again by recovery."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    h.connect(A)

    def thread_E(flt):
        return any(name == "E" for name, _ in flt.tags)

    def silent(filters):
        return any(map(thread_E, filters))

    run(h, A, [hidden], refused=thread_E, silent=silent)
    state = h.state(A)
    for _ in range(5):  # a REQ that stalled is sent again alone, and stalls again
        stall_out(h)
        run(h, A, [hidden], silent=silent)
        if state.status is not ConnectionStatus.SYNCING:
            break
    assert state.status is ConnectionStatus.CONNECTED_HISTORIC_SYNC_FAILURES  # the #E pages
    assert any(map(thread_E, h.manager.recovery.pending_filters(A)))
    assert hidden.id in state.unservable
    assert hidden.id not in h.recovering(A)
    assert asks(h, A, hidden) == (1, 1)


def test_an_id_whose_filter_never_answered_is_not_judged_but_recovered(tmp_path):
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    h.connect(A)

    def residual(filters):  # the filter asked for what the id fetch did not serve
        return any(name == "a" for f in filters for name, _ in f.tags) and h.frames(A, "REQ")[-1][2:] == [
            json.loads(f.to_json()) for f in filters]

    run(h, A, [hidden], silent=residual)
    stall_out(h)
    run(h, A, [hidden])
    state = h.state(A)
    assert hidden.id not in state.unservable
    assert hidden.id in h.recovering(A)


def test_an_id_fetch_that_never_answered_leaves_its_ids_to_recovery_with_the_filter_that_found_them(tmp_path):
    """Found by the simulator (seed 10's year, day 113.1): at a daily fresh start the relay
    sent no EOSE to the id fetch of an id it hides; the stalled fetch handed the id to
    recovery without the filter that found it, and recovery asked it by id twice more (an id
    held without a filter), four asks by id in 23.8 h with the day before's two. An id fetch
    that never answered leaves its ids with their filter: recovery asks by id once, then by
    that filter (SPEC §4 residuals: never only by id again); not brought, unservable there."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    h.connect(A)

    def id_fetch(filters):
        return any(f.ids is not None for f in filters) and h.clock.now < stalled_until

    stalled_until = float("inf")
    run(h, A, [hidden], silent=id_fetch)
    stall_out(h)
    stalled_until = h.clock.now
    assert hidden.id in h.recovering(A)
    for _ in range(30):  # recovery's attempts, on its backoff
        h.advance(60)
        h.tick()
        run(h, A, [hidden])  # its REQs end, without it
    state = h.state(A)
    assert asks(h, A, hidden) == (2, 1), "the stalled fetch, once by id by recovery, then by its filter"
    assert hidden.id in state.unservable and not h.recovering(A)
    assert state.serves_ids(h.clock.now), "one id not there costs the relay nothing"


def test_a_fresh_start_at_reconnect_shortly_before_the_daily_is_that_days_fresh_start(tmp_path):
    """Found by the simulator (seed 13's year, day 191.7): relay1 came back after more than 15
    minutes away (a fresh start: the whole history) two minutes before its daily fresh start
    was due, which then ran the whole history again and asked an id it hides again, and the
    next day's asked it a fourth time within 24 h. A fresh start at reconnect within the
    daily's spread (2 h) before it is that day's (``RelayState.daily_near``): the daily timer
    starts again from it, and the ids unservable there are asked again (they may be served
    now)."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    h.connect(A)
    run(h, A, [hidden])
    state = h.state(A)
    assert hidden.id in state.unservable and asks(h, A, hidden) == (1, 1)

    h.feed(RelayDisconnected(A, state.session, "gone"))
    h.advance(state.next_daily_at - h.clock.now - 30 * 60)  # back 30 minutes before the daily
    h.tick()
    h.feed(HandshakeDone(A, state.attempt, ws=FakeWs()))
    back = h.clock.now
    run(h, A, [hidden])
    assert state.next_daily_at >= back + constants.DAILY_MIN_SECS
    assert asks(h, A, hidden) == (2, 2), "asked again by id once, then by its filter"
    frames = len(h.conn(A).frames)
    for _ in range(60):  # the hour the daily was due in
        h.advance(60)
        h.tick()
    later = h.conn(A).frames[frames:]
    # (a fresh start asks layer 1 first, live and history; the descendants of the thread
    # members the own relay holds are watched meanwhile: a live REQ of their ids)
    assert not [m for m in later if m[0] == "REQ" and any(flt.get("kinds") == list(constants.LAYER1_KINDS) for flt in m[2:])], \
        "no second fresh start"


def _layer2_exchange_running(tmp_path):
    """Relay a's first layer-2 exchange started (threads queued behind it): (harness, its
    state, the exchange's greenlet, an issue the own relay lacks)."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, _ = world(h)
    wanted = issue(bob, repo, subject="served by id")
    h.connect(A)
    for _ in range(10):
        h.answer_own_reads(held=HELD)
        h.advance(1.1)
        layer2 = [g for g in h.effects.spawned if g.name == "reconcile_filter" and filter_plan.asks_by_repo(g.args[2])]
        if layer2:
            return h, h.state(A), layer2[0], wanted
    raise AssertionError("no layer-2 exchange started")


def test_what_an_exchange_found_is_fetched_by_id_when_the_batchs_last_exchange_is_dropped_for_a_paused_shape(tmp_path):
    """Found by the simulator (seed 13's year, day 329.97): a batch's layer-2 exchange found
    four ids missing, to be fetched by id when its thread exchange (queued behind it) had
    answered; the relay refused #e and #q by policy meanwhile, and that exchange was dropped
    before it started (``start_queue.regroup``) without fetching what the first had found.
    Never asked by id, the ids went to their filter, which brought one: the relay was judged
    not to serve ids. The batch's last exchange dropped so, what the others found is fetched
    by id, as at the last one's answer."""
    h, state, g, wanted = _layer2_exchange_running(tmp_path)
    assert any(is_exchange(token) and any(map(filter_plan.asks_by_root, group))
               for token, group in state.current.historic_queue), "a thread exchange waits behind it"
    for key in {coverage_key(f) for _, group in state.current.historic_queue for f in group
                if filter_plan.asks_by_root(f)}:
        state.paused.pause(key, h.clock.now)  # refused by policy meanwhile
    h.effects.spawned.remove(g)
    h.feed(NegentropyFinished(A, state.session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2],
                              NegentropyOutcome(True, need_ids=[wanted.id], rounds=1)))
    run(h, A, [wanted], by_id=True, by_filter=True)
    assert asks(h, A, wanted)[0] == 1, "fetched by id"
    assert state.ids_unserved_at is None and state.serves_ids(h.clock.now)


def test_what_an_exchange_found_is_fetched_by_id_when_a_rate_limit_turns_the_batchs_last_exchange_into_reqs(
        tmp_path):
    """Found by the simulator (seed 196, day 0.001): a batch's layer-2 exchange found two
    ids missing, to be fetched by id at its thread exchanges' answers; the relay then
    refused a REQ for rate (its queries limited), and its queued exchanges went as REQ pages
    (``exchanges_to_reqs``) without fetching what the first had found. Never asked by id,
    the ids went to their filter, which brought them: the relay was judged not to serve
    ids. Now what the exchanges found is fetched by id as the last one turns into REQs."""
    h, state, layer2, wanted = _layer2_exchange_running(tmp_path)
    for g in [g for g in h.effects.spawned if g.name == "reconcile_filter"]:  # those running answer
        h.effects.spawned.remove(g)
        need = [wanted.id] if g is layer2 else []
        h.feed(NegentropyFinished(A, state.session, g.kwargs["batch_id"], g.kwargs["token"], g.args[2],
                                  NegentropyOutcome(True, need_ids=need, rounds=1)))
    assert not state.current.neg_running
    assert any(is_exchange(token) for token, _ in state.current.historic_queue), "exchanges wait, not started"
    live = next(iter(state.current.live_subs))
    h.relay_says(A, wire.parse_relay_message(json.dumps(["CLOSED", live, "rate-limited: too many queries"])))
    assert not any(is_exchange(token) for token, _ in state.current.historic_queue)
    h.advance(constants.RATE_LIMIT_COOLDOWN_SECS + 1)
    run(h, A, [wanted], by_id=True, by_filter=True)
    assert asks(h, A, wanted)[0] == 1, "fetched by id"
    assert state.ids_unserved_at is None and state.serves_ids(h.clock.now)


def test_an_id_unservable_the_day_before_is_not_retried_by_id_beside_a_new_one_that_is(tmp_path):
    """Found by the simulator (seed 1's year of 20 relays, day 182.05): at the daily fresh
    start two ids unservable there the day before were missing again beside a third, new
    one; the residual's retry by id (lag) asked all three, the two a fourth time in 23.4 h.
    Only the new one is retried by id; all go to their filter then."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, hidden = world(h)
    h.connect(A)
    served = [issue(bob, repo, subject=f"served {i}") for i in range(2)]
    run(h, A, [hidden, *served], by_id=True, never=[hidden])
    state = h.state(A)
    assert hidden.id in state.unservable and asks(h, A, hidden) == (2, 1)

    h.advance(state.next_daily_at - h.clock.now + 1)
    h.tick()
    day_two = sent(h, A)
    new = issue(bob, repo, subject="new, never served either")
    more = [issue(bob, repo, subject=f"later {i}") for i in range(3)]
    run(h, A, [hidden, new, *more], by_id=True, never=[hidden, new])
    assert hidden.id in state.unservable and new.id in state.unservable
    assert asks(h, A, new, after=day_two) == (2, 1), "new: by id, once more by id (lag); then by its filter"
    assert asks(h, A, hidden) == (3, 2), "unservable the day before: asked again by id once, then by its filter"


def test_twenty_ids_served_neither_by_id_nor_by_their_filter_cost_the_relay_nothing(tmp_path):
    """Found by the simulator (seed 28's year, day 349.24): a relay that still advertised 20
    events it would not serve (hidden on read, gathered over months) lost its NIP-77 at
    every daily fresh start, judged by the seed's count (20 advertised, none served by id)
    before their filter was asked. The filter is the witness: it brought none of them
    either, so they are not there, and the relay serves ids."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, _ = world(h)
    hidden = [issue(bob, repo, subject=f"advertised, never served {i}") for i in range(25)]
    h.connect(A)
    run(h, A, hidden, by_id=True, by_filter=True, never=hidden)
    state = h.state(A)
    assert state.ids_unserved_at is None and state.serves_ids(h.clock.now), "the relay keeps its NIP-77"
    assert all(e.id in state.unservable for e in hidden)
    assert all(asks(h, A, e) == (1, 1) for e in hidden), "once by id, once by the filter that found it"

    h.advance(state.next_daily_at - h.clock.now + 1)  # the daily fresh start asks them again
    h.tick()
    day_two = sent(h, A)
    assert run(h, A, hidden, by_id=True, by_filter=True, never=hidden), "by NIP-77 still"
    assert state.ids_unserved_at is None and state.serves_ids(h.clock.now)
    assert all(asks(h, A, e, after=day_two) == (1, 1) for e in hidden)


def test_twenty_ids_not_served_by_id_whose_filter_brings_them_say_the_relay_does_not_serve_ids(tmp_path):
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, _ = world(h)
    advertised = [issue(bob, repo, subject=f"served by filter only {i}") for i in range(25)]
    h.connect(A)
    run(h, A, advertised, by_filter=True)
    state = h.state(A)
    assert state.ids_unserved_at is not None and not state.serves_ids(h.clock.now)
    assert not any(e.id in state.unservable for e in advertised)


def test_twenty_ids_not_served_by_id_whose_filter_never_answered_are_judged_by_the_count(tmp_path):
    """No witness (the filter asked for them stalled): the seed's count decides, 20
    advertised and none served by id."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    repo, _ = world(h)
    advertised = [issue(bob, repo, subject=f"never served by id {i}") for i in range(25)]
    h.connect(A)

    def residual(filters):  # the filter asked for what the id fetch did not serve
        return any(name == "a" for f in filters for name, _ in f.tags) and h.frames(A, "REQ")[-1][2:] == [
            json.loads(f.to_json()) for f in filters]

    run(h, A, advertised, silent=residual)
    stall_out(h)
    run(h, A, advertised)
    state = h.state(A)
    assert state.ids_unserved_at is not None and not state.serves_ids(h.clock.now)


def test_an_id_the_daily_fresh_start_asked_by_id_is_not_asked_so_again_by_a_fresh_start_after_a_cut(tmp_path):
    """Found by the simulator (seed 46's year, day 293.99): the daily fresh start asked an id
    unservable there the day before by id, once, and the connection dropped before its
    filter answered; the fresh start at the reconnect asked it by id again, a fourth time in
    23.7 h. The day's ask by id was had: the reconnect asks it by its filter only."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    h.connect(A)
    run(h, A, [hidden], by_id=True, never=[hidden])
    state = h.state(A)
    assert hidden.id in state.unservable

    h.advance(state.next_daily_at - h.clock.now + 1)
    h.tick()
    daily = sent(h, A)

    def residual(filters):  # the filter asked for what the id fetch did not serve: cut off
        return any(name == "a" for f in filters for name, _ in f.tags) and h.frames(A, "REQ")[-1][2:] == [
            json.loads(f.to_json()) for f in filters]

    run(h, A, [hidden], by_id=True, never=[hidden], silent=residual)
    assert asks(h, A, hidden, after=daily)[0] == 1, "the daily's ask by id"
    h.feed(RelayDisconnected(A, state.session, "gone"))
    h.advance(16 * 60)  # away long enough for a fresh start, the daily not near
    h.tick()
    h.feed(HandshakeDone(A, state.attempt, ws=FakeWs()))
    run(h, A, [hidden], by_id=True, never=[hidden])
    assert asks(h, A, hidden, after=daily)[0] == 1, "not by id again that day"
    assert asks(h, A, hidden, after=daily)[1] >= 1, "by its filter"
    assert hidden.id in state.unservable


def test_an_id_asked_by_id_and_not_served_is_not_asked_so_again_that_day_after_a_cut(tmp_path):
    """Found by the simulator (seed 300's year, day 191.77): the daily fresh start asked ids
    new that day by id, and once more (the residual retry); the connection dropped before
    their filter answered, and the fresh start at the reconnect asked them by id a third
    time (the next daily, 23 h on, a fourth within a day). Asked by id and not served, an id
    goes to its filter from then on that day, whatever it was the day before."""
    h = ManagerHarness(tmp_path, recovery_base_secs=1)
    _, hidden = world(h)
    h.connect(A)
    state = h.state(A)
    first = sent(h, A)

    def residual(filters):  # the filter asked for what the id fetch did not serve: cut off
        return any(name == "a" for f in filters for name, _ in f.tags) and h.frames(A, "REQ")[-1][2:] == [
            json.loads(f.to_json()) for f in filters]

    run(h, A, [hidden], by_id=True, never=[hidden], silent=residual)
    by_id = asks(h, A, hidden, after=first)[0]
    assert 1 <= by_id <= 2, by_id  # the ask, and the residual retry
    assert hidden.id not in state.unservable  # no verdict yet: its filter was cut off
    h.feed(RelayDisconnected(A, state.session, "gone"))
    h.advance(16 * 60)  # away long enough for a fresh start, the daily not near
    h.tick()
    h.feed(HandshakeDone(A, state.attempt, ws=FakeWs()))
    run(h, A, [hidden], by_id=True, never=[hidden])
    assert asks(h, A, hidden, after=first)[0] == by_id, "not by id again that day"
    assert hidden.id in state.unservable  # its filter's verdict
