"""The self-subscription: what the own relay accepted is what gsync should sync (SPEC §2).

``REQ {kinds:[30617,1617,1618,1621]}``, full history on first connect and
``since = last_connected - 900`` after a reconnect. Every event is posted to the manager,
which batches them; EOSE is posted too (it is when systemd hears READY=1).
"""
from __future__ import annotations

import time

import gevent
import websocket

from .. import constants
from ..protocol import messages as wire
from ..protocol.event import EventError, parse_event
from ..protocol.filters import Filter
from .events import OwnEvent, OwnSubscribed

SUB_ID = "gsync-self"


def self_filter(since: int | None) -> Filter:
    return Filter.make(kinds=constants.SELF_SUB_KINDS, since=since)


class SelfSubscriber:
    def __init__(self, url: str, post, log, *, clock=time.time):
        self.url = url
        self._post = post
        self._log = log
        self._clock = clock
        self.last_connected: float | None = None
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
                ws = websocket.create_connection(self.url, timeout=10, enable_multithread=False)
            except Exception as exc:
                self._log.warning("own_relay_unreachable", relay=self.url, reason=type(exc).__name__)
                gevent.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            reconnect = self.last_connected is not None
            since = int(self.last_connected) - constants.RECONNECT_OVERLAP_SECS if reconnect else None
            self.last_connected = self._clock()
            try:
                ws.send(wire.req(SUB_ID, [self_filter(since)]))
                self._log.info("self_subscription_started", relay=self.url, since=since)
                self._read(ws, reconnect)
            except Exception as exc:
                self._log.warning("self_subscription_lost", relay=self.url, reason=type(exc).__name__)
            finally:
                try:
                    ws.close(timeout=1)
                except Exception:
                    pass
            gevent.sleep(backoff)

    def _read(self, ws, reconnect: bool) -> None:
        ws.settimeout(None)
        while True:
            msg = wire.parse_relay_message(ws.recv())
            if isinstance(msg, wire.RelayEvent) and msg.sub_id == SUB_ID:
                try:
                    # Our own relay already checked the signature; the id check stays cheap.
                    self._post(OwnEvent(parse_event(msg.event, check_sig=False)))
                except EventError as exc:
                    self._log.warning("own_relay_bad_event", reason=exc.reason)
                self.last_connected = self._clock()
            elif isinstance(msg, wire.Eose) and msg.sub_id == SUB_ID:
                self._post(OwnSubscribed(reconnect))
            elif isinstance(msg, wire.Closed) and msg.sub_id == SUB_ID:
                raise ConnectionError(f"own relay closed the self-subscription: {msg.text}")
