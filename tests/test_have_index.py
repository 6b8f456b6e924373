"""The NIP-77 have-set beyond the own relay's holdings (SPEC §4): in-flight and refused events,
indexed so that an exchange gets exactly those its filter can match."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol.filters import Filter
from gsync.sync.filter_plan import build_sync_level_aware_filters, layer1_filter
from gsync.sync.have_index import HaveIndex, RejectedHave
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
        index.add(e)
    for flt in _filters(repo, bug):
        want = sorted((e.created_at, e.id) for e in events if flt.matches(e))
        assert sorted(index.matching(flt)) == want, flt


def test_an_exchange_over_one_repo_does_not_touch_unrelated_events():
    repo, bug, events = _world()
    index = HaveIndex()
    for i in range(5000):  # in flight for other repositories
        index.add(f.comment(BOB, f.issue(BOB, f"30617:{BOB.pubkey}:x{i}", created_at=1000 + i),
                            created_at=9000 + i))
    for e in events:
        index.add(e)
    layer2 = Filter.make(tags={"a": [repo.address]})
    assert len(index._candidates(layer2)) == 2  # the issue and the status, not 10,000 events
    assert sorted(index.matching(layer2)) == sorted((e.created_at, e.id) for e in events if layer2.matches(e))


def test_discarded_events_leave_every_index():
    repo, bug, events = _world()
    index = HaveIndex()
    for e in events:
        index.add(e)
    for e in events:
        index.discard(e.id)
    assert len(index) == 0
    assert index._by_tag == {} and index._by_author == {} and index._by_kind == {}
    for flt in _filters(repo, bug):
        assert index.matching(flt) == []


def test_loose_entries_go_to_every_filter_their_time_allows():
    index = HaveIndex()
    index.add_loose("ab" * 32, 500)
    assert index.matching(Filter.make(tags={"a": ["x"]})) == [(500, "ab" * 32)]
    assert index.matching(Filter.make(kinds=[1])) == [(500, "ab" * 32)]
    assert index.matching(Filter.make(since=501)) == []


def test_rejected_have_follows_the_rejected_index():
    repo, bug, events = _world()
    rejected = RejectedHave(hot_secs=10, cold_secs=100)
    for e in events:
        rejected.add(e, now=0)
    layer3 = Filter.make(tags={"E": [bug.id]})
    assert rejected.items_matching(layer3) == [(events[5].created_at, events[5].id)]
    rejected.remove(events[5].id)
    assert rejected.items_matching(layer3) == []
    rejected.expire(now=200)  # the cold tier ages out: the index with it
    assert len(rejected) == 0 and len(rejected.have) == 0


def test_rejected_have_survives_a_restart_as_loose_entries():
    repo, bug, events = _world()
    rejected = RejectedHave()
    rejected.add(events[5], now=0)
    again = RejectedHave.loads(rejected.dumps(), now=1)
    # tags are not saved: after a restart the refused event is claimed for every filter
    assert again.items_matching(Filter.make(tags={"a": ["anything"]})) == [(events[5].created_at, events[5].id)]
    assert again.items_matching(Filter.make(since=events[5].created_at + 1)) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_matching_agrees_with_filter_matching_on_random_worlds(seed, n):
    rng = random.Random(seed)
    repo, bug, events = _world()
    index = HaveIndex()
    chosen = rng.sample(events, k=min(n, len(events)))
    for e in chosen:
        index.add(e, compact=rng.random() < 0.5)
    for e in rng.sample(chosen, k=len(chosen) // 3):
        index.discard(e.id)
    present = [e for e in chosen if e.id in index]
    for flt in _filters(repo, bug):
        assert sorted(index.matching(flt)) == sorted((e.created_at, e.id) for e in present if flt.matches(e))
