"""What a relay connection has open, closing and ended: the bookkeeping of its
subscriptions, apart from its socket. Pure.

The manager's session (``RelaySession.book``) and the connection's reader share one
``SubscriptionBook``: the manager opens and closes subscriptions in it and gets the frames
to send (which ``Effects`` sends); the reader matches events against it.
"""
from __future__ import annotations

from . import messages as wire
from .filters import FilterSet
from .precise import PRECISE_KINDS, made_precise

# Filters of subscriptions that ended, kept so that their late events are still read
# (``EndedFilters``): at most this many per connection, and at most this much REQ text (a
# filter of 489 root ids is about 33 KB sent and several times that held), so that a session
# of days keeps what its last few minutes of subscriptions need, not every REQ it ever sent.
CLOSING_CAPACITY = 1_000
ENDED_FILTER_BYTES = 256 * 1024


class EndedFilters:
    """Filters of ended subscriptions by sub id, oldest dropped first past ``CLOSING_CAPACITY``
    entries or ``ENDED_FILTER_BYTES`` of their REQ text. A late event on one dropped is
    dropped as on an unknown subscription.

    A connection keeps two: subscriptions it sent CLOSE for whose CLOSED has not come
    (events the relay sent before reading the CLOSE, or waiting in our socket, are still
    checked against their filters and kept, not dropped as "unknown subscription"), and
    subscriptions that ended (the relay's CLOSED, to our CLOSE or on its own: some relays
    still send events, or a second EOSE or CLOSED, after it; events matching the ended
    filters are kept, what we asked for, harmlessly late, and the rest of the traffic is
    dropped and counted without a misbehaviour point)."""

    def __init__(self):
        self._filters: dict[str, tuple[FilterSet, int]] = {}
        self.bytes = 0

    def __contains__(self, sub_id: str) -> bool:
        return sub_id in self._filters

    def __len__(self) -> int:
        return len(self._filters)

    def get(self, sub_id: str) -> FilterSet | None:
        entry = self._filters.get(sub_id)
        return entry[0] if entry else None

    def add(self, sub_id: str, filters: FilterSet | None, size: int) -> None:
        if filters is None:
            return
        self.pop(sub_id)
        self._filters[sub_id] = (filters, size)
        self.bytes += size
        while len(self._filters) > 1 and (len(self._filters) > CLOSING_CAPACITY
                                          or self.bytes > ENDED_FILTER_BYTES):
            self.pop(next(iter(self._filters)))

    def pop(self, sub_id: str) -> tuple[FilterSet | None, int]:
        filters, size = self._filters.pop(sub_id, (None, 0))
        self.bytes -= size
        return filters, size


MAX_CLOSED_BY_RELAY = 1024


class SubscriptionBook:
    """``subscriptions`` maps sub id -> filters, for the filter-match check; what they
    weigh; the REQs not answered yet (when each went: ``clock``, the connection's); those
    closing and those ended."""

    def __init__(self, clock):
        self.clock = clock
        self.subscriptions: dict[str, FilterSet] = {}
        self.filter_bytes: dict[str, int] = {}  # REQ size per open subscription
        # REQs the relay has not answered yet (no EVENT, EOSE or CLOSED), oldest sent first,
        # with when: what a NOTICE that names no subscription can be refusing.
        self.unanswered: dict[str, float] = {}
        # how many others were open when each open subscription's REQ went: a relay refusing
        # it for their number held that many then (``Refusals.learn_max_subscriptions``)
        self.open_beside: dict[str, int] = {}
        self.open_filter_bytes = 0
        self.peak_subscriptions = 0  # the most REQs open at once: checked against the budget
        self.closing = EndedFilters()  # CLOSE sent, the relay's CLOSED not yet seen
        self.ended = EndedFilters()  # ended: late events matching them are kept
        # open ones the relay ended with CLOSED, read before the manager took that in (a relay
        # closing every REQ after its EOSE: the manager, done with its EOSE, would CLOSE it)
        self.closed_by_relay: dict[str, None] = {}
        # A relay answering only precise queries (``protocol.precise``): every filter it is
        # sent is made precise, with these authors for a ``kinds`` filter (none: as it is) and
        # these kinds for a tag filter. None: as they are.
        self.precise_authors: frozenset[str] | None = None
        self.precise_kinds: frozenset[int] = PRECISE_KINDS
        self.precise_ids = False  # ... and an ``ids`` filter those kinds (``made_precise``)
        self.probe_sub: str | None = None  # the precise probe's REQ, while it runs (``probe_frame``)
        self.probe_sent_at: float | None = None  # ... when it went

    def req_frame(self, sub_id: str, filters) -> str:
        """``sub_id`` is open from now (its events are matched, its bytes counted): its REQ,
        for the caller to send."""
        filters = tuple(map(self.precise, filters))
        self.forget(sub_id)  # (and no longer closed by the relay: open again)
        self.open_beside[sub_id] = len(self.subscriptions)
        self.subscriptions[sub_id] = FilterSet(filters)
        self.peak_subscriptions = max(self.peak_subscriptions, len(self.subscriptions))
        text = wire.req(sub_id, filters)
        for f in filters:  # kept for matching; their JSON now lives in ``text`` only
            f.drop_json()
        self.filter_bytes[sub_id] = len(text)
        self.open_filter_bytes += len(text)
        self.unanswered[sub_id] = self.clock()
        return text

    def precise(self, f):
        """``f`` as this relay is asked it (``precise_authors``)."""
        if self.precise_authors is None:
            return f
        return made_precise(f, self.precise_authors, self.precise_kinds, self.precise_ids)

    def probe_frame(self, sub_id: str, filters) -> str:
        """The precise probe's REQ (``protocol.precise``), for the caller to send: not a
        subscription of the manager's; the reader takes its answer until ``probe_ended``."""
        self.probe_sub, self.probe_sent_at = sub_id, self.clock()
        return wire.req(sub_id, filters)

    def probe_ended(self) -> str | None:
        """The probe answered: its CLOSE, for the caller to send (None: none runs). Its late
        frames are read as any unknown subscription's."""
        sub_id, self.probe_sub = self.probe_sub, None
        return None if sub_id is None else wire.close(sub_id)

    def close_frame(self, sub_id: str) -> str | None:
        """``sub_id`` is closing from now: its CLOSE, for the caller to send (None: it is not
        open, or the relay closed it already)."""
        if sub_id in self.closed_by_relay:
            self.forget(sub_id)
            return None
        filters, size = self._drop_sub(sub_id)
        if filters is None:
            return None
        self.closing.add(sub_id, filters, size)
        return wire.close(sub_id)

    def forget(self, sub_id: str) -> None:
        """The relay closed it: no CLOSE to send; its late events are still read
        (``ended``)."""
        self.closed_by_relay.pop(sub_id, None)
        self.ended.add(sub_id, *self._drop_sub(sub_id))

    def held_by_relay(self) -> int:
        """The REQs the relay holds open of ours, as far as we know: those open, less those
        it closed (its CLOSED read, not taken in yet)."""
        return len(self.subscriptions) - len(self.closed_by_relay)

    def relay_closed(self, sub_id: str) -> None:
        """The relay's CLOSED for open ``sub_id`` was read (the manager is told): no CLOSE
        is sent for it (``close_frame``). At most MAX_CLOSED_BY_RELAY kept, the oldest
        dropped (each leaves at its ``forget`` or ``close_frame``)."""
        if sub_id in self.subscriptions:
            self.closed_by_relay[sub_id] = None
            while len(self.closed_by_relay) > MAX_CLOSED_BY_RELAY:
                del self.closed_by_relay[next(iter(self.closed_by_relay))]

    def _drop_sub(self, sub_id: str) -> tuple[FilterSet | None, int]:
        size = self.filter_bytes.pop(sub_id, 0)
        self.open_filter_bytes -= size
        self.unanswered.pop(sub_id, None)
        self.open_beside.pop(sub_id, None)
        return self.subscriptions.pop(sub_id, None), size
