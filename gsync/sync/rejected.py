"""Rejected index: events the own relay refused for good, so they are never fetched again.

Pure (time passed in; persistence is text in and out). Hot tier: full events for two minutes,
so a dependency that arrives soon after can have them re-delivered at once. Cold tier: ids
for seven days, saved in ``state_dir`` across restarts, each with the relay it came from;
cold ids whose event is gone are re-fetched from that relay when a dependency arrives
(SPEC §5).

**Dependencies.** A GRASP-01 relay refuses some events only for now: an announcement or a
state event whose author is not (yet) a maintainer of a repository with that ``d``, and an
event that names no repository it hosts, or replies to no event it holds ("orphans"). Each
entry keeps the keys of what it may be waiting for (``dependencies``), and the manager
releases a key when that thing is accepted by the own relay: ``maintainer_key(p, d)`` when
an announcement for ``d`` lists ``p`` as a maintainer, ``repo_key(address)`` when that
repository is accepted, ``event_key(id)`` when that root event is. A released entry leaves
the index, so nothing excludes it from sync any more; a new refusal puts it back.
"""
from __future__ import annotations

import heapq
import json
import re

from ..constants import (
    MAX_DEPENDENCIES,
    REJECTED_COLD_SECS,
    REJECTED_HOT_SECS,
    REJECTED_MAX_BYTES,
    REJECTED_MAX_ENTRIES,
    REJECTED_MAX_VALUE_CHARS,
    RELEASE_BEHIND_OTHERS_SECS,
    ROOT_KINDS,
    STORE_PROBE_FIRST_SECS,
    STORE_PROBE_MAX_SECS,
)
from ..protocol.event import Event
from ..protocol.filters import Filter
from .have_index import INDEXED_TAGS, HaveIndex

ANNOUNCEMENT_KIND = 30617
STATE_KIND = 30618
REPO_TAGS = ("a", "A", "q")  # values `30617:<pubkey>:<d>` name a repository
EVENT_TAGS = ("e", "E", "q")  # hex values reference an event
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
FORMAT_VERSION = 2
# The tags gsync's sync filters select by (state ``d``; repositories ``a``/``A``/``q``;
# threads ``e``/``E``/``q``): a cold entry keeps their values, so whether a filter could
# match it is known after the full event is gone, across restarts too (the have index
# indexes the same tags).
FILTER_TAGS = INDEXED_TAGS
MAX_REFS = 32  # tag values kept per entry: a hostile event cannot make an entry large


# The release key of events the own relay may have refused with everything else: refused
# finally (a relay put read-only refuses all so), or given up while it refused everything (a
# full disk, a broken database: ``error:`` to each of ten attempts over an hour, nothing
# stored since the first). Released when it stores an event again.
OWN_STORES_KEY = "own-relay-stores"
# The release key of an event dated ahead of the clock when refused (a relay refuses what is
# too far in the future, NIP-22: strfry past 15 minutes): released once its time has come
# (``RejectedIndex.due``), not a week later. Only for a time within the index's week.
TIME_KEY_PREFIX = "time:"
AHEAD_SECS = 60  # dated this far ahead of the clock, or more: it waits for its time too
STORE_RELEASES_MAX = 3  # releases of one event by the own relay storing again, at most
STORE_RELEASED_KEPT = 10_000


def maintainer_key(pubkey: str, identifier: str) -> str:
    return f"maintainer:{pubkey}:{identifier}"


def repo_key(address: str) -> str:
    return f"repo:{address}"


def event_key(event_id: str) -> str:
    return f"event:{event_id}"


def author_key(pubkey: str) -> str:
    """Entries saved before dependencies were recorded (format 1) wait on their author."""
    return f"author:{pubkey}"


def names_repo(name: str, value: str) -> bool:
    """Does a tag ``[name, value, …]`` name a repository (``a``/``A``/``q`` of ``30617:…``)?"""
    return name in REPO_TAGS and value.startswith(f"{ANNOUNCEMENT_KIND}:")


def repo_addresses(event: Event, cap: int = MAX_DEPENDENCIES) -> list[str]:
    """The repositories ``event`` names (``names_repo``), at most ``cap`` of them: a hostile
    event cannot make its refusal costly."""
    out: dict[str, None] = {}
    for tag in event.tags:
        if len(out) >= cap:
            break
        if len(tag) >= 2 and names_repo(tag[0], tag[1]):
            out[tag[1]] = None
    return list(out)


def dependencies(event: Event, cap: int = MAX_DEPENDENCIES, repos=()) -> tuple[str, ...]:
    """What the own relay may be missing to accept ``event``, as release keys.

    An announcement or state event waits for its author to become a maintainer of ``d``; a
    state event also for its own repository to be accepted. Any event waits for the
    repositories it names and the events it references, and for ``repos`` (those it belongs
    to without naming them: a comment names its issue). Bounded: a hostile event cannot make
    an entry large.
    """
    keys: dict[str, None] = {}
    if event.kind in (ANNOUNCEMENT_KIND, STATE_KIND):
        keys[maintainer_key(event.pubkey, event.d_tag)] = None
    if event.kind == STATE_KIND:
        keys[repo_key(f"{ANNOUNCEMENT_KIND}:{event.pubkey}:{event.d_tag}")] = None
    for tag in event.tags:
        if len(keys) >= cap:
            break
        if len(tag) < 2:
            continue
        name, value = tag[0], tag[1]
        if names_repo(name, value):
            keys[repo_key(value)] = None
        elif name in EVENT_TAGS and _HEX64.match(value):
            keys[event_key(value)] = None
    for address in repos:
        if len(keys) >= cap:
            break
        keys[repo_key(address)] = None
    # a key past the bound is not kept: its entry is released by the others, or expires
    return tuple(k for k in keys if len(k) <= REJECTED_MAX_VALUE_CHARS)[:cap]


def filter_refs(event: Event) -> tuple[tuple[str, str], ...] | None:
    """The (name, value) pairs of ``event``'s tags that sync filters select by; None (may
    match any filter: stored loose) past MAX_REFS of them, or with a value longer than
    REJECTED_MAX_VALUE_CHARS (a 64 KiB tag must not make the entry 64 KiB)."""
    refs = tuple((t[0], t[1]) for t in event.tags if len(t) >= 2 and t[0] in FILTER_TAGS)
    if len(refs) > MAX_REFS or any(len(value) > REJECTED_MAX_VALUE_CHARS for _, value in refs):
        return None
    return refs


class _Cold:
    """One cold entry: enough for the negentropy have-set, a re-fetch, a release, and to
    tell which filters may match it (``kind``, ``pubkey``, ``tags``: the filter tags'
    values; None when unknown — saved by an older gsync, or too many tags to keep — then it
    may match any filter)."""

    __slots__ = ("created_at", "rejected_at", "relay", "keys", "kind", "pubkey", "tags", "size")
    compact = True  # tags outside FILTER_TAGS are not kept (have_index.may_match)

    def __init__(self, created_at: int, rejected_at: float, relay: str, keys: tuple[str, ...],
                 kind: int | None = None, pubkey: str | None = None, tags=None):
        self.created_at = created_at
        self.rejected_at = rejected_at
        self.relay = relay  # where it came from ("" unknown): a re-fetch asks there
        self.keys = keys
        self.kind = kind
        self.pubkey = pubkey
        self.tags = tags
        # bytes it stands for (its saved row, about): what REJECTED_MAX_BYTES counts
        self.size = 150 + len(relay) + sum(len(k) + 4 for k in keys) + (
            sum(len(n) + len(v) + 8 for n, v in tags) if tags else 0)

    def row(self) -> str:
        """The saved form: ``[created_at, rejected_at, relay, [keys], kind, pubkey,
        [[tag, value], …] or null]``."""
        return json.dumps([self.created_at, self.rejected_at, self.relay, list(self.keys), self.kind,
                           self.pubkey, None if self.tags is None else [list(t) for t in self.tags]],
                          separators=(",", ":"))

    @classmethod
    def from_row(cls, text: str) -> _Cold:
        created_at, at, relay, keys, kind, pubkey, refs = json.loads(text)
        return cls(int(created_at), float(at), str(relay),
                   tuple(str(k) for k in keys[:MAX_DEPENDENCIES]),
                   None if kind is None else int(kind), None if pubkey is None else str(pubkey),
                   None if refs is None else tuple((str(n), str(v)) for n, v in refs[:MAX_REFS]))


class RejectedIndex:
    def __init__(self, hot_secs: float = REJECTED_HOT_SECS, cold_secs: float = REJECTED_COLD_SECS,
                 max_entries: int = REJECTED_MAX_ENTRIES, max_bytes: int = REJECTED_MAX_BYTES):
        self.hot_secs = hot_secs
        self.cold_secs = cold_secs
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0  # the cold entries' sizes, together
        self._hot: dict[str, tuple[Event, float]] = {}  # id → (event, hot until)
        self._cold: dict[str, _Cold] = {}
        self._by_key: dict[str, set[str]] = {}  # release key → ids waiting on it
        self._index = HaveIndex()  # the cold entries, by what filters select on
        self.dirty = False
        self._changed: set[str] = set()  # ids added or removed since the last take_changes
        self._expiry = float("inf")  # no entry expires before this (expire's scans skipped until)
        # id -> times released by the own relay storing again (``OWN_STORES_KEY``): refused
        # with everything that often, they wait out the week (an error of their own, in a
        # quiet hour, would otherwise go round at every store; a disk that fills again gets
        # a few rounds); the newest STORE_RELEASED_KEPT ids
        self._store_released: dict[str, int] = {}
        self._times: list[tuple[int, str]] = []  # (time, time key) of entries waiting on one (``due``)
        # the next probe of the own relay storing again (``take_store_probe``), its gap, and
        # the newest event waiting for it, kept past the hot tier (offered without a fetch)
        self._probe_at: float | None = None
        self._probe_gap = STORE_PROBE_FIRST_SECS
        self._probe_body: Event | None = None

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._cold

    def __len__(self) -> int:
        return len(self._cold)

    def add(self, event: Event, now: float, relay: str = "", until_own_stores: bool = False,
            repos=()) -> None:
        """``event``, refused by the own relay (fetched from ``relay``). ``until_own_stores``:
        maybe refused with everything else (a final refusal, which a relay put read-only
        gives everything; given up while it stored nothing: a full disk), so released as
        soon as it stores again (``OWN_STORES_KEY``; ``STORE_RELEASES_MAX`` times at most),
        not a week later. ``repos``: repositories it belongs to that it does not name (a
        comment names its issue; gsync knows the issue's repository): it waits for those to
        be accepted too (an own relay that lost the announcement refuses the comment)."""
        self.remove(event.id)
        self._hot[event.id] = (event, now + self.hot_secs)
        self._expiry = min(self._expiry, now + self.hot_secs)
        keys = dependencies(event, repos=repos)
        ahead = now + AHEAD_SECS <= event.created_at < now + self.cold_secs
        if until_own_stores and not ahead and self._store_released.get(event.id, 0) < STORE_RELEASES_MAX:
            # (dated ahead, it waits for its time alone: released at each store, it was
            # refused as too early again, and spent its rounds before its time: seed 460)
            keys = (OWN_STORES_KEY, *keys[:MAX_DEPENDENCIES - 1])
            self._probe_body = event
        if ahead:
            keys = (f"{TIME_KEY_PREFIX}{event.created_at}", *keys[:MAX_DEPENDENCIES - 1])
        self._put(event.id, _Cold(event.created_at, now, relay, keys,
                                  event.kind, event.pubkey, filter_refs(event)))

    def due(self, now: float) -> set[str]:
        """The time keys whose time has come and that entries still wait on: released now
        (``TIME_KEY_PREFIX``)."""
        out = set()
        times = self._times
        while times and times[0][0] <= now:
            _, key = heapq.heappop(times)
            if key in self._by_key:
                out.add(key)
        return out

    def waits_on(self, key: str) -> bool:
        """Does an entry wait on release key ``key``?"""
        return key in self._by_key

    def _put(self, event_id: str, entry: _Cold) -> None:
        while self._cold and (len(self._cold) >= self.max_entries
                              or self.bytes + entry.size > self.max_bytes):  # the oldest makes room
            self.remove(next(iter(self._cold)))
        self._cold[event_id] = entry
        self._expiry = min(self._expiry, entry.rejected_at + self.cold_secs)
        self.bytes += entry.size
        self._changed.add(event_id)
        self._index.add(event_id, entry)
        if self._probe_at is None and OWN_STORES_KEY in entry.keys:
            self._probe_at = entry.rejected_at + self._probe_gap
        for key in entry.keys:
            if key not in self._by_key and key.startswith(TIME_KEY_PREFIX) and key[len(TIME_KEY_PREFIX):].isdigit():
                heapq.heappush(self._times, (int(key[len(TIME_KEY_PREFIX):]), key))  # (once while waited on)
            self._by_key.setdefault(key, set()).add(event_id)
        if len(self._times) > 2 * len(self._cold) + 1000:  # (those no entry waits on any more, dropped)
            self._times = [(at, key) for at, key in self._times if key in self._by_key]
            heapq.heapify(self._times)
        self.dirty = True

    def remove(self, event_id: str) -> None:
        self._hot.pop(event_id, None)
        if self._probe_body is not None and self._probe_body.id == event_id:
            self._probe_body = None
        entry = self._cold.pop(event_id, None)
        if entry is None:
            return
        self.bytes -= entry.size
        self._changed.add(event_id)
        self._index.discard(event_id)
        for key in entry.keys:
            waiting = self._by_key.get(key)
            if waiting is not None:
                waiting.discard(event_id)
                if not waiting:
                    del self._by_key[key]
        self.dirty = True

    def items(self) -> list[tuple[int, str]]:
        """(created_at, id) of every entry."""
        return [(entry.created_at, eid) for eid, entry in self._cold.items()]

    def items_matching(self, flt: Filter) -> list[tuple[int, str]]:
        """(created_at, id) of the entries ``flt`` may match: they belong in its NIP-77
        "already have" set (indexed: the cost follows the filter, not the index)."""
        return self._index.matching(flt)

    def any_may_match(self, flt: Filter) -> bool:
        """Could ``flt`` match an entry? Then fetching it by REQ would bring refused events
        back: NIP-77 counts them as held (SPEC §5: never fetched again)."""
        return self._index.any_matching(flt)

    def take_dependents(self, keys, now: float) -> tuple[list[tuple[Event, str]], list[tuple[str, str]]]:
        """Entries waiting on any of ``keys``: ``(event, relay)`` still hot, to re-deliver
        now, and ``(id, relay)`` cold only, to re-fetch. Both leave the index."""
        ids = set()
        for key in keys:
            ids |= self._by_key.get(key, set())
        if OWN_STORES_KEY in keys:
            released = self._store_released
            for eid in self._by_key.get(OWN_STORES_KEY, ()):
                released[eid] = released.pop(eid, 0) + 1
            while len(released) > STORE_RELEASED_KEPT:
                del released[next(iter(released))]
            ids -= self._behind_others(ids, now)
        hot, cold = [], []
        for eid in sorted(ids):
            relay = self._cold[eid].relay
            entry = self._hot.get(eid)
            if entry is not None and entry[1] > now:
                hot.append((entry[0], relay))
            else:
                cold.append((eid, relay))
            self.remove(eid)
        return hot, cold

    def _behind_others(self, ids: set[str], now: float) -> set[str]:
        """Of ``ids``, released by the own relay storing again, those that wait on another of
        them: an event naming a repository whose announcement is released with it, one
        replying to a root released with it. They wait for that to be accepted (its
        ``repo_key`` or ``event_key``), no longer on the own relay storing: sent at once,
        before it is stored again (it is fetched again, or goes on another lane), a GRASP
        relay refuses them as of a repository it does not host, or as orphans, and they go
        round twice. Seed 276 of the per-filter stress mix: the own relay back empty, its disk
        full for three hours; at the first store 4,000 entries went at once and 2,900 were
        refused again. Not beyond ``RELEASE_BEHIND_OTHERS_SECS``: a time key releases them
        then, whatever came of what they wait on."""
        ahead = set()
        for eid in ids:
            entry = self._cold[eid]
            if entry.kind == ANNOUNCEMENT_KIND and entry.pubkey:
                prefix = f"maintainer:{entry.pubkey}:"
                ahead.update(repo_key(f"{ANNOUNCEMENT_KIND}:{entry.pubkey}:{key[len(prefix):]}")
                             for key in entry.keys if key.startswith(prefix))
            elif entry.kind in ROOT_KINDS:
                ahead.add(event_key(eid))
        if not ahead:
            return set()
        behind = {eid for eid in ids if not ahead.isdisjoint(self._cold[eid].keys)}
        until = f"{TIME_KEY_PREFIX}{int(now + RELEASE_BEHIND_OTHERS_SECS)}"
        for eid in behind:
            entry, hot = self._cold[eid], self._hot.get(eid)
            keys = (until, *(key for key in entry.keys if key != OWN_STORES_KEY))[:MAX_DEPENDENCIES]
            self.remove(eid)
            self._put(eid, _Cold(entry.created_at, entry.rejected_at, entry.relay, keys,
                                 entry.kind, entry.pubkey, entry.tags))
            if hot is not None:
                self._hot[eid] = hot
        return behind

    def own_stored(self) -> None:
        """The own relay stored an event anew: the next wait on it starts with a short gap
        between probes again."""
        self._probe_at = None
        self._probe_gap = STORE_PROBE_FIRST_SECS

    def take_store_probe(self, now: float) -> tuple[list[tuple[Event, str]], list[tuple[str, str]]]:
        """One entry waiting on ``OWN_STORES_KEY``, when its probe is due (``_put``: a gap
        after the first waited; then doubling to ``STORE_PROBE_MAX_SECS``): as
        ``take_dependents`` gives it (``_probe_order``: its full event if kept, else fetched
        again), not counted as a release. A probe refused waits as before; one stored
        releases the rest. (``_probe_body``, the newest added, is kept past the hot tier.)"""
        if self._probe_at is None or now < self._probe_at:
            return [], []
        waiting = self._by_key.get(OWN_STORES_KEY)
        if not waiting:
            self._probe_at = None
            return [], []
        self._probe_gap = min(STORE_PROBE_MAX_SECS, self._probe_gap * 2)
        self._probe_at = now + self._probe_gap
        eid = min(waiting, key=self._probe_order)
        body = self._probe_body if self._probe_body is not None and self._probe_body.id == eid else None
        if body is None and eid in self._hot and self._hot[eid][1] > now:
            body = self._hot[eid][0]
        relay = self._cold[eid].relay
        self.remove(eid)
        return ([(body, relay)], []) if body is not None else ([], [(eid, relay)])

    def _probe_order(self, eid: str) -> tuple:
        """Which waiting entry a probe offers first: an announcement, then a state or a root,
        then the rest (what others wait on goes before them: an issue offered while its
        announcement waited too was refused as of a repository not hosted, at every probe,
        and nothing else was ever offered: seed 304 of the per-filter stress mix, the own
        relay back empty after a full disk, its 2,460 refused events a week behind); among
        them the one refused longest ago (a probe refused again goes to the back: one refused
        for what it is does not hold the others back)."""
        entry = self._cold[eid]
        rank = 0 if entry.kind == ANNOUNCEMENT_KIND else 1 if entry.kind in (STATE_KIND, *ROOT_KINDS) else 2
        return rank, entry.rejected_at, eid

    def expire(self, now: float) -> list[str]:
        """Drop the full events past the hot tier and the entries past the cold one; the ids
        of those (refused ``cold_secs`` ago: they may be offered again)."""
        if now + 1.0 < self._expiry:
            return []  # nothing is due: no scan of every entry (this runs every tick)
        for eid in [e for e, (_, until) in self._hot.items() if until <= now]:
            del self._hot[eid]
        expired = [e for e, entry in self._cold.items() if now - entry.rejected_at >= self.cold_secs]
        for eid in expired:
            self.remove(eid)
        self._expiry = min(min((until for _, until in self._hot.values()), default=float("inf")),
                           min((e.rejected_at for e in self._cold.values()), default=float("inf")) + self.cold_secs)
        return expired

    # -- persistence (cold tier only) --------------------------------------------------

    def take_changes(self) -> tuple[list[tuple[str, str]], list[str]]:
        """What changed since the last call, to write by change (``ops.store``): rows to
        put ``(id, row)`` and ids to delete."""
        changed, self._changed = self._changed, set()
        self.dirty = False
        puts = [(eid, self._cold[eid].row()) for eid in changed if eid in self._cold]
        return puts, [eid for eid in changed if eid not in self._cold]

    def keep_changes(self, ids) -> None:
        """A save failed: ``ids`` are written with the next one."""
        self._changed.update(ids)

    @classmethod
    def from_rows(cls, rows, now: float, **kw) -> tuple[RejectedIndex, list[str]]:
        """The index saved as rows ``(id, row)``, and the ids of rows to delete: unreadable,
        expired, or past the index's bounds. Entries go in by refusal time, as they were
        added, so the next to make room is still the oldest refusal (rows come back in id
        order). A bad row costs that entry, never the rest."""
        index = cls(**kw)
        drop, entries = [], []
        for eid, text in rows:
            try:
                entry = _Cold.from_row(text)
            except (ValueError, KeyError, TypeError, IndexError):
                drop.append(eid)
                continue
            if isinstance(eid, str) and _HEX64.match(eid) and now - entry.rejected_at < index.cold_secs:
                entries.append((entry.rejected_at, eid, entry))
            else:
                drop.append(eid)
        index._put_in_refusal_order(entries)
        drop += [eid for eid in index._changed if eid not in index._cold]  # made room for newer
        index._changed = set()
        index.dirty = False
        return index, drop

    def _put_in_refusal_order(self, entries) -> None:
        entries.sort(key=lambda item: (item[0], item[1]))
        for _, eid, entry in entries:
            self._put(eid, entry)

    def dumps(self) -> str:
        """Format 2: relay URLs once in a table, entries ``id: [created_at, rejected_at,
        relay index or -1, [keys], kind, pubkey, [[tag, value], …]]``."""
        self.dirty = False
        relays: dict[str, int] = {}
        cold = {}
        for eid, entry in self._cold.items():
            index = relays.setdefault(entry.relay, len(relays)) if entry.relay else -1
            cold[eid] = [entry.created_at, entry.rejected_at, index, list(entry.keys),
                         entry.kind, entry.pubkey, None if entry.tags is None else list(entry.tags)]
        return json.dumps({"version": FORMAT_VERSION, "relays": list(relays), "cold": cold},
                          separators=(",", ":"))

    @classmethod
    def loads(cls, text: str, now: float, **kw) -> RejectedIndex:
        """A saved index (format 1 or 2); anything unreadable gives an empty one (losing it
        costs bandwidth, never events), an unreadable entry is skipped."""
        index = cls(**kw)
        try:
            saved = json.loads(text)
            cold, version = saved["cold"], saved.get("version", 1)
            relays = saved.get("relays", [])
            items = cold.items()
        except (ValueError, KeyError, TypeError, AttributeError):
            return index
        entries = []
        for eid, fields in items:
            try:
                entry = _load_entry(fields, version, relays)
            except (ValueError, KeyError, TypeError, IndexError):
                continue
            if isinstance(eid, str) and _HEX64.match(eid) and now - entry.rejected_at < index.cold_secs:
                entries.append((entry.rejected_at, eid, entry))
        index._put_in_refusal_order(entries)
        index.dirty = False
        return index


def _load_entry(fields, version: int, relays: list) -> _Cold:
    if version == 1:  # (created_at, kind, pubkey, rejected_at): released by author, no tags
        created_at, kind, pubkey, at = fields
        return _Cold(int(created_at), float(at), "", (author_key(str(pubkey)),), int(kind), str(pubkey))
    created_at, at, relay_index, keys, kind, pubkey, refs = fields
    relay = relays[relay_index] if relay_index >= 0 else ""
    return _Cold(int(created_at), float(at), str(relay),
                 tuple(str(k) for k in keys[:MAX_DEPENDENCIES]),
                 None if kind is None else int(kind), None if pubkey is None else str(pubkey),
                 None if refs is None else tuple((str(n), str(v)) for n, v in refs[:MAX_REFS]))
