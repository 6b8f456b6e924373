"""NIP-01 / NIP-42 / NIP-45 / NIP-77 wire messages: relay→client parsing, client→relay builders.

Pure: no sockets, no clock. ``parse_relay_message`` turns one text frame into a typed value and
never raises: anything a hostile or broken relay can send comes back as ``Malformed`` with a
``reason`` from a closed set (a metric label). Events inside ``EVENT`` are handed on as raw
dicts; ``event.parse_event`` decides whether to trust them.
"""
from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..constants import MAX_MESSAGE_BYTES
from .event import Event
from .event import compact_json as _dump
from .filters import Filter, json_size

_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


# -- machine-readable prefixes (NIP-01 OK/CLOSED, NIP-77 NEG-ERR, GRASP-01) -----------------


class Prefix(enum.Enum):
    DUPLICATE = "duplicate"
    POW = "pow"
    BLOCKED = "blocked"
    RATE_LIMITED = "rate-limited"
    INVALID = "invalid"
    RESTRICTED = "restricted"
    MUTE = "mute"
    ERROR = "error"
    AUTH_REQUIRED = "auth-required"
    UNSUPPORTED = "unsupported"
    CLOSED = "closed"  # NIP-77: the relay ended the negentropy session itself
    PURGATORY = "purgatory"  # GRASP-01: accepted, held until the git data arrives
    OTHER = "other"  # a ``word:`` prefix no NIP defines; the text keeps it
    NONE = "none"  # no prefix at all


_KNOWN_PREFIXES = {p.value: p for p in Prefix if p not in (Prefix.OTHER, Prefix.NONE)}
# A prefix is one short word before a colon; anything longer is prose that happens to
# contain a colon ("Error while parsing: …" is still recognised, case-insensitively).
_PREFIX = re.compile(r"\s*([A-Za-z][A-Za-z0-9_-]{0,31}):(.*)\Z", re.DOTALL)


def split_prefix(message: str) -> tuple[Prefix, str]:
    """``"blocked: spam"`` → ``(Prefix.BLOCKED, "spam")``.

    For an unknown prefix (``OTHER``) or none (``NONE``) the text is the whole message, so
    nothing the relay said is lost from logs.
    """
    match = _PREFIX.match(message)
    if match is None:
        return Prefix.NONE, message
    prefix = _KNOWN_PREFIXES.get(match.group(1).lower())
    if prefix is None:
        return Prefix.OTHER, message
    return prefix, match.group(2).strip()


_RATE_LIMIT_WORDS = ("rate-limit", "rate limit", "slow down", "throttl")  # "rate-limited" too
_NEGENTROPY_MENTION = re.compile(r"negentropy|\bneg(?:\b|_)", re.IGNORECASE)


def is_rate_limit_text(text: str) -> bool:
    """Relays say "slow down" in many ways, with or without the NIP-01 prefix (SPEC §5).
    "Too many" about the REQ's filters or values is not one (``is_filter_shape_refusal``),
    nor about the results of one query (``says_too_many_results``)."""
    lowered = text.lower()
    if any(word in lowered for word in _RATE_LIMIT_WORDS):
        return True
    return "too many" in lowered and not is_filter_shape_refusal(lowered) and not says_too_many_results(lowered)


def says_too_many_results(text: str) -> bool:
    """A query matching more events than the relay will reconcile at once (strfry past its
    ``maxSyncEvents``: ``"blocked: too many query results"``): the filter is too wide, not
    our pace, and narrower filters are served."""
    lowered = text.lower()
    return ("too many" in lowered or "exceed" in lowered) and "result" in lowered


_SHAPE_WORDS = ("too many", "too large", "too long", "too big", "exceed", "maximum", "max ")
_SHAPE_TOO_MANY = ("too many tags", "too many ids", "too many authors", "too many kinds",
                   "too many values", "too many tag values", "too many elements")


def is_filter_shape_refusal(text: str) -> bool:
    """Wording about the REQ itself (its filters, or the values in one), not about how fast
    or how much we ask: ``"error: too many filters"``, ``"filter too large"``."""
    lowered = text.lower()
    if any(h in lowered for h in _SHAPE_TOO_MANY):
        return True
    return "filter" in lowered and any(w in lowered for w in _SHAPE_WORDS)


def says_too_many_filters(text: str) -> bool:
    """The relay takes fewer filters in one REQ than it got (``"too many filters"``)."""
    lowered = text.lower()
    return "filters" in lowered and any(w in lowered for w in _SHAPE_WORDS) and not says_too_many_values(lowered)


_VALUE_WORDS = ("value", "item", "element", "too many ids", "too many authors")


def says_too_many_values(text: str) -> bool:
    """The relay takes fewer values in one list of a filter (its ids, authors or a tag's)
    than it got: ``"too many values in filter"``, strfry's ``"total filter items too large"``
    (64 KB of one list's values)."""
    lowered = text.lower()
    return is_filter_shape_refusal(lowered) and any(w in lowered for w in _VALUE_WORDS)


_LIMIT_TOO_HIGH = re.compile(r"\blimit\b.*?(?:too (?:high|large|big)|exceed|less than|at most|maximum|max\b)",
                             re.IGNORECASE | re.DOTALL)
_NUMBER = re.compile(r"\b(\d{1,9})\b")
# How much of a refusal ``limit_allowed`` reads: nostream's is 90 characters. (The pattern's
# lazy scan is quadratic in the text: a hostile relay's NOTICE of 120 KB of "limit" held the
# process for 56 s.)
LIMIT_REFUSAL_CHARS = 300


def limit_allowed(text: str) -> int | None:
    """The largest ``limit`` a relay refusing ours says it takes (nostream: "Subscription
    rejected: Limit too high: Filter limit must be less than or equal to 500"), or None
    when ``text`` is not such a refusal or names no number."""
    text = text[:LIMIT_REFUSAL_CHARS]
    if not _LIMIT_TOO_HIGH.search(text):
        return None
    numbers = _NUMBER.findall(text)
    return int(numbers[-1]) if numbers and int(numbers[-1]) > 0 else None


# A count a refusal names (values in a list, subscriptions open), not a size or a time
# ("64 KB", "10 s"): ``values_allowed``, ``subscriptions_allowed``
_COUNT = re.compile(r"(?<![\w.])(\d{1,9})(?![\w.]|\s*(?:%|[kmg]?i?b(?:ytes?)?\b|bytes?\b|m?s\b|seconds?\b|minutes?\b))",
                    re.IGNORECASE)


def values_allowed(text: str, longest: int) -> int | None:
    """The values one list of a filter may hold, as a refusal naming them says
    (``says_too_many_values``: "too many values in filter (380 > 20)", "max 20 items"), or
    None when it names no count below ``longest``, the longest list refused. Of several such
    numbers the largest: each is below what was refused, and the cap is the nearest to it a
    relay says (the others, a filter's index, say, are smaller); one above the real cap is
    refused again, and halved from then (``policy.values_cap_after``)."""
    text = text[:LIMIT_REFUSAL_CHARS]
    return _count_at_most(text, longest - 1) if says_too_many_values(text) else None


def _count_at_most(text: str, most: int) -> int | None:
    """The largest count (``_COUNT``) in ``text`` from 1 to ``most``."""
    return max((n for n in map(int, _COUNT.findall(text)) if 1 <= n <= most), default=None)


_SUBSCRIPTION_SUBJECT = re.compile(r"subscription|concurrent|\breqs?\b", re.IGNORECASE)
_COUNT_WORDS = ("too many", "maximum", "max ", "reached", "exceed")
_SIZE_WORDS = ("size", "byte", "large", "long", "big")


def says_too_many_subscriptions(text: str) -> bool:
    """The relay holds fewer open subscriptions than we had (``"too many concurrent REQs"``,
    ``"Maximum concurrent subscription count reached"``): a count, not a rate, and not
    about one REQ's shape or the size of what is open."""
    lowered = text.lower()
    if any(w in lowered for w in _SIZE_WORDS) or is_filter_shape_refusal(lowered):
        return False
    return bool(_SUBSCRIPTION_SUBJECT.search(lowered)) and any(w in lowered for w in _COUNT_WORDS)


def subscriptions_allowed(text: str, most: int) -> int | None:
    """The subscriptions a relay refusing one past them says it holds (nostream: "Too many
    subscriptions: Number of subscriptions must be less than or equal to 10"; "max 20"), or
    None when ``text`` is not such a refusal or names no count up to ``most``, the most that
    were open when it was refused (a count above it cannot be the cap: "21 > 20" says 20)."""
    text = text[:LIMIT_REFUSAL_CHARS]
    if not says_too_many_subscriptions(text) or any(w in text.lower() for w in _RATE_LIMIT_WORDS):
        return None  # (a rate's numbers are no count held: "rate-limited: max 5 REQs a second")
    return _count_at_most(text, most)


def is_negentropy_notice(text: str) -> bool:
    """A NOTICE about NEG-OPEN/negentropy: how some relays say they do not speak NIP-77."""
    return _NEGENTROPY_MENTION.search(text) is not None


# -- relay → client ---------------------------------------------------------------------


# RelayEvent and Ok are made for every event and every OK; a frozen dataclass's __init__
# costs five times a plain one's, so these two are plain (nothing changes them).
@dataclass(slots=True)
class RelayEvent:
    """``["EVENT", sub_id, event]``; ``event`` is the raw dict, not yet checked."""

    sub_id: str
    event: dict


@dataclass(slots=True)
class Ok:
    event_id: str
    accepted: bool
    prefix: Prefix
    text: str


@dataclass(frozen=True, slots=True)
class Eose:
    sub_id: str


@dataclass(frozen=True, slots=True)
class Closed:
    sub_id: str
    prefix: Prefix
    text: str


@dataclass(frozen=True, slots=True)
class Notice:
    text: str
    # ``["NOTICE", <subscription_id>, <message>]``: NIP-01 had that form for a while (2023,
    # nips#372); a relay still saying it names what it refuses
    sub_id: str | None = None


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    challenge: str


@dataclass(frozen=True, slots=True)
class NegMsg:
    sub_id: str
    message_hex: str  # lower-cased


@dataclass(frozen=True, slots=True)
class NegErr:
    sub_id: str
    prefix: Prefix
    text: str
    # strfry adds its cap past the reason: ``["NEG-ERR", sub, "blocked: too many query
    # results", 1000000]``; None when absent or not a count
    cap: int | None = None


@dataclass(frozen=True, slots=True)
class Count:
    sub_id: str
    count: int
    approximate: bool


Message = RelayEvent | Ok | Eose | Closed | Notice | AuthChallenge | NegMsg | NegErr | Count


@dataclass(frozen=True, slots=True)
class Malformed:
    """A frame that is not a relay message we understand. Counted, then dropped."""

    REASONS = frozenset(
        {"too_large", "bad_encoding", "bad_json", "not_array", "unknown_type", "bad_shape"}
    )

    reason: str
    detail: str = ""


class _Reject(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


_ABSENT = object()  # an optional item the relay left out (unlike an explicit null)


def _args(items: list, required: int, optional: int = 0) -> list:
    """The items after the type, padded with ``_ABSENT`` for missing optional ones."""
    args = items[1:]
    if not required <= len(args) <= required + optional:
        raise _Reject("bad_shape", f"{items[0]} with {len(args)} arguments")
    return args + [_ABSENT] * (required + optional - len(args))


def _text(value, what: str, default: str | None = None) -> str:
    if value is _ABSENT and default is not None:
        return default
    if not isinstance(value, str):
        raise _Reject("bad_shape", f"{what} is not a string")
    if value.isascii():
        return value
    # A JSON "\ud800" escape decodes to a lone surrogate, which cannot be logged or re-sent.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Reject("bad_encoding", f"{what} is not valid UTF-8") from None
    return value


def _event(items: list) -> RelayEvent:
    if len(items) != 3:  # (what _args checks, without its copies: this runs for every event)
        raise _Reject("bad_shape", f"EVENT with {len(items) - 1} arguments")
    _, sub_id, event = items
    if not isinstance(event, dict):
        raise _Reject("bad_shape", "EVENT payload is not an object")
    return RelayEvent(_text(sub_id, "sub_id"), event)


def _ok(items: list) -> Ok:
    # The message is required by NIP-01, but older relays omit it.
    event_id, accepted, message = _args(items, 2, optional=1)
    if not isinstance(event_id, str) or not _HEX64.match(event_id):
        raise _Reject("bad_shape", "OK event id is not lower-case hex")
    if type(accepted) is not bool:
        raise _Reject("bad_shape", "OK flag is not a boolean")
    prefix, text = split_prefix(_text(message, "OK message", default=""))
    return Ok(event_id, accepted, prefix, text)


def _eose(items: list) -> Eose:
    (sub_id,) = _args(items, 1)
    return Eose(_text(sub_id, "sub_id"))


def _closed(items: list) -> Closed:
    sub_id, message = _args(items, 1, optional=1)
    prefix, text = split_prefix(_text(message, "CLOSED message", default=""))
    return Closed(_text(sub_id, "sub_id"), prefix, text)


def _notice(items: list) -> Notice:
    first, message = _args(items, 1, 1)
    if message is _ABSENT:
        return Notice(_text(first, "NOTICE message"))
    return Notice(_text(message, "NOTICE message"), _text(first, "sub_id"))


def _auth(items: list) -> AuthChallenge:
    (challenge,) = _args(items, 1)
    return AuthChallenge(_text(challenge, "AUTH challenge"))


def _neg_msg(items: list) -> NegMsg:
    sub_id, message = _args(items, 2)
    if not isinstance(message, str) or not _is_hex_bytes(message):
        raise _Reject("bad_shape", "NEG-MSG payload is not hex")
    return NegMsg(_text(sub_id, "sub_id"), message.lower())


def _is_hex_bytes(text: str) -> bool:
    """Whole bytes of hex digits, nothing else. ``bytes.fromhex`` checks the digits in C
    (a regex took 25 times as long: 0.75 ms per 60 kB NEG-MSG, each parsed twice); it
    also skips whitespace, which the length comparison catches."""
    try:
        return bool(text) and len(bytes.fromhex(text)) * 2 == len(text)
    except ValueError:
        return False


def _neg_err(items: list) -> NegErr:
    sub_id, reason, cap = _args(items, 1, optional=2)
    prefix, text = split_prefix(_text(reason, "NEG-ERR reason", default=""))
    if type(cap) is not int or cap < 0:
        cap = None  # an extra element we cannot use is no reason to drop the refusal
    return NegErr(_text(sub_id, "sub_id"), prefix, text, cap)


def _count(items: list) -> Count:
    sub_id, body = _args(items, 2)
    if not isinstance(body, dict):
        raise _Reject("bad_shape", "COUNT payload is not an object")
    count, approximate = body.get("count"), body.get("approximate", False)
    if type(count) is not int or count < 0 or type(approximate) is not bool:
        raise _Reject("bad_shape", "COUNT payload has wrong types")
    return Count(_text(sub_id, "sub_id"), count, approximate)


_PARSERS = {
    "EVENT": _event,
    "OK": _ok,
    "EOSE": _eose,
    "CLOSED": _closed,
    "NOTICE": _notice,
    "AUTH": _auth,
    "NEG-MSG": _neg_msg,
    "NEG-ERR": _neg_err,
    "COUNT": _count,
}


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


# One decoder for every frame (``json.loads`` with options builds a new one per call); its
# C scanner is called directly (``decode`` wraps it in two regex calls and two Python
# frames, a third of the cost of an OK or EOSE).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_SCAN = _DECODER.scan_once
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # what JSON allows around a value


def _decode(frame: str | bytes) -> list:
    if len(frame) > MAX_MESSAGE_BYTES:
        raise _Reject("too_large", f"{len(frame)} bytes")
    if isinstance(frame, (bytes, bytearray, memoryview)):
        try:
            frame = bytes(frame).decode("utf-8")
        except UnicodeDecodeError:
            raise _Reject("bad_encoding", "frame is not UTF-8") from None
    # Characters never outnumber UTF-8 bytes, so only long text needs measuring.
    elif len(frame) * 4 > MAX_MESSAGE_BYTES:
        size = len(frame.encode("utf-8", "surrogatepass"))
        if size > MAX_MESSAGE_BYTES:
            raise _Reject("too_large", f"{size} bytes")
    start = 0 if frame[:1] == "[" else _WHITESPACE.match(frame).end()
    try:
        items, end = _SCAN(frame, start)
    except StopIteration:
        raise _Reject("bad_json", "JSONDecodeError") from None
    except (ValueError, RecursionError) as exc:
        raise _Reject("bad_json", type(exc).__name__) from None
    if end != len(frame) and _WHITESPACE.match(frame, end).end() != len(frame):
        raise _Reject("bad_json", "JSONDecodeError")  # more after the value
    if not isinstance(items, list) or not items:
        raise _Reject("not_array", "frame is not a non-empty JSON array")
    return items


# The own relay answers every delivered event with exactly this: read it without JSON.
_PLAIN_OK_HEAD, _PLAIN_OK_TAIL, _PLAIN_OK_SIZE = '["OK","', '",true,""]', 7 + 64 + 10


def _plain_ok(frame: str | bytes) -> Ok | None:
    """``["OK","<id>",true,""]`` exactly, or None (then the full parser decides)."""
    if len(frame) != _PLAIN_OK_SIZE:
        return None
    if isinstance(frame, (bytes, bytearray)):
        frame = frame.decode("ascii", "replace")
    elif not isinstance(frame, str):
        return None
    if not (frame.startswith(_PLAIN_OK_HEAD) and frame.endswith(_PLAIN_OK_TAIL)):
        return None
    event_id = frame[7:71]
    return Ok(event_id, True, Prefix.NONE, "") if _HEX64.match(event_id) else None


def parse_relay_message(frame: str | bytes) -> Message | Malformed:
    """One websocket frame from a relay → a typed message, or ``Malformed``. Never raises."""
    ok = _plain_ok(frame)
    if ok is not None:
        return ok
    try:
        items = _decode(frame)
        parser = _PARSERS.get(items[0]) if isinstance(items[0], str) else None
        if parser is None:
            kind = items[0] if isinstance(items[0], str) else type(items[0]).__name__
            raise _Reject("unknown_type", kind[:32])
        return parser(items)
    except _Reject as exc:
        return Malformed(exc.reason, exc.detail)


# -- client → relay ---------------------------------------------------------------------


def req(sub_id: str, filters: Iterable[Filter]) -> str:
    filter_texts = [f.to_json() for f in filters]
    if not filter_texts:
        raise ValueError("a REQ needs at least one filter")
    return f'["REQ",{_dump(sub_id)},{",".join(filter_texts)}]'


def req_size(sub_id: str, filters: Iterable[Filter]) -> int:
    """UTF-8 bytes of ``req(sub_id, filters)``, without building it: packing and budgets
    measure REQs many times over, and each filter's size comes from its cached selectors."""
    return 8 + json_size(sub_id) + sum(f.serialized_size() + 1 for f in filters)


def close(sub_id: str) -> str:
    return f'["CLOSE",{_dump(sub_id)}]'


def event(ev: Event) -> str:
    # The event's own JSON, reusing the tags and content encoded for its id check.
    return f'["EVENT",{ev.to_json()}]'


def auth(ev: Event) -> str:
    """NIP-42 answer: the signed kind-22242 event."""
    return _dump(["AUTH", ev.to_dict()])


def neg_open(sub_id: str, flt: Filter, message_hex: str) -> str:
    return f'["NEG-OPEN",{_dump(sub_id)},{flt.to_json()},{_dump(message_hex)}]'


def neg_msg(sub_id: str, message_hex: str) -> str:
    return f'["NEG-MSG",{_dump(sub_id)},{_dump(message_hex)}]'


def neg_close(sub_id: str) -> str:
    return f'["NEG-CLOSE",{_dump(sub_id)}]'
