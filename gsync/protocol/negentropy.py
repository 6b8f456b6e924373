"""Negentropy set reconciliation, protocol version 1 (the binary payload of NIP-77).

Pure: bytes in, bytes out; no sockets, no clock. Both roles live here. A client (the
initiator) sends ``initiate()`` and feeds every answer to ``reconcile()``, which reports the
ids only it has (``have``), the ids only the server has (``need``) and the next message, or
``None`` once every range is settled; each id is reported once, even when a frame limit
brings a range round again. A server answers each message with ``respond()`` and keeps no
state between messages. Malformed input is a ``NegentropyError``, never a crash or a loop:
every step consumes input, and the caller bounds the rounds.

Theory of operation. Both sides sort their items by (timestamp, id). A message is a version
byte and a list of adjacent ranges covering the whole (timestamp, id) space; each range
carries its exclusive upper bound and one of three payloads: Skip (settled), a Fingerprint of
the sender's ids in it, or the full IdList. A receiver answers a differing fingerprint by
splitting the range (16 fingerprinted buckets, or the ids themselves when fewer than 32) and
an IdList by its own ids; the client settles IdLists itself. With a frame size limit a side
stops early and covers everything it did not get to with one closing range, so later
rounds continue where this one stopped.

Wire details follow docs/negentropy-protocol-v1.md of hoytech/negentropy; the choices the
spec leaves open (bucket count, IdList threshold, 200 bytes of frame slack) are the
reference implementation's, so our messages match its messages byte for byte — except when
a frame limit cuts a message short, where our closing range always describes exactly the
items it covers (see ``_close_early``), and where the client probes a nearly settled
bucket instead of sending its ids (see ``NegentropyClient``; the spec lets the sender pick
its ranges, and any server answers them).
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
from collections.abc import Iterable, Iterator
from enum import IntEnum
from typing import NamedTuple

PROTOCOL_VERSION = 0x61
ID_SIZE = 32
FINGERPRINT_SIZE = 16
# 2**64 - 1 is reserved: it is the "infinity" timestamp of the last range's upper bound.
INFINITY = 2**64 - 1
MIN_FRAME_SIZE_LIMIT = 4096  # below this one split range might not fit in a frame

# A differing range is split into this many fingerprinted buckets; ranges with fewer than
# twice as many items are sent as id lists instead (cheaper than 16 fingerprints).
BUCKETS = 16
ID_LIST_THRESHOLD = 2 * BUCKETS
# Kept free under the frame limit for the closing range (at most 64 bytes) and the headers
# around a cut-short id list.
FRAME_SLACK = 200

_SUM_MASK = (1 << 256) - 1
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_MAX_VARINT_BYTES = 10  # 64 bits; longer is hostile input, not a bigger number


class Mode(IntEnum):
    SKIP = 0
    FINGERPRINT = 1
    ID_LIST = 2


class NegentropyError(ValueError):
    """A peer's message we cannot accept (truncated, bad mode, bad version byte...)."""


class UnsupportedVersion(NegentropyError):
    """The server answered with a protocol version we do not speak."""

    def __init__(self, version: int):
        super().__init__(f"peer speaks negentropy protocol version 0x{version:02x}, not 0x61")
        self.version = version


# -- varints and bounds ------------------------------------------------------------------


def encode_varint(n: int) -> bytes:
    """Base-128, most significant digit first, high bit set on all but the last byte."""
    if n < 0x80:
        if n < 0:
            raise ValueError("varint must be non-negative")
        return bytes((n,))
    digits = [n & 0x7F]
    n >>= 7
    while n:
        digits.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(digits))


class Bound(NamedTuple):
    """An exclusive upper bound: a timestamp and the shortest id prefix that separates."""

    timestamp: int
    id_prefix: bytes = b""

    def key(self) -> tuple[int, bytes]:
        # Omitted trailing bytes of the prefix are zeros, so it sorts like a full item key.
        return (self.timestamp, self.id_prefix.ljust(ID_SIZE, b"\0"))


INFINITE_BOUND = Bound(INFINITY)

# A decoded range: (upper bound, mode, payload, lower and upper index of our items in it).
_Range = tuple[Bound, int, bytes, int, int]


class _Decoder:
    """Reads one message; bound timestamps are deltas from the previous bound's."""

    __slots__ = ("data", "pos", "last_timestamp")

    def __init__(self, data: bytes, start: int = 0):
        self.data = data
        self.pos = start
        self.last_timestamp = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise NegentropyError("message ends prematurely")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def varint(self) -> int:
        value = 0
        for _ in range(_MAX_VARINT_BYTES):
            if self.pos >= len(self.data):
                raise NegentropyError("message ends inside a varint")
            byte = self.data[self.pos]
            self.pos += 1
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                if value > INFINITY:
                    break
                return value
        raise NegentropyError("varint larger than 64 bits")

    def bound(self) -> Bound:
        encoded = self.varint()
        if encoded == 0:
            timestamp = INFINITY
        else:  # saturate: a delta past infinity is infinity, as in the reference
            timestamp = min(self.last_timestamp + encoded - 1, INFINITY)
        self.last_timestamp = timestamp
        length = self.varint()
        if length > ID_SIZE:
            raise NegentropyError(f"bound id prefix of {length} bytes")
        return Bound(timestamp, self.take(length))


class _Encoder:
    """Writes bounds as deltas; ``mark``/``rewind`` undo a piece that did not fit.

    ``bounds`` lists the ranges' upper bounds as written."""

    __slots__ = ("out", "last_timestamp", "bounds")

    def __init__(self):
        self.out = bytearray([PROTOCOL_VERSION])
        self.last_timestamp = 0
        self.bounds: list[Bound] = []

    def bound(self, bound: Bound) -> None:
        if bound.timestamp == INFINITY:
            self.out += b"\0"
        else:
            self.out += encode_varint(bound.timestamp - self.last_timestamp + 1)
        self.last_timestamp = bound.timestamp
        self.out += encode_varint(len(bound.id_prefix))
        self.out += bound.id_prefix
        self.bounds.append(bound)

    def range(self, bound: Bound, mode: Mode, payload: bytes = b"") -> None:
        self.bound(bound)
        self.out.append(mode)
        self.out += payload

    def id_list(self, bound: Bound, ids: list[bytes]) -> None:
        self.range(bound, Mode.ID_LIST, encode_varint(len(ids)) + b"".join(ids))

    def mark(self) -> tuple[int, int, int]:
        return (len(self.out), self.last_timestamp, len(self.bounds))

    def rewind(self, mark: tuple[int, int, int]) -> None:
        del self.out[mark[0] :]
        self.last_timestamp = mark[1]
        del self.bounds[mark[2] :]


# -- storage -----------------------------------------------------------------------------


class Storage:
    """Items sorted by (timestamp, id), with prefix sums of the ids for O(1) fingerprints.

    A fingerprint is SHA-256 of (sum of the ids as little-endian 256-bit integers, mod
    2**256) followed by the item count as a varint, cut to 16 bytes. Keeping the running
    sums as Python integers makes any range's sum one subtraction, so a round over 50,000
    items costs a few hundred hashes, not a pass over the items.
    """

    __slots__ = ("_keys", "_sums")

    def __init__(self, items: Iterable[tuple[int, bytes]]):
        # Checked and summed column by column, in C (map, set, zip): a Python loop per item
        # made building a storage most of a NIP-77 exchange's cost at scale.
        keys = sorted(items)
        if keys and set(map(len, keys)) != {2}:
            raise ValueError("an item is not (timestamp, id)")
        # (columns by itemgetter: ``zip(*keys)`` made an iterator per item, the most of a build)
        stamps = list(map(_FIRST, keys))
        ids = list(map(_SECOND, keys))
        if stamps and (not set(map(type, stamps)) <= {int} or stamps[0] < 0 or stamps[-1] >= INFINITY):
            bad = next(t for t in stamps if type(t) is not int or not 0 <= t < INFINITY)
            raise ValueError(f"timestamp {bad!r} out of range")
        if ids and set(map(len, ids)) != {ID_SIZE}:
            raise ValueError("an id is not 32 bytes")
        if not set(map(type, ids)) <= {bytes}:
            ids = list(map(bytes, ids))  # bytearray or memoryview: an immutable copy
            keys = list(zip(stamps, ids, strict=True))
        elif not set(map(type, keys)) <= {tuple}:
            keys = list(zip(stamps, ids, strict=True))  # (lists, say: kept as tuples)
        if any(map(operator.eq, keys, itertools.islice(keys, 1, None))):
            raise ValueError("duplicate item")
        self._keys = keys
        self._sums = list(
            itertools.accumulate(map(int.from_bytes, ids, itertools.repeat("little")), initial=0)
        )

    @classmethod
    def from_hex(cls, items: Iterable[tuple[int, str]]) -> Storage:
        pairs = list(items)
        try:
            if not set(map(len, pairs)) <= {2}:
                raise ValueError("an item is not (timestamp, id)")
            hexes = list(map(operator.itemgetter(1), pairs))
            if not set(map(len, hexes)) <= {2 * ID_SIZE}:  # (bytes.fromhex skips spaces)
                raise ValueError("an id is not 64 hex digits")
            return cls(zip(map(operator.itemgetter(0), pairs), map(bytes.fromhex, hexes), strict=True))
        except (TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"bad item: {exc}") from None

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self, lower: int, upper: int) -> list[bytes]:
        return [i for _, i in self._keys[lower:upper]]

    def fingerprint(self, lower: int, upper: int) -> bytes:
        total = (self._sums[upper] - self._sums[lower]) & _SUM_MASK
        digest = hashlib.sha256(total.to_bytes(ID_SIZE, "little") + encode_varint(upper - lower))
        return digest.digest()[:FINGERPRINT_SIZE]

    def find_lower_bound(self, lower: int, bound: Bound) -> int:
        """Index of the first item at or after ``bound``, searching from ``lower``."""
        return bisect.bisect_left(self._keys, bound.key(), lower)

    def item_bound(self, index: int) -> Bound:
        timestamp, item_id = self._keys[index]
        return Bound(timestamp, item_id)

    def bound_between(self, index: int) -> Bound:
        """Shortest bound above item ``index - 1`` and at or below item ``index``."""
        prev_ts, prev_id = self._keys[index - 1]
        ts, item_id = self._keys[index]
        if ts != prev_ts:
            return Bound(ts)
        shared = 0
        while prev_id[shared] == item_id[shared]:
            shared += 1
        return Bound(ts, item_id[: shared + 1])


# -- the two roles -----------------------------------------------------------------------


class ClientStep(NamedTuple):
    message: bytes | None  # send this next; None: reconciliation is complete
    have: list[bytes]  # ids we have and the server lacks
    need: list[bytes]  # ids the server has and we lack


def _check_frame_size_limit(limit: int) -> int:
    if limit != 0 and limit < MIN_FRAME_SIZE_LIMIT:
        raise ValueError(
            f"frame size limit must be 0 (unlimited) or at least {MIN_FRAME_SIZE_LIMIT}"
        )
    return limit


class _Reconciler:
    """The message processing both roles share; ``initiator`` picks the role's answers."""

    initiator = False

    def __init__(self, storage: Storage, frame_size_limit: int = 0):
        self.storage = storage
        self.frame_size_limit = _check_frame_size_limit(frame_size_limit)

    def _fits(self, size: int) -> bool:
        return not self.frame_size_limit or size <= self.frame_size_limit - FRAME_SLACK

    def _split_range(self, enc: _Encoder, lower: int, upper: int, upper_bound: Bound) -> None:
        storage = self.storage
        count = upper - lower
        if count < ID_LIST_THRESHOLD:
            enc.id_list(upper_bound, storage.ids(lower, upper))
            return
        per_bucket, with_extra = divmod(count, BUCKETS)
        start = lower
        for bucket in range(BUCKETS):
            end = start + per_bucket + (1 if bucket < with_extra else 0)
            bound = upper_bound if end == upper else storage.bound_between(end)
            enc.range(bound, Mode.FINGERPRINT, storage.fingerprint(start, end))
            start = end

    def _answer_differing(self, enc: _Encoder, lower: int, upper: int, bound: Bound) -> None:
        self._split_range(enc, lower, upper, bound)

    def _close_early(self, enc: _Encoder, index: int) -> None:
        """Cover everything from ``index`` to infinity with one range, for a later round.

        An empty remainder is sent as an empty id list, never as a fingerprint: a peer that
        answers with the reference's cut-short message fingerprints less than the range it
        covers, and two empty fingerprints would then "agree" about items only it has.
        """
        if index == len(self.storage):
            enc.id_list(INFINITE_BOUND, [])
        else:
            rest = self.storage.fingerprint(index, len(self.storage))
            enc.range(INFINITE_BOUND, Mode.FINGERPRINT, rest)

    def _process(self, message: bytes, have: list[bytes], need: list[bytes]) -> bytes:
        if not message:
            raise NegentropyError("empty message")
        version = message[0]
        if not 0x60 <= version <= 0x6F:
            raise NegentropyError(f"invalid protocol version byte 0x{version:02x}")
        if version != PROTOCOL_VERSION:
            if self.initiator:
                raise UnsupportedVersion(version)
            return bytes([PROTOCOL_VERSION])  # tell the client which version we speak
        return self._answer_ranges(self._read(message), have, need)

    def _read(self, message: bytes) -> Iterable[_Range]:
        """The peer's ranges, decoded as they are answered: a range after the frame is
        full is never read."""
        return _ranges(message, self.storage)

    def _new_encoder(self) -> _Encoder:
        return _Encoder()

    _floor = Bound(0)

    def _needs_below(self, bound: Bound) -> None:
        """The server's id list below ``bound`` (from ``_floor``) held ids we lack (the
        client's concern)."""

    def _answer_ranges(self, ranges: Iterable[_Range], have: list[bytes], need: list[bytes]) -> bytes:
        enc = self._new_encoder()
        prev_bound = Bound(0)
        # Settled ranges are only written when something follows them: a message that ends
        # early implies Skip up to infinity.
        skip_pending = False
        ranges = iter(ranges)
        following = next(ranges, None)
        while following is not None:
            (bound, mode, payload, lower, upper), following = following, next(ranges, None)
            start = enc.mark()
            if skip_pending:
                enc.range(prev_bound, Mode.SKIP)
            self._floor = prev_bound  # (the range's lower bound: ``_needs_below``)
            settled, resume_at = self._answer_range(
                enc, mode, payload, lower, upper, bound, start[0], have, need
            )
            if settled:
                enc.rewind(start)
                skip_pending = True
            elif resume_at is not None:
                self._close_early(enc, resume_at)
                break
            elif not self._fits(len(enc.out)) and mode == Mode.ID_LIST:
                # Our whole id list for that range went out, and took the frame past its
                # limit by less than the slack (``_answer_id_list`` adds ids while there is
                # room): keep it, as the reference does, and continue after it next round.
                if following is not None:
                    self._close_early(enc, upper)
                break
            elif not self._fits(len(enc.out)):
                # No room for this answer: leave it, and everything after, to a later round.
                enc.rewind(start)
                if skip_pending:
                    enc.range(prev_bound, Mode.SKIP)
                self._close_early(enc, lower)
                break
            else:
                skip_pending = False
            prev_bound = bound
        return bytes(enc.out)

    def _answer_range(
        self,
        enc: _Encoder,
        mode: int,
        payload: bytes,
        lower: int,
        upper: int,
        bound: Bound,
        used: int,
        have: list[bytes],
        need: list[bytes],
    ) -> tuple[bool, int | None]:
        """Write our answer to one range of the peer's.

        Returns (settled, resume_at): settled means we have nothing to say (a Skip);
        ``resume_at`` is set when the frame limit cut our id list short at that index.
        """
        if mode == Mode.SKIP:
            return True, None
        if mode == Mode.FINGERPRINT:
            if payload == self.storage.fingerprint(lower, upper):
                return True, None
            self._answer_differing(enc, lower, upper, bound)
            return False, None
        # An id list (``_ranges`` lets no other mode through). The server answers with all
        # of its ids, whatever the client's.
        if self.initiator:
            theirs = [payload[i : i + ID_SIZE] for i in range(0, len(payload), ID_SIZE)]
            before = len(need)
            _compare_ids(self.storage.ids(lower, upper), theirs, have, need)
            if len(need) > before:
                self._needs_below(bound)
            return True, None
        return False, self._answer_id_list(enc, lower, upper, bound, used)

    def _answer_id_list(
        self, enc: _Encoder, lower: int, upper: int, bound: Bound, used: int
    ) -> int | None:
        """Our ids in the range, as many as the frame allows; returns where we stopped.

        ``used`` is the message size before this range. Like the reference, ids are added
        while that plus the ids so far stays within the limit less the slack; the headers
        around them (at most about 100 bytes) and the closing range fit in the slack.
        """
        count = upper - lower
        if self.frame_size_limit:
            count = min(count, max(0, (self.frame_size_limit - FRAME_SLACK - used) // ID_SIZE + 1))
        stop = lower + count
        if stop == upper:
            enc.id_list(bound, self.storage.ids(lower, upper))
            return None
        enc.id_list(self.storage.item_bound(stop), self.storage.ids(lower, stop))
        return stop


def _ranges(message: bytes, storage: Storage) -> Iterator[_Range]:
    """A message's ranges (after the version byte) as (upper bound, mode, payload, lower,
    upper): the payload is the fingerprint, the ids one after another, or nothing for a
    Skip; ``lower`` and ``upper`` delimit the storage's items in the range."""
    dec = _Decoder(message, start=1)
    lower = 0
    while not dec.at_end():
        bound, mode = dec.bound(), dec.varint()
        if mode == Mode.SKIP:
            payload = b""
        elif mode == Mode.FINGERPRINT:
            payload = dec.take(FINGERPRINT_SIZE)
        elif mode == Mode.ID_LIST:
            count = dec.varint()
            if count * ID_SIZE > dec.remaining():
                raise NegentropyError("id list longer than the message")
            payload = dec.take(count * ID_SIZE)
        else:
            raise NegentropyError(f"unknown range mode {mode}")
        upper = storage.find_lower_bound(lower, bound)
        yield bound, mode, payload, lower, upper
        lower = upper


def _compare_ids(
    ours: list[bytes], theirs: list[bytes], have: list[bytes], need: list[bytes]
) -> None:
    their_set = set(theirs)
    our_set = set(ours)
    have.extend(i for i in ours if i not in their_set)
    need.extend(dict.fromkeys(i for i in theirs if i not in our_set))  # ordered, deduplicated


class NegentropyClient(_Reconciler):
    """The initiator: learns which ids each side is missing.

    It answers like the reference but for one case, where it saves most of the bytes of a
    nearly settled exchange. A differing bucket of a server's split, known to hold fewer
    than ``ID_LIST_THRESHOLD`` of the server's items, would be answered with our ids in it,
    and the server would answer with all of its own: a whole bucket each way for each id
    that differs. We probe it instead: one fingerprinted range for each of our items in it
    (from the item up to our next one; the first also takes what lies below it), ~20 bytes
    up where an id is 32, and the server answers only the probes that differ, each with its
    two or three ids. Rounds do not change: no probe holds 2 * BUCKETS server items, so
    every differing probe comes back as an id list, which settles it as the ids would have.
    (A server cutting its messages at a frame size cuts them elsewhere: a round less, as
    its answers are smaller, or now and then one more; tests/test_negentropy.py.)
    What the server holds in a bucket is known from its siblings: a split cuts one range of
    ours into BUCKETS of equal size give or take one item, and a sibling whose fingerprint
    matches ours holds exactly our items there. Without such a sibling the bucket is
    answered with ids, as before. (6,700 items, 1 % missing: the server sends a fifth of
    the reference's bytes, we send two thirds; see tests/test_negentropy.py.)
    """

    initiator = True

    def __init__(self, storage: Storage, frame_size_limit: int = 0, bound_needs: bool = False):
        super().__init__(storage, frame_size_limit)
        self._initiated = False
        self._bound_needs = bound_needs  # (``initiate``)
        # A cut-short server message covers the rest of the space with one range, which
        # can reopen ranges already settled: the ids found there again are not news.
        self._reported: set[bytes] = set()
        # Our last message's range bounds, which tell a server's splits apart, and the
        # upper bounds of the server's buckets that may be probed this round.
        self._sent: list[Bound] = []
        self._probe: set[Bound] = set()
        # The oldest id the server holds and we lack is at most this old (the least upper
        # bound of the id lists that held one; INFINITY past our newest item; None: none
        # held one), and at least ``need_after`` (the least lower bound). A server that
        # compares only its newest events (a silent cap) is asked about what lies below its
        # oldest: these say where that is (``NegentropyResult``).
        self.need_before: int | None = None
        self.need_after: int | None = None

    def _needs_below(self, bound: Bound) -> None:
        if self.need_before is None or bound.timestamp < self.need_before:
            self.need_before = bound.timestamp
        if self.need_after is None or self._floor.timestamp < self.need_after:
            self.need_after = self._floor.timestamp

    def initiate(self) -> bytes:
        if self._initiated:
            raise RuntimeError("already initiated")
        self._initiated = True
        enc = self._new_encoder()
        storage = self.storage
        if self._bound_needs and len(storage) < ID_LIST_THRESHOLD:
            # Few items: one fingerprint of them all, not their ids (the reference's), so that
            # a server holding many splits by its own items: the id lists it then sends
            # are bounded by its items, and what we lack is known to lie below those
            # bounds (``need_before``). An id list from 0 to infinity says nothing of when.
            # (A round more where they differ; none where they agree.)
            enc.range(INFINITE_BOUND, Mode.FINGERPRINT, storage.fingerprint(0, len(storage)))
        else:
            self._split_range(enc, 0, len(storage), INFINITE_BOUND)
        return bytes(enc.out)

    def reconcile(self, message: bytes) -> ClientStep:
        """Settle a server message; raises ``NegentropyError`` if it is malformed.

        Each id is reported once over the whole exchange.
        """
        if not self._initiated:
            raise RuntimeError("reconcile before initiate")
        have: list[bytes] = []
        need: list[bytes] = []
        out = self._process(message, have, need)
        have, need = self._first_reports(have), self._first_reports(need)
        return ClientStep(out if len(out) > 1 else None, have, need)

    def _new_encoder(self) -> _Encoder:
        enc = _Encoder()
        self._sent = enc.bounds
        return enc

    def _read(self, message: bytes) -> list[_Range]:
        """The whole message first: which buckets to probe takes their siblings."""
        ranges = list(_ranges(message, self.storage))
        self._find_probes(ranges)
        return ranges

    def _find_probes(self, ranges: list[_Range]) -> None:
        """Find the server's differing buckets that hold fewer than ``ID_LIST_THRESHOLD``
        of its items for sure, to probe them (see the class docstring)."""
        self._probe = set()
        # A split is BUCKETS fingerprints answering one range of ours, and nothing else
        # there: look only inside runs of at least that many fingerprints.
        runs, first = [], None
        for at, (_, mode, _, _, _) in enumerate([*ranges, (None, Mode.SKIP, b"", 0, 0)]):
            if mode == Mode.FINGERPRINT:
                first = at if first is None else first
            elif first is not None:
                if at - first >= BUCKETS:
                    runs.append((first, at))
                first = None
        if not runs:
            return
        sent = [bound.key() for bound in self._sent]

        def ours(at: int) -> int | None:  # which of our ranges the server's range answers
            return bisect.bisect_left(sent, ranges[at][0].key()) if 0 <= at < len(ranges) else None

        storage = self.storage
        for first, end in runs:
            owners = {at: ours(at) for at in range(first - 1, end + 1)}
            for owner, group in itertools.groupby(range(first, end), owners.__getitem__):
                members = list(group)
                if len(members) != BUCKETS or owner in (owners[members[0] - 1], owners[members[-1] + 1]):
                    continue
                matched, differing = [], []
                for at in members:
                    bound, _, fingerprint, lower, upper = ranges[at]
                    if fingerprint == storage.fingerprint(lower, upper):
                        matched.append(upper - lower)
                    else:
                        differing.append(bound)
                if matched and min(matched) + 1 < ID_LIST_THRESHOLD:
                    self._probe.update(differing)

    def _answer_differing(self, enc: _Encoder, lower: int, upper: int, bound: Bound) -> None:
        if bound not in self._probe or not 0 < upper - lower < ID_LIST_THRESHOLD:
            self._split_range(enc, lower, upper, bound)
            return
        storage = self.storage
        start = enc.mark()
        for index in range(lower + 1, upper):
            enc.range(storage.bound_between(index), Mode.FINGERPRINT, storage.fingerprint(index - 1, index))
        enc.range(bound, Mode.FINGERPRINT, storage.fingerprint(upper - 1, upper))
        if len(enc.out) - start[0] > (upper - lower) * (ID_SIZE + 1):
            # Long bounds (ids sharing many leading bytes at one timestamp) make probes
            # dearer than the ids (a byte an id of slack: probes also spare the server's
            # answer): send the ids, as the reference does.
            enc.rewind(start)
            self._split_range(enc, lower, upper, bound)

    def _first_reports(self, ids: list[bytes]) -> list[bytes]:
        fresh = [i for i in ids if i not in self._reported]
        self._reported.update(fresh)
        return fresh


class NegentropyServer(_Reconciler):
    """The responder: answers each client message; stateless between messages."""

    def respond(self, message: bytes) -> bytes:
        """The answer to ``message``; raises ``NegentropyError`` if it is malformed."""
        return self._process(message, [], [])
