"""Rejected index: events the own relay refused for good, so they are never fetched again.

Pure (time passed in; persistence is text in and out). Hot tier: full events for two minutes,
so a dependency that arrives soon after (a new announcement adding a maintainer) can have them
re-delivered at once. Cold tier: ids for seven days, saved in ``state_dir`` across restarts;
cold ids whose event is gone are re-fetched by id when a dependency arrives (SPEC §5).
"""
from __future__ import annotations

import json

from ..constants import REJECTED_COLD_SECS, REJECTED_HOT_SECS
from ..protocol.event import Event


class RejectedIndex:
    def __init__(self, hot_secs: float = REJECTED_HOT_SECS, cold_secs: float = REJECTED_COLD_SECS):
        self.hot_secs = hot_secs
        self.cold_secs = cold_secs
        self._hot: dict[str, tuple[Event, float]] = {}
        # id → (created_at, kind, pubkey, rejected_at): enough for the negentropy have-set
        # and to find the entries a new announcement may unblock.
        self._cold: dict[str, tuple[int, int, str, float]] = {}
        self.dirty = False

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._cold

    def __len__(self) -> int:
        return len(self._cold)

    def add(self, event: Event, now: float) -> None:
        self._hot[event.id] = (event, now + self.hot_secs)
        self._cold[event.id] = (event.created_at, event.kind, event.pubkey, now)
        self.dirty = True

    def remove(self, event_id: str) -> None:
        self._hot.pop(event_id, None)
        if self._cold.pop(event_id, None) is not None:
            self.dirty = True

    def items(self) -> list[tuple[int, str]]:
        """(created_at, id) pairs: they belong in every negentropy "already have" set."""
        return [(meta[0], eid) for eid, meta in self._cold.items()]

    def take_by_author(self, pubkeys) -> tuple[list[Event], list[str]]:
        """Entries a dependency may have unblocked: full hot events to re-deliver now, and
        cold-only ids to re-fetch. Both leave the index (a new refusal puts them back)."""
        pubkeys = set(pubkeys)
        hot, cold = [], []
        for eid, (_, _, pubkey, _) in list(self._cold.items()):
            if pubkey in pubkeys:
                entry = self._hot.get(eid)
                (hot if entry else cold).append(entry[0] if entry else eid)
                self.remove(eid)
        return hot, cold

    def expire(self, now: float) -> None:
        for eid in [e for e, (_, until) in self._hot.items() if until <= now]:
            del self._hot[eid]
        stale = [e for e, meta in self._cold.items() if now - meta[3] >= self.cold_secs]
        for eid in stale:
            del self._cold[eid]
        self.dirty = self.dirty or bool(stale)

    # -- persistence (cold tier only) --------------------------------------------------

    def dumps(self) -> str:
        self.dirty = False
        return json.dumps({"version": 1, "cold": self._cold}, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str, now: float, **kw) -> RejectedIndex:
        """A saved index; anything unreadable gives an empty one (losing it costs bandwidth,
        never events)."""
        index = cls(**kw)
        try:
            cold = json.loads(text)["cold"]
            for eid, (created_at, kind, pubkey, at) in cold.items():
                if isinstance(eid, str) and len(eid) == 64 and now - float(at) < index.cold_secs:
                    index._cold[eid] = (int(created_at), int(kind), str(pubkey), float(at))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return index
