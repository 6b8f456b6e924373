"""The manager's only I/O: greenlets it spawns (and kills), messages it posts to itself
later, the connections it opens, the frames it sends on them and the monotonic clock of its
deadlines.

The manager holds no greenlet and no socket: ``spawn`` and ``every`` return an opaque handle,
which it hands back to ``kill`` and ``on_death``; the effects map it to the greenlet while that
runs. ``connection`` returns a handle to the connection (``send``, ``close``, ``spawn_on``) and
its ``SubscriptionBook``, the pure bookkeeping the session keeps (``subscribe``,
``unsubscribe`` write it and send what it says).
Production uses ``GeventEffects``; a test gives ``SyncManager`` a recorder of its own (and a
fake ``clock``) and feeds it inbox messages, so the manager's decisions are tested in one
process, without sockets or waits.
"""
from __future__ import annotations

import itertools
import time

import gevent

from ...protocol.subscription_book import SubscriptionBook
from ..connection import RelayConnection


class ConnectionLinks:
    """The relay connections an effects holds, by handle (``_links``, handles drawn from
    ``_handles``): what the manager sends and closes goes through these, the same for the
    real connections, the simulator's and the harness's."""

    _links: dict
    _handles: itertools.count

    def _link(self, conn) -> tuple[int, SubscriptionBook]:
        return link(self._links, self._handles, conn)

    def send(self, handle: int, frame: str) -> None:
        """Queue ``frame`` (a wire message) for the connection's writer."""
        conn = self._links.get(handle)
        if conn is not None:
            conn.send(frame)

    def close(self, handle: int, reason: str) -> None:
        conn = self._links.pop(handle, None)
        if conn is not None:
            conn.close(reason)

    def spawn_on(self, handle: int, fn, *args, **kwargs):
        """``spawn(fn, the connection, *args)``: a NIP-77 exchange runs on the socket itself."""
        return self.spawn(fn, self._links.get(handle), *args, **kwargs)


class GeventEffects(ConnectionLinks):
    """Real greenlets and timers (gevent), real relay connections."""

    def __init__(self, post):
        self.post = post  # the manager's inbox
        self._running: dict[int, gevent.Greenlet] = {}  # handle → its greenlet, until it ends
        self._handles = itertools.count(1)
        self._links: dict[int, RelayConnection] = {}  # connection handle → the connection, while open

    def _hold(self, greenlet: gevent.Greenlet) -> int:
        handle = next(self._handles)
        self._running[handle] = greenlet
        greenlet.link(lambda _g: self._running.pop(handle, None))
        return handle

    def later(self, delay: float, msg) -> None:
        """``msg`` arrives in the inbox ``delay`` seconds from now."""
        gevent.spawn_later(delay, self.post, msg)

    def every(self, interval: float, make_msg) -> int:
        """``make_msg()`` arrives in the inbox every ``interval`` seconds; returns its
        handle (``kill`` stops it)."""
        def loop() -> None:
            while True:
                gevent.sleep(interval)
                self.post(make_msg())

        return self._hold(gevent.spawn(loop))

    def spawn(self, fn, *args, **kwargs) -> int:
        """Run ``fn`` in a greenlet of its own; returns its handle (``kill``, ``on_death``)."""
        return self._hold(gevent.spawn(fn, *args, **kwargs))

    def on_death(self, handle: int, callback) -> None:
        """``callback(exception)`` if the greenlet of ``handle`` dies of one (not if it is
        killed, nor if it ended already)."""
        greenlet = self._running.get(handle)
        if greenlet is not None:
            greenlet.link_exception(lambda g: callback(g.exception))

    def kill(self, handle: int) -> None:
        """Stop the greenlet of ``handle`` (nothing if it ended already); does not wait."""
        greenlet = self._running.pop(handle, None)
        if greenlet is not None:
            greenlet.kill(block=False)

    def connection(self, relay: str, ws, session: int, **kwargs) -> tuple[int, SubscriptionBook]:
        """A started connection over the handshake's socket: its reader posts to the inbox,
        its writer sends what the manager queues. Returns (its handle, its bookkeeping)."""
        conn = RelayConnection(relay, ws, session, self.post, **kwargs)
        conn.start()
        return self._link(conn)

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


def link(links: dict, handles, conn) -> tuple[int, SubscriptionBook]:
    """``conn`` under a new handle in ``links`` (any effects' table), closed ones dropped:
    the table holds the open connections and those closed since the last one opened."""
    for handle in [h for h, c in links.items() if c.closed]:
        del links[handle]
    handle = next(handles)
    links[handle] = conn
    return handle, conn.book


def subscribe(effects, session, sub_id: str, filters) -> None:
    """REQ ``sub_id`` on ``session``'s connection: open in its book, then sent."""
    effects.send(session.link, session.book.req_frame(sub_id, filters))


def unsubscribe(effects, session, sub_id: str) -> None:
    """CLOSE ``sub_id``, if open; its late events are still read until the relay's CLOSED."""
    frame = session.book.close_frame(sub_id)
    if frame is not None:
        effects.send(session.link, frame)
