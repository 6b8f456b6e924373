"""RFC 6455 frames as a client sees them: decoding what a server sends, encoding what we send.

Pure. websocket-client does the opening handshake; after that, gsync reads and writes frames
itself, because websocket-client reads each frame with two or three socket calls (header,
length, payload) and writes each message with one. A relay sends thousands of small EVENT
frames in a burst: ``FrameDecoder`` takes whatever one ``recv`` returned and yields every
complete message in it, and ``encode_text`` lets a writer join many frames into one send.

A server's frames must not be masked, must not set RSV bits (we negotiate no extension),
and control frames must be short and unfragmented. Anything else, and any message over
``max_message`` bytes, raises ``FrameError``: the peer is broken or hostile, and the caller
closes the connection (a byte stream cannot be resynchronised).
"""
from __future__ import annotations

import os
import struct

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

_DATA_OPCODES = (OP_TEXT, OP_BINARY)
_CONTROL_OPCODES = (OP_CLOSE, OP_PING, OP_PONG)
_COMPACT_AT = 1 << 16  # drop consumed bytes from the buffer once this many have piled up


class FrameError(Exception):
    """The byte stream breaks RFC 6455 (or our size bound); the connection must close."""


class FrameDecoder:
    """Feed it bytes as they arrive; ``next_message`` returns ``(opcode, payload)`` for each
    complete message (data messages reassembled from fragments, control frames as they
    come), or None when more bytes are needed."""

    def __init__(self, max_message: int):
        self.max_message = max_message
        self._buf = bytearray()
        self._pos = 0
        self._fragments: list[bytes] = []
        self._fragment_opcode: int | None = None
        self._fragment_size = 0

    def feed(self, data: bytes) -> None:
        if self._pos == len(self._buf):
            # Everything read so far is consumed: start a fresh buffer, because a bytearray
            # keeps the capacity of its largest burst (a few hundred KB on each of hundreds
            # of idle connections).
            self._buf = bytearray(data)
            self._pos = 0
            return
        if self._pos >= _COMPACT_AT:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    @property
    def mid_message(self) -> bool:
        """Part of a message has arrived, not all of it (after ``next_message`` said None)."""
        return self.buffered > 0 or self._fragment_opcode is not None

    def next_message(self) -> tuple[int, bytes] | None:
        while True:
            frame = self._next_frame()
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode in _CONTROL_OPCODES:
                return opcode, payload
            if opcode == OP_CONTINUATION:
                if self._fragment_opcode is None:
                    raise FrameError("continuation without a first fragment")
            elif self._fragment_opcode is not None:
                raise FrameError("new message inside a fragmented one")
            elif fin:
                return opcode, payload
            else:
                self._fragment_opcode = opcode
            self._fragment_size += len(payload)
            if self._fragment_size > self.max_message:
                raise FrameError("message too large")
            self._fragments.append(payload)
            if fin:
                message = self._fragment_opcode, b"".join(self._fragments)
                self._fragments, self._fragment_opcode, self._fragment_size = [], None, 0
                return message

    def _next_frame(self) -> tuple[bool, int, bytes] | None:
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if available < 2:
            return None
        first, second = buf[pos], buf[pos + 1]
        if first & 0x70:
            raise FrameError("reserved bits set")
        if second & 0x80:
            raise FrameError("masked frame from a server")
        fin, opcode, length = bool(first & 0x80), first & 0x0F, second & 0x7F
        header = 2
        if length == 126:
            if available < 4:
                return None
            (length,) = struct.unpack_from("!H", buf, pos + 2)
            header = 4
        elif length == 127:
            if available < 10:
                return None
            (length,) = struct.unpack_from("!Q", buf, pos + 2)
            header = 10
        if opcode in _CONTROL_OPCODES:
            if not fin or length > 125:
                raise FrameError("fragmented or long control frame")
        elif opcode not in _DATA_OPCODES and opcode != OP_CONTINUATION:
            raise FrameError(f"unknown opcode {opcode}")
        if length > self.max_message:
            raise FrameError("message too large")
        end = pos + header + length
        if len(buf) < end:
            return None
        payload = bytes(buf[pos + header:end])
        self._pos = end
        return fin, opcode, payload


def _mask(key: bytes, payload: bytes) -> bytes:
    n = len(payload)
    if not n:
        return payload
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


def encode(opcode: int, payload: bytes, mask_key: bytes | None = None) -> bytes:
    """One final client frame: masked, as RFC 6455 requires of clients."""
    key = mask_key if mask_key is not None else os.urandom(4)
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return header + key + _mask(key, payload)


def encode_text(text: str, mask_key: bytes | None = None) -> bytes:
    return encode(OP_TEXT, text.encode("utf-8"), mask_key)
