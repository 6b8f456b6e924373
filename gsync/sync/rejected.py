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
from ..protocol.filters import Filter

# The tags gsync's sync filters select by (state ``d``; repositories ``a``/``A``/``q``;
# threads ``e``/``E``/``q``): a cold entry keeps their values, so whether a filter could
# match it is known after the full event is gone.
FILTER_TAGS = frozenset("aAqeEd")


def _refs(event: Event) -> tuple[tuple[str, str], ...]:
    return tuple((t[0], t[1]) for t in event.tags if len(t) >= 2 and t[0] in FILTER_TAGS)


class RejectedIndex:
    def __init__(self, hot_secs: float = REJECTED_HOT_SECS, cold_secs: float = REJECTED_COLD_SECS):
        self.hot_secs = hot_secs
        self.cold_secs = cold_secs
        self._hot: dict[str, tuple[Event, float]] = {}
        # id → (created_at, kind, pubkey, rejected_at, refs): enough for the negentropy
        # have-set, to find the entries a new announcement may unblock, and to tell which
        # filters may match (refs: the FILTER_TAGS (name, value) pairs; None when saved by
        # an older gsync, which kept none: then every filter that allows the kind may).
        self._cold: dict[str, tuple] = {}
        self.dirty = False

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._cold

    def __len__(self) -> int:
        return len(self._cold)

    def add(self, event: Event, now: float) -> None:
        self._hot[event.id] = (event, now + self.hot_secs)
        self._cold[event.id] = (event.created_at, event.kind, event.pubkey, now, _refs(event))
        self.dirty = True

    def remove(self, event_id: str) -> None:
        self._hot.pop(event_id, None)
        if self._cold.pop(event_id, None) is not None:
            self.dirty = True

    def items(self) -> list[tuple[int, str]]:
        """(created_at, id) pairs: they belong in every negentropy "already have" set."""
        return [(meta[0], eid) for eid, meta in self._cold.items()]

    def any_may_match(self, flt: Filter) -> bool:
        """Could ``flt`` match an entry? Then fetching it by REQ would bring refused events
        back: NIP-77 counts them as held (SPEC §5: never fetched again)."""
        return any(_may_match(eid, meta, flt) for eid, meta in self._cold.items())

    def take_by_author(self, pubkeys) -> tuple[list[Event], list[str]]:
        """Entries a dependency may have unblocked: full hot events to re-deliver now, and
        cold-only ids to re-fetch. Both leave the index (a new refusal puts them back)."""
        pubkeys = set(pubkeys)
        hot, cold = [], []
        for eid, meta in list(self._cold.items()):
            if meta[2] in pubkeys:
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
        return json.dumps({"version": 2, "cold": self._cold}, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str, now: float, **kw) -> RejectedIndex:
        """A saved index; anything unreadable gives an empty one (losing it costs bandwidth,
        never events)."""
        index = cls(**kw)
        try:
            cold = json.loads(text)["cold"]
            for eid, entry in cold.items():
                created_at, kind, pubkey, at = entry[:4]
                refs = tuple((str(n), str(v)) for n, v in entry[4]) if len(entry) > 4 else None
                if isinstance(eid, str) and len(eid) == 64 and now - float(at) < index.cold_secs:
                    index._cold[eid] = (int(created_at), int(kind), str(pubkey), float(at), refs)
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return index


def _may_match(event_id: str, meta: tuple, flt: Filter) -> bool:
    created_at, kind, pubkey, _, refs = meta
    if flt.ids is not None and event_id not in flt.ids:
        return False
    if flt.kinds is not None and kind not in flt.kinds:
        return False
    if flt.authors is not None and pubkey not in flt.authors:
        return False
    if (flt.since is not None and created_at < flt.since) or (
            flt.until is not None and created_at > flt.until):
        return False
    return refs is None or all(any(n == name and v in values for n, v in refs)
                               for name, values in flt.tags)
