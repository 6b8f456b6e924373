"""One websocket session with a remote relay: a reader and a writer greenlet.

The reader turns frames into typed messages and checks every event before anything else
sees it (SPEC §6): a filter of the subscription it came on (the cheap check, first), then
the recomputed id and the BIP-340 signature. Drops are counted by reason. A relay that keeps
misbehaving is hung up on (``gsync_relay_hangups_total``): 50 junk frames in a row, an
overdrawn misbehaviour budget (constants.MISBEHAVIOUR_BUDGET), a message stalled half-way
(constants.MESSAGE_STALL_SECS) or a broken frame; the manager then backs it off. The writer
owns the socket's send side, so the manager only ever enqueues text and never blocks on I/O.
"""
from __future__ import annotations

import time
from collections import deque

import gevent
import gevent.event
from gevent.queue import Empty, Queue

from .. import constants
from ..ops import metrics
from ..ops.logging import get_logger
from ..protocol import messages as wire
from ..protocol import wsframes
from ..protocol.event import EventError, parse_event, sign_event, verify_event
from ..protocol.precise import PROBE_AGAIN_SECS, is_imprecise, proves_ignored
from ..protocol.subscription_book import (  # noqa: F401
    CLOSING_CAPACITY,
    ENDED_FILTER_BYTES,
    EndedFilters,
    SubscriptionBook,
)
from ..sync.health import MisbehaviourBudget
from ..sync.pending import slow_answer
from . import ws as ws_stream
from .inbox import (
    ImpreciseIgnored,
    ProbeRefused,
    ProbeWanted,
    RelayDisconnected,
    RemoteEvent,
    RemoteEvents,
    RemoteMessage,
)

log = get_logger("gsync.connection")

IDLE_PING_SECS = 30.0
SEND_TIMEOUT_SECS = 30.0
SEND_BATCH = 64  # queued messages joined into one socket write
# Ids this session verified, so a copy arriving before the manager applied the first is not
# verified again. The reader waits for the manager after every burst, so a few bursts' worth
# is plenty; about 1 MB.
CHECKED_CAPACITY = 10_000
CLOSE_MESSAGE_TOO_BIG = 1009  # RFC 6455 close status
NEG_INBOX_FRAMES = 16  # NIP-77 frames waiting for one exchange (it is owed one at a time)
# Read bursts posted to the manager and not yet applied: the reader waits beyond this, so
# the manager's queue holds at most this many bursts per connection however many relays
# send at once (the socket pushes back on the relay meanwhile).
MAX_UNAPPLIED_BURSTS = 2
# A NOTICE refusing a REQ (too many open, or a rate) is taken as the refusal of the last REQ
# sent and not yet answered, if it went out this recently (a relay refuses as it reads)...
NOTICE_REFUSAL_SECS = 30.0
# ...unless the relay also said it in a CLOSED this recently (some say both). One refusing by
# its prefix alone (``invalid:``, ``blocked:``...) is taken only this soon after the REQ, and
# only if no other REQ went this recently and waits for its answer: a relay validating a REQ
# answers as it reads it, and a stray NOTICE so prefixed, or one about another REQ, must not
# pause the coverage of the last.
NOTICE_ECHO_SECS = 2.0
NOTICE_PREFIX_REFUSAL_SECS = 5.0
NOTICES_OPEN = 32  # refusing NOTICEs whose REQ is not yet told, at most (the newest kept)



class RelayConnection:
    """A live session. ``subscriptions`` maps sub id → filters, for the filter-match check."""

    def __init__(self, relay: str, ws, session: int, post, *, auth_secret: str | None = None,
                 clock=None, seen=frozenset(), room=None, probe: bool = False):
        self.relay = relay
        self.ws = ws
        self.session = session
        self._post = post
        self._auth_secret = auth_secret
        self._clock = clock
        self._seen = seen  # the manager's id -> fetch-time map (``seen``): only ever read here
        self._room = room  # set while delivery can take more: reading waits for it
        # On a relay of a make that may answer imprecise REQs with nothing (``protocol.precise``):
        # the first that does (``_maybe_probe``) has the manager send a precise probe, paced,
        # as ``book.probe_sub``; what it brings shows the relay ignored that REQ
        # (``_probe_answered``). False: nothing asked.
        self._probe = probe
        self._probe_asked_at: float | None = None  # (again PROBE_AGAIN_SECS later, if found nothing)
        self._probe_whole_at: float | None = None  # ... and after a REQ asking history whole
        self._probe_events = 0  # ... of them, those the REQ that came back empty asked for
        self._probe_trigger: list = []  # that REQ's imprecise filters asking stored events
        self._probe_retried = False  # its probe asked once more after a slow answer of nothing
        self._probe_chain = 0  # probes left of a trigger that asked history whole (``_probe_answered``)
        self._evented: set[str] = set()  # subscriptions that brought an event (while a probe may go)
        # ids this session verified, and the same ids oldest first for eviction (a dict
        # emptied from the front makes each ``next(iter(...))`` walk past every deleted
        # slot: 4.6 us an event at this capacity; an OrderedDict is fast but 2.3x the size)
        self._checked: dict[str, None] = {}
        self._checked_order: deque[str] = deque()
        # what is open on it, closing and ended (pure, shared with the manager's session):
        # the same tables under their old names, for the reader
        self.book = SubscriptionBook(clock=lambda: time.monotonic())  # this module's clock (the simulator's there)
        self.subscriptions = self.book.subscriptions
        self.filter_bytes = self.book.filter_bytes
        self._unanswered = self.book.unanswered
        self._closing = self.book.closing
        self._ended = self.book.ended
        self._refusal_closed_at = float("-inf")  # the last CLOSED refusing for count or rate
        # refusing NOTICEs whose REQ is not yet told (several waited): (at, text, candidates)
        self._open_notices: list[tuple[float, str, set[str]]] = []
        self.neg_waiters: dict[str, Queue] = {}
        # NIP-77 exchanges running (``neg_waiters``) → their NEG-OPEN while the relay has not
        # answered it: sent again after AUTH if refused for want of it (``_reopened_after_auth``);
        # None once answered or sent again. An entry lives as long as its exchange.
        self._neg_opens: dict[str, str | None] = {}
        self._outbox: Queue = Queue()
        self._challenge: str | None = None
        self._answered: str | None = None  # the challenge our last AUTH answered
        self._auth_event_id: str | None = None
        self._auth_refused = False  # the relay said OK false to our AUTH
        self._auth_taken = False  # the relay said OK true to our AUTH
        self._auth_retried: set[str] = set()
        # Sent again after our AUTH before the relay said OK to it (REQs, NEG-OPENs): a relay
        # reading each message in a task of its own (khatru) may read one of them before it
        # took our AUTH and refuse it ``auth-required:`` again. Such a refusal is not final:
        # sent again once more when the OK comes (``_held_for_auth``, what waits for it), or at
        # once if it came. Entries last the session (a few at a connect).
        self._auth_unconfirmed: set[str] = set()
        self._held_for_auth: dict[str, tuple] = {}  # sub id → ("req", CLOSED) or ("neg", NEG-OPEN, frame)
        # exchanges whose NEG-OPEN went again after our AUTH, until the relay answers it
        self._neg_resent: dict[str, str] = {}
        # what the relay read before our AUTH and has not answered (REQs, NEG-OPENs), for a
        # relay that refuses them in a NOTICE ``auth-required:`` alone (``_auth_notice``);
        # such NOTICEs still to come for what went again, and those come before our AUTH
        self._before_auth: list[str] = []
        # all of it, kept for the session: a ``restricted:`` refusal of one of these may be
        # for want of our AUTH (``_for_want_of_auth``)
        self._sent_before_auth: frozenset[str] = frozenset()
        self._auth_notices_owed = 0
        self._auth_notices_early = 0
        self._junk_streak = 0
        self._budget = MisbehaviourBudget(
            constants.MISBEHAVIOUR_BUDGET, constants.MISBEHAVIOUR_REFILL_PER_SEC, time.monotonic()
        )
        self._events: list[RemoteEvent] = []  # checked, not yet posted (see _flush_events)
        # sub id → events of it newer than every ``until`` it gave (a relay ignoring ``until``
        # sends a page's newest again): told to the manager with its EOSE, then gone
        self._past_until: dict[str, list[int]] = {}  # sub id -> per filter (``RemoteMessage.past_until``)
        self._unapplied: deque[gevent.event.Event] = deque()  # bursts posted, each set once applied
        self._greenlets: list[gevent.Greenlet] = []
        self.closed = False
        self._long_sent: deque[tuple[float, int]] = deque(maxlen=32)  # (when, length) sent
        self._bytes_up = metrics.BYTES_UP.labels(relay)
        self._bytes_down = metrics.BYTES_DOWN.labels(relay)

    # -- manager-facing (never blocks) --------------------------------------------------

    def start(self) -> None:
        self._greenlets = [gevent.spawn(self._read_loop), gevent.spawn(self._write_loop)]

    def send(self, text: str) -> None:
        if not self.closed:
            self._outbox.put(text)

    def subscribe(self, sub_id: str, filters) -> None:
        self.send(self.req_frame(sub_id, filters))

    def req_frame(self, sub_id: str, filters) -> str:
        return self.book.req_frame(sub_id, filters)

    @property
    def open_filter_bytes(self) -> int:
        return self.book.open_filter_bytes

    @property
    def will_authenticate(self) -> bool:
        """A challenge gets our AUTH: we have a key and the relay has not refused it."""
        return bool(self._auth_secret) and not self._auth_refused

    @property
    def peak_subscriptions(self) -> int:
        return self.book.peak_subscriptions

    def open_negentropy(self, sub_id: str, inbox: Queue) -> None:
        """A NIP-77 exchange begins: the relay's frames for ``sub_id`` go to ``inbox``."""
        self.neg_waiters[sub_id] = inbox
        self._neg_opens.pop(sub_id, None)

    def send_negentropy(self, sub_id: str, text: str) -> None:
        """A frame of the exchange ``sub_id``; its first is its NEG-OPEN, kept until the relay
        answers it."""
        if sub_id not in self._neg_opens:
            self._neg_opens[sub_id] = text
        self.send(text)

    def end_negentropy(self, sub_id: str) -> None:
        self.neg_waiters.pop(sub_id, None)
        self._neg_opens.pop(sub_id, None)
        self._neg_resent.pop(sub_id, None)
        self._held_for_auth.pop(sub_id, None)

    def unsubscribe(self, sub_id: str) -> None:
        """CLOSE it; its late events are still read until the relay's CLOSED (``_closing``:
        many relays never send one)."""
        frame = self.close_frame(sub_id)
        if frame is not None:
            self.send(frame)
        self._past_until.pop(sub_id, None)  # (one the relay never ended: nothing to tell)

    def close_frame(self, sub_id: str) -> str | None:
        return self.book.close_frame(sub_id)

    def forget(self, sub_id: str) -> None:
        self.book.forget(sub_id)

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
                        self._note_long(batch)
                        self.ws.send_many(batch)
                        self._bytes_up.inc(sum(map(len, batch)))
                    else:
                        self.ws.ping()
            except BaseException as exc:  # Timeout is a BaseException
                self._finish(f"send failed: {type(exc).__name__}", self.sent_too_long())
                return

    def _note_long(self, batch) -> None:
        long = [len(text) for text in batch if len(text) >= constants.LONG_MESSAGE_BYTES]
        if long:
            self._long_sent.append((time.monotonic(), max(long)))

    def sent_too_long(self, close_status: int | None = None) -> int:
        """The session is ending from the relay's side: the longest message we sent within
        HANGUP_AFTER_LONG_SECS, the likely reason (a read limit); with status 1009 ("message
        too big") the longest we sent at all. 0 when no long message makes it likely."""
        now = time.monotonic()
        recent = [n for t, n in self._long_sent if now - t <= constants.HANGUP_AFTER_LONG_SECS]
        if not recent and close_status == CLOSE_MESSAGE_TOO_BIG:
            recent = [n for _, n in self._long_sent]
        return max(recent, default=0)

    def _read_loop(self) -> None:
        reason, too_long, too_big = "connection closed", 0, False
        try:
            self.ws.settimeout(constants.READ_IDLE_TIMEOUT_SECS)
            self.ws.stall_timeout = constants.MESSAGE_STALL_SECS
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
                self._wait_for_manager()
                if self._room is not None:
                    self._room.wait()  # delivery is full: the socket pushes back on the relay
                if burst[-1][0] == wsframes.OP_CLOSE:
                    status = int.from_bytes(burst[-1][1][:2], "big") if len(burst[-1][1]) >= 2 else None
                    reason = "closed by relay" + (f" ({status})" if status else "")
                    too_long = self.sent_too_long(status)
                    too_big = bool(too_long) and status == CLOSE_MESSAGE_TOO_BIG
                    break
        except ws_stream.StalledMessage as exc:
            self._hang_up("stalled_message", str(exc))
        except ws_stream.Timeout:
            reason = "idle timeout"
        except ws_stream.BrokenFrame as exc:
            self._hang_up("bad_frame", str(exc))
        except ws_stream.ConnectionClosed as exc:
            reason, too_long = str(exc) or "connection closed", self.sent_too_long()
        except Exception as exc:
            reason, too_long = f"read failed: {type(exc).__name__}", self.sent_too_long()
        self._finish(reason, too_long, too_big)

    def _finish(self, reason: str, sent_too_long: int = 0, said_too_big: bool = False,
                misbehaved: bool = False) -> None:
        if not self.closed:
            self.close(reason)
            self._emit(RelayDisconnected(self.relay, self.session, reason, misbehaved, sent_too_long,
                                         said_too_big))

    def _hang_up(self, label: str, reason: str) -> None:
        """End the session because the relay misbehaved: counted, and backed off."""
        if not self.closed:
            metrics.HANGUPS.labels(label).inc()
            self._finish(reason, misbehaved=True)

    def _emit(self, message) -> None:
        """Post to the manager, after the events read before it (order is kept)."""
        self._flush_events()
        self._post(message)

    def _flush_events(self) -> None:
        if self._events:
            events, self._events = self._events, []
            applied = gevent.event.Event()
            self._unapplied.append(applied)
            self._post(RemoteEvents(self.relay, self.session, events, applied))

    def _wait_for_manager(self) -> None:
        """Read no further while MAX_UNAPPLIED_BURSTS of this connection's bursts wait in
        the manager's queue: however fast its relay sends, memory per connection is bounded
        by design, and the next burst is read while the manager applies the last one.
        (Reading on would not even yield while the socket has data.)"""
        unapplied = self._unapplied
        while unapplied and unapplied[0].is_set():
            unapplied.popleft()
        if len(unapplied) < MAX_UNAPPLIED_BURSTS:
            gevent.sleep(0)  # still let the others run
        while len(unapplied) >= MAX_UNAPPLIED_BURSTS:
            unapplied.popleft().wait()

    # -- frames -------------------------------------------------------------------------

    def _drop(self, reason: str, event_id=None, misbehaved: bool = True) -> None:
        """Every dropped frame or event is counted by reason, logged (debug), and spends a
        misbehaviour point unless it is no fault of the relay's."""
        metrics.DROPS.labels(reason).inc()
        log.debug("event_dropped", relay=self.relay, reason=reason, event_id=event_id)
        if misbehaved:
            self._misbehaved()

    def _misbehaved(self) -> None:
        if not self._budget.spend(time.monotonic()):
            self._hang_up("misbehaving", "misbehaviour budget exhausted")

    def _junk(self, reason: str) -> None:
        self._drop(reason)
        self._junk_streak += 1
        if self._junk_streak >= constants.JUNK_DISCONNECT_THRESHOLD:
            self._hang_up("junk", "too much junk")

    def _handle_frame(self, data: bytes) -> None:
        msg = wire.parse_relay_message(data)
        if isinstance(msg, wire.Notice) and msg.sub_id is not None:
            msg = self._notice_naming(msg)
        if self.book.probe_sub is not None and getattr(msg, "sub_id", None) == self.book.probe_sub:
            self._probe_answered(msg)
            return
        if isinstance(msg, (wire.NegMsg, wire.NegErr)) or (isinstance(msg, wire.Closed)
                                                           and msg.sub_id in self.neg_waiters):
            # (a CLOSED naming an exchange: some relays end NIP-77 as they end a REQ)
            if not self._reopened_after_auth(msg, data):
                self._to_negentropy([self.neg_waiters.get(msg.sub_id)], data)
            return
        if isinstance(msg, wire.Notice) and self._auth_notice(msg):
            return
        if self.neg_waiters and _concerns_negentropy(msg):
            named = msg.sub_id if isinstance(msg, wire.Notice) else None
            if named is None:
                self._to_negentropy(list(self.neg_waiters.values()), data)
            elif named in self.neg_waiters:  # (a NOTICE naming an exchange: that one alone)
                self._to_negentropy([self.neg_waiters[named]], data)
        if isinstance(msg, wire.Malformed):
            self._junk(f"malformed_{msg.reason}")
            return
        self._junk_streak = 0
        sent_at = None  # (of a REQ answered first by this message)
        if (self.book.closed_unanswered and isinstance(msg, (wire.RelayEvent, wire.Eose, wire.Closed))
                and msg.sub_id in self.book.closed_unanswered):
            self.book.answered(msg.sub_id)  # (one closed unanswered, answered after our CLOSE)
        if self._unanswered and isinstance(msg, (wire.RelayEvent, wire.Eose, wire.Closed)):
            sent_at = self._unanswered.pop(msg.sub_id, None)
            if sent_at is not None:
                self.book.answered(msg.sub_id)
            if sent_at is not None and self._open_notices:
                if isinstance(msg, wire.Closed) and _refuses_a_req(msg.text, msg.prefix):
                    self._explained(msg.sub_id)  # (a relay that says it twice: that NOTICE was this)
                self._settle_notices()
        if isinstance(msg, wire.Closed) and _refuses_a_req(msg.text, msg.prefix):
            self._refusal_closed_at = time.monotonic()
        if isinstance(msg, wire.RelayEvent):
            self._handle_event(msg)
        elif isinstance(msg, wire.Notice) and self._refused_by_notice(msg):
            return
        elif isinstance(msg, wire.Notice) and not self._count_notice(msg):
            return
        elif isinstance(msg, wire.AuthChallenge):
            self._on_challenge(msg)
        elif isinstance(msg, wire.Ok) and msg.event_id == self._auth_event_id:
            self._on_auth_answer(msg)
        elif isinstance(msg, (wire.Closed, wire.Eose)):
            if self._probe and isinstance(msg, wire.Eose):
                self._maybe_probe(msg.sub_id, sent_at)
            past_until = tuple(self._past_until.pop(msg.sub_id, ())) if self._past_until else ()
            if not self._ended_here(msg):
                if isinstance(msg, wire.Closed):
                    self.book.relay_closed(msg.sub_id)  # (no CLOSE for it now)
                self._emit(RemoteMessage(self.relay, self.session, msg, past_until))
        else:
            self._emit(RemoteMessage(self.relay, self.session, msg))

    def _on_challenge(self, msg: wire.AuthChallenge) -> None:
        # A relay challenges once a connection; each challenge after that spends a
        # misbehaviour point, as a NOTICE does: every new one costs a signature and a
        # frame, so a stream of them is hung up on instead of answered for ever.
        if self._challenge is not None:
            self._misbehaved()
            if self.closed:
                return
        self._challenge = msg.challenge
        self._answer_challenge()  # now, so that what we send next is already allowed

    def _on_auth_answer(self, msg: wire.Ok) -> None:
        if not msg.accepted:
            self._auth_refused = True
            log.warning("relay_auth_refused", relay=self.relay,
                        reason=f"{msg.prefix.value}: {msg.text}"[:200])
        else:
            self._auth_taken = True
        held, self._held_for_auth = self._held_for_auth, {}
        for sub_id, what in held.items():
            if msg.accepted:
                self._send_held(sub_id, what)
            else:  # refused for want of an AUTH the relay will not take: final
                self._pass_on_refusal(sub_id, what)
        self._emit(RemoteMessage(self.relay, self.session, msg))  # it may say "slow down"

    def _ended_here(self, msg) -> bool:
        """An EOSE or CLOSED the connection deals with itself, never told to the manager:
        the answer to our own CLOSE, a second end of a subscription, one about no
        subscription of ours, an auth-required CLOSED whose REQ goes again after AUTH. A
        subscription open now is the one answered, whatever ended under its id before (a
        live REQ closed "rate-limited:" goes again under its id after the cooldown: seed
        91's year, day 204.95, its policy refusal was dropped as an echo of the old end)."""
        if msg.sub_id in self.subscriptions:
            return (isinstance(msg, wire.Closed) and self._for_want_of_auth(msg.prefix, msg.sub_id)
                    and self._retry_after_auth(msg))
        if msg.sub_id in self._closing:
            if isinstance(msg, wire.Closed):
                self._ended.add(msg.sub_id, *self._closing.pop(msg.sub_id))  # the answer to our own CLOSE
            return True
        if msg.sub_id in self._ended:
            self._drop("ended_subscription", misbehaved=False)  # a second EOSE or CLOSED: harmless
            return True
        # About no subscription of ours (or one the relay already ended): nothing to tell
        # the manager, and a stream of them spends the budget like unasked events.
        self._drop("unknown_subscription")
        return True

    def _reopened_after_auth(self, msg, data: bytes) -> bool:
        """The relay's first answer to an exchange's NEG-OPEN refuses it ``auth-required:``
        (NEG-ERR, or CLOSED naming it): with a key, authenticate and send the NEG-OPEN again,
        once, as a refused REQ is (``_retry_after_auth``); the exchange does not hear the
        refusal and waits for the answer, within its own deadline. A relay that read our
        NEG-OPEN before our AUTH would otherwise have NIP-77 turned off for the session. False
        (the exchange hears it: a refusal, REQ pages then) without a key or a challenge, once
        the relay refused our AUTH, or the second time (unless the relay may have read it
        before it took our AUTH: ``_again_once_taken``)."""
        resent = self._neg_resent.pop(msg.sub_id, None)
        if resent is not None:  # the answer to the one sent again
            if isinstance(msg, wire.NegMsg) or msg.prefix is not wire.Prefix.AUTH_REQUIRED:
                return False
            return not self._auth_refused and self._again_once_taken(msg.sub_id, ("neg", resent, data))
        opening = self._neg_opens.get(msg.sub_id)
        if opening is None:
            return False
        self._neg_opens[msg.sub_id] = None  # answered: what comes next is the exchange's
        if isinstance(msg, wire.NegMsg) or not self._for_want_of_auth(msg.prefix, msg.sub_id):
            return False
        if not (self._auth_secret and self._challenge) or self._auth_refused:
            return False
        log.debug("negentropy_sent_again_after_auth", relay=self.relay, sub_id=msg.sub_id)
        self._answer_challenge()
        self.send(opening)
        self._neg_resent[msg.sub_id] = opening
        if not self._auth_taken:
            self._auth_unconfirmed.add(msg.sub_id)
        return True

    def _again_once_taken(self, sub_id: str, what: tuple) -> bool:
        """``sub_id``, sent again after our AUTH, is refused for want of it again. Sent before
        the relay said OK to our AUTH, it may have been read before the relay took it (khatru
        reads each message in a task of its own: the AUTH's signature is still being checked
        when the REQ after it is refused): it goes once more, when the OK comes (at once if it
        came). Sent after the OK, the refusal is final (False)."""
        if sub_id not in self._auth_unconfirmed:
            return False
        self._auth_unconfirmed.discard(sub_id)
        if self._auth_taken:
            self._send_held(sub_id, what)
        else:
            self._held_for_auth[sub_id] = what
            if what[0] == "req":  # (unanswered still: a relay that never says OK stalls it)
                self._unanswered[sub_id] = time.monotonic()
        return True

    def _send_held(self, sub_id: str, what: tuple) -> None:
        """Send again what was refused before the relay took our AUTH, if still wanted."""
        if what[0] == "req":
            filters = self.subscriptions.get(sub_id)
            if filters is None:
                return  # (closed by us meanwhile)
            self._send_req(sub_id, filters)
        elif sub_id in self.neg_waiters:
            self.send(what[1])
        else:
            return
        log.debug("sent_again_once_authed", relay=self.relay, sub_id=sub_id)

    def _pass_on_refusal(self, sub_id: str, what: tuple) -> None:
        """The refusal held for our AUTH's answer, told now (the relay refused our AUTH)."""
        if what[0] == "req":
            if sub_id in self.subscriptions:
                self.book.relay_closed(sub_id)
                self._emit(RemoteMessage(self.relay, self.session, what[1]))
        else:
            self._to_negentropy([self.neg_waiters.get(sub_id)], what[2])

    def _to_negentropy(self, inboxes, data: bytes) -> None:
        """Hand a raw frame to NIP-77 exchanges (negentropy_ws parses and judges it): a
        NEG-MSG/NEG-ERR to the one exchange it names, a NOTICE or unreadable frame to all.
        A relay answers each of our messages once, so an exchange never has more than a
        few frames waiting; frames past NEG_INBOX_FRAMES, or for no exchange of ours, are a
        stream to nowhere: dropped and counted, not queued."""
        for inbox in inboxes:
            if inbox is None or inbox.qsize() >= NEG_INBOX_FRAMES:
                self._drop("unsolicited_negentropy")
            else:
                inbox.put(data)

    def _refused_by_notice(self, msg: wire.Notice) -> bool:
        """Some relays refuse a REQ with a NOTICE alone, naming no subscription: past their
        subscription cap (strfry's "too many concurrent REQs", nostr_relay's "rejected: too
        many subscriptions"), for a rate, or as invalid (nostream refuses a filter with a
        tag key it does not take, ``#E``, so: a REQ of several filters, split, had each of
        its shapes stall 30 s before, and a small repository's comments took 158 s). A
        relay reads our messages in order and refuses
        the REQ it has just read, so the refused one is taken to be the last REQ sent that
        it has not answered: the manager hears that REQ's CLOSED, as from relays that say
        CLOSED (the cap is learnt, or the REQ waits out the cooldown whole, instead of
        stalling, being split and sent filter by filter). A CLOSE goes out for it too, in
        case the guess is wrong and the relay holds it open. A NOTICE that repeats a CLOSED
        just received is only counted. False (an ordinary NOTICE) otherwise."""
        text = msg.text
        if not _refuses_a_req(text) or wire.is_negentropy_notice(text) or msg.sub_id is not None:
            return False  # (one about a NEG-OPEN goes to its exchange; one naming no REQ of ours is not ours)
        now = time.monotonic()
        whose_unknown = False
        if now - self._refusal_closed_at <= NOTICE_ECHO_SECS:
            sub_id = None  # the relay's CLOSED said it already
        elif self._probe_refused_by(text, now):
            return True
        else:
            by_words = _refuses_by_words(text)
            # (a REQ we closed before its answer may be the one refused: the relay read it
            # before the REQs sent since; seed 2140 of the stress world, a NOTICE refusing one
            # closed so was taken for a burst's, and a REQ it served was paused with the one
            # it refused)
            closed = set() if by_words else self.book.refusable_closed(now, NOTICE_REFUSAL_SECS)
            if not self._unanswered and not closed:
                return False
            sub_id, sent_at = next(reversed(self._unanswered.items()), (None, now))
            if now - sent_at > (NOTICE_REFUSAL_SECS if by_words else NOTICE_PREFIX_REFUSAL_SECS) and not closed:
                return False
            recent = set() if by_words else {
                s for s, at in self._unanswered.items() if now - at <= NOTICE_PREFIX_REFUSAL_SECS} | closed
            if len(recent) > 1:  # whose? Told by the others' answers (``_settle_notices``)
                self._open_notices.append((now, text, recent))
                del self._open_notices[:-NOTICES_OPEN]
                sub_id, whose_unknown = None, True
            elif recent and recent <= closed:
                sub_id = None  # the refusal of a REQ closed already: nothing more to do
                self.book.answered(next(iter(recent)))
        metrics.NOTICES.labels(wire.split_prefix(text)[0].value).inc()
        if sub_id is not None:
            self._take_notice(sub_id, text)
        elif whose_unknown:
            self._settle_notices()  # (as many NOTICEs as REQs among them already)
        return True

    def _probe_refused_by(self, text: str, now: float) -> bool:
        """A refusing NOTICE naming nothing, read soon after the precise probe went, no REQ
        waiting for its answer sent since nor this soon before it: the probe's CLOSED, and a
        whole REQ's chain of probes goes on (the simulator's seed 2102: a relay refusing
        ``#a`` so for a day and a half; the probe asking it never ended), and the manager
        hears it (``ProbeRefused``: a refusal of the shape pauses it there)."""
        probe, sent_at = self.book.probe_sub, self.book.probe_sent_at
        if probe is None or sent_at is None:
            return False
        if now - sent_at > (NOTICE_REFUSAL_SECS if _refuses_by_words(text) else NOTICE_PREFIX_REFUSAL_SECS):
            return False
        if any(at >= sent_at - NOTICE_PREFIX_REFUSAL_SECS for at in self._unanswered.values()):
            return False  # (whose? that REQ's, as likely: told as any REQ's below)
        prefix, rest = wire.split_prefix(text)
        metrics.NOTICES.labels(prefix.value).inc()
        log.info("notice_taken_as_closed", relay=self.relay, sub_id=probe, text=text[:200])
        self._probe_answered(wire.Closed(probe, prefix, rest))
        return True

    def _take_notice(self, sub_id: str, text: str) -> None:
        """``text``, a NOTICE, is ``sub_id``'s CLOSED (and a CLOSE goes out for it)."""
        prefix, rest = wire.split_prefix(text)
        log.info("notice_taken_as_closed", relay=self.relay, sub_id=sub_id, text=text[:200])
        beside = self.book.open_beside.get(sub_id, 0)  # (its CLOSE drops it from the book)
        self.book.answered(sub_id)  # (the relay read it: not a REQ closed unanswered)
        self._unanswered.pop(sub_id, None)
        self.unsubscribe(sub_id)
        self._emit(RemoteMessage(self.relay, self.session, wire.Closed(sub_id, prefix, rest), beside=beside))

    def _explained(self, sub_id: str) -> None:
        """``sub_id`` was refused in a CLOSED too: the oldest open NOTICE it may have been is
        its own, not another REQ's."""
        for i, (_, _, candidates) in enumerate(self._open_notices):
            if sub_id in candidates:
                del self._open_notices[i]
                return

    def _settle_notices(self) -> None:
        """Refusing NOTICEs that came while several REQs just sent waited for their answers:
        a REQ refused so is never answered, so once the others have been, those left are
        the refused ones: a NOTICE left with one of them, or as many NOTICEs as REQs left
        among the same ones, are their CLOSEDs. (A relay refusing several of a burst, such
        as every live REQ holding ``#E``, says so in as many NOTICEs; taken for the last
        REQ, each could have paused a REQ the relay served.) Past NOTICE_REFUSAL_SECS an
        open NOTICE is dropped: its REQ's stall finds it."""
        now, taken = time.monotonic(), False
        still = []
        closed = self.book.closed_unanswered
        for at, text, candidates in self._open_notices:
            if now - at <= NOTICE_REFUSAL_SECS:
                candidates &= self._unanswered.keys() | closed.keys()
                if candidates:
                    still.append((at, text, candidates))
        for _, _, candidates in still:
            alike = [n for n in still if n[2] == candidates]
            if len(candidates) == 1 or len(alike) == len(candidates):
                for (_, said, _), sub_id in zip(alike, sorted(candidates, key=self.book.sent_order), strict=False):
                    if sub_id in closed:
                        self.book.answered(sub_id)  # (refused after we closed it: nothing more to do)
                    else:
                        self._take_notice(sub_id, said)
                still = [n for n in still if n[2] != candidates]
                taken = True
                break
        self._open_notices = still
        if taken and still:
            self._settle_notices()

    def _count_notice(self, msg: wire.Notice) -> bool:
        """Counted by prefix; each spends a misbehaviour point (a relay says little this way:
        a stream of NOTICEs is a stream of log lines). False if that hung up."""
        metrics.NOTICES.labels(wire.split_prefix(msg.text)[0].value).inc()
        self._misbehaved()
        return not self.closed

    def _handle_event(self, msg: wire.RelayEvent) -> None:
        if self._probe:
            evented = self._evented
            evented.add(msg.sub_id)
            if len(evented) > 1024:  # (subscriptions ended without an EOSE: at worst one needless probe)
                evented.clear()
        filters = (self.subscriptions.get(msg.sub_id) or self._closing.get(msg.sub_id)
                   or self._ended.get(msg.sub_id))
        event_id = msg.event.get("id") if isinstance(msg.event.get("id"), str) else None
        if filters is None:
            self._drop("unknown_subscription", event_id)
            return
        if self._probe and any(map(is_imprecise, filters.filters)):  # (the probe's own: ``_probe_answered``)
            # a REQ with an imprecise filter brought an event: the relay does not answer such
            # REQs with nothing (a "scraper" gets nothing at all): no probe this session (the
            # simulator's --rs-software relays were probed every hour)
            self._probe, self._evented = False, set()
        # An id already handed to delivery (or held by the own relay) is never delivered
        # again, so its signature need not be checked twice; the event still counts for
        # pagination. Relays send many such duplicates (a comment matches #e and #E).
        known = event_id is not None and (event_id in self._seen or event_id in self._checked)
        try:
            event = parse_event(msg.event, check_id=False, check_sig=False)
            # What we did not ask for is dropped before its signature costs anything.
            matched = filters.matching(event)
            if matched and not known:
                verify_event(event)
        except EventError as exc:
            self._drop(exc.reason, event_id)
            return
        if not matched:
            if filters.matches_apart_from_time(event):
                # What we asked for, outside the time bounds we gave: a relay that ignores
                # ``since`` sends a page of these to every poll and reconnect. Not junk.
                self._drop("outside_time_bounds", event_id, misbehaved=False)
                # (a relay ignoring ``until`` sends its stored newest again; an event published
                # while the page was open, sent to it by a relay that matches live events without
                # their time bounds, is dated about now: no sign, and counted, it would mark a
                # relay paging rightly as one ignoring ``until`` for its session; clocks drift as
                # ``RECONNECT_OVERLAP_SECS``)
                stored = event.created_at < time.time() - constants.RECONNECT_OVERLAP_SECS
                for i in filters.newer_than_until(event) if stored else ():
                    counts = self._past_until.setdefault(msg.sub_id, [0] * len(filters.filters))
                    counts[i] += 1
            else:
                self._drop("no_matching_filter", event_id)
            return
        if not known:
            # The manager learns of it only when it takes the event off its queue; copies
            # arriving before that (other filters of the same REQ) are recognised here.
            self._checked[event.id] = None
            self._checked_order.append(event.id)
            if len(self._checked_order) > CHECKED_CAPACITY:
                del self._checked[self._checked_order.popleft()]
        self._events.append(RemoteEvent(self.relay, self.session, msg.sub_id, event, not known, matched))

    def _maybe_probe(self, sub_id: str, sent_at: float | None = None) -> None:
        """An EOSE: if its REQ brought nothing and asked an imprecise filter, ask the probe
        (of its filters asking stored events, the imprecise ones first; once an hour). Not on
        an answer of nothing that came slowly (``sent_at``: when the REQ went, if this EOSE
        was its first answer): a relay that answers only precise queries refuses a "scraper"
        before any query, at once; a slow nothing may be a query
        its time budget stopped, asked once more (``FilterPaginationState.next_page``), and a
        probe answered then would mark the relay as answering only precise queries."""
        brought = sub_id in self._evented
        self._evented.discard(sub_id)
        filters = self.subscriptions.get(sub_id)
        if brought or filters is None:
            return
        # (a live REQ's ``limit: 0`` asks for nothing stored: its nothing says nothing)
        stored = [f for f in filters.filters if f.limit != 0]
        imprecise = [f for f in stored if is_imprecise(f)]
        # one that asked history whole (no ``since``: a sync's first page) is its own trigger,
        # an hour after the last of its kind, whatever probes of the last hour's REQs went since
        whole = all(f.since is None for f in imprecise)
        now = time.monotonic()
        asked_at = self._probe_whole_at if whole else self._probe_asked_at
        if not imprecise or (asked_at is not None and now - asked_at < PROBE_AGAIN_SECS):
            return
        if sent_at is not None and slow_answer(now - sent_at):
            return
        self._probe_asked_at = now
        if whole:
            self._probe_whole_at = now
        # its precise filters too, after them: such a relay ignores them beside an imprecise
        # one, and one holding nothing the imprecise ones ask but what the precise ones do (a
        # repository's states, its ``#d``) was never proven so, and every state published
        # there was lost (the simulator's seed 847 of the every-behaviour world: relay2)
        trigger = imprecise + [f for f in stored if not is_imprecise(f) and f.ids is None]
        self._probe_trigger, self._probe_retried = trigger, False
        self._probe_chain = len(trigger) - 1 if whole else 0
        self._emit(ProbeWanted(self.relay, self.session, tuple(trigger)))

    def _probe_answered(self, msg) -> None:
        """The probe's events are counted, not told; at its end (EOSE, CLOSED) it is closed,
        and if it brought an event that the REQ which came back empty asked for (one of its
        imprecise filters matches it), the relay held it and did not send it: the manager
        hears that the relay answers only precise queries (``ImpreciseIgnored``), and
        nothing is asked again this session. Anything else it brings proves nothing: the
        REQ may have asked for what the relay does not hold (replies to roots that have
        none; before, every relay of that make was marked so by the first such REQ, and its
        layer 1 asked the owners' announcements only, a maintainer's not)."""
        if isinstance(msg, wire.RelayEvent):
            try:
                event = parse_event(msg.event)
            except EventError:
                return
            self._probe_events += proves_ignored(self._probe_trigger, event)
            return
        if not isinstance(msg, (wire.Eose, wire.Closed)):
            return
        sent_at = self.book.probe_sent_at
        close = self.book.probe_ended()
        if isinstance(msg, wire.Eose) and close is not None:
            self.send(close)
        if isinstance(msg, wire.Closed):  # (refused: its shape may be paused there)
            self._emit(ProbeRefused(self.relay, self.session, msg.prefix.value, msg.text))
        if self._probe_events:
            self._probe, self._evented = False, set()
            self._emit(ImpreciseIgnored(self.relay, self.session))
        elif (isinstance(msg, wire.Eose) and not self._probe_retried and sent_at is not None
              and slow_answer(time.monotonic() - sent_at)):
            # nothing, slowly: a time budget may have stopped it before its first event (as a
            # page's, ``FilterPaginationState.next_page``): the same probe once more (the
            # simulator's seed 1508: a slow relay answering only precise queries, its first
            # probe cut so, and every later REQ a poll asking what came since, unproven for days)
            self._probe_retried = True
            self._emit(ProbeWanted(self.relay, self.session, tuple(self._probe_trigger), again=True))
        elif self._probe_chain > 0 and (isinstance(msg, wire.Eose)
                                        or msg.prefix not in (wire.Prefix.RATE_LIMITED, wire.Prefix.AUTH_REQUIRED)):
            # nothing, and the REQ that came back empty asked history whole (a sync's first
            # page, no ``since``): its next filter's probe at once, not one a PROBE_AGAIN_SECS,
            # whose later REQs ask the last hour only. One filter a day in turn, a relay
            # answering only precise queries and holding one repository's old issue (its
            # ``#a``) went unproven for days (the simulator's seed 2102 of an every-behaviour
            # world with slow and nostr-rs relays: the issue never came). A probe refused
            # (that shape blocked there) tells nothing of the others: the next goes too; not
            # after a refusal for our rate, or for want of AUTH (each would be refused so)
            self._probe_chain -= 1
            self._emit(ProbeWanted(self.relay, self.session, tuple(self._probe_trigger)))

    def _answer_challenge(self) -> None:
        """NIP-42: answer the relay's current challenge with our key, once. What went before
        it unanswered is noted: a relay refusing it by NOTICE has it sent again
        (``_auth_notice``), at once if such NOTICEs came before the challenge."""
        if not self._auth_secret or not self._challenge or self._challenge == self._answered:
            return
        self._answered = self._challenge
        event = auth_event(self._auth_secret, self.relay, self._challenge, self._now())
        self._auth_event_id = event.id
        self.send(wire.auth(event))
        self._before_auth = [*self._unanswered, *(s for s, o in self._neg_opens.items() if o is not None)]
        self._sent_before_auth = frozenset(self._before_auth)
        self._auth_notices_owed = 0
        if self._auth_notices_early:
            early, self._auth_notices_early = self._auth_notices_early, 0
            self._auth_notices_owed = max(0, self._send_again_after_auth() - early)

    def _notice_naming(self, msg: wire.Notice):
        """A NOTICE naming a subscription of ours (``["NOTICE", <sub_id>, <message>]``, a form
        NIP-01 had in 2023) that refuses (``_refuses_a_req``) is that subscription's CLOSED:
        no guess about whose it is. Any other is a NOTICE as any."""
        sub_id = msg.sub_id
        if (sub_id in self.subscriptions or sub_id in self.neg_waiters) and _refuses_a_req(msg.text):
            prefix, rest = wire.split_prefix(msg.text)
            metrics.NOTICES.labels(prefix.value).inc()
            return wire.Closed(sub_id, prefix, rest)
        return msg

    def _auth_notice(self, msg: wire.Notice) -> bool:
        """A NOTICE ``auth-required:`` (or ``restricted:`` while something read before our
        AUTH waits, ``_for_want_of_auth``). Some relays refuse so, naming nothing, what they read
        before our AUTH (a connect's REQs go before its challenge is read): without this
        they were never answered, a live REQ dead for the whole session. With a key, what
        went before our AUTH and is not answered goes again after it, once, as after an
        auth-required CLOSED (``_retry_after_auth``); the NOTICEs for the rest of it are
        counted only, and one come before any challenge waits for our AUTH. True when taken
        so (no exchange or subscription hears it: their answers follow). False without a key,
        once the relay refused our AUTH, or past what went before it: a refusal then
        (``_refused_by_notice``), as an auth-required CLOSED is."""
        prefix = wire.split_prefix(msg.text)[0]
        if prefix not in (wire.Prefix.AUTH_REQUIRED, wire.Prefix.RESTRICTED) or msg.sub_id is not None:
            return False
        if not self._auth_secret or self._auth_refused:
            return False
        if prefix is wire.Prefix.RESTRICTED and not (self._auth_notices_owed or self._unanswered_before_auth()):
            return False  # (nothing read before our AUTH waits: a refusal as any)
        if self._answered is None:  # (our AUTH is to go when the challenge comes)
            if self._auth_notices_early >= len(self._unanswered) + len(self._neg_opens):
                return False
            self._auth_notices_early += 1
        elif self._auth_notices_owed > 0:
            self._auth_notices_owed -= 1
        else:
            sent = self._send_again_after_auth() or self._notices_before_auth_taken(msg)
            if not sent:
                return False
            self._auth_notices_owed = sent - 1
        metrics.NOTICES.labels(prefix.value).inc()
        return True

    def _notices_before_auth_taken(self, msg: wire.Notice) -> int:
        """An ``auth-required:`` NOTICE after what went again after our AUTH: the relay may
        have read those REQs before it took our AUTH (``_again_once_taken``, told by NOTICEs
        naming nothing): the ones sent before its OK and still unanswered go once more, on
        the OK (at once if it came). How many; 0 (a refusal) when none."""
        prefix, text = wire.split_prefix(msg.text)
        if prefix is not wire.Prefix.AUTH_REQUIRED:
            return 0
        again = [s for s in self._auth_unconfirmed if s in self._unanswered and s in self.subscriptions]
        for sub_id in again:
            self._again_once_taken(sub_id, ("req", wire.Closed(sub_id, prefix, text)))
        return len(again)

    def _for_want_of_auth(self, prefix: wire.Prefix | None, sub_id: str) -> bool:
        """A refusal that our AUTH may answer: ``auth-required:``, or ``restricted:`` for a
        REQ or NEG-OPEN the relay read before our AUTH. NIP-42 has a relay say
        ``auth-required:`` until the client authenticates, but some say ``restricted:``
        (nostr_relay: ``restricted: permission denied`` in a NOTICE to each REQ read before
        the AUTH it asked for at connect); taken as final, the live REQ of layer 1 was
        paused there for a day."""
        return prefix is wire.Prefix.AUTH_REQUIRED or (prefix is wire.Prefix.RESTRICTED
                                                       and sub_id in self._sent_before_auth)

    def _unanswered_before_auth(self) -> bool:
        """Something read before our AUTH still waits to go again after it."""
        return any(s in self._unanswered or self._neg_opens.get(s) is not None for s in self._before_auth)

    def _send_again_after_auth(self) -> int:
        """Send again, after our AUTH, the REQs and NEG-OPENs read before it that are still
        unanswered (each once a session); how many went."""
        sent = 0
        for sub_id in self._before_auth:
            opening = self._neg_opens.get(sub_id)
            if opening is not None:
                self._neg_opens[sub_id] = None
                self.send(opening)
                sent += 1
            elif sub_id in self._unanswered and self._resend_req(sub_id):
                sent += 1
        self._before_auth = []
        if sent:
            log.debug("sent_again_after_auth", relay=self.relay, count=sent)
        return sent

    def _resend_req(self, sub_id: str) -> bool:
        """Send open REQ ``sub_id`` again as it is, once a session (after our AUTH): unanswered
        from now. False if it is not open or went again already."""
        filters = self.subscriptions.get(sub_id)
        if filters is None or sub_id in self._auth_retried:
            return False
        self._auth_retried.add(sub_id)
        self._send_req(sub_id, filters)
        if not self._auth_taken:
            self._auth_unconfirmed.add(sub_id)
        return True

    def _send_req(self, sub_id: str, filters) -> None:
        """Send open REQ ``sub_id`` again as it is: unanswered from now."""
        self._unanswered.pop(sub_id, None)
        self._unanswered[sub_id] = time.monotonic()
        self.send(wire.req(sub_id, filters.filters))

    def _retry_after_auth(self, msg: wire.Closed) -> bool:
        """A REQ refused with ``auth-required:``: with a key, authenticate (if the challenge
        is not answered yet) and send it again, once; the AUTH goes out first, so the relay
        reads it first. False — the manager hears the refusal, a policy refusal — without
        a key or a challenge, once the relay refused our AUTH, or the second time (unless
        the relay may have read it before it took our AUTH: ``_again_once_taken``)."""
        sub_id = msg.sub_id
        if not (self._auth_secret and self._challenge and sub_id in self.subscriptions):
            return False
        if self._auth_refused:
            return False
        if sub_id in self._auth_retried:  # (``restricted:`` after our AUTH: not allowed, final)
            return msg.prefix is wire.Prefix.AUTH_REQUIRED and self._again_once_taken(sub_id, ("req", msg))
        self._answer_challenge()
        return self._resend_req(sub_id)

    def _now(self) -> int:
        return int((self._clock or time.time)())


# A NOTICE with one of these prefixes refuses what it was sent about (NIP-01's machine-
# readable prefixes): a relay that validates a REQ before reading it answers so, with no
# CLOSED and no EOSE (nostream: ``invalid: "#E" is not allowed``, its filter schema takes
# tag keys ``#a``-``#z`` only).
_REFUSING_PREFIXES = frozenset({wire.Prefix.INVALID, wire.Prefix.BLOCKED, wire.Prefix.RESTRICTED,
                                wire.Prefix.UNSUPPORTED, wire.Prefix.AUTH_REQUIRED})


def _refuses_by_words(text: str) -> bool:
    """Wording that refuses a REQ for the number open, for a rate, or for the ``limit`` it
    asks (nostream says each in a NOTICE with no prefix: "Subscription rejected: Limit too
    high: …", ``wire.limit_allowed``)."""
    return (wire.says_too_many_subscriptions(text) or wire.is_rate_limit_text(text)
            or wire.limit_allowed(text) is not None)


def _refuses_a_req(text: str, prefix: wire.Prefix | None = None) -> bool:
    """Wording that refuses a REQ (``_refuses_by_words``), or for its size ("too many values
    in filter"; strfry before it named the REQ in a CLOSED: "ERROR: bad req: total filter
    items too large"), or a refusing prefix (``prefix``: a CLOSED's, already split off; else
    read from ``text``). Only the first is taken for the last REQ sent however many wait:
    the rest is told from the others' answers (``_settle_notices``)."""
    if prefix is None:
        prefix = wire.split_prefix(text)[0]
    return (prefix in _REFUSING_PREFIXES or _refuses_by_words(text) or wire.is_filter_shape_refusal(text)
            or "bad req:" in text.lower())


def _concerns_negentropy(msg) -> bool:
    """NEG-MSG / NEG-ERR, any NOTICE (one between a NEG-OPEN and its first answer is that
    exchange's refusal, whatever its words: the exchange judges), or a frame too broken to
    tell."""
    return isinstance(msg, (wire.NegMsg, wire.NegErr, wire.Malformed, wire.Notice))


def auth_event(secret: str, relay: str, challenge: str, now: int):
    """NIP-42 kind 22242 answer to a challenge."""
    return sign_event(
        secret, created_at=now, kind=22242, tags=[["relay", relay], ["challenge", challenge]]
    )

