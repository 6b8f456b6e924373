"""Which batch is fetching an event, so that no other relay fetches it too (SPEC §4, NIP-77).

Repositories list two or three relays, and NIP-77 on each finds the same missing events: the
first exchange to find an id claims it for its batch (fetched by id or by that filter's REQ
pages), and later exchanges, on any relay, skip it and wait for it. Nothing is lost when the
claiming batch fails: when it ends (complete, failed, or its relay gone) every claimed id that
did not arrive is handed back to each relay that skipped it, with the filter whose exchange
found it there, for missing-event recovery (by id, or by that filter on a relay that does
not serve ids). An arrival, from wherever, settles the id for everyone.

Trade-off: a skipped id comes from the claiming relay only; if that relay is slow or fails,
the others fetch it later (recovery's backoff) rather than at once.

Pure: the manager calls ``claim`` after each exchange, ``arrived`` for each event handed to
delivery, and ``release`` when a batch is done with.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..protocol.filters import Filter

BatchKey = tuple[str, int]  # (relay url, batch id)


class FetchClaims:
    def __init__(self):
        self._owner: dict[str, BatchKey] = {}  # id → the batch fetching it
        self._by_batch: dict[BatchKey, set[str]] = {}
        # id → relays that skipped it → the filter their exchange found it by
        self._waiting: dict[str, dict[str, Filter | None]] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def claim(self, relay: str, batch_id: int, ids: Iterable[str], found_by: Filter | None = None) -> set[str]:
        """Claim ``ids`` for this batch; returns those it now fetches. Ids another batch is
        fetching (on any relay) are not returned: this relay waits for them instead.
        ``found_by``: the filter whose exchange found them here."""
        key = (relay, batch_id)
        mine = set()
        for event_id in ids:
            owner = self._owner.get(event_id)
            if owner is None:
                self._owner[event_id] = key
                mine.add(event_id)
            elif owner != key:
                self._waiting.setdefault(event_id, {})[relay] = found_by
        if mine:
            self._by_batch.setdefault(key, set()).update(mine)
        return mine

    def arrived(self, event_id: str) -> None:
        """The event reached delivery: nobody needs to fetch it any more."""
        owner = self._owner.pop(event_id, None)
        if owner is not None:
            self._waiting.pop(event_id, None)
            ids = self._by_batch.get(owner)
            if ids is not None:
                ids.discard(event_id)
                if not ids:
                    del self._by_batch[owner]

    def release(self, relay: str, batch_id: int) -> dict[str, dict[str, Filter | None]]:
        """The batch is done with (complete, failed or dropped): its ids that have not
        arrived are unclaimed. Returns, per relay that skipped some of them, those ids (to
        fetch itself, through missing-event recovery), each with the filter it found it by."""
        handed: dict[str, dict[str, Filter | None]] = {}
        for event_id in self._by_batch.pop((relay, batch_id), ()):
            del self._owner[event_id]
            for waiter, found_by in self._waiting.pop(event_id, {}).items():
                handed.setdefault(waiter, {})[event_id] = found_by
        return handed
