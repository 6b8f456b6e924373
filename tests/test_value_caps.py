"""A relay that caps the values in one list of a filter (its ids, authors or one tag's):
filters sliced within the cap it taught, historic pages and live subscriptions alike, and
nothing paused for it. The pure parts, then the manager's decisions (tests/manager_harness.py);
over a socket in tests/test_engine_public_relays.py."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gsync import constants
from gsync.io.inbox import HandshakeDone, RelayDisconnected
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter
from gsync.protocol.messages import parse_relay_message
from gsync.sync import filter_plan, policy
from gsync.sync.pending import FilterPaginationState

from .factory import Author, announcement
from .manager_harness import FakeWs, ManagerHarness

A = "wss://a.example"
TOO_MANY = "error: too many values in filter"


def hex_id(i: int) -> str:
    return f"{i:064x}"


# -- the pure parts ------------------------------------------------------------------------


@pytest.mark.parametrize("text, values, filters", [
    ("error: too many values in filter", True, False),
    ("ERROR: bad req: total filter items too large", True, False),  # strfry, 64 KB of one list
    ("invalid: too many ids", True, False),
    ("error: too many filters", False, True),
    ("filter too large", False, False),  # about a filter's size: which part, not said
    ("rate-limited: too many values", False, False),  # (the prefix says what it is: a rate)
    ("blocked: not allowed", False, False),
])
def test_words_naming_the_values_of_a_filter_are_told_from_words_about_its_filters(text, values, filters):
    assert wire.says_too_many_values(text) is values or text.startswith("rate-limited")
    assert wire.says_too_many_filters(text) is filters


def test_the_cap_is_half_the_longest_list_refused_and_never_learnt_from_what_slicing_cannot_help():
    many = Filter.make(tags={"a": [f"30617:{hex_id(i)}:r" for i in range(40)]})
    few = Filter.make(kinds=[1621], tags={"e": [hex_id(1), hex_id(2)]})
    assert policy.values_cap_after([many], TOO_MANY, None) == 20
    assert policy.values_cap_after([few, many], TOO_MANY, None) == 20  # the words name the values
    assert policy.values_cap_after([many], "filter too large", None) == 20  # a lone filter: its values
    assert policy.values_cap_after([few, many], "filter too large", None) is None  # which? split by filter first
    assert policy.values_cap_after([many], TOO_MANY, 10) == 10  # built past the cap known: sliced to it
    assert policy.values_cap_after([few], TOO_MANY, 10) == 1
    assert policy.values_cap_after([Filter.make(ids=[hex_id(1)])], TOO_MANY, None) is None  # one value
    assert policy.values_cap_after([many], "error: too many filters", None) is None
    assert policy.values_cap_after([many], "blocked: no", None) is None


@pytest.mark.parametrize("text, longest, cap", [
    ("error: too many values in filter (max 20)", 40, 20),
    ("error: too many values in filter: 380 > 20", 380, 20),
    ("invalid: filter 3 has too many items, at most 50", 200, 50),  # (3: below the cap, not it)
    ("error: too many values in filter (max 50)", 40, None),  # not below what was refused: not the cap
    ("ERROR: bad req: total filter items too large (64 KB)", 5000, None),  # a size, not a count
    ("error: too many values in filter, try again in 10 s", 40, None),  # a time
    ("error: too many values in filter", 40, None),
    ("filter too large: max 20", 40, None),  # (not said to be about values: which part is not known)
    ("error: too many filters (max 20)", 40, None),
    ("error: too many values in filter (max 0)", 40, None),
])
def test_a_count_a_refusal_names_below_the_list_refused_is_the_cap(text, longest, cap):
    assert wire.values_allowed(text, longest) == cap


def test_the_cap_a_refusal_names_is_learnt_at_once_and_never_raises_one_known():
    many = Filter.make(tags={"a": [f"30617:{hex_id(i)}:r" for i in range(40)]})
    assert policy.values_cap_after([many], TOO_MANY + " (max 7)", None) == 7
    assert policy.values_cap_after([many], TOO_MANY + " (max 7)", 10) == 7  # lower than the one known
    assert policy.values_cap_after([many], TOO_MANY + " (max 17)", 10) == 10
    assert policy.values_cap_after([many], TOO_MANY + " (max 39)", None) == 39  # (refused again if wrong: halved)
    assert policy.values_cap_after([many], TOO_MANY + " (max 40)", None) == 20


value_lists = st.lists(st.integers(0, 60), unique=True, max_size=30).map(lambda xs: [hex_id(x) for x in xs])


@given(ids=value_lists, authors=value_lists, tag=value_lists, most=st.integers(1, 12))
def test_slices_hold_most_values_a_list_and_together_ask_what_the_filter_asked(ids, authors, tag, most):
    f = Filter.make(ids=ids or None, authors=authors or None, kinds=[1, 1621], tags={"e": tag} if tag else None,
                    since=5, until=90)
    pieces = filter_plan.within_values(f, most)
    assert all(p.most_values() <= most for p in pieces)
    assert all((p.kinds, p.since, p.until) == (f.kinds, f.since, f.until) for p in pieces)
    # (a filter is an AND of ORs: the pieces' combinations of values are exactly the filter's)
    combos = {(i, a, e) for p in pieces for i in (p.ids or [None]) for a in (p.authors or [None])
              for e in (p.tag("e") or [None])}
    assert combos == {(i, a, e) for i in (ids or [None]) for a in (authors or [None]) for e in (tag or [None])}
    assert len(combos) == sum(max(1, len(p.ids or ())) * max(1, len(p.authors or ())) * max(1, len(p.tag("e") or ()))
                              for p in pieces)  # no combination asked twice
    if f.most_values() <= most:
        assert pieces == [f]


def test_builders_and_merges_keep_within_the_cap():
    roots = [hex_id(i) for i in range(25)]
    addresses = [f"30617:{hex_id(i)}:repo-{i}" for i in range(7)]
    assert [len(c) for c in filter_plan.chunk_by_tag_bytes(roots, most=10)] == [10, 10, 5]
    assert [len(c) for c in filter_plan.chunk_by_tag_bytes(addresses, most=3)] == [3, 3, 1]
    assert len(filter_plan.chunk_by_tag_bytes(roots)) == 1  # (no cap: the byte budget alone)
    filters = filter_plan.build_sync_level_aware_filters(
        {a: filter_plan.SyncLevel.FULL for a in addresses}, roots, most=4)
    assert max(f.most_values() for f in filters) == 4
    assert {v for f in filters if f.tag("a") for v in f.tag("a")} == set(addresses)
    a, b = (Filter.make(tags={"e": roots[:3]}), Filter.make(tags={"e": roots[3:6]}))
    assert filter_plan.merge_tag_values(a, b, 1 << 20, most=6) is not None
    assert filter_plan.merge_tag_values(a, b, 1 << 20, most=5) is None


def test_a_page_sliced_keeps_the_page_it_was_on():
    f = Filter.make(tags={"e": [hex_id(i) for i in range(9)]})
    state = FilterPaginationState(original_filter=f, page_filter=f.replace(until=500), pages=3, full=True,
                                  boundary_ids={"x"})
    pieces = state.within_values(4)
    assert [len(p.page_filter.tag("e")) for p in pieces] == [4, 4, 1]
    assert all(p.page_filter.until == 500 and p.pages == 3 and p.full for p in pieces)
    assert all(p.original_filter.until is None and p.boundary_ids == {"x"} for p in pieces)
    assert state.within_values(9)[0].page_filter == state.page_filter


# -- the manager's decisions ---------------------------------------------------------------


def closed(sub_id, text):
    return parse_relay_message(json.dumps(["CLOSED", sub_id, text]))


def longest(req) -> int:
    return max(max([len(v) for k, v in flt.items() if isinstance(v, list) and k != "kinds"], default=0)
               for flt in req[2:])


def answer_as_a_capped_relay(h, cap: int, rounds: int = 12, words: str = TOO_MANY) -> list:
    """Run the relay as one refusing any REQ with a filter holding more than ``cap`` values
    in a list (in ``words``), ending every other historic page empty and keeping live ones:
    the REQs it refused."""
    refused, read = [], 0
    for _ in range(rounds):
        h.answer_own_reads()
        h.advance(1.1)  # the pacing gate
        frames = h.frames(A)
        for frame in frames[read:]:
            if frame[0] != "REQ":
                continue
            if longest(frame) > cap:
                refused.append(frame)
                h.relay_says(A, closed(frame[1], words))
            elif frame[1] not in h.state(A).current.live_subs:
                h.relay_says(A, wire.Eose(frame[1]))
        read = len(frames)
    return refused


def test_a_relay_capping_the_values_of_a_filter_is_asked_in_slices_from_its_first_refusal_on(tmp_path):
    """Its repositories' addresses came in one ``#a`` filter (and ``#A``, ``#q``, the
    states' ``#d``) of twelve values, refused for it: read as a shape's refusal, that shape
    was paused for a day and none of the twelve was synced there. Now the refusal teaches
    the cap: the refused REQ goes again in slices, every filter built after is within it,
    live subscriptions too, and the next session starts there."""
    h = ManagerHarness(tmp_path)
    owners = [Author.named(f"u{i}") for i in range(12)]
    h.own_relay_holds(*[announcement(owner, f"r{i}", relays=[A]) for i, owner in enumerate(owners)])
    h.connect(A)  # no NIP-11: nothing says the cap
    refused = answer_as_a_capped_relay(h, cap=5)
    assert refused, "nothing was refused: the test does not reach the cap"
    assert len(refused) <= 4, [longest(r) for r in refused]  # learnt once, not refused filter by filter
    assert h.state(A).max_values_learned <= 5
    assert not h.state(A).paused  # nothing paused: every repository is asked there
    asked = [flt for req in h.reqs(A) if req not in refused for flt in req[2:]]
    addresses = {f"30617:{owner.pubkey}:r{i}" for i, owner in enumerate(owners)}
    for tag in ("#a", "#A", "#q"):
        assert {v for flt in asked if flt.get("limit") != 0 for v in flt.get(tag, ())} == addresses, tag
        assert {v for flt in asked if flt.get("limit") == 0 for v in flt.get(tag, ())} == addresses, tag
    assert {v for flt in asked for v in flt.get("#d", ())} == {f"r{i}" for i in range(12)}

    state = h.state(A)
    h.feed(RelayDisconnected(A, state.session, "gone"))
    h.advance(60)
    h.tick()
    h.feed(HandshakeDone(A, state.attempt, ws=FakeWs()))
    assert answer_as_a_capped_relay(h, cap=5) == []  # the next session starts within it
    assert h.state(A).current.limits.max_values == h.state(A).max_values_learned


def test_a_relay_naming_its_values_cap_is_asked_within_it_after_one_refusal(tmp_path):
    """Halving finds a cap of 5 from twelve values at 3 (12, 6, 3), after two refusals, and
    slices every list a third smaller than it need be; a relay that names its cap is taken
    at its word."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(12)])
    h.connect(A)
    refused = answer_as_a_capped_relay(h, cap=5, words=TOO_MANY + " (max 5)")
    assert h.state(A).max_values_learned == 5
    assert len({longest(r) for r in refused}) == 1, [longest(r) for r in refused]  # refused at twelve alone
    assert max(longest(req) for req in h.reqs(A) if req not in refused) == 5
    assert not h.state(A).paused


def test_a_values_cap_is_judged_again_a_week_after_it_was_learnt(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(12)])
    h.connect(A)
    answer_as_a_capped_relay(h, cap=5)
    state = h.state(A)
    learnt = state.max_values_learned
    assert learnt is not None
    h.manager.lifecycle.start_day(state, h.clock.now + constants.LEARNT_CAP_SECS - 60)
    assert state.max_values_learned == learnt
    h.manager.lifecycle.start_day(state, h.clock.now + constants.LEARNT_CAP_SECS + 60)
    assert state.max_values_learned is None and state.values_learned_at is None
