"""gsync/io/ws.py: WsStream over a real socket, against the scripted relay's own framing."""
import json
import struct
import threading
import time

import pytest

from gsync.io import ws as ws_stream
from gsync.protocol import wsframes
from tests.relays import wait_until
from tests.scripted_relay import OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_TEXT, Raw, _frame


def on_ping_req(frames):
    """A scripted relay that answers the REQ "x" with ``frames`` (then its EOSE)."""
    def on_message(relay, conn, message):
        if message[:2] == ["REQ", "x"]:
            return [*frames, ["EOSE", "x"]]
        return None
    return on_message


def test_bursts_fragments_pings_and_binary_frames(scripted):
    relay = scripted(on_message=on_ping_req([
        Raw(_frame(OP_PING, b"are you there")),
        Raw(_frame(OP_TEXT, b'["NOTICE","frag', fin=False)),
        Raw(_frame(OP_CONT, b'mented"]')),
        Raw(_frame(OP_BINARY, b"\x00\x01")),
        ["NOTICE", "whole"],
    ]))
    stream = ws_stream.connect(relay.url, 10)
    try:
        stream.send_many([json.dumps(["REQ", "x", {}])])
        got = []
        while not got or got[-1] != (OP_TEXT, ["EOSE", "x"]):
            got += [(op, json.loads(data) if op == OP_TEXT else data)
                    for op, data in stream.recv_burst()]
        assert got == [
            (OP_TEXT, ["NOTICE", "fragmented"]),
            (OP_BINARY, b"\x00\x01"),
            (OP_TEXT, ["NOTICE", "whole"]),
            (OP_TEXT, ["EOSE", "x"]),
        ]  # the ping was answered, not returned:
        wait_until(lambda: relay.connections[0].pongs == [b"are you there"], timeout=5,
                   what="the pong")
    finally:
        stream.close()


def test_a_burst_of_pings_gets_one_pong_for_the_latest(scripted):
    # RFC 6455 §5.5.3 allows answering only the most recent ping: one pong per read, not
    # one socket write per ping a relay cares to send.
    pings = b"".join(_frame(OP_PING, f"p{i}".encode()) for i in range(50))
    relay = scripted(on_message=on_ping_req([Raw(pings), ["NOTICE", "after"]]))
    stream = ws_stream.connect(relay.url, 10)
    try:
        stream.send_many([json.dumps(["REQ", "x", {}])])
        got = []
        while not got or got[-1] != ["EOSE", "x"]:
            got += [json.loads(data) for _, data in stream.recv_burst()]
        assert got == [["NOTICE", "after"], ["EOSE", "x"]]
        wait_until(lambda: relay.connections[0].pongs, timeout=5, what="a pong")
        time.sleep(0.2)
        assert relay.connections[0].pongs == [b"p49"]
    finally:
        stream.close()


_FLOODED_READER = """
import gevent.monkey; gevent.monkey.patch_all()
import json, socket, sys, time, types, gevent
from gsync.io import ws as ws_stream
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
ticks = [0]
def ticker():
    while True:
        ticks[0] += 1
        gevent.sleep(0.01)
def reader():
    started = time.monotonic()
    try:
        ws_stream.WsStream(types.SimpleNamespace(sock=sock)).recv_message()
        ended = "returned"
    except Exception as exc:
        ended = type(exc).__name__
    return ended, time.monotonic() - started
gevent.spawn(ticker)
ended, secs = gevent.spawn(reader).get()
print(json.dumps({"ended": ended, "secs": secs, "ticks": ticks[0]}))
"""


def test_a_stream_of_pings_ends_the_connection_without_holding_the_process():
    # A peer that streams pings (a socket that always has data never blocks) held the
    # whole gevent process: nothing else ran while its reader answered ping after ping.
    # Now the pings are counted and the stream ends; meanwhile the others run.
    import socket
    import subprocess
    import sys

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def flood():
        conn, _ = listener.accept()
        block = _frame(OP_PING, b"") * 32768
        try:
            while not stop.is_set():
                conn.sendall(block)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=flood, daemon=True).start()
    try:
        out = subprocess.run([sys.executable, "-c", _FLOODED_READER, str(listener.getsockname()[1])],
                             capture_output=True, text=True, timeout=60)
    finally:
        stop.set()
        listener.close()
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ended"] == "BrokenFrame", (result, out.stderr[-2000:])
    assert result["secs"] < 5
    # the ticker ran beside the reader: one tick per 10 ms it was let run
    assert result["ticks"] >= result["secs"] * 100 / 10, result


def test_many_messages_in_one_write_arrive_in_order(scripted):
    relay = scripted()
    stream = ws_stream.connect(relay.url, 10)
    try:
        texts = [json.dumps(["REQ", f"s{i}", {"kinds": [i]}]) for i in range(50)]
        assert stream.send_many(texts) > sum(map(len, texts))  # headers and masks
        eose = [stream.recv() for _ in range(50)]
        assert [json.loads(m)[1] for m in eose] == [f"s{i}" for i in range(50)]
        assert [m[1] for m in relay.messages("REQ")] == [f"s{i}" for i in range(50)]
    finally:
        stream.close()


def test_close_frame_ends_recv(scripted):
    relay = scripted(on_message=on_ping_req([Raw(_frame(OP_CLOSE, struct.pack("!H", 1000)))]))
    stream = ws_stream.connect(relay.url, 10)
    stream.send(json.dumps(["REQ", "x", {}]))
    assert stream.recv_message()[0] == wsframes.OP_CLOSE
    stream.close()


def test_masked_server_frame_ends_the_stream(scripted):
    masked = bytes([0x81, 0x82]) + b"abcd" + bytes([ord("h") ^ ord("a"), ord("i") ^ ord("b")])
    relay = scripted(on_message=on_ping_req([Raw(masked)]))
    stream = ws_stream.connect(relay.url, 10)
    stream.send(json.dumps(["REQ", "x", {}]))
    with pytest.raises(ws_stream.ConnectionClosed, match="masked"):
        stream.recv()
    assert not stream.connected
    stream.close()


def test_idle_stream_times_out(scripted):
    relay = scripted()
    stream = ws_stream.connect(relay.url, 10)
    stream.settimeout(0.3)
    with pytest.raises(ws_stream.Timeout):
        stream.recv()
    stream.close()


def _half_a_frame(size=1000):
    """The header of a ``size``-byte text frame and half its payload: a message begun."""
    return Raw(bytes([0x81, 126]) + struct.pack("!H", size) + b"x" * (size // 2))


def test_a_message_stalled_half_way_ends_at_the_stall_bound_not_the_idle_timeout(scripted):
    relay = scripted(on_message=on_ping_req([_half_a_frame()]))
    stream = ws_stream.connect(relay.url, 10)
    stream.settimeout(30)
    stream.stall_timeout = 0.5
    stream.send(json.dumps(["REQ", "x", {}]))
    started = time.monotonic()
    with pytest.raises(ws_stream.StalledMessage):
        stream.recv()
    assert time.monotonic() - started < 5
    stream.close()


def test_a_trickled_message_ends_at_the_stall_bound_although_bytes_keep_coming(scripted):
    relay = scripted()
    stream = ws_stream.connect(relay.url, 10)
    stream.settimeout(0.4)  # each byte arrives well inside the idle timeout
    stream.stall_timeout = 1.0
    wait_until(lambda: relay.connections, timeout=5, what="the session")
    conn = relay.connections[0]
    conn.send_frame(Raw(bytes([0x81, 126]) + struct.pack("!H", 1000)))
    stop = threading.Event()

    def trickle():
        while not stop.is_set() and conn.open:
            conn.send_frame(Raw(b"x"))
            time.sleep(0.1)

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(ws_stream.StalledMessage):
            stream.recv()
        assert 0.9 < time.monotonic() - started < 5
    finally:
        stop.set()
        stream.close()


def test_waiting_between_messages_is_idle_not_stalled(scripted):
    relay = scripted(on_message=on_ping_req([["NOTICE", "whole"]]))
    stream = ws_stream.connect(relay.url, 10)
    stream.settimeout(0.6)
    stream.stall_timeout = 0.2
    stream.send(json.dumps(["REQ", "x", {}]))
    assert json.loads(stream.recv()) == ["NOTICE", "whole"]
    assert json.loads(stream.recv()) == ["EOSE", "x"]
    with pytest.raises(ws_stream.Timeout) as info:
        stream.recv()  # nothing begun: the idle timeout applies, not the stall bound
    assert not isinstance(info.value, ws_stream.StalledMessage)
    stream.close()


def test_a_message_over_the_size_bound_is_a_broken_frame(scripted):
    huge = Raw(bytes([0x81, 127]) + struct.pack("!Q", 64 * 1024 * 1024))
    relay = scripted(on_message=on_ping_req([huge]))
    stream = ws_stream.connect(relay.url, 10)
    stream.send(json.dumps(["REQ", "x", {}]))
    with pytest.raises(ws_stream.BrokenFrame, match="too large"):
        stream.recv()
    stream.close()


def test_messages_before_a_broken_frame_are_returned_before_it_raises(scripted):
    masked = bytes([0x81, 0x82]) + b"abcd" + b"xx"
    relay = scripted(on_message=on_ping_req([["NOTICE", "whole"], Raw(masked)]))
    stream = ws_stream.connect(relay.url, 10)
    stream.send(json.dumps(["REQ", "x", {}]))
    wait_until(lambda: relay.connections and relay.connections[0].subs is not None, timeout=5)
    time.sleep(0.2)  # both frames in our socket: one read takes them together
    assert [json.loads(m) for _, m in stream.recv_burst()] == [["NOTICE", "whole"]]
    with pytest.raises(ws_stream.BrokenFrame, match="masked"):
        stream.recv_burst()
    stream.close()


def test_sockets_gsync_dials_itself_send_small_frames_without_delay(scripted):
    """The handshake connects to the address the SSRF guard checked, on a socket of its own:
    it must set TCP_NODELAY as websocket-client does for the sockets it opens, or a lone
    small frame (a live REQ, a CLOSE) waits for the peer's delayed ACK."""
    import socket

    from gsync.io.handshake import open_websocket
    from gsync.protocol.urls import AddressPolicy

    relay = scripted()
    stream = open_websocket(relay.url, AddressPolicy.parse(f"127.0.0.1:{relay.port}"), 10)
    try:
        assert stream._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        stream.close()


@pytest.mark.parametrize("answer", [
    # a refusal whose body never ends (websocket-client would read it all, copying it
    # at every 16 KB), and a head that never ends
    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\nContent-Length: 4000000000\r\n\r\n",
    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\nX-Pad: ",
])
def test_the_answer_to_an_upgrade_is_read_only_so_far(answer):
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    sent = [0]

    def serve():
        conn, _ = listener.accept()
        conn.recv(65536)
        try:
            conn.sendall(answer)
            while sent[0] < 8 << 20:  # then hang up (an unbounded reader gets it all)
                conn.sendall(b"y" * 65536)
                sent[0] += 65536
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    sock = socket.create_connection(listener.getsockname())
    started = time.process_time()
    with pytest.raises(ws_stream.HandshakeAnswerTooLarge) as info:
        ws_stream.connect(f"ws://127.0.0.1:{listener.getsockname()[1]}", 10, socket=sock)
    assert time.process_time() - started < 1.0
    assert info.value.status == 429 and info.value.headers["retry-after"] == "30"
    sock.close()
    listener.close()


def test_each_frame_of_one_write_has_its_own_mask():
    # RFC 6455 §5.3: a fresh, unpredictable key per frame; send_many draws them in one call.
    import socket
    import types

    ours, theirs = socket.socketpair()
    try:
        stream = ws_stream.WsStream(types.SimpleNamespace(sock=ours))
        texts = [json.dumps(["EVENT", {"n": i, "pad": "x" * (i * 20)}]) for i in range(20)]
        sent = stream.send_many(texts)
        data = b""
        while len(data) < sent:
            data += theirs.recv(65536)
        keys, got, pos = [], [], 0
        while pos < len(data):
            assert data[pos] == 0x81 and data[pos + 1] & 0x80  # final text frame, masked
            length, pos = data[pos + 1] & 0x7F, pos + 2
            if length == 126:
                (length,), pos = struct.unpack("!H", data[pos:pos + 2]), pos + 2
            key, pos = data[pos:pos + 4], pos + 4
            keys.append(key)
            got.append(bytes(b ^ key[i % 4] for i, b in enumerate(data[pos:pos + length])).decode())
            pos += length
        assert got == texts
        assert len(set(keys)) == len(keys)
    finally:
        ours.close()
        theirs.close()


def _nagle_server(rounds: int, gap: float):
    """A websocket server that leaves Nagle's algorithm on (no TCP_NODELAY, the default of
    many relays): a conversation first (each client message answered at once, as a relay
    answers REQs), then per round two small messages ``gap`` apart, as a relay sends two
    live events stored one after the other. Returns (url, thread)."""
    import base64
    import hashlib
    import socket

    from tests.scripted_relay import WS_GUID

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(10)

    def serve():
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn, conn.makefile("rb") as rfile:
            head = list(iter(rfile.readline, b"\r\n"))  # the upgrade request, to its blank line
            key = next(line.split(b":", 1)[1].strip() for line in head
                       if line.lower().startswith(b"sec-websocket-key"))
            accept = base64.b64encode(hashlib.sha1(key + WS_GUID.encode()).digest()).decode()
            conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n").encode())

            def client_message():  # a masked text frame under 126 bytes
                head = rfile.read(2)
                rfile.read(4 + (head[1] & 0x7F))

            for i in range(20 + rounds):
                client_message()
                if i < 20:
                    conn.sendall(_frame(OP_TEXT, b'["NOTICE","talk"]'))
                else:
                    conn.sendall(_frame(OP_TEXT, b'["EVENT","live","first"]'))
                    time.sleep(gap)
                    conn.sendall(_frame(OP_TEXT, b'["EVENT","live","second"]'))
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"ws://127.0.0.1:{listener.getsockname()[1]}", thread


@pytest.mark.skipif(ws_stream.TCP_QUICKACK is None, reason="TCP_QUICKACK is Linux's")
def test_a_message_right_after_another_is_not_held_for_our_delayed_ack():
    """A relay with Nagle's algorithm on sends a second small message only once the first
    is ACKed; a reader that delays its ACK (Linux: 40 ms, on a connection that also sends)
    held every second live event of a pair that long (bench/scale --live: 30-45 ms). The
    stream ACKs each read at once: the second comes the gap after the first."""
    rounds, gap = 7, 0.005
    url, server = _nagle_server(rounds, gap)
    stream = ws_stream.connect(url, 10)
    waits = []
    try:
        for _ in range(20):
            stream.send('["REQ","talk",{}]')
            stream.recv()
        for _ in range(rounds):
            stream.send('["REQ","go",{}]')
            first = stream.recv()
            at = time.monotonic()
            second = first if b"second" in first else stream.recv()
            waits.append(time.monotonic() - at)
            assert b"second" in second
    finally:
        stream.close()
        server.join(10)
    assert sorted(waits)[rounds // 2] < gap + 0.020, waits  # the median; without: 40 ms and more


def test_a_read_that_fills_a_chunk_says_more_may_be_waiting():
    """``drained`` (the own relay's stream pauses between gulps only after a read that
    left nothing waiting, constants.OWN_STREAM_GULP_SECS): False after a read that took a
    whole chunk, True after one that took less."""
    class Sock:
        def __init__(self, chunks):
            self.chunks = list(chunks)

        def recv(self, n):
            assert n == ws_stream.RECV_CHUNK
            return self.chunks.pop(0)

        def gettimeout(self):
            return None

    class Ws:
        def __init__(self, chunks):
            self.sock = Sock(chunks)

    full = _frame(OP_TEXT, b"x" * (ws_stream.RECV_CHUNK - 10))  # 10: a 64-bit length's header
    assert len(full) == ws_stream.RECV_CHUNK
    stream = ws_stream.WsStream(Ws([full, _frame(OP_TEXT, b"y")]), max_message=2 * ws_stream.RECV_CHUNK)
    assert stream.recv_burst() == [(OP_TEXT, b"x" * (ws_stream.RECV_CHUNK - 10))]
    assert stream.drained is False
    assert stream.recv_burst() == [(OP_TEXT, b"y")]
    assert stream.drained is True
