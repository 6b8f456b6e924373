"""Negentropy v1 core: wire encoding, fingerprints, and client against our own server.

The property tests draw the shape of two sets (sizes up to 10,000, how timestamps and ids
cluster, both frame limits) and generate the items from a drawn seed, so hypothesis can
shrink the shape while big sets stay cheap to build.
"""
import hashlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gsync.protocol.negentropy import (
    INFINITE_BOUND,
    INFINITY,
    Bound,
    Mode,
    NegentropyClient,
    NegentropyError,
    NegentropyServer,
    Storage,
    UnsupportedVersion,
    _Decoder,
    _Encoder,
    encode_varint,
)

# -- helpers -----------------------------------------------------------------------------


def reconcile(client_items, server_items, client_limit=0, server_limit=0, max_rounds=100_000):
    """Run a whole exchange in memory; checks every message against its sender's limit."""
    client = NegentropyClient(Storage(client_items), client_limit)
    server = NegentropyServer(Storage(server_items), server_limit)
    have, need, rounds = [], [], 0
    message = client.initiate()
    while message is not None:
        assert not client_limit or len(message) <= client_limit
        rounds += 1
        assert rounds <= max_rounds, "reconciliation does not converge"
        answer = server.respond(message)
        assert not server_limit or len(answer) <= server_limit
        step = client.reconcile(answer)
        have += step.have
        need += step.need
        message = step.message
    return have, need, rounds


def assert_symmetric_difference(client_items, server_items, have, need):
    client_ids = {i for _, i in client_items}
    server_ids = {i for _, i in server_items}
    assert len(have) == len(set(have)), "an id reported twice as have"
    assert len(need) == len(set(need)), "an id reported twice as need"
    assert set(have) == client_ids - server_ids
    assert set(need) == server_ids - client_ids


def decode_ranges(message):
    """(bound, mode, payload) triples of a message, for looking inside our own output."""
    dec = _Decoder(message, start=1)
    out = []
    while not dec.at_end():
        bound, mode = dec.bound(), dec.varint()
        if mode == Mode.FINGERPRINT:
            payload = dec.take(16)
        elif mode == Mode.ID_LIST:
            payload = [dec.take(32) for _ in range(dec.varint())]
        else:
            payload = None
        out.append((bound, Mode(mode), payload))
    return out


# -- encoding ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, encoded",
    [(0, "00"), (1, "01"), (127, "7f"), (128, "8100"), (16383, "ff7f"), (16384, "818000")],
)
def test_varint_is_base128_most_significant_digit_first(n, encoded):
    assert encode_varint(n).hex() == encoded
    dec = _Decoder(bytes.fromhex(encoded))
    assert dec.varint() == n and dec.at_end()


@given(st.integers(0, 2**64 - 1))
def test_varint_round_trips(n):
    dec = _Decoder(encode_varint(n))
    assert dec.varint() == n and dec.at_end()


def test_varint_beyond_64_bits_is_an_error_not_a_huge_number():
    with pytest.raises(NegentropyError):
        _Decoder(b"\xff" * 10 + b"\x01").varint()
    with pytest.raises(NegentropyError):
        _Decoder(b"\x82" + b"\x80" * 8 + b"\x00").varint()  # 2**64: one past the top


@given(st.lists(st.tuples(st.integers(0, 2**40), st.binary(max_size=32)), max_size=20))
def test_bounds_round_trip_as_timestamp_deltas(raw):
    bounds = sorted(Bound(t, p) for t, p in raw) + [INFINITE_BOUND]
    enc = _Encoder()
    for b in bounds:
        enc.bound(b)
    dec = _Decoder(bytes(enc.out), start=1)
    assert [dec.bound() for _ in bounds] == bounds and dec.at_end()


def test_infinity_is_encoded_as_zero_and_timestamps_as_one_plus_delta():
    enc = _Encoder()
    enc.bound(Bound(100))
    enc.bound(Bound(105, b"\xab"))
    enc.bound(INFINITE_BOUND)
    assert bytes(enc.out).hex() == "61" + "6500" + "0601ab" + "0000"


def test_fingerprint_is_sha256_of_little_endian_sum_and_count():
    ids = [bytes([0xFF] * 32), (1).to_bytes(32, "little"), bytes(range(32))]
    storage = Storage((1, i) for i in ids)
    total = sum(int.from_bytes(i, "little") for i in ids) % 2**256
    expected = hashlib.sha256(total.to_bytes(32, "little") + b"\x03").digest()[:16]
    assert storage.fingerprint(0, 3) == expected
    assert Storage([]).fingerprint(0, 0) == hashlib.sha256(bytes(32) + b"\0").digest()[:16]


def test_storage_sorts_by_timestamp_then_id_and_refuses_bad_items():
    a, b = bytes([1] * 32), bytes([2] * 32)
    storage = Storage([(5, b), (5, a), (1, b)])
    assert [storage.item_bound(i) for i in range(3)] == [Bound(1, b), Bound(5, a), Bound(5, b)]
    assert storage.bound_between(2) == Bound(5, b[:1])  # first differing byte + 1
    assert storage.bound_between(1) == Bound(5)  # timestamps differ: no id prefix
    with pytest.raises(ValueError):
        Storage([(1, a), (1, a)])
    with pytest.raises(ValueError):
        Storage([(INFINITY, a)])
    with pytest.raises(ValueError):
        Storage([(1, b"short")])
    with pytest.raises(ValueError):
        Storage([(1, a, 3)])
    listed = Storage([[5, b], [1, a]])  # (items as lists: kept as the tuples a bound compares with)
    assert [listed.item_bound(i) for i in range(2)] == [Bound(1, a), Bound(5, b)]
    assert listed.find_lower_bound(0, Bound(5)) == 1


@pytest.mark.parametrize("items", [
    [(-1, "01" * 32)], [(True, "01" * 32)], [(1.0, "01" * 32)], [(INFINITY, "01" * 32)],
    [(1, "01" * 31)], [(1, "zz" * 32)], [(1, "01 " * 32)], [(1, 5)],
    [(1,)], [(1, "01" * 32, 3)], [5], [(1, "01" * 32), (1, "01" * 32)],
])
def test_storage_from_hex_refuses_every_bad_item(items):
    with pytest.raises(ValueError):
        Storage.from_hex(items)


def test_storage_from_hex_and_from_bytes_agree():
    ids = [bytes([i]) * 32 for i in range(40)]
    items = [(1_000 + i % 7, item_id) for i, item_id in enumerate(ids)]
    by_bytes = Storage(items + [(9, bytearray(b"x" * 32))])
    by_hex = Storage.from_hex([(t, i.hex()) for t, i in items] + [(9, (b"x" * 32).hex())])
    assert len(by_bytes) == len(by_hex) == 41
    assert [by_bytes.item_bound(i) for i in range(41)] == [by_hex.item_bound(i) for i in range(41)]
    assert by_bytes.fingerprint(0, 41) == by_hex.fingerprint(0, 41)
    assert type(by_bytes.ids(0, 1)[0]) is bytes


def test_frame_size_limit_below_4096_is_refused():
    with pytest.raises(ValueError):
        NegentropyClient(Storage([]), 4095)
    NegentropyClient(Storage([]), 4096)


# -- the protocol's shape ----------------------------------------------------------------


def ids_at(seed, n, timestamp=lambda r, i: 1_700_000_000 + i):
    r = random.Random(seed)
    return [(timestamp(r, i), r.randbytes(32)) for i in range(n)]


def test_small_sets_are_sent_as_one_id_list_and_large_ones_as_16_fingerprints():
    small = NegentropyClient(Storage(ids_at(1, 31))).initiate()
    assert [(b, m, len(p)) for b, m, p in decode_ranges(small)] == [(INFINITE_BOUND, Mode.ID_LIST, 31)]
    large = decode_ranges(NegentropyClient(Storage(ids_at(1, 32))).initiate())
    assert [m for _, m, _ in large] == [Mode.FINGERPRINT] * 16 and large[-1][0] == INFINITE_BOUND


def test_equal_sets_settle_in_one_round_with_an_empty_answer():
    items = ids_at(2, 5000)
    server = NegentropyServer(Storage(items))
    client = NegentropyClient(Storage(items))
    answer = server.respond(client.initiate())
    assert answer == b"\x61"
    assert client.reconcile(answer) == (None, [], [])


def test_server_answers_an_unknown_version_with_the_one_it_speaks():
    server = NegentropyServer(Storage(ids_at(3, 10)))
    assert server.respond(bytes.fromhex("62aabbccddeeff")) == b"\x61"
    with pytest.raises(NegentropyError):
        server.respond(b"\x01\x00")  # not a negentropy version byte at all


def test_client_reports_a_version_answer_as_unsupported():
    client = NegentropyClient(Storage([]))
    client.initiate()
    with pytest.raises(UnsupportedVersion) as info:
        client.reconcile(b"\x62")
    assert info.value.version == 0x62


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"\x61\x00",  # bound without its prefix length
        b"\x61\x00\x00",  # range without a mode
        b"\x61\x00\x00\x03",  # unknown mode
        b"\x61\x00\x00\x01" + b"\x00" * 15,  # short fingerprint
        b"\x61\x00\x00\x02\x02" + b"\x00" * 40,  # id list shorter than its count
        b"\x61\x00\x21" + b"\x00" * 40,  # id prefix of 33 bytes
        b"\x61\x00\x00\x02\xff\xff\xff\xff\x0f",  # a huge count, no ids
        b"\x61" + b"\xff" * 64,  # endless varint
    ],
)
def test_malformed_messages_are_typed_errors(message):
    with pytest.raises(NegentropyError):
        NegentropyServer(Storage(ids_at(4, 40))).respond(message)
    client = NegentropyClient(Storage(ids_at(4, 40)))
    client.initiate()
    with pytest.raises(NegentropyError):
        client.reconcile(message)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_random_bytes_never_crash_either_side(garbage, as_client):
    storage = Storage(ids_at(5, 100, lambda r, i: 1000 + i // 7))
    for message in (garbage, b"\x61" + garbage):
        try:
            if as_client:
                client = NegentropyClient(storage, 4096)
                client.initiate()
                client.reconcile(message)
            else:
                NegentropyServer(storage, 4096).respond(message)
        except NegentropyError:
            pass


def test_a_cut_short_answer_describes_exactly_the_items_it_covers():
    # The client claims "nothing" for the last range, which the server (frame-limited)
    # reaches only after its answer is full. The reference implementation's closing range
    # then fingerprints only the items after that range -- here none, which equals the
    # client's empty fingerprint, so 400 ids would silently never be reported.
    server_items = [(t, t.to_bytes(2, "little") + bytes(30)) for t in range(1, 1001)]
    enc = _Encoder()
    for r in range(12):
        enc.range(Bound((r + 1) * 50 + 1), Mode.FINGERPRINT, b"\x01" * 16)  # forces splits
    enc.range(INFINITE_BOUND, Mode.FINGERPRINT, Storage([]).fingerprint(0, 0))
    server = NegentropyServer(Storage(server_items), 4096)
    client_items = [x for x in server_items if x[0] < 601]
    client = NegentropyClient(Storage(client_items))
    client.initiate()
    need, message = [], server.respond(bytes(enc.out))
    while message is not None:
        step = client.reconcile(message)
        need += step.need
        message = step.message and server.respond(step.message)
    assert sorted(need) == sorted(i for t, i in server_items if t >= 601)


def test_client_never_fingerprints_an_empty_remainder():
    # Its own cut-short messages send an empty id list instead, so a peer with the
    # reference's closing-range behaviour can never mistake "empty" for agreement.
    items = ids_at(6, 3000, lambda r, i: 1000 + i)
    client = NegentropyClient(Storage(items[:2000]), 4096)
    server = NegentropyServer(Storage(items[1000:]))
    message = client.initiate()
    empty_fingerprint = Storage([]).fingerprint(0, 0)
    while message is not None:
        for _, mode, payload in decode_ranges(message):
            assert not (mode == Mode.FINGERPRINT and payload == empty_fingerprint)
        message = client.reconcile(server.respond(message)).message


# -- properties: client against our own server -------------------------------------------

LIMITS = st.one_of(st.just(0), st.integers(4096, 70_000), st.sampled_from([4096, 60_000]))


@st.composite
def set_pairs(draw, max_items):
    """Two item sets sharing a drawn fraction, with drawn timestamp and id clustering."""
    # hypothesis favours small integers; draw big sets on purpose as well
    total = draw(st.one_of(st.integers(0, 40), st.integers(max_items // 10, max_items)))
    shared = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    client_only = draw(st.floats(0, 1))
    timestamps = draw(st.sampled_from(["equal", "few", "spread"]))
    ids = draw(st.sampled_from(["random", "clustered"]))
    r = random.Random(draw(st.integers(0, 2**32)))

    def timestamp():
        if timestamps == "equal":
            return 1_700_000_000
        if timestamps == "few":
            return 1_700_000_000 + r.randrange(4)
        return r.randrange(0, 2**33)

    prefix = r.randbytes(26)

    def new_id():
        # Clustered ids share 26 bytes, so bounds between them need long prefixes. They keep
        # 6 random bytes: the fingerprint is a sum, so with only a byte or two of difference
        # {a, b} and {c, d} collide whenever a + b == c + d (real ids are hashes).
        return prefix + r.randbytes(6) if ids == "clustered" else r.randbytes(32)

    seen, client, server = set(), [], []
    for _ in range(total):
        item = (timestamp(), new_id())
        if item[1] in seen:
            continue
        seen.add(item[1])
        if r.random() < shared:
            client.append(item)
            server.append(item)
        elif r.random() < client_only:
            client.append(item)
        else:
            server.append(item)
    return client, server


@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(set_pairs(max_items=10_000), LIMITS, LIMITS)
def test_reconciliation_finds_exactly_the_symmetric_difference(pair, client_limit, server_limit):
    client_items, server_items = pair
    have, need, _ = reconcile(client_items, server_items, client_limit, server_limit)
    assert_symmetric_difference(client_items, server_items, have, need)


@settings(max_examples=300, deadline=None)
@given(set_pairs(max_items=120), LIMITS, LIMITS)
def test_reconciliation_of_small_sets_finds_exactly_the_symmetric_difference(pair, cl, sl):
    client_items, server_items = pair
    have, need, _ = reconcile(client_items, server_items, cl, sl)
    assert_symmetric_difference(client_items, server_items, have, need)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.binary(min_size=32, max_size=32)), max_size=80),
    st.lists(st.tuples(st.integers(0, 3), st.binary(min_size=32, max_size=32)), max_size=80),
)
def test_reconciliation_of_drawn_items_finds_exactly_the_symmetric_difference(a, b):
    # Items drawn one by one (so hypothesis shrinks them), made consistent: one timestamp
    # per id, as for nostr events.
    when = {}
    for t, i in a + b:
        when.setdefault(i, t)
    client_items = sorted({(when[i], i) for _, i in a})
    server_items = sorted({(when[i], i) for _, i in b})
    have, need, _ = reconcile(client_items, server_items)
    assert_symmetric_difference(client_items, server_items, have, need)


@pytest.mark.parametrize("client_limit, server_limit", [(0, 0), (4096, 4096), (0, 60_000)])
def test_fifty_thousand_items_reconcile_quickly(client_limit, server_limit):
    server_items = ids_at(7, 50_000, lambda r, i: 1_700_000_000 + r.randrange(86_400 * 365))
    client_items = server_items[:49_500] + ids_at(8, 500)
    have, need, rounds = reconcile(client_items, server_items, client_limit, server_limit)
    assert_symmetric_difference(client_items, server_items, have, need)
    assert rounds < 200


def test_a_whole_id_list_that_takes_the_frame_past_its_limit_is_kept():
    # The server answers three id-list ranges: its 100 ids in the first, its 22 in the
    # second (room was left for 21 and a bit: the list ends past limit - slack, within the
    # slack), and the third no longer fits. Like the reference, the second list is kept
    # whole and the rest closed after it: dropping it would cost a round for ids written.
    items = [(t, t.to_bytes(2, "big") + bytes(30)) for t in range(1, 301)]
    enc = _Encoder()
    for bound in (Bound(101), Bound(123), INFINITE_BOUND):
        enc.id_list(bound, [])
    answer = NegentropyServer(Storage(items), 4096).respond(bytes(enc.out))
    assert 4096 - 200 < len(answer) <= 4096
    ranges = decode_ranges(answer)
    assert [(mode, len(payload) if mode == Mode.ID_LIST else None) for _, mode, payload in ranges] == [
        (Mode.ID_LIST, 100), (Mode.ID_LIST, 22), (Mode.FINGERPRINT, None)]
    assert ranges[1][0] == Bound(123)
    assert ranges[2][2] == Storage(items).fingerprint(122, 300)


# -- probes: the client's answer to a nearly settled bucket ------------------------------


class ReferenceClient(NegentropyClient):
    """Answers as the reference does: a differing bucket under 32 items with its ids."""

    def _answer_differing(self, enc, lower, upper, bound):
        self._split_range(enc, lower, upper, bound)


def exchange(client, server_items, server_limit=0):
    """A whole exchange: (bytes up, bytes down, rounds, need, the server's answers)."""
    server = NegentropyServer(Storage(server_items), server_limit)
    up = down = rounds = 0
    need, answers = [], []
    message = client.initiate()
    while message is not None:
        answer = server.respond(message)
        up, down, rounds = up + len(message), down + len(answer), rounds + 1
        answers.append(answer)
        step = client.reconcile(answer)
        need += step.need
        message = step.message
    return up, down, rounds, need, answers


def test_a_nearly_settled_exchange_probes_its_buckets_and_the_server_sends_a_fifth():
    # 6,700 items of which the client lacks 1 %: every top bucket differs, the server
    # splits each into 16 buckets of ~26 items, and ~60 of those differ. The reference
    # answers them with ~1,600 ids and hears back as many; probes hear back ~2 a missing id.
    server_items = ids_at(11, 6700, lambda r, i: 1_700_000_000 + r.randrange(86_400 * 365))
    missing = set(random.Random(12).sample(range(6700), 67))
    client_items = [x for i, x in enumerate(server_items) if i not in missing]
    up, down, rounds, need, answers = exchange(NegentropyClient(Storage(client_items)), server_items)
    ref_up, ref_down, ref_rounds, ref_need, _ = exchange(ReferenceClient(Storage(client_items)), server_items)
    assert sorted(need) == sorted(ref_need) == sorted(server_items[i][1] for i in missing)
    assert rounds == ref_rounds == 2
    assert down < ref_down / 4 and up < ref_up * 0.7
    last = decode_ranges(answers[-1])
    assert {mode for _, mode, _ in last} == {Mode.SKIP, Mode.ID_LIST}
    assert sum(len(ids) for _, mode, ids in last if mode == Mode.ID_LIST) <= 2 * len(missing)


def test_a_bucket_whose_siblings_all_differ_is_answered_with_ids():
    # Nothing tells the client how many items the server holds there (it might be 32 or
    # more, which a probe would turn into another round), so it sends its ids.
    server_items = ids_at(13, 2048)
    client_items = server_items[1::2]  # every bucket of every split differs
    client = NegentropyClient(Storage(client_items))
    server = NegentropyServer(Storage(server_items))
    answer = server.respond(client.initiate())
    assert {mode for _, mode, _ in decode_ranges(answer)} == {Mode.FINGERPRINT}
    step = client.reconcile(answer)
    assert {mode for _, mode, _ in decode_ranges(step.message)} == {Mode.ID_LIST}
    assert client.reconcile(server.respond(step.message)).message is None


def test_probes_dearer_than_ids_are_not_sent():
    # One timestamp and ids sharing 26 leading bytes: each probe's bound is a 27-byte
    # prefix, more than the id it stands for.
    prefix = bytes(26)
    r = random.Random(14)
    server_items = [(5, prefix + r.randbytes(6)) for _ in range(6000)]
    client_items = server_items[:2000] + server_items[2010:]
    client = NegentropyClient(Storage(client_items))
    server = NegentropyServer(Storage(server_items))
    step = client.reconcile(server.respond(client.initiate()))
    assert Mode.FINGERPRINT not in {mode for _, mode, _ in decode_ranges(step.message)}
    step = client.reconcile(server.respond(step.message))
    assert step.message is None and sorted(step.need) == sorted(i for _, i in server_items[2000:2010])


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_against_a_server_cutting_its_messages_probes_save_rounds_more_often_than_they_cost_one():
    """A server cutting its messages at 4 KB (the hypothesis property below found one:
    827 items over four seconds, the client lacking half) sends what fits and the rest a
    round later; probes change what its messages hold, so where it cuts: a round less
    (answers to probes are smaller) or, now and then, one more (seed 18 here: 10 rounds
    where the ids took 9). Forty such worlds: fewer rounds in 14, one more in 1."""
    fewer = more = 0
    for seed in range(40):
        r = random.Random(seed)
        server_items = [(1_700_000_000 + r.randrange(4), r.randbytes(32)) for _ in range(r.randrange(780, 880))]
        client_items = [x for x in server_items if r.random() < 0.5]
        probed = exchange(NegentropyClient(Storage(client_items)), server_items, 4096)
        reference = exchange(ReferenceClient(Storage(client_items)), server_items, 4096)
        assert sorted(probed[3]) == sorted(reference[3])
        assert probed[2] <= reference[2] + 1
        fewer += probed[2] < reference[2]
        more += probed[2] > reference[2]
    assert fewer >= 10 * more and more <= 1


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(set_pairs(max_items=4000), LIMITS)
def test_probes_cost_no_round_but_where_a_server_cuts_its_messages_one_at_most(pair, server_limit):
    # Against a server splitting as the reference does: no probe holds 32 of its items. A
    # server cutting its messages short cuts them elsewhere than the reference's: a round
    # more at most (and more often one less: the test above).
    client_items, server_items = pair
    probed = exchange(NegentropyClient(Storage(client_items)), server_items, server_limit)
    reference = exchange(ReferenceClient(Storage(client_items)), server_items, server_limit)
    assert probed[2] <= reference[2] + (1 if server_limit else 0)
    assert sorted(probed[3]) == sorted(reference[3])


# -- where what we lack lies (a server comparing its newest only: ``need_before``) -----------


def _bounded_exchange(client_items, server_items, bound_needs=True):
    client = NegentropyClient(Storage(client_items), bound_needs=bound_needs)
    server = NegentropyServer(Storage(server_items))
    need, message = [], client.initiate()
    while message is not None:
        step = client.reconcile(server.respond(message))
        need += step.need
        message = step.message
    return client, need


@given(st.integers(0, 200), st.integers(0, 400), st.integers(0, 2**32))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_id_we_lack_lies_between_need_after_and_need_before(held, served, seed):
    r = random.Random(seed)
    server = [(1_700_000_000 + r.randrange(5000), r.randbytes(32)) for _ in range(served)]
    client = r.sample(server, min(held, len(server))) + [(1_700_000_000 + r.randrange(5000), r.randbytes(32))
                                                         for _ in range(held // 4)]
    exchange, need = _bounded_exchange(client, server)
    assert set(need) == {i for _, i in server} - {i for _, i in client}
    times = {i: t for t, i in server}
    if need:
        assert exchange.need_after <= min(times[i] for i in need) <= exchange.need_before
    else:
        assert exchange.need_before is None and exchange.need_after is None


def test_few_items_initiate_with_one_fingerprint_so_a_large_server_bounds_what_we_lack():
    server = ids_at(3, 300, timestamp=lambda r, i: 1_700_000_000 + 10 * i)
    held = server[-4:]  # the newest four
    reference, need = _bounded_exchange(held, server, bound_needs=False)
    assert len(need) == 296 and reference.need_before == INFINITY  # one id list from 0 to infinity
    bounded, need = _bounded_exchange(held, server)
    assert [m for _, m, _ in decode_ranges(NegentropyClient(Storage(held), bound_needs=True).initiate())] == [
        Mode.FINGERPRINT]
    assert len(need) == 296
    oldest = server[0][0]
    assert oldest <= bounded.need_before <= oldest + 10 * 300 // 16 + 10  # within the server's first bucket
