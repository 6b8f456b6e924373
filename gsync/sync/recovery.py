"""Missing-event recovery: ids a relay advertised but did not deliver, fetched again later
(SPEC §4; seed 001 "Missing-Event Recovery for Incomplete Batches").

Pure: the manager asks ``next_attempt`` on its maintenance tick, sends the ``{ids:[…]}``
REQ itself, and reports what arrived. Per relay: one attempt in flight, at most 300 ids per
fetch, 30 s backoff doubling to 15 min. Progress resets the backoff; 12 attempts in a row
that recover nothing drop the relay's ids (the daily sync will find the gap again). Ids
that arrive by other means are cleared without using an attempt. An unreachable relay
defers its attempts instead of spending them, so it neither expires its work nor spins.

A historic REQ that never finished (no EOSE) leaves no ids to ask for: its filter is kept
instead (``add_missing_filters``) and asked again with the same schedule; it is recovered
when a REQ for it finishes. An id given with the filter that found it (``found_by``) is asked
by id once; if that attempt does not bring it, by that filter, once (some relays advertise
ids through NIP-77 and serve none of them by id). An id that filter does not bring either is
*unservable there* (``sync.unservable``): it leaves that relay's recovery, returned to the
manager (``Attempt.unservable``); a whole filter is never asked again for an id it failed to
bring. An id unservable on one relay is asked of the others listing its repository by id
once (``once``): one that does not serve it either is unservable there too (one ask per
relay a day, not the backoff's dozen: seeds 3 and 4's year asked a relay hiding it 4 times
in an hour); an id held without a filter, answered without it by id ``UNSERVED_ID_ASKS``
times, is unservable there too.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ..constants import (
    MAX_IDS_PER_REQ,
    RECOVERY_BASE_SECS,
    RECOVERY_MAX_SECS,
    RECOVERY_MAX_ZERO_PROGRESS,
)
from ..protocol.filters import Filter

# An id recovery holds without the filter that found it (a stalled REQ's, say), answered
# without it by id this many times: unservable there, not asked again with the backoff
# (seeds 5 and 9's year: a relay hiding 6 ids a stalled REQ had asked asked for them again
# every 2 minutes, its attempts making progress on other work).
UNSERVED_ID_ASKS = 2


@dataclass
class _RelayRecovery:
    pending: dict[str, None] = field(default_factory=dict)  # ordered set: oldest asked first
    found_by: dict[str, Filter] = field(default_factory=dict)  # pending id -> its filter here
    by_filter: set[str] = field(default_factory=set)  # pending ids asked by found_by now
    once: set[str] = field(default_factory=set)  # pending ids asked by id once (no filter)
    unserved: dict[str, int] = field(default_factory=dict)  # id (no filter) -> answered asks without it
    filters: dict[Filter, None] = field(default_factory=dict)  # REQs that never finished
    next_attempt_at: float = 0.0
    zero_progress_attempts: int = 0
    in_flight: tuple[str, ...] | None = None
    filters_in_flight: tuple[Filter, ...] = ()
    by_filter_in_flight: tuple[str, ...] = ()  # the ids the attempt in flight asks by filter

    def __bool__(self) -> bool:
        return bool(self.pending or self.filters)


class Attempt(NamedTuple):
    """What an attempt's end settled: ids given up for good (``dropped``), and ids its
    filters finished without (``unservable``: id -> the filter that failed to bring it, None
    for an id asked by id ``once``)."""

    dropped: set[str]
    unservable: dict[str, Filter | None]


class MissingEventRecovery:
    def __init__(
        self,
        base_delay: float = RECOVERY_BASE_SECS,
        max_delay: float = RECOVERY_MAX_SECS,
        max_zero_progress: int = RECOVERY_MAX_ZERO_PROGRESS,
        ids_per_fetch: int = MAX_IDS_PER_REQ,
    ):
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_zero_progress = max_zero_progress
        self.ids_per_fetch = ids_per_fetch
        self._relays: dict[str, _RelayRecovery] = {}
        self._gave_up: set[str] = set()  # relays whose ids were dropped since forget()
        # id → relays it is pending on: every delivered event asks ``clear_arrived``, which
        # must not cost a walk over every relay in recovery
        self._owners: dict[str, set[str]] = {}

    def add_missing(self, relay: str, ids: Iterable[str], now: float,
                    found_by: dict[str, Filter | None] | None = None, by_id_first: bool = True,
                    once: bool = False) -> None:
        """Register ids a failed batch did not get; merged with any already pending.
        ``found_by``: id -> the filter that found it on this relay, asked if the id is not
        served by id (at once unless ``by_id_first``: a relay known not to serve ids).
        ``once``: ids unservable on another relay, asked here by id once; not served, they
        are unservable here too (``Attempt.unservable``, with no filter)."""
        ids = list(ids)
        if ids:
            r = self._relay(relay, now)
            r.pending.update(dict.fromkeys(ids))
            for event_id in ids:
                self._owners.setdefault(event_id, set()).add(relay)
                flt = (found_by or {}).get(event_id)
                if flt is not None:
                    r.found_by[event_id] = flt
                    r.once.discard(event_id)
                    if not by_id_first:
                        r.by_filter.add(event_id)
                elif once and event_id not in r.found_by:
                    r.once.add(event_id)

    def add_missing_filters(self, relay: str, filters: Iterable[Filter], now: float) -> None:
        """Register filters whose REQ never finished (the relay sent no EOSE)."""
        filters = list(filters)
        if filters:
            self._relay(relay, now).filters.update(dict.fromkeys(filters))

    def _relay(self, relay: str, now: float) -> _RelayRecovery:
        r = self._relays.get(relay)
        if r is None:
            r = self._relays[relay] = _RelayRecovery(next_attempt_at=now + self.base_delay)
        return r

    def next_attempt(self, relay: str, now: float, connected: bool = True) -> list[str] | None:
        """Ids to fetch now, marking the attempt in flight; None if nothing is due. The
        attempt also carries every pending filter (``attempt_filters``); the id list is
        empty when only filters are pending.

        A disconnected relay gets None and keeps its schedule: the attempt is deferred.
        """
        r = self._relays.get(relay)
        if r is None or r.in_flight is not None or not connected or now < r.next_attempt_at:
            return None
        ids = [i for i in r.pending if i not in r.by_filter][: self.ids_per_fetch]
        r.in_flight = tuple(ids)
        r.by_filter_in_flight = tuple(r.by_filter)
        by_filter = dict.fromkeys(r.found_by[i] for i in r.by_filter)
        r.filters_in_flight = tuple(r.filters) + tuple(f for f in by_filter if f not in r.filters)
        return ids

    def attempt_filters(self, relay: str) -> list[Filter]:
        """The filters of the attempt in flight."""
        r = self._relays.get(relay)
        return list(r.filters_in_flight) if r is not None else []

    def awaited(self, relay: str) -> set[str]:
        """The ids the attempt in flight may bring: those asked by id and by filter."""
        r = self._relays.get(relay)
        return set(r.in_flight or ()) | r.by_filter if r is not None else set()

    def due_relays(self, now: float) -> list[str]:
        """Relays with an attempt due (the caller still checks they are connected)."""
        return sorted(
            relay
            for relay, r in self._relays.items()
            if r.in_flight is None and now >= r.next_attempt_at
        )

    def record_result(self, relay: str, delivered_ids: Iterable[str], now: float,
                      filters_done: bool = False) -> Attempt:
        """The in-flight fetch ended (EOSE). ``filters_done``: its filters' REQs finished
        this time (else what they did not bring is not judged)."""
        r = self._relays.get(relay)
        if r is None:
            return Attempt(set(), {})
        asked, r.in_flight = r.in_flight or (), None
        asked_by_filter, r.by_filter_in_flight = r.by_filter_in_flight, ()
        recovered = [i for i in delivered_ids if i in r.pending]
        for event_id in recovered:
            self._settle(r, event_id, relay)
        unservable = {}
        if filters_done:  # asked by the filter that found them, and not brought by it either
            for event_id in asked_by_filter:
                if event_id in r.pending:
                    unservable[event_id] = r.found_by[event_id]
                    self._settle(r, event_id, relay)
            for event_id in asked:  # asked by id, answered without it, and no filter to ask
                if event_id not in r.pending or event_id in r.found_by:
                    continue
                r.unserved[event_id] = times = r.unserved.get(event_id, 0) + 1
                if event_id in r.once or times >= UNSERVED_ID_ASKS:
                    unservable[event_id] = None
                    self._settle(r, event_id, relay)
        # REQs that never finished, finished now (a filter asked for ids is done only when
        # its ids arrive)
        finished = [f for f in r.filters_in_flight if f in r.filters] if filters_done else []
        for f in finished:
            r.filters.pop(f, None)
        r.filters_in_flight = ()
        # asked by id and not served: by the filter that found them from now on
        r.by_filter.update(i for i in asked if i in r.pending and i in r.found_by)
        if not r:
            del self._relays[relay]
            return Attempt(set(), unservable)
        if recovered or finished:
            r.zero_progress_attempts = 0
            r.next_attempt_at = now + self.base_delay
            return Attempt(set(), unservable)
        r.zero_progress_attempts += 1
        if r.zero_progress_attempts >= self.max_zero_progress:
            self._drop(relay)
            self._gave_up.add(relay)
            return Attempt(set(r.pending), unservable)
        delay = self.base_delay * 2 ** (r.zero_progress_attempts - 1)
        r.next_attempt_at = now + min(delay, self.max_delay)
        return Attempt(set(), unservable)

    def _settle(self, r: _RelayRecovery, event_id: str, relay: str) -> None:
        r.pending.pop(event_id, None)
        r.found_by.pop(event_id, None)
        r.by_filter.discard(event_id)
        r.once.discard(event_id)
        r.unserved.pop(event_id, None)
        self._disown(event_id, relay)

    def cancel_attempt(self, relay: str) -> None:
        """The relay disconnected mid-attempt: deferred, not counted, schedule unchanged."""
        r = self._relays.get(relay)
        if r is not None:
            r.in_flight = None
            r.filters_in_flight = ()
            r.by_filter_in_flight = ()

    def clear_arrived(self, ids: Iterable[str]) -> set[str]:
        """Ids that arrived by other means (live sync, another relay). Returns the relays
        this fully recovered. The cost follows ``ids``, not the relays in recovery."""
        recovered_relays = set()
        for event_id in ids:
            for relay in self._owners.pop(event_id, ()):
                r = self._relays[relay]
                r.pending.pop(event_id, None)
                r.found_by.pop(event_id, None)
                r.by_filter.discard(event_id)
                r.once.discard(event_id)
                r.unserved.pop(event_id, None)
                if not r:
                    del self._relays[relay]
                    recovered_relays.add(relay)
        return recovered_relays

    def is_missing(self, event_id: str) -> bool:
        """Is ``event_id`` waiting for recovery on any relay? (Asked for every delivered
        event: a lookup, so the common case allocates nothing.)"""
        return event_id in self._owners

    def _disown(self, event_id: str, relay: str) -> None:
        owners = self._owners.get(event_id)
        if owners is not None:
            owners.discard(relay)
            if not owners:
                del self._owners[event_id]

    def _drop(self, relay: str) -> None:
        r = self._relays.pop(relay, None)
        if r is not None:
            for event_id in r.pending:
                self._disown(event_id, relay)

    def pending_filters(self, relay: str) -> set[Filter]:
        """The relay's filters whose REQ never finished."""
        r = self._relays.get(relay)
        return set(r.filters) if r else set()

    def is_fully_recovered(self, relay: str) -> bool:
        """Nothing pending and nothing given up on since the last ``forget``: the relay may
        go back to Connected (if no unrelated batch failed — the caller knows that)."""
        return relay not in self._relays and relay not in self._gave_up

    def forget(self, relay: str) -> None:
        """Fresh start or daily sync: historic sync will re-detect whatever is still missing."""
        self._drop(relay)
        self._gave_up.discard(relay)
