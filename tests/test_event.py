"""Event ids and signatures agree with nostr-sdk (rust-nostr), and untrustworthy events are refused.

nostr-sdk is the independent reference: it re-serialises the NIP-01 commitment with
serde_json, so any difference in JSON escaping between it and ``json.dumps`` shows up here as
an id mismatch.
"""
from __future__ import annotations

import json
import random

import nostr_sdk
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gsync.protocol.event import (
    MAX_EVENT_BYTES,
    MAX_TAGS,
    MAX_TIMESTAMP,
    EventError,
    compute_id,
    is_authentic,
    parse_event,
    public_key,
    serialize_for_id,
    sign_event,
    verify_event,
)
from tests import factory as f


def parse_event_json(text: str | bytes, **checks):
    """An event from JSON text, as a relay's frame carries it (the connection parses the
    frame, then ``parse_event`` its event object)."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise EventError("malformed", "not JSON") from exc
    return parse_event(obj, **checks)


# Characters where JSON encoders are known to differ, or that a careless one breaks on.
C0_CONTROLS = [chr(c) for c in range(0x20)]
AWKWARD = [
    *C0_CONTROLS,
    "\x7f",  # DEL: not escaped by NIP-01
    '"', "\\", "/",  # "/" may be escaped as "\/" on the wire, never in the commitment
    "\u0085", "\u00a0",  # NEL, NBSP
    "\u2028", "\u2029",  # JavaScript line/paragraph separators
    "\ufeff",  # BOM
    "\ue000", "\uffff", "\U0010ffff",  # private use, non-characters
    "é", "e\u0301",  # precomposed and combining: never normalised
    "😀", "👩‍💻", "🇯🇵",  # astral plane, ZWJ sequence, flag pair
    "漢字", "한국어", "ﾃｽﾄ",  # CJK, Hangul, half-width katakana
]

SECRETS = [f"{n:064x}" for n in range(1, 6)] + [
    "7ccaebd3be20c0faa40eee84868e364d8cd8c327923aad79398e1fbbf3c6d8e6"
]


def random_codepoint(rng: random.Random) -> str:
    while True:
        c = rng.randrange(0x80, 0x110000)
        if not 0xD800 <= c <= 0xDFFF:  # surrogates cannot be encoded as UTF-8
            return chr(c)


def random_text(rng: random.Random, max_len: int) -> str:
    parts = []
    for _ in range(rng.randrange(max_len + 1)):
        roll = rng.random()
        if roll < 0.35:
            parts.append(rng.choice(AWKWARD))
        elif roll < 0.8:
            parts.append(chr(rng.randrange(0x20, 0x7F)))
        else:
            parts.append(random_codepoint(rng))
    return "".join(parts)


def random_event_fields(rng: random.Random) -> dict:
    tags = [
        [rng.choice(["e", "p", "a", "t", "d", "clone", random_text(rng, 4) or "x"])]
        + [random_text(rng, 12) for _ in range(rng.randrange(4))]
        for _ in range(rng.randrange(6))
    ]
    return {
        "created_at": rng.choice([0, 1, 1_700_000_000, 2**32, MAX_TIMESTAMP, rng.randrange(2**40)]),
        "kind": rng.choice([0, 1, 1111, 1617, 1621, 30617, 30618, 65535, rng.randrange(65536)]),
        "tags": tags,
        "content": random_text(rng, 60),
    }


def sdk_event(ev) -> nostr_sdk.Event:
    return nostr_sdk.Event.from_json(ev.to_json())


def assert_sdk_agrees(ev) -> None:
    theirs = sdk_event(ev)
    assert theirs.verify_id(), ev.to_json()
    assert theirs.verify_signature()
    assert theirs.id().to_hex() == ev.id
    assert parse_event(ev.to_dict()) == ev


# -- agreement with nostr-sdk --------------------------------------------------------------


def test_a_thousand_generated_events_verify_in_nostr_sdk():
    rng = random.Random(20240611)
    seen = set()
    for _ in range(1_000):
        fields = random_event_fields(rng)
        ev = sign_event(rng.choice(SECRETS), **fields)
        assert_sdk_agrees(ev)
        seen.update(ev.content)
    # The generator really did exercise every awkward single character.
    assert {c for c in AWKWARD if len(c) == 1} <= seen


def test_our_serialisation_is_byte_identical_to_nostr_sdk():
    rng = random.Random(7)
    for _ in range(300):
        ev = sign_event(SECRETS[0], **random_event_fields(rng))
        assert sdk_event(ev).as_json() == ev.to_json()


@pytest.mark.parametrize("char", [*C0_CONTROLS, "\x7f"], ids=lambda c: f"U+{ord(c):04X}")
def test_every_control_character_in_content_and_tags(char):
    ev = sign_event(SECRETS[1], created_at=1, kind=1, tags=[["t", f"a{char}b", char]], content=char * 3)
    assert_sdk_agrees(ev)


_tag = st.lists(st.text(max_size=20), min_size=1, max_size=4)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    content=st.text(max_size=200),
    tags=st.lists(_tag, max_size=6),
    kind=st.integers(0, 65535),
    created_at=st.integers(0, MAX_TIMESTAMP),
)
def test_hypothesis_events_verify_in_nostr_sdk(content, tags, kind, created_at):
    ev = sign_event(SECRETS[2], created_at=created_at, kind=kind, tags=tags, content=content)
    assert_sdk_agrees(ev)


_plain_or_not = st.text(max_size=12) | st.sampled_from(["e", "a" * 64, "30617:" + "b" * 64 + ":repo", 'q"', "\\", "\x7f"])


@given(tags=st.lists(st.lists(_plain_or_not, min_size=1, max_size=3), max_size=4), content=_plain_or_not)
def test_the_commitment_is_json_dumps_of_the_array(tags, content):
    # Plain values are joined without the encoder: the text must be the encoder's all the same.
    pubkey = "c" * 64
    expected = json.dumps([0, pubkey, 7, 1, tags, content], ensure_ascii=False, separators=(",", ":"))
    assert serialize_for_id(pubkey, 7, 1, tags, content) == expected.encode()
    assert serialize_for_id(pubkey, 7, 1, tuple(map(tuple, tags)), content) == expected.encode()


def _sdk_sign(keys, kind, content, tags, created_at) -> nostr_sdk.Event:
    builder = nostr_sdk.EventBuilder(nostr_sdk.Kind(kind), content)
    builder = builder.tags([nostr_sdk.Tag.parse(t) for t in tags])
    return builder.custom_created_at(nostr_sdk.Timestamp.from_secs(created_at)).finalize(keys)


def test_events_signed_by_nostr_sdk_parse_and_verify_with_ours():
    rng = random.Random(99)
    keys = nostr_sdk.Keys.parse(SECRETS[3])
    for _ in range(300):
        f = random_event_fields(rng)
        theirs = _sdk_sign(keys, f["kind"], f["content"], f["tags"], f["created_at"])
        ours = parse_event_json(theirs.as_json())
        assert ours.id == theirs.id().to_hex()
        assert ours.pubkey == public_key(SECRETS[3])
        assert ours.content == f["content"]
        assert [list(t) for t in ours.tags] == f["tags"]


def test_wire_escaping_does_not_matter_only_the_decoded_values():
    """Relays may send "\\u00e9", "\\/" or all-ASCII JSON; the id commits to the decoded text."""
    ev = sign_event(SECRETS[0], created_at=5, kind=1, tags=[["t", "a/b é"]], content="x/y 😀 \u2028")
    ascii_json = json.dumps(ev.to_dict(), ensure_ascii=True)
    assert "\\u00e9" in ascii_json and "\\ud83d\\ude00" in ascii_json
    slashed = ascii_json.replace("/", "\\/")
    for text in (ascii_json, slashed):
        assert parse_event_json(text) == ev
        assert nostr_sdk.Event.from_json(text).verify()


# -- tampering ------------------------------------------------------------------------------


@pytest.fixture
def signed():
    return sign_event(SECRETS[4], created_at=1_700_000_000, kind=1621,
                      tags=[["a", "30617:" + "ab" * 32 + ":repo"], ["subject", "bug"]],
                      content="it \"breaks\"\n\\ 漢字")


def _flip_hex(value: str, at: int = -1) -> str:
    chars = list(value)
    chars[at] = "0" if chars[at] != "0" else "1"
    return "".join(chars)


def _reason(obj) -> str:
    with pytest.raises(EventError) as info:
        parse_event(obj)
    return info.value.reason


def _sdk_rejects(obj) -> bool:
    try:
        return not nostr_sdk.Event.from_json(json.dumps(obj)).verify()
    except Exception:
        return True


OTHER_PUBKEY = public_key(SECRETS[0])

TAMPERINGS = {
    "content": ("content", "it breaks"),
    "created_at": ("created_at", 1_700_000_001),
    "kind": ("kind", 1617),
    "tags": ("tags", [["a", "30617:" + "ab" * 32 + ":other"], ["subject", "bug"]]),
    "pubkey": ("pubkey", OTHER_PUBKEY),
}


@pytest.mark.parametrize("field", TAMPERINGS)
def test_a_changed_field_no_longer_matches_the_id(signed, field):
    name, value = TAMPERINGS[field]
    obj = {**signed.to_dict(), name: value}
    assert _reason(obj) == "bad_id"
    assert _sdk_rejects(obj)


@pytest.mark.parametrize("field", TAMPERINGS)
def test_a_changed_field_with_a_recomputed_id_fails_the_signature(signed, field):
    name, value = TAMPERINGS[field]
    obj = {**signed.to_dict(), name: value}
    obj["id"] = compute_id(obj["pubkey"], obj["created_at"], obj["kind"], obj["tags"], obj["content"])
    assert _reason(obj) == "bad_signature"
    assert _sdk_rejects(obj)


def test_a_changed_id_is_refused(signed):
    assert _reason({**signed.to_dict(), "id": _flip_hex(signed.id)}) == "bad_id"


@pytest.mark.parametrize("at", [0, 31, 64, -1])
def test_a_changed_signature_is_refused(signed, at):
    obj = {**signed.to_dict(), "sig": _flip_hex(signed.sig, at)}
    assert _reason(obj) == "bad_signature"
    assert _sdk_rejects(obj)


def test_a_pubkey_that_is_not_a_curve_point_fails_the_signature(signed):
    # "ff…ff" is above the field prime, so it is no x coordinate at all.
    obj = {**signed.to_dict(), "pubkey": "f" * 64}
    obj["id"] = compute_id(obj["pubkey"], obj["created_at"], obj["kind"], obj["tags"], obj["content"])
    assert _reason(obj) == "bad_signature"


def test_verify_event_does_the_checks_parse_event_skipped(signed):
    assert verify_event(parse_event(signed.to_dict(), check_id=False, check_sig=False)) == signed
    for name, value in TAMPERINGS.values():
        with pytest.raises(EventError) as info:
            verify_event(parse_event({**signed.to_dict(), name: value}, check_id=False, check_sig=False))
        assert info.value.reason == "bad_id"
    forged = {**signed.to_dict(), "sig": _flip_hex(signed.sig, 3)}
    with pytest.raises(EventError) as info:
        verify_event(parse_event(forged, check_id=False, check_sig=False))
    assert info.value.reason == "bad_signature"


def test_a_remembered_signature_vouches_for_no_other_content_or_signature(signed):
    """Signatures are remembered once verified (the same event comes from every relay
    that holds it): a second copy costs no verification, and the memory vouches for nothing
    but the exact (id, pubkey, sig) it verified."""
    from gsync.protocol import event as ev

    ev._signed.cache_clear()
    verify_event(parse_event(signed.to_dict(), check_id=False, check_sig=False))
    verify_event(parse_event(signed.to_dict(), check_id=False, check_sig=False))
    assert (ev._signed.cache_info().hits, ev._signed.cache_info().misses) == (1, 1)
    for name, value in TAMPERINGS.values():  # the same id and signature on other content
        assert _reason({**signed.to_dict(), name: value}) == "bad_id"
        assert not is_authentic(parse_event({**signed.to_dict(), name: value}, check_id=False, check_sig=False))
    for at in (0, 64, -1):
        assert _reason({**signed.to_dict(), "sig": _flip_hex(signed.sig, at)}) == "bad_signature"


def test_verify_event_keeps_the_json_delivery_sends(signed):
    event = verify_event(parse_event(signed.to_dict(), check_id=False, check_sig=False))
    assert event.to_json() == parse_event(signed.to_dict()).to_json()
    assert event._json_parts is not None


def test_checks_can_be_skipped_for_events_we_made(signed):
    obj = {**signed.to_dict(), "content": "changed"}
    assert parse_event(obj, check_id=False, check_sig=False).content == "changed"


@pytest.mark.parametrize("field", TAMPERINGS)
def test_skipped_checks_can_be_made_later(signed, field):
    """A copy parsed unchecked (its id was known) is checked when it is wanted after all."""
    assert is_authentic(parse_event(signed.to_dict(), check_id=False, check_sig=False))
    name, value = TAMPERINGS[field]
    tampered = {**signed.to_dict(), name: value}
    assert not is_authentic(parse_event(tampered, check_id=False, check_sig=False))
    tampered["id"] = compute_id(tampered["pubkey"], tampered["created_at"], tampered["kind"],
                                tampered["tags"], tampered["content"])
    assert not is_authentic(parse_event(tampered, check_id=False, check_sig=False))


# -- strict types and bounds ------------------------------------------------------------------

MALFORMED = {
    "bool kind": ("kind", True),
    "float kind": ("kind", 1621.0),
    "kind too big": ("kind", 65536),
    "negative kind": ("kind", -1),
    "float created_at": ("created_at", 1_700_000_000.0),
    "string created_at": ("created_at", "1700000000"),
    "bool created_at": ("created_at", False),
    "negative created_at": ("created_at", -1),
    "created_at beyond i64": ("created_at", MAX_TIMESTAMP + 1),
    "uppercase id": ("id", str.upper),  # callables derive the value from the real field
    "uppercase pubkey": ("pubkey", str.upper),
    "uppercase sig": ("sig", str.upper),
    "short sig": ("sig", "ab" * 63),
    "long id": ("id", "ab" * 33),
    "non-hex id": ("id", "g" * 64),
    "int id": ("id", 5),
    "content not a string": ("content", 5),
    "null content": ("content", None),
    "tags not a list": ("tags", {"a": "b"}),
    "tag not a list": ("tags", ["a"]),
    "empty tag": ("tags", [[]]),
    "int tag item": ("tags", [["t", 5]]),
    "null tag item": ("tags", [["t", None]]),
    "list tag item": ("tags", [["t", ["x"]]]),
    "bool tag item": ("tags", [["t", True]]),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_wrong_types_are_malformed(signed, case):
    name, value = MALFORMED[case]
    if callable(value):
        value = value(getattr(signed, name))
    assert _reason({**signed.to_dict(), name: value}) == "malformed"


@pytest.mark.parametrize("missing", ["id", "pubkey", "created_at", "kind", "tags", "content", "sig"])
def test_missing_fields_are_malformed(signed, missing):
    obj = signed.to_dict()
    del obj[missing]
    assert _reason(obj) == "malformed"


@pytest.mark.parametrize("obj", [None, [], "event", 5])
def test_non_objects_are_malformed(obj):
    assert _reason(obj) == "malformed"


@pytest.mark.parametrize("where", ["content", "tag"])
def test_lone_surrogate_from_json_text_is_bad_encoding(signed, where):
    text = signed.to_json()
    if where == "content":
        text = text.replace('"content":"', '"content":"\\ud800', 1)
    else:
        text = text.replace('["subject","bug"]', '["subject","bug\\udfff"]', 1)
    with pytest.raises(EventError) as info:
        parse_event_json(text)
    assert info.value.reason == "bad_encoding"
    with pytest.raises(Exception):  # serde_json refuses lone surrogates outright
        nostr_sdk.Event.from_json(text)


def test_oversize_content_and_too_many_tags(signed):
    assert _reason({**signed.to_dict(), "content": "x" * (MAX_EVENT_BYTES + 1)}) == "too_large"
    assert _reason({**signed.to_dict(), "tags": [["t", "x"]] * (MAX_TAGS + 1)}) == "too_many_tags"


def test_multibyte_content_counts_in_utf8_bytes_for_the_size_bound():
    content = "漢" * (MAX_EVENT_BYTES // 3 + 1)  # fewer characters than the bound, more bytes
    ev = sign_event(SECRETS[0], created_at=1, kind=1, content=content)
    with pytest.raises(EventError) as info:
        parse_event(ev.to_dict())
    assert info.value.reason == "too_large"


@pytest.mark.parametrize("text", ["", "{", "[1,2]", '{"id": NaN}', "\xff"])
def test_parse_event_json_refuses_non_events(text):
    with pytest.raises(EventError) as info:
        parse_event_json(text)
    assert info.value.reason == "malformed"


def test_every_test_factory_event_is_genuine():
    alice, bob = f.Author.named("alice"), f.Author()
    repo = f.announcement(alice, "répo 😀", clone=["https://h/x.git", "https://g/x.git"],
                          relays=["wss://h"], maintainers=[bob], euc="c" * 40)
    bug = f.issue(bob, repo, subject='"quoted" \\ \u2028')
    root_patch = f.patch(bob, repo)
    pull = f.pr(bob, repo, branch="feature")
    made = [
        repo, bug, root_patch, pull,
        f.state(alice, "répo 😀"),
        f.patch(bob, repo, reply_to=root_patch),
        f.pr_update(bob, pull),
        f.comment(alice, bug),
        f.comment(bob, bug, f.comment(alice, bug)),
        *(f.status(alice, bug, kind) for kind in range(1630, 1634)),
        f.quote(alice, repo),
    ]
    for ev in made:
        assert_sdk_agrees(ev)
    assert [ev.created_at for ev in made] == sorted(ev.created_at for ev in made)
    assert f.Author.named("alice") == alice and f.Author().pubkey != bob.pubkey
