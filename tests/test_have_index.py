"""The NIP-77 have-set beyond the own relay's holdings (SPEC §4): in-flight and refused events,
indexed so that an exchange gets exactly those its filter can match."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol.filters import Filter
from gsync.sync.filter_plan import build_sync_level_aware_filters, layer1_filter
from gsync.sync.have_index import INDEXED_TAGS, HaveIndex
from gsync.sync.rejected import RejectedIndex, _Cold, filter_refs
from gsync.sync.repos import SyncLevel
from tests import factory as f

ALICE, BOB = f.Author.named("alice"), f.Author.named("bob")


def _world():
    repo = f.announcement(ALICE, "one", created_at=100)
    other = f.announcement(BOB, "two", created_at=101)
    bug = f.issue(BOB, repo, created_at=110)
    theirs = f.issue(ALICE, other, created_at=111)
    events = [repo, other, bug, theirs, f.state(ALICE, "one", created_at=120),
              f.comment(ALICE, bug, created_at=130), f.status(ALICE, bug, created_at=131),
              f.quote(BOB, bug, created_at=132), f.comment(BOB, theirs, created_at=133)]
    return repo, bug, events


def _filters(repo, bug):
    return [layer1_filter(), *build_sync_level_aware_filters({repo.address: SyncLevel.FULL}, [bug.id]),
            Filter.make(ids=[bug.id]), Filter.make(authors=[BOB.pubkey]), Filter.make(kinds=[1111]),
            Filter.make(tags={"p": [BOB.pubkey]}), Filter.make(), Filter.make(since=125),
            Filter.make(tags={"e": [bug.id]}, until=130)]


def test_each_filter_gets_exactly_the_indexed_events_it_matches():
    repo, bug, events = _world()
    index = HaveIndex()
    for e in events:
        index.add(e.id, e)
    for flt in _filters(repo, bug):
        want = sorted((e.created_at, e.id) for e in events if flt.matches(e))
        assert sorted(index.matching(flt)) == want, flt


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_an_exchange_over_one_repo_does_not_touch_unrelated_events():
    repo, bug, events = _world()
    index = HaveIndex()
    for i in range(5000):  # in flight for other repositories
        note = f.comment(BOB, f.issue(BOB, f"30617:{BOB.pubkey}:x{i}", created_at=1000 + i),
                         created_at=9000 + i)
        index.add(note.id, note)
    for e in events:
        index.add(e.id, e)
    layer2 = Filter.make(tags={"a": [repo.address]})
    assert len(index._candidates(layer2)) == 2  # the issue and the status, not 10,000 events
    assert sorted(index.matching(layer2)) == sorted((e.created_at, e.id) for e in events if layer2.matches(e))


def test_discarded_events_leave_every_index():
    repo, bug, events = _world()
    index = HaveIndex()
    for e in events:
        index.add(e.id, e)
    for e in events:
        index.discard(e.id)
    assert len(index) == 0
    assert index._by_tag == {} and index._by_author == {} and index._by_kind == {}
    for flt in _filters(repo, bug):
        assert index.matching(flt) == []


def test_loose_entries_go_to_every_filter_their_time_allows():
    """A refusal saved by an older gsync kept no tags (nor kind, nor author): it may match
    any filter, so every filter gets it, within its time bounds."""
    index = HaveIndex()
    index.add("ab" * 32, _Cold(500, 0.0, "", ()))
    assert index.matching(Filter.make(tags={"a": ["x"]})) == [(500, "ab" * 32)]
    assert index.matching(Filter.make(kinds=[1])) == [(500, "ab" * 32)]
    assert index.matching(Filter.make(since=501)) == []
    assert index.any_matching(Filter.make(authors=[BOB.pubkey]))


def test_the_rejected_index_gives_each_exchange_only_what_its_filter_may_match():
    repo, bug, events = _world()
    rejected = RejectedIndex(hot_secs=10, cold_secs=100)
    for e in events:
        rejected.add(e, now=0)
    layer3 = Filter.make(tags={"E": [bug.id]})
    assert rejected.items_matching(layer3) == [(events[5].created_at, events[5].id)]
    assert rejected.any_may_match(layer3)
    rejected.remove(events[5].id)
    assert rejected.items_matching(layer3) == [] and not rejected.any_may_match(layer3)
    rejected.expire(now=200)  # the cold tier ages out: the index with it
    assert len(rejected) == 0 and len(rejected._index) == 0


def test_the_rejected_index_keeps_its_matching_across_a_restart():
    repo, bug, events = _world()
    rejected = RejectedIndex()
    rejected.add(events[5], now=0)  # a comment on ``bug``
    again = RejectedIndex.loads(rejected.dumps(), now=1)
    assert again.items_matching(Filter.make(tags={"E": [bug.id]})) == [(events[5].created_at, events[5].id)]
    assert again.items_matching(Filter.make(tags={"a": ["anything"]})) == []
    assert again.items_matching(Filter.make(since=events[5].created_at + 1)) == []


def test_the_rejected_index_is_bounded_the_oldest_refusal_making_room():
    repo, bug, events = _world()
    rejected = RejectedIndex(max_entries=4)
    for i, e in enumerate(events):
        rejected.add(e, now=i)
    assert len(rejected) == 4 and len(rejected._index) == 4
    assert [e.id in rejected for e in events] == [False] * (len(events) - 4) + [True] * 4
    again = RejectedIndex.loads(rejected.dumps(), now=10, max_entries=2)
    assert [e.id in again for e in events[-4:]] == [False, False, True, True]


def test_an_event_with_too_many_filter_tags_may_match_any_filter():
    bug = f.issue(BOB, f"30617:{ALICE.pubkey}:one")
    spam = f.comment(ALICE, bug, extra_tags=[["e", f"{i:064x}"] for i in range(40)])
    assert filter_refs(spam) is None
    rejected = RejectedIndex()
    rejected.add(spam, now=0)
    assert rejected.any_may_match(Filter.make(tags={"a": ["30617:x:y"]}))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_matching_agrees_with_filter_matching_on_random_worlds(seed, n):
    rng = random.Random(seed)
    repo, bug, events = _world()
    index = HaveIndex()
    chosen = rng.sample(events, k=min(n, len(events)))
    compact = set()
    for e in chosen:  # an event in flight, or a refusal's compact entry
        if rng.random() < 0.5:
            index.add(e.id, e)
        else:
            index.add(e.id, _Cold(e.created_at, 0.0, "", (), e.kind, e.pubkey, filter_refs(e)))
            compact.add(e.id)
    for e in rng.sample(chosen, k=len(chosen) // 3):
        index.discard(e.id)
    present = [e for e in chosen if e.id in index]
    for flt in _filters(repo, bug):
        got = sorted(index.matching(flt))
        exact = sorted((e.created_at, e.id) for e in present if flt.matches(e))
        if all(name in INDEXED_TAGS for name, _ in flt.tags):
            assert got == exact, flt
        else:  # a compact entry kept no such tag: it may match (conservative), never missed
            assert set(exact) <= set(got) and {i for _, i in set(got) - set(exact)} <= compact, flt
