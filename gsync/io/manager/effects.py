"""The manager's only I/O: greenlets it spawns, messages it posts to itself later, the
connections it opens and the monotonic clock of its deadlines.

Production uses ``GeventEffects``; a test gives ``SyncManager`` a recorder of its own (and a
fake ``clock``) and feeds it inbox messages, so the manager's decisions are tested in one
process, without sockets or waits.
"""
from __future__ import annotations

import time

import gevent

from ..connection import RelayConnection


class GeventEffects:
    """Real greenlets and timers (gevent), real relay connections."""

    def __init__(self, post):
        self.post = post  # the manager's inbox

    def later(self, delay: float, msg) -> None:
        """``msg`` arrives in the inbox ``delay`` seconds from now."""
        gevent.spawn_later(delay, self.post, msg)

    def every(self, interval: float, make_msg):
        """``make_msg()`` arrives in the inbox every ``interval`` seconds; returns the
        greenlet (``kill`` stops it)."""
        def loop() -> None:
            while True:
                gevent.sleep(interval)
                self.post(make_msg())

        return gevent.spawn(loop)

    def spawn(self, fn, *args, **kwargs):
        """Run ``fn`` in a greenlet of its own; returns the greenlet (``kill``,
        ``link_exception``)."""
        return gevent.spawn(fn, *args, **kwargs)

    def connection(self, relay: str, ws, session: int, **kwargs) -> RelayConnection:
        """A started connection over the handshake's socket: its reader posts to the inbox,
        its writer sends what the manager queues."""
        conn = RelayConnection(relay, ws, session, self.post, **kwargs)
        conn.start()
        return conn

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()
