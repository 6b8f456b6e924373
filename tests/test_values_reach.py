"""The proof of how wide a list of tag values a relay reads (``gsync.sync.values_reach``):
pure, no sockets."""
from __future__ import annotations

import pytest

from gsync.protocol.filters import Filter
from gsync.sync import values_reach
from gsync.sync.values_reach import ValuesSeed

from . import factory as f

alice = f.Author.named("alice")


def _search(cap: int | None, width: int, reach: int = 0, held: bool = True) -> tuple[int, list[int]]:
    """The proof's search against a relay reading ``cap`` values (None: any), from an
    empty filter of ``width``: (the width found, 0 for none; the widths asked)."""
    served_at, unserved_at, asked = 0, 0, [width]
    w = width
    while True:
        if held and (cap is None or w <= cap):
            served_at = w
            if not unserved_at:
                return served_at, asked
        else:
            unserved_at = w
        w = values_reach.next_width(served_at, unserved_at, reach if not served_at else 0)
        if w is None:
            return served_at, asked
        asked.append(w)


@pytest.mark.parametrize("width", [2, 3, 10, 25, 100, 489])
def test_the_search_finds_every_cap_below_the_width_asked(width):
    for cap in range(1, width):
        found, asked = _search(cap, width)
        assert found == cap, (cap, asked)
        assert len(asked) <= 2 * width.bit_length() + 1, (cap, asked)


def test_a_relay_reading_as_wide_as_asked_is_proven_by_one_ask():
    assert _search(None, 489) == (489, [489])
    assert _search(489, 489) == (489, [489])


def test_the_reach_an_answer_proved_is_asked_first_and_shortens_the_search():
    found, asked = _search(10, 489, reach=8)
    assert found == 10 and asked[:2] == [489, 8]
    assert len(asked) < len(_search(10, 489)[1])


def test_a_seed_unserved_at_a_width_the_relay_reads_proves_nothing():
    # (deleted since, hidden on read: asked at the reach an answer proved, not served)
    assert _search(10, 489, reach=8, held=False) == (0, [489, 8])
    # with no reach to go by, halved down to one value, then given up
    found, asked = _search(10, 64, held=False)
    assert found == 0 and asked == [64, 32, 16, 8, 4, 2, 1]


def test_the_seed_is_an_event_served_and_one_of_its_tag_values():
    repo = f.announcement(alice, "seeded", clone=["http://h/seeded.git"], relays=["ws://h"])
    assert values_reach.seed_of(repo) == ValuesSeed(repo.id, "d", "seeded", 30617, alice.pubkey)
    issue = f.issue(alice, repo, subject="bug")
    assert values_reach.seed_of(issue) == ValuesSeed(issue.id, "a", repo.address, 1621, alice.pubkey)
    note = f.Author.named("bob").sign(1, [["t", "x"]], "no seed tag")
    assert values_reach.seed_of(note) is None


def test_a_proof_asks_the_seed_by_its_id_among_that_many_values():
    seed = ValuesSeed("ab" * 32, "d", "seeded", 30617, "cd" * 32)
    flt = values_reach.proof_filter(seed, 25)
    assert flt.ids == frozenset({seed.event_id}) and flt.kinds == frozenset({30617})
    assert flt.authors == frozenset({seed.author})
    assert values_reach.tag_width(flt) == 25 and "seeded" in flt.tag("d")
    assert values_reach.tag_width(values_reach.proof_filter(seed, 1)) == 1
    assert values_reach.tag_width(Filter.make(kinds=[1], tags={"a": ["x", "y"], "e": ["z"]})) == 3
