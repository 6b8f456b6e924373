"""Which batch is fetching an event, so that no other relay fetches it too (SPEC §4, NIP-77).

Repositories list two or three relays, and NIP-77 on each finds the same missing events: the
first exchange to find an id claims it for its batch (fetched by id or by that filter's REQ
pages), and later exchanges, on any relay, skip it and wait for it. Nothing is lost when the
claiming batch fails: when it ends (complete, failed, or its relay gone) every claimed id that
did not arrive is handed back to each relay that skipped it, for missing-event recovery
there. An arrival, from wherever, settles the id for everyone.

Trade-off: a skipped id comes from the claiming relay only; if that relay is slow or fails,
the others fetch it later (recovery's backoff) rather than at once.

Pure: the manager calls ``claim`` after each exchange, ``arrived`` for each event handed to
delivery, and ``release`` when a batch is done with.
"""
from __future__ import annotations

from collections.abc import Iterable

BatchKey = tuple[str, int]  # (relay url, batch id)


class FetchClaims:
    def __init__(self):
        self._owner: dict[str, BatchKey] = {}  # id → the batch fetching it
        self._by_batch: dict[BatchKey, set[str]] = {}
        self._waiting: dict[str, set[str]] = {}  # id → relays that skipped it

    def __len__(self) -> int:
        return len(self._owner)

    def claim(self, relay: str, batch_id: int, ids: Iterable[str]) -> set[str]:
        """Claim ``ids`` for this batch; returns those it now fetches. Ids another batch is
        fetching (on any relay) are not returned: this relay waits for them instead."""
        key = (relay, batch_id)
        mine = set()
        for event_id in ids:
            owner = self._owner.get(event_id)
            if owner is None:
                self._owner[event_id] = key
                mine.add(event_id)
            elif owner != key:
                self._waiting.setdefault(event_id, set()).add(relay)
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

    def release(self, relay: str, batch_id: int) -> dict[str, list[str]]:
        """The batch is done with (complete, failed or dropped): its ids that have not
        arrived are unclaimed. Returns, per relay that skipped some of them, those ids (to
        fetch itself, through missing-event recovery)."""
        handed: dict[str, list[str]] = {}
        for event_id in self._by_batch.pop((relay, batch_id), ()):
            del self._owner[event_id]
            for waiter in self._waiting.pop(event_id, ()):
                handed.setdefault(waiter, []).append(event_id)
        return handed
