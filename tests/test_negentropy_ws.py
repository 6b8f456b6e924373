"""gsync/io/negentropy_ws.py: one NIP-77 exchange over a real websocket.

The relay side is the scripted relay (tests/scripted_relay.py) with a NIP-77 handler per
test: our own negentropy server for the happy paths, and each way a relay can fail us.
LocalRelay's own refusal is checked too.
"""
import os
import time

import pytest
import websocket

from gsync.io.negentropy_ws import NegentropyFailed, reconcile
from gsync.protocol.filters import Filter
from gsync.protocol.negentropy import NegentropyServer, Storage

from .scripted_relay import ScriptedRelay

KIND_FILTER = Filter.make(kinds=[1])


def ws_functions(ws: websocket.WebSocket):
    """send / receive-with-timeout over a blocking websocket-client connection."""

    def receive(timeout: float):
        ws.settimeout(timeout)
        try:
            return ws.recv()
        except websocket.WebSocketTimeoutException:
            return None

    return ws.send, receive


def items(n, start=0, base=1_700_000_000):
    """Events ``start`` … ``start + n - 1``; an event's timestamp follows from its number."""
    return [(base + i, f"{i:064x}") for i in range(start, start + n)]


class Nip77Server:
    """A NIP-77 handler for the scripted relay backed by our own negentropy server."""

    def __init__(self, relay_items, frame_size_limit=0, before_answer=()):
        self.server = NegentropyServer(Storage.from_hex(relay_items), frame_size_limit)
        self.before_answer = list(before_answer)  # frames sent ahead of every answer

    def __call__(self, relay, conn, message):
        if message[0] == "NEG-OPEN":
            payload = message[3]
        elif message[0] == "NEG-MSG":
            payload = message[2]
        else:
            return []
        answer = self.server.respond(bytes.fromhex(payload)).hex()
        return self.before_answer + [["NEG-MSG", message[1], answer]]


def run(relay, client_items, **kw):
    ws = websocket.create_connection(relay.url, timeout=10)
    try:
        send, receive = ws_functions(ws)
        return reconcile(send, receive, "neg-1", KIND_FILTER, client_items, **kw)
    finally:
        ws.close()


def neg_messages(relay, kind):
    return [m for _, m in relay.received if isinstance(m, list) and m and m[0] == kind]


def test_reconcile_reports_have_and_need_and_closes_the_session():
    with ScriptedRelay(negentropy=Nip77Server(items(300))) as relay:
        result = run(relay, items(300, start=250))
        time.sleep(0.1)  # let the relay's reader log the NEG-CLOSE
        opened = neg_messages(relay, "NEG-OPEN")
        closed = neg_messages(relay, "NEG-CLOSE")
    assert sorted(result.need_ids) == [f"{i:064x}" for i in range(250)]
    assert sorted(result.have_ids) == [f"{i:064x}" for i in range(300, 550)]
    assert opened[0][:3] == ["NEG-OPEN", "neg-1", {"kinds": [1]}]
    assert closed == [["NEG-CLOSE", "neg-1"]]
    assert result.rounds >= 1 and result.bytes_up > 0 and result.bytes_down > 0


def test_many_rounds_under_a_small_frame_limit_on_both_sides():
    with ScriptedRelay(negentropy=Nip77Server(items(5_000), frame_size_limit=4096)) as relay:
        result = run(relay, items(5_000, start=1_000), frame_size_limit=4096)
    assert len(result.need_ids) == 1_000 and len(result.have_ids) == 1_000
    assert result.rounds > 5


def test_traffic_for_other_subscriptions_is_skipped():
    noise = [
        ["NEG-MSG", "someone-else", "61"],
        ["NEG-ERR", "someone-else", "blocked: not you"],
        ["EOSE", "neg-1"],
        "not json at all",
        ["NEG-MSG", "someone-else", "zz"],
    ]
    with ScriptedRelay(negentropy=Nip77Server(items(40), before_answer=noise)) as relay:
        result = run(relay, items(40, start=20))
    assert len(result.need_ids) == 20 and len(result.have_ids) == 20
    # (a NOTICE before the first answer is a refusal: see the tests of NOTICEs below)


class FreshIdsEveryRound:
    """A relay that never concludes: every answer lists ids we lack, new ones each time."""

    def __init__(self, per_round=100):
        self.per_round = per_round
        self.next = 0

    def __call__(self, relay, conn, message):
        if message[0] not in ("NEG-OPEN", "NEG-MSG"):
            return []
        ids = [f"{self.next + i:064x}" for i in range(self.per_round)]
        self.next += self.per_round
        # Version; a range up to timestamp 1 listing the ids (id-list mode); then the rest
        # of the space to infinity with a fingerprint that never matches ours, so there is
        # always another round.
        id_range = "02" + "00" + "02" + _varint(len(ids)) + "".join(ids)
        rest = "00" + "00" + "01" + os.urandom(16).hex()
        return [["NEG-MSG", message[1], "61" + id_range + rest]]


def _varint(n: int) -> str:
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out)).hex()


def test_a_relay_streaming_fresh_ids_fails_at_the_need_cap_long_before_the_deadline():
    with ScriptedRelay(negentropy=FreshIdsEveryRound(per_round=100)) as relay:
        started = time.monotonic()
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(5), max_need_ids=1_000, deadline_secs=30)
    assert info.value.reason == "too-many-ids"
    assert time.monotonic() - started < 10
    assert 1_000 < len(info.value.result.need_ids) <= 1_100


def test_neg_err_is_a_failure_carrying_the_relays_reason():
    with ScriptedRelay(negentropy="err", neg_err_reason="blocked: this query is too big") as relay:
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
        time.sleep(0.1)
        closed = neg_messages(relay, "NEG-CLOSE")
    assert info.value.reason == "neg-err"
    assert info.value.text == "blocked: this query is too big"
    assert closed == [["NEG-CLOSE", "neg-1"]]


def test_neg_err_without_a_prefix_keeps_its_text():
    with ScriptedRelay(negentropy="err", neg_err_reason="Could not parse your message") as relay:
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
    assert (info.value.reason, info.value.text) == ("neg-err", "Could not parse your message")


def test_a_closed_naming_the_exchange_is_a_refusal_at_once_not_at_the_deadline():
    """NIP-77 says NEG-ERR; a relay that ends a NEG-OPEN as it ends a REQ (``CLOSED``) means
    the same. (A CLOSED for another sub id is not ours: skipped.)"""
    def closes(relay, conn, message):
        if message[0] != "NEG-OPEN":
            return []
        return [["CLOSED", "other", "error: not yours"], ["CLOSED", message[1], "blocked: not here"]]

    with ScriptedRelay(negentropy=closes) as relay:
        started = time.monotonic()
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10), deadline_secs=5)
    assert (info.value.reason, info.value.text) == ("neg-err", "blocked: not here")
    assert time.monotonic() - started < 4


def test_a_notice_about_negentropy_is_a_failure():
    with ScriptedRelay(negentropy="notice") as relay:
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
    assert info.value.reason == "notice" and "negentropy" in info.value.text


def scripted_answer(payload):
    def handler(relay, conn, message):
        return [["NEG-MSG", message[1], payload]] if message[0] == "NEG-OPEN" else []

    return handler


def test_an_answer_in_another_protocol_version_is_unsupported_version():
    with ScriptedRelay(negentropy=scripted_answer("62")) as relay:
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
    assert info.value.reason == "unsupported-version" and "0x62" in info.value.text


@pytest.mark.parametrize("payload", ["zz", "", "6", "61000002ff", "01"])
def test_garbage_in_a_neg_msg_is_a_bad_message(payload):
    with ScriptedRelay(negentropy=scripted_answer(payload)) as relay:
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
    assert info.value.reason == "bad-message"


def test_silence_ends_at_the_total_deadline():
    with ScriptedRelay(negentropy="ignore") as relay:
        started = time.monotonic()
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10), deadline_secs=0.5)
        elapsed = time.monotonic() - started
    assert info.value.reason == "timeout"
    assert 0.4 < elapsed < 3


def test_the_deadline_is_total_not_per_message():
    # A relay that keeps talking (about other things) must not keep us forever.
    now = [0.0]

    def receive(timeout):
        now[0] += 1.0
        return '["EOSE","another-subscription"]'

    sent = []
    with pytest.raises(NegentropyFailed) as info:
        reconcile(sent.append, receive, "s", KIND_FILTER, items(3), deadline_secs=15, clock=lambda: now[0])
    assert info.value.reason == "timeout"
    assert now[0] == 15.0
    assert sent[-1] == '["NEG-CLOSE","s"]'


def test_the_default_deadline_is_fifteen_seconds_of_the_injected_clock():
    now = [100.0]

    def receive(timeout):
        now[0] += timeout  # a receive that waits its whole timeout
        return None

    with pytest.raises(NegentropyFailed) as info:
        reconcile(lambda text: None, receive, "s", KIND_FILTER, [], clock=lambda: now[0])
    assert info.value.reason == "timeout" and now[0] == 115.0


def test_a_dropped_connection_is_not_a_verdict_on_nip77():
    def receive(timeout):
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        reconcile(lambda text: None, receive, "s", KIND_FILTER, items(3))


def test_duplicate_items_from_overlapping_sources_count_once():
    with ScriptedRelay(negentropy=Nip77Server(items(5))) as relay:
        result = run(relay, items(5) + items(5) + items(2, start=5))
    assert result.need_ids == [] and sorted(result.have_ids) == [f"{i:064x}" for i in (5, 6)]


def test_localrelay_refusing_the_query_is_a_neg_err(relay_factory):
    relay = relay_factory(block_queries="not today")
    with pytest.raises(NegentropyFailed) as info:
        run(relay, items(10))
    assert info.value.reason == "neg-err" and info.value.text.startswith("blocked:")


def test_a_notice_in_any_words_before_the_first_answer_is_a_refusal():
    """primal.net and purplepag.es refuse NEG-OPEN with a NOTICE of their own words."""
    with ScriptedRelay(negentropy="plain-notice", neg_err_reason="ERROR: bad msg: unknown command") as relay:
        started = time.monotonic()
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
    assert (info.value.reason, info.value.text) == ("notice", "ERROR: bad msg: unknown command")
    assert time.monotonic() - started < 3, "not the deadline"


def test_a_notice_naming_nothing_after_the_first_answer_is_not_a_refusal():
    server = Nip77Server(items(300), frame_size_limit=4_096)

    def notice_before_later_answers(relay, conn, message):
        frames = server(relay, conn, message)
        return ([["NOTICE", "restarting soon"]] if message[0] == "NEG-MSG" else []) + frames

    with ScriptedRelay(negentropy=notice_before_later_answers) as relay:
        result = run(relay, items(250), frame_size_limit=4_096)
    assert result.rounds > 1
    assert len(result.need_ids) == 50


def test_a_neg_err_past_the_relays_result_cap_says_so_with_its_cap():
    def capped(relay, conn, message):
        if message[0] != "NEG-OPEN":
            return []
        return [["NEG-ERR", message[1], "blocked: too many query results", 1000000]]

    with ScriptedRelay(negentropy=capped) as relay:
        with pytest.raises(NegentropyFailed) as info:
            run(relay, items(10))
    assert info.value.reason == "too-many-results"
    assert info.value.text == "blocked: too many query results (cap 1000000)"


def test_a_notice_about_the_subscription_cap_before_the_first_answer_is_not_ours():
    """"too many concurrent REQs" refuses the last REQ (the connection learns the cap from
    it): read as this exchange's refusal, it would become a rate limit's cooldown."""
    server = Nip77Server(items(40), before_answer=[["NOTICE", "ERROR: too many concurrent REQs"]])
    with ScriptedRelay(negentropy=server) as relay:
        result = run(relay, items(40, start=20))
    assert len(result.need_ids) == 20 and len(result.have_ids) == 20
