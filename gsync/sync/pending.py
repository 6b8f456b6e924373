"""PendingBatch: one AddFilters' worth of historic sync in flight on one relay (SPEC §4).

Pure. The manager owns the batches; this module decides what each EOSE means (another
page, or that filter is done), when a batch is complete, and what to do when an exact-id
fetch after NIP-77 delivers less than the relay advertised. Items move to the confirmed
index only when the whole batch completes.

Pagination (REQ+EOSE fallback): a filter that got ``PAGE_THRESHOLD`` or more events before
EOSE may have more; its next page is the same filter with ``until`` = the oldest
``created_at`` it certainly returned. ``until`` is inclusive, so the boundary second is
fetched again: we remember the ids seen at it and, if a page brings nothing new and no older
event, step ``until`` one second further. Trade-off: when more than a relay's page size of
events share one second, those beyond the page cannot be reached by ``until`` at all; we skip
that second instead of looping forever, and leave them to NIP-77 on the next daily sync or to
live sync.

Several filters share a REQ. A relay caps each filter separately and sends the union,
de-duplicated, so an event two filters match may have been sent "for" the other one, from
further back in time than this filter's own page reached. Two things are certain: events
that match no other filter of the REQ were sent for this one, and the filter's own page is
its newest events, newer than any other event of it that arrived. So the oldest "own" event
is a safe ``until``, and so is the N-th newest matching event when the relay's page size is
at least N (``PageCap`` learns that bound from the own events of earlier pages). A filter
with neither is asked again alone, where every event is its own. Counting all matches for
the "maybe more" threshold errs towards one more page, never one fewer.

Relays cap events per filter, and the proactive gate paces REQ starts, so a REQ of ten
filters moves up to ten times what a REQ of one does for the same start. A filter that needs
another page and carries many tag values is therefore split, by value, to fill the next REQ
(``split_for_throughput``).
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..constants import (
    FETCH_BY_FILTER_MAX_HELD_FRACTION,
    MAX_FILTERS_PER_REQ,
    MAX_IDS_PER_REQ,
    PAGE_THRESHOLD,
    RESIDUAL_FALLBACK_MAX_FRACTION,
    RESIDUAL_FALLBACK_MIN_ADVERTISED,
)
from ..protocol.event import Event
from ..protocol.filters import Filter
from .targets import PendingItems


class SyncMethod(enum.Enum):
    REQ_EOSE = "req_eose"
    NEGENTROPY = "negentropy"


# -- pagination ---------------------------------------------------------------------------


@dataclass
class PageCap:
    """What we know of a relay's page size (events per filter per REQ): at least the most
    events one filter certainly returned in one page (its own events, below), and at least
    ``PAGE_THRESHOLD``, which the "fewer means done" rule assumes already."""

    floor: int = PAGE_THRESHOLD

    def observe(self, own_events: int) -> None:
        self.floor = max(self.floor, own_events)


@dataclass
class FilterPaginationState:
    """Progress of one OR filter of a grouped subscription, for the page being fetched."""

    original_filter: Filter
    page_filter: Filter  # original_filter with this page's until
    # (created_at, id) of every event that matched, its own or shared
    seen: list[tuple[int, str]] = field(default_factory=list)
    own_count: int = 0  # matched by no other filter of the REQ: certainly sent for this one
    own_min: int | None = None  # the oldest of those
    # ids already seen at page_filter.until on earlier pages: they are not progress
    boundary_ids: set[str] = field(default_factory=set)
    alone: bool = False  # the next page must be a REQ of its own

    @classmethod
    def start(cls, f: Filter) -> FilterPaginationState:
        return cls(original_filter=f, page_filter=f)

    @property
    def event_count(self) -> int:
        return len(self.seen)

    def record(self, event: Event, own: bool) -> None:
        """Count a matching event; ``own`` when no other filter of the REQ matches it."""
        self.seen.append((event.created_at, event.id))
        if own:
            self.own_count += 1
            if self.own_min is None or event.created_at < self.own_min:
                self.own_min = event.created_at

    def restarted(self) -> FilterPaginationState:
        return FilterPaginationState(
            self.original_filter, self.page_filter, boundary_ids=self.boundary_ids
        )

    def covered_until(self, cap: int) -> int | None:
        """The oldest ``created_at`` down to which this page certainly holds every event of
        the filter, or None if nothing is certain.

        The relay sent this filter's newest events, up to its page size, and the union
        brought some of other filters' too. Two bounds are safe: the oldest event no other
        filter matched (it was sent for this one), and, when the page size is at least
        ``cap``, the ``cap``-th newest event that matched (the filter's own newest events
        are newer than every other event of it that arrived). The older of the two wins.
        """
        bounds = [] if self.own_min is None else [self.own_min]
        if len(self.seen) >= cap:
            newest_first = sorted((t for t, _ in self.seen), reverse=True)
            bounds.append(newest_first[cap - 1])
        return min(bounds) if bounds else None

    def next_page(self, cap: int = PAGE_THRESHOLD) -> FilterPaginationState | None:
        """The state for the next page, or None when this filter is exhausted. ``cap``: a
        lower bound of the relay's page size (``PageCap.floor``)."""
        if self.page_filter.ids is not None:
            return None  # an exact-id answer is complete; shortfalls are residuals
        if len(self.seen) < PAGE_THRESHOLD:
            return None
        covered = self.covered_until(cap)
        if covered is None:
            # Everything it matched, another filter matched too, and too little of it to
            # use the page size: the same page again, alone, where all of it is its own.
            return FilterPaginationState(self.original_filter, self.page_filter,
                                         boundary_ids=self.boundary_ids, alone=True)
        ids_at = {i for t, i in self.seen if t == covered}
        until = self.page_filter.until
        at_boundary = until is not None and covered >= until
        if not at_boundary:
            next_until, boundary = covered, ids_at
        elif ids_at - self.boundary_ids:
            # Still inside one crowded second but seeing new ids: ask it once more.
            next_until, boundary = until, self.boundary_ids | ids_at
        else:
            # No progress: the relay keeps returning the same page. Skip that second.
            next_until, boundary = until - 1, set()
        since = self.original_filter.since
        if next_until < 0 or (since is not None and next_until < since):
            return None
        return FilterPaginationState(
            original_filter=self.original_filter,
            page_filter=self.original_filter.replace(until=next_until),
            boundary_ids=boundary,
        )

    def split(self, parts: int) -> list[FilterPaginationState]:
        """This page as up to ``parts`` filters over disjoint slices of its one tag's
        values, each with the same ``until`` (everything newer arrived already, for every
        slice). Filters with ids, several tags or a single value stay whole."""
        f = self.page_filter
        if parts < 2 or f.ids is not None or len(f.tags) != 1 or self.alone:
            return [self]
        name, values = f.tags[0]
        ordered = sorted(values)
        parts = min(parts, len(ordered))
        if parts < 2:
            return [self]
        size, extra = divmod(len(ordered), parts)
        pieces, start = [], 0
        for i in range(parts):
            end = start + size + (1 if i < extra else 0)
            original = self.original_filter.replace(tags=((name, frozenset(ordered[start:end])),))
            pieces.append(FilterPaginationState(
                original_filter=original,
                page_filter=original.replace(until=f.until),
                boundary_ids=set(self.boundary_ids),
            ))
            start = end
        return pieces


def split_for_throughput(states: list[FilterPaginationState], per_req: int):
    """Split the filters that need another page so that together they fill one REQ of
    ``per_req`` filters: each gets an equal share of the slots."""
    if not states:
        return []
    share = per_req // len(states)
    return [piece for s in states for piece in s.split(share)]


@dataclass
class PaginationState:
    """Per-filter progress for every OR filter carried by one subscription."""

    filters: list[FilterPaginationState]

    @property
    def page_filters(self) -> list[Filter]:
        return [s.page_filter for s in self.filters]

    def record(self, event: Event, matched_indices: tuple[int, ...] | None = None) -> bool:
        """Count ``event`` for every filter it matches; False if it matches none.
        ``matched_indices``: which of ``page_filters`` it matches, when already known."""
        if matched_indices is None:
            matched = [s for s in self.filters if s.page_filter.matches(event)]
        else:
            matched = [self.filters[i] for i in matched_indices]
        own = len(matched) == 1
        for s in matched:
            s.record(event, own)
        return bool(matched)


# -- residuals after NIP-77 --------------------------------------------------------------


class ResidualDecision(enum.Enum):
    DONE = "done"  # everything advertised arrived
    RETRY_RESIDUAL = "retry_residual"  # ask once more for the ids still missing
    SEMANTIC_FALLBACK = "semantic_fallback"  # exact-id fetch is unusable here: use REQ+EOSE
    FAIL = "fail"  # give up on the batch; missing ids go to recovery


def decide_residual(
    advertised: int, delivered: int, retried: bool, has_semantic_fallback: bool = True
) -> ResidualDecision:
    """What to do after an exact-id fetch pass delivered ``delivered`` of ``advertised``.

    Semantic fallback is kept for a material first-pass incompatibility (≥ 20 advertised,
    ≤ 10 % delivered): a relay that advertises inventory but cannot serve it by id. Small
    residuals (expiry, indexing lag, deletion) get one retry instead, and NIP-77 stays on.
    The layer-1 batch has no repos or roots to build semantic filters from.
    """
    if delivered >= advertised:
        return ResidualDecision.DONE
    if retried:
        return ResidualDecision.FAIL
    unusable = (
        advertised >= RESIDUAL_FALLBACK_MIN_ADVERTISED
        and delivered <= advertised * RESIDUAL_FALLBACK_MAX_FRACTION
    )
    if unusable and has_semantic_fallback:
        return ResidualDecision.SEMANTIC_FALLBACK
    return ResidualDecision.RETRY_RESIDUAL


def _first_then_numbered(sub_id: str):
    count = 0

    def name() -> str:
        nonlocal count
        count += 1
        return sub_id if count == 1 else f"{sub_id}.{count}"
    return name


def fetch_by_filter(need: int, held: int) -> bool:
    """After NIP-77 over one filter: fetch what is missing with the filter's own REQ pages
    rather than by id? Yes when more than one id fetch (300) is missing and the own relay
    holds at most a tenth of that for the filter (the REQ brings those again): a fresh own
    relay then fills in a few paced starts instead of one start per 300 events."""
    return need > MAX_IDS_PER_REQ and held <= need * FETCH_BY_FILTER_MAX_HELD_FRACTION


# -- the batch ---------------------------------------------------------------------------


@dataclass
class PendingBatch:
    """Historic sync of ``items`` on one relay; complete when no subscription is outstanding.

    ``outstanding_subs`` holds REQ subscription ids and, for NIP-77, any token the caller
    uses for the negentropy exchange itself (added without filters).
    """

    batch_id: int
    items: PendingItems
    method: SyncMethod = SyncMethod.REQ_EOSE
    outstanding_subs: set[str] = field(default_factory=set)
    pagination: dict[str, PaginationState] = field(default_factory=dict)
    failed: bool = False
    # NIP-77 hydration: ids the relay advertised that the own relay lacks, and arrivals.
    advertised_ids: set[str] = field(default_factory=set)
    received_ids: set[str] = field(default_factory=set)
    residual_retried: bool = False
    # filters NIP-77 found mostly missing: fetched by REQ after the last exchange
    fetch_by_filter: list[Filter] = field(default_factory=list)
    # An AddFilters batch whose REQs all still wait for the pacing gate may take in the next
    # AddFilters (``coalescable``), so that their filters share REQs; ``started`` ends that.
    coalescable: bool = False
    started: bool = False
    _retry_asked: int = 0  # residual size when the retry started

    # -- subscriptions

    def add_subscription(self, sub_id: str, filters: Iterable[Filter] = ()) -> None:
        self.outstanding_subs.add(sub_id)
        states = [FilterPaginationState.start(f) for f in filters]
        if states:
            self.pagination[sub_id] = PaginationState(states)

    def finish_subscription(self, sub_id: str) -> None:
        """The caller's own end for a filterless entry (e.g. the NIP-77 exchange)."""
        self.outstanding_subs.discard(sub_id)
        self.pagination.pop(sub_id, None)

    def rename_subscription(self, old: str, new: str) -> None:
        """Carry pagination over when the next page is sent under a fresh subscription id."""
        if old in self.outstanding_subs:
            self.outstanding_subs.discard(old)
            self.outstanding_subs.add(new)
        if old in self.pagination:
            self.pagination[new] = self.pagination.pop(old)

    def restart_page(self, sub_id: str) -> None:
        """The current page will be sent again (its sub was refused for rate): forget what
        it delivered so far, or re-delivered events would be counted twice."""
        state = self.pagination.get(sub_id)
        if state is not None:
            state.filters = [s.restarted() for s in state.filters]

    def split_subscription(self, sub_id: str, parts) -> list[tuple[str, list[Filter]]]:
        """Send ``sub_id``'s filters again as several REQs: ``parts`` is ``(new sub id,
        indices into its filters)`` each; filters in no part are dropped. For a REQ the
        relay refused or never finished as a whole, to find the filter at fault. Each
        part restarts the page it was on. Returns ``(new sub id, filters)`` to queue."""
        state = self.pagination.pop(sub_id, None)
        self.outstanding_subs.discard(sub_id)
        out = []
        for new_id, indices in parts:
            group = [state.filters[i].restarted() for i in indices] if state else []
            if not group:
                continue
            self.outstanding_subs.add(new_id)
            self.pagination[new_id] = PaginationState(group)
            out.append((new_id, [s.page_filter for s in group]))
        return out

    def filters_of(self, sub_id: str) -> list[Filter]:
        state = self.pagination.get(sub_id)
        return state.page_filters if state else []

    def record_event(self, sub_id: str, event: Event,
                     matched_indices: tuple[int, ...] | None = None) -> bool:
        """Count ``event`` for every filter of the sub it matches; False if it matches none.
        ``matched_indices`` saves matching again: which of ``filters_of(sub_id)`` it matches
        (the connection checked that already)."""
        if event.id in self.advertised_ids:
            self.received_ids.add(event.id)
        state = self.pagination.get(sub_id)
        return state is not None and state.record(event, matched_indices)

    def on_eose(self, sub_id: str, per_req: int = MAX_FILTERS_PER_REQ, pack=None,
                new_sub_id=None, cap: PageCap | None = None) -> list[tuple[str, list[Filter]]]:
        """The next pages after ``sub_id``'s EOSE, as ``(sub_id, filters)`` REQs to send;
        empty when every filter of the sub is done. Each REQ is an outstanding sub of the
        batch. The first keeps ``sub_id`` unless ``new_sub_id`` (a callable) names them all;
        ``pack`` groups filters into REQs (default: one REQ, ``per_req`` filters at most).
        ``cap`` is the relay's ``PageCap``, kept per connection: this page teaches it too.
        """
        state = self.pagination.get(sub_id)
        self.finish_subscription(sub_id)
        if state is None:
            return []
        cap = cap or PageCap()
        for s in state.filters:
            cap.observe(s.own_count)
        continuing = [n for n in (s.next_page(cap.floor) for s in state.filters) if n]
        shared = split_for_throughput([s for s in continuing if not s.alone], per_req)
        by_filter = {s.page_filter: s for s in shared}
        pack = pack or (lambda fs: [fs[i:i + per_req] for i in range(0, len(fs), per_req)])
        groups = [[s] for s in continuing if s.alone]
        if by_filter:
            groups += [[by_filter[f] for f in group] for group in pack(list(by_filter))]
        names = new_sub_id or _first_then_numbered(sub_id)
        pages = []
        for group in groups:
            name = names()
            self.outstanding_subs.add(name)
            self.pagination[name] = PaginationState(group)
            pages.append((name, [s.page_filter for s in group]))
        return pages

    def on_closed(self, sub_id: str) -> list[Filter]:
        """The relay ended a sub before EOSE: the batch cannot complete cleanly. Returns the
        filters the sub was carrying, for the caller's log or rebuild."""
        filters = self.filters_of(sub_id)
        if sub_id in self.outstanding_subs:
            self.failed = True
        self.finish_subscription(sub_id)
        return filters

    @property
    def is_complete(self) -> bool:
        return not self.outstanding_subs

    def mark_failed(self) -> None:
        self.failed = True

    # -- NIP-77 residuals

    def expect_ids(self, ids: Iterable[str]) -> None:
        """Ids the relay advertised (and the own relay lacks): fetched by id next."""
        self.advertised_ids |= set(ids)

    def residual_ids(self) -> set[str]:
        return self.advertised_ids - self.received_ids

    def residual_decision(self) -> ResidualDecision:
        """Decision for the fetch pass just finished (first pass, or the one retry)."""
        missing = len(self.residual_ids())
        if self.residual_retried:
            asked = self._retry_asked
        else:
            asked = len(self.advertised_ids)
        return decide_residual(asked, asked - missing, self.residual_retried, bool(self.items))

    def begin_residual_retry(self) -> set[str]:
        """Start the one retry; returns the ids to ask for again."""
        residual = self.residual_ids()
        self.residual_retried = True
        self._retry_asked = len(residual)
        return residual

    def switch_to_req_eose(self) -> None:
        """Semantic fallback: the caller now adds REQ+EOSE subs built from ``items``."""
        self.method = SyncMethod.REQ_EOSE
