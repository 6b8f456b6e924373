"""PendingBatch: grouped until-pagination, completion, and NIP-77 residual decisions."""
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync import constants
from gsync.protocol import messages as wire
from gsync.protocol.event import Event, generate_secret, sign_event
from gsync.protocol.filters import Filter
from gsync.sync.batch_phase import Step
from gsync.sync.pending import (
    CrowdedSecond,
    PageCap,
    PendingBatch,
    ResidualDecision,
    SyncMethod,
    decide_residual,
    split_crowded,
)
from gsync.sync.repos import SyncLevel
from gsync.sync.start_queue import (
    add_subscription,
    fill_by_splitting,
    filters_of,
    finish_subscription,
    may_share,
    on_closed,
    on_eose,
    rename_subscription,
    repack,
    restart_page,
    split_subscription,
)
from gsync.sync.targets import SyncItems

SECRET = generate_secret()
REPO = "30617:aa:repo"
ISSUES = Filter.make(kinds=[1621])
PATCHES = Filter.make(kinds=[1617])
_content = itertools.count()


def event(kind=1621, created_at=1000):
    # distinct content so events with the same created_at still have distinct ids
    return sign_event(SECRET, created_at=created_at, kind=kind, content=str(next(_content)))


def page(kind, newest, count, step=1):
    return [event(kind, newest - i * step) for i in range(count)]


def batch(method=SyncMethod.REQ_EOSE, items=None):
    return PendingBatch(
        batch_id=1,
        items=items if items is not None else SyncItems({REPO: SyncLevel.FULL}),
        method=method,
    )


def flat(pages):
    """The filters of the next pages, in order (which REQ carries them aside)."""
    return [f for _, filters in pages for f in filters]


def feed(b, sub, events):
    for e in events:
        b.record_event(sub, e)


P = 80  # the page size per filter of the relay in most tests below


def learnt(size=P):
    """A connection that has seen its relay cap each filter at ``size`` (and not per REQ)."""
    return PageCap.per_filter(size)


# -- pagination ---------------------------------------------------------------------------


def test_short_page_finishes_the_sub_and_completes_the_batch():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, P - 1))
    assert flat(on_eose(b, "s1", cap=learnt())) == []
    assert "s1" not in b.outstanding_subs
    assert b.is_complete
    assert not b.failed


def test_full_page_asks_next_page_with_inclusive_until():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, P))
    oldest = 1000 - (P - 1)
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=oldest)]
    assert not b.is_complete
    assert filters_of(b, "s1") == [ISSUES.replace(until=oldest)]


def test_each_or_filter_paginates_on_its_own_and_pages_stay_grouped():
    b = batch()
    add_subscription(b, "s1", [ISSUES, PATCHES, Filter.make(kinds=[1618])])
    feed(b, "s1", page(1621, 1000, P))
    feed(b, "s1", page(1617, 2000, P, step=2))
    feed(b, "s1", page(1618, 3000, 3))
    assert flat(on_eose(b, "s1", cap=learnt())) == [
        ISSUES.replace(until=1000 - (P - 1)), PATCHES.replace(until=2000 - 2 * (P - 1))]


def test_pagination_keeps_since_and_counters_reset_per_page():
    since_filter = ISSUES.replace(since=800)
    b = batch()
    add_subscription(b, "s1", [since_filter])
    cap = learnt()
    first = page(1621, 1000, P)
    feed(b, "s1", first)
    assert flat(on_eose(b, "s1", cap=cap)) == [since_filter.replace(until=1000 - (P - 1))]
    feed(b, "s1", [first[-1], *page(1621, 1000 - P, 10)])  # its boundary second again, then older
    assert flat(on_eose(b, "s1", cap=cap)) == []
    assert b.is_complete


def test_next_page_below_since_ends_the_filter():
    f = ISSUES.replace(since=1000)
    b = batch()
    add_subscription(b, "s1", [f])
    crowd = [event(1621, 1000) for _ in range(P)]
    feed(b, "s1", crowd)
    assert flat(on_eose(b, "s1", cap=learnt())) == [f.replace(until=1000)]
    feed(b, "s1", crowd)  # no progress: stepping to 999 would leave since behind
    assert flat(on_eose(b, "s1", cap=learnt())) == []


def test_shared_events_count_for_every_filter_but_only_certain_ones_set_until():
    # A relay caps each filter and sends the de-duplicated union: an event both filters
    # match may have come from the other one's page, from further back than this one's.
    issues_or_patches = Filter.make(kinds=[1621, 1617])
    b = batch()
    add_subscription(b, "s1", [ISSUES, issues_or_patches])
    feed(b, "s1", page(1621, 1000, 45))  # shared: down to 956
    feed(b, "s1", page(1617, 2000, 45))  # only the second filter's: down to 1956
    assert len(b.pagination["s1"].filters[1].seen) == 90
    # ISSUES saw 45, under the relay's 80 a filter: done. The other matched 90: its own
    # events reach 1956, and, since the relay serves each filter 80, its 80 newest matches
    # (down to 966) were its own page.
    assert flat(on_eose(b, "s1", cap=learnt())) == [issues_or_patches.replace(until=966)]


def test_when_a_per_req_cap_may_have_cut_the_page_only_own_events_bound_it():
    issues_or_patches = Filter.make(kinds=[1621, 1617])
    b = batch()
    add_subscription(b, "s1", [ISSUES, issues_or_patches])
    feed(b, "s1", page(1621, 1000, 40))
    feed(b, "s1", page(1617, 2000, 40))
    # The connection's first page: the relay may cap per REQ at 80, and then the shared
    # events say nothing of either filter's page. The second filter's own events bound it;
    # ISSUES has none, and is asked again alone.
    pages = on_eose(b, "s1", cap=PageCap())
    assert sorted(map(str, (filters for _, filters in pages))) == sorted(
        map(str, ([ISSUES], [issues_or_patches.replace(until=1961)])))


def test_page_cap_learns_what_the_relay_served_and_never_shrinks():
    cap = PageCap()
    assert (cap.filter_served, cap.req_served) == (0, 0)
    b = batch()
    add_subscription(b, "s1", [ISSUES, PATCHES])
    feed(b, "s1", page(1621, 1000, 120))  # all its own: the relay serves a filter >= 120
    feed(b, "s1", page(1617, 1000, 90))
    on_eose(b, "s1", cap=cap)
    assert (cap.filter_served, cap.req_served) == (120, 210)
    cap.observe(80, 100)
    assert (cap.filter_served, cap.req_served) == (120, 210)


def test_a_page_cut_at_its_own_limit_is_full_though_an_id_fetch_served_more():
    """Pages carrying a relay's lower NIP-11 ``max_limit`` (100): an unlimited id fetch that
    brought 300 taught ``filter_served`` 300, and a page of 100 is still a cut one, its next
    page asked (taken as complete, the rest of the filter was never asked)."""
    cap = PageCap(page_limit=100)
    cap.observe(300, 300)  # an id fetch of 300
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, 100))
    pages = on_eose(b, "s1", cap=cap)
    assert [filters for _, filters in pages] == [[ISSUES.replace(until=901)]]
    assert not on_eose(batch_with_page(90), "s1", cap=cap)  # fewer than its limit: complete


def batch_with_page(n):
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, n))
    return b


def test_filter_without_certain_events_is_asked_again_alone():
    both = Filter.make(kinds=[1621, 1617])
    b = batch()
    add_subscription(b, "s1", [ISSUES, both])
    cap = PageCap()
    feed(b, "s1", page(1621, 1000, 75))
    pages = on_eose(b, "s1", cap=cap)
    # Neither can tell which events were its own: each repeats its page in a REQ of its own.
    assert sorted(map(str, (filters for _, filters in pages))) == sorted(
        map(str, ([ISSUES], [both])))
    assert len({name for name, _ in pages}) == 2
    assert b.outstanding_subs == {name for name, _ in pages}
    # Alone, every event is its own: the next page moves on.
    name = next(n for n, filters in pages if filters == [ISSUES])
    feed(b, name, page(1621, 1000, 75))
    assert flat(on_eose(b, name, cap=cap)) == [ISSUES.replace(until=926)]


def _full_page_over_25_roots():
    """A batch whose one filter (25 root ids) just filled its page."""
    roots = [f"{i:064x}" for i in range(25)]
    f = Filter.make(tags={"E": roots})
    b = batch()
    add_subscription(b, "s1", [f])
    feed(b, "s1", [sign_event(SECRET, created_at=1000 - i, kind=1111, content=str(i),
                              tags=[["E", roots[i % 25]]]) for i in range(P)])
    return roots, f, b


def test_full_page_of_many_values_is_split_to_fill_the_next_req():
    roots, f, b = _full_page_over_25_roots()
    pages = on_eose(b, "s1", per_req=10, cap=learnt())
    assert pages == [("s1", [f.replace(until=1000 - (P - 1))])]  # whole until it starts
    pieces = fill_by_splitting(b, "s1", per_req=10)
    assert filters_of(b, "s1") == pieces
    assert len(pieces) == 10
    assert {p.until for p in pieces} == {1000 - (P - 1)}
    values = [v for p in pieces for v in p.tag("E")]
    assert sorted(values) == roots  # disjoint slices covering every value
    assert {len(p.tag("E")) for p in pieces} == {2, 3}


def test_a_split_takes_only_the_room_the_req_has_left():
    roots, f, b = _full_page_over_25_roots()
    on_eose(b, "s1", per_req=10, cap=learnt())
    add_subscription(b, "s2", [ISSUES, PATCHES])
    repack(b, ["s1", "s2"])  # two first pages of a later AddFilters ride along
    pieces = fill_by_splitting(b, "s1", per_req=10)
    assert len(pieces) == 10 and pieces[-2:] == [ISSUES, PATCHES]
    assert sorted(v for p in pieces[:8] for v in p.tag("E")) == roots
    # With the room taken by whole filters, nothing is split.
    _, f, b = _full_page_over_25_roots()
    on_eose(b, "s1", per_req=10, cap=learnt())
    add_subscription(b, "s2", [Filter.make(kinds=[k]) for k in range(1, 10)])
    repack(b, ["s1", "s2"])
    assert fill_by_splitting(b, "s1", per_req=10)[0] == f.replace(until=1000 - (P - 1))


def test_a_split_stays_within_what_fits():
    """A relay whose messages hold four pieces of the page, not five."""
    _, _, four = _full_page_over_25_roots()
    on_eose(four, "s1", per_req=10, cap=learnt())
    max_chars = len(wire.req("s1", fill_by_splitting(four, "s1", per_req=4)))
    roots, f, b = _full_page_over_25_roots()
    on_eose(b, "s1", per_req=10, cap=learnt())
    pieces = fill_by_splitting(b, "s1", per_req=10, max_chars=max_chars)
    assert len(pieces) == 4
    assert sorted(v for p in pieces for v in p.tag("E")) == roots


def test_split_parts_are_never_merged_back_into_one_req():
    b = batch()
    add_subscription(b, "s1", [ISSUES, PATCHES])
    add_subscription(b, "s9", [Filter.make(kinds=[1618])])
    split_subscription(b, "s1", [("s2", [0]), ("s3", [1])])
    assert not may_share(b, "s2") and not may_share(b, "s3")
    assert may_share(b, "s9")


def test_split_shares_the_req_between_the_filters_that_continue():
    def tagged(name, values):
        return Filter.make(tags={name: values})
    vals = [f"{i:064x}" for i in range(30)]
    filters = [tagged("e", vals), tagged("E", vals), tagged("q", vals), ISSUES]
    b = batch()
    add_subscription(b, "s1", filters)
    for i in range(P):  # each event carries one tag: all are their filter's own
        for name in ("e", "E", "q"):
            b.record_event("s1", sign_event(SECRET, created_at=2000 - i, kind=1, content=name,
                                            tags=[[name, vals[i % 30]]]))
    on_eose(b, "s1", per_req=10, cap=learnt())
    pieces = fill_by_splitting(b, "s1", per_req=10)
    assert len(pieces) == 10  # 3 filters: 4 + 3 + 3 slices of their 30 values
    assert sorted(len(p.tags[0][1]) for p in pieces) == [7, 7, 8, 8] + [10] * 6
    for name in ("e", "E", "q"):
        assert sorted(v for p in pieces if p.tags[0][0] == name for v in p.tags[0][1]) == vals


def test_next_pages_are_packed_and_named_by_the_caller():
    filters = [Filter.make(kinds=[k]) for k in range(1, 5)]
    b = batch()
    add_subscription(b, "s1", filters)
    for k in range(1, 5):
        feed(b, "s1", page(k, 1000, P))
    names = iter(["p1", "p2"])
    pages = on_eose(b, "s1", pack=lambda fs: [fs[:3], fs[3:]], new_sub_id=lambda: next(names),
                      cap=learnt())
    assert [(n, len(fs)) for n, fs in pages] == [("p1", 3), ("p2", 1)]
    assert b.outstanding_subs == {"p1", "p2"}
    assert flat(pages) == [f.replace(until=1000 - (P - 1)) for f in filters]


def test_event_matching_no_filter_is_reported_and_not_counted():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    assert not b.record_event("s1", event(kind=1))
    assert b.record_event("s1", event(kind=1621))
    assert not b.record_event("unknown", event(kind=1621))
    assert len(b.pagination["s1"].filters[0].seen) == 1


def test_events_outside_the_page_until_are_not_counted():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, P))
    on_eose(b, "s1", cap=learnt())
    assert not b.record_event("s1", event(1621, 5000))


def test_batch_completes_only_when_every_sub_is_done():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    add_subscription(b, "s2", [PATCHES])
    assert flat(on_eose(b, "s1")) == []
    assert not b.is_complete
    assert flat(on_eose(b, "s2")) == []
    assert b.is_complete


def test_rename_subscription_carries_pagination():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    first = page(1621, 1000, P)
    feed(b, "s1", first)
    nxt = flat(on_eose(b, "s1", cap=learnt()))
    rename_subscription(b, "s1", "s1-p2")
    assert b.outstanding_subs == {"s1-p2"}
    assert filters_of(b, "s1-p2") == nxt
    feed(b, "s1-p2", [first[-1], *page(1621, nxt[0].until - 1, 3)])
    assert flat(on_eose(b, "s1-p2", cap=learnt())) == []
    assert b.is_complete


def test_restarted_page_does_not_count_events_twice():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    first_half = page(1621, 1000, 50)
    feed(b, "s1", first_half)
    restart_page(b, "s1")  # CLOSED rate-limited: the same page goes out again
    feed(b, "s1", first_half + page(1621, 950, 10))
    assert flat(on_eose(b, "s1", cap=learnt())) == []  # 60 events, not 110: that was the last page


def test_split_subscription_sends_parts_again_on_the_same_page():
    later = ISSUES.replace(until=900)
    b = batch()
    add_subscription(b, "s1", [later, PATCHES, Filter.make(kinds=[1618])])
    feed(b, "s1", page(1621, 900, 10))  # a refusal may follow events: they do not count twice
    parts = split_subscription(b, "s1", [("s2", [0, 1]), ("s3", [2]), ("s4", [])])
    assert parts == [("s2", [later, PATCHES]), ("s3", [Filter.make(kinds=[1618])])]
    assert b.outstanding_subs == {"s2", "s3"}
    assert len(b.pagination["s2"].filters[0].seen) == 0
    assert split_subscription(b, "s3", []) == []  # a filter dropped: the sub is done
    feed(b, "s2", page(1621, 900, 5))
    assert flat(on_eose(b, "s2")) == []
    assert b.is_complete and not b.failed


def test_id_filters_never_paginate():
    events = page(1621, 1000, 100)
    b = batch()
    add_subscription(b, "fetch", [Filter.make(ids=[e.id for e in events])])
    feed(b, "fetch", events)
    assert len(b.pagination["fetch"].filters[0].seen) == 100
    assert flat(on_eose(b, "fetch")) == []  # an exact-id answer is complete; shortfalls are residuals
    assert b.is_complete


def test_closed_before_eose_fails_the_batch():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    assert on_closed(b, "s1") == [ISSUES]
    assert b.failed
    assert b.is_complete


def test_eose_for_unknown_sub_is_harmless():
    b = batch()
    assert flat(on_eose(b, "nope")) == []


# -- the inclusive-until loop ------------------------------------------------------------


def test_crowded_second_does_not_loop_forever():
    """A page full of events at one second: the relay keeps returning it for until=that
    second. After one page without progress, until steps past that second."""
    crowd = [event(1621, 1000) for _ in range(P)]
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", crowd)
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=1000)]
    feed(b, "s1", crowd)  # the same page again
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=999)]
    feed(b, "s1", page(1621, 999, 5))
    assert flat(on_eose(b, "s1", cap=learnt())) == []


def test_a_second_paging_cannot_enter_is_reported_for_completing_another_way():
    crowd = [event(1621, 1000) for _ in range(P)]
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", crowd)
    on_eose(b, "s1", cap=learnt())
    assert b.take_crowded() == []  # one full page at a second: asked again first
    feed(b, "s1", crowd)
    on_eose(b, "s1", cap=learnt())
    assert b.take_crowded() == [CrowdedSecond(ISSUES.replace(since=1000, until=1000), 1000, P)]
    assert b.take_crowded() == []


def test_a_crowded_second_asked_alone_and_crowded_again_says_so():
    alone = ISSUES.replace(since=1000, until=1000)
    crowd = [event(1621, 1000) for _ in range(P)]
    b = batch()
    add_subscription(b, "s1", [alone])
    feed(b, "s1", crowd)
    on_eose(b, "s1", cap=learnt())
    feed(b, "s1", crowd)
    assert flat(on_eose(b, "s1", cap=learnt())) == []
    assert b.take_crowded() == [CrowdedSecond(alone, 1000, P, again=True)]


def test_a_crowded_second_splits_on_what_its_filter_enumerates():
    second = dict(since=5, until=5)
    by_tag = Filter.make(tags={"a": ["x", "y", "z"]}, **second)
    assert split_crowded(by_tag) == [Filter.make(tags={"a": ["x"]}, **second),
                                     Filter.make(tags={"a": ["y", "z"]}, **second)]
    by_kind = Filter.make(kinds=[1621, 1617], tags={"a": ["x"]}, **second)
    assert split_crowded(by_kind) == [Filter.make(kinds=[1617], tags={"a": ["x"]}, **second),
                                      Filter.make(kinds=[1621], tags={"a": ["x"]}, **second)]
    by_author = Filter.make(kinds=[1621], authors=["aa", "bb"], **second)
    assert split_crowded(by_author) == [Filter.make(kinds=[1621], authors=["aa"], **second),
                                        Filter.make(kinds=[1621], authors=["bb"], **second)]
    assert split_crowded(Filter.make(kinds=[1621], tags={"a": ["x"]}, **second)) == []


def test_crowded_second_with_new_ids_is_asked_once_more():
    first = [event(1621, 1000) for _ in range(P)]
    second = first[:40] + [event(1621, 1000) for _ in range(P - 40)]
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", first)
    on_eose(b, "s1", cap=learnt())
    feed(b, "s1", second)  # some new ids at 1000: progress
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=1000)]
    feed(b, "s1", second)  # nothing new now
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=999)]


def test_boundary_second_reappearing_with_older_events_is_progress():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    first = page(1621, 1100, P)  # down to 1100 - (P - 1)
    oldest = 1100 - (P - 1)
    feed(b, "s1", first)
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=oldest)]
    feed(b, "s1", [first[-1]] + page(1621, oldest - 1, P - 1))
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=oldest - 1 - (P - 2))]


def test_until_never_goes_negative():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    crowd = [event(1621, 0) for _ in range(P)]
    feed(b, "s1", crowd)
    assert flat(on_eose(b, "s1", cap=learnt())) == [ISSUES.replace(until=0)]
    feed(b, "s1", crowd)
    assert flat(on_eose(b, "s1", cap=learnt())) == []


# -- residuals after NIP-77 --------------------------------------------------------------


@pytest.mark.parametrize(
    "advertised, delivered, retried, by_filter_done, expected",
    [
        (0, 0, False, False, ResidualDecision.DONE),
        (10, 10, False, False, ResidualDecision.DONE),
        (10, 12, False, False, ResidualDecision.DONE),
        (10, 9, False, False, ResidualDecision.RETRY_RESIDUAL),  # serves by id: lag, retry
        (20, 3, False, False, ResidualDecision.RETRY_RESIDUAL),
        (20, 2, False, False, ResidualDecision.SEMANTIC_FALLBACK),  # 10 %: does not serve by id
        (2, 0, False, False, ResidualDecision.SEMANTIC_FALLBACK),  # however few were asked
        (1, 0, False, False, ResidualDecision.SEMANTIC_FALLBACK),
        (300, 0, False, False, ResidualDecision.SEMANTIC_FALLBACK),
        (5, 0, True, False, ResidualDecision.SEMANTIC_FALLBACK),  # the retry brought nothing
        (5, 4, True, False, ResidualDecision.SEMANTIC_FALLBACK),  # never only by id again
        (5, 4, True, True, ResidualDecision.FAIL),
        (300, 0, False, True, ResidualDecision.FAIL),
        (5, 5, True, True, ResidualDecision.DONE),
    ],
)
def test_decide_residual(advertised, delivered, retried, by_filter_done, expected):
    assert decide_residual(advertised, delivered, retried, by_filter_done) is expected


def negentropy_batch(advertised, items=None):
    b = batch(SyncMethod.NEGENTROPY, items)
    b.move(Step.FIRST_START)  # its exchanges ran
    b.expect_ids(e.id for e in advertised)
    return b


def test_small_residual_is_retried_once_then_asked_by_its_filter_then_fails():
    events = page(1621, 1000, 10)
    b = negentropy_batch(events)
    add_subscription(b, "fetch", [Filter.make(ids=[e.id for e in events])])
    feed(b, "fetch", events[:8])
    on_eose(b, "fetch")
    assert b.residual_decision() is ResidualDecision.RETRY_RESIDUAL
    b.move(Step.IDS_ASKED_AGAIN)
    residual = b.begin_residual_retry()
    assert residual == {e.id for e in events[8:]}
    add_subscription(b, "retry", [Filter.make(ids=residual)])
    feed(b, "retry", events[8:9])  # one of two: still incomplete
    on_eose(b, "retry")
    assert b.residual_decision() is ResidualDecision.SEMANTIC_FALLBACK
    assert b.first_pass_served_by_id()
    b.move(Step.ASKED_BY_FILTER)
    assert b.residual_decision() is ResidualDecision.FAIL
    assert b.residual_ids() == {events[9].id}


def test_residual_retry_that_delivers_everything_is_done():
    events = page(1621, 1000, 10)
    b = negentropy_batch(events)
    feed(b, "fetch", events[:9])
    b.move(Step.IDS_ASKED_AGAIN)
    b.begin_residual_retry()
    feed(b, "retry", events[9:])
    assert b.residual_decision() is ResidualDecision.DONE


def test_ids_not_served_by_id_are_asked_by_the_filters_that_found_them():
    found_a = Filter.make(kinds=[1621], tags={"a": ["30617:aa:one"]})
    found_b = Filter.make(kinds=[30617, 10317])
    events = page(1621, 1000, 30)
    b = batch(SyncMethod.NEGENTROPY)
    b.expect_ids((e.id for e in events[:20]), found_by=found_a)
    b.expect_ids((e.id for e in events[20:]), found_by=found_b)
    feed(b, "fetch", events[:2])
    assert b.residual_decision() is ResidualDecision.SEMANTIC_FALLBACK
    assert not b.first_pass_served_by_id()
    assert b.residual_filters(b.residual_ids()) == sorted([found_a, found_b], key=Filter.to_json)
    assert b.residual_filters({events[25].id}) == [found_b]


def test_layer1_batch_asks_what_it_was_not_served_by_its_filter_too():
    events = page(30617, 1000, 2)
    layer1 = Filter.make(kinds=[30617, 10317])
    b = batch(SyncMethod.NEGENTROPY, SyncItems())
    b.expect_ids((e.id for e in events), found_by=layer1)
    assert b.residual_decision() is ResidualDecision.SEMANTIC_FALLBACK
    assert b.residual_filters(b.residual_ids()) == [layer1]


def test_negentropy_exchange_is_an_outstanding_entry_without_filters():
    b = negentropy_batch([])
    add_subscription(b, "neg-1")
    assert not b.is_complete
    finish_subscription(b, "neg-1")
    assert b.is_complete
    assert b.residual_decision() is ResidualDecision.DONE


# -- against simulated relays of each kind -------------------------------------------------
#
# NIP-01 as relays implement it, with the caps they use (none of them says so in NIP-11 here):
# each filter's newest N, union, de-duplicated (LocalRelay, strfry, at 500; some at 30); the
# whole REQ's newest N (one query over the OR of the filters), or filter after filter until
# N; and a relay that stops a slow query on a time budget, after a varying number of events,
# but only after a slow answer (``constants.TIME_CUT_SUSPECT_SECS``).

FAST, SLOW = 0.01, constants.TIME_CUT_SUSPECT_SECS + 0.5


def newest_first(events):
    return sorted(events, key=lambda e: (-e.created_at, e.id))


def per_filter_relay(size):
    def answer(store, filters, rng):
        sent = {}
        for f in filters:
            for e in newest_first(e for e in store if f.matches(e))[:size]:
                sent[e.id] = e
        return newest_first(sent.values()), FAST
    return answer


def per_req_relay(size, order="time"):
    def answer(store, filters, rng):
        if order == "time":  # one query: ORDER BY created_at DESC LIMIT size
            return newest_first(e for e in store if any(f.matches(e) for f in filters))[:size], FAST
        sent = {}  # filter after filter, each newest first, until the REQ has size events
        for f in filters:
            for e in newest_first(e for e in store if f.matches(e)):
                if len(sent) == size:
                    return list(sent.values()), FAST
                sent.setdefault(e.id, e)
        return list(sent.values()), FAST
    return answer


def time_cut_relay(size, least=5):
    """Caps each filter at ``size``, and stops a query when its time is up: after a random
    number of events, never fewer than ``least`` (its budget always reaches a few more than
    one second holds), always slowly. Some slow answers are complete all the same."""
    inner = per_filter_relay(size)

    def answer(store, filters, rng):
        events, _ = inner(store, filters, rng)
        budget = rng.randint(least, 2 * size)
        if len(events) > budget:  # out of time: what it had found so far
            return events[:budget], SLOW
        return events, SLOW if rng.random() < 0.3 else FAST
    return answer


def cold_cut_relay(size):
    """``time_cut_relay`` whose cold queries (asked for the first time) may run out of
    time before their first event: asked again, the relay's cache answers within its budget
    (the simulator's ``--slow-queries`` relays cut anywhere, at random)."""
    asked: dict[int, set] = {}  # (the store's, while it is synced: one sync at a time)

    def answer(store, filters, rng):
        events, _ = per_filter_relay(size)(store, filters, rng)
        if id(store) not in asked:
            asked.clear()
        warm = asked.setdefault(id(store), set())
        key = tuple(filters)
        budget = rng.randint(0 if key not in warm else 1, 2 * size)
        warm.add(key)
        if len(events) > budget:
            return events[:budget], SLOW
        return events, SLOW if rng.random() < 0.3 else FAST
    return answer


def both_caps_relay(per_filter, per_req):
    """Each filter's newest ``per_filter``, and of their union the newest ``per_req``: a
    relay with both caps at once (the simulator's relay3 of seed 4 with imports: 20 and 60)."""
    inner = per_filter_relay(per_filter)

    def answer(store, filters, rng):
        events, _ = inner(store, filters, rng)
        return events[:per_req], FAST
    return answer


def until_exclusive(relay):
    """``relay``, reading each filter's ``until`` as exclusive (PEERS.md: some relays do)."""
    def answer(store, filters, rng):
        return relay(store, [f if f.until is None else f.replace(until=f.until - 1) for f in filters], rng)
    return answer


RELAYS = {
    "per filter 80": per_filter_relay(80),
    "per filter 30, below 75": per_filter_relay(30),
    "per REQ 20, newest of all": per_req_relay(20, "time"),
    "per REQ 20, filter by filter": per_req_relay(20, "filters"),
    "per REQ 150": per_req_relay(150),
    "per filter 20, per REQ 60": both_caps_relay(20, 60),
    "per filter 50, stops slow queries": time_cut_relay(50),
    "per filter 80, until exclusive": until_exclusive(per_filter_relay(80)),
    "per REQ 20, newest of all, until exclusive": until_exclusive(per_req_relay(20, "time")),
    "per filter 50, stops slow queries, until exclusive": until_exclusive(time_cut_relay(50)),
    "per filter 50, stops cold queries before their first event": cold_cut_relay(50),
}

_fake_ids = itertools.count(1)


def fake_event(created_at, tags, kind=1111):
    """An Event for pagination only: a unique id, no signature (nothing here checks it)."""
    return Event(id=f"{next(_fake_ids):064x}", pubkey="0" * 64, created_at=created_at, kind=kind,
                 tags=tuple(tuple(t) for t in tags), content="", sig="")


def sync_all(store, filters, relay=RELAYS["per filter 80"], per_req=10, seed=0, cap=None):
    """Historic sync of ``filters`` against a simulated relay, as the manager drives it:
    pages queued first, the connection's PageCap kept across REQs. Returns what arrived
    and how many REQs it took."""
    rng = random.Random(seed)
    b = batch()
    add_subscription(b, "s0", filters)
    queue = [("s0", filters)]
    received, reqs = {}, 0
    counter = itertools.count(1)
    cap = cap or PageCap()
    while queue:
        sub, _ = queue.pop(0)
        page_filters = fill_by_splitting(b, sub, per_req)  # as the manager does at its start
        reqs += 1
        assert reqs < 2_000, "pagination does not terminate"
        assert len(page_filters) <= per_req
        events, elapsed = relay(store, page_filters, rng)
        for e in events:
            received[e.id] = e
            b.record_event(sub, e)
        queue[0:0] = on_eose(b, sub, per_req=per_req, new_sub_id=lambda: f"s{next(counter)}",
                               cap=cap, elapsed=elapsed)
    assert b.is_complete
    return received, reqs


def random_store(rng, n, values, crowd):
    """``n`` events tagging random ``values`` by e/E/q, at most ``crowd`` in one second."""
    seconds = rng.sample([t for t in range(1, n // crowd + 2) for _ in range(crowd)], n)
    return [fake_event(t, [[rng.choice("eEq"), rng.choice(values)] for _ in range(rng.randint(1, 3))])
            for t in seconds]


def test_a_page_bounded_to_a_second_and_answered_slowly_with_nothing_teaches_nothing_of_until():
    """A relay that stops slow queries may stop one before its first event: a page bounded to
    a second its last page saw events at, answered slowly with nothing, is asked once more
    (``next_page``), and says nothing of how the relay reads ``until``. Taken as whole, it
    marked a relay reading ``until`` as NIP-01 says as one reading it as exclusive (the
    property test below, with a relay stopping cold queries before their first event)."""
    cut = {"once": True}
    inner = per_filter_relay(50)

    def relay(store, filters, rng):
        if cut["once"] and any(f.until is not None for f in filters):
            cut["once"] = False
            return [], SLOW  # (its time budget out before the first event)
        return inner(store, filters, rng)

    store = [fake_event(1000 + t // 2, [["e", "v"]]) for t in range(120)]  # two a second
    cap = PageCap()
    received, _ = sync_all(store, [Filter.make(tags={"e": ["v"]})], relay, cap=cap)
    assert not cut["once"] and {e.id for e in store} <= received.keys()
    assert not cap.until_exclusive


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_every_event_arrives_from_every_kind_of_relay(data):
    """Random overlapping tag filters, packed ten to a REQ, against each kind of relay:
    whatever each cap cut and whatever was sent for which filter, pagination (with splits)
    reaches every matching event. No second holds more events than one page of the relay,
    the documented limit of until-pagination."""
    name = data.draw(st.sampled_from(sorted(RELAYS)), label="relay")
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    values = [f"v{i}" for i in range(12)]
    n = data.draw(st.integers(0, 600), label="events")
    store = random_store(rng, n, values, crowd=2)
    filters = [Filter.make(tags={tag: data.draw(st.sets(st.sampled_from(values), min_size=1))})
               for tag in data.draw(st.lists(st.sampled_from("eEq"), min_size=1, max_size=10))]
    cap = PageCap()
    received, _ = sync_all(store, filters, RELAYS[name], seed=rng.randrange(1 << 30), cap=cap)
    wanted = {e.id for e in store if any(f.matches(e) for f in filters)}
    assert wanted <= received.keys()
    if not name.endswith("until exclusive"):
        assert not cap.until_exclusive  # a relay that reads it as NIP-01 says is never misread


def test_a_relay_reading_until_as_exclusive_is_learnt_and_its_cut_seconds_asked_again():
    """Pages cut inside a second: asked ``until`` that second, this relay sends none of it.
    The page that proves it (it brought older events, none at its ``until``) makes the
    connection's pages ask one second further, and that second again."""
    store = [fake_event(1_000 - i // 3, [["a", "r"]], kind=1621) for i in range(200)]  # 3 a second
    f = Filter.make(tags={"a": ["r"]})
    inclusive_cap, exclusive_cap = PageCap(), PageCap()
    received, inclusive_reqs = sync_all(store, [f], per_filter_relay(20), cap=inclusive_cap)
    assert len(received) == 200 and not inclusive_cap.until_exclusive
    received, exclusive_reqs = sync_all(store, [f], until_exclusive(per_filter_relay(20)),
                                        cap=exclusive_cap)
    assert len(received) == 200 and exclusive_cap.until_exclusive
    assert exclusive_reqs == inclusive_reqs + 1  # the page that proved it, asked again
    b = batch()
    add_subscription(b, "s1", [f], until_shift=exclusive_cap.until_shift)
    assert filters_of(b, "s1") == [f]  # no until: nothing to shift
    add_subscription(b, "s2", [f.replace(since=990, until=990)], until_shift=1)
    assert filters_of(b, "s2") == [f.replace(since=990, until=991)]  # one second, as it reads it


def test_a_page_that_moved_on_before_until_was_known_exclusive_asks_its_second_again():
    """Found by the property test in a loaded .ci/run: a full page, cut inside second 16 of a
    relay that reads ``until`` as exclusive and stops slow queries, split in five; a slow
    answer proved nothing yet, and three pieces paged on below 16, two brought nothing. The
    next page proved it; the pieces that had moved on ask from second 16 again, as the
    relay reads it (one of them had an event there)."""
    rng = random.Random(17)
    store = random_store(rng, 184, [f"v{i}" for i in range(12)], crowd=2)
    f = Filter.make(tags={"e": ["v0", "v2", "v3", "v4", "v9"]})
    cap = PageCap()
    received, _ = sync_all(store, [f], RELAYS["per filter 50, stops slow queries, until exclusive"],
                           seed=rng.randrange(1 << 30), cap=cap)
    assert cap.until_exclusive
    assert {e.id for e in store if f.matches(e)} <= received.keys()


@pytest.mark.parametrize("relay, seed, events, tags, values", [
    # a piece that ended, all its page's events shared, before the relay was known to read
    # until as exclusive (the property test, seed 32 of a loaded run)
    ("per REQ 20, newest of all, until exclusive", 29687, 343, ["E"], [["v7", "v1", "v6", "v3", "v8", "v9", "v2", "v0", "v4"]]),
    # an event at a page's until sent for another filter of the REQ, not for it: no proof
    # that the relay reads until as NIP-01 says (seed 13)
    ("per REQ 20, newest of all, until exclusive", 3538505, 320, ["E"], [["v0", "v2", "v7", "v4", "v1", "v3", "v5", "v6"]]),
])
def test_seconds_left_behind_before_the_relay_was_known_to_read_until_as_exclusive_are_asked_again(
        relay, seed, events, tags, values):
    rng = random.Random(seed)
    store = random_store(rng, events, [f"v{i}" for i in range(12)], crowd=2)
    filters = [Filter.make(tags={t: v}) for t, v in zip(tags, values, strict=True)]
    received, _ = sync_all(store, filters, RELAYS[relay], seed=rng.randrange(1 << 30))
    assert {e.id for e in store if any(f.matches(e) for f in filters)} <= received.keys()


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_batch_ending_without_knowing_how_the_relay_reads_until_asks_it_once(exclusive):
    """A filter bounded from the start (a result cap's page below what the own relay holds):
    its page proves nothing on a relay that reads until as exclusive (no event at 100
    comes, as if none were there). Before the batch ends, one probe: an event it served,
    bounded to its own second. Read as exclusive, nothing comes back, and second 100 is
    asked again as the relay reads it; a NIP-01 relay proves itself with the page."""
    store = [fake_event(t, [["a", "r"]], kind=1621) for t in (100, 100, 99, 98)]
    f = Filter.make(tags={"a": ["r"]}, until=100)
    asked = []
    inner = until_exclusive(per_filter_relay(80)) if exclusive else per_filter_relay(80)

    def relay(store, filters, rng):
        asked.append(filters)
        return inner(store, filters, rng)

    cap = PageCap()
    received, _ = sync_all(store, [f], relay, cap=cap)
    assert len(received) == 4
    probes = [fs for fs in asked if any(flt.ids is not None for flt in fs)]
    assert (cap.until_exclusive, cap.until_inclusive) == (exclusive, not exclusive)
    assert len(probes) == (1 if exclusive else 0) and all(len(fs) == 1 for fs in probes)


def test_splitting_moves_a_large_history_in_few_reqs():
    rng = random.Random(7)
    values = [f"r{i}" for i in range(50)]
    store = [fake_event(100_000 - i, [["a", rng.choice(values)]], kind=1621) for i in range(4_000)]
    received, reqs = sync_all(store, [Filter.make(tags={"a": values})])
    assert len(received) == 4_000
    # Unsplit, one filter at 80 per page needs 50 REQs; split ten ways about one tenth.
    assert reqs <= 12


def small_and_large(rng):
    """Ten tag filters: two match 300 events each, eight match 5 each."""
    store, filters = [], []
    for i in range(10):
        value = f"thread-{i}"
        store += [fake_event(rng.randint(1, 100_000), [["e", value]]) for _ in range(300 if i < 2 else 5)]
        filters.append(Filter.make(tags={"e": [value]}))
    return store, filters


def test_on_a_relay_capping_each_filter_small_filters_are_not_asked_twice():
    """Once the connection has seen the relay cap a filter at 80 (not the REQ: it brought
    more), a filter that matched fewer is done: no confirming page rides along for it."""
    store, filters = small_and_large(random.Random(1))
    received, reqs = sync_all(store, filters, per_filter_relay(80), cap=learnt(80))
    assert len(received) == len(store)
    # 300 at 80 a page: four full pages and a short one for each large filter, which split
    # after the first; the eight small ones end with the first page.
    assert reqs <= 4


def test_a_connection_learns_the_per_filter_cap_from_its_pages():
    store, filters = small_and_large(random.Random(2))
    cap = PageCap()
    sync_all(store, filters[:1], per_filter_relay(80), cap=cap)  # one large filter first
    sync_all(store, filters, per_filter_relay(80), cap=cap)
    assert cap.filter_served == 80


def test_a_connection_learns_a_per_req_cap_and_then_ends_small_reqs_at_once():
    store, filters = small_and_large(random.Random(3))
    cap = PageCap()
    received, _ = sync_all(store, filters, per_req_relay(20), cap=cap)
    assert len(received) == len(store)
    assert cap.req_served == 20
    # Now a REQ that brings fewer than 20 is complete, whatever its filters matched.
    few = [fake_event(5, [["e", "lonely"]]) for _ in range(12)]
    _, reqs = sync_all(few, [Filter.make(tags={"e": ["lonely"]})], per_req_relay(20), cap=cap)
    assert reqs == 1


def test_a_page_at_the_most_a_fresh_connection_has_served_is_confirmed():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, 12))
    # A relay capping at 12 would look just like this: the next page says which it is.
    assert flat(on_eose(b, "s1", cap=PageCap())) == [ISSUES.replace(until=989)]


def test_fewer_events_than_any_relay_caps_a_page_at_are_complete():
    b = batch()
    add_subscription(b, "s1", [ISSUES, PATCHES])
    feed(b, "s1", page(1621, 1000, 5) + page(1617, 1000, constants.MIN_PAGE_CAP - 6))
    assert flat(on_eose(b, "s1", cap=PageCap())) == []


def test_an_empty_filter_in_a_req_that_may_have_been_cut_is_asked_again():
    b = batch()
    add_subscription(b, "s1", [ISSUES, PATCHES])
    feed(b, "s1", page(1621, 1000, 20))
    # A relay capping each REQ at 20 may have stopped before any patch: PATCHES again,
    # unchanged (not alone: it has no events another filter could have taken).
    assert flat(on_eose(b, "s1", cap=PageCap())) == [ISSUES.replace(until=981), PATCHES]


def test_a_slow_page_is_confirmed_until_a_slow_page_brings_nothing():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    issues = page(1621, 1000, 10)
    feed(b, "s1", issues)
    cap = learnt()
    # 10 < 80: complete, unless the relay stopped a slow query early.
    assert flat(on_eose(b, "s1", cap=cap, elapsed=SLOW)) == [ISSUES.replace(until=991)]
    feed(b, "s1", issues[-1:])  # slow again, only the boundary second: step past it
    assert flat(on_eose(b, "s1", cap=cap, elapsed=SLOW)) == [ISSUES.replace(until=990)]
    # slow, and nothing at all: the budget may have run out before its first event: once more
    assert flat(on_eose(b, "s1", cap=cap, elapsed=SLOW)) == [ISSUES.replace(until=990)]
    # slow and nothing again: a relay that is slow every time, not one that cut
    assert flat(on_eose(b, "s1", cap=cap, elapsed=SLOW)) == []
    assert b.is_complete


def test_a_slow_answer_of_nothing_is_asked_once_more_and_a_fast_one_not():
    for elapsed, again in ((SLOW, True), (FAST, False), (None, False)):
        b = batch()
        add_subscription(b, "s1", [ISSUES, PATCHES])
        assert flat(on_eose(b, "s1", cap=learnt(), elapsed=elapsed)) == ([ISSUES, PATCHES] if again else [])
    # what the second answer brings pages on as any page does
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    assert flat(on_eose(b, "s1", cap=learnt(20), elapsed=SLOW)) == [ISSUES]
    feed(b, "s1", page(1621, 1000, 20))
    assert flat(on_eose(b, "s1", cap=learnt(20), elapsed=FAST)) == [ISSUES.replace(until=981)]


def test_a_slow_id_fetch_asks_again_what_it_did_not_bring():
    wanted = page(1621, 1000, 30)
    ids = Filter.make(ids=[e.id for e in wanted])
    b = batch()
    add_subscription(b, "s1", [ids])
    # nothing, slowly: a time budget may have stopped it before the first: the same ids again
    assert flat(on_eose(b, "s1", cap=learnt(), elapsed=SLOW)) == [ids]
    feed(b, "s1", wanted[:2])  # then 2 of 30, slowly: the 28 it did not send, by id again
    assert flat(on_eose(b, "s1", cap=learnt(), elapsed=SLOW)) == [Filter.make(ids=[e.id for e in wanted[2:]])]
    for elapsed in (FAST, None):  # the same shortfall, fast: a residual (by their filters, judged)
        b = batch()
        add_subscription(b, "s1", [ids])
        feed(b, "s1", wanted[:2])
        assert flat(on_eose(b, "s1", cap=learnt(), elapsed=elapsed)) == []


def test_a_relay_capping_each_filter_and_the_req_keeps_both_tests():
    """Each filter's newest 20, of their union the newest 60 (the simulator's relay3, seed
    4 with imports). A filter alone cut at 20 (a REQ of 20: not the REQ's cap) does not show
    that the REQ is not capped: ten filters of 6 to 8 events each, 60 in all, were cut at
    60, and are confirmed, not taken as complete (they were: 42 comments left behind)."""
    cap = PageCap()
    lonely = [fake_event(500 - i, [["e", "alone"]]) for i in range(30)]
    received, _ = sync_all(lonely, [Filter.make(tags={"e": ["alone"]})], both_caps_relay(20, 60), cap=cap)
    assert len(received) == 30 and cap.filter_served == 20
    roots = [f"root{i}" for i in range(10)]
    store = [fake_event(100 + j, [["e", root]]) for i, root in enumerate(roots) for j in range(9)]
    filters = [Filter.make(tags={"e": [root]}) for root in roots]
    received, reqs = sync_all(store, filters, both_caps_relay(20, 60), cap=cap)
    assert len(received) == len(store) == 90
    assert cap.req_served == 60 and reqs >= 2


def _queue(sizes):
    from gsync.sync.relay_state import RelayState

    state = RelayState("wss://relay.example")
    b = batch()
    n = itertools.count()
    for sub_id, size in sizes:
        group = [Filter.make(kinds=[1], authors=[f"{next(n):064x}"]) for _ in range(size)]
        add_subscription(b, sub_id, group)
        state.current.sub_to_batch[sub_id] = b.batch_id
        state.current.historic_queue.append((sub_id, group))
    return state, b


def test_queued_reqs_of_a_batch_fill_the_room_earlier_reqs_left():
    """Groups of 7, 7, 3 and 3 filters queued in that order make two full REQs (two paced
    starts), where merging only into the last REQ made three (7, 10, 3)."""
    from gsync.io.manager.historic import share_queued_reqs

    state, b = _queue((("a", 7), ("b", 7), ("c", 3), ("d", 3)))
    order = [f for _, group in state.current.historic_queue for f in group]
    share_queued_reqs(state, b)
    assert [(sub_id, len(group)) for sub_id, group in state.current.historic_queue] == [("a", 10), ("b", 10)]
    assert b.outstanding_subs == {"a", "b"}
    assert filters_of(b, "a") + filters_of(b, "b") == order  # queue order kept


def test_a_next_page_takes_first_pages_along_instead_of_waiting_for_a_split():
    """One next page at the front, then a full REQ of first pages (the trace of
    bench/historic: the page was split ten ways for 926 events while 3,000 waited): the
    first REQ takes nine of them, and the tenth follows."""
    from gsync.io.manager.historic import share_queued_reqs

    state, b = _queue((("next", 1), ("first", 10)))
    share_queued_reqs(state, b)
    assert [(sub_id, len(group)) for sub_id, group in state.current.historic_queue] == [
        ("next", 10), ("first", 1)]


def test_queued_reqs_keep_a_chunks_twins_together_where_that_takes_no_more_starts():
    """Next pages of two chunks' #e/#E/#q and two more (eight) queued before a REQ of four
    first pages, a third chunk's and another: in turn the third chunk's twins straddled the
    two REQs, and a relay sends a root's comments once per REQ that asks (bench/historic:
    about 500 copies a split). Still two REQs."""
    from gsync.io.manager.historic import share_queued_reqs

    state, b = _queue(())
    chunks = [frozenset(f"{c}{i:063x}" for i in range(3)) for c in "abc"]
    groups = [[Filter.make(tags={name: sorted(chunk)}, until=900 - k) for chunk in chunks[:2]
               for k, name in enumerate("eEq")] + [Filter.make(kinds=[5]), Filter.make(kinds=[6])],
              [Filter.make(tags={name: sorted(chunks[2])}) for name in "eEq"] + [Filter.make(kinds=[7])]]
    for sub_id, group in zip(("next", "first"), groups, strict=True):
        add_subscription(b, sub_id, group)
        state.current.sub_to_batch[sub_id] = b.batch_id
        state.current.historic_queue.append((sub_id, group))
    share_queued_reqs(state, b)
    assert [(sub_id, len(group)) for sub_id, group in state.current.historic_queue] == [("next", 8), ("first", 4)]
    assert filters_of(b, "first") == groups[1]


def test_repacking_keeps_within_the_relays_message_size():
    state, b = _queue((("a", 3), ("b", 3)))
    size = len(wire.req("a", filters_of(b, "a")))
    groups = repack(b, ["a", "b"], per_req=10, max_chars=size)
    assert [len(g) for g in groups.values()] == [3, 3]
    assert all(len(wire.req(s, g)) <= size for s, g in groups.items())


def test_reqs_packed_before_the_relays_limits_were_lowered_are_not_repacked_into_more():
    """Queued REQs packed ten filters each (slices of a filter refused for its values) and
    repacked for a relay asked one filter a REQ (its looks, say) would need more REQs than
    there are: they go as they are (the simulator's seed 978 of a 30-relay world with value
    caps: the manager's handler raised, StopIteration)."""
    state, b = _queue((("a", 3), ("b", 3)))
    before = {sub_id: filters_of(b, sub_id) for sub_id in ("a", "b")}
    assert repack(b, ["a", "b"], per_req=1) is None
    assert {sub_id: filters_of(b, sub_id) for sub_id in ("a", "b")} == before


def test_the_queues_measure_of_a_req_is_the_bytes_the_wire_sends():
    """``start_queue.req_bytes`` measures the REQs the queue will send as ``messages.req``
    builds them, for every kind of id it mints (a page after an EOSE, ``h…-….2``, too)."""
    from gsync.sync.start_queue import StartQueue, req_bytes

    queue = StartQueue(itertools.count(7))
    filters = [Filter.make(kinds=[1], tags={"e": ["a" * 64, "b" * 64]}, until=5),
               Filter.make(tags={"d": ["漢字", "x\n"]}, limit=0)]
    for sub_id in (queue.req_id(), queue.exchange_token(3), f"{queue.req_id()}.2"):
        for group in (filters, filters[:1]):
            assert req_bytes(sub_id, group) == len(wire.req(sub_id, group).encode())


# -- a relay that ignores until --------------------------------------------------------------


def ignoring(size=P):
    cap = learnt(size)
    cap.until_ignored = True
    return cap


def test_on_a_relay_ignoring_until_a_page_past_the_first_leaves_its_range_to_be_reached_another_way():
    newest = page(1621, 1000, P)
    oldest = 1000 - P + 1
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", newest)
    (sub, filters), = on_eose(b, "s1", cap=learnt())
    assert filters == [ISSUES.replace(until=oldest)]
    feed(b, sub, newest[-1:])  # the newest again: its oldest second alone is in bounds (the rest dropped)
    assert flat(on_eose(b, sub, cap=ignoring())) == []
    assert b.take_crowded() == [CrowdedSecond(ISSUES.replace(until=oldest), oldest, 1, span=True)]


def test_on_a_relay_ignoring_until_a_first_page_cut_leaves_what_it_could_not_hold():
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, P))  # a full first page: the rest is older than its oldest
    assert flat(on_eose(b, "s1", cap=ignoring())) == []
    assert b.take_crowded() == [CrowdedSecond(ISSUES.replace(until=1000 - P + 1), 1000 - P + 1, P, span=True)]
    b = batch()
    add_subscription(b, "s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, 5))  # short: all of it came
    assert flat(on_eose(b, "s1", cap=ignoring())) == [] and b.take_crowded() == []


def test_on_a_relay_ignoring_until_what_it_sent_past_a_first_pages_until_counts_toward_its_cap():
    """Seed 707 of the stress mix: a piece of a split filter, bounded by ``until``, came back
    20 of a relay's 20 a filter, 12 of them newer than its ``until`` (dropped by the
    connection, ``RemoteMessage.past_until``): 8 counted, the piece passed for complete, and
    an import of 178 events waited a day. What came past ``until`` counts; without it, 8
    are all of it."""
    bounded = ISSUES.replace(until=1000)
    for past, cut in ((12, True), (0, False)):
        b = batch()
        add_subscription(b, "s1", [bounded, Filter.make(kinds=[1622], until=1000)])
        feed(b, "s1", page(1621, 1000, 8))
        assert flat(on_eose(b, "s1", cap=ignoring(20), past_until=(past, 0))) == []
        crowded = b.take_crowded()
        assert (crowded == [CrowdedSecond(bounded.replace(until=1000 - 8 + 1), 1000 - 8 + 1, 8, span=True)]) is cut
        assert bool(crowded) is cut


def test_on_a_relay_ignoring_until_a_filter_sent_another_filters_events_past_its_until_teaches_no_page_size():
    """Seed 707 of the stress mix: on a relay serving 20 a filter and ignoring ``until``,
    events sent for one filter past its ``until`` matched another filter of the REQ within
    its bounds and counted as that one's own: 26 "own" events taught a page size of 26,
    and full pages of 20 passed for complete. Own counts teach there only where no other
    filter of the REQ is bounded by ``until``; a relay reading ``until`` learns as before."""
    for cap, learnt_size in ((ignoring(20), 20), (learnt(20), 26)):
        b = batch()
        add_subscription(b, "s1", [ISSUES, Filter.make(kinds=[1622], until=900)])
        feed(b, "s1", page(1621, 1000, 26))
        on_eose(b, "s1", cap=cap)
        assert cap.filter_served == learnt_size


def test_an_id_page_a_relay_ignoring_until_may_have_cut_asks_the_ids_it_did_not_send_again():
    wanted = page(1621, 1000, 50)
    ids = Filter.make(ids=[e.id for e in wanted])
    b = batch()
    add_subscription(b, "s1", [ids])
    feed(b, "s1", wanted[:20])  # a relay serving 20 a filter, an id filter too
    assert flat(on_eose(b, "s1", cap=ignoring(20))) == [Filter.make(ids=[e.id for e in wanted[20:]])]
    for cap, served in ((ignoring(80), 45), (ignoring(20), 30), (learnt(20), 20)):
        # short of what the relay serves a filter: the rest is not there; less missing than
        # came: the residual's retry; a relay that reads until: the rest by their filters' pages
        b = batch()
        add_subscription(b, "s1", [ids])
        feed(b, "s1", wanted[:served])
        assert flat(on_eose(b, "s1", cap=cap)) == []


def test_an_until_probe_answered_slowly_with_nothing_teaches_nothing_and_is_asked_again():
    """A probe of how the relay reads ``until`` (one event it served, bounded to its own
    second) that came back slow and empty may have been stopped by a time budget: it teaches
    nothing (before, "exclusive"), and is asked once more; its answer then tells."""
    from gsync.sync.pending import until_probe

    served = page(1621, 1000, 1)[0]
    probe = until_probe(served.id, served.created_at)
    b = batch()
    add_subscription(b, "p", [probe])
    cap = learnt()
    [(again, filters)] = on_eose(b, "p", cap=cap, elapsed=SLOW)
    assert filters == [probe]
    assert not (cap.until_exclusive or cap.until_inclusive)
    feed(b, again, [served])
    on_eose(b, again, cap=cap, elapsed=FAST)
    assert cap.until_inclusive and not cap.until_exclusive
    b = batch()
    add_subscription(b, "p", [probe])
    cap = learnt()
    on_eose(b, "p", cap=cap, elapsed=FAST)  # nothing, at once: read as exclusive
    assert cap.until_exclusive
