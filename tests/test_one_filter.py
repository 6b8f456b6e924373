"""gsync/sync/one_filter.py: which answers could come from a relay answering one filter a
REQ, which of their filters to ask alone, and how."""
import pytest

from gsync import constants
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter
from gsync.sync import one_filter


def test_an_answer_one_filter_explains_is_suspect_and_the_others_are_candidates():
    # the first filter matches all it brought: it may be all the relay answered; the third
    # matched nothing; the second matched some (answered, or cut by a cap of its own)
    assert one_filter.unserved_candidates([{"x", "y"}, {"y"}, set()]) == [2]
    # two filters matching all of it (#e and #E of top-level comments): the rest are candidates
    assert one_filter.unserved_candidates([{"x"}, {"x"}, set(), set()]) == [2, 3]
    assert one_filter.unserved_candidates([{"x"}, {"x"}]) == []


def test_nothing_brought_leaves_every_filter_a_candidate():
    assert one_filter.unserved_candidates([set(), set(), set()]) == [0, 1, 2]


def test_an_answer_that_needs_two_filters_proves_more_than_one_answered():
    assert one_filter.unserved_candidates([{"x"}, {"y"}]) is None
    assert one_filter.unserved_candidates([{"x", "z"}, {"y", "z"}, set()]) is None


def test_a_req_of_one_filter_is_never_suspect():
    assert one_filter.unserved_candidates([set()]) is None
    assert one_filter.unserved_candidates([]) is None


def test_layer_1_is_probed_first_then_repository_tags_then_the_rest():
    filters = [Filter(tags=(("q", ("30617:p:d",)),)), Filter(kinds=(30618,), tags=(("d", ("d",)),)),
               Filter(tags=(("a", ("30617:p:d",)),)), Filter(kinds=(30617, 10317)),
               Filter(tags=(("A", ("30617:p:d",)),))]
    assert one_filter.probe_order(filters, [0, 1, 2, 3, 4]) == [3, 2, 4, 0, 1]
    assert one_filter.probe_order(filters, [4, 0]) == [4, 0]
    # a filter on a later page was answered before: the others first
    paged = [filters[3].replace(until=100), *filters[1:3]]
    assert one_filter.probe_order(paged, [0, 1, 2]) == [2, 1, 0]


def test_a_probe_asks_one_event_no_newer_than_the_answer_could_have_brought():
    flt = Filter(tags=(("a", ("30617:p:d",)),), limit=5000)
    assert one_filter.probe_filter(flt, 1000) == flt.replace(limit=1, until=1000)
    paged = flt.replace(until=900)  # a page's: older than the second it is bounded to
    assert one_filter.probe_filter(paged, 1000).until == 899
    assert one_filter.probe_filter(paged, 800).until == 800


# -- the proof outlives the session (in one process: tests/manager_harness.py) --------------

def probes_sent(h, url: str) -> list:
    """The one-filter probes sent to ``url`` this session: REQs of one filter asking one event."""
    return [r for r in h.historic_reqs(url) if len(r) == 3 and r[2].get("limit") == 1]


def answer_everything_empty(h, url: str) -> None:
    for _ in range(8):
        h.answer_own_reads()
        h.advance(1.1)
        h.eose_all(url)


def test_a_relay_proven_to_answer_several_filters_is_probed_again_only_after_its_daily_start(tmp_path):
    """A relay reconnecting every few minutes spent up to three starts a session on probes
    though its first session had proven it answers every filter of a REQ."""
    from gsync.io.inbox import RelayDisconnected

    from .factory import Author, announcement, issue
    from .manager_harness import ManagerHarness

    a = "wss://several.example"
    owner = Author.named("several-owner")
    h = ManagerHarness(tmp_path)
    ann = announcement(owner, "several", relays=[a])
    h.own_relay_holds(ann)
    h.connect(a)
    h.answer_own_reads()
    h.advance(1.1)
    first = h.historic_reqs(a)[0]
    assert len(first) > 3  # several filters in one REQ
    h.relay_sends(a, first[1], ann, issue(Author.named("several-dev"), ann))  # layer 1's and #a's
    h.relay_says(a, wire.Eose(first[1]))
    answer_everything_empty(h, a)
    assert h.state(a).filters_answered

    h.feed(RelayDisconnected(a, h.state(a).session, "gone"))
    h.advance(60)
    h.connect(a)  # a quick reconnect: its answers are all empty, one filter "explains" each
    answer_everything_empty(h, a)
    assert h.historic_reqs(a) and not probes_sent(h, a)

    h.advance(h.state(a).next_daily_at - h.clock.now + 1)
    h.tick()  # the daily fresh start: its answers are judged again
    answer_everything_empty(h, a)
    assert probes_sent(h, a)


# -- relays reading the first few filters of a REQ -------------------------------------------


@pytest.mark.parametrize("served, run", [
    ([True, True, True, False, False], (3, 3)),
    ([True, False, False], (1, 1)),
    ([False, False, True, True], (2, 1)),  # the last two: the one before them is asked alone
    ([False] * 7 + [True] * 3, (3, 6)),
    ([False, True], (1, 0)),
    ([True, False], (1, 1)),
    ([True, True, True], None),  # every one: proven
    ([False, False, False], None),  # none: deleted, or not served by id
    ([True, False, True], None),  # a gap: one event gone since, not a relay reading a few
    ([False, True, False], None),
    ([True, False, True, True], None),
])
def test_a_proof_answered_for_its_first_or_last_filters_alone_names_how_many_and_which_to_ask(served, run):
    assert one_filter.answered_run(served) == run


class _State:
    """What ``reach_to_prove`` reads of a ``RelayState``."""

    def __init__(self, ids, reach=0, completed=True, unserved=False, max_filters=None):
        from gsync.protocol.nip11 import RelayLimits
        self.reach_ids, self.filters_reach = tuple(ids), reach
        self.historic_sync_completed_at = 1.0 if completed else None
        self.ids_unserved_at = 2.0 if unserved else None
        self.reach_proof_again_at = 0.0
        self.current = type("Session", (), {"limits": RelayLimits(max_filters=max_filters)})()


def reach_to_prove(state, rejected=(), now=1.0 + constants.LIVE_AUDIT_SECS):
    return one_filter.reach_to_prove(state, rejected, now)


def test_the_proof_of_a_relay_proven_to_answer_several_asks_as_many_ids_as_a_req_carries_there():
    ids = [f"{i:064x}" for i in range(12)]
    assert reach_to_prove(_State(ids), (), 1.0 + constants.LIVE_AUDIT_SECS - 1) == ()  # a look's interval on
    assert reach_to_prove(_State(ids)) == tuple(ids[:10])  # ten filters a REQ
    assert reach_to_prove(_State(ids, max_filters=4)) == tuple(ids[:4])
    assert reach_to_prove(_State(ids), rejected={ids[0], ids[5]}) == (*ids[1:5], *ids[6:12])
    assert reach_to_prove(_State(ids[:2])) == ()  # two: the proof of two filters proves that
    assert reach_to_prove(_State(ids, reach=10)) == ()  # proven today
    assert reach_to_prove(_State(ids[:5], reach=3)) == tuple(ids[:5])  # more known since
    assert reach_to_prove(_State(ids, completed=False)) == ()  # its first sync's time is the operator's
    assert reach_to_prove(_State(ids, unserved=True)) == ()  # a proof by id proves nothing there


def proven_then_proof(tmp_path, answer_proof):
    """A relay proven to answer several filters by its first answer (the announcement by
    layer 1, the issues by ``#a``), serving twelve issues, its sync completed an hour ago;
    its daily proof (ten ids, a filter each) answered by ``answer_proof(h, url, req)``."""
    from .factory import Author, announcement, issue
    from .manager_harness import ManagerHarness

    a = "wss://few.example"
    owner = Author.named("few-owner")
    h = ManagerHarness(tmp_path)
    ann = announcement(owner, "few", relays=[a])
    bugs = [issue(Author.named("few-dev"), ann, subject=f"bug {i}") for i in range(12)]
    h.own_relay_holds(ann)
    h.connect(a)
    h.answer_own_reads()
    h.advance(1.1)
    first = h.historic_reqs(a)[0]
    h.relay_sends(a, first[1], ann, *bugs)
    h.relay_says(a, wire.Eose(first[1]))
    assert h.state(a).filters_answered
    answer_everything_empty(h, a)
    assert h.state(a).historic_sync_completed_at is not None
    h.advance(constants.LIVE_AUDIT_SECS)  # the proof is due at the first live look's answer
    for _ in range(60):  # every other page ends empty (in steps of the gate: the proof is answered at once)
        h.answer_own_reads()
        h.advance(1.1)
        h.tick()
        proofs = [r for r in h.historic_reqs(a) if len(r) > 3 and all(list(x) == ["ids"] for x in r[2:])]
        if proofs:
            break
        h.eose_all(a)
    assert proofs, "no proof asked once the sync completed"
    [proof] = proofs
    assert len(proof) - 2 == 10 and {x["ids"][0] for x in proof[2:]} <= {b.id for b in bugs} | {ann.id}
    answer_proof(h, a, proof, {e.id: e for e in (ann, *bugs)})
    return h, a


def test_a_proof_answered_for_its_first_three_filters_then_the_fourth_alone_teaches_three_a_req(tmp_path):
    sent = []

    def first_three(h, url, proof, events):
        h.relay_sends(url, proof[1], *[events[x["ids"][0]] for x in proof[2:5]])
        h.relay_says(url, wire.Eose(proof[1]))
        h.advance(1.1)
        [probe] = [r for r in h.historic_reqs(url) if len(r) == 3 and r[2].get("ids") == proof[5]["ids"]]
        sent.append(probe)
        h.relay_sends(url, probe[1], events[proof[5]["ids"][0]])
        h.relay_says(url, wire.Eose(probe[1]))

    h, a = proven_then_proof(tmp_path, first_three)
    assert sent
    assert h.state(a).max_filters_learned == 3 and h.state(a).current.limits.max_filters == 3
    before = len(h.historic_reqs(a))
    for _ in range(3):
        h.answer_own_reads()
        h.advance(1.1)
    again = h.historic_reqs(a)[before:]
    assert again and all(len(r) - 2 <= 3 for r in again), again  # its sync again, three a REQ


def test_a_proof_answered_in_full_proves_the_relay_and_a_slow_cut_one_teaches_nothing(tmp_path):
    def every_one(h, url, proof, events):
        h.relay_sends(url, proof[1], *[events[x["ids"][0]] for x in proof[2:]])
        h.relay_says(url, wire.Eose(proof[1]))

    h, a = proven_then_proof(tmp_path, every_one)
    assert h.state(a).filters_reach == 10 and h.state(a).max_filters_learned is None

    def cut_slowly(h, url, proof, events):
        h.relay_sends(url, proof[1], *[events[x["ids"][0]] for x in proof[2:5]])
        h.advance(3)  # past TIME_CUT_SUSPECT_SECS: a relay stopping slow queries cuts anywhere
        h.relay_says(url, wire.Eose(proof[1]))
        h.advance(1.1)

    h, a = proven_then_proof(tmp_path / "slow", cut_slowly)
    assert not [r for r in h.historic_reqs(a) if len(r) == 3 and "ids" in r[2] and r[2].get("limit") is None
                and len(r[2]["ids"]) == 1]
    assert h.state(a).max_filters_learned is None and h.state(a).filters_reach == 0


def test_a_proof_cut_slowly_is_asked_again_an_hour_later_and_teaches_then(tmp_path):
    """The simulator's seed 865 of the every-behaviour world: relay6, reading three filters
    a REQ within a query budget, served one of the proof's ten ids slowly at day 0.075; it was
    asked again the next day only, and what the own relay lost at day 0.27 was asked of it
    eight and ten filters a REQ: a state never came back. Now a slow answer is asked again a
    live look's interval later (twice at most a day)."""
    held: dict = {}

    def cut_slowly(h, url, proof, events):
        held.update(events)
        h.relay_sends(url, proof[1], events[proof[2]["ids"][0]])
        h.advance(6)  # a query budget's cut
        h.relay_says(url, wire.Eose(proof[1]))
        h.advance(1.1)

    h, a = proven_then_proof(tmp_path, cut_slowly)
    assert h.state(a).filters_reach == 0
    first = len(h.historic_reqs(a))
    h.advance(constants.LIVE_AUDIT_SECS - 60)
    h.tick()
    h.eose_all(a)
    assert not _proofs(h, a, first)  # (not before the hour)
    h.advance(60)
    for _ in range(40):
        h.answer_own_reads()
        h.advance(1.1)
        h.tick()
        if _proofs(h, a, first):
            break
        h.eose_all(a)
    [proof] = _proofs(h, a, first)
    h.relay_sends(a, proof[1], *[held[x["ids"][0]] for x in proof[2:]])
    h.relay_says(a, wire.Eose(proof[1]))  # all ten, quickly
    assert h.state(a).filters_reach == 10


def _proofs(h, url, after: int) -> list:
    return [r for r in h.historic_reqs(url)[after:] if len(r) > 3 and all(list(x) == ["ids"] for x in r[2:])]


def test_a_relay_proven_by_the_proof_of_two_is_asked_the_proof_of_its_reach_the_same_day():
    """The simulator's seed 822 of an every-behaviour world with ``--filter-caps 0.2``: a
    relay reading three filters, proven by the proof of two at day 0, was asked nothing more
    that day, and what the own relay lost at day 0.16 was asked of it ten filters a REQ."""
    ids = [f"{i:064x}" for i in range(12)]
    state = _State(ids)
    state.filters_answered, state.filters_proof_asked, state.reach_proof_asked = True, True, False
    now = 1.0 + constants.LIVE_AUDIT_SECS
    assert one_filter.asks_filters_proof(state, (), now)
    state.reach_proof_asked = True
    assert not one_filter.asks_filters_proof(state, (), now)


def test_an_id_a_proof_asked_that_the_relay_does_not_serve_alone_is_no_proof_any_more(tmp_path):
    """The simulator's seed 829 of the every-behaviour world: relay8 hid on read an event it
    had served (``hidden``). The daily proof asked it beside another, the suspect answer had
    it asked alone, unserved; the next day the same, four asks by id in 16 h
    (``unservable_asked_again``). Unserved alone, it leaves the ids a proof asks, and the
    relay is taught nothing."""
    hidden = []

    def first_three_then_nothing(h, url, proof, events):
        h.relay_sends(url, proof[1], *[events[x["ids"][0]] for x in proof[2:5]])
        h.relay_says(url, wire.Eose(proof[1]))
        h.advance(1.1)
        [probe] = [r for r in h.historic_reqs(url) if len(r) == 3 and r[2].get("ids") == proof[5]["ids"]]
        hidden.append(probe[2]["ids"][0])
        h.relay_says(url, wire.Eose(probe[1]))  # (hidden on read: nothing)

    h, a = proven_then_proof(tmp_path, first_three_then_nothing)
    state = h.state(a)
    assert hidden and state.max_filters_learned is None
    assert hidden[0] not in state.reach_ids + state.proof_ids + state.proof_served
    assert len(state.reach_ids) == 9, "the others still prove"


def test_ids_a_proof_left_unserved_among_served_ones_are_no_proof_any_more(tmp_path):
    """A proof answered but for one filter in the middle: no relay answering the first few
    filters answers so (an event deleted since, hidden on read): it teaches nothing, and the
    unserved id leaves the ids the next day's proof asks."""
    holes = []

    def all_but_the_fifth(h, url, proof, events):
        holes.append(proof[6]["ids"][0])
        h.relay_sends(url, proof[1], *[events[x["ids"][0]] for i, x in enumerate(proof[2:]) if i != 4])
        h.relay_says(url, wire.Eose(proof[1]))

    h, a = proven_then_proof(tmp_path, all_but_the_fifth)
    state = h.state(a)
    assert holes and state.max_filters_learned is None and state.filters_reach == 0
    assert holes[0] not in state.reach_ids + state.proof_ids + state.proof_served
    assert not [r for r in h.historic_reqs(a) if len(r) == 3 and r[2].get("ids") == [holes[0]]], "asked alone"
