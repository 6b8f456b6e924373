"""PendingBatch: grouped until-pagination, completion, and NIP-77 residual decisions."""
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.constants import PAGE_THRESHOLD
from gsync.protocol.event import generate_secret, sign_event
from gsync.protocol.filters import Filter
from gsync.sync.pending import (
    PageCap,
    PendingBatch,
    ResidualDecision,
    SyncMethod,
    decide_residual,
    fetch_by_filter,
)
from gsync.sync.repos import SyncLevel
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


# -- pagination ---------------------------------------------------------------------------


def test_short_page_finishes_the_sub_and_completes_the_batch():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, PAGE_THRESHOLD - 1))
    assert flat(b.on_eose("s1")) == []
    assert "s1" not in b.outstanding_subs
    assert b.is_complete
    assert not b.failed


def test_full_page_asks_next_page_with_inclusive_until():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, PAGE_THRESHOLD))
    oldest = 1000 - (PAGE_THRESHOLD - 1)
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=oldest)]
    assert not b.is_complete
    assert b.filters_of("s1") == [ISSUES.replace(until=oldest)]


def test_each_or_filter_paginates_on_its_own_and_pages_stay_grouped():
    b = batch()
    b.add_subscription("s1", [ISSUES, PATCHES, Filter.make(kinds=[1618])])
    feed(b, "s1", page(1621, 1000, 80))
    feed(b, "s1", page(1617, 2000, 90, step=2))
    feed(b, "s1", page(1618, 3000, 3))
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=921), PATCHES.replace(until=1822)]


def test_pagination_keeps_since_and_counters_reset_per_page():
    since_filter = ISSUES.replace(since=800)
    b = batch()
    b.add_subscription("s1", [since_filter])
    feed(b, "s1", page(1621, 1000, 80))
    assert flat(b.on_eose("s1")) == [since_filter.replace(until=921)]
    feed(b, "s1", page(1621, 921, 10))
    assert flat(b.on_eose("s1")) == []
    assert b.is_complete


def test_next_page_below_since_ends_the_filter():
    f = ISSUES.replace(since=1000)
    b = batch()
    b.add_subscription("s1", [f])
    crowd = [event(1621, 1000) for _ in range(PAGE_THRESHOLD)]
    feed(b, "s1", crowd)
    assert flat(b.on_eose("s1")) == [f.replace(until=1000)]
    feed(b, "s1", crowd)  # no progress: stepping to 999 would leave since behind
    assert flat(b.on_eose("s1")) == []


def test_shared_events_count_for_every_filter_but_only_certain_ones_set_until():
    # A relay caps each filter and sends the de-duplicated union: an event both filters
    # match may have come from the other one's page, from further back than this one's.
    issues_or_patches = Filter.make(kinds=[1621, 1617])
    b = batch()
    b.add_subscription("s1", [ISSUES, issues_or_patches])
    feed(b, "s1", page(1621, 1000, 40))  # shared: down to 961
    feed(b, "s1", page(1617, 2000, 40))  # only the second filter's: down to 1961
    assert b.pagination["s1"].filters[1].event_count == 80
    # ISSUES saw 40 (no next page). The other saw 80: its own events reach 1961, and, with
    # a page size of at least 75, its 75 newest matches (down to 966) were its own page.
    assert flat(b.on_eose("s1")) == [issues_or_patches.replace(until=966)]


def test_with_a_larger_known_page_size_only_own_events_bound_the_page():
    issues_or_patches = Filter.make(kinds=[1621, 1617])
    b = batch()
    b.add_subscription("s1", [ISSUES, issues_or_patches])
    feed(b, "s1", page(1621, 1000, 40))
    feed(b, "s1", page(1617, 2000, 40))
    # 80 < 500: the shared events may all have been sent for ISSUES.
    assert flat(b.on_eose("s1", cap=PageCap(500))) == [issues_or_patches.replace(until=1961)]


def test_page_cap_learns_from_own_events_and_never_shrinks():
    cap = PageCap()
    assert cap.floor == PAGE_THRESHOLD
    b = batch()
    b.add_subscription("s1", [ISSUES, PATCHES])
    feed(b, "s1", page(1621, 1000, 120))  # all its own: the relay's page holds >= 120
    feed(b, "s1", page(1617, 1000, 90))
    b.on_eose("s1", cap=cap)
    assert cap.floor == 120
    cap.observe(80)
    assert cap.floor == 120


def test_filter_without_certain_events_is_asked_again_alone():
    both = Filter.make(kinds=[1621, 1617])
    b = batch()
    b.add_subscription("s1", [ISSUES, both])
    feed(b, "s1", page(1621, 1000, PAGE_THRESHOLD))
    pages = b.on_eose("s1", cap=PageCap(500))
    # Neither can tell which events were its own: each repeats its page in a REQ of its own.
    assert sorted(map(str, (filters for _, filters in pages))) == sorted(
        map(str, ([ISSUES], [both])))
    assert len({name for name, _ in pages}) == 2
    assert b.outstanding_subs == {name for name, _ in pages}
    # Alone, every event is its own: the next page moves on.
    name = next(n for n, filters in pages if filters == [ISSUES])
    feed(b, name, page(1621, 1000, PAGE_THRESHOLD))
    assert flat(b.on_eose(name, cap=PageCap(500))) == [ISSUES.replace(until=926)]


def test_full_page_of_many_values_is_split_to_fill_the_next_req():
    roots = [f"{i:064x}" for i in range(25)]
    f = Filter.make(tags={"E": roots})
    b = batch()
    b.add_subscription("s1", [f])
    feed(b, "s1", [sign_event(SECRET, created_at=1000 - i, kind=1111, content=str(i),
                              tags=[["E", roots[i % 25]]]) for i in range(PAGE_THRESHOLD)])
    pages = b.on_eose("s1", per_req=10)
    assert [name for name, _ in pages] == ["s1"]
    pieces = pages[0][1]
    assert len(pieces) == 10
    assert {p.until for p in pieces} == {1000 - (PAGE_THRESHOLD - 1)}
    values = [v for p in pieces for v in p.tag("E")]
    assert sorted(values) == roots  # disjoint slices covering every value
    assert {len(p.tag("E")) for p in pieces} == {2, 3}


def test_split_shares_the_req_between_the_filters_that_continue():
    def tagged(name, values):
        return Filter.make(tags={name: values})
    vals = [f"{i:064x}" for i in range(30)]
    filters = [tagged("e", vals), tagged("E", vals), tagged("q", vals), ISSUES]
    b = batch()
    b.add_subscription("s1", filters)
    for i in range(PAGE_THRESHOLD):  # each event carries one tag: all are their filter's own
        for name in ("e", "E", "q"):
            b.record_event("s1", sign_event(SECRET, created_at=2000 - i, kind=1, content=name,
                                            tags=[[name, vals[i % 30]]]))
    pieces = flat(b.on_eose("s1", per_req=10))
    assert sorted(len(p.tags[0][1]) for p in pieces) == [10] * 9  # 3 filters × 3 slices
    assert len(pieces) == 9


def test_next_pages_are_packed_and_named_by_the_caller():
    filters = [Filter.make(kinds=[k]) for k in range(1, 5)]
    b = batch()
    b.add_subscription("s1", filters)
    for k in range(1, 5):
        feed(b, "s1", page(k, 1000, PAGE_THRESHOLD))
    names = iter(["p1", "p2"])
    pages = b.on_eose("s1", pack=lambda fs: [fs[:3], fs[3:]], new_sub_id=lambda: next(names))
    assert [(n, len(fs)) for n, fs in pages] == [("p1", 3), ("p2", 1)]
    assert b.outstanding_subs == {"p1", "p2"}
    assert flat(pages) == [f.replace(until=926) for f in filters]


def test_event_matching_no_filter_is_reported_and_not_counted():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    assert not b.record_event("s1", event(kind=1))
    assert b.record_event("s1", event(kind=1621))
    assert not b.record_event("unknown", event(kind=1621))
    assert b.pagination["s1"].filters[0].event_count == 1


def test_events_outside_the_page_until_are_not_counted():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, PAGE_THRESHOLD))
    b.on_eose("s1")
    assert not b.record_event("s1", event(1621, 5000))


def test_batch_completes_only_when_every_sub_is_done():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    b.add_subscription("s2", [PATCHES])
    assert flat(b.on_eose("s1")) == []
    assert not b.is_complete
    assert flat(b.on_eose("s2")) == []
    assert b.is_complete


def test_rename_subscription_carries_pagination():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    feed(b, "s1", page(1621, 1000, PAGE_THRESHOLD))
    nxt = flat(b.on_eose("s1"))
    b.rename_subscription("s1", "s1-p2")
    assert b.outstanding_subs == {"s1-p2"}
    assert b.filters_of("s1-p2") == nxt
    feed(b, "s1-p2", page(1621, nxt[0].until - 1, 3))
    assert flat(b.on_eose("s1-p2")) == []
    assert b.is_complete


def test_restarted_page_does_not_count_events_twice():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    first_half = page(1621, 1000, 50)
    feed(b, "s1", first_half)
    b.restart_page("s1")  # CLOSED rate-limited: the same page goes out again
    feed(b, "s1", first_half + page(1621, 950, 10))
    assert flat(b.on_eose("s1")) == []  # 60 events, not 110: that was the last page


def test_split_subscription_sends_parts_again_on_the_same_page():
    later = ISSUES.replace(until=900)
    b = batch()
    b.add_subscription("s1", [later, PATCHES, Filter.make(kinds=[1618])])
    feed(b, "s1", page(1621, 900, 10))  # a refusal may follow events: they do not count twice
    parts = b.split_subscription("s1", [("s2", [0, 1]), ("s3", [2]), ("s4", [])])
    assert parts == [("s2", [later, PATCHES]), ("s3", [Filter.make(kinds=[1618])])]
    assert b.outstanding_subs == {"s2", "s3"}
    assert b.pagination["s2"].filters[0].event_count == 0
    assert b.split_subscription("s3", []) == []  # a filter dropped: the sub is done
    feed(b, "s2", page(1621, 900, 5))
    assert flat(b.on_eose("s2")) == []
    assert b.is_complete and not b.failed


def test_id_filters_never_paginate():
    events = page(1621, 1000, 100)
    b = batch()
    b.add_subscription("fetch", [Filter.make(ids=[e.id for e in events])])
    feed(b, "fetch", events)
    assert b.pagination["fetch"].filters[0].event_count == 100
    assert flat(b.on_eose("fetch")) == []  # an exact-id answer is complete; shortfalls are residuals
    assert b.is_complete


def test_closed_before_eose_fails_the_batch():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    assert b.on_closed("s1") == [ISSUES]
    assert b.failed
    assert b.is_complete


def test_eose_for_unknown_sub_is_harmless():
    b = batch()
    assert flat(b.on_eose("nope")) == []


# -- the inclusive-until loop ------------------------------------------------------------


def test_crowded_second_does_not_loop_forever():
    """A page full of events at one second: the relay keeps returning it for until=that
    second. After one page without progress, until steps past that second."""
    crowd = [event(1621, 1000) for _ in range(PAGE_THRESHOLD)]
    b = batch()
    b.add_subscription("s1", [ISSUES])
    feed(b, "s1", crowd)
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=1000)]
    feed(b, "s1", crowd)  # the same page again
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=999)]
    feed(b, "s1", page(1621, 999, 5))
    assert flat(b.on_eose("s1")) == []


def test_crowded_second_with_new_ids_is_asked_once_more():
    first = [event(1621, 1000) for _ in range(PAGE_THRESHOLD)]
    second = first[:40] + [event(1621, 1000) for _ in range(PAGE_THRESHOLD - 40)]
    b = batch()
    b.add_subscription("s1", [ISSUES])
    feed(b, "s1", first)
    b.on_eose("s1")
    feed(b, "s1", second)  # some new ids at 1000: progress
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=1000)]
    feed(b, "s1", second)  # nothing new now
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=999)]


def test_boundary_second_reappearing_with_older_events_is_progress():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    first = page(1621, 1100, PAGE_THRESHOLD)  # down to 1026
    feed(b, "s1", first)
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=1026)]
    feed(b, "s1", [first[-1]] + page(1621, 1025, PAGE_THRESHOLD - 1))
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=1025 - (PAGE_THRESHOLD - 2))]


def test_until_never_goes_negative():
    b = batch()
    b.add_subscription("s1", [ISSUES])
    crowd = [event(1621, 0) for _ in range(PAGE_THRESHOLD)]
    feed(b, "s1", crowd)
    assert flat(b.on_eose("s1")) == [ISSUES.replace(until=0)]
    feed(b, "s1", crowd)
    assert flat(b.on_eose("s1")) == []


# -- residuals after NIP-77 --------------------------------------------------------------


@pytest.mark.parametrize(
    "advertised, delivered, retried, semantic, expected",
    [
        (0, 0, False, True, ResidualDecision.DONE),
        (10, 10, False, True, ResidualDecision.DONE),
        (10, 12, False, True, ResidualDecision.DONE),
        (10, 9, False, True, ResidualDecision.RETRY_RESIDUAL),
        (19, 0, False, True, ResidualDecision.RETRY_RESIDUAL),  # too few to judge the relay
        (20, 2, False, True, ResidualDecision.SEMANTIC_FALLBACK),  # 10 %: unusable by id
        (20, 3, False, True, ResidualDecision.RETRY_RESIDUAL),
        (300, 0, False, True, ResidualDecision.SEMANTIC_FALLBACK),
        (300, 0, False, False, ResidualDecision.RETRY_RESIDUAL),  # layer 1: no semantic form
        (5, 0, True, True, ResidualDecision.FAIL),
        (300, 0, True, True, ResidualDecision.FAIL),
        (5, 5, True, True, ResidualDecision.DONE),
    ],
)
def test_decide_residual(advertised, delivered, retried, semantic, expected):
    assert decide_residual(advertised, delivered, retried, semantic) is expected


def negentropy_batch(advertised, items=None):
    b = batch(SyncMethod.NEGENTROPY, items)
    b.expect_ids(e.id for e in advertised)
    return b


def test_small_residual_is_retried_once_then_fails():
    events = page(1621, 1000, 10)
    b = negentropy_batch(events)
    b.add_subscription("fetch", [Filter.make(ids=[e.id for e in events])])
    feed(b, "fetch", events[:8])
    b.on_eose("fetch")
    assert b.residual_decision() is ResidualDecision.RETRY_RESIDUAL
    residual = b.begin_residual_retry()
    assert residual == {e.id for e in events[8:]}
    b.add_subscription("retry", [Filter.make(ids=residual)])
    feed(b, "retry", events[8:9])  # one of two: still incomplete
    b.on_eose("retry")
    assert b.residual_decision() is ResidualDecision.FAIL
    assert b.residual_ids() == {events[9].id}


def test_residual_retry_that_delivers_everything_is_done():
    events = page(1621, 1000, 10)
    b = negentropy_batch(events)
    feed(b, "fetch", events[:9])
    b.begin_residual_retry()
    feed(b, "retry", events[9:])
    assert b.residual_decision() is ResidualDecision.DONE


def test_relay_that_cannot_serve_by_id_switches_to_semantic_req():
    events = page(1621, 1000, 30)
    b = negentropy_batch(events)
    feed(b, "fetch", events[:3])
    assert b.residual_decision() is ResidualDecision.SEMANTIC_FALLBACK
    b.switch_to_req_eose()
    assert b.method is SyncMethod.REQ_EOSE


def test_layer1_batch_has_no_semantic_fallback():
    events = page(30617, 1000, 30)
    b = negentropy_batch(events, items=SyncItems())
    assert b.residual_decision() is ResidualDecision.RETRY_RESIDUAL


def test_negentropy_exchange_is_an_outstanding_entry_without_filters():
    b = negentropy_batch([])
    b.add_subscription("neg-1")
    assert not b.is_complete
    b.finish_subscription("neg-1")
    assert b.is_complete
    assert b.residual_decision() is ResidualDecision.DONE


# -- against a relay that caps each filter and sends the union ----------------------------

CAP = 80  # per filter, as LocalRelay's 500 but smaller; at least PAGE_THRESHOLD


def capped_relay_answer(store, filters):
    """NIP-01 as relays implement it: each filter's newest CAP, union, de-duplicated."""
    sent = {}
    for f in filters:
        hits = sorted((e for e in store if f.matches(e)), key=lambda e: (-e.created_at, e.id))
        for e in hits[:CAP]:
            sent[e.id] = e
    return list(sent.values())


def sync_all(store, filters, per_req=10):
    b = batch()
    queue = [("s0", filters)]
    b.add_subscription("s0", filters)
    received, reqs = {}, 0
    counter = itertools.count(1)
    cap = PageCap()  # learnt across pages, as the manager keeps it per connection
    while queue:
        sub, page_filters = queue.pop(0)
        reqs += 1
        assert reqs < 500, "pagination does not terminate"
        assert len(page_filters) <= per_req
        for e in capped_relay_answer(store, page_filters):
            received[e.id] = e
            b.record_event(sub, e)
        queue += b.on_eose(sub, per_req=per_req, new_sub_id=lambda: f"s{next(counter)}",
                           cap=cap)
    assert cap.floor <= CAP
    assert b.is_complete
    return received, reqs


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_grouped_overlapping_filters_with_splits_fetch_everything(data):
    """Random overlapping tag filters in one REQ: whatever was sent for which filter,
    pagination (with splits) reaches every matching event. No second holds more than CAP
    events, the documented limit of until-pagination."""
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    values = [f"v{i}" for i in range(12)]
    n = data.draw(st.integers(0, 700))
    store = []
    for i in range(n):
        tags = [[rng.choice("eEq"), rng.choice(values)] for _ in range(rng.randint(1, 3))]
        store.append(sign_event(SECRET, created_at=rng.randint(1, n // 3 + 1), kind=1111,
                                content=str(i), tags=tags))
    filters = []
    for name in "eEq":
        chosen = data.draw(st.sets(st.sampled_from(values), min_size=1))
        filters.append(Filter.make(tags={name: chosen}))
    received, _ = sync_all(store, filters)
    wanted = {e.id for e in store if any(f.matches(e) for f in filters)}
    assert wanted <= received.keys()


def test_splitting_moves_a_large_history_in_few_reqs():
    rng = random.Random(7)
    values = [f"r{i}" for i in range(50)]
    store = [sign_event(SECRET, created_at=100_000 - i, kind=1621, content=str(i),
                        tags=[["a", rng.choice(values)]]) for i in range(4_000)]
    received, reqs = sync_all(store, [Filter.make(tags={"a": values})])
    assert len(received) == 4_000
    # Unsplit, one filter at 80 per page needs 50 REQs; split ten ways about one tenth.
    assert reqs <= 12


@pytest.mark.parametrize("need, held, expected", [
    (0, 0, False),
    (300, 0, False),  # one id fetch does it
    (301, 0, True),  # a fresh own relay: pages
    (1000, 100, True),
    (1000, 101, False),  # the REQ would bring back too much of what is held
    (19_800, 20_000, False),  # the 99 % case: by id
])
def test_fetch_by_filter_when_the_own_relay_lacks_most_of_it(need, held, expected):
    assert fetch_by_filter(need, held) is expected
