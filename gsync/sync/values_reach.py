"""Relays that answer a filter of many tag values with nothing, without a word.

A relay on an SQL event store (fiatjaf's eventstore for khatru and relayer: postgresql,
sqlite3, mysql) caps the tag values one filter may hold, all its tags' lists together
(``QueryTagsLimit``, 10 on sqlite3 by default). Past it, newer stores say so (a NOTICE "too
many tag values", read as any refusal of a filter's values: ``policy.values_cap_after``);
older ones build an empty query and answer nothing, and the REQ's EOSE comes as if the
filter matched nothing. gsync packs hundreds of roots or repositories into one list, so on
such a relay every wide filter's events, stored and exchanged by NIP-77 alike, never arrive.

What a relay answers tells how wide a list it reads (``values_reach``: the widest list of a
filter that brought something). When a filter wider than that brought nothing, the relay
is asked, once its sync has completed and once a day, an event it served, by its id and one of its tag values padded with
values nothing matches to the width in doubt (``proof_filter``): served, it reads that wide;
not served, it is asked narrower, between what it served and what it did not
(``next_width``), until the width it reads is found: its lists are cut to that from then on
(``RelayState.max_values_learned``, as a refusal of more teaches) and its sync starts again.
An event not served even at the narrowest width proves nothing (deleted since).

Pure: events and filters in, filters and widths out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..protocol.filters import Filter

# The tags a proof may ask by: single-letter tags every relay indexes (NIP-01), in the order
# tried (``d``: every announcement and state has one, and any string is a ``d``)
SEED_TAGS = ("d", "a", "e", "E", "A")
# A proof's padding: values no event carries (a ``d`` tag is any string)
PADDING_PREFIX = "gsync-values-proof-"


@dataclass(frozen=True)
class ValuesSeed:
    """An event the relay served, and one of its tag values: what a proof asks back."""

    event_id: str
    name: str
    value: str
    kind: int = 0
    author: str = ""


def seed_of(event, names: tuple[str, ...] = SEED_TAGS) -> ValuesSeed | None:
    """A proof's seed from ``event`` (a served ``Event``): its id and its first tag value
    of ``names``, in their order; None when it has none."""
    for name in names:
        for tag in event.tags:
            if len(tag) >= 2 and tag[0] == name and tag[1]:
                return ValuesSeed(event.id, name, tag[1], event.kind, event.pubkey)
    return None


def tag_width(f: Filter) -> int:
    """The tag values ``f`` holds, all its tags' lists together (what such a relay counts)."""
    return sum(len(values) for _, values in f.tags)


def proof_filter(seed: ValuesSeed, width: int) -> Filter:
    """The seed's event asked by its id, its kind, its author and its tag value among
    ``width`` values in all (as precise as a filter gets: a relay refusing filters that name
    no author, or scoring their precision, takes it)."""
    values = [seed.value, *(f"{PADDING_PREFIX}{i}" for i in range(1, max(1, width)))]
    return Filter.make(ids=[seed.event_id], kinds=[seed.kind], authors=[seed.author], tags={seed.name: values})


def next_width(served_at: int, unserved_at: int, reach: int = 0) -> int | None:
    """The width a proof asks next: its seed was served at ``served_at`` values at most (0:
    not yet) and not at ``unserved_at``; ``reach``: the widest list of a filter that brought
    something (the relay reads that wide). First the reach (served, the seed is there),
    then the geometric middle between the two. None when the search is over: they meet (``served_at`` is
    how wide the relay reads), or the seed went unserved at a width the relay reads (deleted
    since: no evidence)."""
    if served_at == 0 and 0 < unserved_at <= reach:
        return None
    if unserved_at - served_at <= 1:
        return None
    if served_at == 0:
        return reach if reach > 0 else max(1, unserved_at // 2)
    # (the geometric middle: caps are small numbers, 10 or 20, far below the hundreds asked)
    return min(unserved_at - 1, max(served_at + 1, round(math.sqrt(served_at * unserved_at))))
