"""Relay→client parsing (every type, every prefix, junk of every shape) and client→relay builders."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gsync.constants import MAX_MESSAGE_BYTES
from gsync.protocol import messages as m
from gsync.protocol.event import sign_event
from gsync.protocol.filters import Filter
from gsync.protocol.messages import (
    AuthChallenge,
    Closed,
    Count,
    Eose,
    Malformed,
    NegErr,
    NegMsg,
    Notice,
    Ok,
    Prefix,
    RelayEvent,
    is_negentropy_notice,
    is_rate_limit_text,
    parse_relay_message,
    split_prefix,
)

EID = "e" * 64
RAW_EVENT = {"id": EID, "kind": 1, "whatever": ["not", "checked", "here"]}

PARSED = [
    (["EVENT", "sub1", RAW_EVENT], RelayEvent("sub1", RAW_EVENT)),
    (["OK", EID, True, ""], Ok(EID, True, Prefix.NONE, "")),
    (["OK", EID, True, "duplicate: already have it"], Ok(EID, True, Prefix.DUPLICATE, "already have it")),
    (["OK", EID, True, "purgatory: waiting for git data"], Ok(EID, True, Prefix.PURGATORY, "waiting for git data")),
    (["OK", EID, False, "rate-limited: slow down"], Ok(EID, False, Prefix.RATE_LIMITED, "slow down")),
    (["OK", EID, False, "blocked: not on the list"], Ok(EID, False, Prefix.BLOCKED, "not on the list")),
    (["OK", EID, True], Ok(EID, True, Prefix.NONE, "")),  # older relays leave the message out
    (["EOSE", "sub1"], Eose("sub1")),
    (["CLOSED", "sub1", "auth-required: you must auth"], Closed("sub1", Prefix.AUTH_REQUIRED, "you must auth")),
    (["CLOSED", "sub1", "rate-limited: too many REQs"], Closed("sub1", Prefix.RATE_LIMITED, "too many REQs")),
    (["CLOSED", "sub1"], Closed("sub1", Prefix.NONE, "")),
    (["NOTICE", "hello"], Notice("hello")),
    (["NOTICE", ""], Notice("")),
    (["NOTICE", "sub-1", "blocked: not here"], Notice("blocked: not here", "sub-1")),  # (NIP-01 in 2023)
    (["AUTH", "challenge-123"], AuthChallenge("challenge-123")),
    (["NEG-MSG", "neg1", "61"], NegMsg("neg1", "61")),
    (["NEG-MSG", "neg1", "61AB00"], NegMsg("neg1", "61ab00")),
    (["NEG-ERR", "neg1", "error: invalid negentropy message"], NegErr("neg1", Prefix.ERROR, "invalid negentropy message")),
    (["NEG-ERR", "neg1", "closed: timeout"], NegErr("neg1", Prefix.CLOSED, "timeout")),
    (["NEG-ERR", "neg1", "parse failed"], NegErr("neg1", Prefix.NONE, "parse failed")),
    (["NEG-ERR", "neg1"], NegErr("neg1", Prefix.NONE, "")),
    # strfry past its maxSyncEvents adds the cap
    (["NEG-ERR", "neg1", "blocked: too many query results", 1000000],
     NegErr("neg1", Prefix.BLOCKED, "too many query results", 1000000)),
    (["NEG-ERR", "neg1", "blocked: too many query results", "lots"],
     NegErr("neg1", Prefix.BLOCKED, "too many query results", None)),
    (["COUNT", "c1", {"count": 42}], Count("c1", 42, False)),
    (["COUNT", "c1", {"count": 0, "approximate": True}], Count("c1", 0, True)),
    (["NOTICE", "漢字 😀 \u2028 \x00"], Notice("漢字 😀 \u2028 \x00")),
]


@pytest.mark.parametrize("items, expected", PARSED, ids=[json.dumps(p[0])[:50] for p in PARSED])
def test_parses_every_message_type(items, expected):
    text = json.dumps(items, ensure_ascii=False)
    assert parse_relay_message(text) == expected
    assert parse_relay_message(text.encode("utf-8")) == expected
    assert parse_relay_message(json.dumps(items, ensure_ascii=True, indent=2)) == expected


MALFORMED = [
    ("not json", "bad_json"),
    ("", "bad_json"),
    ("[", "bad_json"),
    ('["NOTICE", NaN]', "bad_json"),
    ('["NOTICE", Infinity]', "bad_json"),
    ("[" * 100_000 + "]" * 100_000, "bad_json"),  # deeper than the recursion limit
    ('{"type": "EVENT"}', "not_array"),
    ("[]", "not_array"),
    ('"EVENT"', "not_array"),
    ("null", "not_array"),
    ('["PING"]', "unknown_type"),
    ('["event", "s", {}]', "unknown_type"),  # types are case-sensitive
    ('[1, "s"]', "unknown_type"),
    ('[["EVENT"], "s"]', "unknown_type"),
    ('["EVENT", "s"]', "bad_shape"),
    ('["EVENT", "s", [], 1]', "bad_shape"),
    ('["EVENT", "s", "{}"]', "bad_shape"),
    ('["EVENT", 1, {}]', "bad_shape"),
    ('["OK", "' + "E" * 64 + '", true, ""]', "bad_shape"),
    ('["OK", "abc", true, ""]', "bad_shape"),
    ('["OK", "' + EID + '", "true", ""]', "bad_shape"),
    ('["OK", "' + EID + '", 1, ""]', "bad_shape"),
    ('["OK", "' + EID + '", true, null]', "bad_shape"),
    ('["OK", "' + EID + '"]', "bad_shape"),
    ('["EOSE"]', "bad_shape"),
    ('["EOSE", null]', "bad_shape"),
    ('["EOSE", "s", "extra"]', "bad_shape"),
    ('["CLOSED", "s", 5]', "bad_shape"),
    ('["NOTICE"]', "bad_shape"),
    ('["NOTICE", {"text": "x"}]', "bad_shape"),
    ('["NOTICE", 5, "x"]', "bad_shape"),
    ('["NOTICE", "s", "x", "y"]', "bad_shape"),
    ('["AUTH", 5]', "bad_shape"),
    ('["NEG-MSG", "s", ""]', "bad_shape"),
    ('["NEG-MSG", "s", "abc"]', "bad_shape"),
    ('["NEG-MSG", "s", "zz"]', "bad_shape"),
    ('["NEG-MSG", "s", "61 ab"]', "bad_shape"),  # bytes.fromhex would skip the space
    ('["NEG-MSG", "s", " 61ab"]', "bad_shape"),
    ('["NEG-MSG", "s", "61\\n"]', "bad_shape"),
    ('["NEG-MSG", "s", "\u0661\u0662"]', "bad_shape"),  # Arabic-Indic digits are not hex
    ('["NEG-MSG", "s", 61]', "bad_shape"),
    ('["NEG-ERR", 5, "error: x"]', "bad_shape"),
    ('["COUNT", "c", {"count": -1}]', "bad_shape"),
    ('["COUNT", "c", {"count": true}]', "bad_shape"),
    ('["COUNT", "c", {}]', "bad_shape"),
    ('["COUNT", "c", 5]', "bad_shape"),
    ('["NOTICE", "\\ud800"]', "bad_encoding"),  # lone surrogate: valid JSON, not valid text
    ('["CLOSED", "s\\udc00", "x"]', "bad_encoding"),
]


@pytest.mark.parametrize("text, reason", MALFORMED, ids=[t[:40] for t, _ in MALFORMED])
def test_junk_is_malformed_with_a_reason(text, reason):
    result = parse_relay_message(text)
    assert isinstance(result, Malformed)
    assert result.reason == reason
    assert result.reason in Malformed.REASONS


@pytest.mark.parametrize("frame", [b"\xff\xfe", b'["NOTICE", "\xc3"]', b'["NOTICE", "\xed\xa0\x80"]'])
def test_bytes_that_are_not_utf8_are_bad_encoding(frame):
    assert parse_relay_message(frame) == Malformed("bad_encoding", "frame is not UTF-8")


def test_utf16_bytes_are_not_sniffed_into_text():
    frame = json.dumps(["NOTICE", "hi"]).encode("utf-16")
    assert parse_relay_message(frame).reason == "bad_encoding"


def test_oversize_frames_are_refused_before_decoding():
    padding = MAX_MESSAGE_BYTES - len('["NOTICE",""]')
    fits = json.dumps(["NOTICE", "x" * padding], separators=(",", ":"))
    assert parse_relay_message(fits) == Notice("x" * padding)
    assert parse_relay_message(fits.encode()) == Notice("x" * padding)
    too_big = json.dumps(["NOTICE", "x" * (padding + 1)], separators=(",", ":"))
    assert parse_relay_message(too_big).reason == "too_large"
    assert parse_relay_message(too_big.encode()).reason == "too_large"


def test_oversize_counts_utf8_bytes_not_characters():
    text = json.dumps(["NOTICE", "漢" * (MAX_MESSAGE_BYTES // 3)], ensure_ascii=False)
    assert len(text) < MAX_MESSAGE_BYTES < len(text.encode())
    assert parse_relay_message(text).reason == "too_large"


def test_event_payload_is_passed_on_unverified():
    """Checking the event is the caller's job: it knows the subscription's filters."""
    junk_event = {"id": "not even hex", "sig": 5}
    assert parse_relay_message(json.dumps(["EVENT", "s", junk_event])) == RelayEvent("s", junk_event)


# -- prefixes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefix",
    [p for p in Prefix if p not in (Prefix.OTHER, Prefix.NONE)],
    ids=lambda p: p.value,
)
def test_every_known_prefix_is_recognised(prefix):
    assert split_prefix(f"{prefix.value}: the details") == (prefix, "the details")
    assert split_prefix(f"{prefix.value}:") == (prefix, "")
    assert split_prefix(f"{prefix.value.upper()}:no space") == (prefix, "no space")
    closed = parse_relay_message(json.dumps(["CLOSED", "s", f"{prefix.value}: why"]))
    assert closed == Closed("s", prefix, "why")
    ok = parse_relay_message(json.dumps(["OK", EID, False, f"{prefix.value}: why"]))
    assert ok == Ok(EID, False, prefix, "why")


@pytest.mark.parametrize(
    "message, expected",
    [
        ("", (Prefix.NONE, "")),
        ("just text", (Prefix.NONE, "just text")),
        ("spam-filter: nope", (Prefix.OTHER, "spam-filter: nope")),
        ("wss://relay.example.com is down", (Prefix.OTHER, "wss://relay.example.com is down")),
        ("Error while parsing the filter: bad", (Prefix.NONE, "Error while parsing the filter: bad")),
        ("  blocked:  spaced out  ", (Prefix.BLOCKED, "spaced out")),
        ("error: a: b: c", (Prefix.ERROR, "a: b: c")),
        ("invalid: line one\nline two", (Prefix.INVALID, "line one\nline two")),
        (":no word", (Prefix.NONE, ":no word")),
        ("rate_limited: underscore", (Prefix.OTHER, "rate_limited: underscore")),
    ],
)
def test_split_prefix_edge_cases(message, expected):
    assert split_prefix(message) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("rate-limited: slow down", True),
        ("RATE-LIMITED: x", True),
        ("You are being rate limited", True),
        ("too many REQs", True),
        ("Too Many Requests", True),
        ("please slow down", True),
        ("throttled", True),
        ("Throttling in effect", True),
        ("blocked: spam", False),
        ("error: invalid negentropy message", False),
        ("", False),
        ("ERROR: bad req: too many filters", False),  # the REQ's shape, not a rate
        ("too many tags", False),
        ("rate-limited: too many filters", True),
        ("slow down: too many filters at once", True),
    ],
)
def test_is_rate_limit_text(text, expected):
    assert is_rate_limit_text(text) is expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("too many concurrent REQs", True),  # strfry
        ("too many REQs", True),  # LocalRelay's max_reqs, after its rate-limited: prefix
        ("Maximum concurrent subscription count reached", True),
        ("too many subscriptions", True),
        ("max subscriptions reached", True),
        ("too many open subscriptions on this connection", True),
        ("active subscriptions exceed max size 1048576 bytes", False),  # a size: CAPACITY
        ("too many filters", False),  # one REQ's shape
        ("bad req: too many filters in REQ", False),
        ("too many requests", False),  # a rate
        ("too many queries", False),
        ("error: limit must be <= 500 in a subscription", False),
        ("subscription closed by the relay", False),
        ("", False),
    ],
)
def test_says_too_many_subscriptions(text, expected):
    assert m.says_too_many_subscriptions(text) is expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("unknown message type NEG-OPEN", True),
        ('ERROR: bad msg: unknown cmd "NEG-OPEN"', True),
        ("negentropy disabled", True),
        ("Negentropy: not supported", True),
        ("NEG_OPEN unsupported", True),
        ("could not parse command: NEG", True),
        ("negative numbers not allowed", False),
        ("connection is being renegotiated", False),
        ("slow down", False),
    ],
)
def test_is_negentropy_notice(text, expected):
    assert is_negentropy_notice(text) is expected


# -- builders -----------------------------------------------------------------------------------


def test_builders_write_compact_json():
    flt = Filter.make(kinds=[30617, 1621], tags={"a": ["30617:ab:漢"]})
    assert m.req("s1", [flt]) == '["REQ","s1",{"kinds":[1621,30617],"#a":["30617:ab:漢"]}]'
    assert m.req("s1", [flt, Filter.make(ids=[EID])]) == (
        '["REQ","s1",{"kinds":[1621,30617],"#a":["30617:ab:漢"]},{"ids":["' + EID + '"]}]'
    )
    assert m.close("s1") == '["CLOSE","s1"]'
    assert m.neg_open("n1", flt, "6100") == '["NEG-OPEN","n1",{"kinds":[1621,30617],"#a":["30617:ab:漢"]},"6100"]'
    assert m.neg_msg("n1", "61ab") == '["NEG-MSG","n1","61ab"]'
    assert m.neg_close("n1") == '["NEG-CLOSE","n1"]'


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=20),
    st.lists(st.builds(
        Filter.make,
        kinds=st.none() | st.lists(st.integers(0, 40000), max_size=3),
        tags=st.dictionaries(st.sampled_from("adeEq"), st.lists(st.text(max_size=8), max_size=3), max_size=2),
        until=st.none() | st.integers(0, 2**40),
    ), min_size=1, max_size=4),
)
def test_req_is_the_json_array_of_its_parts(sub_id, filters):
    for flt in filters[:1]:
        flt.to_json()  # a filter encoded earlier (cached) reads the same
    expected = json.dumps(["REQ", sub_id, *(json.loads(f.to_json()) for f in filters)],
                          ensure_ascii=False, separators=(",", ":"))
    assert m.req(sub_id, filters) == expected
    assert json.loads(m.neg_open(sub_id, filters[0], "61")) == ["NEG-OPEN", sub_id, json.loads(filters[0].to_json()), "61"]


@given(st.text(max_size=12) | st.sampled_from(["live-12", "h3-4", 'a"b', "\\", "\x7f", "\n"]),
       st.text(alphabet="0123456789abcdef", max_size=40) | st.text(max_size=4))
def test_close_and_negentropy_frames_are_json_dumps(sub_id, message):
    def dumped(*parts):
        return json.dumps(list(parts), ensure_ascii=False, separators=(",", ":"))

    assert m.close(sub_id) == dumped("CLOSE", sub_id)
    assert m.neg_msg(sub_id, message) == dumped("NEG-MSG", sub_id, message)
    assert m.neg_close(sub_id) == dumped("NEG-CLOSE", sub_id)
    flt = Filter.make(kinds=[1])
    assert m.neg_open(sub_id, flt, message) == dumped("NEG-OPEN", sub_id, {"kinds": [1]}, message)
    assert m.req_size(sub_id, [flt]) == len(m.req(sub_id, [flt]).encode())


def test_req_needs_a_filter():
    with pytest.raises(ValueError):
        m.req("s1", [])


def test_event_and_auth_carry_the_event_unchanged():
    ev = sign_event("01" * 32, created_at=1, kind=22242,
                    tags=[["relay", "ws://127.0.0.1:7777"], ["challenge", "c"]], content="漢\n")
    assert m.event(ev) == '["EVENT",' + ev.to_json() + "]"
    assert m.auth(ev) == '["AUTH",' + ev.to_json() + "]"
    assert json.loads(m.event(ev))[1] == ev.to_dict()


# -- fuzz: never raises -------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)
_message_type = st.sampled_from(
    ["EVENT", "OK", "EOSE", "CLOSED", "NOTICE", "AUTH", "NEG-MSG", "NEG-ERR", "COUNT", "REQ", ""]
)
_message_like = st.tuples(_message_type, st.lists(_json_values | st.just(EID), max_size=4)).map(
    lambda t: [t[0], *t[1]]
)


def _assert_total(frame) -> None:
    result = parse_relay_message(frame)
    if isinstance(result, Malformed):
        assert result.reason in Malformed.REASONS
    else:
        assert type(result) in (RelayEvent, Ok, Eose, Closed, Notice, AuthChallenge, NegMsg, NegErr, Count)


@FUZZ
@given(st.text() | st.text(st.characters(exclude_categories=())))  # the second has surrogates
def test_fuzz_arbitrary_text(text):
    _assert_total(text)


@FUZZ
@given(st.binary())
def test_fuzz_arbitrary_bytes(data):
    _assert_total(data)


@pytest.mark.slow
@FUZZ
@given(_json_values)
def test_fuzz_arbitrary_json(value):
    _assert_total(json.dumps(value))


@pytest.mark.slow
@FUZZ
@given(_message_like)
def test_fuzz_message_shaped_json(items):
    text = json.dumps(items)
    _assert_total(text)
    _assert_total(text.encode())


@FUZZ
@given(st.text(alphabet=st.characters(exclude_categories=()) | st.sampled_from('[]{}",:\\')))
def test_fuzz_json_punctuation_soup(text):
    _assert_total(text)


# -- the plain OK shortcut agrees with the full parser ----------------------------------

_ok_ids = st.text("0123456789abcdefABCDEF", min_size=63, max_size=65)
_ok_texts = st.sampled_from(['""', '"duplicate: have it"', '"x"', "null", '""'])
_ok_flags = st.sampled_from(["true", "false", "1", '"true"'])


@settings(max_examples=300, deadline=None)
@given(_ok_ids, _ok_flags, _ok_texts, st.booleans())
def test_plain_ok_shortcut_gives_what_the_full_parser_gives(event_id, flag, text, as_bytes):
    frame = f'["OK","{event_id}",{flag},{text}]'
    full = m.parse_relay_message(" " + frame)  # leading space: JSON, never the shortcut
    fast = m.parse_relay_message(frame.encode() if as_bytes else frame)
    assert fast == full


def test_plain_ok_shortcut_takes_the_common_answer():
    frame = f'["OK","{EID}",true,""]'
    assert m._plain_ok(frame) == m.Ok(EID, True, m.Prefix.NONE, "")
    assert m._plain_ok(frame.encode()) == m.Ok(EID, True, m.Prefix.NONE, "")
    assert m._plain_ok(frame.replace("true", "false")[:-1] + "]") is None


def test_req_size_is_the_utf8_length_of_the_req():
    filters = [Filter.make(kinds=[1], tags={"e": ["a" * 64, "b" * 64]}, until=5),
               Filter.make(tags={"d": ["漢字", "x\n"]}, limit=0)]
    for sub_id, group in (("h1-2", filters), ("live-00000000", filters[:1]), ("é", filters[1:])):
        assert m.req_size(sub_id, group) == len(m.req(sub_id, group).encode())


@pytest.mark.parametrize("text", ["blocked: too many query results", "too many results",
                                  "query results exceed the sync limit"])
def test_too_many_results_is_about_the_filter_not_our_pace(text):
    assert m.says_too_many_results(text)
    assert not m.is_rate_limit_text(text)


@pytest.mark.parametrize("text", ["rate-limited: too many queries", "too many concurrent REQs",
                                  "blocked: no results for you"])
def test_other_refusals_are_not_too_many_results(text):
    assert not m.says_too_many_results(text)


@pytest.mark.parametrize("text, allowed", [
    ("Subscription rejected: Limit too high: Filter limit must be less than or equal to 500", 500),  # nostream
    ("invalid: limit exceeds max 1000", 1000),
    ("limit must be at most 200", 200),
    ("blocked: #a queries are not allowed here", None),
    ("rate-limited: slow down", None),
    ("error: too many concurrent REQs", None),
    ("too many filters (max 10)", None),
    ("Limit too high", None),  # (no number: nothing to learn)
])
def test_a_refusal_of_the_limit_asked_tells_the_most_the_relay_takes(text, allowed):
    assert m.limit_allowed(text) == allowed


def test_a_long_notice_is_not_read_past_what_a_limit_refusal_says():
    """A hostile relay's NOTICE of 1.2 MB of "limit " (the pattern's lazy scan is quadratic:
    120 KB held the process 56 s) is read no further than a refusal's length."""
    assert m.limit_allowed("limit " * 200_000) is None
    assert m.limit_allowed("limit too high: at most 50 " + "x" * 100_000) == 50
