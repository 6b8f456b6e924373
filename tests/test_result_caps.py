"""A NIP-77 result cap: what is known of a relay's cap, and how a refused filter is cut by
what the own relay holds of it (``gsync.sync.result_caps``)."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gsync.io.negentropy_sync import NegentropyOutcome
from gsync.protocol.filters import Filter
from gsync.protocol.negentropy import INFINITY
from gsync.sync import result_caps
from gsync.sync.pending import PageCap, exchange_asks
from gsync.sync.result_caps import (
    SILENT_CAP_MIN,
    Cut,
    ResultCap,
    SilentCap,
    after_refusal,
    cut_before_start,
    cut_past_cap,
    found_more,
    oldest_compared,
    pages_pay,
)

NOW = 1_780_000_000
BASE = 1_700_000_000
ISSUES = Filter.make(kinds=[1621], tags={"a": ["30617:x:y"]})


def _in(flt: Filter, t: int) -> bool:
    return (flt.since is None or t >= flt.since) and (flt.until is None or t <= flt.until)


def _held(times) -> list[tuple[int, str]]:
    return [(t, f"{i:064x}") for i, t in enumerate(times)]


def assert_tiles(flt: Filter, cut: Cut, probes) -> None:
    """Exchanges and pages together ask exactly what ``flt`` asks: every second once."""
    pieces = cut.exchanges + cut.pages
    assert all(p.replace(since=None, until=None) == flt.replace(since=None, until=None) for p in pieces)
    for t in probes:
        assert sum(_in(p, t) for p in pieces) == (1 if _in(flt, t) else 0), (t, pieces)


# -- what is known of the cap ----------------------------------------------------------------


def test_a_reported_cap_is_the_limit():
    cap = ResultCap()
    cap.note_refused(10, expected=84)
    assert cap.limit() == 10
    cap.note_passed(7, held=4)
    assert cap.limit() == 10


def test_an_unreported_cap_is_searched_between_the_most_served_and_the_fewest_refused():
    cap = ResultCap()
    assert cap.limit() is None  # nothing known: nothing to cut by
    cap.note_refused(None, expected=160)
    assert cap.limit() == 80  # halfway down from what was refused
    cap.note_passed(120, held=100)
    assert cap.limit() == 120  # served: the cap is at least that
    cap.note_refused(None, expected=130)
    assert cap.limit() == 120
    cap.note_refused(None, expected=20)  # the relay held far more there than we did
    assert cap.limit() == 120, "what was served is known to fit"
    cap = ResultCap()
    cap.note_refused(None, expected=60)
    cap.note_passed(25, held=24)
    cap.note_refused(None, expected=40)
    assert cap.limit() == 25


def test_an_exchange_served_holding_as_many_as_one_refused_drops_that_estimate():
    cap = ResultCap()
    cap.note_refused(None, expected=10)
    cap.note_passed(12, held=9)
    assert cap.refused == 10 and cap.limit() == 12
    cap.note_passed(12, held=10)
    assert cap.refused is None and cap.limit() is None


def test_a_refusal_of_nothing_held_teaches_no_estimate():
    cap = ResultCap()
    cap.note_refused(None, expected=0)
    assert cap.refused is None and cap.limit() is None


# -- pages or exchanges ------------------------------------------------------------------------


@pytest.mark.parametrize("held,limit,pages", [
    (0, None, True),  # nothing held: NIP-77 would find nothing to save
    (0, 10, True),
    (1, 10, True),  # one event again by pages, against two exchanges or more
    (2, 10, False),
    (1, None, False),  # cap unknown: how much the relay holds besides is unknown too
    (90_000, 1_000_000, True),
    (200_000, 1_000_000, False),
])
def test_pages_pay_where_the_own_relay_holds_a_tenth_or_less_of_the_rest(held, limit, pages):
    assert pages_pay(held, limit) is pages


def test_a_filter_the_own_relay_holds_nothing_of_goes_by_pages_whole():
    assert cut_past_cap(ISSUES, [], 10) == Cut([], [ISSUES])


# -- the cut -----------------------------------------------------------------------------------


def test_windows_hold_at_most_a_fill_of_the_cap_and_meet_and_the_open_ends_go_by_pages():
    times = [BASE + 3600 * i for i in range(0, 169, 2)]  # every other of 169 hourly events
    cut = cut_past_cap(ISSUES, times, 10)
    per_window = [sum(_in(w, t) for t in times) for w in cut.exchanges]
    assert max(per_window) == int(10 * result_caps.FILL) and sum(per_window) == len(times)
    assert all(a.until + 1 == b.since for a, b in itertools.pairwise(cut.exchanges))
    assert cut.exchanges[0].since == times[0] and cut.exchanges[-1].until == times[-1]
    assert [(p.since, p.until) for p in cut.pages] == [(None, times[0] - 1), (times[-1] + 1, None)]
    assert_tiles(ISSUES, cut, [0, BASE - 1, *range(BASE - 5, BASE + 3600 * 170, 600), NOW + 10**6])


def test_a_window_refused_again_is_halved_by_what_it_holds():
    times = [BASE + 3600 * i for i in range(8)]
    window = ISSUES.replace(since=BASE, until=BASE + 3600 * 7)
    cut = cut_past_cap(window, times, 10)
    assert [sum(_in(w, t) for t in times) for w in cut.exchanges] == [4, 4]
    assert_tiles(window, cut, range(BASE - 10, BASE + 3600 * 8, 100))


def test_a_crowded_second_is_a_window_alone():
    times = [BASE] * 12 + [BASE + 5, BASE + 6]
    cut = cut_past_cap(ISSUES, times, 10)
    assert [sum(_in(w, t) for t in times) for w in cut.exchanges] == [12, 2]
    assert_tiles(ISSUES, cut, range(BASE - 3, BASE + 10))


def test_a_window_holding_one_second_is_that_second_and_pages_around_it():
    window = ISSUES.replace(since=BASE, until=BASE + 100)
    cut = cut_past_cap(window, [BASE + 50] * 3, None)
    assert [(w.since, w.until) for w in cut.exchanges] == [(BASE + 50, BASE + 50)]
    assert [(p.since, p.until) for p in cut.pages] == [(BASE, BASE + 49), (BASE + 51, BASE + 100)]


def test_one_second_all_held_cannot_be_cut_by_its_holdings():
    second = ISSUES.replace(since=BASE, until=BASE)
    assert cut_past_cap(second, [BASE] * 30, 10) is None
    assert after_refusal(ResultCap(), second, _held([BASE] * 30), 10, NOW) == Cut([], [second])


def test_a_huge_holding_under_a_tiny_cap_queues_a_bounded_number_of_windows():
    times = list(range(BASE, BASE + 100_000))
    cut = cut_past_cap(ISSUES, times, 1)
    assert len(cut.exchanges) <= result_caps.MAX_WINDOWS


@given(st.lists(st.integers(BASE, BASE + 500), max_size=60),
       st.one_of(st.none(), st.integers(1, 30)),
       st.one_of(st.none(), st.integers(BASE - 10, BASE + 250)),
       st.one_of(st.none(), st.integers(BASE + 250, BASE + 510)))
def test_a_cut_asks_exactly_what_the_filter_asks(times, limit, since, until):
    flt = ISSUES.replace(since=since, until=until)
    cut = cut_past_cap(flt, times, limit)
    if cut is None:
        assert flt.since is not None and flt.since == flt.until, "only one second cannot be cut"
        return
    assert_tiles(flt, cut, range(BASE - 12, BASE + 515))
    held = [t for t in times if _in(flt, t)]
    for w in cut.exchanges:
        n = sum(_in(w, t) for t in held)
        assert n >= 1, "every exchange has something held to save"
        assert n < len(held) or len(set(held)) == 1
        # asked one second on where the relay's reading of until is not known
        # (``exchange_asks``), a window ends at its last held second: the second past it
        # holds nothing of ours unless held seconds follow each other there
        if w.until != flt.until:
            assert w.until in held, (w, sorted(held))


def test_windows_end_at_their_last_held_second_so_one_second_more_counts_nothing_held():
    """Hourly holdings, cap 10 (8 a window): the windows end at held seconds and the next
    begins a second later, so an exchange asking one second past its window (a relay whose
    reading of ``until`` is not known) is counted by the relay as the window is. The second
    it asks before its window (one that may read ``since`` as exclusive) is the window
    before's last held second: one held second more where ``since`` is read as NIP-01 says,
    within the cap (``FILL``)."""
    times = [BASE + 3600 * i for i in range(40)]
    cut = cut_past_cap(ISSUES, times, 10)
    assert [(w.since, w.until) for w in cut.exchanges] == [
        (BASE, BASE + 3600 * 7), (BASE + 3600 * 7 + 1, BASE + 3600 * 15),
        (BASE + 3600 * 15 + 1, BASE + 3600 * 23), (BASE + 3600 * 23 + 1, BASE + 3600 * 31),
        (BASE + 3600 * 31 + 1, BASE + 3600 * 39)]
    assert [(p.since, p.until) for p in cut.pages] == [(None, BASE - 1), (BASE + 3600 * 39 + 1, None)]
    counted = [sum(_in(exchange_asks(w, None), t) for t in times) for w in cut.exchanges]
    assert counted == [8, 9, 9, 9, 9] and max(counted) < 10


# -- after a refusal, before a start -------------------------------------------------------------


def test_nothing_known_of_the_holdings_halves_blindly():
    cut = after_refusal(ResultCap(), ISSUES, None, 10, NOW)
    assert len(cut.exchanges) == 2 and cut.pages == []


def test_an_id_held_and_in_flight_counts_once():
    cap = ResultCap()
    after_refusal(cap, ISSUES, _held([BASE, BASE + 1]) * 2, None, NOW)
    assert cap.refused == 2


def test_an_exchange_holding_more_than_a_known_cap_is_cut_before_its_start():
    cap = ResultCap(reported=10)
    assert cut_before_start(ResultCap(), ISSUES, _held(range(BASE, BASE + 50))) is None  # nothing known
    assert cut_before_start(cap, ISSUES, _held(range(BASE, BASE + 10))) is None  # fits
    cut = cut_before_start(cap, ISSUES, _held(range(BASE, BASE + 50)))
    assert cut is not None and len(cut.exchanges) == 7


def test_a_sibling_of_a_refused_window_holding_as_many_is_cut_before_its_start():
    cap = ResultCap()
    cap.note_refused(10, 8, ISSUES.replace(since=BASE - 100, until=BASE - 1))  # the relay has more there
    window = ISSUES.replace(since=BASE, until=BASE + 100)
    assert cut_before_start(cap, window, _held(range(BASE, BASE + 7))) is None
    assert len(cut_before_start(cap, window, _held(range(BASE, BASE + 8))).exchanges) == 2
    assert cut_before_start(cap, ISSUES, _held(range(BASE, BASE + 8))) is None, "a whole filter: the cap only"
    other = Filter.make(kinds=[1621], tags={"a": ["30617:x:other"]}, since=BASE, until=BASE + 100)
    assert cut_before_start(cap, other, _held(range(BASE, BASE + 8))) is None, "another filter's windows"


# -- convergence, as the manager drives it ------------------------------------------------------


def converge(remote: list[int], held: list[int], cap: int) -> tuple[int, int, int]:
    """The manager's loop over a relay refusing past ``cap``: (refusals, exchanges served,
    page filters). Every remote event is asked exactly once."""
    known = ResultCap()
    queue, refusals, served, pages, asked = [ISSUES], 0, 0, 0, []
    ids = itertools.count()
    holding = lambda flt: [(t, f"{next(ids):064x}") for t in held if _in(flt, t)]  # noqa: E731
    while queue:
        flt = queue.pop(0)
        cut = cut_before_start(known, flt, holding(flt))
        if cut is None:
            matched = [t for t in remote if _in(flt, t)]
            if len(matched) <= cap:
                served += 1
                known.note_passed(len(matched), len(holding(flt)))
                asked += matched
                continue
            refusals += 1
            cut = after_refusal(known, flt, holding(flt), cap, NOW)
        pages += len(cut.pages)
        asked += [t for p in cut.pages for t in remote if _in(p, t)]
        queue[0:0] = cut.exchanges
    assert sorted(asked) == sorted(remote)
    return refusals, served, pages


@pytest.mark.parametrize("every", [1, 2, 3, 10, 20, 169])
def test_a_cap_of_10_over_169_events_converges_in_few_refusals(every):
    remote = [BASE + 3600 * i for i in range(169)]
    refusals, served, pages = converge(remote, remote[::every], cap=10)
    print(f"held every {every}: {refusals} refusals, {served} exchanges, {pages} page filters")
    assert refusals <= 15


def test_an_exchange_asks_one_second_past_its_window_unless_the_relay_is_known_to_read_until_as_nip01():
    """And one second before it, always: no relay is known to read ``since`` as NIP-01 says
    (seed 8 of ``--since-exclusive 1 --small-pages 1 --series 1``)."""
    window = ISSUES.replace(since=BASE, until=BASE + 100)
    assert exchange_asks(window, None) == window.replace(since=BASE - 1, until=BASE + 101)  # nothing known
    assert exchange_asks(window, PageCap()).until == BASE + 101
    assert exchange_asks(window, PageCap(until_exclusive=True)).until == BASE + 101
    assert exchange_asks(window, PageCap(until_inclusive=True)) == window.replace(since=BASE - 1)
    assert exchange_asks(ISSUES, None) == ISSUES  # no bounds: nothing to read either way
    second = ISSUES.replace(since=BASE, until=BASE)
    assert exchange_asks(second, PageCap(until_exclusive=True)) == ISSUES.replace(since=BASE - 1, until=BASE + 1)


# -- a silent cap: a relay comparing a filter's newest events only ----------------------------

KHATRU = "https://github.com/fiatjaf/khatru"


@pytest.mark.parametrize("software", [KHATRU, ""])
def test_an_exchange_is_checked_while_it_compares_as_many_as_any_there_and_more_than_any_proven_whole(software):
    cap = SilentCap()
    assert not cap.check_wanted(SILENT_CAP_MIN - 1, software)  # (too few for any cap guarded against)
    assert cap.check_wanted(137, software)  # any number: caps of 77 and 130 lost events for good
    assert not cap.check_wanted(120, software)  # fewer than another compared there: not cut
    assert cap.check_wanted(137, software)  # as many: a cap cuts every exchange at the same number
    assert cap.check_wanted(1001, software)
    cap.note_check(1001, found_more=False)
    assert not cap.check_wanted(1001, software) and cap.check_wanted(1002, software)  # whole up to 1001


@pytest.mark.parametrize("software", [
    "https://github.com/hoytech/strfry",  # says when it cuts (NEG-ERR)
    "https://git.sr.ht/~gheartsfield/nostr-rs-relay",  # no NIP-77
])
def test_software_that_says_when_it_cuts_or_has_no_nip77_is_never_checked(software):
    assert not SilentCap().check_wanted(100, software)


def test_a_cut_relay_is_checked_at_every_exchange_comparing_its_cap():
    cap = SilentCap(whole=60)
    cap.note_check(100, found_more=True)
    assert cap.cut == 100 and cap.check_wanted(100) and not cap.check_wanted(99)
    cap.note_check(100, found_more=False)  # (a check that found nothing more: the cut stays)
    assert cap.cut == 100 and cap.check_wanted(100)


def test_a_check_finds_more_by_an_id_it_did_not_compare_or_by_fewer_of_ours_it_lacks():
    compared = frozenset({"a", "b", "c"})
    check = SimpleNamespace(need_ids=["a", "b"], have_ids=["x", "y"])  # compared again: a relay ignoring until
    assert not found_more(compared, 2, check)
    assert found_more(compared, 2, SimpleNamespace(need_ids=["d"], have_ids=["x", "y"]))  # one we lack
    assert found_more(compared, 3, check)  # it holds one of ours it did not compare


@pytest.mark.parametrize("common_min, needs, before, after, oldest", [
    (100, False, None, None, 100),  # all held: the oldest held
    (None, False, None, None, None),  # nothing compared
    (100, True, 80, 10, 80),  # what we lack lies below 80: at most 80
    (100, True, 150, 90, 100),
    (100, True, INFINITY, 120, 100),  # past our newest and above the held one: the held one
    (100, True, INFINITY, 50, None),  # unbounded, perhaps older: not known
    (None, True, INFINITY, 0, None),
    (None, True, 70, 0, 70),
])
def test_the_oldest_compared_is_bounded_from_above_or_not_known(common_min, needs, before, after, oldest):
    assert oldest_compared(common_min, needs, before, after) == oldest


def test_an_outcome_notes_what_the_relay_compared_of_the_have_set():
    items = [(1000 + i, f"{i:064x}") for i in range(80)]
    outcome = NegentropyOutcome(True, need_ids=[f"{900:064x}"], have_ids=[f"{i:064x}" for i in range(10)],
                                need_before=1020, need_after=1000)
    outcome.note_advertised(items)
    assert outcome.advertised == 71  # 70 of ours and one we lack
    assert outcome.oldest == 1010  # the oldest held it compared: below the need's bound
    assert outcome.have_upto == 10  # every one of ours it lacks is older
    assert outcome.compared_held.keys() == {f"{i:064x}" for i in range(10, 80)}
    few = NegentropyOutcome(True, have_ids=[f"{i:064x}" for i in range(40)])
    few.note_advertised(items)
    assert few.advertised == 0 and few.oldest is None  # (too few compared to be cut)


def test_an_outcome_notes_the_newest_two_events_held_on_both_sides():
    items = [(1000 + i, f"{i:064x}") for i in range(5)]
    outcome = NegentropyOutcome(True, have_ids=[f"{4:064x}", f"{2:064x}"])  # the relay lacks those
    outcome.note_held_both(items)
    assert outcome.held_both == (f"{3:064x}", f"{1:064x}")
    one = NegentropyOutcome(True, have_ids=[f"{i:064x}" for i in range(4)])
    one.note_held_both(items)
    assert one.held_both == (f"{4:064x}",)
    none = NegentropyOutcome(True, have_ids=[event_id for _, event_id in items])
    none.note_held_both(items)
    assert none.held_both == ()
