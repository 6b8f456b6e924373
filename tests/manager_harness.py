"""A real ``SyncManager`` in the test's process: a fake clock, recorded effects, inbox
messages fed by the test.

Nothing is spawned and no socket is opened: timers wait in a list until the test moves the
clock past them, greenlets the manager would spawn (NIP-77 exchanges, own-relay reads) are
recorded for the test to answer, and each relay connection records the frames the manager
sends instead of writing them. The manager's decisions are then read from what it sent::

    h = ManagerHarness(tmp_path, bootstrap=["wss://a.example"])
    h.connect("wss://a.example")
    assert h.reqs("wss://a.example")  # layer 1 went out
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import json

from gsync.io.connection import RelayConnection
from gsync.io.inbox import (
    HandshakeDone,
    OwnEvents,
    OwnReadsDue,
    OwnReadsLanded,
    OwnSubscribed,
    RemoteEvent,
    RemoteEvents,
    RemoteMessage,
    Tick,
)
from gsync.io.manager import SyncManager
from gsync.io.manager.effects import ConnectionLinks
from gsync.io.manager.lifecycle import LAYER1_LIVE_SUB
from gsync.io.manager.live import LIVE_SUB_PREFIX
from gsync.io.own_query import HeldItems
from gsync.ops.config import ClusterConfig, Config, NetworkConfig, ServiceConfig, SyncConfig
from gsync.protocol import messages as wire

OWN = "ws://127.0.0.1:9"  # never dialled: delivery and the self-subscription are not started
START = 1_800_000_000.0


class FakeClock:
    def __init__(self, now: float = START):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeWs:
    connected = True

    def close(self, timeout=None) -> None:
        self.connected = False

    def peer_closed(self) -> bool:
        return not self.connected


class Spawned:
    """A greenlet the manager asked for, not run: the test answers for it. It is also the
    handle the manager gets back (opaque to it): ``killed`` and ``dead_callbacks`` record
    what the manager asked of it through the effects."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.killed = False
        self.dead_callbacks: list = []  # each takes the exception the greenlet died of

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


class RecordedConnection(RelayConnection):
    """The manager's side of a connection (subscriptions, budgets) with its frames kept in
    ``frames`` (parsed JSON) instead of written to a socket."""

    def __init__(self, *args, fake_clock, **kwargs):
        super().__init__(*args, **kwargs)
        self.fake_clock = fake_clock
        self.frames: list = []
        self.sent_at: list[float] = []  # the fake clock's time of each frame

    def send(self, text: str) -> None:
        if not self.closed:
            self.frames.append(json.loads(text))
            self.sent_at.append(self.fake_clock.now)


class RecordingEffects(ConnectionLinks):
    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.timers: list = []  # heap of (due, seq, msg)
        self._seq = itertools.count()
        self.spawned: list[Spawned] = []
        self.connections: dict[str, list[RecordedConnection]] = {}
        self._links: dict[int, RecordedConnection] = {}  # connection handle → the connection
        self._handles = itertools.count(1)

    def later(self, delay: float, msg) -> None:
        heapq.heappush(self.timers, (self.clock.now + delay, next(self._seq), msg))

    def every(self, interval: float, make_msg):
        return Spawned(make_msg, (interval,), {})

    def spawn(self, fn, *args, **kwargs) -> Spawned:
        g = Spawned(fn, args, kwargs)
        self.spawned.append(g)
        return g

    def on_death(self, handle: Spawned, callback) -> None:
        handle.dead_callbacks.append(callback)

    def kill(self, handle: Spawned) -> None:
        handle.killed = True

    def connection(self, relay: str, ws, session: int, **kwargs):
        conn = RecordedConnection(relay, ws, session, lambda msg: None, fake_clock=self.clock, **kwargs)
        self.connections.setdefault(relay, []).append(conn)
        return self._link(conn)

    def monotonic(self) -> float:
        return self.clock.now


class ManagerHarness:
    def __init__(self, tmp_path, *, bootstrap=(), shard=None, **sync):
        """``shard``: this instance's ``[cluster] shard`` (a ``Shard``; all relays without)."""
        sync.setdefault("bootstrap_relays", tuple(bootstrap))
        self.config = Config(
            service=ServiceConfig(OWN, ("127.0.0.1:9",), str(tmp_path / "state")),
            sync=SyncConfig(**sync),
            network=NetworkConfig(),
            cluster=ClusterConfig(shard) if shard is not None else ClusterConfig(),
        )
        self.clock = FakeClock()
        self.effects = RecordingEffects(self.clock)
        self.manager = SyncManager(self.config, clock=self.clock, effects=self.effects)

    # -- feeding ---------------------------------------------------------------------------

    def feed(self, msg) -> None:
        """Hand ``msg`` to its handler, then whatever the manager posted to itself meanwhile,
        as its loop would."""
        m = self.manager
        m.apply(msg)
        while not m.queue.empty():
            queued = m.queue.get_nowait()
            m.apply(queued)

    def advance(self, secs: float) -> None:
        """Move the clock ``secs`` on, firing the timers that fall due on the way, in order."""
        end = self.clock.now + secs
        while self.effects.timers and self.effects.timers[0][0] <= end:
            due, _, msg = heapq.heappop(self.effects.timers)
            self.clock.now = max(self.clock.now, due)
            self.feed(msg)
        self.clock.now = end

    def own_relay_holds(self, *events) -> None:
        """The self-subscription shows ``events`` (announcements list the relays to sync
        from): the first time as its first history read, then through the batch window."""
        self.feed(OwnEvents(list(events)))
        if not self.manager.ready:
            self.feed(OwnSubscribed(reconnect=False))
        else:
            self.advance(self.config.sync.batch_window_ms / 1000)

    def tick(self) -> None:
        self.feed(Tick(self.clock.now))

    def connect(self, url: str, limits=None) -> RecordedConnection:
        """A tick dials ``url`` (it must be wanted: bootstrap, or listed); its handshake
        succeeds at once."""
        state = self.manager.relays.get(url)
        if state is None or state.current.link is None:
            self.tick()
        state = self.manager.relays[url]
        assert url in self.manager.handshakes.queued, f"{url} not dialled"
        self.feed(HandshakeDone(url, state.attempt, ws=FakeWs(), limits=limits))
        return self.conn(url)

    def close_own_read_window(self) -> None:
        """The window collecting own-relay reads closes now (``OwnReadsDue``), whatever the
        clock says: the merged read it starts is then among ``spawned``."""
        due = [t for t in self.effects.timers if isinstance(t[2], OwnReadsDue)]
        if due:
            self.effects.timers = [t for t in self.effects.timers if not isinstance(t[2], OwnReadsDue)]
            heapq.heapify(self.effects.timers)
            for _due, _seq, msg in due:
                self.feed(msg)

    def own_reads(self) -> list:
        """The own-relay reads asked for and not answered yet (greenlets not run)."""
        return [g for g in self.effects.spawned
                if g.name == "read_merged" and not g.killed]

    def answer_own_reads(self, held=None) -> int:
        """Close the collecting window and answer the own-relay reads the manager asked for,
        and those it asks for as they land, until none is left: ``held(filter)`` lists the
        (created_at, id) the own relay holds of each filter read (nothing, by default), as
        events that filter matches. How many reads were answered."""
        answered = 0
        used: set[str] = set()  # an id given for two filters is two events (one event, one entry)
        for _ in range(20):
            self.close_own_read_window()
            reads = self.own_reads()
            if not reads:
                break
            for g in reads:
                self.effects.spawned.remove(g)
                _own, filters, _post = g.args
                holdings = [held_items(f, held(f) if held else (), used) for f in filters]
                self.feed(OwnReadsLanded(g.kwargs["read_id"], list(filters), holdings, "", g.kwargs["epoch"]))
                answered += 1
        return answered

    def relay_says(self, url: str, message) -> None:
        state = self.manager.relays[url]
        self.feed(RemoteMessage(url, state.session, message))

    def relay_sends(self, url: str, sub_id: str, *events) -> None:
        """``url`` sends ``events`` on its subscription ``sub_id``, checked as its connection
        hands them to the manager."""
        session = self.manager.relays[url].session
        filters = self.conn(url).subscriptions.get(sub_id)
        self.feed(RemoteEvents(url, session, [
            RemoteEvent(url, session, sub_id, e, matched=filters.matching(e) if filters is not None else ())
            for e in events]))

    def settle(self, url: str) -> None:
        """Own-relay reads answered (it holds nothing) and every page ended empty, until
        nothing is left to start; then the completion check's wait."""
        for _ in range(20):
            self.answer_own_reads()
            self.advance(1.1)  # the pacing gate
            historic = self.conn(url).subscriptions.keys() - self.state(url).current.live_subs.keys()
            if not historic and not self.own_reads() and not self.state(url).current.historic_queue:
                break
            self.eose_all(url)
        self.answer_own_reads()
        self.advance(10)

    # -- reading ---------------------------------------------------------------------------

    def state(self, url: str):
        return self.manager.relays[url]

    def recovering(self, url: str) -> set[str]:
        """The ids missing-event recovery still asks ``url`` for."""
        r = self.manager.recovery._relays.get(url)
        return set(r.pending) if r else set()

    def conn(self, url: str) -> RecordedConnection:
        return self.effects.connections[url][-1]

    def frames(self, url: str, verb: str | None = None) -> list:
        frames = self.conn(url).frames
        return [f for f in frames if verb is None or f[0] == verb]

    def reqs(self, url: str) -> list:
        """``["REQ", sub_id, *filters]`` frames sent to ``url`` this session."""
        return self.frames(url, "REQ")

    def historic_reqs(self, url: str, times: bool = False) -> list:
        """The REQs of historic sync (not live subscriptions: those ask ``limit: 0``, or go
        by their ids on a relay known to drop them); with ``times``, as (when sent, frame)."""
        conn = self.conn(url)
        out = [(at, f) for at, f in zip(conn.sent_at, conn.frames, strict=True)
               if f[0] == "REQ" and not all(flt.get("limit") == 0 for flt in f[2:])
               and not f[1].startswith((LIVE_SUB_PREFIX, LAYER1_LIVE_SUB))]
        return out if times else [f for _, f in out]

    def replies_asked(self, url: str, event_id: str) -> list:
        """The REQs sent to ``url`` asking for replies to ``event_id`` (``#e``)."""
        return [r for r in self.reqs(url) if any(event_id in flt.get("#e", ()) for flt in r[2:])]

    def eose_all(self, url: str) -> None:
        """The relay ends every open subscription's stored events, nothing found."""
        for sub_id in list(self.conn(url).subscriptions):
            self.relay_says(url, wire.Eose(sub_id))


def resync_holdings(n: int = 150):
    """``answer_own_reads``' ``held`` for a re-sync: the own relay holds ``n`` events of every
    filter, enough that REQ pages would bring back more than NIP-77's starts cost
    (``sync.method``): every filter goes by NIP-77."""
    pairs = [(1_700_000_000 - i, f"{i + 1:064x}") for i in range(n)]
    return lambda flt: pairs


def held_items(flt, pairs, used: set) -> HeldItems:
    """What a read of ``flt`` returns when the own relay holds ``pairs`` (created_at, id) of
    it: events of its first kind and author, tagged with every value it asks for. An id in
    ``used`` (given for another filter) is made another one."""
    pairs = [(at, event_id if event_id not in used else hashlib.sha256((event_id + flt.to_json()).encode()).hexdigest())
             for at, event_id in pairs]
    used.update(event_id for _, event_id in pairs)
    kind = min(flt.kinds) if flt.kinds else 1
    pubkey = min(flt.authors) if flt.authors else "0" * 64
    tags = [[name, value] for name, values in flt.tags for value in sorted(values)]
    return HeldItems({"id": event_id, "created_at": at, "kind": kind, "pubkey": pubkey, "tags": tags}
                     for at, event_id in pairs)
