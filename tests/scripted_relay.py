"""A scriptable websocket relay for misbehaviour no real relay produces.

A minimal RFC 6455 server on raw sockets and threads (no dependency beyond gsync's own
protocol modules), run in-process by a test on a free 127.0.0.1 port:

    relay = ScriptedRelay(events, page_size=100).start()
    ...                                  # relay.url, relay.port
    relay.broadcast(event)               # live: stored, and sent to matching open subs
    relay.received                       # every client frame, decoded, in arrival order
    relay.sent_count(event_id)           # how many EVENT frames carried that event to clients
    relay.stop()

What it does by default is plain NIP-01: ``REQ`` is answered from the store, per filter the
newest events first, at most ``page_size`` per filter (and at most the filter's ``limit``;
``limit: 0`` sends nothing stored), then ``EOSE``; ``CLOSE`` ends a subscription; ``EVENT``
from the client is stored and answered with ``OK`` (one already stored: ``OK`` true,
``duplicate:``, as relays say it, and not sent to subscriptions again). It never serves NIP-11 (an HTTP GET
without an upgrade gets ``404``) unless given a document.

Knobs for misbehaviour:

- ``extra_frames_for_req(relay, conn, sub_id, filters) -> frames``: frames injected into a
  subscription's answer, after the stored events and before ``EOSE`` (forged events, junk,
  events that match no filter). ``filters`` are parsed ``Filter`` objects. A frame is a
  ``str`` (sent as a text frame as is), a ``list``/``dict`` (JSON-encoded text frame),
  ``bytes`` (a binary frame) or ``Raw(bytes)`` (written to the socket verbatim).
- ``hang_handshake=True``: accept the TCP connection, read the HTTP upgrade request, never
  answer it (until the client hangs up or the relay stops).
- ``handshake_gauge``: a ``HandshakeGauge`` shared by several relays. Every accepted
  connection counts as a pending handshake until its HTTP request is answered (or the client
  hangs up), so a test can assert how many handshakes a client had in flight at once across
  many relays. Each relay gets its own gauge when none is given.
- ``negentropy``: how ``NEG-OPEN`` is met: ``"err"`` (``NEG-ERR``, the default), ``"ignore"``
  (no answer at all), ``"notice"`` (a ``NOTICE`` about negentropy), ``"plain-notice"`` (a
  ``NOTICE`` of ``neg_err_reason`` as it is, naming nothing), ``"serve"`` (real NIP-77
  over the store, by gsync's pure negentropy server), or a handler object or
  callable ``handler(relay, conn, message) -> frames`` that gets every ``NEG-OPEN``,
  ``NEG-MSG`` and ``NEG-CLOSE`` (the hook for a real NIP-77 implementation).
- ``on_message(relay, conn, message) -> frames | None``: sees every decoded client message
  first; returning anything other than ``None`` means "handled" (its frames are sent).
- ``answer_close``: answer ``CLOSE`` with ``CLOSED`` as LocalRelay does.
- ``nip11``: a dict served as the NIP-11 document.
- ``req_cap``: at most this many stored events per REQ in total, all its filters together
  (the newest of the union), as relays that run one query per REQ do; ``page_size`` still
  caps each filter. Neither is said in NIP-11.
- ``until_exclusive``: a filter's ``until`` excludes its own second, as some relays read it;
  ``since_exclusive``: its ``since`` too (stored events; live ones match as written).
- ``ignores_until``: a filter's ``until`` is not read at all (a page past the first brings the
  newest again).
- ``limit_zero_unlimited``: ``limit: 0`` reads as no limit (a live REQ brings stored events too).
- ``oldest_first``: a filter without a ``limit`` gets its oldest events, oldest first (at most
  ``page_size``), and a REQ's answer is its filters' answers in turn, as nostream serves
  (``LIMIT 500 ORDER BY created_at ASC``); one with a limit, its newest, as NIP-01 says.
- ``query_budget=(events, secs)``: a query stopped by a time budget: a REQ whose answer has
  more than ``events`` stored events gets only the newest ``events`` of it, after ``secs``.
  ``events`` may be a list, taken in turn by successive REQs (a budget reaches further on
  some queries than on others).
- ``first_cut_to_nothing=(secs, kind)``: the first REQ whose answer has a stored event of
  ``kind`` runs out of its time budget before the first of them: nothing, its EOSE after
  ``secs`` (a cold query).
- ``refuse_upgrades``: answers for the first websocket upgrades, in turn, instead of ``101``:
  ``(status, headers)`` or ``(status, headers, body_bytes)`` (the body may be a generator
  of chunks, sent until the client hangs up); upgrades after them are accepted.
  ``upgrade_times`` has the ``time.monotonic()`` of every upgrade request.
- ``redirect_to``: answer every websocket upgrade with ``301`` to that URL;
  ``nip11_redirect_to``: answer every plain HTTP GET (NIP-11) with ``302`` to that URL.
- ``max_message=(bytes, how)``: a client message longer than ``bytes`` ends the session, as
  websocket servers with a read limit do: ``how`` is ``"close"`` (a close frame with status
  1009, "message too big", then the socket closes) or ``"drop"`` (the socket closes, nothing
  said). ``oversized`` lists the sizes of the messages that did so.
- ``hold_nip11``: a ``threading.Event``: every plain HTTP GET (gsync's NIP-11 fetch, which
  comes after its websocket upgrade) waits for it before it is answered (at most 30 s), so a
  test holds a handshake open, its socket upgraded, until it says so; ``nip11_held`` is set
  when the first such GET is waiting.
- ``answers_one_filter``: ``"first"`` or ``"last"``: a REQ's stored answer is that filter's
  alone, the others dropped without a word (ORLY before October 2025 kept the last filter's
  answer; minimal relays read ``filters[0]``); live events still match every filter.
- ``reads_filters``: N: the first N filters of a REQ are read (-N: the last N), the rest
  dropped without a word, its stored answer and its live subscription alike (a
  ``max_filters`` a relay enforces and never publishes).
- ``tag_values_cap=(n, how)``: a filter holding more than ``n`` tag values in all (its
  tags' lists together) is not queried, as relays on an SQL event store do (fiatjaf's
  eventstore: ``QueryTagsLimit``, 10 by default on sqlite3): ``how`` is ``"notice"`` (a
  ``NOTICE`` "too many tag values" for it, the REQ's other filters answered, one ``EOSE``:
  khatru's handling of a query error) or ``"silent"`` (nothing for it, no word: the older
  store's empty query); its live subscription still matches it (in memory), and a filter of
  ``limit: 0`` is not queried at all (khatru).
- ``drops_limited_live``: once a REQ's stored events are sent, each filter whose ``limit``
  they reached (``limit: 0`` always) is dropped from it without a word, the REQ with its last
  (ORLY's handle-req.go since October 2025); live events match what is left.
- ``host``: the loopback address to listen on (default ``127.0.0.1``; all of 127.0.0.0/8 is
  loopback on Linux).

``handshake_gauge.total`` counts every TCP connection the relay accepted, upgraded or not.
"""
from __future__ import annotations

import base64
import hashlib
import itertools
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gsync.protocol.event import Event, EventError, parse_event
from gsync.protocol.filters import Filter
from gsync.protocol.negentropy import NegentropyServer, Storage
from gsync.sim.relay import filter_from_json

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_HTTP_REQUEST = 64 * 1024
MAX_FRAME = 16 * 1024 * 1024

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


@dataclass(frozen=True)
class Raw:
    """Bytes written to the socket as they are: not even a frame header."""

    data: bytes


class HandshakeGauge:
    """Connections accepted whose opening HTTP request is not answered yet, across relays.

    ``max`` is the most ever pending at once. A healthy relay leaves the gauge before it
    writes its answer (so a client that moves on cannot overlap itself); a hanging relay
    leaves it when the client hangs up. Threads notice a hang-up a little late, so before
    counting a new connection the gauge first looks (without blocking) for pending ones
    whose client has already closed: a client that closes one attempt and then dials the
    next is never counted twice. ``intervals`` keeps one record per connection (relay port,
    monotonic enter and leave times, how it ended) for diagnosing a failure.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.current = 0
        self.max = 0
        self.total = 0
        self.history: list[tuple[float, int]] = []  # (monotonic time, pending after change)
        self.intervals: list[dict] = []
        self._pending: list[tuple[dict, socket.socket | None]] = []

    def enter(self, port: int = 0, sock: socket.socket | None = None) -> dict:
        with self._lock:
            for record, pending_sock in list(self._pending):
                if pending_sock is not None and _peer_closed(pending_sock):
                    self._leave_locked(record, "client hung up")
            self.current += 1
            self.total += 1
            self.max = max(self.max, self.current)
            now = time.monotonic()
            self.history.append((now, self.current))
            record = {"port": port, "enter": now, "leave": None, "how": None}
            self.intervals.append(record)
            self._pending.append((record, sock))
            return record

    def leave(self, record: dict | None = None, how: str = "") -> None:
        with self._lock:
            if record is not None and record["leave"] is not None:
                return  # already counted out by a sweep
            self._leave_locked(record, how)

    def _leave_locked(self, record: dict | None, how: str) -> None:
        self.current -= 1
        now = time.monotonic()
        self.history.append((now, self.current))
        if record is not None:
            record["leave"], record["how"] = now, how
            self._pending = [(r, s) for r, s in self._pending if r is not record]

    def pending_at_max(self) -> list[dict]:
        """The connections pending at the first moment the gauge reached ``max``."""
        with self._lock:
            for t, n in self.history:
                if n == self.max:
                    return [r for r in self.intervals
                            if r["enter"] <= t and (r["leave"] is None or r["leave"] > t)]
        return []

    def describe(self) -> str:
        if not self.history:
            return "no connections"
        t0 = self.history[0][0]
        rows = [
            f"port {r['port']}: {r['enter'] - t0:.3f}s → "
            + (f"{r['leave'] - t0:.3f}s ({r['how']})" if r["leave"] is not None else "still pending")
            for r in self.pending_at_max()
        ]
        return f"max {self.max} pending at once:\n" + "\n".join(rows)


class _Closed(Exception):
    pass


def _peer_closed(sock: socket.socket) -> bool:
    """True if the client has closed (EOF or reset is queued); never blocks."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _unmask(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if not n:
        return data
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def _frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    head = bytearray([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head.append(n)
    elif n < 1 << 16:
        head.append(126)
        head += struct.pack("!H", n)
    else:
        head.append(127)
        head += struct.pack("!Q", n)
    return bytes(head) + payload


def _redirect(status: int, location: str) -> bytes:
    reason = {301: "Moved Permanently", 302: "Found"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\nLocation: {location}\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n").encode()


def _event_dict(event) -> dict:
    return event.to_dict() if hasattr(event, "to_dict") else dict(event)


class Connection:
    """One client session (after the upgrade). ``subs`` maps sub id → parsed filters."""

    def __init__(self, relay: ScriptedRelay, conn_id: int, sock: socket.socket, rfile):
        self.relay = relay
        self.id = conn_id
        self.sock = sock
        self.rfile = rfile
        self.subs: dict[str, list[Filter]] = {}
        self.open = True
        self.opened_at = time.monotonic()
        self.pongs: list[bytes] = []  # payloads of the client's pong frames
        self._send_lock = threading.Lock()

    # -- sending (any thread) ------------------------------------------------------------

    def send_frame(self, frame) -> None:
        if isinstance(frame, Raw):
            data = frame.data
        elif isinstance(frame, (bytes, bytearray)):
            data = _frame(OP_BINARY, bytes(frame))
        elif isinstance(frame, str):
            data = _frame(OP_TEXT, frame.encode("utf-8", "surrogatepass"))
        else:
            data = _frame(OP_TEXT, json.dumps(frame, ensure_ascii=False).encode("utf-8"))
        self._write(data)

    def send_frames(self, frames: Iterable | None) -> None:
        for frame in frames or ():
            self.send_frame(frame)

    def send(self, *message) -> None:
        """A relay message as JSON: ``conn.send("NOTICE", "hello")``."""
        if message[0] == "EVENT" and len(message) >= 3 and isinstance(message[2], dict):
            self.relay.count_sent(message[2].get("id"))
        self.send_frame(list(message))

    def _write(self, data: bytes) -> None:
        if not self.open:
            return
        with self._send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.open = False

    def close(self, code: int = 1000) -> None:
        """A clean websocket close, then the socket."""
        if self.open:
            self._write(_frame(OP_CLOSE, struct.pack("!H", code)))
        self.drop()

    def drop(self) -> None:
        """Hang up without a close frame, as a crashed relay would."""
        self.open = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- reading (its own thread) --------------------------------------------------------

    def _read(self, n: int) -> bytes:
        data = self.rfile.read(n) if n else b""
        if len(data) < n:
            raise _Closed()
        return data

    def read_message(self) -> tuple[int, bytes]:
        """The next data message (text or binary), answering control frames on the way."""
        parts: list[bytes] = []
        first_opcode = None
        while True:
            b1, b2 = self._read(2)
            fin, opcode = b1 & 0x80, b1 & 0x0F
            masked, n = b2 & 0x80, b2 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            if n > MAX_FRAME:
                raise _Closed()
            mask = self._read(4) if masked else b""
            payload = self._read(n)
            if masked:
                payload = _unmask(payload, mask)
            if opcode == OP_PING:
                self._write(_frame(OP_PONG, payload))
                continue
            if opcode == OP_PONG:
                self.pongs.append(payload)
                continue
            if opcode == OP_CLOSE:
                self._write(_frame(OP_CLOSE, payload[:2]))
                raise _Closed()
            if opcode != OP_CONT:
                first_opcode, parts = opcode, []
            parts.append(payload)
            if fin and first_opcode is not None:
                return first_opcode, b"".join(parts)


class _NegentropyRefusal:
    """The default NIP-77 behaviour: NEG-OPEN gets NEG-ERR, a NOTICE, or nothing."""

    def __init__(self, mode: str, reason: str):
        if mode not in ("err", "ignore", "notice", "plain-notice"):
            raise ValueError(f"negentropy mode {mode!r}")
        self.mode = mode
        self.reason = reason

    def __call__(self, relay, conn, message):
        if message[0] != "NEG-OPEN" or self.mode == "ignore":
            return []
        sub = message[1] if len(message) > 1 else ""
        if self.mode == "err":
            return [["NEG-ERR", sub, self.reason]]
        if self.mode == "plain-notice":  # primal.net, purplepag.es: their own words
            return [["NOTICE", self.reason]]
        return [["NOTICE", f"ERROR: negentropy error: {self.reason}"]]


class Nip77Serve:
    """NIP-77 over the relay's store: a ``NegentropyServer`` per open subscription. Counts
    NEG-OPENs (``opened``) and keeps their filters, in order (``filters``).

    ``max_results``: a NEG-OPEN whose filter matches more stored events is refused as strfry
    refuses past its ``maxSyncEvents``: ``["NEG-ERR", sub, "blocked: too many query results",
    max_results]`` (without the number when not ``report_cap``); ``refused`` counts those.
    ``unlisted``: ids stored and never advertised (an index that lags). ``silent_cap``: a
    filter's newest this many events only are compared, and nothing said of the rest (khatru
    relays whose store caps every query, a negentropy session's too)."""

    def __init__(self, max_results: int | None = None, report_cap: bool = True, unlisted=(),
                 silent_cap: int | None = None):
        self.unlisted = set(unlisted)
        self.silent_cap = silent_cap
        self.opened = 0
        self.refused = 0
        self.max_results = max_results
        self.report_cap = report_cap
        self.filters: list[Filter] = []
        self._sessions: dict[tuple[int, str], Any] = {}

    def __call__(self, relay, conn, message):
        kind, sub = message[0], message[1] if len(message) > 1 else ""
        key = (conn.id, sub)
        if kind == "NEG-OPEN":
            self.opened += 1
            flt = filter_from_json(message[2])
            self.filters.append(flt)
            read = relay.as_read(flt)
            with relay._store_lock:
                items = [(ev.created_at, ev.id) for _, ev in relay._store.values()
                         if ev is not None and read.matches(ev) and ev.id not in self.unlisted]
            if self.max_results is not None and len(items) > self.max_results:
                self.refused += 1
                return [["NEG-ERR", sub, "blocked: too many query results",
                         *([self.max_results] if self.report_cap else [])]]
            if self.silent_cap is not None:
                items = sorted(items, reverse=True)[:self.silent_cap]
            self._sessions[key] = NegentropyServer(Storage.from_hex(items))
            payload = message[3]
        elif kind == "NEG-MSG":
            payload = message[2]
        else:
            self._sessions.pop(key, None)
            return []
        server = self._sessions.get(key)
        if server is None:
            return [["NEG-ERR", sub, "closed: unknown subscription"]]
        return [["NEG-MSG", sub, server.respond(bytes.fromhex(payload)).hex()]]


class ScriptedRelay:
    def __init__(
        self,
        events: Iterable = (),
        *,
        page_size: int | None = 100,
        hang_handshake: bool = False,
        handshake_gauge: HandshakeGauge | None = None,
        extra_frames_for_req: Callable[..., Iterable] | None = None,
        negentropy: str | Callable[..., Iterable] = "err",
        neg_err_reason: str = "error: negentropy is not supported here",
        on_message: Callable[..., Any] | None = None,
        answer_close: bool = False,
        accept_events: bool = True,
        nip11: dict | None = None,
        req_cap: int | None = None,
        until_exclusive: bool = False,
        since_exclusive: bool = False,
        ignores_until: bool = False,
        limit_zero_unlimited: bool = False,
        oldest_first: bool = False,
        query_budget: tuple | None = None,
        first_cut_to_nothing: tuple | None = None,
        redirect_to: str | None = None,
        nip11_redirect_to: str | None = None,
        refuse_upgrades: Iterable = (),
        max_message: tuple | None = None,
        hold_nip11: threading.Event | None = None,
        answers_one_filter: str | None = None,
        reads_filters: int | None = None,
        tag_values_cap: tuple[int, str] | None = None,
        drops_limited_live: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        self.answers_one_filter = answers_one_filter
        self.reads_filters = reads_filters
        self.tag_values_cap = tag_values_cap
        self.drops_limited_live = drops_limited_live
        self.page_size = page_size
        self.req_cap = req_cap
        self.until_exclusive = until_exclusive
        self.since_exclusive = since_exclusive
        self.ignores_until = ignores_until
        self.limit_zero_unlimited = limit_zero_unlimited
        self.oldest_first = oldest_first
        self.query_budget = query_budget
        self.first_cut_to_nothing = first_cut_to_nothing
        self._budgets = itertools.cycle(
            [query_budget[0]] if query_budget and isinstance(query_budget[0], int)
            else (query_budget[0] if query_budget else [0]))
        self.hang_handshake = hang_handshake
        self.handshake_gauge = handshake_gauge or HandshakeGauge()
        self.extra_frames_for_req = extra_frames_for_req
        if negentropy == "serve":
            self.negentropy = Nip77Serve()
        elif isinstance(negentropy, str):
            self.negentropy = _NegentropyRefusal(negentropy, neg_err_reason)
        else:
            self.negentropy = negentropy
        self.on_message = on_message
        self.answer_close = answer_close
        self.accept_events = accept_events
        self.nip11 = nip11
        self.redirect_to = redirect_to
        self.refuse_upgrades = list(refuse_upgrades)
        self.upgrade_times: list[float] = []
        self.nip11_redirect_to = nip11_redirect_to
        self.max_message = max_message
        self.hold_nip11 = hold_nip11
        self.nip11_held = threading.Event()
        self.oversized: list[int] = []
        self.host = host
        self._requested_port = port
        self.port = 0
        self.url = ""
        self.received: list[tuple[int, Any]] = []  # (connection id, decoded client message)
        self.received_at: list[float] = []  # time.monotonic() of each, in the same order
        self._received_lock = threading.Lock()
        self.connections: list[Connection] = []
        self.http_requests: list[tuple[str, dict]] = []  # (request line, headers)
        self._store: dict[str, tuple[dict, Event | None]] = {}
        self._store_lock = threading.Lock()
        self._sent: dict[str, int] = {}  # event id → EVENT frames sent with it
        self._ids = itertools.count(1)
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._sockets_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.add(*events)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> ScriptedRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self._requested_port))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self.url = f"ws://{self.host}:{self.port}"
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() at once on Linux
            except OSError:
                pass
            self._listener.close()
        with self._sockets_lock:
            sockets = list(self._sockets)
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=2)

    def __enter__(self) -> ScriptedRelay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    # -- the store -----------------------------------------------------------------------

    def add(self, *events) -> None:
        """Store events (``Event`` objects or dicts; dicts may be forged: ids and signatures
        are not checked here). One that cannot be parsed at all is kept but matches nothing."""
        with self._store_lock:
            for e in events:
                raw = _event_dict(e)
                try:
                    parsed = parse_event(raw, check_id=False, check_sig=False)
                except EventError:
                    parsed = None
                self._store[str(raw.get("id"))] = (raw, parsed)

    def forget(self, *events) -> None:
        """Drop events from the store, as a relay in memory that restarted has lost them."""
        with self._store_lock:
            for e in events:
                self._store.pop(str(_event_dict(e).get("id")), None)

    @property
    def events(self) -> list[dict]:
        with self._store_lock:
            return [raw for raw, _ in self._store.values()]

    def query(self, f: Filter) -> list[dict]:
        """NIP-01 for one filter: newest first (ties by id), at most ``limit`` and ``page_size``."""
        cap = None if f.limit == 0 and self.limit_zero_unlimited else f.limit
        if self.page_size is not None:
            cap = self.page_size if cap is None else min(cap, self.page_size)
        if cap == 0:
            return []
        f = self.as_read(f)
        with self._store_lock:
            found = [(ev, raw) for raw, ev in self._store.values() if ev is not None and f.matches(ev)]
        found.sort(key=lambda pair: (-pair[0].created_at, pair[0].id))
        if self.oldest_first and f.limit is None:
            found.reverse()
        return [raw for _, raw in found[:cap]]

    def as_read(self, f: Filter) -> Filter:
        """``f`` as this relay reads it, in REQs and NEG-OPENs alike: ``until`` excluding
        its own second where ``until_exclusive``, not read where ``ignores_until``; ``since``
        excluding its own where ``since_exclusive``."""
        if self.since_exclusive and f.since is not None:
            f = f.replace(since=f.since + 1)
        if f.until is None:
            return f
        if self.ignores_until:
            return f.replace(until=None)
        return f.replace(until=f.until - 1) if self.until_exclusive else f

    def answer(self, filters: list[Filter]) -> list[dict]:
        """A REQ's stored events: the union over its filters, newest first (at most
        ``req_cap`` of them)."""
        seen: dict[str, dict] = {}
        for f in filters:
            for raw in self.query(f):
                seen.setdefault(raw["id"], raw)
        union = list(seen.values()) if self.oldest_first else sorted(
            seen.values(), key=lambda r: (-r["created_at"], r["id"]))
        return union if self.req_cap is None else union[:self.req_cap]

    def broadcast(self, event) -> int:
        """Store ``event`` and send it to every open subscription it matches. Returns how
        many subscriptions it went to."""
        self.add(event)
        raw = _event_dict(event)
        try:
            parsed = parse_event(raw, check_id=False, check_sig=False)
        except EventError:
            return 0
        sent = 0
        for conn in list(self.connections):
            if not conn.open:
                continue
            for sub_id, filters in list(conn.subs.items()):
                if any(f.replace(limit=None).matches(parsed) for f in filters):
                    conn.send("EVENT", sub_id, raw)
                    sent += 1
        return sent

    # -- what the client did -------------------------------------------------------------

    def count_sent(self, event_id) -> None:
        with self._store_lock:
            self._sent[event_id] = self._sent.get(event_id, 0) + 1

    def sent_count(self, event_id: str) -> int:
        """How many times an EVENT frame carried ``event_id`` to a client (any connection)."""
        with self._store_lock:
            return self._sent.get(event_id, 0)

    def messages(self, kind: str | None = None) -> list[list]:
        """Decoded client messages (lists), optionally only those of one type (``"REQ"``)."""
        return [
            m for _, m in list(self.received)
            if isinstance(m, list) and m and (kind is None or m[0] == kind)
        ]

    def reqs(self) -> list[tuple[str, list[dict]]]:
        """Every REQ as (sub id, filter dicts)."""
        return [(m[1], m[2:]) for m in self.messages("REQ") if len(m) >= 2]

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block (a hook's thread) until the relay stops: how a hook stalls its session."""
        return self._stopping.wait(timeout)

    @property
    def open_connections(self) -> list[Connection]:
        return [c for c in self.connections if c.open]

    def drop_all(self) -> None:
        for conn in list(self.connections):
            conn.drop()

    # -- network -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = self.handshake_gauge.enter(self.port, sock)
            sock.settimeout(None)
            with self._sockets_lock:
                self._sockets.add(sock)
            self._spawn(self._serve, sock, record)

    def _serve(self, sock: socket.socket, record: dict) -> None:
        pending = True

        def answered(how: str):
            nonlocal pending
            if pending:
                pending = False
                self.handshake_gauge.leave(record, how)

        rfile = sock.makefile("rb")
        try:
            request_line, headers = self._read_http_request(rfile)
            self.http_requests.append((request_line, headers))
            if self.hang_handshake:
                while rfile.read(1):  # never answer: wait for the client to give up
                    pass
                return
            if headers.get("upgrade", "").lower() != "websocket" or "sec-websocket-key" not in headers:
                answered("http")
                hold = self.hold_nip11
                if hold is not None:
                    self.nip11_held.set()
                    hold.wait(30)
                self._answer_http(sock, headers)
                return
            if self.redirect_to is not None:
                answered("redirected")
                sock.sendall(_redirect(301, self.redirect_to))
                return
            self.upgrade_times.append(time.monotonic())
            if self.refuse_upgrades:
                answered("refused")
                self._refuse_upgrade(sock, *self.refuse_upgrades.pop(0))
                return
            accept = base64.b64encode(
                hashlib.sha1((headers["sec-websocket-key"] + WS_GUID).encode()).digest()
            ).decode()
            answered("upgraded")
            sock.sendall(
                (
                    "HTTP/1.1 101 Switching Protocols\r\n"
                    "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {accept}\r\n\r\n"
                ).encode()
            )
            conn = Connection(self, next(self._ids), sock, rfile)
            self.connections.append(conn)
            self._session(conn)
        except (_Closed, OSError, ValueError):
            pass
        finally:
            answered("client hung up" if self.hang_handshake else "ended before an answer")
            with self._sockets_lock:
                self._sockets.discard(sock)
            try:
                rfile.close()
                sock.close()
            except OSError:
                pass

    @staticmethod
    def _refuse_upgrade(sock, status: int, headers: dict, body=b"") -> None:
        head = f"HTTP/1.1 {status} Refused\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall((head + "\r\n").encode())
        for chunk in [body] if isinstance(body, bytes) else body:
            sock.sendall(chunk)

    @staticmethod
    def _read_http_request(rfile) -> tuple[str, dict]:
        request_line = rfile.readline(MAX_HTTP_REQUEST).decode("latin-1").strip()
        if not request_line:
            raise _Closed()
        headers: dict[str, str] = {}
        size = len(request_line)
        while True:
            line = rfile.readline(MAX_HTTP_REQUEST)
            size += len(line)
            if not line or size > MAX_HTTP_REQUEST:
                raise _Closed()
            line = line.decode("latin-1").strip()
            if not line:
                return request_line, headers
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()

    def _answer_http(self, sock: socket.socket, headers: dict) -> None:
        if self.nip11_redirect_to is not None:
            sock.sendall(_redirect(302, self.nip11_redirect_to))
            return
        if self.nip11 is not None and "application/nostr+json" in headers.get("accept", ""):
            body = json.dumps(self.nip11).encode()
            status, ctype = "200 OK", "application/nostr+json"
        else:
            body, status, ctype = b"not found", "404 Not Found", "text/plain"
        sock.sendall(
            (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n"
                "Access-Control-Allow-Origin: *\r\n\r\n"
            ).encode()
            + body
        )

    def _session(self, conn: Connection) -> None:
        try:
            while not self._stopping.is_set() and conn.open:
                opcode, payload = conn.read_message()
                if self.max_message is not None and len(payload) > self.max_message[0]:
                    self.oversized.append(len(payload))
                    if self.max_message[1] == "close":
                        conn.close(1009)
                    else:
                        conn.drop()
                    return
                if opcode == OP_BINARY:
                    self._note(conn, payload)
                    continue
                try:
                    text = payload.decode("utf-8")
                    message = json.loads(text)
                except ValueError:
                    self._note(conn, payload)
                    conn.send("NOTICE", "error: could not parse message")
                    continue
                self._note(conn, message)
                self._handle(conn, message)
        finally:
            conn.open = False

    def received_with_times(self) -> list[tuple[float, int, Any]]:
        """(arrival time, connection id, message) of everything received so far."""
        with self._received_lock:
            return [(t, c, m) for t, (c, m) in zip(self.received_at, self.received, strict=True)]

    def _note(self, conn: Connection, message) -> None:
        with self._received_lock:
            self.received.append((conn.id, message))
            self.received_at.append(time.monotonic())

    # -- client messages -----------------------------------------------------------------

    def _handle(self, conn: Connection, message) -> None:
        if self.on_message is not None:
            frames = self.on_message(self, conn, message)
            if frames is not None:
                conn.send_frames(frames)
                return
        if not isinstance(message, list) or not message or not isinstance(message[0], str):
            conn.send("NOTICE", "error: message is not a JSON array")
            return
        kind = message[0]
        if kind == "REQ":
            self._on_req(conn, message)
        elif kind == "CLOSE":
            if len(message) >= 2:
                conn.subs.pop(message[1], None)
                if self.answer_close:
                    conn.send("CLOSED", message[1], "")
        elif kind == "EVENT":
            self._on_event(conn, message)
        elif kind in ("NEG-OPEN", "NEG-MSG", "NEG-CLOSE"):
            if self.negentropy is not None:
                conn.send_frames(self.negentropy(self, conn, message))
        elif kind == "AUTH":
            if len(message) >= 2 and isinstance(message[1], dict):
                conn.send("OK", message[1].get("id", ""), True, "")
        else:
            conn.send("NOTICE", f"error: unknown message type {kind[:32]}")

    def _on_req(self, conn: Connection, message: list) -> None:
        if len(message) < 3 or not isinstance(message[1], str):
            conn.send("NOTICE", "error: bad REQ")
            return
        sub_id = message[1]
        try:
            filters = [filter_from_json(f) for f in message[2:]]
        except ValueError as exc:
            conn.send("CLOSED", sub_id, f"invalid: {exc}")
            return
        if self.reads_filters is not None:
            filters = filters[:self.reads_filters] if self.reads_filters > 0 else filters[self.reads_filters:]
        conn.subs[sub_id] = filters
        answered = filters
        if self.answers_one_filter is not None:
            answered = filters[:1] if self.answers_one_filter == "first" else filters[-1:]
        if self.tag_values_cap is not None:
            most, how = self.tag_values_cap
            over = [f for f in answered if f.limit != 0 and sum(len(values) for _, values in f.tags) > most]
            answered = [f for f in answered if f not in over]
            if how == "notice":
                for _ in over:
                    conn.send("NOTICE", "too many tag values")
        stored = self.answer(answered)
        budget = next(self._budgets)
        if self.query_budget is not None and len(stored) > budget:
            time.sleep(self.query_budget[1])  # out of time: what it found so far
            stored = stored[:budget]
        cut = self.first_cut_to_nothing
        if cut is not None and any(raw.get("kind") == cut[1] for raw in stored):
            time.sleep(cut[0])
            self.first_cut_to_nothing, stored = None, []
        for raw in stored:
            conn.send("EVENT", sub_id, raw)
        if self.extra_frames_for_req is not None:
            conn.send_frames(self.extra_frames_for_req(self, conn, sub_id, filters))
        conn.send("EOSE", sub_id)
        if self.drops_limited_live:
            kept = [f for f in filters if f.limit is None or len(stored) < f.limit]
            if kept:
                conn.subs[sub_id] = kept
            else:
                conn.subs.pop(sub_id, None)  # (no CLOSED: the client thinks it open)

    def _on_event(self, conn: Connection, message: list) -> None:
        if len(message) < 2 or not isinstance(message[1], dict):
            conn.send("NOTICE", "error: bad EVENT")
            return
        raw = message[1]
        eid = raw.get("id") if isinstance(raw.get("id"), str) else ""
        if not self.accept_events:
            conn.send("OK", eid, False, "blocked: this relay takes no events")
            return
        try:
            parse_event(raw)
        except EventError as exc:
            conn.send("OK", eid, False, f"invalid: {exc.reason}")
            return
        with self._store_lock:
            held = eid in self._store
        if held:  # (as relays say it: a read, not a write)
            conn.send("OK", eid, True, "duplicate: already have this event")
            return
        self.broadcast(raw)
        conn.send("OK", eid, True, "")
