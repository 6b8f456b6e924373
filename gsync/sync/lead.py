"""Which relay goes first on a repository that several relays list, on a first sync.

The own relay holds nothing of a new repository's filters, so each relay listing it would
fetch all of it by REQ pages: every event once per relay. NIP-77 on each fetches every
event once (``FetchClaims``), but costs a paced start per filter on every relay: a small
world shared by two relays took 11 s instead of 3. So, per repository (and per root), the
first relay to start a batch on it leads, by the usual choice (REQ pages for what the own
relay lacks entirely). Another relay's AddFilters is split (``split``): the repositories
and roots no batch leads go in a batch that leads them; those some batch leads go in a
batch that waits for those leaders, then reads the own relay's holdings, which now hold
what the leaders brought, and chooses per filter: NIP-77 where the leaders brought much
(only what is still missing moves), REQ pages where they brought little (a few copies cost
less than a paced start).

A batch leads until it completes, unless its holdings read chose NIP-77 for a filter: the
own relay held some of it, a re-sync rather than a first one, so its followers go at once,
their exchanges run beside its own and the claims share the fetches out. A follower does
not wait for the whole of a leader, which may go on for minutes taking in later
AddFilters: only until none of the leader's open pages asks for what it follows
(``progress``). A waiting batch never leads, and waits at most as long as the wait is worth
(``sync.method.follower_wait``: its own bound, given to ``wait``), and never more than
``overdue``'s ``max_secs`` (a slow or stalled leader).

Pure: batches are keys ``(relay url, batch id)``, repositories and roots are strings
(addresses and event ids); the manager reports what each batch leads, records waits,
reports batches that stopped leading, and asks which waits are over.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .targets import SyncItems

BatchKey = tuple[str, int]


class SharedLead:
    def __init__(self):
        self._led_by: dict[str, set[BatchKey]] = {}  # repo address or root id → leading batches
        self._leads: dict[BatchKey, set[str]] = {}  # leading batch → what it leads
        self._waits: dict[BatchKey, tuple[float, set[BatchKey]]] = {}  # follower → (since, leaders)
        self._bounds: dict[BatchKey, float] = {}  # follower → the longest its wait is worth
        self._followers: dict[BatchKey, set[BatchKey]] = {}  # leader → followers
        self._wanted: dict[BatchKey, set[str]] = {}  # follower → what it follows

    def __len__(self) -> int:
        """Batches waiting."""
        return len(self._waits)

    # -- leaders

    def lead(self, leader: BatchKey, items: SyncItems) -> None:
        """``leader`` fetches ``items`` (added to what it already leads)."""
        keys = [*items.repos, *items.root_events]
        if not keys:
            return
        self._leads.setdefault(leader, set()).update(keys)
        for key in keys:
            self._led_by.setdefault(key, set()).add(leader)

    def split(self, relay: str, items: SyncItems,
              follow: Callable[[BatchKey], bool] | None = None) -> tuple[SyncItems, SyncItems, set[BatchKey]]:
        """``items`` of ``relay``'s AddFilters: (what no batch of another relay leads, what
        some do, those leaders). With ``follow``, only the leaders it accepts count: what
        only others lead goes with the first part (too late to wait for)."""
        mine, theirs, leaders = SyncItems(), SyncItems(), set()
        for address, level in items.repos.items():
            others = {k for k in self._led_by.get(address, ()) if k[0] != relay and (follow is None or follow(k))}
            (theirs if others else mine).repos[address] = level
            leaders |= others
        for root in items.root_events:
            others = {k for k in self._led_by.get(root, ()) if k[0] != relay and (follow is None or follow(k))}
            (theirs if others else mine).root_events.add(root)
            leaders |= others
        return mine, theirs, leaders

    def done(self, leader: BatchKey) -> list[BatchKey]:
        """``leader`` no longer leads (complete, dropped, or NIP-77 chosen): the followers
        that waited for it alone, in the order they began waiting."""
        for key in self._leads.pop(leader, ()):
            batches = self._led_by.get(key)
            if batches is not None:
                batches.discard(leader)
                if not batches:
                    del self._led_by[key]
        return self._released(leader, self._followers.pop(leader, ()))

    def has_followers(self, leader: BatchKey) -> bool:
        return bool(self._followers.get(leader))

    def progress(self, leader: BatchKey, still_open: Callable[[str], bool]) -> list[BatchKey]:
        """``leader`` finished a page. Its followers none of whose items it still asks for
        (``still_open``: a repository address or root id is in one of its open pages) wait
        for it no longer: those left waiting for nobody, in the order they began."""
        followers = self._followers.get(leader, set())
        done = [f for f in followers
                if f in self._wanted and not any(still_open(key) for key in self._wanted[f])]
        followers.difference_update(done)
        if not followers:
            self._followers.pop(leader, None)
        return self._released(leader, done)

    def _released(self, leader: BatchKey, followers: Iterable[BatchKey]) -> list[BatchKey]:
        """``followers`` wait for ``leader`` no longer: those left waiting for nobody, in the
        order they began waiting."""
        ready = []
        for follower in followers:
            wait = self._waits.get(follower)
            if wait is None:
                continue
            wait[1].discard(leader)
            if not wait[1]:
                ready.append(follower)
                del self._waits[follower]
                self._wanted.pop(follower, None)
                self._bounds.pop(follower, None)
        return sorted(ready, key=lambda k: (k[1], k[0]))

    def succeed(self, old: BatchKey, new: BatchKey) -> None:
        """``old`` joined ``new`` (a coalesced AddFilters): what it led, ``new`` leads, and
        its followers wait for ``new``."""
        for key in self._leads.pop(old, ()):
            batches = self._led_by[key]
            batches.discard(old)
            batches.add(new)
            self._leads.setdefault(new, set()).add(key)
        for follower in self._followers.pop(old, set()):
            wait = self._waits.get(follower)
            if wait is not None:
                wait[1].discard(old)
                wait[1].add(new)
                self._followers.setdefault(new, set()).add(follower)

    # -- followers

    def wait(self, follower: BatchKey, leaders: Iterable[BatchKey], now: float,
             items: SyncItems | None = None, max_secs: float | None = None) -> None:
        """``follower`` waits until every one of ``leaders`` stopped leading, or has
        nothing of ``items`` open any more (``progress``), or ``max_secs`` passed."""
        leaders = set(leaders) - {follower}
        if not leaders:
            return
        self._waits[follower] = (now, leaders)
        if max_secs is not None:
            self._bounds[follower] = max_secs
        if items is not None:
            self._wanted[follower] = {*items.repos, *items.root_events}
        for leader in leaders:
            self._followers.setdefault(leader, set()).add(follower)

    def waiting_since(self, follower: BatchKey) -> float | None:
        """When ``follower`` began to wait (None: it does not wait)."""
        wait = self._waits.get(follower)
        return wait[0] if wait is not None else None

    def forget(self, follower: BatchKey) -> None:
        """``follower``'s batch was dropped (its relay went away)."""
        wait = self._waits.pop(follower, None)
        self._wanted.pop(follower, None)
        self._bounds.pop(follower, None)
        if wait is None:
            return
        for leader in wait[1]:
            followers = self._followers.get(leader)
            if followers is not None:
                followers.discard(follower)
                if not followers:
                    del self._followers[leader]

    def overdue(self, now: float, max_secs: float,
                keep: Callable[[BatchKey, float], bool] | None = None) -> list[BatchKey]:
        """Followers that have waited ``max_secs``, or their own bound (``wait``): they go
        without their leaders (unless ``keep(follower, waited)``)."""
        late = [k for k, (since, _) in self._waits.items()
                if now - since >= min(max_secs, self._bounds.get(k, max_secs))
                and not (keep is not None and keep(k, now - since))]
        for follower in late:
            self.forget(follower)
        return late
