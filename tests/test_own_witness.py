"""The own relay's witnesses (``sync.own_witness``): which events are asked back after an
outage, and how the answer is judged."""
from __future__ import annotations

import hashlib
import random

from gsync.sync.own_held import HeldEntry
from gsync.sync.own_witness import OwnWitness, keyed, regular

AUTHOR = "a" * 64


def _ids(n: int, salt: str = "") -> list[str]:
    return [hashlib.sha256(f"{salt}{i}".encode()).hexdigest() for i in range(n)]


def _entry(kind: int, created_at: int = 1_700_000_000, d: str | None = None, author: str = AUTHOR) -> HeldEntry:
    return HeldEntry(created_at, kind, author, (("d", d),) if d is not None else ())


def _held(w: OwnWitness, asked, pairs):
    """What the own relay answers to ``w.filters(asked)`` when it holds ``pairs``."""
    filters = w.filters(asked)
    return [(i, e) for i, e in pairs
            if any(f.ids and i in f.ids or not f.ids and e.kind in (f.kinds or ()) for f in filters)]


def test_which_kinds_witness_and_how():
    assert all(regular(k) for k in (1, 5, 1111, 1617, 1618, 1619, 1621, 1630, 7, 40_000))
    assert not any(regular(k) for k in (0, 3, 10_002, 10_317, 20_001, 30_617, 30_618))
    assert all(keyed(k) for k in (0, 3, 10_002, 10_317, 30_617, 30_618))
    assert not keyed(20_001)  # ephemeral: never stored
    w = OwnWitness(size=4)
    a, b, c = _ids(3)
    w.stored([(a, _entry(20_001)), (b, _entry(1621)), (c, _entry(30_618, d="r"))])
    assert w.sample() == [b, c]
    assert w.sample(keyed_too=False) == [b]  # (what is saved for the next process: it knows no keys)


def test_the_latest_stored_are_asked_newest_first_and_the_spread_is_the_smallest_ids_ever_stored():
    w = OwnWitness(size=8)
    ids = _ids(500)
    random.Random(1).shuffle(ids)
    for chunk in range(0, 500, 37):
        w.stored([(i, _entry(1)) for i in ids[chunk:chunk + 37]])
    sample = w.sample()
    assert sample[:8] == list(reversed(ids[-8:]))
    assert set(sample[8:]) == set(sorted(ids)[:8]) - set(ids[-8:])  # (each asked once)
    assert len(sample) == len(set(sample)) <= 16


def test_a_witness_the_own_relay_no_longer_has_is_judged_gone_once():
    w = OwnWitness(size=4)
    ids = _ids(10)
    w.stored([(i, _entry(1617)) for i in ids])
    asked = w.sample()
    gone = asked[:2]
    assert w.judge(asked, [(i, _entry(1617)) for i in asked[2:]]) == gone
    again = w.sample()
    assert not set(gone) & set(again)  # deleted or expired there: not a loss a second time
    assert w.judge(again, [(i, _entry(1617)) for i in again]) == []
    w.stored([(gone[0], _entry(1617))])  # stored anew (gsync delivered it again): a witness again
    assert gone[0] in w.sample()


def test_a_keyed_witness_replaced_by_a_newer_one_of_its_key_is_no_loss_and_one_without_it_is():
    """A repository's state is replaced at every push: the own relay holding a newer state
    of the same key is no loss; holding none of that key, or an older one, is."""
    w = OwnWitness(size=4)
    state, newer, announcement = _ids(3, "k")
    w.stored([(state, _entry(30_618, 100, d="r")), (announcement, _entry(30_617, 100, d="r"))])
    asked = w.sample()
    assert [f.tag("d") for f in w.filters(asked)] == [None, frozenset({"r"})]  # by id, and by key
    holds = [(newer, _entry(30_618, 200, d="r"))]  # the state replaced; the announcement lost
    assert w.judge(asked, _held(w, asked, holds)) == [announcement]
    assert w.sample() == []  # both judged: the replaced one superseded, the lost one gone
    w.stored([(state, _entry(30_618, 100, d="r"))])
    assert w.judge([state], [(state + "x", _entry(30_618, 50, d="r"))]) == [state]  # only an older one


def test_a_snapshot_lets_the_next_process_judge_keyed_witnesses_too():
    w = OwnWitness(size=4)
    issue_id, state = _ids(2, "s")
    w.stored([(issue_id, _entry(1621)), (state, _entry(30_618, 100, d="r"))])
    saved = w.snapshot()
    nxt = OwnWitness(size=4)
    asked = nxt.restore(saved)
    assert asked == [issue_id, state]
    assert nxt.judge(asked, [(issue_id, _entry(1621)), ("n" * 64, _entry(30_618, 200, d="r"))]) == []
    again = OwnWitness(size=4)
    assert again.judge(again.restore(saved), [(issue_id, _entry(1621))]) == [state]  # its key gone
    assert OwnWitness().restore({"keyed": [["x", "not a kind", "a", "d", 1]]}) == []


def test_an_event_stored_twice_is_asked_once():
    w = OwnWitness(size=4)
    a, b = _ids(2)
    w.stored([(a, _entry(1)), (b, _entry(1)), (a, _entry(1))])
    assert w.sample() == [a, b]


def test_nothing_stored_asks_nothing():
    assert OwnWitness().sample() == []
