"""Which filters read the own relay for what several batches are waiting to learn of it.

Every batch that may go by NIP-77 needs the own relay's holdings of its filters; what the
session does not know yet is read (``sync.own_held``). Read batch by batch, a first sync of
fifty relays made 459-1,740 read REQs of a few values each (``#a`` of a batch's
repositories, ``#d`` of their states, ``#e``/``#E``/``#q`` of new roots). An own relay whose
tag queries scan (a store in memory) spends about the same on a read of one value as on one
of hundreds: there the number of reads is the cost (issue 26). So the manager collects the
unread parts of every batch waiting within a short window (and while a read is under way)
and reads them together: one filter per (kinds, authors, tag name) carrying every unread
value of that tag, in chunks of ``budget`` tag-value bytes. Values two batches both lack
(one repository listed on several relays) are read once.

Pure: the manager passes the filters; no clock, no I/O.
"""
from __future__ import annotations

from ..protocol.filters import Filter
from .filter_plan import chunk_by_tag_bytes
from .have_index import INDEXED_TAGS


def merged_reads(reads, budget: int) -> list[Filter]:
    """The filters to read for ``reads`` (what each waiting batch lacks, as
    ``OwnHeld.missing`` gives it): those alike but for their one tag's values become one
    filter per ``budget`` bytes of their values (sorted: the same values make the same
    filters); any other filter is read as it is, once. In the order first seen."""
    groups: dict[tuple, tuple[Filter, str, set[str]]] = {}
    alone: dict[str, Filter] = {}
    order: list[tuple] = []
    for flt in reads:
        if mergeable(flt):
            name, values = flt.tags[0]
            key = (flt.replace(tags=()).to_json(), name)
            if key not in groups:
                groups[key] = (flt, name, set())
                order.append(("group", key))
            groups[key][2].update(values)
        else:
            key = flt.to_json()
            if key not in alone:
                alone[key] = flt
                order.append(("alone", key))
    out: list[Filter] = []
    for what, key in order:
        if what == "alone":
            out.append(alone[key])
            continue
        base, name, values = groups[key]
        out.extend(base.replace(tags=((name, frozenset(chunk)),))
                   for chunk in chunk_by_tag_bytes(values, budget))
    return out


def mergeable(flt: Filter) -> bool:
    """One indexed tag and nothing bounding it: its values may be read with others'."""
    return (flt.ids is None and flt.since is None and flt.until is None and flt.limit is None
            and len(flt.tags) == 1 and flt.tags[0][0] in INDEXED_TAGS and bool(flt.tags[0][1]))
