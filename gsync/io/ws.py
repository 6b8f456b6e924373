"""Opening a websocket the way every gsync connection does, and the frames over it.

websocket-client performs the opening handshake (over a socket we may have connected
ourselves, see ``handshake``); after that, ``WsStream`` reads and writes frames with
``protocol.wsframes``: one ``recv`` call for a whole burst of EVENT frames rather than two or
three per frame, and one ``send`` for many frames. Pings are answered, pongs ignored; a
close frame or a broken frame ends the stream.

Two read bounds: ``settimeout`` (nothing at all arrives: idle), and ``stall_timeout``
(a message has begun and is not finished after that long spent waiting for the rest). The
second catches a peer that stops half-way through a frame, or trickles one byte at a time so
that the idle timeout never fires; time the caller spends not reading does not count.
"""
from __future__ import annotations

import os
import socket
import time

import gevent
import gevent.select
import websocket

from ..constants import (
    CONTROL_FLOOD_FRAMES,
    CONTROL_FLOOD_WINDOW_SECS,
    MAX_FRAME_BYTES,
    MAX_HANDSHAKE_ANSWER_BYTES,
)
from ..protocol import wsframes

RECV_CHUNK = 256 * 1024
YIELD_SECS = 0.0005  # between reads of a chunk that completed no message
# Linux only: ACK what was read at once, instead of up to 40 ms later (delayed ACK). A peer
# with Nagle's algorithm on (a relay that never sets TCP_NODELAY on its sockets: a Rust or
# Python server's default) holds its next small message until the last one is ACKed, so a
# second live event sent right after a first waited for our delayed ACK: 30-45 ms added
# to every such pair (bench/scale --live). The setting does not last (the kernel goes back
# to delaying as the connection turns interactive), so it is set again after every read.
TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", None)

# What a closed or broken stream raises, and what an idle one does (both websocket-client's,
# so callers catch one family whichever layer noticed).
ConnectionClosed = websocket.WebSocketConnectionClosedException
Timeout = websocket.WebSocketTimeoutException


class StalledMessage(Timeout):
    """A message begun was not finished within ``stall_timeout`` seconds of reading."""


class BrokenFrame(ConnectionClosed):
    """Bytes that break RFC 6455, or a message over the size bound: the stream is lost."""


class WsStream:
    """A connected client websocket. Not for two greenlets writing at once: every gsync
    connection has one writer (the reader only answers pings, with a short frame)."""

    def __init__(self, ws: websocket.WebSocket, max_message: int = MAX_FRAME_BYTES):
        self._ws = ws
        self._sock = ws.sock
        self._decoder = wsframes.FrameDecoder(max_message)
        self.connected = True
        self.stall_timeout: float | None = None  # None: a half message may wait forever
        self._idle_timeout: float | None = ws.sock.gettimeout()
        self._stalled_for = 0.0  # seconds spent waiting for the rest of the current message
        self._pong_due: bytes | None = None  # the last ping's payload, not yet answered
        self.reads = 0  # socket reads that returned (a pong, even): is the peer there?
        self.drained = True  # the last read took less than a chunk: nothing more was waiting
        self._controls = 0  # pings and pongs since the last message (in this window)
        self._controls_since = 0.0
        self._quickack = TCP_QUICKACK is not None

    # -- reading

    def recv_burst(self) -> list[tuple[int, bytes]]:
        """Every data message already received, at least one (waiting for it like
        ``recv_message``). A close message ends the list."""
        messages = [self.recv_message()]
        while messages[-1][0] != wsframes.OP_CLOSE:
            try:
                message = self._buffered_message()
            except BrokenFrame:
                break  # the messages before it are whole: the next call raises again
            if message is None:
                break
            messages.append(message)
        return messages

    def _buffered_message(self) -> tuple[int, bytes] | None:
        """The next data message if it is complete in the buffer, without reading."""
        while True:
            try:
                message = self._decoder.next_message()
            except wsframes.FrameError as exc:
                self.connected = False
                raise BrokenFrame(f"bad frame: {exc}") from None
            if message is None:
                self._answer_ping()
                return None
            opcode, payload = message
            if opcode == wsframes.OP_PING or opcode == wsframes.OP_PONG:
                self._count_control()
                if opcode == wsframes.OP_PING:
                    self._pong_due = payload  # only the latest is answered (RFC 6455 §5.5.3)
                continue
            self._controls = 0
            self._answer_ping()
            return message

    def _count_control(self) -> None:
        now = time.monotonic()
        if now - self._controls_since > CONTROL_FLOOD_WINDOW_SECS:
            self._controls, self._controls_since = 0, now
        self._controls += 1
        if self._controls > CONTROL_FLOOD_FRAMES:
            self.connected = False
            raise BrokenFrame(f"over {CONTROL_FLOOD_FRAMES} pings and pongs with no message between")

    def _answer_ping(self) -> None:
        if self._pong_due is not None:
            payload, self._pong_due = self._pong_due, None
            self._sock.sendall(wsframes.encode(wsframes.OP_PONG, payload))

    def recv_message(self) -> tuple[int, bytes]:
        """The next data message ``(opcode, payload)``; ``(OP_CLOSE, payload)`` when the
        peer closes. Raises ``Timeout`` after the socket timeout with nothing complete,
        ``ConnectionClosed`` on EOF or a broken frame."""
        read = False
        while True:
            message = self._buffered_message()
            if message is not None:
                if message[0] != wsframes.OP_CLOSE:
                    self._stalled_for = 0.0
                return message
            if read:
                # A whole chunk and still no message (pings, or one large message coming
                # in): let the other greenlets run. A socket that always has data never
                # blocks, so a relay streaming pings would otherwise hold the process.
                # (sleep(0) is not enough: it resumes us before the loop polls anyone's
                # sockets or timers.)
                gevent.sleep(YIELD_SECS)
            read = True
            if self.stall_timeout is not None and self._decoder.mid_message:
                chunk = self._recv_rest_of_message()
            else:
                chunk = self._recv()
            if not chunk:
                self.connected = False
                raise ConnectionClosed("connection closed by peer")
            self._decoder.feed(chunk)

    def _recv(self) -> bytes:
        try:
            chunk = self._sock.recv(RECV_CHUNK)
            self.reads += 1
            self.drained = len(chunk) < RECV_CHUNK
            if self._quickack and chunk:
                self._ack_now()
            return chunk
        except TimeoutError:  # socket.timeout
            raise Timeout("timed out") from None
        except OSError as exc:
            if "timed out" in str(exc):  # gevent's SSL sockets time out with an SSLError
                raise Timeout("timed out") from None
            self.connected = False
            raise ConnectionClosed(f"recv failed: {exc}") from None

    def _ack_now(self) -> None:
        """Re-arm TCP_QUICKACK (see the constant): the ACK for what was just read goes now.
        A socket that refuses it (not TCP) is not asked again."""
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        except (OSError, AttributeError):
            self._quickack = False

    def _recv_rest_of_message(self) -> bytes:
        """``_recv`` while a message is unfinished: waits at most what is left of the stall
        bound (and never longer than the idle timeout)."""
        left = self.stall_timeout - self._stalled_for
        if left <= 0:
            raise StalledMessage(f"message unfinished after {self.stall_timeout:g} s")
        idle = self._idle_timeout
        self._sock.settimeout(left if idle is None else min(left, idle))
        started = time.monotonic()
        try:
            return self._recv()
        except Timeout:
            if idle is None or left < idle:
                raise StalledMessage(f"message unfinished after {self.stall_timeout:g} s") from None
            raise
        finally:
            self._stalled_for += time.monotonic() - started
            self._sock.settimeout(idle)

    def recv(self) -> bytes:
        """The next text message's bytes (binary messages are skipped: Nostr is text).
        Raises ``ConnectionClosed`` when the peer closes."""
        while True:
            opcode, payload = self.recv_message()
            if opcode == wsframes.OP_CLOSE:
                self.connected = False
                raise ConnectionClosed("closed by peer")
            if opcode == wsframes.OP_TEXT:
                return payload

    # -- writing

    def send(self, text: str) -> None:
        self._sock.sendall(wsframes.encode_text(text))

    def send_many(self, texts) -> int:
        """Several text messages in one socket write; returns the bytes sent."""
        texts = list(texts)
        keys = os.urandom(4 * len(texts))  # a fresh random mask per frame, drawn at once
        data = b"".join(wsframes.encode_text(t, keys[4 * i:4 * i + 4]) for i, t in enumerate(texts))
        self._sock.sendall(data)
        return len(data)

    def ping(self) -> None:
        self._sock.sendall(wsframes.encode(wsframes.OP_PING, b""))

    # -- the socket

    def settimeout(self, timeout: float | None) -> None:
        self._idle_timeout = timeout
        self._sock.settimeout(timeout)

    @property
    def timeout(self) -> float | None:
        """What ``settimeout`` set last: how long a read waits for a message."""
        return self._idle_timeout

    def peer_closed(self) -> bool:
        """Has the peer closed or reset the connection, or begun to close it, as far as the
        socket tells without waiting or reading? (A handshake's socket, before its session
        begins: nothing reads it until then.) The first byte waiting is peeked at, on a
        duplicate of the descriptor, at the TCP level, never taken: none at all (end of
        stream), or a close frame's first byte (plain ws; under TLS any byte waiting says
        the peer is still there)."""
        if not self.connected:
            return True
        try:
            readable, _, _ = gevent.select.select([self._sock], [], [], 0)
            if not readable:
                return False
            with socket.socket(fileno=os.dup(self._sock.fileno())) as dup:
                dup.setblocking(False)
                first = dup.recv(1, socket.MSG_PEEK)
            return first in (b"", bytes([0x80 | wsframes.OP_CLOSE]))
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    @property
    def peer(self) -> tuple[int, tuple]:
        """(address family, socket address) this stream is connected to: for a remote relay,
        the address the SSRF guard checked, so NIP-11 can be fetched from the same one."""
        return self._sock.family, self._sock.getpeername()

    def close(self, timeout: float = 1) -> None:
        """Send a close frame and shut the socket (websocket-client waits up to ``timeout``
        for the peer's close frame)."""
        self.connected = False
        try:
            self._ws.close(timeout=timeout)
        except Exception:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


class HandshakeAnswerTooLarge(websocket.WebSocketException):
    """The relay's answer to the upgrade went on past ``MAX_HANDSHAKE_ANSWER_BYTES``.
    ``status`` and ``headers`` (names lower-cased) are what its head said, when it got that
    far: a refusal with an endless body still tells its status and its Retry-After."""

    def __init__(self, head: bytes):
        super().__init__(f"handshake answer over {MAX_HANDSHAKE_ANSWER_BYTES} bytes")
        self.status, self.headers = _status_and_headers(head)


def _status_and_headers(head: bytes) -> tuple[int | None, dict[str, str]]:
    lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() and len(parts[1]) == 3 else None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


class _BoundedReads:
    """A socket for the length of the opening handshake: the relay's answer is read to
    ``limit`` bytes at most (kept, to tell what it was), then ``HandshakeAnswerTooLarge``.
    Everything else is the socket's own."""

    def __init__(self, sock, limit: int):
        self._sock = sock
        self._head = bytearray()
        self._limit = limit

    def recv(self, bufsize: int) -> bytes:
        data = self._sock.recv(min(bufsize, self._limit + 1 - len(self._head)))
        self._head += data
        if len(self._head) > self._limit:
            raise HandshakeAnswerTooLarge(bytes(self._head))
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


def connect(url: str, timeout: float, **options) -> WsStream:
    """Handshake with websocket-client (``socket=`` an already connected socket, as the
    SSRF-checked handshake passes), then hand the socket to a ``WsStream``.

    No redirect is followed (``redirect_limit=0``: a 3xx answer is an error). websocket-client
    would otherwise dial the ``Location`` itself, resolving a name nobody checked. On a
    socket of ours the relay's answer is read to ``MAX_HANDSHAKE_ANSWER_BYTES`` at most.
    """
    sock = options.get("socket")
    if sock is not None:
        options["socket"] = _BoundedReads(sock, MAX_HANDSHAKE_ANSWER_BYTES)
    ws = websocket.create_connection(
        url, timeout=timeout, enable_multithread=False, skip_utf8_validation=True,
        redirect_limit=0, **options
    )
    if sock is not None:
        ws.sock = sock  # upgraded: frames are read from the socket itself, unbounded
    return WsStream(ws)
