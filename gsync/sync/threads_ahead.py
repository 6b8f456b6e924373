"""Threads reconciled before their roots are known: one relay session's record.

A layer-2 exchange (``#a``/``#A``/``#q`` of the repositories) tells which of the relay's
events the own relay lacks before any of them is fetched. Some are roots (issues, patches,
PRs): once fetched and stored they become targets, and their threads (``#e``/``#E``/``#q``
of each) would take a round of exchanges of their own, then a fetch by id of what those
find. Instead, the ids join the batch's thread exchanges that have not started yet
(``batch_end.cover_threads_ahead``), with live coverage of their threads opened at once,
and are noted here. A root among them that the own relay stores later is covered already:
its thread's history by that batch's exchanges, what comes after by the live coverage
(``RelayLifecycle.take_threads_ahead`` takes it from here instead of starting a sync).

Most of the ids are not roots (comments, statuses, patches in a series): each entry lives
``ttl`` seconds at most (well inside the 15 minutes every catch-up overlaps) and the record
holds ``max_entries`` at most; an id past either simply takes the usual round when it turns
out to be a root. A batch that fails takes its ids with it (``drop_batch``).

Pure: the manager owns one per relay session and passes ``now``.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class ThreadsAhead:
    def __init__(self, ttl: float, max_entries: int):
        self.ttl = ttl
        self.max_entries = max_entries
        self._ids: OrderedDict[str, tuple[float, int]] = OrderedDict()  # id -> (noted at, batch id)

    def __len__(self) -> int:
        return len(self._ids)

    def room(self, now: float) -> int:
        """How many more ids may be noted now."""
        self._expire(now)
        return self.max_entries - len(self._ids)

    def note(self, ids: Iterable[str], now: float, batch_id: int) -> None:
        """``ids``' threads are being reconciled by batch ``batch_id`` from ``now`` on, and
        covered live. Callers note at most ``room(now)`` ids; beyond that the oldest go."""
        for event_id in ids:
            self._ids.pop(event_id, None)
            self._ids[event_id] = (now, batch_id)
        while len(self._ids) > self.max_entries:
            self._ids.popitem(last=False)

    def roots(self, now: float) -> set[str]:
        """Every id noted within ``ttl``: their threads' live coverage stays wanted."""
        self._expire(now)
        return set(self._ids)

    def take(self, roots: Iterable[str], now: float) -> dict[str, int]:
        """The ``roots`` (now known to be roots) whose threads are covered: root -> the
        batch that reconciled it. They leave the record."""
        self._expire(now)
        taken = {}
        for root in roots:
            entry = self._ids.pop(root, None)
            if entry is not None:
                taken[root] = entry[1]
        return taken

    def drop_batch(self, batch_id: int) -> None:
        """Batch ``batch_id`` failed: what it reconciled is not to be trusted."""
        for event_id in [i for i, (_, b) in self._ids.items() if b == batch_id]:
            del self._ids[event_id]

    def _expire(self, now: float) -> None:
        ids = self._ids
        while ids and now - next(iter(ids.values()))[0] >= self.ttl:
            ids.popitem(last=False)
