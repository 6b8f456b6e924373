"""The self-subscription: what the own relay accepted is what gsync should sync (SPEC §2).

``REQ {kinds:[30617,1617,1618,1621]}``, full history on first connect and
``since = last_connected - 900`` after a reconnect, read in pages (relays cap one REQ's
answer). Every event is posted to the manager, which batches them; the end of the history is
posted too (it is when systemd hears READY=1).
"""
from __future__ import annotations

import time

import gevent

from .. import constants
from ..protocol import messages as wire
from ..protocol import wsframes
from ..protocol.event import EventError, parse_event
from ..protocol.filters import Filter
from .inbox import OwnEvents, OwnSubscribed
from .own_query import history_pages
from .ws import Timeout
from .ws import connect as ws_connect

SUB_ID = "gsync-self"


class HistoryDeadline(Exception):
    """A history read ran past OWN_HISTORY_DEADLINE_SECS (not a socket timeout: websocket
    calls would take one for their own and say only "timed out")."""


def self_filter(since: int | None) -> Filter:
    return Filter.make(kinds=constants.SELF_SUB_KINDS, since=since)


class SelfSubscriber:
    def __init__(self, url: str, post, log, *, clock=time.time, seen=frozenset()):
        self.url = url
        # Ids whose events gsync has checked already (the manager's dedupe set, only read
        # here): most roots the own relay accepts, gsync delivered itself.
        self._seen = seen
        self._post = post
        self._log = log
        self._clock = clock
        self.last_connected: float | None = None
        self.connected = False  # the live subscription's connection is open (a metric)
        self._full_read_at: float | None = None  # when the whole history was last read
        self._history_read = False  # this session's first history read is done
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
            backoff = 0.5
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
                ws.send(wire.req(SUB_ID, [self_filter(None).replace(limit=0)]))
                self._log.info("self_subscription_started", relay=self.url, since=since)
                history = gevent.spawn(self._read_history, since, reconnect, ws, prior)
                reread = gevent.spawn(self._reread_loop)
                self._read(ws)
            except Exception as exc:
                self._log.warning("self_subscription_lost", relay=self.url, reason=type(exc).__name__,
                                  detail=str(exc)[:200])
            finally:
                self.connected = False
                for greenlet in (history, reread):
                    if greenlet is not None:
                        greenlet.kill(block=False)
                try:
                    ws.close(timeout=1)
                except Exception:
                    pass
            gevent.sleep(backoff)

    def _read_history(self, since: int | None, reconnect: bool, live, prior: float | None) -> None:
        started = self._clock()
        try:
            count = self._read_since(since)
        except Exception as exc:
            # The session ends (its live read with it) and the next one reads from the same
            # point: what this one would have read is not skipped.
            self._log.warning("self_history_failed", relay=self.url, reason=type(exc).__name__,
                              detail=str(exc)[:200])
            self.last_connected = prior
            live.close(timeout=1)
            return
        self._history_read = True
        if since is None:
            self._full_read_at = started
        self._log.info("self_history_read", relay=self.url, events=count, since=since)
        self._post(OwnSubscribed(reconnect))

    def _read_since(self, since: int | None, unseen_only: bool = False) -> int:
        """The own relay's history since ``since``, in pages on a connection of its own,
        each posted as it comes (``unseen_only``: what the manager has not seen); how many
        events it held."""
        deadline = constants.OWN_HISTORY_DEADLINE_SECS
        count = 0
        with gevent.Timeout(deadline, HistoryDeadline(f"history read past its {deadline:g} s deadline")):
            ws = ws_connect(self.url, 30)
            try:
                for page in history_pages(ws, self_filter(since)):
                    count += len(page)
                    if unseen_only:
                        page = [raw for raw in page if raw.get("id") not in self._seen]
                    self._post_events(page)
            finally:
                ws.close(timeout=1)
        return count

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
                count = self._read_since(since, unseen_only=True)
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

    def _read(self, ws) -> None:
        """The live subscription, until the session ends. Silence is asked about: after
        OWN_IDLE_PING_SECS with nothing read, a ping; nothing read again by the next
        timeout (not even its pong) and the socket is taken for half-open."""
        ws.settimeout(constants.OWN_IDLE_PING_SECS)
        pinged_at = None  # ws.reads when the unanswered ping went
        while True:
            raws = []
            try:
                try:
                    burst = ws.recv_burst()
                except Timeout:
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
                    msg = wire.parse_relay_message(data)
                    if isinstance(msg, wire.RelayEvent) and msg.sub_id == SUB_ID:
                        raws.append(msg.event)
                    elif isinstance(msg, wire.Closed) and msg.sub_id == SUB_ID:
                        raise ConnectionError(f"own relay closed the self-subscription: {msg.text}")
            finally:
                self._post_events(raws)  # what came before a close is kept
            if raws and self._history_read:  # a failed history read is read again whole
                self.last_connected = self._clock()
