"""Delivery to the own relay: pipelined EVENTs over a small pool of connections ("lanes").

Every submitted event is tracked until the own relay answers it for good (SPEC §2):
``OK true`` (also ``duplicate:`` and GRASP's ``purgatory:``) is delivered; ``rate-limited``
slows the lane and retries; ``auth-required`` authenticates (NIP-42) and retries; a missing
OK or a dropped connection retries on a fresh connection; ``error:`` or another prefix is
retried with a growing delay, ten attempts over about an hour, then given up as a refusal
(``sync.delivery_retry``); ``invalid``/``blocked``/
``restricted``/``pow``/``mute`` (or a refusal after AUTH) is final and reported so the
manager can remember it in the rejected index. Nothing is dropped silently: a relay that hangs
up (LocalRelay does, silently, when a connection's message budget runs out) only causes a
retry on a fresh connection. Lanes also retire a connection after ``frames_per_connection``
frames, because some relays budget messages per connection.

Delivery is fair between the remote relays events come from (their *source*): waiting
events are taken from each source in turn, and when the backlog is full only sources holding
more than a small allowance stop reading. A relay pouring thousands of genuine events in
(a spammer, or one big history) costs another relay's next event one turn, not thousands.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections import deque

import gevent
import gevent.event

from .. import constants
from ..ops import metrics
from ..ops.logging import get_logger
from ..protocol import messages as wire
from ..protocol import wsframes
from ..protocol.event import Event
from ..protocol.filters import Filter
from ..sync.delivery_retry import refusal_retry_delay
from ..sync.have_index import HaveIndex
from ..sync.own_held import HeldEntry
from .inbox import DeliveryAnswered, DeliveryCaughtUp, OwnEvents, OwnHeldConfirmed, OwnRelayState
from .own_auth import AuthTags
from .ws import StalledMessage, Timeout
from .ws import connect as ws_connect

log = get_logger("gsync.delivery")

FINAL_REFUSALS = {
    wire.Prefix.INVALID,
    wire.Prefix.BLOCKED,
    wire.Prefix.RESTRICTED,
    wire.Prefix.POW,
    wire.Prefix.MUTE,
}
CONNECT_TIMEOUT_SECS = 10.0
MAX_RATE_PAUSE_SECS = 30.0
# While more than half a lane's window is unanswered, its reader pauses this long between
# reads so that OKs are handled in bursts (a relay writes them one by one as it stores).
OK_COALESCE_SECS = 0.025


class _FairQueue:
    """Events waiting for a lane: one FIFO per source, served in turn; events put back
    (a retry, a lane that dropped) go before all of them."""

    def __init__(self):
        self._front: deque[Event] = deque()
        self._by_source: dict[str, deque[Event]] = {}
        self._turns: deque[str] = deque()  # sources with events, next first

    def __bool__(self) -> bool:
        return bool(self._front or self._turns)

    def append(self, event: Event, source: str = "") -> None:
        queue = self._by_source.get(source)
        if queue is None:
            queue = self._by_source[source] = deque()
            self._turns.append(source)
        queue.append(event)

    def appendleft(self, event: Event) -> None:
        self._front.appendleft(event)

    def popleft(self) -> Event:
        if self._front:
            return self._front.popleft()
        source = self._turns[0]
        queue = self._by_source[source]
        event = queue.popleft()
        if queue:
            self._turns.rotate(-1)  # its next event waits for the others' turns
        else:
            del self._by_source[source]
            self._turns.popleft()
        return event


class SourceRoom:
    """What a relay connection waits on before reading more (``wait``): while the backlog
    is full, a source holding DELIVERY_SOURCE_ALLOWANCE events or more waits for room; one
    holding fewer reads on, so a flood from one relay never holds up another's live events."""

    def __init__(self, delivery: OwnRelayDelivery, source: str):
        self._delivery = delivery
        self._source = source

    def wait(self) -> None:
        delivery = self._delivery
        while (not delivery.room.is_set()
               and delivery.held_by(self._source) >= constants.DELIVERY_SOURCE_ALLOWANCE):
            delivery.room.wait()


class _Lane:
    """One connection's in-flight table and pacing."""

    def __init__(self, index: int):
        self.index = index
        self.ws = None
        self.session = 0
        self.in_flight: dict[str, tuple[Event, float]] = {}
        self.frames = 0
        self.challenge: str | None = None
        self.authed = False  # our AUTH went on this connection
        self.auth_id = ""  # its event id, the tag it named (``AuthTags``), and when it went
        self.auth_tag = ""
        self.auth_sent_at = 0.0
        self.auth_tried: set[str] = set()  # the tags named for this connection's challenge
        self.auth_taken_at: float | None = None  # the relay said OK true to it
        self.auth_refused = False  # ... OK false
        self.paused_until = 0.0
        self.rate_pause = 0.0
        self.wake = gevent.event.Event()
        # The relay ended the connection (not a retirement of ours): the relay may be
        # restarting, so the lane counts as down until it has dialled again.
        self.lost = False
        self.sent_at = 0.0  # the clock's time of the last frame sent: idle lanes ping


class OwnRelayDelivery:
    def __init__(
        self,
        url: str,
        post,
        *,
        lanes: int = 3,
        window: int = 400,
        frames_per_connection: int = 5000,
        ok_timeout: float = 30.0,
        max_backlog: int = constants.DELIVERY_MAX_BACKLOG,
        auth_secret: str | None = None,
        auth_tags: AuthTags | None = None,
        clock=time.monotonic,
        wallclock=time.time,
    ):
        self.url = url
        self._post = post
        self._window = window
        self._refill_at = window // 2
        self._frames_per_connection = frames_per_connection
        self._ok_timeout = ok_timeout
        self._max_backlog = max_backlog
        self._hard_limit = 2 * max_backlog + constants.DELIVERY_BACKLOG_SLACK
        self._auth_secret = auth_secret
        self._auth_tags = auth_tags or AuthTags(url)
        self._clock = clock
        self._wallclock = wallclock
        self._lanes = [_Lane(i) for i in range(lanes)]
        self._queue = _FairQueue()
        self._init_tracking()
        self._greenlets: list[gevent.Greenlet] = []
        self._stopping = False
        self._down_since: float | None = None
        self._idle = gevent.event.Event()
        self._idle.set()
        self._wake_below: int | None = None  # post DeliveryCaughtUp under this backlog
        # Set while the backlog has room: relay connections wait on it before reading more.
        self.room = gevent.event.Event()
        self.room.set()
        self._bytes_up = metrics.BYTES_UP.labels("own")
        self._init_reports()

    def _init_tracking(self) -> None:
        """The events submitted and not yet answered for good, and their retries."""
        self._tracked: dict[str, Event] = {}  # submitted, not yet answered for good
        self._sources: dict[str, str] = {}  # id → the remote it came from ("": none), while tracked
        self._held: dict[str, int] = {}  # tracked events per source
        # The same events by what filters select on, for NIP-77 have-sets. Indexed when an
        # exchange asks (most events are answered before any does), not on submit.
        self._tracked_index = HaveIndex()
        self._unindexed: dict[str, Event] = {}
        # event id -> (refusals so far, when the first came) of each event being retried;
        # with when the own relay last stored one: an event given up with nothing stored
        # since its first refusal was refused with everything else (a full disk, a broken
        # database), not for what it is
        self._attempts: dict[str, tuple[int, float]] = {}
        self._stored_at = float("-inf")
        self._retry_heap: list[tuple[float, int, Event]] = []
        # ids waiting in the retry heap: tracked (they count against the hard limit) but not
        # part of the backlog that pauses reading and holds historic starts
        self._parked: set[str] = set()
        self._seq = itertools.count()

    def _init_reports(self) -> None:
        """What the own relay's answers add up to, told to the manager once per read burst."""
        self._outcomes: dict = {}
        self._delivered_uncounted = 0
        # Roots and announcements the own relay accepted (its OK), told to the manager once
        # per read burst: the self-subscription should show them too, but a relay may drop
        # live events for a subscriber that reads too slowly (LocalRelay does, under load),
        # and a root it never shows is a thread never synced.
        self._accepted_roots: list[Event] = []
        self._accepted_duplicates: set[str] = set()  # those of them answered duplicate:
        # Everything it answered OK true to (stored and served), told to the manager once
        # per read burst too: the session's knowledge of what it holds (``sync.own_held``).
        self._confirmed: list = []
        self._stored_anew: list[str] = []  # those it stored anew (not ``duplicate``)

    # -- manager-facing -----------------------------------------------------------------

    def start(self) -> None:
        self._greenlets = [gevent.spawn(self._run_lane, lane) for lane in self._lanes]
        self._greenlets.append(gevent.spawn(self._retry_loop))

    def submit(self, event: Event, source: str = "") -> bool:
        """Queue an event for delivery. False if it is already tracked, or if the backlog is
        past its hard limit (connections stop reading at ``max_backlog``, so beyond it come
        only bursts already read, one per connection at most, and sources' allowances): that
        drop is counted and logged. ``source`` (the remote it came from) decides whose turn
        it waits for, and comes back with a refusal."""
        if event.id in self._tracked:
            return False
        held = len(self._tracked)  # in memory, retries waiting included: reading stops here
        if held >= self._max_backlog:
            if self.room.is_set():
                log.warning("delivery_backlog_full", backlog=held, limit=self._max_backlog)
                self.room.clear()
        if len(self._tracked) >= self._hard_limit:  # retries waiting included: memory
            metrics.DROPS.labels("own_relay_backlog_full").inc()
            log.warning("event_dropped", reason="own_relay_backlog_full", event_id=event.id)
            return False
        self._tracked[event.id] = event
        self._sources[event.id] = source
        self._held[source] = self._held.get(source, 0) + 1
        self._unindexed[event.id] = event
        self._queue.append(event, source)
        self._idle.clear()
        self._wake_lanes()
        return True

    def is_tracked(self, event_id: str) -> bool:
        return event_id in self._tracked

    def held_by(self, source: str) -> int:
        """Tracked events that came from ``source``."""
        return self._held.get(source, 0)

    def room_for(self, source: str) -> SourceRoom:
        return SourceRoom(self, source)

    def tracked_matching(self, flt: Filter) -> list[tuple[int, str]]:
        """(created_at, id) of the events not yet answered that ``flt`` matches: part of a
        NIP-77 have-set for that filter (the own relay will hold them)."""
        index = self._tracked_index
        for event_id, event in self._unindexed.items():
            index.add(event_id, event)
        self._unindexed.clear()
        return index.matching(flt)

    def oldest_answer_wait(self) -> float:
        """Seconds the oldest event in flight has waited for its OK (0: none in flight): how
        far behind the own relay is with what gsync sends it."""
        now = self._clock()
        return max((now - next(iter(lane.in_flight.values()))[1]
                    for lane in self._lanes if lane.in_flight), default=0.0)

    def answering_slowly(self) -> bool:
        """Is the own relay slow to answer what delivery sends it? Reads of it wait then."""
        return self.oldest_answer_wait() > constants.OWN_BUSY_OK_WAIT_SECS

    @property
    def backlog(self) -> int:
        """Events being delivered: tracked, less those waiting out a retry delay."""
        return len(self._tracked) - len(self._parked)

    def wake_below(self, backlog: int) -> None:
        """Post ``DeliveryCaughtUp`` once, as soon as fewer than ``backlog`` events are
        tracked (at once if that is already so): the manager holds historic starts while
        delivery is behind and starts them again the moment it has caught up."""
        if self.backlog < backlog:
            self._wake_below = None
            self._post(DeliveryCaughtUp())
        else:
            self._wake_below = backlog

    def drain(self, timeout: float) -> bool:
        """Wait until every tracked event has its final answer (SIGTERM). True if drained."""
        return self._idle.wait(timeout) and not self._tracked

    def stop(self) -> None:
        self._stopping = True
        for lane in self._lanes:
            self._close_lane(lane)
        gevent.killall(self._greenlets, block=False)

    # -- lanes --------------------------------------------------------------------------

    def _wake_lanes(self) -> None:
        for lane in self._lanes:
            lane.wake.set()

    def _run_lane(self, lane: _Lane) -> None:
        backoff = 0.5
        while not self._stopping:
            try:
                lane.ws = ws_connect(self.url, CONNECT_TIMEOUT_SECS)
            except Exception as exc:
                self._lane_down(lane, f"connect failed: {type(exc).__name__}")
                gevent.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.5
            lane.session += 1
            lane.frames = 0
            lane.sent_at = self._clock()
            lane.authed = lane.auth_refused = False
            lane.challenge = lane.auth_taken_at = None
            lane.auth_tried = set()
            self._lane_up()
            reader = gevent.spawn(self._read_lane, lane, lane.ws, lane.session)
            try:
                self._send_lane(lane)
            finally:
                reader.kill(block=False)
                self._close_lane(lane)
                self._requeue_in_flight(lane, "retry_disconnect")
            if lane.lost:
                # Down before dialling again: a relay that restarts faster than a dial still
                # finds every lane down at once, and its outage is noticed (what it held in
                # memory may be gone: ``OwnRelayState``).
                lane.lost = False
                self._lane_down(lane, "connection lost")
                gevent.sleep(backoff)

    def _send_lane(self, lane: _Lane) -> None:
        ws, session = lane.ws, lane.session
        while not self._stopping and lane.ws is ws and lane.session == session:
            now = self._clock()
            if self._expire_in_flight(lane, now):
                return  # a missing OK: the connection is suspect, start a fresh one
            if lane.frames >= self._frames_per_connection:
                if not lane.in_flight:
                    return  # retire the connection: a fresh one has a fresh budget
            elif now >= lane.paused_until and self._queue and len(lane.in_flight) <= self._refill_at:
                # Everything the window and the frame budget allow, in one socket write. The
                # window is refilled only once half of it is answered: a few large writes
                # instead of one per burst of OKs, with half a window still in flight.
                room = min(self._window - len(lane.in_flight),
                           self._frames_per_connection - lane.frames)
                texts = []
                while self._queue and len(texts) < room:
                    event = self._queue.popleft()
                    if event.id not in self._tracked or event.id in lane.in_flight:
                        continue
                    lane.in_flight[event.id] = (event, now)
                    texts.append(wire.event(event))
                if texts:
                    lane.frames += len(texts)
                    lane.sent_at = now
                    ws.settimeout(CONNECT_TIMEOUT_SECS)
                    try:
                        ws.send_many(texts)
                    except Exception:
                        lane.lost = True
                        return  # a broken connection: its in-flight events go to a fresh one
                    self._bytes_up.inc(sum(map(len, texts)))
                continue
            if now - lane.sent_at >= constants.OWN_IDLE_PING_SECS:
                # An idle lane pings, as the self-subscription does: a proxy in front of the
                # relay then never closes it for silence, so a lane lost is news (``lost``).
                lane.sent_at = now
                ws.settimeout(CONNECT_TIMEOUT_SECS)  # the reader's is None: a write must end
                try:
                    ws.ping()
                except Exception:
                    lane.lost = True
                    return
            lane.wake.clear()
            pause = lane.paused_until - now
            lane.wake.wait(timeout=min(1.0, pause) if pause > 0 else 1.0)

    def _read_lane(self, lane: _Lane, ws, session: int) -> None:
        try:
            ws.settimeout(None)
            while True:
                try:
                    burst = ws.recv_burst()
                except StalledMessage:
                    raise
                except Timeout:
                    # The socket's timeout is the sender's (it sets one for its writes):
                    # silence is no end. Idle lanes ping; an OK that never comes ends the
                    # connection in the sender (``_expire_in_flight``).
                    continue
                for opcode, data in burst:
                    if opcode == wsframes.OP_CLOSE:
                        raise ConnectionError("closed by the own relay")
                    msg = wire.parse_relay_message(data)
                    if isinstance(msg, wire.Ok):
                        self._on_ok(lane, msg)
                    elif isinstance(msg, wire.AuthChallenge):
                        lane.challenge = msg.challenge
                self._count_delivered()
                if len(lane.in_flight) > self._refill_at:
                    # Nothing waits on these answers until half the window is back: let a
                    # few more arrive and read them together (one wake-up instead of many).
                    gevent.sleep(OK_COALESCE_SECS)
        except Exception:
            pass
        finally:
            self._count_delivered()
        if lane.session == session:
            lane.lost = lane.ws is ws  # not closed by the sender: the relay ended it
            self._close_lane(lane)
            lane.wake.set()

    def _close_lane(self, lane: _Lane) -> None:
        ws, lane.ws = lane.ws, None
        if ws is not None:
            try:
                ws.close(timeout=1)
            except Exception:
                pass

    # -- answers ------------------------------------------------------------------------

    def _on_ok(self, lane: _Lane, ok: wire.Ok) -> None:
        if lane.authed and ok.event_id == lane.auth_id:  # the answer to our AUTH
            if ok.accepted:
                lane.auth_taken_at = self._clock()
                self._auth_tags.taken(lane.auth_tag)
            else:
                self._auth_tags.refused(lane.auth_tag, lane.auth_tried)
                if not self._send_auth(lane):  # refused naming each URL the relay may go by
                    lane.auth_refused = True
            return
        entry = lane.in_flight.pop(ok.event_id, None)
        if len(lane.in_flight) <= self._refill_at:
            lane.wake.set()  # the sender refills only then: waking it earlier is wasted work
        if entry is None:
            return
        event = entry[0]
        if ok.accepted:
            lane.rate_pause = 0.0
            prefix = ok.prefix
            outcome = ("duplicate" if prefix is wire.Prefix.DUPLICATE
                       else "purgatory" if prefix is wire.Prefix.PURGATORY else "delivered")
            self._finish(event, outcome, ok.text)
        elif ok.prefix is wire.Prefix.RATE_LIMITED or wire.is_rate_limit_text(ok.text):
            lane.rate_pause = min(MAX_RATE_PAUSE_SECS, max(0.5, lane.rate_pause * 2))
            lane.paused_until = self._clock() + lane.rate_pause
            self._outcome("retry_rate_limited").inc()
            self._queue.appendleft(event)
        elif ok.prefix is wire.Prefix.AUTH_REQUIRED:
            if self._auth_secret and lane.challenge and not lane.authed and lane.ws is not None:
                lane.authed = True
                self._send_auth(lane)
                self._outcome("retry_auth").inc()
                self._queue.appendleft(event)
                self._wake_lanes()
            elif self._auth_secret and lane.authed and self._sent_before_auth_taken(lane, entry[1]):
                self._retry_later(event, "retry_auth", ok)  # read before the relay took our AUTH
            else:  # (no key, or refused after AUTH: a key set or registered later stores it)
                self._finish(event, "rejected", f"auth-required: {ok.text}", until_own_stores=True)
        elif ok.prefix in FINAL_REFUSALS:
            # Final for this event, unless the own relay refuses everything so (put read-only,
            # a write policy switched on for a while): offered again once it stores anew
            self._finish(event, "rejected", f"{ok.prefix.value}: {ok.text}", until_own_stores=True)
        else:
            self._retry_later(event, "retry_error", ok)

    def _send_auth(self, lane: _Lane) -> bool:
        """Answer ``lane``'s challenge, naming the next URL the own relay may go by that it
        was not named by there (False: none left)."""
        signed = self._auth_tags.sign(self._auth_secret, lane.challenge, lane.auth_tried, int(self._wallclock()))
        if signed is None or lane.ws is None:
            return False
        auth, lane.auth_tag = signed
        lane.auth_id, lane.auth_sent_at = auth.id, self._clock()
        lane.ws.send(wire.auth(auth))
        return True

    @staticmethod
    def _sent_before_auth_taken(lane: _Lane, sent_at: float) -> bool:
        """An EVENT refused ``auth-required:`` on a connection our AUTH went on: was it sent
        before the relay took that AUTH? Those the window had in flight when the AUTH went
        were; so, on a relay reading each message apart (khatru), were those sent until it
        said OK to it (the AUTH's signature still being checked). With no answer to our AUTH,
        those sent within ``constants.AUTH_SETTLE_SECS`` of it. Sent again after a while (half a second
        first: ``sync.delivery_retry``, its attempts bounded), not refused for good."""
        if lane.auth_refused:
            return False
        if lane.auth_taken_at is not None:
            return sent_at < lane.auth_taken_at
        return sent_at < lane.auth_sent_at + constants.AUTH_SETTLE_SECS

    def _finish(self, event: Event, outcome: str, reason: str, until_own_stores: bool = False) -> None:
        source = self._sources.pop(event.id, "")
        if self._tracked.pop(event.id, None) is not None:
            left = self._held[source] - 1
            if left:
                self._held[source] = left
            else:
                del self._held[source]
        if self._unindexed.pop(event.id, None) is None:
            self._tracked_index.discard(event.id)
        self._attempts.pop(event.id, None)
        self._parked.discard(event.id)
        self._backlog_fell()
        if outcome == "delivered":
            self._delivered_uncounted += 1  # counted once per read burst (_count_delivered)
        else:
            self._outcome(outcome).inc()
        if outcome in ("delivered", "purgatory"):  # written (a duplicate is only read)
            self._stored_at = self._clock()
        if outcome in ("delivered", "duplicate"):  # stored and served: not purgatory
            self._confirmed.append((event.id, HeldEntry.of(event)))
            if event.kind in constants.SELF_SUB_KINDS:
                self._accepted_roots.append(event)
                if outcome == "duplicate":
                    self._accepted_duplicates.add(event.id)
            if outcome == "delivered":
                self._stored_anew.append(event.id)
        if outcome in ("rejected", "purgatory"):
            # The manager acts on these (rejected index, StateOnly); a plain delivery needs
            # nothing from it, so it is not told (one queue round trip less per event).
            self._post(DeliveryAnswered(event, outcome, reason, source, until_own_stores))
        if not self._tracked:
            self._idle.set()

    def _count_delivered(self) -> None:
        if self._delivered_uncounted:
            self._outcome("delivered").inc(self._delivered_uncounted)
            metrics.EVENTS_SYNCED.inc(self._delivered_uncounted)
            self._delivered_uncounted = 0
        if self._accepted_roots:
            accepted, self._accepted_roots = self._accepted_roots, []
            duplicates, self._accepted_duplicates = frozenset(self._accepted_duplicates), set()
            self._post(OwnEvents(accepted, duplicates))
        if self._confirmed:
            confirmed, self._confirmed = self._confirmed, []
            stored_anew, self._stored_anew = self._stored_anew, []
            self._post(OwnHeldConfirmed(confirmed, stored_anew))

    def _outcome(self, outcome: str):
        """The outcome's counter child, looked up once (this runs for every event)."""
        child = self._outcomes.get(outcome)
        if child is None:
            child = self._outcomes[outcome] = metrics.DELIVERIES.labels(outcome)
        return child

    def _backlog_fell(self) -> None:
        """Historic starts wait on the backlog being delivered (retries waiting out their
        delay do not hold them); relay connections read on when what is held in memory,
        those retries included, has room."""
        if self._wake_below is not None and self.backlog < self._wake_below:
            self._wake_below = None
            self._post(DeliveryCaughtUp())
        held = len(self._tracked)
        if not self.room.is_set() and held < self._max_backlog * 0.9:
            log.info("delivery_backlog_has_room", backlog=held)
            self.room.set()

    def _retry_later(self, event: Event, outcome: str, ok: wire.Ok) -> None:
        """A refusal that is not final: tried again later (``sync.delivery_retry``), or,
        past the last attempt, given up as a refusal (the manager's rejected index)."""
        attempts, first_refused = self._attempts.get(event.id, (0, self._clock()))
        attempts += 1
        self._attempts[event.id] = attempts, first_refused
        delay = refusal_retry_delay(attempts)
        if delay is None:
            with_all = self._stored_at < first_refused
            metrics.DELIVERIES_GIVEN_UP.labels(ok.prefix.value).inc()
            log.warning("delivery_given_up", event_id=event.id, kind=event.kind, attempts=attempts,
                        reason=ok.text[:200], refused_with_all=with_all)
            self._finish(event, "rejected", f"gave up after {attempts} attempts: {ok.prefix.value}: {ok.text}",
                         until_own_stores=with_all)
            return
        self._outcome(outcome).inc()
        heapq.heappush(self._retry_heap, (self._clock() + delay, next(self._seq), event))
        self._parked.add(event.id)
        self._backlog_fell()

    def _retry_loop(self) -> None:
        while not self._stopping:
            now = self._clock()
            while self._retry_heap and self._retry_heap[0][0] <= now:
                _, _, event = heapq.heappop(self._retry_heap)
                self._parked.discard(event.id)
                if event.id in self._tracked:
                    self._queue.append(event, self._sources.get(event.id, ""))
                    self._wake_lanes()
            gevent.sleep(0.2)

    def _requeue_in_flight(self, lane: _Lane, outcome: str) -> None:
        if lane.in_flight:
            self._outcome(outcome).inc(len(lane.in_flight))
            # Oldest first, back at the head of the queue: order is kept where it can be.
            for event, _ in sorted(lane.in_flight.values(), key=lambda e: e[1], reverse=True):
                self._queue.appendleft(event)
            lane.in_flight.clear()
            self._wake_lanes()

    def _expire_in_flight(self, lane: _Lane, now: float) -> bool:
        # Insertion-ordered: the first entry is the oldest still waiting for its OK.
        oldest = next(iter(lane.in_flight.values()), (None, now))[1]
        return now - oldest > self._ok_timeout

    # -- own relay up / down ------------------------------------------------------------

    def _lane_down(self, lane: _Lane, reason: str) -> None:
        if self._down_since is None and all(other.ws is None for other in self._lanes):
            self._down_since = self._wallclock()
            self._post(OwnRelayState(up=False, at=self._down_since))

    def _lane_up(self) -> None:
        if self._down_since is not None:
            self._down_since = None
            self._post(OwnRelayState(up=True, at=self._wallclock()))
