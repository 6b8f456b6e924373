"""GeventEffects: the manager holds handles, not greenlets; the effects map them while the
greenlet runs, report its death and kill it."""
from __future__ import annotations

import gevent
import gevent.event

from gsync.io.manager.effects import GeventEffects


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
