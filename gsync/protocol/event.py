"""Nostr events (NIP-01): strict parsing, id computation, BIP-340 verification and signing.

Pure: no sockets, no clock. Every check a remote event must pass before gsync trusts it
lives here; a failure is an ``EventError`` carrying a short machine-readable reason that
the caller counts (``reason`` is a metric label, so the set of values is closed).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache

import coincurve

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")

# Sizes a remote relay can send before an event is refused outright (SPEC §6). Generous for
# NIP-34 (patches carry whole diffs) yet bounded so one hostile relay cannot exhaust memory.
MAX_EVENT_BYTES = 512 * 1024
MAX_TAGS = 5_000
MAX_TAG_ITEMS = 100
MAX_TAG_BYTES = 64 * 1024

# created_at must fit the NIP-01 serialisation relays use (u64) — anything beyond is junk.
MAX_TIMESTAMP = 2**63 - 1


class EventError(ValueError):
    """An event that must not be trusted. ``reason`` is one of the closed set below."""

    REASONS = frozenset(
        {"malformed", "bad_id", "bad_signature", "too_large", "too_many_tags", "bad_encoding"}
    )

    def __init__(self, reason: str, detail: str = ""):
        assert reason in self.REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


Tags = tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    pubkey: str
    created_at: int
    kind: int
    tags: Tags
    content: str
    sig: str
    # name → values of its tags, built on first use (filters match against it)
    _tag_index: dict | None = field(default=None, compare=False, repr=False, hash=False)
    # (tags, content) as JSON, kept from the id check so delivery does not encode them again
    _json_parts: tuple[str, str] | None = field(default=None, compare=False, repr=False, hash=False)

    def tag_index(self) -> dict[str, tuple[str, ...]]:
        """Each tag name's values, in order (a value twice is there twice). Tuples, not sets:
        an event waits in the delivery backlog with its index built, and a set of one value
        is 216 B where a tuple is 56 (a state event of five refs: 2.3 KB of index against
        0.9)."""
        index = self._tag_index
        if index is None:
            values: dict[str, list[str]] = {}
            for t in self.tags:
                if len(t) >= 2:
                    values.setdefault(t[0], []).append(t[1])
            index = {name: tuple(v) for name, v in values.items()}
            object.__setattr__(self, "_tag_index", index)
        return index

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "pubkey": self.pubkey,
            "created_at": self.created_at,
            "kind": self.kind,
            "tags": [list(t) for t in self.tags],
            "content": self.content,
            "sig": self.sig,
        }

    def to_json(self) -> str:
        tags_json, content_json = self._json_parts or (_tags_json(self.tags), _dumps(self.content))
        return (
            f'{{"id":"{self.id}","pubkey":"{self.pubkey}","created_at":{self.created_at},'
            f'"kind":{self.kind},"tags":{tags_json},"content":{content_json},"sig":"{self.sig}"}}'
        )

    def tag_values(self, name: str) -> list[str]:
        """Values (second element) of every tag called ``name``, in order."""
        return [t[1] for t in self.tags if len(t) >= 2 and t[0] == name]

    def first_tag_value(self, name: str) -> str | None:
        for t in self.tags:
            if len(t) >= 2 and t[0] == name:
                return t[1]
        return None

    @property
    def d_tag(self) -> str:
        return self.first_tag_value("d") or ""

    @property
    def is_addressable(self) -> bool:
        return 30000 <= self.kind < 40000

    @property
    def address(self) -> str | None:
        """``kind:pubkey:d`` for addressable events (NIP-01), else None."""
        if not self.is_addressable:
            return None
        return f"{self.kind}:{self.pubkey}:{self.d_tag}"


def serialize_for_id(pubkey: str, created_at: int, kind: int, tags, content: str) -> bytes:
    """The NIP-01 commitment ``[0,pubkey,created_at,kind,tags,content]`` as UTF-8 bytes.

    ``json.dumps`` with ``ensure_ascii=False`` escapes exactly what NIP-01 (and serde_json,
    which most relays use) escape: ``"``, ``\\``, the short forms ``\\n \\r \\t \\b \\f`` and the
    other C0 controls as ``\\u00xx``; everything else is written verbatim as UTF-8.
    """
    return _commitment(pubkey, created_at, kind, _tags_json(tags), _dumps(content))


# Compact JSON as NIP-01 serialises (see serialize_for_id). One encoder for every call:
# json.dumps with options builds a new JSONEncoder each time, a third of its cost here.
compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_dumps = compact_json


# Printable ASCII but the two characters JSON escapes: what ``is_plain`` strips away.
_PLAIN_BYTES = bytes(c for c in range(0x20, 0x7F) if chr(c) not in '"\\')


def is_plain(text: str) -> bool:
    """Printable ASCII with nothing JSON escapes: as a JSON string, its length + 2 bytes.
    (``isascii`` reads a flag; the bytes' ``translate`` then checks the rest several times
    faster than ``isprintable``: thousands of ids are checked at each reconnect.)"""
    return text.isascii() and not text.encode().translate(None, _PLAIN_BYTES)


def _tags_json(tags) -> str:
    """``_dumps(tags)``, joined directly when every value is a string needing no escape
    (every event read is checked: its id is the hash of this text)."""
    try:
        plain = all(tags) and is_plain("".join(itertools.chain.from_iterable(tags)))
    except TypeError:  # a value that is not a string: the encoder's business
        plain = False
    if not plain:
        return _dumps(tags)
    return "[" + ",".join(['["' + '","'.join(tag) + '"]' for tag in tags]) + "]"


def _commitment(pubkey: str, created_at: int, kind: int, tags_json: str, content_json: str) -> bytes:
    # Exactly json.dumps of the array: its elements joined by "," (pubkey is checked hex).
    text = f'[0,{_dumps(pubkey)},{created_at},{kind},{tags_json},{content_json}]'
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates from a "\ud800" escape
        raise EventError("bad_encoding", "not valid UTF-8") from exc


def compute_id(pubkey: str, created_at: int, kind: int, tags, content: str) -> str:
    return hashlib.sha256(serialize_for_id(pubkey, created_at, kind, tags, content)).hexdigest()


@lru_cache(maxsize=4096)
def _xonly_key(pubkey: str) -> coincurve.PublicKeyXOnly | None:
    # Parsing a key costs about a fifth of a verification; relays send many events per author.
    try:
        return coincurve.PublicKeyXOnly(bytes.fromhex(pubkey))
    except Exception:
        return None


def verify_signature(event: Event) -> bool:
    return _signed(event.id, event.pubkey, event.sig)


@lru_cache(maxsize=20_000)
def _signed(event_id: str, pubkey: str, sig: str) -> bool:
    # A function of these three alone, so remembered: the same event comes from every relay
    # that holds it, and again after what remembered it as delivered forgot it (a trimmed or
    # cleared seen set, a copy the own relay refused). Callers recompute the id from the
    # content, so a copy whose content does not hash to it is refused before this. In a
    # simulated month of 20 relays, 18,000 verifications were of 3,400 events. About 11 MB.
    key = _xonly_key(pubkey)
    if key is None:
        return False
    try:
        return key.verify(bytes.fromhex(sig), bytes.fromhex(event_id))
    except Exception:
        return False


def is_authentic(event: Event) -> bool:
    """Id and signature of an event parsed without its checks (``check_id=False``)."""
    try:
        if compute_id(event.pubkey, event.created_at, event.kind, event.tags, event.content) != event.id:
            return False
    except EventError:
        return False
    return verify_signature(event)


def _as_str_tags(raw) -> Tags:
    if not isinstance(raw, list):
        raise EventError("malformed", "tags is not a list")
    if len(raw) > MAX_TAGS:
        raise EventError("too_many_tags", f"{len(raw)} tags")
    out = []
    for tag in raw:
        if not isinstance(tag, list) or not tag:
            raise EventError("malformed", "tag is not a non-empty list")
        if len(tag) > MAX_TAG_ITEMS:
            raise EventError("too_many_tags", f"tag with {len(tag)} items")
        try:
            size = len("".join(tag))  # checks that every item is a string, in C
        except TypeError:
            raise EventError("malformed", "tag item is not a string") from None
        if size > MAX_TAG_BYTES:
            raise EventError("too_large", "tag too large")
        out.append(tuple(tag))
    return tuple(out)


def parse_event(obj, *, check_id: bool = True, check_sig: bool = True) -> Event:
    """Turn a decoded JSON object into an ``Event``, or raise ``EventError``.

    Strict about types (``bool`` is not an ``int``), hex forms (lower-case, exact length) and
    sizes. With the defaults the id is recomputed and the BIP-340 signature verified.
    """
    if not isinstance(obj, dict):
        raise EventError("malformed", "event is not an object")
    try:
        eid, pubkey, sig = obj["id"], obj["pubkey"], obj["sig"]
        created_at, kind = obj["created_at"], obj["kind"]
        content, raw_tags = obj["content"], obj["tags"]
    except KeyError as exc:
        raise EventError("malformed", f"missing field {exc.args[0]}") from None
    for name, value, pattern in (("id", eid, _HEX64), ("pubkey", pubkey, _HEX64), ("sig", sig, _HEX128)):
        if not isinstance(value, str) or not pattern.match(value):
            raise EventError("malformed", f"{name} is not lower-case hex of the right length")
    for name, value, top in (("created_at", created_at, MAX_TIMESTAMP), ("kind", kind, 65535)):
        if type(value) is not int or not 0 <= value <= top:
            raise EventError("malformed", f"{name} is not an integer in range")
    if not isinstance(content, str):
        raise EventError("malformed", "content is not a string")
    if len(content) > MAX_EVENT_BYTES:
        raise EventError("too_large", f"content of {len(content)} characters")
    tags = _as_str_tags(raw_tags)
    parts = (_tags_json(raw_tags), _dumps(content)) if check_id else None
    event = Event(eid, pubkey, created_at, kind, tags, content, sig, _json_parts=parts)
    if check_id:
        _check_id(event, parts)
    if check_sig and not verify_signature(event):
        raise EventError("bad_signature")
    return event


def verify_event(event: Event) -> Event:
    """``event`` (parsed with the checks off) with its id recomputed and its signature
    verified, or ``EventError``. Lets a reader run the cheap checks (does it match what we
    asked for?) before the costly ones."""
    parts = (_tags_json(event.tags), _dumps(event.content))  # tuples encode as the lists they were
    _check_id(event, parts)
    object.__setattr__(event, "_json_parts", parts)
    if not verify_signature(event):
        raise EventError("bad_signature")
    return event


def _check_id(event: Event, parts: tuple[str, str]) -> None:
    data = _commitment(event.pubkey, event.created_at, event.kind, *parts)
    if len(data) > MAX_EVENT_BYTES:
        raise EventError("too_large", f"{len(data)} bytes")
    if hashlib.sha256(data).hexdigest() != event.id:
        raise EventError("bad_id")


# -- keys and signing (NIP-42 AUTH, tests, the demo) ----------------------------------------


def generate_secret() -> str:
    return os.urandom(32).hex()


def public_key(secret_hex: str) -> str:
    return coincurve.PrivateKey(bytes.fromhex(secret_hex)).public_key_xonly.format().hex()


@lru_cache(maxsize=64)
def _private_key(secret_hex: str) -> coincurve.PrivateKey:
    return coincurve.PrivateKey(bytes.fromhex(secret_hex))


def sign_event(
    secret_hex: str, *, created_at: int, kind: int, tags=(), content: str = ""
) -> Event:
    """Build and sign an event. ``created_at`` is passed in: this module never reads a clock."""
    key = _private_key(secret_hex)
    pubkey = key.public_key_xonly.format().hex()
    tag_lists = [list(t) for t in tags]
    eid = compute_id(pubkey, created_at, kind, tag_lists, content)
    sig = key.sign_schnorr(bytes.fromhex(eid), os.urandom(32)).hex()
    return Event(eid, pubkey, created_at, kind, tuple(tuple(t) for t in tag_lists), content, sig)
