"""The own relay's witnesses (``sync.own_witness``): which events are asked back after an
outage, and how the answer is judged."""
from __future__ import annotations

import hashlib
import random

from gsync.sync.own_witness import OwnWitness, regular


def _ids(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def test_only_events_stored_for_good_witness():
    assert all(regular(k) for k in (1, 5, 1111, 1617, 1618, 1619, 1621, 1630, 7, 40_000))
    assert not any(regular(k) for k in (0, 3, 10_002, 10_317, 20_001, 30_617, 30_618))
    w = OwnWitness(size=4)
    a, b = _ids(2)
    w.stored([(a, 30_618), (b, 1621)])
    assert w.sample() == [b]


def test_the_latest_stored_are_asked_newest_first_and_the_spread_is_the_smallest_ids_ever_stored():
    w = OwnWitness(size=8)
    ids = _ids(500)
    random.Random(1).shuffle(ids)
    for chunk in range(0, 500, 37):
        w.stored([(i, 1) for i in ids[chunk:chunk + 37]])
    sample = w.sample()
    assert sample[:8] == list(reversed(ids[-8:]))
    assert set(sample[8:]) == set(sorted(ids)[:8]) - set(ids[-8:])  # (each asked once)
    assert len(sample) == len(set(sample)) <= 16


def test_a_witness_the_own_relay_no_longer_has_is_judged_gone_once():
    w = OwnWitness(size=4)
    ids = _ids(10)
    w.stored([(i, 1617) for i in ids])
    asked = w.sample()
    gone = asked[:2]
    assert w.judge(asked, asked[2:]) == gone
    again = w.sample()
    assert not set(gone) & set(again)  # deleted or expired there: not a loss a second time
    assert w.judge(again, again) == []
    w.stored([(gone[0], 1617)])  # stored anew (gsync delivered it again): a witness again
    assert gone[0] in w.sample()


def test_an_event_stored_twice_is_asked_once():
    w = OwnWitness(size=4)
    a, b = _ids(2)
    w.stored([(a, 1), (b, 1), (a, 1)])
    assert w.sample() == [a, b]


def test_nothing_stored_asks_nothing():
    assert OwnWitness().sample() == []
