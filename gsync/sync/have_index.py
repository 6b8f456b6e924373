"""What a NIP-77 "already have" set claims beyond the own relay's holdings (SPEC §4): events
in flight to the own relay (awaiting its OK) and events it refused for good.

Both sets can hold tens of thousands of events while one exchange's filter matches a few of
them, so they are indexed by what gsync's filters select on — the values of single-letter
tags (``#a``, ``#e``, ``#d`` …), authors, kinds — and an exchange is given only the events
that can match its filter, checked against it: its cost follows the filter's values, not
everything in flight.

Pure. An entry is anything with ``created_at``, ``kind``, ``pubkey`` and ``tags`` (an
``Event``, or the rejected index's compact entry). A part that is ``None`` is unknown (a
refusal remembered from an older gsync): it may match any filter, so such an entry is a
candidate for every filter and matched on what is known.
"""
from __future__ import annotations

from ..protocol.filters import Filter

# The tags gsync's own filters select on (state ``#d``; repositories ``#a``/``#A``/``#q``;
# threads ``#e``/``#E``/``#q``): only these are indexed, so an event costs a few index
# entries, not one per tag.
INDEXED_TAGS = frozenset("daAqeE")


class HaveIndex:
    def __init__(self):
        self._entries: dict[str, object] = {}  # id → entry (kept as given, not copied)
        self._by_tag: dict[str, dict[str, set[str]]] = {}  # name → value → ids
        self._by_author: dict[str, set[str]] = {}
        self._by_kind: dict[int, set[str]] = {}
        self._loose: set[str] = set()  # entries with an unknown part: candidates for any filter

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._entries

    def add(self, event_id: str, entry) -> None:
        if event_id in self._entries:
            return
        self._entries[event_id] = entry
        if entry.tags is None or entry.kind is None or entry.pubkey is None:
            self._loose.add(event_id)
            return
        by_tag = self._by_tag
        for tag in entry.tags:
            if len(tag) >= 2 and tag[0] in INDEXED_TAGS:
                values = by_tag.get(tag[0])
                if values is None:
                    values = by_tag[tag[0]] = {}
                _put(values, tag[1], event_id)
        _put(self._by_author, entry.pubkey, event_id)
        _put(self._by_kind, entry.kind, event_id)

    def discard(self, event_id: str) -> None:
        entry = self._entries.pop(event_id, None)
        if entry is None:
            return
        if event_id in self._loose:
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
        """(created_at, id) of every entry ``flt`` may match. The work is the filter's
        values plus the candidates, not the size of the index."""
        entries = self._entries
        # Candidates found by the filter's one indexed tag carry one of its values there
        # (the index is made of the entries' own tags): only the rest is checked. Own-relay
        # holdings are asked so, of tens of thousands of entries in a long-running process.
        tags_known = (len(flt.tags) == 1 and flt.ids is None and flt.tags[0][0] in INDEXED_TAGS
                      and not self._loose)
        out = []
        for eid in self._candidates(flt):
            entry = entries[eid]
            if may_match(eid, entry, flt, tags_known):
                out.append((entry.created_at, eid))
        return out

    def any_matching(self, flt: Filter) -> bool:
        entries = self._entries
        return any(may_match(eid, entries[eid], flt) for eid in self._candidates(flt))

    def _candidates(self, flt: Filter):
        if flt.ids is not None:
            return [i for i in flt.ids if i in self._entries]
        indexed = [t for t in flt.tags if t[0] in INDEXED_TAGS]
        if indexed:
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


def may_match(event_id: str, entry, flt: Filter, tags_known: bool = False) -> bool:
    """NIP-01 matching (single-letter tags are all filters use); an unknown part (None)
    counts as a match. ``tags_known``: the entry is known to match the filter's tags."""
    if flt.ids is not None and event_id not in flt.ids:
        return False
    if flt.authors is not None and entry.pubkey is not None and entry.pubkey not in flt.authors:
        return False
    if flt.kinds is not None and entry.kind is not None and entry.kind not in flt.kinds:
        return False
    created_at = entry.created_at
    if (flt.since is not None and created_at < flt.since) or (flt.until is not None and created_at > flt.until):
        return False
    tags = entry.tags
    if tags is None or tags_known:
        return True
    compact = getattr(entry, "compact", False)  # only INDEXED_TAGS kept: others unknown
    for name, values in flt.tags:
        if compact and name not in INDEXED_TAGS:
            continue
        if not any(len(t) >= 2 and t[0] == name and t[1] in values for t in tags):
            return False
    return True


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
