"""One websocket session with a remote relay: a reader and a writer greenlet.

The reader turns frames into typed messages and checks every event before anything else
sees it (SPEC §6): recomputed id, BIP-340 signature, a filter of the subscription it came on.
Drops are counted by reason; a relay that keeps sending junk is hung up on. The writer owns
the socket's send side, so the manager only ever enqueues text and never blocks on I/O.
"""
from __future__ import annotations

import time

import gevent
import gevent.event
from gevent.queue import Empty, Queue

from .. import constants
from ..ops import metrics
from ..ops.logging import get_logger
from ..protocol import messages as wire
from ..protocol import wsframes
from ..protocol.event import EventError, parse_event, sign_event
from ..protocol.filters import FilterSet
from . import ws as ws_stream
from .events import RelayDisconnected, RemoteEvent, RemoteEvents, RemoteMessage

log = get_logger("gsync.connection")

IDLE_PING_SECS = 30.0
READ_IDLE_TIMEOUT_SECS = 120.0
SEND_TIMEOUT_SECS = 30.0
SEND_BATCH = 64  # queued messages joined into one socket write
CHECKED_CAPACITY = 50_000
CLOSING_CAPACITY = 1_000  # subscriptions closed by us, awaiting the relay's CLOSED
# Read bursts posted to the manager and not yet applied: the reader waits beyond this, so
# the manager's queue holds at most this many bursts per connection however many relays
# send at once (the socket pushes back on the relay meanwhile).
MAX_UNAPPLIED_BURSTS = 2


class RelayConnection:
    """A live session. ``subscriptions`` maps sub id → filters, for the filter-match check."""

    def __init__(self, relay: str, ws, session: int, post, *, auth_secret: str | None = None,
                 clock=None, known_ids=frozenset(), room=None):
        self.relay = relay
        self.ws = ws
        self.session = session
        self._post = post
        self._auth_secret = auth_secret
        self._clock = clock
        self._known_ids = known_ids  # the manager's dedupe set: only ever read here
        self._room = room  # set while delivery can take more: reading waits for it
        self._checked: dict[str, None] = {}  # ids this session verified, oldest first
        self.subscriptions: dict[str, FilterSet] = {}
        self.filter_bytes: dict[str, int] = {}  # REQ size per open subscription
        self.open_filter_bytes = 0
        self.peak_subscriptions = 0  # the most REQs open at once: checked against the budget
        self.neg_waiters: dict[str, Queue] = {}
        self._outbox: Queue = Queue()
        self._challenge: str | None = None
        self._auth_retried: set[str] = set()
        # CLOSE sent, the relay's CLOSED not yet seen: events it sent before reading our
        # CLOSE (or that were waiting in our socket) are still checked against these filters
        # and kept, not dropped as "unknown subscription"
        self._closing: dict[str, FilterSet] = {}
        self._junk_streak = 0
        self._events: list[RemoteEvent] = []  # checked, not yet posted (see _flush_events)
        self._unapplied = 0  # RemoteEvents posted, not yet applied by the manager
        self._applied = gevent.event.Event()
        self._greenlets: list[gevent.Greenlet] = []
        self.closed = False
        self._bytes_up = metrics.BYTES_UP.labels(relay)
        self._bytes_down = metrics.BYTES_DOWN.labels(relay)

    # -- manager-facing (never blocks) --------------------------------------------------

    def start(self) -> None:
        self._greenlets = [gevent.spawn(self._read_loop), gevent.spawn(self._write_loop)]

    def send(self, text: str) -> None:
        if not self.closed:
            self._outbox.put(text)

    def subscribe(self, sub_id: str, filters) -> None:
        filters = tuple(filters)
        self.forget(sub_id)
        self.subscriptions[sub_id] = FilterSet(filters)
        self.peak_subscriptions = max(self.peak_subscriptions, len(self.subscriptions))
        text = wire.req(sub_id, filters)
        for f in filters:  # kept for matching; their JSON now lives in ``text`` only
            f.drop_json()
        self.filter_bytes[sub_id] = len(text)
        self.open_filter_bytes += len(text)
        self.send(text)

    def unsubscribe(self, sub_id: str) -> None:
        filters = self.subscriptions.get(sub_id)
        if self._drop_sub(sub_id):
            if len(self._closing) >= CLOSING_CAPACITY:  # relays that never answer CLOSE
                del self._closing[next(iter(self._closing))]
            self._closing[sub_id] = filters
            self.send(wire.close(sub_id))

    def forget(self, sub_id: str) -> None:
        """The relay closed it: stop accepting its events without sending CLOSE."""
        self._drop_sub(sub_id)

    def _drop_sub(self, sub_id: str) -> bool:
        self.open_filter_bytes -= self.filter_bytes.pop(sub_id, 0)
        return self.subscriptions.pop(sub_id, None) is not None

    def close(self, reason: str = "closed by gsync") -> None:
        if self.closed:
            return
        self.closed = True
        self._outbox.put(None)
        try:
            self.ws.close(timeout=1)
        except Exception:
            pass
        current = gevent.getcurrent()
        for g in self._greenlets:
            if g is not current:
                g.kill(block=False)

    def burst_applied(self) -> None:
        """The manager applied one of this connection's RemoteEvents: reading may go on."""
        self._unapplied -= 1
        self._applied.set()

    @property
    def is_open(self) -> bool:
        return not self.closed and bool(getattr(self.ws, "connected", False))

    # -- greenlets ----------------------------------------------------------------------

    def _write_loop(self) -> None:
        while not self.closed:
            try:
                text = self._outbox.get(timeout=IDLE_PING_SECS)
            except Empty:
                text = ""
            if text is None:
                return
            batch = [text] if text else []
            while batch and not self._outbox.empty() and len(batch) < SEND_BATCH:
                more = self._outbox.get_nowait()
                if more is None:
                    self._outbox.put(None)  # ends the loop after this send
                    break
                batch.append(more)
            try:
                with gevent.Timeout(SEND_TIMEOUT_SECS):
                    if batch:
                        self.ws.send_many(batch)
                        self._bytes_up.inc(sum(map(len, batch)))
                    else:
                        self.ws.ping()
            except BaseException as exc:  # Timeout is a BaseException
                self._finish(f"send failed: {type(exc).__name__}")
                return

    def _read_loop(self) -> None:
        reason = "connection closed"
        try:
            self.ws.settimeout(READ_IDLE_TIMEOUT_SECS)
            while not self.closed:
                received = 0
                burst = self.ws.recv_burst()  # a close message can only be the last
                for opcode, data in burst:
                    if self.closed:
                        break  # hung up on (junk) halfway through the burst
                    if opcode == wsframes.OP_TEXT:
                        received += len(data)
                        self._handle_frame(data)
                    elif opcode != wsframes.OP_CLOSE:
                        self._junk("binary_frame")
                self._bytes_down.inc(received)
                self._flush_events()  # the burst's events: one message to the manager
                while self._unapplied >= MAX_UNAPPLIED_BURSTS and not self.closed:
                    self._applied.clear()
                    self._applied.wait(1.0)
                if self._room is not None:
                    # Let the manager take this burst to delivery first (reading on would
                    # not yield while the socket has data), then stop reading while
                    # delivery is full: the socket pushes back on the relay.
                    gevent.sleep(0)
                    self._room.wait()
                if burst[-1][0] == wsframes.OP_CLOSE:
                    reason = "closed by relay"
                    break
        except ws_stream.Timeout:
            reason = "idle timeout"
        except ws_stream.ConnectionClosed as exc:
            reason = str(exc) or "connection closed"
        except Exception as exc:
            reason = f"read failed: {type(exc).__name__}"
        self._finish(reason)

    def _finish(self, reason: str) -> None:
        if not self.closed:
            self.close(reason)
            self._emit(RelayDisconnected(self.relay, self.session, reason))

    def _emit(self, message) -> None:
        """Post to the manager, after the events read before it (order is kept)."""
        self._flush_events()
        self._post(message)

    def _flush_events(self) -> None:
        if self._events:
            events, self._events = self._events, []
            self._unapplied += 1
            self._post(RemoteEvents(self.relay, self.session, events))

    # -- frames -------------------------------------------------------------------------

    def _drop(self, reason: str, event_id=None) -> None:
        """Every dropped frame or event is counted by reason, and logged (debug)."""
        metrics.DROPS.labels(reason).inc()
        log.debug("event_dropped", relay=self.relay, reason=reason, event_id=event_id)

    def _junk(self, reason: str) -> None:
        self._drop(reason)
        self._junk_streak += 1
        if self._junk_streak >= constants.JUNK_DISCONNECT_THRESHOLD:
            self._finish("too much junk")

    def _handle_frame(self, data: bytes) -> None:
        msg = wire.parse_relay_message(data)
        if self.neg_waiters and _concerns_negentropy(msg):
            # NIP-77 exchanges read raw frames (negentropy_ws parses and judges them).
            for inbox in self.neg_waiters.values():
                inbox.put(data)
            if isinstance(msg, (wire.NegMsg, wire.NegErr)):
                return
        if isinstance(msg, wire.Malformed):
            self._junk(f"malformed_{msg.reason}")
            return
        self._junk_streak = 0
        if isinstance(msg, wire.RelayEvent):
            self._handle_event(msg)
        elif isinstance(msg, wire.AuthChallenge):
            self._challenge = msg.challenge
        elif isinstance(msg, (wire.Closed, wire.Eose)) and msg.sub_id in self._closing:
            if isinstance(msg, wire.Closed):
                del self._closing[msg.sub_id]  # the answer to our own CLOSE
        elif (
            isinstance(msg, wire.Closed)
            and msg.prefix is wire.Prefix.AUTH_REQUIRED
            and self._retry_after_auth(msg.sub_id)
        ):
            return
        else:
            self._emit(RemoteMessage(self.relay, self.session, msg))

    def _handle_event(self, msg: wire.RelayEvent) -> None:
        filters = self.subscriptions.get(msg.sub_id) or self._closing.get(msg.sub_id)
        event_id = msg.event.get("id") if isinstance(msg.event.get("id"), str) else None
        if filters is None:
            self._drop("unknown_subscription", event_id)
            return
        # An id already handed to delivery (or held by the own relay) is never delivered
        # again, so its signature need not be checked twice; the event still counts for
        # pagination. Relays send many such duplicates (a comment matches #e and #E).
        known = event_id is not None and (event_id in self._known_ids or event_id in self._checked)
        try:
            event = parse_event(msg.event, check_id=not known, check_sig=not known)
        except EventError as exc:
            self._drop(exc.reason, event_id)
            return
        if not known:
            # The manager learns of it only when it takes the event off its queue; copies
            # arriving before that (other filters of the same REQ) are recognised here.
            self._checked[event.id] = None
            if len(self._checked) > CHECKED_CAPACITY:
                del self._checked[next(iter(self._checked))]
        matched = filters.matching(event)
        if not matched:
            self._drop("no_matching_filter", event_id)
            return
        self._events.append(RemoteEvent(self.relay, self.session, msg.sub_id, event, not known, matched))

    def _retry_after_auth(self, sub_id: str) -> bool:
        """NIP-42: authenticate once and re-send the refused REQ. False if we cannot."""
        filters = self.subscriptions.get(sub_id)
        if not (self._auth_secret and self._challenge and filters) or sub_id in self._auth_retried:
            return False
        self._auth_retried.add(sub_id)
        self.send(wire.auth(auth_event(self._auth_secret, self.relay, self._challenge, self._now())))
        self.send(wire.req(sub_id, filters.filters))
        return True

    def _now(self) -> int:
        return int((self._clock or time.time)())


def _concerns_negentropy(msg) -> bool:
    """NEG-MSG / NEG-ERR, a NOTICE about negentropy, or a frame too broken to tell."""
    if isinstance(msg, (wire.NegMsg, wire.NegErr, wire.Malformed)):
        return True
    return isinstance(msg, wire.Notice) and wire.is_negentropy_notice(msg.text)


def auth_event(secret: str, relay: str, challenge: str, now: int):
    """NIP-42 kind 22242 answer to a challenge."""
    return sign_event(
        secret, created_at=now, kind=22242, tags=[["relay", relay], ["challenge", challenge]]
    )
