"""The relay model reads a REQ written as gsync writes filters without decoding it
(``relay.plain_filters``): the filters must be those the decoded frame gives, and any other
text must go the decoding way."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol.filters import Filter
from gsync.sim.relay import _REQ_HEAD, SimRelay, filter_from_json, plain_filters

_hex = st.text("0123456789abcdef", min_size=64, max_size=64)
_tricky = st.text(alphabet='ab{}[],:"\\ \x01é', max_size=8)  # what could cut a filter in the wrong place
_filters = st.builds(
    Filter.make,
    ids=st.none() | st.lists(_hex, max_size=3),
    authors=st.none() | st.lists(_hex, max_size=2),
    kinds=st.none() | st.lists(st.integers(0, 65535), max_size=3),
    tags=st.dictionaries(st.sampled_from("aAeEqd"), st.lists(_tricky | _hex, max_size=3), max_size=3),
    since=st.none() | st.integers(0, 2**40),
    until=st.none() | st.integers(0, 2**40),
    limit=st.none() | st.integers(0, 1000),
)


def decoded(text: str):
    """What the decoding way reads: the filters, or None where it refuses the frame."""
    try:
        msg = json.loads(text)
        return [filter_from_json(f) for f in msg[2:]]
    except (ValueError, TypeError):
        return None


def fast(text: str):
    head = _REQ_HEAD.match(text)
    return None if head is None else plain_filters(text[head.end():])


def frame(filters: list[Filter], sub_id: str = "h1") -> str:
    return f'["REQ",{json.dumps(sub_id)},' + ",".join(f.to_json() for f in filters) + "]"


@settings(max_examples=100, deadline=None)
@given(st.lists(_filters, min_size=1, max_size=4))
def test_a_req_gsync_writes_is_read_as_its_filters(filters):
    text = frame(filters)
    got = fast(text)
    assert got is None or got == filters == decoded(text)
    plain = all(not set("{}[]\"\\") & set(v) for f in filters for _, values in f.tags for v in values)
    if plain:
        assert got == filters  # (the usual frame takes the quick way)


@settings(max_examples=200, deadline=None)
@given(st.lists(_filters, min_size=1, max_size=3), st.data())
def test_a_req_changed_anywhere_is_read_as_decoding_reads_it_or_left_to_decoding(filters, data):
    text = frame(filters)
    at = data.draw(st.integers(0, len(text)))
    cut = data.draw(st.integers(0, 3))
    insert = data.draw(st.text(alphabet='{}[],:"\\0123456789 -sinceuntilmt', max_size=4))
    changed = text[:at] + insert + text[at + cut:]
    got = fast(changed)
    if got is not None:
        assert got == decoded(changed)


@pytest.mark.parametrize("filters_text", [
    '{"#e":["a}"]}',  # a brace in a string
    '{"#e":["a]"],"since":1}',  # a bracket in a string
    '{"#e":["x\\"]"]}',  # an escaped quote before a bracket
    '{,"since":1}',
    '{"since":1,"#e":["x"]}',  # bounds first: JSON, not gsync's order
    '{"#e":["x"],"since":1,"since":2}',  # a bound twice: JSON keeps the last
    '{"#e":["x"],"since":01}',
    '{"#e":["x"],"since":-1}',
    '{"#e":["x"], "since":1}',
    '{"#e":["x"],"until":1,"since":2}',
    '{"#e":["x"]},',
    '{"#e":["x"]}{"#e":["y"]}',
    '{"#e":["x"],"search":["y"]}',
    '{"#ee":["x"]}',
    '{"kinds":[1.5]}',
    '{"kinds":[1],"since":"1"}',
    '{}',
    '{},{}',
    '{"limit":0}',
    '{"since":1,"until":2,"limit":3}',
    '{"ids":[]}',
    '{"#e":["x"]',
    '',
])
def test_odd_filters_are_read_as_decoding_reads_them(filters_text):
    text = '["REQ","s",' + filters_text + "]"
    got = fast(text)
    assert got is None or got == decoded(text)
    relay, decoding = SimRelay("wss://a"), SimRelay("wss://a")
    relay.open_session(1)
    decoding.open_session(1)
    # (the same answer as a frame that only the decoding way reads: a space after its verb)
    assert relay.handle(1, text) == decoding.handle(1, text.replace('["REQ",', '["REQ", ', 1))
