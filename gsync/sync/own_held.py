"""What the own relay holds, as far as this session knows it: the "already have" side of
every NIP-77 exchange, read from the own relay once and then kept (SPEC §4).

Every exchange needs the own relay's holdings for its filter. Read per exchange, that was
a REQ the own relay had to evaluate for every filter on every remote listing a repository:
thousands in a large first sync, the own relay (the operator's production relay) spending
most of a core on gsync's reads. Here a filter's holdings are read once per session and
then known: the events a read returned, and every event the own relay has since answered
``OK true`` to (``duplicate:`` included; never a ``purgatory:`` answer, which may still be
dropped, nor a refusal).

What is known is tracked by *coverage unit*: a filter's kinds and authors with one of its
tag values (``#a`` of one repository, ``#e`` of one root), or its kinds and authors alone
for a filter without tags. A filter is answered from here when every unit of it was read
within ``ttl`` (a day: the daily fresh start reads again); the answer is then the indexed
events the filter matches, so filters packed differently on each remote (roots chunked by
size, merged exchanges, one crowded second) reuse what any of them read.

The property that matters: never claim an event the own relay lacks (a claimed event is
never fetched). Events published to the own relay directly after a read are not known: an
exchange then fetches them again and the own relay answers ``duplicate`` (a copy, never a
loss). An own-relay outage may have lost anything (a relay that restarts in memory holds
nothing after): ``forget`` drops everything, and the next exchanges read again.

An event the own relay stores anew (``new_threads``: gsync delivered it and it was not
known to be held, or another shard's landed stream showed it) had nothing tagging it there
but what is stored from now on, which comes as it is stored (OK answers, the landed stream):
every filter asking what tags it by ``#e``, ``#E`` or ``#q`` (a root's thread, a direct
member's descendants) is known without a read. One id per event, not a unit per tag. A
reply the own relay took before its parent is not known: fetched again (``duplicate``).

Pure: the manager owns it, passes ``now``, and feeds it reads and confirmations.
"""
from __future__ import annotations

from ..protocol.filters import Filter
from .have_index import INDEXED_TAGS, HaveIndex

THREAD_TAGS = frozenset("eEq")  # what tags an event: a root's thread, a member's descendants

Unit = tuple  # (kinds, authors, tag name or None, tag value or None)


class HeldEntry:
    """One held event, compact: what filters select on (indexed tags only)."""

    __slots__ = ("created_at", "kind", "pubkey", "tags")
    compact = True  # only INDEXED_TAGS kept: every filter gsync builds selects on those

    def __init__(self, created_at: int, kind: int, pubkey: str, tags: tuple):
        self.created_at = created_at
        self.kind = kind
        self.pubkey = pubkey
        self.tags = tags

    @classmethod
    def of(cls, event) -> HeldEntry:
        """From an ``Event`` or a raw event dict."""
        if isinstance(event, dict):
            created_at, kind, pubkey, tags = event["created_at"], event["kind"], event["pubkey"], event["tags"]
        else:
            created_at, kind, pubkey, tags = event.created_at, event.kind, event.pubkey, event.tags
        kept = tuple((t[0], t[1]) for t in tags
                     if isinstance(t, list | tuple) and len(t) >= 2 and t[0] in INDEXED_TAGS)
        return cls(created_at, kind, pubkey, kept)


def coverage_units(flt: Filter) -> list[Unit] | None:
    """The units a read of ``flt`` covers (and a holdings answer for it needs); None for
    a filter this cannot answer (ids, several tags, a tag that is not indexed)."""
    if flt.ids is not None or len(flt.tags) > 1:
        return None
    base = (flt.kinds, flt.authors)
    if not flt.tags:
        return [(*base, None, None)]
    name, values = flt.tags[0]
    if name not in INDEXED_TAGS:
        return None
    return [(*base, name, value) for value in values]


class OwnHeld:
    def __init__(self, ttl: float, max_entries: int, on_learn=None):
        self.ttl = ttl
        self.max_entries = max_entries
        self._index = HaveIndex()
        self._covered: dict[Unit, float] = {}  # unit -> when it was read
        self._new: dict[str, float] = {}  # event id -> when stored anew (``new_threads``)
        self._reading: dict[Unit, int] = {}  # unit -> reads of it under way
        self.forgotten = 0  # times everything was dropped (outage, bound reached)
        self.on_learn = on_learn  # told what each read returned, ``(id, HeldEntry)`` pairs (thread members)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, event_id: str) -> bool:
        """Is the event known to be held (read, or answered ``OK true``)?"""
        return event_id in self._index

    @property
    def units(self) -> int:
        return len(self._covered)

    def holdings(self, flt: Filter, now: float) -> list[tuple[int, str]] | None:
        """(created_at, id) of what the own relay holds of ``flt``, or None when some of it
        has not been read this session (within ``ttl``): then it must be read."""
        units = coverage_units(flt)
        if not units:
            return None
        for unit in units:
            read_at = self._known_at(unit)
            if read_at is None or now - read_at >= self.ttl:
                return None
        return self._index.matching(flt.replace(limit=None))

    def _known_at(self, unit: Unit) -> float | None:
        """When ``unit`` was read, or its event stored anew (None: neither)."""
        read_at = self._covered.get(unit)
        if read_at is None and unit[2] in THREAD_TAGS:
            return self._new.get(unit[3])
        return read_at

    def missing(self, flt: Filter, now: float) -> Filter | None:
        """What must still be read of the own relay for ``flt``: None when all of it is
        known; else ``flt`` narrowed to the tag values not read yet (or ``flt`` itself, for
        a filter this cannot answer). Remotes list different repositories, so one relay's
        filter is mostly values another relay's read already covered."""
        units = coverage_units(flt)
        if not units:
            return flt
        known_at = self._known_at
        unread = [unit for unit in units
                  if (read_at := known_at(unit)) is None or now - read_at >= self.ttl]
        if not unread:
            return None
        if len(unread) == len(units) or unread[0][2] is None:
            return flt
        name = unread[0][2]
        return flt.replace(tags=((name, frozenset(unit[3] for unit in unread)),))

    def unread(self, flt: Filter, now: float) -> Filter | None:
        """``missing``, less what a read under way will teach: what a read of ``flt`` must
        still ask now (None: nothing)."""
        narrowed = self.missing(flt, now)
        if narrowed is None or not self._reading:
            return narrowed
        units = _unbounded_units(narrowed)
        if not units:
            return narrowed
        left = [unit for unit in units if unit not in self._reading]
        if not left:
            return None
        if len(left) == len(units) or left[0][2] is None:
            return narrowed
        return narrowed.replace(tags=((left[0][2], frozenset(unit[3] for unit in left)),))

    def begin(self, flt: Filter) -> None:
        """A read of ``flt`` is under way: a filter needing its units ``awaits`` it."""
        for unit in _unbounded_units(flt):
            self._reading[unit] = self._reading.get(unit, 0) + 1

    def end(self, flt: Filter) -> None:
        """That read ended, learnt or not (an outage meanwhile, a failure)."""
        for unit in _unbounded_units(flt):
            left = self._reading.get(unit, 0) - 1
            if left > 0:
                self._reading[unit] = left
            else:
                self._reading.pop(unit, None)

    def awaits(self, flt: Filter, now: float) -> bool:
        """Is a unit of ``flt`` that is not known being read right now? Then a read of
        ``flt`` waits for that one instead of reading the same values again."""
        if not self._reading:
            return False
        known_at = self._known_at
        return any(unit in self._reading
                   and ((read_at := known_at(unit)) is None or now - read_at >= self.ttl)
                   for unit in _unbounded_units(flt))

    def learn(self, flt: Filter, events, now: float) -> None:
        """A read of ``flt`` (every event the own relay holds of it, as raw dicts, ``Event``s
        or (id, ``HeldEntry``) pairs): its units are known from ``now``."""
        units = coverage_units(flt)
        if units is None or flt.since is not None or flt.until is not None:
            return  # a bounded read covers part of its units only
        entries = [_id_and_entry(event) for event in events]
        for entry in entries:
            self._add(*entry)
        for unit in units:
            self._covered[unit] = now
        self._bound()
        if self.on_learn is not None:
            self.on_learn(entries)

    def confirm(self, events) -> None:
        """Events the own relay answered ``OK true`` to (stored and served): held."""
        for event in events:
            self._add(*_id_and_entry(event))
        self._bound()

    def new_threads(self, event_ids, now: float) -> None:
        """The own relay stored these events anew (or is storing them, sent by gsync, which
        did not know them held): what tags them is known from ``now`` (module docstring)."""
        new = self._new
        for event_id in event_ids:
            new[event_id] = now
        self._bound()

    def not_new(self, event_ids) -> None:
        """These were held already (answered ``duplicate``): what tags them may be too."""
        new = self._new
        for event_id in event_ids:
            new.pop(event_id, None)

    def forget(self) -> None:
        """Nothing known is to be trusted any more (an own-relay outage): read again."""
        if self._covered or self._new or len(self._index):
            self.forgotten += 1
        self._index = HaveIndex()
        self._covered = {}
        self._new = {}

    def _add(self, event_id: str, entry: HeldEntry) -> None:
        self._index.add(event_id, entry)

    def _bound(self) -> None:
        """Held past ``max_entries``: start over (reads come back as needed) rather than
        grow with uptime."""
        if len(self._index) > self.max_entries or len(self._new) > self.max_entries:
            self.forget()


def _unbounded_units(flt: Filter) -> list[Unit]:
    """The units a read of ``flt`` will teach (a bounded read teaches none)."""
    if flt.since is not None or flt.until is not None:
        return []
    return coverage_units(flt) or []


def _id_and_entry(event) -> tuple[str, HeldEntry]:
    if isinstance(event, tuple):
        return event
    if isinstance(event, dict):
        return event["id"], HeldEntry.of(event)
    return event.id, HeldEntry.of(event)
