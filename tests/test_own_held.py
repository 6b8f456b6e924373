"""sync/own_held.py: what the own relay holds, read once per filter and session."""
from gsync.protocol.filters import Filter
from gsync.sync.own_held import OwnHeld, coverage_units

from . import factory as f

alice, bob = f.Author.named("alice"), f.Author.named("bob")
A, B = f.repo_addr(alice, "one"), f.repo_addr(alice, "two")


def held():
    return OwnHeld(ttl=100.0, max_entries=1000)


def test_a_filter_is_known_once_read_and_only_then():
    own = held()
    by_a = Filter.make(tags={"a": [A]})
    issues = [f.issue(bob, A, created_at=1000 + i) for i in range(3)]
    assert own.holdings(by_a, now=0) is None
    own.learn(by_a, issues, now=0)
    assert sorted(own.holdings(by_a, now=1)) == sorted((e.created_at, e.id) for e in issues)
    assert own.holdings(Filter.make(tags={"a": [A, B]}), now=1) is None, "B was never read"


def test_what_one_packing_read_answers_another():
    own = held()
    one, two = f.issue(bob, A), f.issue(bob, B)
    own.learn(Filter.make(tags={"a": [A]}), [one], now=0)
    own.learn(Filter.make(tags={"a": [B]}), [two], now=0)
    both = own.holdings(Filter.make(tags={"a": [A, B]}), now=1)
    assert sorted(i for _, i in both) == sorted([one.id, two.id])
    second = own.holdings(Filter.make(tags={"a": [A]}, since=one.created_at, until=one.created_at), now=1)
    assert second == [(one.created_at, one.id)]  # one crowded second of it


def test_confirmed_events_join_what_is_known():
    own = held()
    by_a = Filter.make(tags={"a": [A]})
    own.learn(by_a, [], now=0)
    stored = f.issue(bob, A)
    own.confirm([stored])
    assert own.holdings(by_a, now=1) == [(stored.created_at, stored.id)]


def test_a_day_old_read_is_read_again():
    own = held()
    by_a = Filter.make(tags={"a": [A]})
    own.learn(by_a, [], now=0)
    assert own.holdings(by_a, now=99) == []
    assert own.holdings(by_a, now=100) is None


def test_an_outage_forgets_everything_and_the_bound_starts_over():
    own = held()
    by_a = Filter.make(tags={"a": [A]})
    own.learn(by_a, [f.issue(bob, A)], now=0)
    own.forget()
    assert own.holdings(by_a, now=1) is None and len(own) == 0
    small = OwnHeld(ttl=100.0, max_entries=2)
    small.learn(by_a, [f.issue(bob, A) for _ in range(3)], now=0)
    assert small.holdings(by_a, now=1) is None and len(small) == 0


def test_bounded_reads_cover_nothing_and_some_filters_cannot_be_answered():
    own = held()
    bounded = Filter.make(tags={"a": [A]}, since=5)
    own.learn(bounded, [], now=0)
    assert own.holdings(Filter.make(tags={"a": [A]}), now=1) is None
    assert coverage_units(Filter.make(ids=["00" * 32])) is None
    assert coverage_units(Filter.make(tags={"a": [A], "e": ["00" * 32]})) is None
    assert coverage_units(Filter.make(kinds=[30617, 10317])) == [(frozenset({30617, 10317}), None, None, None)]


def test_kinds_and_authors_are_part_of_what_was_read():
    own = held()
    state = Filter.make(kinds=[30618], tags={"d": ["one"]})
    own.learn(state, [], now=0)
    assert own.holdings(Filter.make(tags={"d": ["one"]}), now=1) is None
    assert own.holdings(state, now=1) == []


def test_what_is_missing_of_a_filter_is_its_unread_values_only():
    own = held()
    own.learn(Filter.make(tags={"a": [A]}), [], now=0)
    assert own.missing(Filter.make(tags={"a": [A]}), now=1) is None
    assert own.missing(Filter.make(tags={"a": [A, B]}), now=1) == Filter.make(tags={"a": [B]})
    assert own.missing(Filter.make(tags={"e": [A]}), now=1) == Filter.make(tags={"e": [A]})
    layer1 = Filter.make(kinds=[30617, 10317])
    assert own.missing(layer1, now=1) == layer1
    assert own.missing(Filter.make(ids=["00" * 32]), now=1) == Filter.make(ids=["00" * 32])


def test_values_being_read_are_waited_for_not_read_again():
    own = held()
    by_a, by_ab = Filter.make(tags={"a": [A]}), Filter.make(tags={"a": [A, B]})
    own.begin(by_a)
    assert own.awaits(by_ab, now=0), "A is being read: a filter needing it waits"
    assert not own.awaits(Filter.make(tags={"a": [B]}), now=0)
    own.learn(by_a, [], now=1)
    own.end(by_a)
    assert not own.awaits(by_ab, now=1)
    assert own.missing(by_ab, now=1) == Filter.make(tags={"a": [B]}), "only B is left to read"
    own.begin(by_a)
    own.end(by_a)  # a read that failed, or spanned an outage: nothing learnt, nothing waited for
    own.forget()
    assert not own.awaits(by_ab, now=2) and own.missing(by_ab, now=2) == by_ab
    bounded = Filter.make(tags={"a": [B]}, since=10)
    own.begin(bounded)  # teaches nothing: nobody waits for it
    assert not own.awaits(by_ab, now=2)


def test_unread_leaves_out_what_a_read_under_way_will_teach():
    held = OwnHeld(ttl=100, max_entries=1000)
    both = Filter.make(kinds=[1621], tags={"a": {"x", "y"}})
    held.begin(Filter.make(kinds=[1621], tags={"a": {"x"}}))
    assert held.unread(both, 0) == Filter.make(kinds=[1621], tags={"a": {"y"}})
    assert held.missing(both, 0) == both  # nothing known yet
    held.begin(Filter.make(kinds=[1621], tags={"a": {"y"}}))
    assert held.unread(both, 0) is None
    held.end(Filter.make(kinds=[1621], tags={"a": {"x"}}))
    assert held.unread(both, 0) == Filter.make(kinds=[1621], tags={"a": {"x"}})


def test_what_tags_an_event_stored_anew_is_known_until_it_proves_held_before():
    """An event stored anew: its thread (#e, #E, #q, any kinds) holds what was confirmed
    since, nothing read; a day on, or answered ``duplicate``, or after an outage, it is
    read again. Other tags of it are not known."""
    own = held()
    root = f.issue(bob, A)
    reply = f.comment(alice, root)
    own.new_threads([root.id], now=0)
    own.confirm([root, reply])
    for name in ("e", "E", "q"):
        thread = Filter.make(tags={name: [root.id]})
        assert own.missing(thread, now=1) is None
    assert own.holdings(Filter.make(tags={"E": [root.id]}), now=1) == [(reply.created_at, reply.id)]
    assert own.holdings(Filter.make(kinds=[1111], tags={"e": [root.id]}), now=1) is not None
    assert own.holdings(Filter.make(tags={"e": [root.id, reply.id]}), now=1) is None, "the reply's was never known"
    assert own.holdings(Filter.make(tags={"a": [A]}), now=1) is None
    assert own.holdings(Filter.make(tags={"e": [root.id]}), now=100) is None, "a day on"
    own.not_new([root.id])
    assert own.holdings(Filter.make(tags={"e": [root.id]}), now=1) is None, "answered duplicate"
    own.new_threads([root.id], now=0)
    own.forget()
    assert own.holdings(Filter.make(tags={"e": [root.id]}), now=1) is None, "an outage"
