"""The proof of how wide a list of tag values a relay reads (``gsync.sync.values_reach``):
pure, no sockets."""
from __future__ import annotations

import pytest

from gsync.protocol import messages as wire
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


# -- the proof, in the manager (a fake clock, no sockets) -------------------------------------


def _wide_and_empty(tmp_path, refused_first: str | None = None):
    """A relay listed by twelve repositories serving their announcements (the proof's seeds,
    ``d``) and nothing for the wide filters of its sync; ``refused_first``: a tag it refused
    a filter of before. (the harness, the relay's url)"""
    from .manager_harness import ManagerHarness

    url = "wss://values.example"
    h = ManagerHarness(tmp_path)
    anns = [f.announcement(alice, f"values-{i:02}", relays=[url]) for i in range(12)]
    h.own_relay_holds(*anns)
    h.anns = {a.id: a for a in anns}
    h.connect(url)
    if refused_first is not None:
        h.state(url).paused.pause(((1621,), (refused_first,), False, False), h.clock())
    for _ in range(12):
        h.answer_own_reads()
        h.advance(1.1)
        if _values_proofs(h, url):
            break  # (left unanswered: the test's)
        for req in h.historic_reqs(url):
            if any(list(x) == ["kinds", "limit"] for x in req[2:]) and not h.state(url).values_seed:
                h.relay_sends(url, req[1], *anns)  # (layer 1: the announcements)
        h.eose_all(url)
    return h, url


def _values_proofs(h, url) -> list:
    return [r for r in h.historic_reqs(url) if len(r) == 3 and "ids" in r[2] and "#d" in r[2]]


def test_a_refused_proof_teaches_nothing_and_pauses_no_coverage(tmp_path):
    h, url = _wide_and_empty(tmp_path)
    [proof] = _values_proofs(h, url)
    assert len(proof[2]["#d"]) == 12 and proof[2]["authors"] == [alice.pubkey]
    h.relay_says(url, wire.Closed(proof[1], wire.Prefix.BLOCKED, "not allowed"))
    h.advance(1.1)
    assert not h.state(url).paused.refuses_tag("d"), "the proof's shape is its own: nothing paused"
    assert h.state(url).max_values_learned is None and len(_values_proofs(h, url)) == 1


def test_no_proof_asks_by_a_tag_the_relay_refused_a_filter_of(tmp_path):
    """The simulator's seed 899 of the every-behaviour world with silent caps: a relay
    refusing ``#e`` queries was asked a proof by ``#e`` (its seed a reply) three times."""
    h, url = _wide_and_empty(tmp_path, refused_first="d")
    assert h.state(url).values_seed is not None and not _values_proofs(h, url)
    h2, url2 = _wide_and_empty(tmp_path / "not-refused")
    assert _values_proofs(h2, url2)


def test_a_proof_answered_slowly_is_asked_again_and_finds_the_width(tmp_path):
    """The simulator's seed 2195 of the stress world with silent caps: relay4, which stops
    slow queries at 5 s and has busy moments of seconds, answered one of its proof's asks
    slowly; that ended the day's proof (a slow answer proves nothing), and nine comments it
    held waited eleven days. A slow answer is asked again (twice at most a proof)."""
    h, url = _wide_and_empty(tmp_path)
    answered: set = set()

    def answer_proofs() -> None:  # (a relay reading six values; its first answer slow)
        for req in _values_proofs(h, url):
            if req[1] in answered:
                continue
            answered.add(req[1])
            if len(answered) == 1:
                h.advance(3)  # past TIME_CUT_SUSPECT_SECS: a time budget may have cut it
            elif len(req[2]["#d"]) <= 6:
                h.relay_sends(url, req[1], h.anns[req[2]["ids"][0]])
            h.relay_says(url, wire.Eose(req[1]))

    for _ in range(30):
        answer_proofs()
        h.answer_own_reads()
        h.advance(1.1)
        answer_proofs()
        h.eose_all(url)
    assert h.state(url).max_values_learned == 6, sorted(len(r[2]["#d"]) for r in _values_proofs(h, url))
