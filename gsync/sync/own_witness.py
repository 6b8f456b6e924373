"""Did the own relay lose what it stored? A few of its events, kept to ask it back.

An own relay that restarts may come back with less than it held: in memory, it holds
nothing; after a crash, it may have lost its last writes; restored from a backup, everything
since that copy. gsync is not told. Its catch-up after the outage asks each relay for what
was *published* since the outage began (``created_at``), but what the own relay lost was
what it *stored* lately or ever: a first sync stores history days or years old, which no
catch-up window reaches, and before this it came back only with each relay's daily fresh
start, up to a day later.

So gsync keeps witnesses: ids the own relay answered ``OK true`` to or showed (stored and
served), and asks it for them when it is back (one REQ by id). Any witness gone means a
loss of unknown extent: every relay then starts fresh (NIP-77 moves only what the own relay
lacks). Two kinds of witness, ``size`` each:

- the latest stored (what a crash before its writes were flushed loses), in order;
- a spread over everything stored this process: the ids that are smallest as numbers (an
  event id is a SHA-256, so the smallest of all are an even sample of all, whenever they
  were stored; no randomness, so the simulator replays it).

Only regular events witness: a replaceable or addressable one is legitimately gone once a
newer version replaces it (a repository's state every push), an ephemeral one never stored.
An event the relay deletes or expires (NIP-09, NIP-40) is legitimately gone too: a witness
found gone is dropped, so such an event costs at most one fresh start (and only when the
own relay comes back from an outage).

Pure: the own relay's side of the manager feeds it and asks the own relay.
"""
from __future__ import annotations

import heapq
from collections import deque

WITNESSES = 64  # of each kind: a REQ of at most 128 ids, under every relay's page size


def regular(kind: int) -> bool:
    """Stored for good (NIP-01): not replaceable, ephemeral or addressable."""
    return not (kind in (0, 3) or 10_000 <= kind < 40_000)


class OwnWitness:
    """The witnesses of one process (the module says which); ``size`` of each kind."""

    def __init__(self, size: int = WITNESSES):
        self.size = size
        self._latest: deque[str] = deque(maxlen=size)
        self._spread: list[tuple[int, str]] = []  # (-rank, id): the largest rank kept on top
        self._in_spread: set[str] = set()

    def stored(self, entries) -> None:
        """The own relay holds these: (event id, kind) pairs."""
        latest, spread, in_spread, size = self._latest, self._spread, self._in_spread, self.size
        for event_id, kind in entries:
            if not regular(kind):
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

    def sample(self) -> list[str]:
        """The ids to ask the own relay back for, latest first."""
        asked = list(dict.fromkeys(reversed(self._latest)))  # (stored twice: asked once)
        seen = set(asked)
        asked += sorted(event_id for event_id in self._in_spread if event_id not in seen)
        return asked

    def judge(self, asked, held) -> list[str]:
        """The own relay answered ``held`` of ``asked``: the witnesses it lost, dropped (a
        deleted or expired one is gone for good: it must not look like a loss again)."""
        held = set(held)
        gone = [event_id for event_id in asked if event_id not in held]
        if gone:
            dropped = set(gone)
            self._latest = deque((e for e in self._latest if e not in dropped), maxlen=self.size)
            self._spread = [pair for pair in self._spread if pair[1] not in dropped]
            heapq.heapify(self._spread)
            self._in_spread -= dropped
        return gone


def _rank(event_id: str) -> int:
    """An id's place among all ids (the first 16 hex digits as a number; a malformed id,
    which the own relay would not have stored, ranks last)."""
    try:
        return int(event_id[:16], 16)
    except ValueError:
        return 1 << 64
