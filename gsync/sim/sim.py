"""The simulation: gsync's real ``SyncManager`` in one process, in a seeded world, through
simulated time.

Nothing is spawned and no socket is opened. The manager's timers, its NIP-77 exchanges and
own-relay reads, every frame to and from a relay, delivery to the own relay and the
self-subscription are events in one heap ordered by simulated time (``Simulation.at``); the
clock jumps to the next one. What the manager's greenlets would do is done here, through
gsync's own code where it can run without a hub:

- a relay connection is gsync's ``RelayConnection`` (its frame checks, AUTH, NOTICE
  handling) with ``send`` handing frames to the simulated relay (``relay.SimRelay``) and the
  relay's answers fed to its ``_handle_frame`` after the relay's latency;
- a NIP-77 exchange is ``negentropy_sync.reconcile_filter`` itself, run when its turn comes,
  the relay answering each of its frames at once (an exchange the relay never answers is
  left hanging, for the manager's deadline to end);
- delivery is ``OwnRelayDelivery`` with its lanes replaced by a pump that hands events to the
  own relay (``relay.OwnRelay``) and reads its ``OK`` through the wire parser;
- gsync's state is a real ``state_dir`` (SQLite), so a kill and restart starts the next
  manager on what the last one saved.

Randomness comes from one ``random.Random(seed)``; iteration is over lists and insertion-
ordered dicts only, so a seed gives the same run (``trace_hash``) in every process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import heapq
import itertools
import json
import os
import random
import re
import tempfile
import traceback
from collections import deque
from dataclasses import dataclass, field

import structlog

from .. import constants
from ..io import connection as connection_module
from ..io import negentropy_sync
from ..io.connection import RelayConnection
from ..io.delivery import OwnRelayDelivery
from ..io.handshake import HandshakePool
from ..io.inbox import (
    HandshakeDone,
    HandshakeStarted,
    OwnEvents,
    OwnLanded,
    OwnReadsLanded,
    OwnSubscribed,
    OwnWitnessRead,
    RelayDisconnected,
    RemoteEvents,
    Tick,
)
from ..io.manager import SyncManager
from ..io.manager import lifecycle as lifecycle_module
from ..io.manager.effects import ConnectionLinks
from ..io.own_query import HeldItems
from ..ops import metrics
from ..ops.config import AuthConfig, Config, MetricsConfig, NetworkConfig, ServiceConfig, SyncConfig
from ..ops.logging import configure_logging
from ..protocol import messages as wire
from ..protocol.event import Event
from ..sync import status as status_module
from ..sync.own_held import HeldEntry
from ..sync.relay_state import ConnectionStatus
from . import faults as faults_module
from .invariants import REFILL_SECS, Checker
from .relay import OwnRelay, SimRelay
from .world import DAY, DOMAIN, KIND_ISSUE, KIND_PATCH, OWN_URL, START, World

GSYNC_SECRET = hashlib.sha256(b"gsync-sim:gsync").hexdigest()
_MEMORY_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class SimOptions:
    seed: int = 1
    days: float = 30.0
    relays: int = 6
    repos: int = 30
    publish_per_day: float | None = None  # world activity; default: repos / 3 a day
    faults: bool = True
    fault_scale: float = 1.0  # every fault rate times this
    abandon_per_day: float = faults_module.ABANDON_PER_DAY  # relays dropped by every repository listing them
    until_exclusive: float = 0.2  # the share of relays that read a filter's until as exclusive
    series: float = 0.1  # the share of roots that open a patch series sent at their second
    small_pages: float = 0.25  # the share of relays that serve 20 or 50 events a filter
    req_caps: float = 0.15  # the share of relays that cap a whole REQ (its filters together) at 60 or 150
    limit_zero: float = 0.1  # the share of relays that read limit 0 as no limit (live REQs get stored events)
    imports: float = 0.1  # the share of repositories whose history holds an import (World.imported); a
    # twentieth of it, the odds of one with each publication after
    closes_after_eose: float = 0.1  # the share of relays that close every subscription after its EOSE
    query_limits: float = 0.1  # the share of relays limiting queries per session (QUERY_LIMIT)
    ahead: float = 0.02  # the share of publications from a client whose clock runs 20 min - 3 h ahead
    ignores_until: float = 0.05  # the share of relays ignoring a filter's until
    since_exclusive: float = 0.0  # the share of relays reading a filter's since as exclusive
    # the share of relays answering each filter of a REQ on its own, as khatru does (ngit-relay):
    # an event two filters match comes twice, and the answer is not newest first as a whole
    per_filter: float = 0.0
    # the share of relays serving a filter that carries no limit its oldest events, as many as
    # their page cap, oldest first (nostream: ``LIMIT 500 ORDER BY created_at ASC``); one with a
    # limit, its newest (NIP-01)
    oldest_first: float = 0.0
    # the share of relays refusing a REQ in a NOTICE alone, no CLOSED (nostream, invalid filters)
    notice_refusals: float = 0.0
    # of those, the share naming the REQ it refuses (``["NOTICE", <sub_id>, <message>]``,
    # NIP-01's form for a while in 2023)
    notice_names: float = 0.0
    # of the relays requiring AUTH, the share refusing what they read before it
    # "restricted: permission denied" (nostr_relay), not "auth-required:"
    auth_restricted: float = 0.0
    # of the relays requiring AUTH, the share doing it as khatru does (``SimRelay.auth_late``):
    # a challenge with each refusal only, and our AUTH taken a moment after what follows it
    auth_late: float = 0.0
    # the share of relays answering only precise queries (nostr-rs-relay's limit_scrapers,
    # its NIP-11 naming it; no NIP-77 there): ``SimRelay.precise_only``
    precise_only: float = 0.0
    # the share of relays refusing any filter that may bring kind-1 notes without naming
    # authors, REQ and NEG-OPEN alike (khatru's AntiSyncBots): ``SimRelay.anti_sync_bots``
    anti_sync_bots: float = 0.0
    # the share of relays refusing a REQ whose filter asks a limit above their page cap, in a
    # NOTICE naming the most they take, as nostream does ("Subscription rejected: Limit too
    # high"): ``SimRelay.limit_refusals``
    limit_refusals: float = 0.0
    # the share of relays answering one filter of a REQ (the first or the last) and dropping
    # the rest without a word: ``SimRelay.one_filter``
    one_filter: float = 0.0
    # the share of relays reading the first 2, 3 or 5 filters of a REQ and dropping the rest
    # without a word (``SimRelay.filter_cap``), of those answering every filter
    filter_caps: float = 0.0
    # of those, the share reading the last few filters instead (a relay keeping the REQ's
    # newest filters within its cap): ``SimRelay.filter_cap_last``
    filter_caps_last: float = 0.0
    # the share of relays refusing a filter holding more than VALUE_CAPS values in one list
    # (its ids, authors or one tag's), in words about its size: ``SimRelay.value_cap``
    value_caps: float = 0.0
    # of those, the share counting a filter's tag values and answering a filter past the cap
    # with nothing, without a word: ``SimRelay.value_cap_silent``
    value_caps_silent: float = 0.0
    # the share of relays whose refusal of a subscription past their cap names it, as
    # nostream's does ("must be less than or equal to 10"): ``SimRelay.subs_cap_said``
    subs_caps_said: float = 0.0
    # the share of relays dropping, without a word, every live subscription carrying a
    # ``limit`` (ORLY since October 2025: ``limit: 0`` included): ``SimRelay.drops_live``
    drops_live: float = 0.0
    # of the relays serving NIP-77, the share comparing a filter's newest events only
    # (``SILENT_CAPS``), silently (khatru relays whose store caps queries): ``SimRelay.neg_silent_cap``
    neg_silent_caps: float = 0.0
    # the share of relays whose answers take time with what they read, stopped at a time
    # budget (``SLOW_BUDGETS``) and sent cut there: ``SimRelay.query_budget``
    slow_queries: float = 0.0
    # the share of relays (of those answering every query) whose NIP-11 names nostr-rs-relay
    # (``limit_scrapers`` off, its default; no NIP-77 there): ``SimRelay.names_rs``
    rs_software: float = 0.0
    # the share of relays (of those without a query budget) answering as slowly, whole,
    # however long it takes: ``SimRelay.slow_rng`` without ``query_budget``
    slow_unbounded: float = 0.0
    # the share of publications followed by a reply tagging only a thread member (a kind-1
    # reply or a reaction to a comment), sent to some of its repository's relays, not the
    # own relay: gsync finds it by the member's id (SPEC §3, direct-member descendants)
    member_replies: float = 0.0
    own_full: float = faults_module.OWN_FULL_PER_DAY  # the own relay's disk full, per day
    own_readonly: float = faults_module.OWN_READONLY_PER_DAY  # the own relay read-only, per day
    own_rate_limited: float = faults_module.OWN_RATE_LIMITED_PER_DAY  # its writes rate-limited, per day
    liveness_after: float | None = None  # the day faults stop (default: days - 2, if > 1)
    tick_secs: float = constants.MAINTENANCE_TICK_SECS
    idle_tick_secs: float = 120.0  # the tick's period while nothing else happens (see tick)
    busy_secs: float = 20.0  # ticks every tick_secs until this long after the last other message
    gate_ms: int | None = None  # background_start_interval_ms (None: the default gate)
    keep_state: bool = False
    verbose_logs: bool = False  # gsync's own logs (debug) on stdout


# A relay limiting its sessions' queries (REQ, NEG-OPEN): a burst of 20, then one every 2 s
# (``SimOptions.query_limits``; PEERS.md: LocalRelay closes a connection's REQs past its own)
QUERY_LIMIT = (20, 2.0)
# How many round trips an exchange waits at most for a relay to read our AUTH (a session
# without an answer to its challenge by then is refused, as a relay would refuse it)
EXCHANGE_AUTH_DEFERRALS = 5
# The silent NIP-77 caps a relay may have (``SimOptions.neg_silent_caps``): numbers someone
# would configure (khatru's sqlite default, 100), and numbers nobody would, which gsync
# checked for only on khatru until 2026-12-07 (events left behind for good elsewhere).
SILENT_CAPS = (50, 100, 77, 130)
# The query time budgets a slow relay may have (``SimOptions.slow_queries``), in seconds:
# above ``constants.TIME_CUT_SUSPECT_SECS``, which gsync takes for the least a relay gives
SLOW_BUDGETS = (2.5, 5.0)
# How many filters of a REQ a relay reading only its first few may read (``SimOptions.filter_caps``)
FILTER_CAPS = (2, 3, 5)
# The caps on a filter's values a relay may have (``SimOptions.value_caps``)
VALUE_CAPS = (20, 50, 100)

# The world's shares and rates a bench/simulate flag sets, each drawn from a generator of its
# own (0: the world of before it): (SimOptions field, flag)
WORLD_SHARES = (
    ("abandon_per_day", "--abandon-rate"),
    ("until_exclusive", "--until-exclusive"),
    ("series", "--series"),
    ("small_pages", "--small-pages"),
    ("req_caps", "--req-caps"),
    ("limit_zero", "--limit-zero"),
    ("imports", "--imports"),
    ("closes_after_eose", "--closes-after-eose"),
    ("query_limits", "--query-limits"),
    ("ahead", "--ahead"),
    ("ignores_until", "--ignores-until"),
    ("since_exclusive", "--since-exclusive"),
    ("per_filter", "--per-filter"),
    ("oldest_first", "--oldest-first"),
    ("notice_refusals", "--notice-refusals"),
    ("notice_names", "--notice-names"),
    ("auth_restricted", "--auth-restricted"),
    ("auth_late", "--auth-late"),
    ("precise_only", "--precise-only"),
    ("anti_sync_bots", "--anti-sync-bots"),
    ("limit_refusals", "--limit-refusals"),
    ("one_filter", "--one-filter"),
    ("filter_caps", "--filter-caps"),
    ("filter_caps_last", "--filter-caps-last"),
    ("value_caps_silent", "--value-caps-silent"),
    ("value_caps", "--value-caps"),
    ("subs_caps_said", "--subs-caps-said"),
    ("drops_live", "--drops-live"),
    ("neg_silent_caps", "--neg-silent-caps"),
    ("slow_queries", "--slow-queries"),
    ("rs_software", "--rs-software"),
    ("slow_unbounded", "--slow-unbounded"),
    ("member_replies", "--member-replies"),
    ("own_full", "--own-full"),
    ("own_readonly", "--own-readonly"),
    ("own_rate_limited", "--own-rate-limited"),
)


class SimTime:
    """Stands in for the ``time`` module where gsync reads the clock."""

    def __init__(self, clock):
        self._clock = clock

    def monotonic(self) -> float:
        return self._clock.now

    def time(self) -> float:
        return self._clock.now


class SimClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class NoAnswer(BaseException):  # noqa: N818 (a control-flow signal, as GreenletExit)
    """A NIP-77 exchange waits for an answer that will never come: it hangs (the manager's
    deadline ends it), as its greenlet would."""


class SimInbox:
    """An exchange's inbox (``negentropy_sync.exchange``): the relay answered synchronously,
    so an empty inbox means no answer is coming."""

    def __init__(self):
        self.items: deque = deque()

    def qsize(self) -> int:
        return len(self.items)

    def put(self, item) -> None:
        self.items.append(item)

    def get(self, timeout=None):
        if not self.items:
            raise NoAnswer()
        return self.items.popleft()


class Spawned:
    """A greenlet the manager asked for: run by the simulation when its turn comes. It is
    also the handle the manager gets back (opaque to it) and hands to ``SimEffects.kill``
    and ``on_death``."""

    def __init__(self, fn, args, kwargs):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.killed = False
        self.dead_callbacks: list = []  # each takes the exception it died of
        self.deferred = 0  # times an exchange waited for our AUTH to be read (``Simulation.exchange``)
        self.started_at: float | None = None  # when it first would have run, had it not waited


class SimWs:
    connected = True

    def close(self, timeout=None) -> None:
        self.connected = False

    def peer_closed(self) -> bool:
        return not self.connected


class SimConnection(RelayConnection):
    """gsync's connection object, its socket replaced by the simulation."""

    def __init__(self, sim, number, *args, **kwargs):
        super().__init__(*args, clock=sim.clock, **kwargs)
        self.sim = sim
        self.number = number
        self.gen = sim.gen
        self.last_arrival = 0.0
        self.starts: list[float] = []  # when each background start went (politeness)
        self.neg_started_at: float | None = None  # an exchange that waited for our AUTH: when it began

    def start(self) -> None:
        pass

    def send(self, text: str) -> None:
        if not self.closed:
            self.sim.client_frame(self, text)

    def _flush_events(self) -> None:
        if self._events:
            events, self._events = self._events, []
            self._post(RemoteEvents(self.relay, self.session, events))

    def close(self, reason: str = "closed by gsync") -> None:
        if self.closed:
            return
        self.closed = True
        self.sim.client_closed(self)


class SimEffects(ConnectionLinks):
    def __init__(self, sim, gen: int):
        self.sim = sim
        self.gen = gen
        self._links: dict[int, SimConnection] = {}  # connection handle → the connection
        self._handles = itertools.count(1)

    def later(self, delay: float, msg) -> None:
        self.sim.at(self.sim.clock.now + delay, self.sim.post, msg, gen=self.gen)

    def every(self, interval: float, make_msg):
        return Spawned(make_msg, (interval,), {})

    def spawn(self, fn, *args, **kwargs) -> Spawned:
        g = Spawned(fn, args, kwargs)
        self.sim.run_spawned(g, self.gen)
        return g

    @staticmethod
    def on_death(handle: Spawned, callback) -> None:
        handle.dead_callbacks.append(callback)

    @staticmethod
    def kill(handle: Spawned) -> None:
        handle.killed = True

    def connection(self, relay: str, ws, session: int, **kwargs):
        return self._link(self.sim.open_connection(relay, session, **kwargs))

    def monotonic(self) -> float:
        return self.sim.clock.now


class SimHandshakes(HandshakePool):
    """Handshakes answered by the simulated relays after their latency."""

    def __init__(self, sim):
        super().__init__(sim.post, None, workers=8)
        self.sim = sim

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def request(self, relay: str, attempt: int) -> None:
        self.queued.add(relay)
        # (this gsync process's: one stopped or killed within the 10 ms dials nothing)
        self.sim.at(self.sim.clock.now + 0.01, self.sim.handshake, relay, attempt, gen=self.sim.gen)


class SimDelivery(OwnRelayDelivery):
    """Delivery as gsync does it (tracking, retries, reports), its lanes replaced by a pump
    the simulation runs: the own relay answers each event as it would over a lane."""

    def __init__(self, sim):
        super().__init__(OWN_URL, sim.post, clock=sim.clock, wallclock=sim.clock,
                         max_backlog=constants.DELIVERY_MAX_BACKLOG)
        self.sim = sim
        self.pump_due = False
        self.down = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self._stopping = True

    def _wake_lanes(self) -> None:
        if not self.pump_due:
            self.pump_due = True
            self.sim.at(self.sim.clock.now + 0.005, self.pump, gen=self.sim.gen)

    def pump(self) -> None:
        self.pump_due = False
        now = self.sim.clock.now
        while self._retry_heap and self._retry_heap[0][0] <= now:
            _, _, event = heapq.heappop(self._retry_heap)
            self._parked.discard(event.id)
            if event.id in self._tracked:
                self._queue.append(event, self._sources.get(event.id, ""))
        if self._retry_heap:
            self.sim.at(self._retry_heap[0][0], self._wake_lanes, gen=self.sim.gen)
        own = self.sim.own
        if not own.up:
            if not self.down:
                self.down = True
                self._lane_down(self._lanes[0], "own relay away")
            return  # the lanes dial again: pumped when it is back (Simulation.own_back)
        if self.down:
            self.down = False
            self._lane_up()
        lane = self._lanes[0]
        if now < lane.paused_until:  # a rate-limited answer: the sender waits it out
            self.pump_due = True
            self.sim.at(lane.paused_until, self.pump, gen=self.sim.gen)
            return
        window = []  # sent in one write, as the lane's sender does; then answered
        while self._queue and len(window) < self._window:
            event = self._queue.popleft()
            if event.id in self._tracked and event.id not in lane.in_flight:
                lane.in_flight[event.id] = (event, now)
                window.append(event)
        for event in window:
            accepted, text, stored = self.sim.deliver_to_own(event)
            frame = json.dumps(["OK", event.id, accepted, text])
            self._on_ok(lane, wire.parse_relay_message(frame))
        self._count_delivered()
        if self._queue:
            self._wake_lanes()


class Simulation:
    def __init__(self, options: SimOptions, state_dir: str | None = None):
        self.options = o = options
        self.rng = random.Random(o.seed)
        self.world = World(random.Random(self.rng.random()), relays=o.relays, repos=o.repos,
                           series=random.Random(f"{o.seed}:series"), series_share=o.series,
                           imports=random.Random(f"{o.seed}:imports"), imports_share=o.imports)
        self.clock = SimClock(START)
        self.time = SimTime(self.clock)
        self.heap: list = []
        self.seq = itertools.count()
        self.gen = 0  # the manager's incarnation: what a killed one scheduled is dropped
        self.manager: SyncManager | None = None
        self.hash = hashlib.sha256()  # of the trace: read it through hashed()
        self._unhashed: list[str] = []  # trace lines not in it yet
        self.messages = 0
        self.frames_up = 0
        self.own = OwnRelay(DOMAIN, self.world.repo_of)
        self.relays: dict[str, SimRelay] = {}
        for url in self.world.relay_urls + self.world.spare_urls:
            self.relays[url] = self.make_relay(url)
        self.conns: dict[int, SimConnection] = {}  # open connections by number
        self._held: dict[str, tuple[Event, tuple]] = {}  # id -> (event, held(it)): bounded by the world's events
        self.conn_numbers = itertools.count(1)
        self.own_session: dict = {"connected": False, "last_connected": None}
        self._tmp = None
        if state_dir is None:
            # the simulated disk is memory where there is one (tmpfs): the same SQLite, WAL and
            # transactions, without a real disk's writes at every save (runs side by side do not
            # wait on the disk; the CPU is about the same: 20-30 µs a save on either)
            self._tmp = tempfile.TemporaryDirectory(prefix="gsync-sim-", dir=_MEMORY_DIR)
            state_dir = self._tmp.name
        self.state_dir = state_dir
        self.checker = Checker(self)
        self.liveness_after = (o.liveness_after if o.liveness_after is not None
                               else (o.days - 2 if o.days > 2.5 else None))
        self.faults = faults_module.Faults(self, random.Random(self.rng.random()))
        self.last_busy = START  # the last moment something other than a tick happened
        self.tick_serial, self.tick_due = 0, float("inf")  # the next tick (schedule_tick)
        self.restarts = 0
        self.own_lost = 0  # events the own relay lost while away (Checker.own_back)
        self.own_lost_ids: list[str] = []  # ... which (Checker.refilled)
        self.ahead_rng = random.Random(f"{o.seed}:ahead")
        self.replies_rng = random.Random(f"{o.seed}:member-replies")

    def make_relay(self, url: str) -> SimRelay:
        r = self.rng
        relay = SimRelay(url, page_cap=r.choice((500, 500, 300, 100)), max_subs=r.choice((20, 20, 50, 10)),
                         nip77=r.random() < 0.6, nip11=r.random() < 0.8, auth_required=r.random() < 0.1,
                         max_sync_events=r.choice((None, None, None, 200)))
        relay.latency = r.uniform(0.02, 0.25)
        # (drawn apart: with none, a seed's world is what it was before relays did)
        o = self.options
        relay.until_exclusive = random.Random(f"{o.seed}:{url}:until").random() < o.until_exclusive
        small = random.Random(f"{o.seed}:{url}:pages")
        if small.random() < o.small_pages:
            relay.page_cap = small.choice((20, 50))
        per_req = random.Random(f"{o.seed}:{url}:req")
        if per_req.random() < o.req_caps:
            relay.req_cap = per_req.choice((60, 150))
        relay.limit_zero_unlimited = random.Random(f"{o.seed}:{url}:limit0").random() < o.limit_zero
        relay.closes_after_eose = random.Random(f"{o.seed}:{url}:closes").random() < o.closes_after_eose
        if random.Random(f"{o.seed}:{url}:queries").random() < o.query_limits:
            relay.query_limit = QUERY_LIMIT
        relay.ignores_until = random.Random(f"{o.seed}:{url}:ignores").random() < o.ignores_until
        relay.since_exclusive = random.Random(f"{o.seed}:{url}:since").random() < o.since_exclusive
        relay.per_filter = random.Random(f"{o.seed}:{url}:per-filter").random() < o.per_filter
        relay.oldest_first = random.Random(f"{o.seed}:{url}:oldest").random() < o.oldest_first
        relay.notice_refusals = random.Random(f"{o.seed}:{url}:notice").random() < o.notice_refusals
        relay.notice_names = relay.notice_refusals and random.Random(f"{o.seed}:{url}:names").random() < o.notice_names
        relay.auth_restricted = (relay.auth_required
                                 and random.Random(f"{o.seed}:{url}:auth-words").random() < o.auth_restricted)
        relay.auth_late = (relay.auth_required and not relay.auth_restricted
                           and random.Random(f"{o.seed}:{url}:auth-late").random() < o.auth_late)
        silent = random.Random(f"{o.seed}:{url}:neg-silent")
        if relay.nip77 and silent.random() < o.neg_silent_caps:
            relay.neg_silent_cap = silent.choice(SILENT_CAPS)
        if random.Random(f"{o.seed}:{url}:precise").random() < o.precise_only:
            relay.precise_only, relay.nip77, relay.nip11 = True, False, True
        elif random.Random(f"{o.seed}:{url}:rs").random() < o.rs_software:
            relay.names_rs, relay.nip77, relay.nip11 = True, False, True  # (nostr-rs-relay: no NIP-77)
        relay.limit_refusals = random.Random(f"{o.seed}:{url}:limits").random() < o.limit_refusals
        one = random.Random(f"{o.seed}:{url}:one-filter")
        if one.random() < o.one_filter and not relay.names_rs:  # (nostr-rs-relay answers every filter)
            relay.one_filter = one.choice(("first", "last"))
        capped = random.Random(f"{o.seed}:{url}:filter-cap")
        if capped.random() < o.filter_caps and relay.one_filter is None and not relay.names_rs:
            relay.filter_cap = capped.choice(FILTER_CAPS)
            relay.filter_cap_last = random.Random(f"{o.seed}:{url}:cap-last").random() < o.filter_caps_last
        relay.drops_live = random.Random(f"{o.seed}:{url}:drops-live").random() < o.drops_live
        relay.subs_cap_said = random.Random(f"{o.seed}:{url}:subs-said").random() < o.subs_caps_said
        values = random.Random(f"{o.seed}:{url}:value-cap")
        if values.random() < o.value_caps:
            relay.value_cap = values.choice(VALUE_CAPS)
            relay.value_cap_said = values.random() < 0.5
            relay.value_cap_silent = random.Random(f"{o.seed}:{url}:values-silent").random() < o.value_caps_silent
        slow = random.Random(f"{o.seed}:{url}:slow")
        if slow.random() < o.slow_queries:
            relay.query_budget = slow.choice(SLOW_BUDGETS)
            relay.slow_rng = random.Random(f"{o.seed}:{url}:slow-answers")
        elif random.Random(f"{o.seed}:{url}:slow-unbounded").random() < o.slow_unbounded:
            relay.slow_rng = random.Random(f"{o.seed}:{url}:slow-answers")  # (no budget)
        # (khatru's policy: not on a relay answering only precise queries, nostr-rs-relay's)
        relay.anti_sync_bots = (random.Random(f"{o.seed}:{url}:anti-sync").random() < o.anti_sync_bots
                                and not relay.precise_only)
        return relay

    # -- the heap -----------------------------------------------------------------------

    def at(self, when: float, fn, *args, gen: int | None = None) -> None:
        """``fn(*args)`` at ``when``; ``gen``: only if that manager still runs."""
        heapq.heappush(self.heap, (when, next(self.seq), gen, fn, args))

    def stamp(self) -> str:
        """The clock as the trace writes it (``%.3f``): made again only when it moved (the
        messages a step drains share it)."""
        now = self.clock.now
        if now != self._stamped_at:
            self._stamped_at, self._stamp = now, f"{now:.3f}"
        return self._stamp

    _stamped_at, _stamp = None, ""

    def note(self, *parts) -> None:
        """One line of the trace (hashed; kept only in ``trace_lines`` if asked for)."""
        line = f"{self.stamp()} {' '.join(map(str, parts))}\n"
        unhashed = self._unhashed
        unhashed.append(line)
        if len(unhashed) >= 1024:  # hashed a thousand lines at a time: the same digest
            self.hashed()
        if self.trace_lines is not None:
            self.trace_lines.append(line)

    def hashed(self):
        """The trace's hash (``hashlib``), every line noted so far in it."""
        if self._unhashed:
            self.hash.update("".join(self._unhashed).encode())
            self._unhashed.clear()
        return self.hash

    trace_lines: list | None = None

    def post(self, msg) -> None:
        if self.manager is not None:
            self.manager.post(msg)

    # -- the manager ----------------------------------------------------------------------

    def config(self) -> Config:
        o = self.options
        sync = dict(bootstrap_relays=tuple(self.world.bootstrap))
        if o.gate_ms is not None:
            sync["background_start_interval_ms"] = o.gate_ms
        return Config(service=ServiceConfig(OWN_URL, (DOMAIN,), self.state_dir), sync=SyncConfig(**sync),
                      network=NetworkConfig(), auth=AuthConfig(secret_key=GSYNC_SECRET),
                      metrics=MetricsConfig(listen=None))

    def start_gsync(self) -> None:
        if self.manager is not None:
            # (a restart scheduled by a stop, after the faults' settling started it already:
            # seed 7034 of the filter-caps world with --slow-queries, day 2.0008)
            return
        self.checker.gsync_started_or_stopped()
        for m in metrics.relay_labelled():  # a new process: no series of the last one's
            m.clear()
        self.gen += 1
        self.note("gsync_start", self.gen)
        self.delivery = SimDelivery(self)
        self.manager = SyncManager(self.config(), clock=self.clock, delivery=self.delivery,
                                   effects=SimEffects(self, self.gen))
        self.manager.handshakes = self.manager.lifecycle.handshakes = SimHandshakes(self)
        self.watch_forgetting(self.manager.saved)
        # (``SyncManager.start`` is not called: the simulation ticks it (``tick``), runs its
        # delivery and self-subscription; this is the ticker's handle ``stop`` kills, without
        # which ``stop`` raised before its save: every graceful stop was a kill, seed 10's year)
        self.manager._ticker = self.manager.effects.every(constants.MAINTENANCE_TICK_SECS, lambda: Tick(self.clock.now))
        self.own_session = {"connected": False, "last_connected": self.own_session.get("last_connected")
                            if self.restarts == 0 else None}
        self.at(self.clock.now + 0.01, self.self_sub_connect, gen=self.gen)
        self.schedule_tick(self.clock.now + self.options.tick_secs)
        self.checker.gsync_started()

    def watch_forgetting(self, saved) -> None:
        """The checker is told which saved relays a process forgets, when it forgets them: the
        first save once ready drops the memories of relays no repository listed then
        (``SavedState.save``), minutes before they may be listed again (seed 71's year, day
        230.51: the own relay had lost its announcements; relay3's dead mark went 400 s before
        relay3 was registered anew, between two of the checker's 10-minute samples)."""
        real_save = saved.save

        def save(relays, health, rejected, now, *, ready, **kwargs):
            if ready and saved._memories:
                self.checker.forgotten(set(saved._memories))
            return real_save(relays, health, rejected, now, ready=ready, **kwargs)

        saved.save = save

    def stop_gsync(self, graceful: bool) -> None:
        """gsync stopped (SIGTERM: state saved) or killed (what it held in memory is lost)."""
        m = self.manager
        if m is None:
            return
        self.note("gsync_stop", graceful)
        self.checker.gsync_ending()
        if not graceful:
            self.checker.gsync_killed(m.saved.saved_at)
        if graceful:
            try:
                m.stop()  # (its state saved)
            except Exception as exc:  # production's stop would have raised too
                self.checker.violation("handler_raised", f"stop: {type(exc).__name__}: {exc}",
                                       detail=traceback.format_exc(limit=6))
        for number in list(self.conns):
            conn = self.conns.pop(number)
            conn.closed = True
            self.checker.session_changed(conn.relay, -1, conn)
            self.relays[conn.relay].close_session(number)
        m.saved.close()
        self.checker.gsync_started_or_stopped()
        self.manager = None
        self.gen += 1  # what the old one scheduled is dropped
        self.restarts += 1

    def tick(self, serial: int) -> None:
        """The maintenance tick: every ``tick_secs`` (2 s, as in production) until
        ``busy_secs`` after the last message that is not a tick, every ``idle_tick_secs``
        while nothing else happens; a message in a quiet stretch (but those that start only a
        redial: ``starts_only_a_redial``) brings the next tick to within ``tick_secs``
        (``handle``: what it starts that only a tick goes on with, the
        state save among them, waited for the idle tick, up to five minutes; seed 1's year
        at day 222.78, a refusal's pause unsaved 288 s). A simplification for speed: what only a tick starts
        (polls, probes, the daily fresh start) starts up to ``idle_tick_secs`` late in a
        quiet world; every timer the manager sets itself fires on time, and so does the
        tick that redials a relay when its backoff ends (the invariants judge how long gsync
        stays away from a relay: that must be gsync's backoff, not the simulator's tick)."""
        if serial != self.tick_serial:
            return  # brought forward since (redial_due)
        self.post(Tick(self.clock.now))
        quiet = self.clock.now - self.last_busy > self.options.busy_secs
        step = self.options.idle_tick_secs if quiet else self.options.tick_secs
        if quiet:  # (one due now is this tick's to dial, or not: max_relays)
            step = min(step, max(self.options.tick_secs, self.next_redial(after=self.clock.now) - self.clock.now))
        self.schedule_tick(self.clock.now + step)

    def schedule_tick(self, when: float) -> None:
        self.tick_serial += 1
        self.tick_due = when
        self.at(when, self.tick, self.tick_serial, gen=self.gen)

    def redial_due(self) -> None:
        """A relay went back to Disconnected (its session ended, or a dial failed): the tick
        that dials it again comes when its backoff ends, if the next one is later."""
        due = max(self.next_redial(after=float("-inf")), self.clock.now + self.options.tick_secs)
        if due < self.tick_due:
            self.schedule_tick(due)

    def next_redial(self, after: float) -> float:
        """When the manager's tick next dials a relay (as ``lifecycle.connect_due_relays``
        chooses them) later than ``after``, if nothing changes meanwhile."""
        m, now = self.manager, self.clock.now
        if m is None:
            return float("inf")
        soonest = float("inf")
        next_attempt_at, wanted, disconnected = m.health.next_attempt_at, m.lifecycle.wanted, ConnectionStatus.DISCONNECTED
        for s in m.relays.values():
            if s.status is disconnected and not s.refused_reason and wanted(s):
                at = next_attempt_at(s.url, now)
                if after < at < soonest:
                    soonest = at
        return soonest

    def handle(self, msg) -> None:
        m = self.manager
        kind = type(msg)
        name = kind.__name__
        if kind is not Tick and not self.starts_only_a_redial(msg, kind):
            self.last_busy = self.clock.now
            if self.tick_due > self.clock.now + self.options.tick_secs:  # a quiet stretch ends (see tick)
                self.schedule_tick(self.clock.now + self.options.tick_secs)
        self.messages += 1
        self.checker.message(msg, name)
        # (note("msg", name, relay, session), written out: one line per message)
        fields = _TRACED.get(kind)
        if fields is None:
            fields = _TRACED[kind] = _traced(kind)
        if fields is not False:
            relay = msg.relay if fields[0] else ""
            session = msg.session if fields[1] else ""
        else:
            relay, session = getattr(msg, "relay", ""), getattr(msg, "session", "")
        line = f"{self.stamp()} msg {name} {relay!s} {session!s}\n"
        unhashed = self._unhashed
        unhashed.append(line)
        if len(unhashed) >= 1024:
            self.hashed()
        if self.trace_lines is not None:
            self.trace_lines.append(line)
        try:
            m.apply(msg)
        except Exception as exc:  # production logs it and goes on; here it is a violation
            self.checker.violation("handler_raised", f"{name}: {type(exc).__name__}: {exc}",
                                   detail=traceback.format_exc(limit=6))
        if name in ("RelayDisconnected", "HandshakeDone") and self.manager is m:
            self.redial_due()

    def starts_only_a_redial(self, msg, kind) -> bool:
        """A dial, a dial that failed, and the end of a session that had nothing pending
        start nothing a tick goes on with but the relay's redial, whose tick comes when its
        backoff ends (``redial_due``). (A session's pending batches, abandoned, hand what
        they claimed to other relays' recovery, which a tick starts.) A dead or restarting
        relay's dials and idle sessions ended most quiet stretches."""
        if kind is HandshakeStarted:
            return True
        if kind is HandshakeDone:
            return msg.ws is None
        if kind is RelayDisconnected:
            state = self.manager.relays.get(msg.relay)
            return state is None or not state.current.pending
        return False

    def drain(self) -> None:
        m = self.manager
        while m is not None and not m.queue.empty():
            self.handle(m.queue.get_nowait())
            m = self.manager

    # -- spawned greenlets ----------------------------------------------------------------

    def run_spawned(self, g: Spawned, gen: int) -> None:
        if g.fn is negentropy_sync.read_merged:
            self.at(self.clock.now + 0.005, self.own_read, g, gen=gen)
        elif g.fn is negentropy_sync.reconcile_filter:
            self.at(self.clock.now + 0.001, self.exchange, g, gen=gen)
        elif g.fn is negentropy_sync.ask_back:
            self.at(self.clock.now + 0.005, self.own_asked_back, g, gen=gen)
        else:
            raise RuntimeError(f"the simulation cannot run {g.fn!r}")

    def own_read(self, g: Spawned) -> None:
        if g.killed:
            return
        own_url, reads, post = g.args
        if not self.own.up:
            post(OwnReadsLanded(g.kwargs["read_id"], list(reads), None, "own relay query failed: ConnectionRefusedError",
                                g.kwargs.get("epoch", 0)))
            return
        fresh = g.kwargs.get("fresh", False)
        holdings = [None if f is None else negentropy_sync._holdings.get(own_url, f, fresh) for f in reads]
        post(OwnReadsLanded(g.kwargs["read_id"], list(reads), holdings, "", g.kwargs.get("epoch", 0)))

    def own_asked_back(self, g: Spawned) -> None:
        """The own relay asked by id which witnesses it holds (``negentropy_sync.ask_back``)."""
        if g.killed:
            return
        own_url, asked, filters, post = g.args
        if not self.own.up:
            post(OwnWitnessRead(list(asked), None, "own relay query failed: ConnectionRefusedError"))
            return
        held = [pair for flt in filters for pair in self.own_holdings(own_url, flt).entries]
        post(OwnWitnessRead(list(asked), held, ""))

    def own_holdings(self, url: str, flt) -> HeldItems:
        """What the own relay holds of ``flt`` (``SharedHoldings``' read), each event's entry
        made once (``held``)."""
        if not self.own.up:
            raise ConnectionRefusedError("own relay away")
        return HeldItems.of_entries(map(self.held, self.own.store.query(flt.replace(limit=None))))

    def held(self, event: Event) -> tuple[str, HeldEntry]:
        """``event`` as ``HeldItems`` keeps a read of it: (id, ``HeldEntry`` of its JSON
        object). Made once per event (the own relay's holdings are read thousands of times a
        month, and making every entry of every read showed in profiles); an entry is never
        changed, so reads share it."""
        made = self._held.get(event.id)
        if made is None or made[0] is not event:  # (the same id, another event: a forged one)
            made = self._held[event.id] = (event, (event.id, HeldEntry.of(event.to_dict())))
        return made[1]

    def exchange(self, g: Spawned) -> None:
        conn = g.args[0]
        if g.killed or conn.closed:
            return
        relay = self.relays[conn.relay]
        latency = relay.latency
        if self._before_auth(conn, relay) and g.deferred < EXCHANGE_AUTH_DEFERRALS:
            # The exchange runs at once, ahead of the frames in flight; a relay asking for
            # AUTH at connect would refuse it before gsync read the challenge, which TCP's order
            # never lets happen (NIP-77 was off for a day on every such relay). It starts once
            # the challenge came and our AUTH was read (a round trip), as the relay would
            # answer a NEG-OPEN sent again after the AUTH.
            if not g.deferred:
                g.started_at = self.clock.now
            g.deferred += 1
            when = max(self.clock.now, conn.last_arrival) + 2 * latency + 0.001
            self.at(when, self.exchange, g, gen=self.gen)
            return
        self.exchanging = conn
        conn.neg_started_at = g.started_at  # (the gate's checker: when gsync started it)

        def post(msg) -> None:  # the answer after the rounds' round trips
            rounds = max(1, getattr(msg.result, "rounds", 1))
            self.at(self.clock.now + 2 * latency * rounds + relay.exchange_secs(rounds), self.post, msg,
                    gen=self.gen)

        args = list(g.args)
        args[4] = post
        try:
            g.fn(*args, **g.kwargs)
        except NoAnswer:
            self.note("neg_hangs", conn.relay)
        except Exception as exc:
            for callback in g.dead_callbacks:
                callback(exc)
        finally:
            self.exchanging = None
            conn.neg_started_at = None

    exchanging = None

    def _before_auth(self, conn: SimConnection, relay: SimRelay) -> bool:
        """``relay`` asks for AUTH, has not read ours yet on ``conn``'s session, and gsync
        will send it (it has a key and the relay did not refuse it)."""
        session = relay.sessions.get(conn.number)
        relay.now = self.clock.now
        return (relay.auth_required and session is not None and not relay.authed(session)
                and conn.will_authenticate)

    # -- the self-subscription ----------------------------------------------------------

    def self_sub_connect(self) -> None:
        if not self.own.up or self.own_session["connected"]:
            return
        last = self.own_session["last_connected"]
        since = None if last is None else int(last) - constants.RECONNECT_OVERLAP_SECS
        self.own_session["connected"] = True
        self.own_session["last_connected"] = self.clock.now
        kinds = constants.SELF_SUB_KINDS
        events = [e for e in self.own.store.events.values()
                  if e.kind in kinds and (since is None or e.created_at >= since)]
        events.sort(key=lambda e: (-e.created_at, e.id))
        for i in range(0, len(events), 500):
            self.post(OwnEvents(events[i:i + 500]))
        self.post(OwnSubscribed(reconnect=last is not None))
        self.checker.own_read()

    def own_away(self, secs: float, lose_last: float = 0.0) -> None:
        """The own relay goes away for ``secs``; it comes back without what it stored in the
        last ``lose_last`` seconds (a crash before its writes were flushed; ``inf``: a relay
        in memory comes back empty)."""
        self.note("own_away", secs, lose_last)
        self.checker.own_away_at = self.clock.now
        held = set(self.own.stored_at) if lose_last else ()
        lost = self.own.lose_since(self.clock.now - lose_last) if lose_last else 0
        if lost:
            self.checker.own_lost_at = self.clock.now
            self.own_lost += lost
            self.own_lost_ids += sorted(held.difference(self.own.stored_at))
        self.own.up = False
        self.own_session["connected"] = False
        self.at(self.clock.now + secs, self.own_back)
        if self.manager is not None:
            self.delivery._wake_lanes()

    def own_back(self) -> None:
        self.note("own_back")
        self.own.up = True
        self.checker.own_back(self.own_lost)
        if self.own_lost_ids:
            self.at(self.clock.now + REFILL_SECS, self.checker.refilled, self.own_lost_ids, self.clock.now)
        self.own_lost, self.own_lost_ids = 0, []
        if self.manager is not None:
            self.delivery._wake_lanes()
            self.at(self.clock.now + 0.5, self.self_sub_connect, gen=self.gen)

    def deliver_to_own(self, event: Event):
        self.checker.delivered(event)
        accepted, text, stored = self.own.submit(event, self.clock.now)
        self.note("deliver", event.id[:16], accepted, bool(stored))
        if stored and event.kind in constants.SELF_SUB_KINDS and self.own_session["connected"]:
            self.at(self.clock.now + 0.01, self.post, OwnEvents([event]), gen=self.gen)
        return accepted, text, stored

    # -- relays ---------------------------------------------------------------------------

    def handshake(self, url: str, attempt: int) -> None:
        m = self.manager
        m.handshakes.queued.discard(url)
        self.post(HandshakeStarted(url, attempt))
        relay = self.relays.get(url)
        self.checker.dialled(url)
        latency = relay.latency if relay is not None else 0.1
        if relay is None or not relay.up:
            done = HandshakeDone(url, attempt, error="ConnectionRefusedError: [Errno 111] Connection refused")
        else:
            done = HandshakeDone(url, attempt, ws=SimWs(), limits=relay.limits())
        self.at(self.clock.now + 3 * latency, self.post, done, gen=self.gen)

    def open_connection(self, url: str, session: int, **kwargs) -> SimConnection:
        number = next(self.conn_numbers)
        conn = SimConnection(self, number, url, SimWs(), session, self.post, **kwargs)
        relay = self.relays[url]
        if not relay.up:  # it went down between the handshake and now
            self.at(self.clock.now + 0.001, conn._finish, "connection closed", gen=self.gen)
            return conn
        self.conns[number] = conn
        self.checker.session_changed(url, +1)
        relay.now = self.clock.now
        frames = relay.open_session(number)
        if frames:
            self.to_client(conn, frames, relay.latency)
        return conn

    def client_closed(self, conn: SimConnection) -> None:
        if self.conns.pop(conn.number, None) is not None:
            self.checker.session_changed(conn.relay, -1, conn)
        self.relays[conn.relay].close_session(conn.number)

    def client_frame(self, conn: SimConnection, text: str) -> None:
        self.frames_up += 1
        verb, sub_id = _verb_and_sub(text)
        self.note("up", conn.relay, verb, sub_id, len(text))
        self.checker.client_frame(conn, verb, text)
        relay = self.relays[conn.relay]
        if verb.startswith("NEG-") and self.exchanging is conn:
            relay.now = self.clock.now
            frames = relay.handle(conn.number, text)
            for frame in frames:
                conn._handle_frame(frame)
            conn._flush_events()
            return
        self.at(self.clock.now + relay.latency, self.relay_reads, conn, text, gen=conn.gen)

    def relay_reads(self, conn: SimConnection, text: str) -> None:
        if conn.number not in self.conns:
            return
        relay = self.relays[conn.relay]
        relay.now = self.clock.now
        frames = relay.handle(conn.number, text)
        frames = self.faults.tamper(relay, conn, text, frames)
        secs, relay.answer_secs = relay.answer_secs, 0.0
        if secs and frames:
            # a slow query's answer, read beside the others: it holds up no later frame
            self.at(self.clock.now + relay.latency + secs, self.client_reads, conn, frames, gen=conn.gen)
        elif frames:
            self.to_client(conn, frames, relay.latency)

    def to_client(self, conn: SimConnection, frames: list[str], latency: float) -> None:
        when = max(self.clock.now + latency, conn.last_arrival)
        conn.last_arrival = when
        self.at(when, self.client_reads, conn, frames, gen=conn.gen)

    def client_reads(self, conn: SimConnection, frames: list[str]) -> None:
        if conn.closed:
            return
        for frame in frames:
            if conn.closed:
                break
            self.checker.relay_frame(conn, frame)
            conn._handle_frame(frame)
        conn._flush_events()

    def publish(self, event: Event, urls: list[str], own: bool) -> None:
        """A user publishes ``event`` to ``urls`` (and the own relay, if ``own``)."""
        self.note("publish", event.id[:16], len(urls), own)
        self.checker.published(event, urls)
        for url in urls:
            relay = self.relays[url]
            if not relay.up:
                continue
            for number, frames in relay.publish(event).items():
                conn = self.conns.get(number)
                if conn is not None:
                    self.to_client(conn, frames, relay.latency)
        if own and self.own.up:
            accepted, _, stored = self.own.submit(event, self.clock.now)
            if stored and event.kind in constants.SELF_SUB_KINDS and self.own_session["connected"]:
                self.at(self.clock.now + 0.01, self.post, OwnEvents([event]), gen=self.gen)
            elif stored and event.kind in constants.MEMBER_KINDS and self.own_session["connected"]:
                # what someone published to the own relay directly, of the kinds thread members
                # are: the self-subscription's next reread shows it (``SelfSubscriber._read_since``)
                entry = [(event.id, HeldEntry.of(event.to_dict()))]
                period = constants.SELF_REREAD_SECS
                self.at(self.clock.now + period - (self.clock.now - START) % period + 0.01, self.post,
                        OwnLanded(entry), gen=self.gen)

    def relay_down(self, url: str, secs: float | None, lose: float = 0.0) -> None:
        """``url`` goes down (``secs`` None: for good); ``lose``: the fraction of its events
        gone when it comes back."""
        relay = self.relays[url]
        until = float("inf") if secs is None else self.clock.now + secs
        if not relay.up:  # down already: the longer of the two
            if until > relay.down_until:
                relay.down_until, relay.dead = until, secs is None
                if secs is not None:
                    self.at(until, self.relay_up, url)
            return
        self.note("relay_down", url, secs, lose)
        self.checker.relay_went_down(url)  # (its up time so far is counted first)
        relay.up = False
        relay.dead = secs is None
        relay.down_until = until
        self.drop_sessions(url)
        if lose:
            relay.lose(lose, self.faults.rng)
        if secs is not None:
            self.at(until, self.relay_up, url)

    def relay_up(self, url: str, force: bool = False) -> None:
        relay = self.relays[url]
        if relay.up or (self.clock.now < relay.down_until and not force):
            return  # (a shorter restart's timer, inside a longer outage)
        self.note("relay_up", url)
        self.checker.relay_came_up(url)
        relay.up = True

    def drop_sessions(self, url: str) -> None:
        for number, conn in list(self.conns.items()):
            if conn.relay == url:
                self.conns.pop(number)
                self.checker.session_changed(url, -1, conn)
                self.relays[url].close_session(number)
                self.at(self.clock.now + 0.001, conn._finish, "connection closed", gen=conn.gen)

    # -- the run --------------------------------------------------------------------------

    def run(self) -> SimResult:
        with patched(self), _collector_tuned():
            self.seed_world()
            gc.freeze()  # (the world made so far, and every module, lives to the end: not scanned again)
            self.start_gsync()
            end = START + self.options.days * DAY
            self.faults.schedule(end)
            self.checker.schedule(end)
            # What is scheduled by now (the faults and the checker's rounds of the whole run,
            # drawn up front) is taken in order from a sorted list, beside the heap of what the
            # run schedules as it goes: the same order ((time, sequence) is unique), and a heap
            # of tens, not of tens of thousands, at every push and pop of a long run.
            heap, pop, clock = self.heap, heapq.heappop, self.clock
            planned = sorted(heap)
            heap.clear()
            planned.append((float("inf"), -1, None, None, ()))  # (the end of the list)
            i = 0
            while True:
                if heap and heap[0] < planned[i]:
                    if heap[0][0] > end:
                        break
                    when, _, gen, fn, args = pop(heap)
                else:
                    if planned[i][0] > end:
                        break
                    when, _, gen, fn, args = planned[i]
                    i += 1
                if gen is not None and gen != self.gen:
                    continue
                if when > clock.now:
                    clock.now = when
                fn(*args)
                m = self.manager
                if m is not None and m.queue.qsize():
                    self.drain()
            self.clock.now = end
            self.checker.finish()
            if self.manager is not None:
                self.stop_gsync(graceful=True)
        if self._tmp is not None and not self.options.keep_state:
            self._tmp.cleanup()
        return SimResult(self.options, self.hashed().hexdigest(), self.checker.violations, self.messages,
                         self.frames_up, self.checker.summary())

    def seed_world(self) -> None:
        """What exists before gsync first starts: the history on the relays, and on the own
        relay the announcements pushed to it directly (about half) with their events."""
        for repo, event in self.world.history(int(START)):
            urls = [u for u in repo.relays if self.rng.random() < 0.8] or repo.relays[:1]
            for url in urls:
                self.relays[url].store.add(event)
            self.checker.published(event, urls)
            if self.rng.random() < 0.3:
                self.own.submit(event, self.clock.now)
        self.schedule_activity(START + self.rng.expovariate(self.activity_rate()))

    def publish_import(self, repo) -> None:
        """An import sent to the repository's relays at once (a fifth of it to the own
        relay too, each event drawn: seconds the own relay holds part of)."""
        rng = self.world.imports_rng
        for event in self.world.imported(repo, int(self.clock.now) - 30):  # (its last seconds: now)
            self.publish(event, repo.relays, own=rng.random() < 0.2)

    def activity_rate(self) -> float:
        per_day = self.options.publish_per_day
        if per_day is None:
            per_day = max(2.0, self.options.repos / 3)
        return per_day / DAY

    def schedule_activity(self, when: float) -> None:
        self.at(when, self.activity)

    def activity(self) -> None:
        created_at = int(self.clock.now) - self.rng.choice((0, 0, 0, 5, 60))
        if self.ahead_rng.random() < self.options.ahead:  # a client whose clock runs ahead
            created_at = int(self.clock.now) + self.ahead_rng.randint(1200, 3 * 3600)
        made = self.world.activity(created_at)
        if made is not None:
            repo, event = made
            urls = [u for u in repo.relays if self.rng.random() < 0.7] or [self.rng.choice(repo.relays)]
            own = self.rng.random() < 0.2
            self.publish(event, urls, own=own)
            if event.kind in (KIND_ISSUE, KIND_PATCH):
                for patch in self.world.series(repo, event):
                    self.publish(patch, urls, own=own)
        if self.world.repos and self.world.imports_now():
            self.publish_import(self.world.import_target())
        if self.options.member_replies and self.replies_rng.random() < self.options.member_replies:
            reply = self.world.member_reply(self.replies_rng, int(self.clock.now))
            if reply is not None:
                repo, event = reply
                rng = self.replies_rng
                self.publish(event, [u for u in repo.relays if rng.random() < 0.5] or [rng.choice(repo.relays)],
                             own=False)
        self.schedule_activity(self.clock.now + self.rng.expovariate(self.activity_rate()))


@dataclass
class SimResult:
    options: SimOptions
    trace_hash: str
    violations: dict = field(default_factory=dict)  # invariant -> [(when, text)]
    messages: int = 0
    frames_up: int = 0
    summary: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay_command(self) -> str:
        o, default = self.options, SimOptions()
        extra = "" if o.faults else " --no-faults"
        if o.fault_scale != default.fault_scale:
            extra += f" --fault-scale {o.fault_scale:g}"
        for name, flag in WORLD_SHARES:
            if getattr(o, name) != getattr(default, name):
                extra += f" {flag} {getattr(o, name):g}"
        if o.liveness_after is not None:
            extra += f" --liveness-after {o.liveness_after:g}"
        if o.idle_tick_secs != default.idle_tick_secs:
            extra += f" --idle-tick {o.idle_tick_secs:g}"
        if o.tick_secs != default.tick_secs:
            extra += f" --tick {o.tick_secs:g}"
        return (f"PYTHONHASHSEED=0 bench/simulate --seed {o.seed} --days {o.days:g} --relays {o.relays} "
                f"--repos {o.repos}{extra} -v")


_TRACED: dict[type, tuple | bool] = {}  # message type -> _traced(it)


def _traced(kind: type) -> tuple[bool, bool] | bool:
    """Whether a message type has a ``relay`` and a ``session`` field, where that is what
    ``getattr(msg, name, "")`` finds on every message of it (a slotted dataclass, instances
    without a ``__dict__``, no such name but a field's): False where it is not, read by
    ``getattr`` then. (Reading a name a slotted message lacks raises inside ``getattr``.)"""
    if not dataclasses.is_dataclass(kind) or kind.__dictoffset__:
        return False
    names = {f.name for f in dataclasses.fields(kind)}
    if any(name not in names and hasattr(kind, name) for name in ("relay", "session")):
        return False
    return "relay" in names, "session" in names


_VERB_AND_SUB = re.compile(r'\["([A-Z-]+)", ?"([^"\\]*)"[,\]]')


def _verb_and_sub(text: str) -> tuple[str, str]:
    """A client frame's verb and subscription id (or ""): read off its start when both are
    plain strings (every frame gsync writes), decoded otherwise."""
    plain = _VERB_AND_SUB.match(text)
    if plain is not None:
        return plain.group(1), plain.group(2)
    try:
        msg = json.loads(text)
        return str(msg[0]), str(msg[1]) if len(msg) > 1 and isinstance(msg[1], str) else ""
    except (ValueError, IndexError, TypeError):
        return "?", ""


class _Random:
    """``random`` as lifecycle reads it (``random.uniform``), drawn from the seed."""

    def __init__(self, rng: random.Random):
        self.uniform = rng.uniform


@contextlib.contextmanager
def patched(sim: Simulation):
    """gsync's module-level clocks, randomness and greenlet plumbing, pointed at the
    simulation for the run, then put back."""
    saved = (connection_module.time, negentropy_sync.time, negentropy_sync._holdings, negentropy_sync.Queue,
             lifecycle_module.random, status_module.move)
    real_move = status_module.move

    def move(state, fact):
        before = state.status
        try:
            return real_move(state, fact)
        except status_module.IllegalMove as exc:
            sim.checker.violation("illegal_status_move", f"{state.url}: {before.name} on {fact.value}")
            raise exc

    for m in metrics.relay_labelled():
        m.clear()
    logs = structlog.get_config()
    if not sim.options.verbose_logs:
        configure_logging("error", stream=_Null())
    else:  # each line with the simulated day it was logged on
        def sim_day(_logger, _name, event_dict):
            event_dict["day"] = f"{(sim.time.time() - START) / DAY:.4f}"
            return event_dict

        structlog.configure(processors=[sim_day, *logs["processors"]])
    connection_module.time = sim.time
    negentropy_sync.time = sim.time
    negentropy_sync._holdings = negentropy_sync.SharedHoldings(sim.own_holdings, clock=sim.time.monotonic)
    negentropy_sync.Queue = SimInbox
    lifecycle_module.random = _Random(random.Random(sim.rng.random()))
    status_module.move = move
    try:
        yield
    finally:
        (connection_module.time, negentropy_sync.time, negentropy_sync._holdings, negentropy_sync.Queue,
         lifecycle_module.random, status_module.move) = saved
        structlog.configure(**logs)


@contextlib.contextmanager
def _collector_tuned():
    """The cyclic collector run a seventh as often (a run makes millions of short-lived
    objects, few of them in cycles: at the default threshold its collections were 6 % of a
    run's CPU, with what ``gc.freeze`` sets aside and this 3 %), then put back; and what the
    run froze collected once it is over (left to the oldest generation, whose collections
    wait on its growth, the runs of a multi-seed ``bench/simulate`` held about 30 MB each:
    3.9 GB after 130 seeds of the default world)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(5000, thresholds[1], thresholds[2])
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        gc.collect()


class _Null:
    def write(self, text) -> None:
        pass

    def flush(self) -> None:
        pass
