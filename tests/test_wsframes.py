"""gsync/protocol/wsframes.py against websocket-client's own frame code (ABNF)."""
import struct

import pytest
import websocket
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.protocol import wsframes
from gsync.protocol.wsframes import FrameDecoder, FrameError


def server_frame(opcode, payload: bytes, fin=True, rsv1=0) -> bytes:
    """A frame as a server sends it: unmasked (websocket-client builds it)."""
    frame = websocket.ABNF(int(fin), rsv1, 0, 0, opcode, 0, payload)
    return frame.format()


def decode_all(data: bytes, cuts=(), max_message=1 << 20):
    decoder = FrameDecoder(max_message)
    out, start = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        decoder.feed(data[start:cut])
        start = cut
        while (message := decoder.next_message()) is not None:
            out.append(message)
    return out, decoder


payloads = st.binary(max_size=70_000)


@settings(max_examples=150, deadline=None)
@given(st.lists(payloads, min_size=1, max_size=6), st.data())
def test_messages_survive_any_split_of_the_stream(bodies, data):
    stream = b"".join(server_frame(wsframes.OP_TEXT, b) for b in bodies)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    out, decoder = decode_all(stream, cuts)
    assert out == [(wsframes.OP_TEXT, b) for b in bodies]
    assert decoder.buffered == 0


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 200_000])
def test_every_length_encoding(size):
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert decode_all(server_frame(wsframes.OP_BINARY, body))[0] == [(wsframes.OP_BINARY, body)]


def test_fragments_are_joined_and_control_frames_may_come_between():
    stream = (
        server_frame(wsframes.OP_TEXT, b'["EVE', fin=False)
        + server_frame(wsframes.OP_PING, b"p")
        + server_frame(wsframes.OP_CONTINUATION, b'NT",', fin=False)
        + server_frame(wsframes.OP_CONTINUATION, b'"x"]')
        + server_frame(wsframes.OP_CLOSE, struct.pack("!H", 1000))
    )
    out, _ = decode_all(stream, cuts=range(0, len(stream), 3))
    assert out == [
        (wsframes.OP_PING, b"p"),
        (wsframes.OP_TEXT, b'["EVENT","x"]'),
        (wsframes.OP_CLOSE, struct.pack("!H", 1000)),
    ]


def test_incomplete_frame_waits_for_more_bytes():
    frame = server_frame(wsframes.OP_TEXT, b"x" * 300)
    out, decoder = decode_all(frame[:200])
    assert out == [] and decoder.buffered == 200


@pytest.mark.parametrize(
    "stream, reason",
    [
        # a client must refuse masked frames from a server
        (websocket.ABNF(1, 0, 0, 0, wsframes.OP_TEXT, 1, b"hi").format(), "masked"),
        (server_frame(wsframes.OP_TEXT, b"hi", rsv1=1), "reserved"),
        (server_frame(wsframes.OP_PING, b"x" * 126), "control"),
        (server_frame(wsframes.OP_PING, b"x", fin=False), "control"),
        (bytes([0x83, 0x00]), "opcode"),
        (server_frame(wsframes.OP_CONTINUATION, b"x"), "continuation"),
        (server_frame(wsframes.OP_TEXT, b"a", fin=False) + server_frame(wsframes.OP_TEXT, b"b"),
         "inside"),
        # a huge length is refused from the header, before any of it is buffered
        (bytes([0x81, 127]) + struct.pack("!Q", 1 << 40), "too large"),
        (server_frame(wsframes.OP_TEXT, b"x", fin=False)
         + server_frame(wsframes.OP_CONTINUATION, b"y" * 2000), "too large"),
    ],
    ids=lambda value: value if isinstance(value, str) else "stream",  # a random mask: not in the id
)
def test_broken_streams_raise(stream, reason):
    with pytest.raises(FrameError, match=reason):
        decode_all(stream, max_message=1000)


def unmask_client_frame(frame: bytes):
    """Parse what we send the way a server does."""
    first, second = frame[0], frame[1]
    assert first & 0x80 and second & 0x80  # final, masked
    length, offset = second & 0x7F, 2
    if length == 126:
        (length,), offset = struct.unpack_from("!H", frame, 2), 4
    elif length == 127:
        (length,), offset = struct.unpack_from("!Q", frame, 2), 10
    key = frame[offset:offset + 4]
    body = frame[offset + 4:]
    assert len(body) == length
    return first & 0x0F, bytes(b ^ key[i % 4] for i, b in enumerate(body))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=70_000))
def test_client_frames_are_masked_and_round_trip(text):
    opcode, body = unmask_client_frame(wsframes.encode_text(text))
    assert opcode == wsframes.OP_TEXT
    assert body.decode("utf-8") == text


def test_client_frame_matches_websocket_client_byte_for_byte():
    key = b"\x01\x02\x03\x04"
    for text in ["", "hi", "x" * 126, "é" * 40_000]:
        theirs = websocket.ABNF.create_frame(text, websocket.ABNF.OPCODE_TEXT)
        theirs.get_mask_key = lambda n: key
        assert wsframes.encode_text(text, key) == theirs.format()


def test_fresh_mask_per_frame():
    assert wsframes.encode_text("same") != wsframes.encode_text("same")
