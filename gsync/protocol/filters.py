"""NIP-01 filters: construction, JSON form, matching and size accounting.

Pure. A ``Filter`` is immutable and hashable so it can key pagination state and be compared
in tests; ``replace`` derives the next page (``until``) or a live form (``limit=0``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .event import Event, is_plain
from .event import compact_json as _dumps

_BOUNDS = frozenset({"since", "until", "limit"})  # what ``replace`` may change and keep the selectors' JSON


def _frozen(values) -> frozenset | None:
    return None if values is None else frozenset(values)


@dataclass(frozen=True, slots=True)
class Filter:
    ids: frozenset[str] | None = None
    authors: frozenset[str] | None = None
    kinds: frozenset[int] | None = None
    # single-letter tag name → accepted values, e.g. {"a": {...}} for "#a"
    tags: tuple[tuple[str, frozenset[str]], ...] = field(default=())
    since: int | None = None
    until: int | None = None
    limit: int | None = None
    # The JSON of the selectors (ids, authors, kinds, tags), made on first use and shared
    # with the filters ``replace`` derives by since/until/limit: a filter of 489 ids is
    # sized, packed and sent as a REQ, then as its next page or its live form, and encoding
    # its values each time showed in profiles. The bounds are cheap to append.
    _selectors: str | None = field(default=None, init=False, compare=False, hash=False, repr=False)
    # the whole JSON, made when first sent or keyed on (sizes come from the selectors)
    _json: str | None = field(default=None, init=False, compare=False, hash=False, repr=False)

    @classmethod
    def make(cls, *, ids=None, authors=None, kinds=None, tags=None, since=None, until=None, limit=None):
        tag_items = tuple(sorted((k, frozenset(v)) for k, v in (tags or {}).items()))
        return cls(_frozen(ids), _frozen(authors), _frozen(kinds), tag_items, since, until, limit)

    def tag(self, name: str) -> frozenset[str] | None:
        for k, v in self.tags:
            if k == name:
                return v
        return None

    def most_values(self) -> int:
        """The longest list of values it holds: its ids, its authors or one tag's."""
        return max([len(self.ids or ()), len(self.authors or ())] + [len(values) for _, values in self.tags])

    def replace(self, **changes) -> Filter:
        if not changes.keys() <= _BOUNDS:
            return dataclasses.replace(self, **changes)
        # the usual change (a page's until, a live form's limit): built directly, as
        # dataclasses.replace would (which reads every field's definition at each call)
        derived = type(self)(self.ids, self.authors, self.kinds, self.tags, changes.get("since", self.since),
                             changes.get("until", self.until), changes.get("limit", self.limit))
        # Made here if not yet, so that the two share it: a filter and its live form (or
        # next page) are both sized and sent, and were each encoding the same values.
        object.__setattr__(derived, "_selectors", self._selectors_json())
        return derived

    def to_json(self) -> str:
        """Its JSON object (values sorted, unset fields left out: equal filters serialise
        equally), compact, made once."""
        text = self._json
        if text is None:
            selectors, bounds = self._selectors_json(), self._bounds_json()
            text = "{" + selectors + ("," if selectors and bounds else "") + bounds + "}"
            object.__setattr__(self, "_json", text)
        return text

    def _bounds_json(self) -> str:
        parts = []
        if self.since is not None:
            parts.append(f'"since":{self.since}')
        if self.until is not None:
            parts.append(f'"until":{self.until}')
        if self.limit is not None:
            parts.append(f'"limit":{self.limit}')
        return ",".join(parts)

    def _selectors_json(self) -> str:
        text = self._selectors
        if text is None:
            parts = []
            if self.ids is not None:
                parts.append('"ids":' + _strings_json(self.ids))
            if self.authors is not None:
                parts.append('"authors":' + _strings_json(self.authors))
            if self.kinds is not None:
                parts.append('"kinds":' + _kinds_json(self.kinds))
            for name, values in self.tags:
                parts.append(_dumps("#" + name) + ":" + _values_json(values))
            text = ",".join(parts)
            object.__setattr__(self, "_selectors", text)
        return text

    def drop_json(self) -> None:
        """Forget the cached JSON: a filter kept for matching once its REQ is sent need not
        hold copies of up to 32 KB (they are made again if ever needed)."""
        object.__setattr__(self, "_selectors", None)
        object.__setattr__(self, "_json", None)

    def tag_value_bytes(self) -> int:
        """Serialized size of the tag values (the quantity the 32 KB budget bounds).

        Measured as JSON, quotes and comma included: values such as ``d`` identifiers come
        from untrusted events, and each control character in one costs six bytes on the wire.
        """
        return sum(json_size(v) + 1 for _, values in self.tags for v in values)

    def serialized_size(self) -> int:
        """``len(self.to_json().encode())``, without building either."""
        selectors, bounds = self._selectors_json(), self._bounds_json()
        size = len(selectors) if selectors.isascii() else len(selectors.encode())
        return 2 + size + (1 if selectors and bounds else 0) + len(bounds)

    def matches(self, event: Event, *, in_time: bool = True) -> bool:
        """NIP-01 matching; ``limit`` does not affect whether an event matches, nor
        ``since``/``until`` when ``in_time`` is False."""
        if self.ids is not None and event.id not in self.ids:
            return False
        if self.authors is not None and event.pubkey not in self.authors:
            return False
        if self.kinds is not None and event.kind not in self.kinds:
            return False
        if in_time and self.since is not None and event.created_at < self.since:
            return False
        if in_time and self.until is not None and event.created_at > self.until:
            return False
        if self.tags:
            index = event.tag_index()
            for name, values in self.tags:
                present = index.get(name)
                if not present or values.isdisjoint(present):
                    return False
        return True


# Encoding a filter's selectors, the same text as ``_dumps`` of each sorted, for less: most
# filters hold a few values (one repository's roots), and the encoder's call cost more than
# their text.


def _strings_json(values) -> str:
    """``_dumps(sorted(values))`` for strings: joined directly when none needs escaping
    (ids, addresses and most identifiers)."""
    ordered = sorted(values)
    if ordered and is_plain("".join(ordered)):
        return '["' + '","'.join(ordered) + '"]'
    return _dumps(ordered)


def _kinds_json(kinds) -> str:
    """``_dumps(sorted(kinds))``; integers are their ``str``."""
    ordered = sorted(kinds)
    if all(type(kind) is int for kind in ordered):
        return "[" + ",".join(map(str, ordered)) + "]"
    return _dumps(ordered)


# The last tag values encoded and their JSON: layers 2 and 3 ask one set of values (the same
# frozenset: ``filter_plan._tag_filters``) under three tags, whose filters are encoded one
# after the other. One entry, by identity: nothing to compare, nothing to grow.
_last_values: tuple[frozenset, str] = (frozenset(), "[]")


def _values_json(values: frozenset[str]) -> str:
    """``_strings_json(values)``, once for the filters sharing ``values``."""
    global _last_values
    last = _last_values
    if values is not last[0]:
        last = _last_values = (values, _strings_json(values))
    return last[1]


def json_size(value: str) -> int:
    """Bytes of ``value`` as a JSON string, quotes included. Ids and addresses (printable
    ASCII, nothing to escape) are counted without encoding: filter building sizes every
    value of every filter."""
    if is_plain(value):
        return len(value) + 2
    return len(_dumps(value).encode())


class FilterSet:
    """The filters of one subscription, indexed so that an event is checked only against
    those that could match it: by id for id filters, by their first tag for tag filters
    (a relay sends thousands of events for a REQ of ten filters with hundreds of values).
    ``matching`` gives the same answer as ``[i for i, f in enumerate(filters) if f.matches(e)]``.

    An index entry is the filter's number, or a tuple of numbers when several filters share
    the value: open subscriptions carry hundreds of thousands of values, and a list per value
    was most of their memory.
    """

    __slots__ = ("filters", "_by_id", "_by_tag", "_always", "_left")

    def __init__(self, filters):
        self.filters = tuple(filters)
        self._by_id: dict[str, int | tuple[int, ...]] = {}
        self._by_tag: dict[str, dict[str, int | tuple[int, ...]]] = {}
        self._always: list[int] = []
        # What is left to check once the index found a filter: (since, until) when that is
        # all (the usual historic filter: one tag, perhaps a page's until), else None.
        self._left: list[tuple[int | None, int | None] | None] = []
        for i, f in enumerate(self.filters):
            if f.ids is not None:
                _index_all(self._by_id, f.ids, i)
                decided = f.authors is None and f.kinds is None and not f.tags
            elif f.tags:
                name, values = f.tags[0]
                _index_all(self._by_tag.setdefault(name, {}), values, i)
                decided = f.authors is None and f.kinds is None and len(f.tags) == 1
            else:
                self._always.append(i)
                decided = False
            self._left.append((f.since, f.until) if decided else None)

    def matching(self, event: Event) -> tuple[int, ...]:
        """Indices of the filters ``event`` matches, in order."""
        candidates = list(self._always)
        found = self._by_id.get(event.id)
        if found is not None:
            if type(found) is int:
                candidates.append(found)
            else:
                candidates += found
        by_tag = self._by_tag
        if by_tag:
            for tag in event.tags:
                if len(tag) >= 2:
                    index = by_tag.get(tag[0])
                    if index is not None:
                        found = index.get(tag[1])
                        if found is not None:
                            if type(found) is int:
                                candidates.append(found)
                            else:
                                candidates += found
        if not candidates:
            return ()
        if len(candidates) > 1:
            candidates = sorted(set(candidates))
        created_at = event.created_at
        out = []
        for i in candidates:
            left = self._left[i]
            if left is None:
                if self.filters[i].matches(event):
                    out.append(i)
            elif (left[0] is None or created_at >= left[0]) and (left[1] is None or created_at <= left[1]):
                out.append(i)
        return tuple(out)

    def newer_than_until(self, event: Event) -> tuple[int, ...]:
        """The indices of the filters that match ``event`` but for its time bounds, when
        every one of them would have matched it but for its ``until`` alone (the event is
        newer); else none. Only asked of an event ``matching`` found no filter for."""
        near = [(i, f) for i, f in enumerate(self.filters) if f.matches(event, in_time=False)]
        at = event.created_at
        if all(f.until is not None and at > f.until and (f.since is None or at >= f.since) for _, f in near):
            return tuple(i for i, _ in near)
        return ()

    def matches_apart_from_time(self, event: Event) -> bool:
        """Whether a filter would match ``event`` but for its ``since``/``until``: what a
        relay that ignores them, or reads them otherwise (an exclusive ``until``), sends.
        Only asked of an event ``matching`` found no filter for."""
        return any(f.matches(event, in_time=False) for f in self.filters)


def _index_all(index: dict, values, i: int) -> None:
    """Add filter ``i`` under each of ``values``. The filters of a REQ rarely share a value
    (chunks of one list), and then the whole set goes in at once."""
    if index.keys().isdisjoint(values):
        index.update(dict.fromkeys(values, i))
    else:
        for value in values:
            _index(index, value, i)


def _index(index: dict, value: str, i: int) -> None:
    """Add filter ``i`` under ``value``: a bare number, a tuple once shared."""
    found = index.get(value)
    if found is None:
        index[value] = i
    elif type(found) is int:
        if found != i:
            index[value] = (found, i)
    elif i not in found:
        index[value] = (*found, i)
