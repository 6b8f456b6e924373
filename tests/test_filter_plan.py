"""Filter builders, REQ packing and the subscription budget (SPEC §3 "Budgets")."""
import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gsync.constants import MAX_TAG_VALUE_BYTES_PER_FILTER
from gsync.protocol.filters import Filter
from gsync.sync import filter_plan
from gsync.sync.filter_plan import (
    SubscriptionBudget,
    build_sync_level_aware_filters,
    chunk_by_tag_bytes,
    descendant_filters,
    filters_per_req,
    layer1_filter,
    live,
    pack_into_reqs,
    repo_tag_filters,
    root_event_filters,
    state_filters,
    tag_value_budget,
)
from gsync.sync.policy import CoveragePauses, by_shape, coverage_key
from gsync.sync.repos import SyncLevel


def hex_id(i: int) -> str:
    return f"{i:064x}"


def limits(**kw):
    base = dict(max_subscriptions=None, max_message_length=None, max_limit=None,
                max_subid_length=None, max_filters=None)
    base.update(kw)
    return SimpleNamespace(**base)


def req_message(filters, subid="x" * 64):
    return json.dumps(["REQ", subid, *[json.loads(f.to_json()) for f in filters]], separators=(",", ":"))


# -- layer builders ----------------------------------------------------------------------


def test_layer1_asks_for_announcements_and_grasp_lists():
    assert json.loads(layer1_filter().to_json()) == {"kinds": [10317, 30617]}
    assert json.loads(layer1_filter(since=100).to_json()) == {"kinds": [10317, 30617], "since": 100}


def test_state_filter_is_kind_30618_by_d():
    assert [json.loads(f.to_json()) for f in state_filters({"b", "a"}, since=5)] == [
        {"kinds": [30618], "#d": ["a", "b"], "since": 5}
    ]


def test_repo_tag_filters_use_a_A_and_q():
    addrs = ["30617:aa:one", "30617:bb:two"]
    assert [json.loads(f.to_json()) for f in repo_tag_filters(addrs)] == [
        {"#a": sorted(addrs)},
        {"#A": sorted(addrs)},
        {"#q": sorted(addrs)},
    ]


def test_root_event_filters_use_e_E_and_q():
    ids = [hex_id(1), hex_id(2)]
    assert [json.loads(f.to_json()) for f in root_event_filters(ids, since=7)] == [
        {"#e": ids, "since": 7},
        {"#E": ids, "since": 7},
        {"#q": ids, "since": 7},
    ]


def test_descendant_filters_have_the_layer3_shape():
    ids = [hex_id(3)]
    assert descendant_filters(ids) == root_event_filters(ids)


def test_no_values_no_filters():
    assert state_filters([]) == []
    assert repo_tag_filters([]) == []
    assert root_event_filters([]) == []


def test_hex_ids_are_chunked_at_489_per_filter():
    ids = [hex_id(i) for i in range(1000)]
    chunks = chunk_by_tag_bytes(ids)
    assert [len(c) for c in chunks] == [489, 489, 22]
    filters = root_event_filters(ids)
    assert len(filters) == 9
    assert all(f.tag_value_bytes() <= MAX_TAG_VALUE_BYTES_PER_FILTER for f in filters)
    covered = set().union(*(f.tag("e") for f in filters if f.tag("e")))
    assert covered == set(ids)


def test_chunk_cost_matches_the_filter_measure_for_awkward_values():
    values = ["ünïcode", 'quote"d', "ctrl\x01char", "x" * 100]
    for budget in (30, 60, 200):
        for chunk in chunk_by_tag_bytes(values, budget):
            f = Filter.make(tags={"d": chunk})
            assert f.tag_value_bytes() <= budget or len(chunk) == 1


def test_chunking_is_deterministic_whatever_the_input_order():
    ids = [hex_id(i) for i in range(600)]
    assert chunk_by_tag_bytes(reversed(ids)) == chunk_by_tag_bytes(ids)


def _chunks_one_by_one(values, budget):
    """The rule value by value (what chunk_by_tag_bytes does for values of mixed sizes)."""
    chunks, current, used = [], [], 0
    for value in sorted(set(values)):
        cost = len(json.dumps(value, ensure_ascii=False).encode()) + 1
        if current and used + cost > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(value)
        used += cost
    return chunks + ([current] if current else [])


@given(st.one_of(
    st.lists(st.text(alphabet="0123456789abcdef", min_size=64, max_size=64), max_size=1200),
    st.integers(0, 12).flatmap(lambda n: st.lists(st.text(min_size=n, max_size=n), max_size=60)),
    st.lists(st.text(max_size=8), max_size=60),
), st.sampled_from([5, 20, 67, 200, 1000, MAX_TAG_VALUE_BYTES_PER_FILTER]))
def test_chunking_equals_the_rule_applied_value_by_value(values, budget):
    # Values of one length and nothing to escape take a fast path (slices); it must cut
    # exactly where the rule does, as must the general path for everything else.
    assert chunk_by_tag_bytes(values, budget) == _chunks_one_by_one(values, budget)


@pytest.mark.parametrize("budget", [1, 66, 67, 68, 200, 1000, 4096, MAX_TAG_VALUE_BYTES_PER_FILTER])
@pytest.mark.parametrize("values", [
    [hex_id(i) for i in range(1000)],
    [f"30617:{hex_id(i)}:repo-{i % 10}" for i in range(300)],  # addresses of one length
    ["", "a", "b"],
])
def test_chunking_equals_the_rule_for_plain_values(values, budget):
    assert chunk_by_tag_bytes(values, budget) == _chunks_one_by_one(values, budget)


def test_oversized_single_value_gets_its_own_chunk():
    assert chunk_by_tag_bytes(["a" * 50, "b"], budget=20) == [["a" * 50], ["b"]]


def test_full_repo_gets_state_layer2_and_layer3():
    repos = {"30617:aa:one": SyncLevel.FULL}
    filters = build_sync_level_aware_filters(repos, [hex_id(1)], since=9)
    assert [json.loads(f.to_json()) for f in filters] == [
        {"kinds": [30618], "#d": ["one"], "since": 9},
        {"#a": ["30617:aa:one"], "since": 9},
        {"#A": ["30617:aa:one"], "since": 9},
        {"#q": ["30617:aa:one"], "since": 9},
        {"#e": [hex_id(1)], "since": 9},
        {"#E": [hex_id(1)], "since": 9},
        {"#q": [hex_id(1)], "since": 9},
    ]


def test_state_only_repo_gets_state_filters_only():
    repos = {"30617:aa:one": SyncLevel.STATE_ONLY, "30617:bb:two": SyncLevel.FULL}
    filters = build_sync_level_aware_filters(repos)
    assert [json.loads(f.to_json()) for f in filters] == [
        {"kinds": [30618], "#d": ["one", "two"]},
        {"#a": ["30617:bb:two"]},
        {"#A": ["30617:bb:two"]},
        {"#q": ["30617:bb:two"]},
    ]


def test_live_form_is_limit_zero():
    assert live([layer1_filter()]) == [layer1_filter().replace(limit=0)]


# -- packing into REQs -------------------------------------------------------------------


def test_up_to_ten_filters_share_a_req():
    filters = [Filter.make(kinds=[k]) for k in range(25)]
    reqs = pack_into_reqs(filters)
    assert [len(r) for r in reqs] == [10, 10, 5]
    assert [f for r in reqs for f in r] == filters


def test_legacy_max_filters_lowers_filters_per_req():
    filters = [Filter.make(kinds=[k]) for k in range(7)]
    assert [len(r) for r in pack_into_reqs(filters, limits(max_filters=3))] == [3, 3, 1]
    assert filters_per_req(limits(max_filters=50)) == 10


def test_whole_req_message_respects_max_message_length():
    ids = [hex_id(i) for i in range(2000)]
    filters = root_event_filters(ids)  # twelve ~32 KB filters and three small ones
    reqs = pack_into_reqs(filters, limits(max_message_length=70_000))
    # (the three small ones are twins: together, in as many REQs as filling in turn takes)
    assert [len(r) for r in reqs] == [2, 2, 2, 2, 2, 2, 3]
    for req in reqs:
        live_req = live(req)
        assert len(req_message(live_req).encode()) <= 70_000


def _greedy_reqs(n: int, per: int) -> int:
    return -(-n // per)


def test_twins_share_a_req_where_that_takes_no_more_reqs():
    # 25 filters: eight chunks' e/E/q and one more; in turn, the fourth chunk's twins
    # straddled the first two REQs (a relay sent its roots' comments once for each REQ)
    filters = root_event_filters([hex_id(i) for i in range(8 * 100)], budget=100 * 67)
    assert len(filters) == 24
    filters.append(Filter.make(kinds=[30618]))
    reqs = pack_into_reqs(filters, key=filter_plan.paging_key)
    assert len(reqs) == _greedy_reqs(len(filters), 10) == 3
    assert [f for r in reqs for f in r] == filters  # in order
    for r in reqs:
        chunks = [f.tags[0][1] for f in r if f.tags]
        assert all(chunks.count(c) == 3 for c in chunks), "a chunk's twins split across REQs"


def test_twins_split_rather_than_take_one_more_req():
    # ten chunks' e/E/q: 30 filters fill three REQs only in turn; kept together, four
    filters = root_event_filters([hex_id(i) for i in range(10 * 100)], budget=100 * 67)
    assert len(filters) == 30
    assert [len(r) for r in pack_into_reqs(filters, key=filter_plan.paging_key)] == [10, 10, 10]


@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=40), st.integers(1, 10),
       st.one_of(st.none(), st.integers(60, 200)))
def test_pack_runs_never_takes_more_reqs_than_filling_in_turn(items, per_req, max_len):
    costs = [c for c, _ in items]
    together = [bool(i) and t for i, (_, t) in enumerate(items)]
    groups = filter_plan.pack_runs(costs, together, per_req, max_len, overhead=10)
    in_turn = filter_plan.pack_runs(costs, [False] * len(costs), per_req, max_len, overhead=10)
    assert [k for g in groups for k in g] == list(range(len(costs)))
    assert len(groups) <= len(in_turn)
    for g in groups:
        assert len(g) <= per_req
        assert max_len is None or len(g) == 1 or 10 + sum(costs[k] for k in g) <= max_len


def test_live_and_historic_filters_never_share_a_req():
    f_hist = [Filter.make(kinds=[1]), Filter.make(kinds=[2])]
    f_live = live([Filter.make(kinds=[3])])
    reqs = pack_into_reqs([f_hist[0], f_live[0], f_hist[1]])
    assert reqs == [[f_hist[0], f_hist[1]], f_live]


def test_filter_too_big_alone_still_gets_a_req():
    big = Filter.make(tags={"e": [hex_id(i) for i in range(100)]})
    assert pack_into_reqs([big, big], limits(max_message_length=1000)) == [[big], [big]]


def test_tag_value_budget_shrinks_for_small_relays():
    assert tag_value_budget() == MAX_TAG_VALUE_BYTES_PER_FILTER
    assert tag_value_budget(limits(max_message_length=1_000_000)) == MAX_TAG_VALUE_BYTES_PER_FILTER
    small = limits(max_message_length=8_000)
    budget = tag_value_budget(small)
    filters = root_event_filters([hex_id(i) for i in range(500)], since=1_700_000_000, budget=budget)
    reqs = pack_into_reqs(filters, small)
    for req in reqs:
        assert len(req_message(live(req)).encode()) <= 8_000


def test_none_limits_mean_defaults():
    assert pack_into_reqs([layer1_filter()], None) == [[layer1_filter()]]
    assert SubscriptionBudget.from_limits(None).max_subscriptions == 20
    assert SubscriptionBudget.from_limits(limits()).max_subscriptions == 20


# -- subscription budget -----------------------------------------------------------------


def test_budget_keeps_control_plane_and_historic_slots():
    budget = SubscriptionBudget.from_limits(limits(max_subscriptions=20))
    assert budget.live_slots == 17
    assert budget.fits(16)
    assert not budget.fits(17)
    assert not budget.fits(15, adding=3)


def test_tiny_relay_has_no_live_slots():
    assert SubscriptionBudget.from_limits(limits(max_subscriptions=2)).live_slots == 0


def test_consolidation_when_next_subscription_would_break_the_budget():
    budget = SubscriptionBudget.from_limits(limits(max_subscriptions=20))
    assert not budget.needs_consolidation(active_live=10, baseline=5)
    assert budget.needs_consolidation(active_live=17, baseline=5)


def test_no_consolidation_when_packing_anew_makes_no_room():
    budget = SubscriptionBudget.from_limits(limits(max_subscriptions=20))  # 17 live slots
    assert not budget.needs_consolidation(active_live=17, baseline=18)  # already packed: poll the rest
    assert not budget.needs_consolidation(active_live=17, baseline=25, adding=3)
    assert budget.needs_consolidation(active_live=17, baseline=17)  # the new one packs in


def test_consolidation_when_fragmented_70_past_baseline():
    budget = SubscriptionBudget.from_limits(limits(max_subscriptions=1000))
    assert not budget.needs_consolidation(active_live=80, baseline=10)
    assert budget.needs_consolidation(active_live=81, baseline=10)


def test_live_reqs_pack_a_shape_that_goes_alone_apart_its_filters_together():
    """``CoveragePauses.pack_key``: live REQs as opening them sends them. Packed with the
    other shapes and split at opening, a REQ of #e, #E and #q with #e and #q going alone
    took three subscriptions where the count before opening said one (seed 983)."""
    roots = [f"{i:064x}" for i in range(60)]
    filters = live([f for n in range(0, 60, 10) for f in filter_plan.root_event_filters(roots[n:n + 10])])
    three = limits(max_filters=3)
    pauses = CoveragePauses()
    assert pack_into_reqs(filters, three, key=pauses.pack_key) == pack_into_reqs(filters, three)
    for shape in ("e", "q"):  # refused once, restored by the probe: alone from then on
        pauses.pause(coverage_key(Filter.make(tags={shape: ["0" * 64]})), 0.0)
    for key in pauses.due_probes(float("inf")):
        pauses.probe_passed(key)
    mixed = pack_into_reqs(filters, three)
    opened = [part for group in mixed for part in pauses.separate(group)]
    packed = pack_into_reqs(filters, three, key=pauses.pack_key)
    assert [pauses.separate(group) for group in packed] == [[group] for group in packed], "nothing split at opening"
    assert sorted(map(len, by_shape([f for group in packed for f in group]))) == sorted(
        map(len, by_shape(filters))), "every filter once"
    assert all(len({coverage_key(f) for f in group}) == 1 for group in packed if pauses.goes_alone(group[0]))
    assert len(packed) == len(filters) // 3 < len(opened), (len(packed), len(opened))


def test_historic_reqs_group_semantic_filters_and_keep_id_fetches_apart():
    # Overlapping filters (a NIP-22 comment tags its root with both E and e) may share a
    # historic REQ: PendingBatch paginates each on the events only it matched.
    roots = [f"{i:064x}" for i in range(1200)]
    filters = filter_plan.root_event_filters(roots)
    fetch = Filter.make(ids=roots[:300])
    groups = filter_plan.pack_into_reqs(filters + [fetch], key=filter_plan.paging_key)
    assert len(filters) == 9
    assert [len(g) for g in groups] == [9, 1]
    assert groups[1] == [fetch]


def test_live_reqs_may_group_any_tags():
    roots = [f"{i:064x}" for i in range(10)]
    live = filter_plan.live(filter_plan.root_event_filters(roots))
    assert len(filter_plan.pack_into_reqs(live)) == 1


def test_restrict_to_keeps_only_what_the_index_still_wants():
    from gsync.sync.filter_plan import restrict_to

    a, b, c = ("30617:" + p * 64 + ":x" for p in "abc")
    closed = [
        Filter.make(tags={"a": [a, b]}, limit=0),
        Filter.make(tags={"q": [c]}, limit=0),
        Filter.make(kinds=[30617, 10317], limit=0),
        Filter.make(kinds=[30618], tags={"d": ["x"]}, limit=0),
    ]
    wanted = [Filter.make(tags={"a": [a]}, limit=0), Filter.make(kinds=[30617, 10317], limit=0),
              Filter.make(tags={"d": ["x"]}, limit=0)]  # #d without the kinds: another shape
    assert restrict_to(closed, wanted) == [
        Filter.make(tags={"a": [a]}, limit=0),  # b is obsolete
        Filter.make(kinds=[30617, 10317], limit=0),
    ]


def test_polls_are_spaced_by_the_bytes_and_reqs_they_send(monkeypatch):
    from gsync import constants
    from gsync.sync.filter_plan import poll_interval
    monkeypatch.setattr(constants, "POLL_SECS", 5.0)
    monkeypatch.setattr(constants, "POLL_SECS_PER_KIB", 1.0)
    monkeypatch.setattr(constants, "POLL_MAX_SECS", 600.0)
    assert poll_interval(0) == poll_interval(2_000) == 5.0  # small polls: POLL_SECS
    assert poll_interval(300 * 1024) == 300.0  # 4,000 roots past the live budget: 5 minutes
    assert poll_interval(10 * 1024 * 1024) == 600.0  # never further apart than POLL_MAX_SECS
    assert poll_interval(51_200) < poll_interval(102_400)
    # ... and by the REQs they take: each is a subscription and one of the relay's paced starts
    assert poll_interval(2_000, reqs=3) == 15.0  # three shapes that go alone: 5 s each
    assert poll_interval(300 * 1024, reqs=3) == 300.0  # (the longer of the two)
    assert poll_interval(0, reqs=500) == 600.0
    assert poll_interval(0, reqs=0) == 5.0
    assert poll_interval(2_000, reqs=3, req_secs=2.0) == 15.0  # the proactive gate's pace, doubled: no change
    assert poll_interval(2_000, reqs=3, req_secs=20.0) == 60.0  # a relay paced at 10 s: polls take half of it


def test_filters_differing_only_in_one_tags_values_merge_within_a_budget():
    r1, r2 = "a" * 64, "b" * 64
    one = Filter.make(kinds=[1111], tags={"E": [r1]})
    two = Filter.make(kinds=[1111], tags={"E": [r2]})
    merged = filter_plan.merge_tag_values(one, two, budget=1000)
    assert merged == Filter.make(kinds=[1111], tags={"E": [r1, r2]})
    assert merged.to_json() == '{"kinds":[1111],"#E":["' + r1 + '","' + r2 + '"]}'
    assert filter_plan.merge_tag_values(one, one, budget=1000) == one
    # Past the budget, or any other difference: not one filter.
    assert filter_plan.merge_tag_values(one, two, budget=100) is None
    assert filter_plan.merge_tag_values(one, Filter.make(kinds=[1111], tags={"e": [r2]}), 1000) is None
    assert filter_plan.merge_tag_values(one, Filter.make(kinds=[1], tags={"E": [r2]}), 1000) is None
    assert filter_plan.merge_tag_values(one, two.replace(since=5), 1000) is None
    assert filter_plan.merge_tag_values(
        one, Filter.make(kinds=[1111], tags={"E": [r2], "k": ["1621"]}), 1000) is None


# -- a NIP-77 query past the relay's result cap ------------------------------------------

NOW = 1_780_000_000


def _events_at(times):
    return [SimpleNamespace(created_at=t) for t in times]


def _in_time(flt, t):
    return (flt.since is None or t >= flt.since) and (flt.until is None or t <= flt.until)


def test_a_filter_of_several_values_is_split_by_its_values():
    flt = Filter.make(kinds=[1621], tags={"e": ["a" * 64, "b" * 64, "c" * 64]})
    parts = filter_plan.split_past_result_cap(flt, NOW)
    assert [sorted(p.tag("e")) for p in parts] == [["a" * 64, "b" * 64], ["c" * 64]]
    assert all(p.kinds == flt.kinds and p.since is None and p.until is None for p in parts)


@pytest.mark.parametrize("since,until", [(None, None), (1_700_000_000, None), (None, 1_700_000_100),
                                         (10, 20), (None, 1_000)])
def test_a_filter_of_one_value_is_split_by_time_and_its_parts_leave_nothing_out(since, until):
    flt = Filter.make(kinds=[1621], tags={"a": ["30617:x:y"]}, since=since, until=until)
    parts = filter_plan.split_past_result_cap(flt, NOW)
    assert len(parts) == 2 and all(p.tags == flt.tags for p in parts)
    probes = [0, 5, 10, 15, 20, 999, 1_000, 1_640_995_200, 1_700_000_000, 1_700_000_050,
              1_700_000_100, NOW, NOW + 10_000]
    for t in probes:
        inside = [p for p in parts if _in_time(p, t)]
        assert len(inside) == (1 if _in_time(flt, t) else 0), (t, parts)


def test_halving_by_time_reaches_a_crowded_hour_in_few_steps():
    """Events an hour apart from 2023: halving from the 2022 floor (not from 1970) gets each
    part under 50 events in about ten levels."""
    flt = Filter.make(kinds=[1621], tags={"a": ["30617:x:y"]})
    times = [1_700_000_000 + 3600 * i for i in range(120)]
    todo, levels, done = [(flt, 0)], 0, []
    while todo:
        part, level = todo.pop()
        if sum(_in_time(part, t) for t in times) <= 50:
            done.append(part)
            continue
        levels = max(levels, level + 1)
        todo += [(p, level + 1) for p in filter_plan.split_past_result_cap(part, NOW)]
    assert levels <= 12
    assert sorted(t for p in done for t in times if _in_time(p, t)) == times


def test_one_value_and_one_second_cannot_be_split():
    flt = Filter.make(kinds=[1621], tags={"a": ["30617:x:y"]}, since=1_700_000_000, until=1_700_000_000)
    assert filter_plan.split_past_result_cap(flt, NOW) is None


def test_the_live_form_for_a_relay_dropping_limit_zero_asks_since_a_margin_back_and_no_limit():
    """``live_since``: what ORLY keeps live (no ``limit``), from LIVE_SINCE_MARGIN_SECS back;
    a live filter's own later ``since`` (a quick reconnect's) stays."""
    from gsync import constants

    now = 1_800_000_000
    plain, late = Filter.make(kinds=[1621], limit=0), Filter.make(kinds=[1621], since=now - 10, limit=0)
    sent = filter_plan.live_since([plain, late], now)
    assert [f.limit for f in sent] == [None, None]
    assert [f.since for f in sent] == [now - constants.LIVE_SINCE_MARGIN_SECS, now - 10]
    assert "limit" not in sent[0].to_json()
