"""NIP-01 filter matching, the JSON form and the tag-value budget measure."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol.event import Event
from gsync.protocol.filters import Filter, FilterSet
from gsync.sim.relay import filter_from_json
from tests import factory as f

ALICE, BOB = "a" * 64, "b" * 64
REPO = f"30617:{ALICE}:gsync"


def make_event(*, id="1" * 64, pubkey=ALICE, created_at=1000, kind=1621, tags=(("a", REPO),)) -> Event:
    # Matching never looks at the signature, so these events need not be signed.
    return Event(id, pubkey, created_at, kind, tuple(tuple(t) for t in tags), "", "0" * 128)


ISSUE = make_event()

MATCHING = [
    # (description, filter, matches ISSUE?)
    ("empty filter matches everything", Filter.make(), True),
    ("id listed", Filter.make(ids=["1" * 64, "2" * 64]), True),
    ("id not listed", Filter.make(ids=["2" * 64]), False),
    ("no ids at all", Filter.make(ids=[]), False),
    ("author listed", Filter.make(authors=[BOB, ALICE]), True),
    ("author not listed", Filter.make(authors=[BOB]), False),
    ("kind listed", Filter.make(kinds=[1617, 1621]), True),
    ("kind not listed", Filter.make(kinds=[1617]), False),
    ("#a value listed", Filter.make(tags={"a": [REPO]}), True),
    ("#a value not listed", Filter.make(tags={"a": [f"30617:{BOB}:gsync"]}), False),
    ("tag name differs by case", Filter.make(tags={"A": [REPO]}), False),
    ("tag absent", Filter.make(tags={"e": ["1" * 64]}), False),
    ("every tag filter must match", Filter.make(tags={"a": [REPO], "e": ["1" * 64]}), False),
    ("since equal is inclusive", Filter.make(since=1000), True),
    ("since after", Filter.make(since=1001), False),
    ("until equal is inclusive", Filter.make(until=1000), True),
    ("until before", Filter.make(until=999), False),
    ("since == until == created_at", Filter.make(since=1000, until=1000), True),
    ("limit does not matter", Filter.make(kinds=[1621], limit=0), True),
    ("limit 1 still matches", Filter.make(limit=1), True),
    ("all fields together", Filter.make(ids=["1" * 64], authors=[ALICE], kinds=[1621],
                                        tags={"a": [REPO]}, since=1, until=2000, limit=5), True),
    ("one field fails among many", Filter.make(authors=[ALICE], kinds=[1621], until=10), False),
]


@pytest.mark.parametrize("flt, expected", [c[1:] for c in MATCHING], ids=[c[0] for c in MATCHING])
def test_matching_table(flt, expected):
    assert flt.matches(ISSUE) is expected


@pytest.mark.parametrize(
    "tags, expected",
    [
        ((("a", "x"), ("a", REPO)), True),  # any of several same-named tags
        ((("a",),), False),  # a tag without a value matches no value
        ((("a", "x", REPO),), False),  # only the first value counts
        ((("d", REPO),), False),
        ((), False),
    ],
)
def test_tag_matching_uses_the_first_value_of_any_tag_of_that_name(tags, expected):
    assert Filter.make(tags={"a": [REPO]}).matches(make_event(tags=tags)) is expected


def matches_any(filters, event) -> bool:
    return any(f.matches(event) for f in filters)


# -- JSON form ----------------------------------------------------------------------------------


def filter_dict(flt: Filter) -> dict:
    """The oracle of a filter's JSON object: values sorted, unset fields left out."""
    out: dict = {}
    if flt.ids is not None:
        out["ids"] = sorted(flt.ids)
    if flt.authors is not None:
        out["authors"] = sorted(flt.authors)
    if flt.kinds is not None:
        out["kinds"] = sorted(flt.kinds)
    for name, values in flt.tags:
        out["#" + name] = sorted(values)
    for bound in ("since", "until", "limit"):
        if getattr(flt, bound) is not None:
            out[bound] = getattr(flt, bound)
    return out


def test_the_json_object_is_sorted_and_omits_unset_fields():
    flt = Filter.make(kinds=[1621, 1617], authors=[BOB, ALICE], tags={"e": ["2", "1"], "a": [REPO]},
                      since=5, limit=0)
    assert filter_dict(flt) == {
        "authors": [ALICE, BOB],
        "kinds": [1617, 1621],
        "#a": [REPO],
        "#e": ["1", "2"],
        "since": 5,
        "limit": 0,
    }
    assert filter_dict(Filter.make()) == {}
    assert json.loads(flt.to_json()) == filter_dict(flt)
    assert " " not in flt.to_json()


def test_equal_filters_serialise_equally_whatever_the_input_order():
    one = Filter.make(kinds=[1, 2], tags={"a": ["x"], "e": ["y", "z"]})
    two = Filter.make(tags={"e": ["z", "y"], "a": ["x"]}, kinds=[2, 1, 1])
    assert one == two and hash(one) == hash(two) and one.to_json() == two.to_json()


_hex = st.text("0123456789abcdef", min_size=64, max_size=64)
_filters = st.builds(
    Filter.make,
    ids=st.none() | st.lists(_hex, max_size=3),
    authors=st.none() | st.lists(_hex, max_size=3),
    kinds=st.none() | st.lists(st.integers(0, 65535), max_size=3),
    tags=st.dictionaries(st.sampled_from("aAeEqdpt"), st.lists(st.text(max_size=10), max_size=3), max_size=3),
    since=st.none() | st.integers(0, 2**40),
    until=st.none() | st.integers(0, 2**40),
    limit=st.none() | st.integers(0, 1000),
)


@settings(max_examples=200, deadline=None)
@given(_filters)
def test_a_relay_parses_back_what_a_filter_sends(flt):
    assert filter_from_json(filter_dict(flt)) == flt
    assert filter_from_json(json.loads(flt.to_json())) == flt


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {"kinds": [True]},
        {"kinds": ["1"]},
        {"kinds": 1},
        {"ids": "abc"},
        {"authors": [1]},
        {"#a": "x"},
        {"#a": [1]},
        {"since": -1},
        {"until": 1.5},
        {"limit": True},
        {"#ab": ["x"]},
        {"search": "x"},
    ],
    ids=repr,
)
def test_the_relay_side_parser_refuses_what_a_relay_would_refuse(obj):
    with pytest.raises(ValueError):
        filter_from_json(obj)


def test_replace_derives_pages_and_live_forms():
    historic = Filter.make(kinds=[1621], tags={"a": [REPO]})
    assert filter_dict(historic.replace(until=900))["until"] == 900
    assert filter_dict(historic.replace(limit=0))["limit"] == 0
    assert filter_dict(historic).keys() == {"kinds", "#a"}


# -- sizes --------------------------------------------------------------------------------------


def test_tag_value_bytes_counts_utf8_bytes_plus_quotes_and_comma():
    assert Filter.make(kinds=[1]).tag_value_bytes() == 0
    assert Filter.make(tags={"e": ["1" * 64]}).tag_value_bytes() == 67
    assert Filter.make(tags={"e": ["1" * 64, "2" * 64], "a": [REPO]}).tag_value_bytes() == 67 * 2 + len(REPO) + 3
    assert Filter.make(tags={"t": ["漢"]}).tag_value_bytes() == 3 + 3
    # Escapes count: d identifiers come from untrusted announcements.
    assert Filter.make(tags={"d": ['a"\x01']}).tag_value_bytes() == len('"a\\"\\u0001"') + 1
    # ids and authors are not tag values: the 32 KB budget is about #-filters only.
    assert Filter.make(ids=["1" * 64], tags={"t": ["x"]}).tag_value_bytes() == 4


def test_tag_value_bytes_bounds_the_serialised_values():
    values = [f"{n:064x}" for n in range(489)]
    flt = Filter.make(tags={"e": values})
    serialised_values = len(json.dumps(sorted(values), separators=(",", ":")))
    assert flt.tag_value_bytes() == serialised_values - 1  # brackets instead of a last comma
    assert flt.tag_value_bytes() <= 32 * 1024  # about 489 hex ids fit the budget (SPEC §3)


def test_serialized_size_is_the_utf8_length_of_the_json():
    flt = Filter.make(tags={"t": ["漢字"]}, kinds=[1])
    assert flt.serialized_size() == len(flt.to_json().encode("utf-8"))


# -- the sync layers (SPEC §3) against NIP-34 events from the test factory ------------------------


def test_nip34_events_match_the_layer_filters_that_should_find_them():
    alice, bob = f.Author.named("alice"), f.Author.named("bob")
    repo = f.announcement(alice, "gsync", clone=["https://relay.example.com/alice/gsync.git"],
                          relays=["wss://relay.example.com"])
    addr = f.repo_addr(alice, "gsync")
    bug = f.issue(bob, repo)
    root_patch = f.patch(bob, addr)
    pull = f.pr(bob, repo)
    layer1 = Filter.make(kinds=[30617, 10317])
    state = Filter.make(kinds=[30618], tags={"d": ["gsync"]})
    layer2 = [Filter.make(tags={name: [addr]}) for name in ("a", "A", "q")]
    layer3 = [Filter.make(tags={name: [bug.id, root_patch.id, pull.id]}) for name in ("e", "E", "q")]

    assert repo.address == addr and layer1.matches(repo)
    assert state.matches(f.state(alice, "gsync"))
    for root in (bug, root_patch, pull):
        assert matches_any(layer2, root) and not matches_any(layer3, root)
    assert matches_any(layer2, f.comment(bob, repo))  # NIP-22 on the repository itself: #A
    assert matches_any(layer2, f.quote(bob, repo))
    for reply in (
        f.patch(bob, addr, reply_to=root_patch),
        f.pr_update(bob, pull),
        f.comment(alice, bug),
        f.status(alice, bug, f.KIND_STATUS_CLOSED),
        f.quote(alice, pull),
    ):
        assert matches_any(layer3, reply), reply.kind
    # A reply to a comment is a direct-member descendant: found by the root (E), not the parent.
    top = f.comment(alice, bug)
    nested = f.comment(bob, bug, top)
    assert Filter.make(tags={"E": [bug.id]}).matches(nested)
    assert Filter.make(tags={"e": [top.id]}).matches(nested)


# -- FilterSet: the indexed form of one subscription's filters ---------------------------

_small_ids = st.sampled_from(["1" * 64, "2" * 64, "3" * 64])
_small_values = st.sampled_from(["x", "y", "z", REPO])
_set_filters = st.builds(
    Filter.make,
    ids=st.none() | st.lists(_small_ids, max_size=2),
    authors=st.none() | st.lists(st.sampled_from([ALICE, BOB]), max_size=2),
    kinds=st.none() | st.lists(st.sampled_from([1, 1621, 1111]), max_size=2),
    tags=st.dictionaries(st.sampled_from("aeEq"), st.lists(_small_values, max_size=3), max_size=2),
    since=st.none() | st.integers(990, 1010),
    until=st.none() | st.integers(990, 1010),
)
_set_events = st.builds(
    lambda id_, pubkey, created_at, kind, tags: make_event(
        id=id_, pubkey=pubkey, created_at=created_at, kind=kind, tags=tags),
    _small_ids, st.sampled_from([ALICE, BOB]), st.integers(990, 1010),
    st.sampled_from([1, 1621, 1111]),
    st.lists(st.tuples(st.sampled_from("aeEqp"), _small_values), max_size=4),
)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.lists(_set_filters, max_size=10), _set_events)
def test_filter_set_matches_exactly_like_each_filter(filters, event):
    expected = tuple(i for i, flt in enumerate(filters) if flt.matches(event))
    assert FilterSet(filters).matching(event) == expected


def test_filter_set_checks_only_candidate_filters():
    # kinds make each filter more than its index can decide, so a candidate is checked
    filters = [Filter.make(kinds=[1], tags={"E": [f"{i:064x}" for i in range(k * 10, k * 10 + 10)]})
               for k in range(10)]
    event = make_event(kind=1, tags=(("E", f"{42:064x}"),))
    checked = []

    class Counting(Filter):
        def matches(self, e):
            checked.append(self)
            return super().matches(e)

    counting = [Counting(*(getattr(f, fl.name) for fl in dataclasses.fields(Filter) if fl.init))
                for f in filters]
    assert FilterSet(counting).matching(event) == (4,)
    assert checked == [counting[4]]


def test_filter_set_decides_single_tag_filters_from_its_index():
    one_tag = Filter.make(tags={"e": ["1" * 64]}, since=995, until=1005)
    filters = FilterSet([one_tag, Filter.make(ids=["2" * 64], until=1000)])
    assert filters.matching(make_event(id="2" * 64, created_at=1000, tags=(("e", "1" * 64),))) == (0, 1)
    assert filters.matching(make_event(id="2" * 64, created_at=1001, tags=(("e", "1" * 64),))) == (0,)
    assert filters.matching(make_event(created_at=995, tags=(("e", "1" * 64),))) == (0,)
    assert filters.matching(make_event(created_at=1005, tags=(("e", "1" * 64),))) == (0,)
    assert filters.matching(make_event(created_at=1006, tags=(("e", "1" * 64),))) == ()
    assert filters.matching(make_event(created_at=994, tags=(("e", "1" * 64), ("e", "2" * 64)))) == ()
    assert filters.matching(make_event(created_at=1000, tags=(("E", "1" * 64),))) == ()


def test_a_replaced_filter_is_encoded_afresh():
    first = Filter.make(kinds=[1], tags={"e": ["1" * 64]})
    assert first.to_json() == '{"kinds":[1],"#e":["' + "1" * 64 + '"]}'
    page = first.replace(until=5)
    assert json.loads(page.to_json()) == {"kinds": [1], "#e": ["1" * 64], "until": 5}
    assert page != first and first.replace(until=None) == first


@given(st.text(max_size=40))
def test_json_size_is_the_size_of_the_json_string(value):
    from gsync.protocol.filters import json_size

    assert json_size(value) == len(json.dumps(value, ensure_ascii=False).encode())


_values = st.lists(st.text(max_size=6), max_size=3)
_bound = st.one_of(st.none(), st.integers(0, 2**63 - 1))


@given(
    ids=st.one_of(st.none(), st.lists(st.sampled_from(["1" * 64, "2" * 64]), max_size=2)),
    kinds=st.one_of(st.none(), st.lists(st.integers(0, 65535), max_size=3)),
    tags=st.dictionaries(st.sampled_from(["e", "E", "q", '"', "\\", "é"]), _values, max_size=2),
    bounds=st.tuples(_bound, _bound, _bound),
    new_bounds=st.tuples(_bound, _bound, _bound),
)
def test_the_json_of_a_filter_and_of_the_pages_derived_from_it_is_json_dumps(ids, kinds, tags, bounds, new_bounds):
    # The selectors' JSON is made once and shared by the filters replace derives by
    # since/until/limit; the result must be exactly the JSON of the oracle (filter_dict) either way.
    def dumped(flt):
        return json.dumps(filter_dict(flt), ensure_ascii=False, separators=(",", ":"))

    since, until, limit = bounds
    flt = Filter.make(ids=ids, kinds=kinds, tags=tags, since=since, until=until, limit=limit)
    assert flt.to_json() == dumped(flt)
    assert flt.serialized_size() == len(dumped(flt).encode())
    since, until, limit = new_bounds
    page = flt.replace(since=since, until=until, limit=limit)
    assert page.to_json() == dumped(page) and page.serialized_size() == len(dumped(page).encode())
    narrower = page.replace(kinds=[7])  # other selectors: encoded afresh
    assert narrower.to_json() == dumped(narrower)
    page.drop_json()
    assert page.to_json() == dumped(page)


@given(
    values=st.lists(st.one_of(st.text(max_size=6), st.sampled_from(["1" * 64, "30617:" + "a" * 64 + ":r"])),
                    max_size=4),
    others=st.lists(st.text(max_size=6), max_size=3),
    authors=st.one_of(st.none(), st.lists(st.text(max_size=6), max_size=3)),
)
def test_filters_sharing_their_values_encode_them_as_json_dumps(values, others, authors):
    # Layers 2 and 3 ask one frozenset under three tags (its JSON made once for them); a
    # filter of other values between them, or none at all, encodes as json.dumps all the same.
    def dumped(flt):
        return json.dumps(filter_dict(flt), ensure_ascii=False, separators=(",", ":"))

    shared = frozenset(values)
    filters = [Filter.make(authors=authors, tags={name: shared}, limit=0) for name in ("e", "E")]
    filters += [Filter.make(tags={"q": others}), Filter.make(kinds=[1], tags={"q": shared}), Filter.make(tags={"e": []})]
    assert [flt.to_json() for flt in filters] == [dumped(flt) for flt in filters]


@given(st.text(max_size=12) | st.sampled_from(["", " ", "~", "\x7f", "\x1f", '"', "\\", "é", "a" * 64]))
def test_is_plain_means_printable_ascii_that_json_does_not_escape(text):
    from gsync.protocol.filters import is_plain

    definition = text.isascii() and text.isprintable() and '"' not in text and "\\" not in text
    assert is_plain(text) is definition
    if definition:
        assert json.dumps(text, ensure_ascii=False) == '"' + text + '"'
