"""The self-subscription: what the own relay accepted is what gsync should sync (SPEC §2).

``REQ {kinds:[30617,1617,1618,1621]}``, full history on first connect and
``since = last_connected - 900`` after a reconnect, read in pages (relays cap one REQ's
answer). Every event is posted to the manager, which batches them; the end of the history is
posted too (it is when systemd hears READY=1).

With shards (``landed``), the same connection also subscribes to every new event the own
relay stores (``{"limit":0}``): what the other shards deliver. Posted as ``OwnLanded``
(id and ``HeldEntry``, no event checks: the own relay checked them), so that this instance
knows what the own relay holds without reading it again (``sync.own_held``), a filter
another shard led is reconciled against what that shard brought, and the thread members
among them are known. Events this instance knows are held or fetched itself (its own
deliveries: their OK tells the manager) are skipped before they are parsed. A single
instance learns the members someone published to the own relay directly from its rereads
instead (``MEMBER_KINDS``, every SELF_REREAD_SECS): shown live, every comment gsync
delivered came back too (bench/scale, 50 relays: gsync's CPU 5.2 s to 6.3 s).
"""
from __future__ import annotations

import time

import gevent
import gevent.lock

from .. import constants
from ..protocol import messages as wire
from ..protocol import wsframes
from ..protocol.event import EventError, parse_event
from ..protocol.filters import Filter
from ..sync.own_held import HeldEntry
from .inbox import OwnEvents, OwnLanded, OwnSubscribed
from .own_auth import ReadAuth, refusal_for_auth
from .own_query import history_pages
from .ws import Timeout
from .ws import connect as ws_connect

SUB_ID = "gsync-self"
LANDED_SUB_ID = "gsync-landed"
_LANDED_PREFIX = b'["EVENT","' + LANDED_SUB_ID.encode() + b'",'
_ID_KEY = b'"id":"'


def _plain(raw: dict) -> bool:
    """Has ``raw`` the fields a ``HeldEntry`` is made of, of the right types?"""
    return (isinstance(raw.get("id"), str) and type(raw.get("created_at")) is int
            and isinstance(raw.get("pubkey"), str) and isinstance(raw.get("tags"), list))


class SubscriptionClosed(ConnectionError):
    """The own relay closed the live subscription (``CLOSED``); the socket may stay up."""


class HistoryDeadline(Exception):
    """A history read ran past OWN_HISTORY_DEADLINE_SECS (not a socket timeout: websocket
    calls would take one for their own and say only "timed out")."""


def self_filter(since: int | None) -> Filter:
    return Filter.make(kinds=constants.SELF_SUB_KINDS, since=since)


def history_filter(since: int | None) -> Filter:
    """What a history read asks: the self-subscription's kinds and layer 1's (user GRASP
    lists besides the announcements, few), so that a whole read also tells layer 1's
    holdings (``OwnSubscribed.layer1``): each instance read them again for its layer-1
    exchanges, every announcement (0.6 MB in bench/scale's 1,000-repository world)."""
    return Filter.make(kinds=tuple(dict.fromkeys(constants.SELF_SUB_KINDS + constants.LAYER1_KINDS)),
                       since=since)


class SelfSubscriber:
    def __init__(self, url: str, post, log, *, clock=time.time, seen=None, landed: bool = False,
                 held=frozenset(), auth_secret: str | None = None, auth_tags=None):
        self.url = url
        # an own relay asking for NIP-42 AUTH to read is answered with the configured key
        self._auth = ReadAuth(url, auth_secret, clock=clock, tags=auth_tags)
        # With shards: every new event the own relay stores (``LANDED_SUB_ID``), those not
        # in ``held`` (what this instance knows the own relay holds: only read here).
        self._landed = landed
        self._held = held
        # Ids whose events gsync has checked already (the manager's dedupe set, only read
        # here): most roots the own relay accepts, gsync delivered itself.
        self._seen = seen if seen is not None else {}
        self._post = post
        self._log = log
        self._clock = clock
        self.last_connected: float | None = None
        self.connected = False  # the live subscription's connection is open (a metric)
        self._full_read_at: float | None = None  # when the whole history was last read
        self._history_read = False  # this session's first history read is done
        # The connection history reads go over, kept between them for the session: a
        # reread every SELF_REREAD_SECS on a connection of its own was twelve connections an
        # hour, all that ngit-relay (khatru's ConnectionRateLimiter: 100, then one per five
        # minutes an address) gives back, so every other connection of gsync's drained it
        # for good. One read at a time (``_history_lock``).
        self._history_ws = None
        self._history_lock = gevent.lock.Semaphore()
        self._greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        self._greenlet = gevent.spawn(self._run)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)

    def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                ws = ws_connect(self.url, 10)
            except Exception as exc:
                self._log.warning("own_relay_unreachable", relay=self.url, reason=type(exc).__name__)
                gevent.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            began = time.monotonic()
            self.connected = True
            reconnect = self.last_connected is not None
            since = int(self.last_connected) - constants.RECONNECT_OVERLAP_SECS if reconnect else None
            prior, self.last_connected = self.last_connected, self._clock()
            self._history_read = False
            history = reread = None
            try:
                # Live first (limit 0: only new events), then the history in pages on a
                # second connection: relays cap one REQ's answer, and nothing may slip
                # between the two.
                live = {SUB_ID: wire.req(SUB_ID, [self_filter(None).replace(limit=0)])}
                if self._landed:  # before any holdings read: a read and this cover everything
                    live[LANDED_SUB_ID] = wire.req(LANDED_SUB_ID, [Filter.make(limit=0)])
                for req in live.values():
                    ws.send(req)
                self._log.info("self_subscription_started", relay=self.url, since=since)
                history = gevent.spawn(self._read_history, since, reconnect, ws)
                reread = gevent.spawn(self._reread_loop)
                self._read(ws, live)
            except Exception as exc:
                self._log.warning("self_subscription_lost", relay=self.url, reason=type(exc).__name__,
                                  detail=str(exc)[:200])
                if isinstance(exc, SubscriptionClosed) and history is not None:
                    # A relay closing every subscription after its EOSE (PEERS.md) closes this
                    # one before the history (on a connection of its own) is read: read it
                    # all the same, or gsync is never ready.
                    history.join(timeout=constants.OWN_HISTORY_DEADLINE_SECS)
            finally:
                self.connected = False
                if not self._history_read:  # the next session reads from where this one would have
                    self.last_connected = prior
                for greenlet in (history, reread):
                    if greenlet is not None:
                        greenlet.kill(block=False)
                self.close_history()  # (a new session reads on a connection of its own)
                try:
                    ws.close(timeout=1)
                except Exception:
                    pass
            if time.monotonic() - began >= constants.OWN_SESSION_STABLE_SECS:
                backoff = 0.5
            # (else one that ends as soon as it begins, e.g. an own relay closing every
            # subscription after its EOSE, is not met twice a second: every 10 s at most,
            # each session reading the history since the last)
            gevent.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _read_history(self, since: int | None, reconnect: bool, live) -> None:
        started = self._clock()
        layer1 = [] if since is None else None  # a whole read tells layer 1's holdings
        try:
            count = self._read_since(since, layer1=layer1)
        except Exception as exc:
            # The session ends (its live read with it) and the next one reads from the same
            # point (``_run`` restores it: this one read nothing), so nothing is skipped.
            self._log.warning("self_history_failed", relay=self.url, reason=type(exc).__name__,
                              detail=str(exc)[:200])
            live.close(timeout=1)
            return
        self._history_read = True
        if since is None:
            self._full_read_at = started
        self._log.info("self_history_read", relay=self.url, events=count, since=since)
        self._post(OwnSubscribed(reconnect, layer1))

    def _read_since(self, since: int | None, unseen_only: bool = False, layer1: list | None = None,
                    members: bool = False) -> int:
        """The own relay's history since ``since``, in pages on a connection of its own,
        each posted as it comes (``unseen_only``: what the manager has not seen); how many
        events it held. ``layer1`` gets the layer-1 events among them (id, ``HeldEntry``).
        ``members``: what it stored of the kinds thread members are too (``MEMBER_KINDS``),
        those this instance neither fetched nor knows held, posted as ``OwnLanded``."""
        deadline = constants.OWN_HISTORY_DEADLINE_SECS
        count = 0
        with self._history_lock, gevent.Timeout(deadline, HistoryDeadline(f"history read past its {deadline:g} s deadline")):
            for page in self._history_pages(history_filter(since)):
                count += len(page)
                if layer1 is not None:
                    layer1 += [(raw["id"], HeldEntry.of(raw)) for raw in page
                               if raw.get("kind") in constants.LAYER1_KINDS and _plain(raw)]
                if unseen_only:
                    page = [raw for raw in page if raw.get("id") not in self._seen]
                self._post_events(page)
            if members:
                for page in self._history_pages(Filter.make(kinds=constants.MEMBER_KINDS, since=since)):
                    self._post_landed([raw for raw in page if raw.get("id") not in self._seen
                                       and raw.get("id") not in self._held])
        return count

    def _history_pages(self, flt: Filter):
        """``history_pages`` over the kept history connection. One the own relay closed
        meanwhile (idle) fails at its first page: read again, once, on a fresh connection.
        A connection that fails is closed and forgotten."""
        kept = self._history_ws is not None
        for attempt in range(2 if kept else 1):
            if self._history_ws is None:
                self._history_ws = ws_connect(self.url, 30)
            pages = history_pages(self._history_ws, flt, auth=self._auth)
            try:
                first = next(pages, None)
            except BaseException as exc:
                self.close_history()
                if attempt or not kept or not isinstance(exc, Exception) or isinstance(exc, HistoryDeadline):
                    raise  # (killed, or past the deadline: not read again)
                continue
            try:
                if first is not None:
                    yield first
                    yield from pages
            except BaseException:
                self.close_history()
                raise
            return

    def close_history(self) -> None:
        ws, self._history_ws = self._history_ws, None
        if ws is not None:
            try:
                ws.close(timeout=1)
            except Exception:
                pass

    def _reread_loop(self) -> None:
        """Every SELF_REREAD_SECS, the history since the last read (less the overlap), on a
        fresh connection: what the live subscription should have shown, in case the relay
        dropped some of it (relays drop live events for a subscriber that reads too slowly).
        Once every SELF_FULL_REREAD_SECS, the whole history: an event whose created_at is
        older than the overlap (backdated, or published while gsync was away) and that was
        never shown live is found within a day. Only what the manager has not seen is
        posted: a root gsync delivered itself came with the own relay's OK already."""
        read_at = self._clock()
        while True:
            gevent.sleep(constants.SELF_REREAD_SECS)
            started = self._clock()
            full_at = self._full_read_at  # kept over reconnects, which read only since
            full = full_at is None or started - full_at >= constants.SELF_FULL_REREAD_SECS
            since = None if full else int(read_at) - constants.RECONNECT_OVERLAP_SECS
            try:
                # (members someone published to the own relay directly: a single instance
                # is shown them here; with shards, live)
                count = self._read_since(since, unseen_only=True, members=not full and not self._landed)
            except Exception as exc:
                self._log.warning("self_reread_failed", relay=self.url, reason=type(exc).__name__)
                continue  # the next round reads from the same point
            if full:
                self._log.info("self_full_reread", relay=self.url, events=count)
                self._full_read_at = started
            read_at = started

    def _post_events(self, raws: list) -> None:
        """Check and post what one read burst or history page brought, as one message."""
        events = []
        for raw in raws:
            try:
                # Our own relay already checked the signature. The id is checked unless
                # gsync checked this event itself (it delivered it, or read it here before).
                check_id = raw.get("id") not in self._seen  # (a dict: the parser said so)
                events.append(parse_event(raw, check_id=check_id, check_sig=False))
            except EventError as exc:
                self._log.warning("own_relay_bad_event", reason=exc.reason)
        if events:
            self._post(OwnEvents(events))

    def _known_held(self, data: bytes) -> bool:
        """Is the landed event in ``data`` (an EVENT frame) one this instance knows is held?
        Read off its ``"id"`` key without parsing the frame (a quote inside a JSON string
        is escaped, so the first ``"id":"`` is the event's key); anything else is parsed."""
        at = data.find(_ID_KEY)
        if at < 0:
            return False
        start = at + len(_ID_KEY)
        event_id = data[start:start + 64]
        if len(event_id) != 64 or data[start + 64:start + 65] != b'"':
            return False
        event_id = event_id.decode("ascii", "replace")
        # held, or fetched here (in delivery: its OK tells the manager)
        return event_id in self._held or self._seen.get(event_id) is not None

    def _post_landed(self, raws: list) -> None:
        """What another instance stored (``LANDED_SUB_ID``), as held entries, one message."""
        entries = []
        for raw in raws:
            try:
                event_id = raw["id"]
                if not (isinstance(event_id, str) and len(event_id) == 64 and type(raw["created_at"]) is int
                        and type(raw["kind"]) is int and isinstance(raw["pubkey"], str)
                        and isinstance(raw["tags"], list)):
                    continue
                entries.append((event_id, HeldEntry.of(raw)))
            except (KeyError, TypeError):
                continue
        if entries:
            self._post(OwnLanded(entries))

    def _read(self, ws, live: dict[str, str]) -> None:
        """The live subscription (``live``: its REQs by subscription id), until the session
        ends. Silence is asked about: after OWN_IDLE_PING_SECS with nothing read, a ping;
        nothing read again by the next timeout (not even its pong) and the socket is taken
        for half-open. REQs refused for want of AUTH go again once the relay took ours
        (``_LiveAuth``)."""
        ws.settimeout(constants.OWN_IDLE_PING_SECS)
        pinged_at = None  # ws.reads when the unanswered ping went
        auth = _LiveAuth(self._auth, ws, live)
        while True:
            raws, landed = [], []
            try:
                try:
                    burst = ws.recv_burst()
                except Timeout:
                    if auth.settled():
                        continue
                    if pinged_at is not None and ws.reads == pinged_at:
                        raise ConnectionError("the own relay answered no ping: half-open socket") from None
                    pinged_at = ws.reads
                    ws.ping()
                    continue
                pinged_at = None
                for opcode, data in burst:
                    if opcode == wsframes.OP_CLOSE:
                        raise ConnectionError("the own relay closed the connection")
                    if opcode != wsframes.OP_TEXT:
                        continue
                    if self._landed and data.startswith(_LANDED_PREFIX) and self._known_held(data):
                        continue
                    msg = wire.parse_relay_message(data)
                    if isinstance(msg, wire.RelayEvent) and msg.sub_id == SUB_ID:
                        raws.append(msg.event)
                    elif isinstance(msg, wire.RelayEvent) and msg.sub_id == LANDED_SUB_ID:
                        landed.append(msg.event)
                    elif auth.handled(msg):
                        continue
                    elif isinstance(msg, wire.Closed) and msg.sub_id == SUB_ID:
                        raise SubscriptionClosed(f"own relay closed the self-subscription: {msg.text}")
            finally:
                self._post_events(raws)  # what came before a close is kept
                self._post_landed(landed)
            if raws and self._history_read:  # a failed history read is read again whole
                self.last_connected = self._clock()
            if ws.drained:  # read in gulps (OWN_STREAM_GULP_SECS)
                gevent.sleep(constants.OWN_STREAM_GULP_SECS)


class _LiveAuth:
    """The live subscription's NIP-42 (``own_auth``): a REQ of ``live`` refused for want of
    AUTH, with a key, has our AUTH sent as soon as the relay's challenge is known (the read
    goes on meanwhile), and goes again once the relay said OK to it, or said nothing for
    ``AUTH_SETTLE_SECS`` (the read's timeout while it waits). Refused again, our AUTH
    refused, or no challenge within that time: the subscription is closed
    (``SubscriptionClosed``: the session ends and a new one begins)."""

    def __init__(self, auth: ReadAuth, ws, live: dict[str, str]):
        self._auth = auth
        self._ws = ws
        self._live = live
        self._refused: set[str] = set()  # waiting for our AUTH to be taken
        self._auth_id: str | None = None
        self._since = 0.0  # the first refusal, or our AUTH: what the wait counts from
        self._asked_again = False

    def handled(self, msg) -> bool:
        """Was ``msg`` a challenge, a refusal for want of AUTH of a live REQ, or the answer
        to our AUTH (all taken care of here)?"""
        if self._auth.note(self._ws, msg):
            if self._refused and self._auth_id is None and not self._asked_again:
                self._answer()
            return True
        if refusal_for_auth(msg, self._auth.challenged(self._ws)):
            sub = getattr(msg, "sub_id", None)
            refused = set(self._live) if sub is None else {sub} & set(self._live)
            if not refused:
                return False
            if self._asked_again or not self._auth.has_key:
                raise SubscriptionClosed(f"own relay closed the self-subscription: {self._auth.refusal(msg.text)}")
            if not self._refused:
                self._since = time.monotonic()
            self._refused |= refused
            if self._auth_id is None:
                self._answer()
            self._ws.settimeout(constants.AUTH_SETTLE_SECS)
            return True
        if self._auth_id is not None and not self._asked_again:
            taken = self._auth.taken(self._ws, msg, self._auth_id)
            if taken is False:
                self._auth_id = self._auth.refused(self._ws, self._auth_id)  # named another way
                if self._auth_id is None:
                    raise SubscriptionClosed(f"own relay refused our AUTH: {msg.text}")
                self._since = time.monotonic()
                return True
            if taken:
                self._send_again()
                return True
        return False

    def settled(self) -> bool:
        """A read timed out: past ``AUTH_SETTLE_SECS`` of an unanswered AUTH, the refused
        REQs go again (True: the timeout was that wait's, not the relay's silence)."""
        if not self._refused or self._asked_again:
            return False
        if time.monotonic() - self._since >= constants.AUTH_SETTLE_SECS:
            if self._auth_id is None:
                raise SubscriptionClosed("own relay asked for AUTH and sent no challenge")
            self._send_again()
        return True

    def _answer(self) -> None:
        self._auth_id = self._auth.answer(self._ws)
        if self._auth_id is not None:
            self._since = time.monotonic()

    def _send_again(self) -> None:
        self._asked_again = True
        for sub in sorted(self._refused):
            self._ws.send(self._live[sub])
        self._ws.settimeout(constants.OWN_IDLE_PING_SECS)
