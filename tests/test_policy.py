"""Policy refusals (gsync.sync.policy): which coverage a relay refused, the 24 h pause, the
one probe after it, and splitting a refused REQ to find its culprit. Time is passed in."""
from gsync.constants import REQ_STALL_SECS
from gsync.protocol.filters import Filter
from gsync.sync.policy import CoveragePauses, Trials, coverage_key, describe, halves

DAY = 24 * 3600.0

quotes = Filter.make(tags={"q": ["30617:aa:x"]})
more_quotes = Filter.make(tags={"q": ["30617:bb:y", "30617:cc:z"]}, since=5, limit=0)
replies = Filter.make(tags={"e": ["ab" * 32]})
state = Filter.make(kinds=[30618], tags={"d": ["x"]})
ids = Filter.make(ids=["cd" * 32])


def test_the_key_is_the_shape_not_the_values_window_or_limit():
    assert coverage_key(quotes) == coverage_key(more_quotes)  # live form, other chunk
    assert coverage_key(quotes) != coverage_key(replies)
    assert coverage_key(state) != coverage_key(Filter.make(tags={"d": ["x"]}))  # kinds count
    assert coverage_key(ids) != coverage_key(Filter.make())
    assert describe(coverage_key(state)) == "kinds=30618 #d"
    assert describe(coverage_key(ids)) == "ids"


def test_a_refusal_pauses_the_shape_for_24h_then_one_probe():
    p = CoveragePauses()
    assert p.pause(coverage_key(quotes), now=0)
    assert p.is_filter_paused(more_quotes)
    assert not p.is_filter_paused(replies)
    assert p.allowed([quotes, replies, more_quotes]) == [replies]
    assert p.due_probes(DAY - 1) == []
    assert p.due_probes(DAY) == [coverage_key(quotes)]
    assert p.due_probes(DAY + 1) == []  # only one probe
    assert p.is_filter_paused(quotes), "nothing but the probe may ask while it is out"
    p.probe_passed(coverage_key(quotes))
    assert not p.is_filter_paused(quotes)
    assert len(p) == 0


def test_a_refused_probe_pauses_another_24h():
    p = CoveragePauses()
    p.pause(coverage_key(quotes), now=0)
    p.due_probes(DAY)
    assert p.pause(coverage_key(quotes), now=DAY)
    assert p.due_probes(2 * DAY - 1) == []
    assert p.due_probes(2 * DAY) == [coverage_key(quotes)]


def test_repeated_refusals_do_not_move_the_probe():
    p = CoveragePauses()
    assert p.pause(coverage_key(quotes), now=0)
    assert not p.pause(coverage_key(more_quotes), now=100)  # a REQ sent before the first answer
    assert p.due_probes(DAY) == [coverage_key(quotes)]


def test_a_probe_lost_with_its_connection_is_due_again():
    p = CoveragePauses()
    p.pause(coverage_key(quotes), now=0)
    p.due_probes(DAY)
    p.abandon_probes()
    assert p.is_filter_paused(quotes)
    assert p.due_probes(DAY + 5) == [coverage_key(quotes)]


def test_halves_split_a_group_until_one_filter_is_left():
    group = [1, 2, 3, 4, 5, 6, 7]
    first, second = halves(group)
    assert (first, second) == ([1, 2, 3, 4], [5, 6, 7])
    assert halves([9]) == ([9], [])
    # Bisecting a group of ten for one culprit takes at most four splits.
    culprit, rounds, group = 7, 0, list(range(10))
    while len(group) > 1:
        first, second = halves(group)
        group = first if culprit in first else second
        rounds += 1
    assert group == [culprit] and rounds <= 4


# -- finding the shape at fault, and keeping it apart ----------------------------------------

Q = Filter.make(tags={"q": ["x"]})
Q2 = Filter.make(tags={"q": ["y"]})
A = Filter.make(tags={"a": ["x"]})
D = Filter.make(kinds=[30618], tags={"d": ["x"]})


def test_a_refused_req_splits_into_one_group_per_shape_in_order():
    from gsync.sync.policy import by_shape

    assert by_shape([A, Q, D, Q2]) == [[0], [1, 3], [2]]
    assert by_shape([Q, Q2]) == [[0, 1]]


def test_a_shape_refused_once_goes_alone_even_after_its_probe_restored_it():
    pauses = CoveragePauses()
    assert pauses.separate([A, Q, D]) == [[A, Q, D]]
    pauses.pause(coverage_key(Q), now=0)
    assert pauses.due_probes(now=10**9) == [coverage_key(Q)]
    pauses.probe_passed(coverage_key(Q))
    assert not pauses.is_filter_paused(Q)
    assert pauses.separate([A, Q, D, Q2]) == [[A, D], [Q, Q2]]
    assert pauses.separate([Q]) == [[Q]]


def test_an_auth_pause_does_not_set_the_shape_apart():
    pauses = CoveragePauses()
    pauses.pause(coverage_key(A), now=0, shape_at_fault=False)
    assert pauses.is_filter_paused(A)
    assert not pauses.refused_any and pauses.separate([A, D]) == [[A, D]]


def test_policy_and_prefixed_unsupported_refuse_a_shape_size_wording_does_not():
    from gsync.sync.health import Refusal, classify_refusal, refuses_a_shape

    assert refuses_a_shape(classify_refusal("blocked", "we do not serve that"), "we do not serve that")
    assert refuses_a_shape(classify_refusal("unsupported", "no #q index"), "no #q index")
    assert not refuses_a_shape(classify_refusal("error", "too many filters"), "too many filters")
    assert not refuses_a_shape(Refusal.AUTH, "")


def test_the_shapes_of_a_refused_req_go_alone_until_each_has_its_verdict():
    """A REQ of shapes A, Q, D refused by policy: one of them is at fault. Until each is
    served alone or refused alone, any REQ built meanwhile (a consolidation's) keeps them
    apart, so the culprit is not packed with the others, refused and split again."""
    pauses = CoveragePauses()
    pauses.suspect([A, Q, D])
    assert pauses.refused_any and pauses.suspects
    assert pauses.separate([A, Q, D, Q2]) == [[A], [Q, Q2], [D]]
    pauses.served([A])  # A served alone: innocent
    pauses.served([Q, D])  # two shapes served together tell nothing
    assert pauses.separate([A, Q, D]) == [[A], [Q], [D]]
    pauses.pause(coverage_key(Q), now=0)  # Q refused alone: the culprit, paused
    assert pauses.separate([A, D]) == [[A], [D]]
    pauses.served([D])
    assert pauses.separate([A, D]) == [[A, D]]
    assert pauses.goes_alone(Q2) and pauses.is_filter_paused(Q2)  # refused once: alone for good
    assert not pauses.suspects


def test_a_trial_holds_other_reqs_of_its_shape_until_its_verdict_or_the_stall_deadline():
    p = CoveragePauses()
    p.suspect([quotes, replies])
    t = Trials()
    assert not t.holds(p, {"live-1"}, "live-1", [more_quotes], now=0)  # the trial: it goes
    assert "live-1" in t
    assert t.holds(p, {"live-1"}, "live-2", [quotes], now=1)  # its verdict is out
    assert not t.holds(p, {"live-1"}, "live-3", [state], now=1)  # not a suspect shape
    assert not t.overdue(REQ_STALL_SECS - 1)
    assert t.holds(p, {"live-1"}, "live-2", [quotes], now=REQ_STALL_SECS - 1)
    assert t.overdue(REQ_STALL_SECS) and not t.overdue(REQ_STALL_SECS + 1)  # once
    assert not t.holds(p, {"live-1"}, "live-2", [quotes], now=REQ_STALL_SECS)  # silence: it goes
    assert "live-2" not in t  # ... and is no new trial
    p.pause(coverage_key(quotes), now=REQ_STALL_SECS + 5)  # the late verdict ends the trial
    assert not t.holds(p, {"live-1"}, "live-4", [replies], now=REQ_STALL_SECS + 5)
    assert "live-1" not in t and len(t) == 1  # live-4 tries #e


def test_a_trial_served_or_closed_lets_the_next_req_go():
    p = CoveragePauses()
    p.suspect([quotes, replies])
    t = Trials()
    assert not t.holds(p, {"live-1"}, "live-1", [quotes], now=0)
    assert not t.holds(p, set(), "live-2", [quotes], now=1)  # live-1 closed: live-2 is the trial
    assert "live-2" in t and "live-1" not in t
    p.served([quotes])
    assert not t.holds(p, {"live-2"}, "live-3", [quotes], now=2)
    assert len(t) == 0
