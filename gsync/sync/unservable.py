"""Ids a relay advertises and does not serve, and what that says of the relay (SPEC §4
residuals).

A relay that advertised an id through NIP-77 and did not serve it by id is asked by the
filter that found it. The filter is the witness: what it brings and the id fetch did not
says the relay does not serve ids (``ids_not_served``: REQ+EOSE there for a day; judged once
the filters answered, by the seed's count only where they could not); what it
does not bring either is not there to be served (hidden on read, expired, deleted between
the exchange and the fetch): *unservable there* (``UnservableIds``), not asked on that relay
again before its next daily fresh start, and recovered from the other relays that list its
repository. One such id costs the relay nothing else, NIP-77 included. The fresh start asks
it again, by id, once: an id that was unservable there before that fresh start
(``UnservableIds.before``) is not lag, and does not get the residual's retry by id (it goes
to its filter at once).
"""
from __future__ import annotations

from collections.abc import Iterable

from ..constants import (
    IDS_NOT_SERVED_MIN_ADVERTISED,
    MIN_PAGE_CAP,
    RESIDUAL_FALLBACK_MAX_FRACTION,
    UNSERVABLE_MAX_IDS,
)


def ids_not_served(advertised: int, served_by_id: int, brought_by_filter: int | None = None) -> bool:
    """Does the relay not serve by id what its NIP-77 advertises? Only if its id fetch
    served at most a tenth of the ``advertised`` ids, and their filters brought some of what
    the id fetch did not (``brought_by_filter``). Where the filters could not answer (None:
    refused, silent), the seed's count decides: at least ``IDS_NOT_SERVED_MIN_ADVERTISED``
    advertised. Ids that neither the id fetch nor their filters brought say nothing of the
    relay, however many: they are not there (a relay that hides on read, or still advertises
    what it deleted, would otherwise lose its NIP-77 at every daily fresh start; seed 28's
    year: 20 such ids, gathered over months). Nor does one that served ``MIN_PAGE_CAP`` ids
    or more by id: it serves ids, and its page cap cut the fetch (a relay serving 20 a
    filter sent 20 of 300 ids, and lost its NIP-77 for a day: seed 8's year of small pages)."""
    if served_by_id > advertised * RESIDUAL_FALLBACK_MAX_FRACTION or served_by_id >= MIN_PAGE_CAP:
        return False
    if brought_by_filter is None:
        return advertised >= IDS_NOT_SERVED_MIN_ADVERTISED
    return brought_by_filter > 0


class UnservableIds:
    """One relay's unservable ids (see the module), oldest first, ``max_ids`` at most: the
    relay's advertised ids are the work that fills it, its daily fresh start (``clear``)
    and its retirement (the relay's state goes) what ends it."""

    def __init__(self, max_ids: int = UNSERVABLE_MAX_IDS):
        self.max_ids = max_ids
        self._ids: dict[str, None] = {}
        self._before: frozenset[str] = frozenset()  # what was unservable at the last ``clear``
        self._asked: dict[str, None] = {}  # asked by id since (``asked_by_id``), oldest first

    def add(self, ids: Iterable[str]) -> list[str]:
        """Remember ``ids``; returns those not remembered before (what is counted)."""
        new = [i for i in dict.fromkeys(ids) if i not in self._ids]
        self._ids.update(dict.fromkeys(new))
        while len(self._ids) > self.max_ids:
            del self._ids[next(iter(self._ids))]
        return new

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def before(self, event_id: str) -> bool:
        """Was ``event_id`` unservable here before the last daily fresh start (or is it now)?"""
        return event_id in self._ids or event_id in self._before

    def asked_by_id(self, ids: Iterable[str], *, unserved: bool = False) -> None:
        """``ids`` are asked by id: those unservable before the last daily fresh start have
        had that day's ask (``asked_today``); so have all of them when ``unserved`` (asked
        by id and not served: on their way to their filter, whose verdict a cut may lose;
        seed 300's year, day 191.77: asked by id a third time at the reconnect). At most
        twice ``max_ids``, oldest dropped first."""
        before = self._before
        self._asked.update(dict.fromkeys(i for i in ids if unserved or i in before))
        while len(self._asked) > 2 * self.max_ids:
            del self._asked[next(iter(self._asked))]

    def asked_today(self, event_id: str) -> bool:
        """Was ``event_id``, unservable before the last daily fresh start, asked by id since?
        Then not by id again before the next one, whatever the session: a fresh start at a
        reconnect after the daily's batch was cut off goes to its filter at once (seed 46's
        year, day 293.99: asked by id a fourth time in 23.7 h)."""
        return event_id in self._asked

    def clear(self) -> None:
        """The daily fresh start: each id is asked once more; what was unservable, or asked
        by id since the last and not served (``asked_by_id``), is remembered until the next
        one (``before``: not lag, no retry by id), no more (bounded as ``max_ids`` and
        twice it). (An id whose filter is no witness, on a relay ignoring ``until``, is never
        judged unservable: taken for lag at each daily fresh start, it was asked by id,
        again, and by recovery, 9 times in 23.7 h: seed 64 of --fault-scale 3 with
        --notice-refusals 0.3.)"""
        self._before = frozenset(self._ids).union(self._asked)
        self._ids.clear()
        self._asked = {}
