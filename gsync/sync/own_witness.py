"""Did the own relay lose what it stored? A few of its events, kept to ask it back.

An own relay that restarts may come back with less than it held: in memory, it holds
nothing; after a crash, it may have lost its last writes; restored from a backup, everything
since that copy. gsync is not told. Its catch-up after the outage asks each relay for what
was *published* since the outage began (``created_at``), but what the own relay lost was
what it *stored* lately or ever: a first sync stores history days or years old, which no
catch-up window reaches, and before this it came back only with each relay's daily fresh
start, up to a day later.

So gsync keeps witnesses: ids the own relay answered ``OK true`` to or showed (stored and
served), and asks it for them when it is back (one REQ). Any witness gone means a
loss of unknown extent: every relay then starts fresh (NIP-77 moves only what the own relay
lacks). Three kinds of witness, ``size`` each:

- the latest regular events stored (what a crash before its writes were flushed loses);
- a spread over every regular event stored this process: the ids that are smallest as
  numbers (an event id is a SHA-256, so the smallest of all are an even sample of all,
  whenever they were stored; no randomness, so the simulator replays it);
- the latest replaceable and addressable events stored (announcements, repository states),
  judged by their key: one is legitimately gone once a newer version of its key replaces it
  (a state every push), so it is asked by id and by its key (kind, author, ``d``), and is
  gone only if the own relay holds nothing of that key as new as it (a crash that lost the
  states a first sync stored, and nothing else, is found too).

An ephemeral event is never stored. An event the relay deletes or expires (NIP-09, NIP-40) is
legitimately gone: a witness found gone is dropped, so such an event costs at most one fresh
start (and only when the own relay comes back from an outage).

Pure: the own relay's side of the manager feeds it and asks the own relay.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict, deque

from ..protocol.filters import Filter

WITNESSES = 64  # of each kind: a REQ of at most 192 ids, under every relay's page size


def regular(kind: int) -> bool:
    """Stored for good (NIP-01): not replaceable, ephemeral or addressable."""
    return not (kind in (0, 3) or 10_000 <= kind < 40_000)


def keyed(kind: int) -> bool:
    """Replaceable or addressable: the newest of its key stays (NIP-01)."""
    return kind in (0, 3) or 10_000 <= kind < 20_000 or 30_000 <= kind < 40_000


def key_of(entry) -> tuple[int, str, str]:
    """(kind, author, ``d``) of a replaceable or addressable event (an ``Event`` or its
    ``HeldEntry``)."""
    addressable = 30_000 <= entry.kind < 40_000
    d = next((t[1] for t in entry.tags if len(t) >= 2 and t[0] == "d"), "") if addressable else ""
    return entry.kind, entry.pubkey, d


class OwnWitness:
    """The witnesses of one process (the module says which); ``size`` of each kind."""

    def __init__(self, size: int = WITNESSES):
        self.size = size
        self._latest: deque[str] = deque(maxlen=size)
        self._spread: list[tuple[int, str]] = []  # (-rank, id): the largest rank kept on top
        self._in_spread: set[str] = set()
        # id -> (key, created_at) of the latest replaceable and addressable events stored
        self._keyed: OrderedDict[str, tuple[tuple[int, str, str], int]] = OrderedDict()
        self.version = 0  # moved by every change (a state save snapshots it only when it moved)

    def stored(self, entries) -> None:
        """The own relay holds these: (event id, ``HeldEntry`` or ``Event``) pairs."""
        self.version += 1
        latest, spread, in_spread, size, keyed_ = self._latest, self._spread, self._in_spread, self.size, self._keyed
        for event_id, entry in entries:
            kind = entry.kind
            if not regular(kind):
                if keyed(kind):
                    keyed_[event_id] = (key_of(entry), entry.created_at)
                    keyed_.move_to_end(event_id)
                    if len(keyed_) > size:
                        keyed_.popitem(last=False)
                continue
            latest.append(event_id)  # (a repeat only narrows the sample)
            if event_id in in_spread:
                continue
            rank = _rank(event_id)
            if len(spread) < size:
                heapq.heappush(spread, (-rank, event_id))
                in_spread.add(event_id)
            elif -spread[0][0] > rank:  # smaller than the largest kept
                _, out = heapq.heapreplace(spread, (-rank, event_id))
                in_spread.discard(out)
                in_spread.add(event_id)

    def sample(self, keyed_too: bool = True) -> list[str]:
        """The ids to ask the own relay back for, latest first (``keyed_too``: with the
        replaceable and addressable ones, which only this process can judge: it knows
        their keys)."""
        asked = list(dict.fromkeys(reversed(self._latest)))  # (stored twice: asked once)
        seen = set(asked)
        asked += sorted(event_id for event_id in self._in_spread if event_id not in seen)
        if keyed_too:
            asked += [event_id for event_id in reversed(self._keyed) if event_id not in seen]
        return asked

    def snapshot(self) -> dict:
        """What the next process needs to judge these witnesses (``restore``): JSON-able."""
        return {"ids": self.sample(keyed_too=False),
                "keyed": [[event_id, *key, created_at]
                          for event_id, (key, created_at) in reversed(self._keyed.items())]}

    def restore(self, snapshot: dict) -> list[str]:
        """An earlier process's ``snapshot``: its keyed witnesses known here again; every id
        to ask the own relay for (``filters``), or none for a snapshot that does not parse."""
        self.version += 1
        try:
            ids = [i for i in snapshot.get("ids", ()) if isinstance(i, str)]
            keyed_ids = []
            for event_id, kind, author, d, created_at in snapshot.get("keyed", ())[:self.size]:
                if isinstance(event_id, str) and event_id not in self._keyed:
                    self._keyed[event_id] = ((int(kind), str(author), str(d)), int(created_at))
                    self._keyed.move_to_end(event_id, last=False)  # (older than what this one stores)
                    keyed_ids.append(event_id)
        except (AttributeError, TypeError, ValueError):
            return []
        while len(self._keyed) > self.size:
            self._keyed.popitem(last=False)
        return ids + [i for i in keyed_ids if i in self._keyed]  # (judged by key: known here)

    def filters(self, asked) -> list[Filter]:
        """How to ask the own relay for ``asked``: by id, and the keyed ones' keys too (the
        newest of each, which may have replaced a witness)."""
        keys = [self._keyed[i][0] for i in asked if i in self._keyed]
        out = [Filter.make(ids=asked)]
        addressable = [k for k in keys if k[0] >= 30_000]
        replaceable = [k for k in keys if k[0] < 30_000]
        if addressable:
            out.append(Filter.make(kinds={k for k, _, _ in addressable}, authors={a for _, a, _ in addressable},
                                   tags={"d": {d for _, _, d in addressable}}))
        if replaceable:
            out.append(Filter.make(kinds={k for k, _, _ in replaceable}, authors={a for _, a, _ in replaceable}))
        return out

    def judge(self, asked, held) -> list[str]:
        """The own relay answered ``held`` ((id, ``HeldEntry``) pairs of ``filters``) for
        ``asked``: the witnesses it lost, dropped (a deleted or expired one is gone for
        good: it must not look like a loss again). A keyed one whose key it holds as new
        or newer was replaced, not lost (dropped too: superseded)."""
        held_ids, newest = set(), {}
        for event_id, entry in held:
            held_ids.add(event_id)
            if keyed(entry.kind):
                key = key_of(entry)
                newest[key] = max(newest.get(key, -1), entry.created_at)
        gone, superseded = [], []
        for event_id in asked:
            if event_id in held_ids:
                continue
            witnessed = self._keyed.get(event_id)
            if witnessed is not None and newest.get(witnessed[0], -1) >= witnessed[1]:
                superseded.append(event_id)
            else:
                gone.append(event_id)
        dropped = set(gone) | set(superseded)
        if dropped:
            self.version += 1
            self._latest = deque((e for e in self._latest if e not in dropped), maxlen=self.size)
            self._spread = [pair for pair in self._spread if pair[1] not in dropped]
            heapq.heapify(self._spread)
            self._in_spread -= dropped
            for event_id in dropped:
                self._keyed.pop(event_id, None)
        return gone


def _rank(event_id: str) -> int:
    """An id's place among all ids (the first 16 hex digits as a number; a malformed id,
    which the own relay would not have stored, ranks last)."""
    try:
        return int(event_id[:16], 16)
    except ValueError:
        return 1 << 64
