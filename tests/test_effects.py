"""GeventEffects: the manager holds handles, not greenlets; the effects map them while the
greenlet runs, report its death and kill it."""
from __future__ import annotations

import dataclasses

import gevent
import gevent.event

from gsync.io.manager.effects import GeventEffects, link


def test_a_handle_stands_for_its_greenlet_until_it_ends():
    effects = GeventEffects(post=lambda msg: None)
    died: list = []
    handle = effects.spawn(lambda: 1 / 0)
    effects.on_death(handle, died.append)
    assert isinstance(handle, int)
    with gevent.Timeout(5):
        while not died:
            gevent.sleep(0.001)
    assert isinstance(died[0], ZeroDivisionError)
    assert not effects._running, "a greenlet that ended is forgotten (the map is bounded by the running)"


def test_kill_stops_it_without_a_death_report():
    effects = GeventEffects(post=lambda msg: None)
    finished, died = [], []
    release = gevent.event.Event()
    handle = effects.spawn(lambda: (release.wait(), finished.append(1)))
    effects.on_death(handle, died.append)
    gevent.sleep(0)
    effects.kill(handle)
    release.set()
    gevent.sleep(0.01)
    assert not finished and not died and not effects._running
    effects.kill(handle)  # ended already: nothing to do


def test_every_posts_until_killed():
    posted: list = []
    effects = GeventEffects(post=posted.append)
    handle = effects.every(0.001, lambda: "tick")
    with gevent.Timeout(5):
        while len(posted) < 2:
            gevent.sleep(0.001)
    effects.kill(handle)  # does not wait: the kill lands at the greenlet's next switch
    gevent.sleep(0.005)
    count = len(posted)
    gevent.sleep(0.02)
    assert len(posted) == count and not effects._running


class _Conn:
    """A connection as the effects see it: a socket they send on and close."""

    def __init__(self):
        self.book, self.sent, self.closed = object(), [], False

    def send(self, text: str) -> None:
        self.sent.append(text)

    def close(self, reason: str) -> None:
        self.closed = True


def test_the_manager_holds_a_connection_handle_and_the_effects_alone_send_on_it_and_close_it():
    effects = GeventEffects(post=lambda msg: None)
    a, b = _Conn(), _Conn()
    handle, book = link(effects._links, effects._handles, a)
    assert isinstance(handle, int) and book is a.book
    effects.send(handle, '["CLOSE","x"]')
    ran: list = []
    with gevent.Timeout(5):
        gevent.joinall([effects._running[effects.spawn_on(handle, lambda conn, n: ran.append((conn, n)), 7)]])
    assert a.sent == ['["CLOSE","x"]'] and ran == [(a, 7)]
    effects.close(handle, "no work left")
    assert a.closed and not effects._links
    effects.send(handle, "late")  # closed: nothing is sent
    assert a.sent == ['["CLOSE","x"]']
    # One the relay closed leaves the table when the next connection opens: it holds the open.
    first, _ = link(effects._links, effects._handles, a := _Conn())
    a.closed = True
    second, _ = link(effects._links, effects._handles, b)
    assert list(effects._links) == [second] and first != second


def test_a_session_holds_its_connection_s_bookkeeping_and_handle_not_the_connection(tmp_path):
    from gsync.io.connection import RelayConnection
    from tests.manager_harness import ManagerHarness

    h = ManagerHarness(tmp_path, bootstrap=["wss://a.example"])
    conn = h.connect("wss://a.example")
    session = h.state("wss://a.example").current
    assert session.book is conn.book and isinstance(session.link, int)
    held = [getattr(session, f.name) for f in dataclasses.fields(session)]
    assert not any(isinstance(v, (RelayConnection, gevent.Greenlet)) for v in held)
    assert set(conn.subscriptions) == set(session.book.subscriptions) and conn.subscriptions
