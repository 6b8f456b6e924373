"""The manager's only I/O: greenlets it spawns (and kills), messages it posts to itself
later, the connections it opens, the frames it sends on them and the monotonic clock of its
deadlines.

The manager holds no greenlet: ``spawn`` and ``every`` return an opaque handle, which it
hands back to ``kill`` and ``on_death``; the effects map it to the greenlet while that runs.
Production uses ``GeventEffects``; a test gives ``SyncManager`` a recorder of its own (and a
fake ``clock``) and feeds it inbox messages, so the manager's decisions are tested in one
process, without sockets or waits.
"""
from __future__ import annotations

import itertools
import time

import gevent

from ..connection import RelayConnection


class GeventEffects:
    """Real greenlets and timers (gevent), real relay connections."""

    def __init__(self, post):
        self.post = post  # the manager's inbox
        self._running: dict[int, gevent.Greenlet] = {}  # handle → its greenlet, until it ends
        self._handles = itertools.count(1)

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

    def connection(self, relay: str, ws, session: int, **kwargs) -> RelayConnection:
        """A started connection over the handshake's socket: its reader posts to the inbox,
        its writer sends what the manager queues."""
        conn = RelayConnection(relay, ws, session, self.post, **kwargs)
        conn.start()
        return conn

    @staticmethod
    def send(conn: RelayConnection, frame: str) -> None:
        """Queue ``frame`` (a wire message) for ``conn``'s writer."""
        conn.send(frame)

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()
