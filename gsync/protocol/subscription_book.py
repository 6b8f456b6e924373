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
MAX_CLOSED_UNANSWERED = 64


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
        # REQs closed before the relay answered them (sub id -> when sent, its place in the
        # order sent): a relay reads in order, so a NOTICE refusing one may come yet, until
        # it answers a REQ sent after it (``refusable_closed``); each kept until it is
        # answered, a NOTICE is taken for it, or NOTICE_REFUSAL_SECS (a NOTICE open for it
        # may be its refusal); MAX_CLOSED_UNANSWERED at most
        self.closed_unanswered: dict[str, tuple[float, int]] = {}
        self.req_order: dict[str, int] = {}  # each open subscription's place in the order sent
        self._sent = 0
        self.answered_order = 0  # the latest place in that order of a REQ the relay answered
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
        self._sent += 1
        self.req_order[sub_id] = self._sent
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
        sent_at = self.unanswered.get(sub_id)
        if sent_at is not None:
            self.closed_unanswered[sub_id] = (sent_at, self.req_order.get(sub_id, 0))
            while len(self.closed_unanswered) > MAX_CLOSED_UNANSWERED:
                del self.closed_unanswered[next(iter(self.closed_unanswered))]
        filters, size = self._drop_sub(sub_id)
        if filters is None:
            return None
        self.closing.add(sub_id, filters, size)
        return wire.close(sub_id)

    def answered(self, sub_id: str) -> None:
        """The relay's first answer (EVENT, EOSE, CLOSED, or a NOTICE taken for its refusal)
        to ``sub_id``, open or closed unanswered: it read that REQ, so it read every REQ sent
        before it, and a NOTICE refusing one of those closed unanswered would have come
        already."""
        closed = self.closed_unanswered.pop(sub_id, None)
        order = closed[1] if closed is not None else self.req_order.get(sub_id)
        if order is not None and order > self.answered_order:
            self.answered_order = order

    def sent_order(self, sub_id: str) -> int:
        """Where ``sub_id`` (open, or closed unanswered) stands in the order REQs were sent."""
        closed = self.closed_unanswered.get(sub_id)
        return closed[1] if closed is not None else self.req_order.get(sub_id, 0)

    def refusable_closed(self, now: float, within: float) -> set[str]:
        """The REQs closed unanswered, sent ``within`` seconds of ``now``, that a NOTICE
        naming no subscription read now may be refusing: none the relay read before a REQ
        it answered (older ones are forgotten)."""
        if not self.closed_unanswered:
            return set()
        self.closed_unanswered = {s: v for s, v in self.closed_unanswered.items() if now - v[0] <= within}
        return {s for s, (_, order) in self.closed_unanswered.items() if order > self.answered_order}

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
        self.req_order.pop(sub_id, None)
        self.open_beside.pop(sub_id, None)
        return self.subscriptions.pop(sub_id, None), size
