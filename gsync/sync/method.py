"""How a historic batch is fetched: NIP-77, REQ pages, an id fetch, or waiting for another
relay's lead. The one place these choices are made; the manager gathers the facts and calls it.

Every choice is priced in one currency, bytes down, at an exchange rate measured, not guessed
(README, Design: "the method per batch"):

- **a start** (a REQ page, a NEG-OPEN, an id fetch) is worth ``START_BYTES``: a remote
  (LocalRelay on LMDB, ``bench/start_worth``) spends as much CPU on one start that finds
  nothing as on serving that many bytes of events. Under the pacing gate each start is
  also one gate interval of wait on that relay; on a first sync (nothing of the batch held
  before this round) that is the operator's wait, worth ``WAIT_BYTES_PER_SEC`` (what a
  first sync by REQ pages takes in a second under the gate) (``start_bytes``), or, when
  many relays sync side by side, that relay's share of what the own relay stores in a
  second (``wait_bytes_per_sec``);
- **bytes down**: an event brought again (held, in flight, or fetched by another relay)
  costs ``EVENT_BYTES``; NIP-77 costs ``NEG_ITEM_BYTES`` for each item the two sides compare;
- **own-relay reads**: the holdings a NIP-77 exchange needs are read before any choice
  (loopback, unpaced, one merged read per batch), so they do not tell the methods apart;
  a follower's wait costs one more read, ``OWN_READ_BYTES`` (the own relay's work for it).

What each method costs a batch's filters (missing events cost the same either way):

- REQ pages: ten filters share a start, a filter of R events needs R // 500 + 1 pages; every
  event comes again.
- NIP-77: one start per filter, then id fetches (300 ids a start) for what is missing (on a
  first sync, what the filter likely holds in all, ``expected_of``, less what is held: a
  new root's thread lacks most of it; on a re-sync, little: one fetch); only the missing
  events move, and ``NEG_ITEM_BYTES`` per item compared.
- After NIP-77, what is missing comes by id (a start per 300) or by the filter's pages
  (which bring again what is held): ``fetch_missing_by_filter``.
- A follower waits for another relay's lead only while the pages the lead saves it are
  worth more than the wait (``follower_wait``), and no longer than that (its deadline).

Pure: counts in, choices out; no clock (the gate interval is an argument).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

from ..constants import MAX_IDS_PER_REQ, START_BYTES, WAIT_BYTES_PER_SEC

# The mean EVENT frame of NIP-34 events (the demo's and bench/start_worth's comments: 665 B;
# bench/historic's data set: 149,443 B of EVENT frames for 200 events, 747 B).
EVENT_BYTES = 700
# NIP-77's bytes per item compared: bench/historic --mode neg-99, 175,459 B of NEG-MSG down
# for 20,000 items held on both sides (308,759 B before the client probed nearly settled
# buckets, protocol/negentropy.py).
NEG_ITEM_BYTES = 9
# One read of the own relay's holdings (a REQ on loopback, not paced): the own relay's CPU
# for it, in the same currency as a remote's start.
OWN_READ_BYTES = START_BYTES
PAGE_EVENTS = 500  # LocalRelay's and strfry's cap per filter and page
# How often a re-sync's exchanges find something to fetch: bench/historic --mode neg-99, two
# batches (layer 1; layers 2 and 3), one id fetch after them.
RESYNC_FETCH_ODDS = 0.5
FILTERS_PER_REQ = 10
IDS_PER_FETCH = MAX_IDS_PER_REQ  # ids an id fetch asks for at once
# What a first sync of an item brings, before anything of it was read: the demo's world has
# 24.5 events a repository (147 over 6), bench/scale's 20 (20,000 over 1,000), bench/historic's
# 100 (20,000 over 200, most of it threads); a root's thread, 3 to 5 in all three.
EVENTS_PER_REPO = 20
EVENTS_PER_ROOT = 3
# What the own relay stores in a second, whatever feeds it: bench/own_store, an LMDB
# LocalRelay alone, 263 events a second (bench/README).
OWN_STORE_BYTES_PER_SEC = 263 * EVENT_BYTES


@dataclass(frozen=True)
class FilterFacts:
    """What is known of one filter before any start is spent on it.

    ``held``: the ids of its events REQ pages would bring again, held by the own relay or in
    flight to it (filters of a batch overlap: a comment matches its root's ``#E`` and
    ``#e``; one REQ brings it once); ``elsewhere``: how many more another relay is fetching
    right now (the expected share of a lead still running). ``expected``: on a first sync,
    what it likely matches in all (``expected_of``). ``refused``: the rejected index may match it: a REQ would bring refused events back,
    NIP-77 counts them as held (SPEC §5: never fetched again)."""

    held: frozenset[str] = frozenset()
    elsewhere: int = 0
    refused: bool = False
    expected: int = 0  # what it likely matches in all, on a first sync (0: about what is held)

    @property
    def missing(self) -> int:
        return max(0, self.expected - self.again)

    @property
    def again(self) -> int:
        return len(self.held) + self.elsewhere


def wait_bytes_per_sec(side_by_side: int = 1) -> float:
    """What a second of one relay's gate is worth to an operator waiting for a first sync
    that ``side_by_side`` relays run at once. One relay alone takes in WAIT_BYTES_PER_SEC by
    REQ pages; many together are held to what the own relay stores
    (``OWN_STORE_BYTES_PER_SEC``: delivery's backlog holds their starts back past it), so a
    gate interval on one of them holds the operator back by its share of that at most.
    bench/scale, 50 relays: NIP-77 on and off took the same time (125 s) with 2.2 and 3.2
    events received per wanted: the own relay, not the gate, set the pace."""
    if WAIT_BYTES_PER_SEC <= 0:
        return 0.0
    return min(WAIT_BYTES_PER_SEC, OWN_STORE_BYTES_PER_SEC / max(1, side_by_side))


def start_bytes(gate_secs: float, first_sync: bool, side_by_side: int = 1) -> int:
    """What one start is worth: the remote's work, and on a first sync the gate interval an
    operator waits for it (``wait_bytes_per_sec``: ``side_by_side`` relays syncing)."""
    if first_sync:
        return START_BYTES + int(gate_secs * wait_bytes_per_sec(side_by_side))
    return START_BYTES


@dataclass(frozen=True)
class MethodChoice:
    """Per filter, NIP-77 (True) or REQ pages (False), with what the choice costs: starts
    at ``start`` bytes each, and bytes down."""

    negentropy: tuple[bool, ...]
    starts: int
    bytes_down: int
    start: int = START_BYTES
    likely_starts: float = 0.0  # starts that follow only if something is found (a re-sync's id fetch)

    @property
    def cost(self) -> float:
        return (self.starts + self.likely_starts) * self.start + self.bytes_down


def req_starts(again: Sequence[int]) -> int:
    """Starts REQ pages take for filters that bring at least ``again`` events each."""
    if not again:
        return 0
    return ceil(sum(n // PAGE_EVENTS + 1 for n in again) / FILTERS_PER_REQ)


def price(filters: Sequence[FilterFacts], negentropy: Sequence[bool], start: int = START_BYTES,
          first_sync: bool = True) -> MethodChoice:
    """What fetching ``filters`` so costs (``negentropy[i]``: filter i by NIP-77)."""
    by_req = [f for f, neg in zip(filters, negentropy, strict=True) if not neg]
    by_neg = [f for f, neg in zip(filters, negentropy, strict=True) if neg]
    starts = req_starts([max(f.again, f.expected) for f in by_req])
    likely = 0.0
    if by_neg:
        # one exchange each, then id fetches of what they find missing: what a first sync
        # lacks, at least one (a first sync's layer 1 finds the announcements of every
        # repository not ours); on a re-sync, what came since: a fetch follows only what is
        # found, RESYNC_FETCH_ODDS of the time (bench/historic --mode neg-99's descendants,
        # 28 events held of one filter, came again by a REQ priced against a whole fetch)
        fetches = ceil(sum(f.missing for f in by_neg) / IDS_PER_FETCH)
        starts += len(by_neg) + (max(1, fetches) if first_sync else fetches)
        if not first_sync and not fetches:
            likely = RESYNC_FETCH_ODDS
    again_by_req = len(frozenset().union(*(f.held for f in by_req))) + sum(f.elsewhere for f in by_req)
    bytes_down = again_by_req * EVENT_BYTES + sum(f.again for f in by_neg) * NEG_ITEM_BYTES
    return MethodChoice(tuple(negentropy), starts, bytes_down, start, likely)


def choose_methods(filters: Sequence[FilterFacts], negentropy_allowed: bool = True,
                   start: int = START_BYTES, first_sync: bool = True) -> MethodChoice:
    """The cheapest split of a batch's filters between NIP-77 and REQ pages.

    The filters a REQ would bring most of again go by NIP-77 first: the best split is one
    of those prefixes (each filter moved to NIP-77 costs about one start, and saves what
    its pages bring again). Filters the rejected index may match go by NIP-77 whatever
    the price. Without NIP-77 (not allowed here), REQ pages for all. ``start``: what a
    start is worth here (``start_bytes``); ``first_sync``: nothing of the batch was held
    before this round (``price``: a re-sync expects no id fetch)."""
    n = len(filters)
    if not negentropy_allowed or n == 0:
        return price(filters, [False] * n, start, first_sync)
    forced = [f.refused for f in filters]
    order = sorted((i for i in range(n) if not forced[i]), key=lambda i: -filters[i].again)
    best = None
    chosen = list(forced)
    for k in range(len(order) + 1):
        if k:
            chosen[order[k - 1]] = True
        if k and filters[order[k - 1]].again == 0:
            break  # nothing more to save: NIP-77 for it only adds starts
        candidate = price(filters, chosen, start, first_sync)
        if best is None or candidate.cost < best.cost:
            best = candidate
    return best


def fetch_missing_by_filter(need: int, again: int, start: int = START_BYTES) -> bool:
    """After NIP-77 over one filter: fetch its ``need`` missing events by the filter's own REQ
    pages rather than by id? The pages take (need + again) // 500 + 1 starts (shared with
    nine other filters) and bring ``again`` events again (held, in flight, fetched
    elsewhere); by id, a start per 300."""
    if need == 0:
        return False
    by_id = ceil(need / IDS_PER_FETCH) * start
    by_filter = req_starts([need + again]) * start + again * EVENT_BYTES
    return by_filter < by_id


def expected_of(flt) -> int:
    """What a filter likely matches on a first sync, from the repositories (``#a``/``#A``)
    and roots (``#e``/``#E``/``#q``) it asks for; 0 for any other (its holdings tell)."""
    repos = roots = 0
    for name, values in flt.tags:
        if name in ("a", "A"):
            repos = max(repos, len(values))
        elif name in ("e", "E", "q"):
            roots = max(roots, len(values))
    return expected_events(repos, roots)


def expected_events(repos: int, roots: int) -> int:
    """What a first sync of ``repos`` repositories and ``roots`` roots likely brings."""
    return repos * EVENTS_PER_REPO + roots * EVENTS_PER_ROOT


@dataclass(frozen=True)
class FollowerWait:
    """Wait for another relay's lead (``wait``), and for at most ``max_secs``."""

    wait: bool
    max_secs: float


def follower_wait(expected: int, leader_queued: int, gate_secs: float, cap_secs: float,
                  filters: int = 0, start: int = START_BYTES, own_queued: int | None = None,
                  side_by_side: int = 1) -> FollowerWait:
    """Should a batch of ``expected`` events that another relay leads wait for that lead?

    Waiting saves the pages that would bring again what the lead brings (``expected`` events
    by REQ, all of it a copy), less what checking the lead's work then costs: an exchange
    for each of the batch's ``filters`` at ``start`` each (the remote's work: the events the
    operator waits for come by the lead meanwhile, so the exchanges, queued behind the
    relay's own leads, add no wait of theirs) and one more own-relay read.

    The wait costs the operator only the lead's lateness: the lead's pages come after the
    starts queued on the leader's relay (``leader_queued``), the batch's own would have come
    after those queued on its own relay (``own_queued``), a gate interval each, worth
    ``wait_bytes_per_sec(side_by_side)`` a second. It waits at most as long as its own pages would have
    taken plus what the saving is worth (``cap_secs`` in all), so a slow or silent lead
    (another shard's) costs no more than it could save; and only when the lead comes within
    that. ``own_queued`` None: as long as the leader's (the lead is never late)."""
    saved = expected * EVENT_BYTES - filters * start - OWN_READ_BYTES
    free = WAIT_BYTES_PER_SEC <= 0  # (0: the test suite's tiny worlds)
    until_lead = (leader_queued + 1) * gate_secs
    until_own = until_lead if own_queued is None else (own_queued + 1) * gate_secs
    if free:
        return FollowerWait(saved > 0 and until_lead <= cap_secs, cap_secs)
    max_secs = min(cap_secs, until_own + max(0.0, saved / wait_bytes_per_sec(side_by_side)))
    return FollowerWait(saved > 0 and until_lead <= max_secs, max_secs)
