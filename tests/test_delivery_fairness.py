"""gsync/io/delivery.py: fairness between the relays events come from, without sockets."""
from __future__ import annotations

import gevent

from gsync import constants
from gsync.io.delivery import OwnRelayDelivery, _FairQueue

from . import factory as f

author = f.Author.named("fair")


def events(n, tag):
    return [author.sign(1, [], f"{tag} {i}") for i in range(n)]


def test_sources_are_served_in_turn_and_put_back_events_first():
    q = _FairQueue()
    flood, honest = events(1000, "flood"), events(2, "honest")
    for e in flood:
        q.append(e, "wss://flood")
    for e in honest:
        q.append(e, "wss://honest")
    retry = events(1, "retry")[0]
    q.appendleft(retry)
    taken = [q.popleft() for _ in range(5)]
    assert taken == [retry, flood[0], honest[0], flood[1], honest[1]]
    rest = []
    while q:
        rest.append(q.popleft())
    assert rest == flood[2:]  # each source keeps its own order


def test_a_full_backlog_stops_only_the_sources_that_hold_much_of_it():
    delivery = OwnRelayDelivery("ws://127.0.0.1:1", lambda msg: None, max_backlog=200)
    for e in events(201, "flood"):  # the one past the limit closes the room
        assert delivery.submit(e, "wss://flood")
    assert not delivery.room.is_set()
    honest = delivery.room_for("wss://honest")
    flood = delivery.room_for("wss://flood")
    waiter = gevent.spawn(flood.wait)
    gevent.sleep(0.1)
    assert not waiter.dead  # the flooder waits for room ...
    quick = gevent.spawn(honest.wait)
    gevent.sleep(0.1)
    assert quick.dead  # ... the honest relay, holding nothing, reads on
    for e in events(constants.DELIVERY_SOURCE_ALLOWANCE, "honest"):
        delivery.submit(e, "wss://honest")
    slow = gevent.spawn(honest.wait)
    gevent.sleep(0.1)
    assert not slow.dead  # past its allowance, it waits too
    delivery.room.set()
    gevent.sleep(0.1)
    assert waiter.dead and slow.dead
    assert delivery.held_by("wss://flood") == 201


def test_the_manager_hears_at_once_when_delivery_has_caught_up():
    """Historic starts held while delivery is behind go again as soon as the backlog falls
    below the mark, not on the next maintenance tick."""
    from gsync.io.inbox import DeliveryCaughtUp

    posted = []
    delivery = OwnRelayDelivery("ws://127.0.0.1:1", posted.append, max_backlog=200)
    sent = events(60, "page")
    for e in sent:
        delivery.submit(e, "wss://remote")
    delivery.wake_below(50)
    assert not [m for m in posted if isinstance(m, DeliveryCaughtUp)]
    for e in sent[:10]:
        delivery._finish(e, "delivered", "")
    assert not [m for m in posted if isinstance(m, DeliveryCaughtUp)]  # 50 left: not below
    delivery._finish(sent[10], "delivered", "")
    delivery._finish(sent[11], "delivered", "")
    assert len([m for m in posted if isinstance(m, DeliveryCaughtUp)]) == 1  # once
    delivery.wake_below(100)  # already below: at once
    assert len([m for m in posted if isinstance(m, DeliveryCaughtUp)]) == 2
