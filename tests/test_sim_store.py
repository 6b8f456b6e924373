"""The relay model's store answers a query as a relay would (everything it holds that matches,
newest first, then the limit) through its kept lists: they follow every add, replacement and
removal."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol.event import Event
from gsync.protocol.filters import Filter
from gsync.sim.relay import EventStore

AUTHORS = ["a" * 64, "b" * 64]
VALUES = ["x", "y", "z"]
SERIAL = itertools.count()  # (event ids: each event its own)


@st.composite
def events(draw):
    kind = draw(st.sampled_from([1, 1621, 30617, 0]))
    tags = [("d", draw(st.sampled_from(VALUES)))] if kind == 30617 else []
    tags += [(name, draw(st.sampled_from(VALUES))) for name in draw(st.lists(st.sampled_from("ae"), max_size=2))]
    return Event(f"{next(SERIAL):064x}", draw(st.sampled_from(AUTHORS)), draw(st.integers(0, 20)), kind,
                 tuple(tags), "", "0" * 128)


filters = st.builds(
    Filter.make,
    authors=st.none() | st.lists(st.sampled_from(AUTHORS), max_size=2),
    kinds=st.none() | st.lists(st.sampled_from([1, 1621, 30617, 0]), max_size=2),
    tags=st.dictionaries(st.sampled_from("ade"), st.lists(st.sampled_from(VALUES), min_size=1, max_size=2), max_size=2),
    since=st.none() | st.integers(0, 20),
    until=st.none() | st.integers(0, 20),
    limit=st.none() | st.integers(0, 5),
)
steps = st.lists(st.one_of(st.tuples(st.just("add"), events()), st.tuples(st.just("remove"), st.integers(0, 40)),
                           st.tuples(st.just("query"), filters, st.none() | st.integers(0, 5))), max_size=40)


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_query_answers_what_the_store_holds_through_adds_and_removals(steps):
    store = EventStore()
    added: list[str] = []
    for step in steps:
        if step[0] == "add":
            store.add(step[1])
            added.append(step[1].id)
        elif step[0] == "remove":
            if added:
                store.remove(added[step[1] % len(added)])
        else:
            _, flt, cap = step
            expected = sorted((e for e in store.events.values() if flt.matches(e)),
                              key=lambda e: (-e.created_at, e.id))
            limit = flt.limit if cap is None else cap if flt.limit is None else min(flt.limit, cap)
            assert store.query(flt, cap) == (expected if limit is None else expected[:limit])
