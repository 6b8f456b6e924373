"""What a NIP-77 "already have" set claims beyond the own relay's holdings (SPEC §4): events
in flight to the own relay (awaiting its OK) and events it refused for good.

Both sets can hold tens of thousands of events while one exchange's filter matches a few of
them, so they are indexed by what gsync's filters select on — the values of single-letter
tags (``#a``, ``#e``, ``#d`` …), authors, kinds — and an exchange is given only the events
that can match its filter, checked against it: its cost follows the filter's values, not
everything in flight.

Pure. ``HaveIndex`` is the index; ``RejectedHave`` is the rejected index keeping one.
"""
from __future__ import annotations

from ..protocol.filters import Filter
from .filter_plan import EVENT_TAGS, REPO_TAGS
from .rejected import RejectedIndex

# The tags gsync's own filters select on (state ``#d``, layers 2 and 3, descendants): only
# these are indexed, so an event costs a few index entries, not one per tag.
INDEXED_TAGS = frozenset(("d", *REPO_TAGS, *EVENT_TAGS))


class _Compact:
    """An event reduced to what filters select on (kept for days for a refused event:
    no content, no signature, single-letter tags only)."""

    __slots__ = ("id", "created_at", "kind", "pubkey", "tags")

    def __init__(self, event):
        self.id = event.id
        self.created_at = event.created_at
        self.kind = event.kind
        self.pubkey = event.pubkey
        self.tags = tuple((t[0], t[1]) for t in event.tags if len(t) >= 2 and len(t[0]) == 1)


class _Loose:
    """Only (created_at, id) known (a refusal remembered across a restart): it may match
    any filter, so every filter gets it."""

    __slots__ = ("id", "created_at")

    def __init__(self, event_id: str, created_at: int):
        self.id = event_id
        self.created_at = created_at


class HaveIndex:
    def __init__(self):
        self._entries: dict[str, object] = {}  # id → Event, _Compact or _Loose
        self._by_tag: dict[str, dict[str, set[str]]] = {}  # name → value → ids
        self._by_author: dict[str, set[str]] = {}
        self._by_kind: dict[int, set[str]] = {}
        self._loose: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._entries

    def ids(self):
        return self._entries.keys()

    def add(self, event, compact: bool = False) -> None:
        """Index ``event``. ``compact``: keep only what filters select on (for entries that
        outlive the event object); otherwise the event itself is kept (no copy)."""
        if event.id in self._entries:
            return
        self._entries[event.id] = _Compact(event) if compact else event
        eid = event.id
        by_tag = self._by_tag
        for tag in event.tags:
            if len(tag) >= 2 and tag[0] in INDEXED_TAGS:
                values = by_tag.get(tag[0])
                if values is None:
                    values = by_tag[tag[0]] = {}
                ids = values.get(tag[1])
                if ids is None:
                    values[tag[1]] = {eid}
                else:
                    ids.add(eid)
        _put(self._by_author, event.pubkey, eid)
        _put(self._by_kind, event.kind, eid)

    def add_loose(self, event_id: str, created_at: int) -> None:
        if event_id not in self._entries:
            self._entries[event_id] = _Loose(event_id, created_at)
            self._loose.add(event_id)

    def discard(self, event_id: str) -> None:
        entry = self._entries.pop(event_id, None)
        if entry is None:
            return
        if isinstance(entry, _Loose):
            self._loose.discard(event_id)
            return
        for tag in entry.tags:
            if len(tag) >= 2 and tag[0] in INDEXED_TAGS:
                values = self._by_tag.get(tag[0])
                if values is not None:
                    _take(values, tag[1], event_id)
                    if not values:
                        del self._by_tag[tag[0]]
        _take(self._by_author, entry.pubkey, event_id)
        _take(self._by_kind, entry.kind, event_id)

    def matching(self, flt: Filter) -> list[tuple[int, str]]:
        """(created_at, id) of every indexed event ``flt`` matches (and of every loose one
        its time bounds allow). The work is the filter's values plus the candidates."""
        out = []
        entries = self._entries
        for eid in self._candidates(flt):
            entry = entries[eid]
            if isinstance(entry, _Loose):
                if _in_time(entry.created_at, flt):
                    out.append((entry.created_at, eid))
            elif _matches(entry, flt):
                out.append((entry.created_at, eid))
        return out

    def _candidates(self, flt: Filter):
        indexed = [t for t in flt.tags if t[0] in INDEXED_TAGS]
        if flt.ids is not None:
            found = {i for i in flt.ids if i in self._entries}
        elif indexed:
            name, values = min(indexed, key=lambda t: len(t[1]))
            found = _union(self._by_tag.get(name, {}), values)
        elif flt.authors is not None:
            found = _union(self._by_author, flt.authors)
        elif flt.kinds is not None:
            found = _union(self._by_kind, flt.kinds)
        else:
            return list(self._entries)
        if self._loose:
            found |= self._loose
        return found


def _put(index: dict, key, eid: str) -> None:
    ids = index.get(key)
    if ids is None:
        index[key] = {eid}
    else:
        ids.add(eid)


def _take(index: dict, key, eid: str) -> None:
    ids = index.get(key)
    if ids is not None:
        ids.discard(eid)
        if not ids:
            del index[key]


def _union(index: dict, keys) -> set[str]:
    found: set[str] = set()
    for key in keys:
        ids = index.get(key)
        if ids:
            found |= ids
    return found


def _in_time(created_at: int, flt: Filter) -> bool:
    return (flt.since is None or created_at >= flt.since) and (flt.until is None or created_at <= flt.until)


def _matches(entry, flt: Filter) -> bool:
    """NIP-01 matching on an Event or a _Compact (single-letter tags are all filters use)."""
    if flt.ids is not None and entry.id not in flt.ids:
        return False
    if flt.authors is not None and entry.pubkey not in flt.authors:
        return False
    if flt.kinds is not None and entry.kind not in flt.kinds:
        return False
    if not _in_time(entry.created_at, flt):
        return False
    for name, values in flt.tags:
        if not any(len(t) >= 2 and t[0] == name and t[1] in values for t in entry.tags):
            return False
    return True


class RejectedHave(RejectedIndex):
    """The rejected index (SPEC §5), with a ``HaveIndex`` of its entries so that a NIP-77
    exchange gets only the refused events its filter can match (``items_matching``).

    Refusals remembered across a restart carry no tags: they are given to every exchange
    (their time bounds allowing) until they expire."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.have = HaveIndex()

    def add(self, event, now: float) -> None:
        super().add(event, now)
        self.have.add(event, compact=True)

    def remove(self, event_id: str) -> None:
        super().remove(event_id)
        self.have.discard(event_id)

    def expire(self, now: float) -> None:
        super().expire(now)
        if len(self.have) > len(self):  # some expired: drop them from the index too
            for eid in [e for e in self.have.ids() if e not in self]:
                self.have.discard(eid)

    def items_matching(self, flt: Filter) -> list[tuple[int, str]]:
        return [item for item in self.have.matching(flt) if item[1] in self]

    @classmethod
    def loads(cls, text: str, now: float, **kw) -> RejectedHave:
        index = super().loads(text, now, **kw)
        for created_at, eid in index.items():
            index.have.add_loose(eid, created_at)
        return index
