"""PendingBatch: one AddFilters' worth of historic sync in flight on one relay (SPEC §4).

Pure. The manager owns the batches; this module decides what each EOSE means (another
page, or that filter is done), when a batch is complete, and what to do when an exact-id
fetch after NIP-77 delivers less than the relay advertised. Items move to the confirmed
index only when the whole batch completes.

Pagination (REQ+EOSE fallback): a filter whose page may have been cut short may have more;
its next page is the same filter with ``until`` = the oldest ``created_at`` it certainly
returned. ``until`` is inclusive, so the boundary second is fetched again: we remember the
ids seen at it and, if a page brings nothing new and no older event, step ``until`` one
second further. When more than a relay's page size of events share one second, those beyond the
page cannot be reached by ``until`` at all: paging skips that second instead of looping for
ever, and reports it (``CrowdedSecond``) so that the caller completes it another way: by
NIP-77 over that second where the relay has it, else by splitting the filter on a dimension
it enumerates (``split_crowded``), and what no split reaches is logged and counted.

Whether a page may have been cut short is what ``PageCap`` learns, per connection, from the
pages themselves (relays rarely say it in NIP-11): how many events the relay served one
filter, and one REQ, at most; and, from the confirming pages, which kind of cap cut a page.
A relay caps per filter (most: LocalRelay and strfry at 500), per REQ (all filters
together), or stops a slow query on a time budget. A page below every cap the relay has
shown is complete; a page at one of them, or a slow one, is confirmed by the next page.

Several filters share a REQ. A relay caps each filter separately and sends the union,
de-duplicated, so an event two filters match may have been sent "for" the other one, from
further back in time than this filter's own page reached. Two things are certain: events
that match no other filter of the REQ were sent for this one, and the filter's own page is
its newest events, newer than any other event of it that arrived. So the oldest "own" event
is a safe ``until``, and so is the N-th newest matching event when the relay serves every
filter of the REQ at least N (``PageCap.per_filter_bound``: not when a per-REQ cap may have
cut the page). A filter with neither is asked again alone, where every event is its own.
Counting all matches for the "maybe cut" test errs towards one more page, never one fewer.

Relays cap events per filter, and the proactive gate paces REQ starts, so a REQ of ten
filters moves up to ten times what a REQ of one does for the same start. A filter that filled
its page and carries many tag values is therefore split, by value, into the room its next REQ
has left (``start_queue.fill_by_splitting``). Only just before that REQ starts: by then the
batch's other queued pages (a later AddFilters' first pages, say) have taken what room they
need, and a split only fills the slots nothing else would use. (Split earlier, the pieces
would take every slot and push those pages to later starts; and pieces of a filter with few
events left each cost a slot for little.)
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from .. import constants
from ..constants import (
    MAX_FILTERS_PER_REQ,
    MIN_PAGE_CAP,
    PAGE_LIMIT,
    RESIDUAL_FALLBACK_MAX_FRACTION,
)
from ..protocol.event import Event
from ..protocol.filters import Filter
from . import batch_phase
from .batch_phase import BatchPhase, Step
from .filter_plan import value_slices
from .targets import PendingItems


class SyncMethod(enum.Enum):
    REQ_EOSE = "req_eose"
    NEGENTROPY = "negentropy"


class BatchKind(enum.Enum):
    """What a historic batch is for. SYNC and LAYER1 batches are historic sync proper (a
    relay is Syncing while one is pending); the others are upkeep, run for as long as a
    relay is connected and judged each on its own answer (they never share a batch)."""

    SYNC = "sync"  # AddFilters, catch-ups, thread members' history
    LAYER1 = "layer1"  # announcements and lists: every round of a relay begins with it
    RECOVERY = "recovery"  # a missing-event recovery attempt
    POLL = "poll"  # live coverage that did not fit the relay's budget, asked for by a poll
    PROBE = "probe"  # one filter of a shape the relay refused by policy: served again yet?
    AUDIT = "audit"  # what the open live subscriptions asked for: did they miss any? (hourly)

    @property
    def upkeep(self) -> bool:
        return self in (BatchKind.RECOVERY, BatchKind.POLL, BatchKind.PROBE, BatchKind.AUDIT)


# -- pagination ---------------------------------------------------------------------------


@dataclass
class PageCap:
    """How one relay connection cuts a REQ's answer short, learnt from its pages.

    Two lower bounds, from what it served: ``filter_served``, the most events one filter
    certainly got in one page (its own events: no other filter of the REQ matched them), and
    ``req_served``, the most events one REQ brought. A relay capping per filter at P has
    P >= filter_served, so a filter that matched fewer was not cut per filter; one capping
    per REQ at T has T >= req_served, so a REQ that brought fewer was not cut per REQ. Both
    are assumed to be at least ``MIN_PAGE_CAP``. A page is complete only when both say so:
    the first full page of a connection is confirmed (learning costs that one page), and so
    is a REQ that brings as many as the most the relay served one.

    Both tests hold for the whole connection, whatever the relay's cuts have shown: a relay
    may cap each filter and the REQ at once (each filter's newest 20, of their union the
    newest 60), and a cut one cap explains does not show that the other is not there. (The
    tests used to be narrowed to one kind once a proven cut ruled the other out; against
    such a relay, REQs of ten filters cut at 60 were then taken as complete: the simulator,
    seed 4 with imports, 42 comments left behind.) No page proves a cap absent: a filter
    that got as many as it matched may simply have had no more. A relay that stops slow
    queries cuts anywhere: every slow page is confirmed (``constants.TIME_CUT_SUSPECT_SECS``).
    """

    filter_served: int = 0
    req_served: int = 0
    # how the relay reads ``until``, once a page proved it: as exclusive (some do; a page
    # bounded to second T is then asked with ``until`` T + 1,
    # ``FilterPaginationState.until_shift``), or as NIP-01 says (inclusive)
    until_exclusive: bool = False
    until_inclusive: bool = False
    # it ignores ``until``: a page past the first brought events newer than it (the newest
    # again, ``RemoteMessage.past_until``). No page past a filter's first reaches older
    # events: what a first page could not hold is left to NIP-77 or to pieces of the filter
    # (``FilterPaginationState.unpaged``)
    until_ignored: bool = False
    # the ``limit`` its pages carry (``filter_plan.page_limit``): a page cut at it is full,
    # whatever an unlimited id fetch taught ``filter_served``
    page_limit: int = PAGE_LIMIT

    @property
    def until_shift(self) -> int:
        return 1 if self.until_exclusive else 0

    @classmethod
    def per_filter(cls, size: int) -> PageCap:
        """What a connection knows once it has seen a relay serve a filter ``size`` and a
        REQ of ten such filters all of theirs."""
        return cls(filter_served=size, req_served=MAX_FILTERS_PER_REQ * size)

    def observe(self, own_events: int, total: int | None = None) -> None:
        """One filter's own events in one page (and, once per page, the REQ's total)."""
        self.filter_served = max(self.filter_served, own_events)
        if total is not None:
            self.req_served = max(self.req_served, total)

    def req_maybe_cut(self, total: int, slow: bool = False) -> bool:
        """Could a per-REQ cap (or a time budget) have cut this REQ's answer?"""
        return slow or total >= max(MIN_PAGE_CAP, self.req_served)

    def filled(self, matched: int) -> bool:
        """Did a filter that matched this many fill a page, if the relay caps per filter (it
        likely has far more: worth splitting across a REQ)?"""
        return matched >= max(MIN_PAGE_CAP, min(self.filter_served, self.page_limit))

    def maybe_cut(self, matched: int, total: int, slow: bool = False) -> bool:
        """Could this filter's page (``matched`` events, in a REQ of ``total``) be cut?"""
        return self.req_maybe_cut(total, slow) or self.filled(matched)

    def per_filter_bound(self, total: int, slow: bool = False) -> int:
        """How many of its newest events every filter of this REQ certainly got (0: no
        bound): ``filter_served`` on a relay capping per filter, unless a per-REQ cap or a
        time budget may have cut the REQ."""
        return 0 if self.req_maybe_cut(total, slow) else min(self.filter_served, self.page_limit)


@dataclass
class FilterPaginationState:
    """Progress of one OR filter of a grouped subscription, for the page being fetched."""

    original_filter: Filter
    page_filter: Filter  # original_filter with this page's until
    # (created_at, id) of every event that matched, its own or shared
    seen: list[tuple[int, str]] = field(default_factory=list)
    own_count: int = 0  # matched by no other filter of the REQ: certainly sent for this one
    own_min: int | None = None  # the oldest of those
    own_at_until: bool = False  # one of them at the second this page is bounded to
    # ids already seen at page_filter.until on earlier pages: they are not progress
    boundary_ids: set[str] = field(default_factory=set)
    # None: the boundary ids are this filter's; n: those of the filter this one is one of n
    # pieces of (each piece holds some of them, or none); -1: not known whose
    boundary_shared: int | None = None
    alone: bool = False  # the next page must be a REQ of its own
    full: bool = False  # the page it continues filled a per-filter cap: more pages likely
    stalled: bool = False  # it repeats a page that made no progress
    # it repeats a page whose REQ came back slow with nothing: a time budget may have stopped
    # it before its first event (``next_page``); nothing again is taken as nothing
    retried_empty: bool = False
    # set by ``next_page`` when this page left a second it could not page inside (more
    # events at ``until`` than the relay serves): (that second, ids seen at it)
    crowded: tuple[int, int] | None = None
    pages: int = 0  # pages of this filter before this one: what the progress estimate reads
    # what ``page_filter.until`` adds to the second it is bounded to: 1 on a relay that reads
    # ``until`` as exclusive (``PageCap.until_exclusive``), else 0
    until_shift: int = 0
    # set by ``next_page`` when this page, bounded to a second as NIP-01 reads ``until``,
    # brought no event at it and the filter leaves it behind (pages on below it, or ends):
    # a relay that reads ``until`` as exclusive never sent that second
    passed: int | None = None
    # set by ``next_page`` on a relay that ignores ``until`` (``PageCap.until_ignored``) when
    # the filter may hold more than this page brought: what no page can reach (the filter
    # bounded to the newest second it may lack, that second included)
    unpaged: Filter | None = None

    @classmethod
    def start(cls, f: Filter, until_shift: int = 0) -> FilterPaginationState:
        """The first page of ``f``; ``until_shift`` 1 for a relay that reads ``until`` as
        exclusive (``f.until`` stays the second the filter is bounded to)."""
        if until_shift and f.until is not None:
            return cls(original_filter=f, page_filter=f.replace(until=f.until + 1), until_shift=1)
        return cls(original_filter=f, page_filter=f)

    @property
    def until(self) -> int | None:
        """The newest second this page is bounded to (None: none)."""
        until = self.page_filter.until
        return None if until is None else until - self.until_shift

    @property
    def one_second(self) -> bool:
        """Is this page bounded to a single second? Paging by ``until`` cannot complete it."""
        since = self.original_filter.since
        return since is not None and since == self.until

    def _bounded(self, until: int, boundary_ids, shift: int, **fields) -> FilterPaginationState:
        """The next page, bounded to second ``until`` (as ``shift`` says the relay reads it)."""
        return FilterPaginationState(
            original_filter=self.original_filter,
            page_filter=self.original_filter.replace(until=until + shift),
            boundary_ids=boundary_ids, until_shift=shift, pages=self.pages + 1, **fields)

    def _again(self, boundary_ids=None, **fields) -> FilterPaginationState:
        """This page asked again (what it saw is not counted twice)."""
        return FilterPaginationState(
            original_filter=self.original_filter, page_filter=self.page_filter,
            boundary_ids=self.boundary_ids if boundary_ids is None else boundary_ids,
            boundary_shared=self.boundary_shared, until_shift=self.until_shift, pages=self.pages + 1, **fields)

    def record(self, event: Event, own: bool) -> None:
        """Count a matching event; ``own`` when no other filter of the REQ matches it."""
        self.seen.append((event.created_at, event.id))
        if own:
            self.own_count += 1
            if self.own_min is None or event.created_at < self.own_min:
                self.own_min = event.created_at
            if event.created_at == self.until:
                self.own_at_until = True

    def restarted(self) -> FilterPaginationState:
        return FilterPaginationState(
            self.original_filter, self.page_filter, boundary_ids=self.boundary_ids,
            boundary_shared=self.boundary_shared, alone=self.alone,
            full=self.full, stalled=self.stalled, pages=self.pages, until_shift=self.until_shift,
        )

    def covered_until(self, cap: int) -> int | None:
        """The oldest ``created_at`` down to which this page certainly holds every event of
        the filter, or None if nothing is certain.

        The relay sent this filter's newest events, as many as it would, and the union
        brought some of other filters' too. Two bounds are safe: the oldest event no other
        filter matched (it was sent for this one), and, when the relay served every filter
        of the REQ at least ``cap`` (``PageCap.per_filter_bound``; 0 when unknown), the
        ``cap``-th newest event that matched (the filter's own newest events are newer than
        every other event of it that arrived). The older of the two wins.
        """
        bounds = [] if self.own_min is None else [self.own_min]
        if cap and len(self.seen) >= cap:
            newest_first = sorted((t for t, _ in self.seen), reverse=True)
            bounds.append(newest_first[cap - 1])
        return min(bounds) if bounds else None

    def next_page(self, cap: PageCap | None = None, total: int | None = None,
                  elapsed: float | None = None, by_itself: bool = True,
                  past_until: int = 0) -> FilterPaginationState | None:
        """The state for the next page, or None when this filter is exhausted.

        ``cap``: the connection's ``PageCap`` (already taught this page); ``total``: events
        the whole REQ brought (default: this filter's); ``by_itself``: it was the REQ's one
        filter (its answer was all its own); ``past_until``: events of this filter but for
        its ``until`` the relay sent newer than it (one ignoring ``until``: dropped by the
        connection, yet they fill the relay's cap; a piece of a split whose 20 of 20 were 12
        newer and 8 within came back "complete" at 8, and an import of 178 events waited a
        day: seed 707 of the stress mix); ``elapsed``: seconds from REQ to
        EOSE, None if unknown. A slow page is confirmed: one that brought events by the next
        page, one whose whole REQ brought nothing by asking it once more (a relay that stops
        slow queries may stop one before its first event. The simulator, ``--slow-queries
        0.4``: seed 1402, a poll cut to nothing and the next one asking from past the reply
        it held, which waited for the daily sync; seed 1408, a fetch of one id cut to
        nothing, its filter bringing it, and the relay judged not to serve ids for a day).
        So a relay slow every time still ends, with ``until`` moving back each page until
        one comes back empty twice."""
        cap = cap or PageCap()
        total = len(self.seen) if total is None else total
        if not total and not self.retried_empty and slow_answer(elapsed):
            return self._again(alone=self.alone, retried_empty=True)
        slow = slow_page(elapsed, total)
        if self.page_filter.ids is not None:
            return self._ids_again(cap, total, slow) if cap.until_ignored or slow else None
        if cap.until_ignored:
            return self._unpaged(cap, total, slow, past_until)
        if cap.until_exclusive and not self.until_shift and self.until is not None:
            # The relay reads ``until`` as exclusive (``PaginationState.teach``): this
            # page's last second never came. Asked again, bounded the way the relay reads it.
            return self._bounded(self.until, self.boundary_ids, cap.until_shift, alone=self.alone,
                                 boundary_shared=self.boundary_shared)
        if not cap.maybe_cut(len(self.seen), total, slow):
            return self._leaving(None)
        covered = self.covered_until(cap.per_filter_bound(total, slow))
        if not self.seen:
            # A REQ that may have been cut before reaching it: the same page again, in any
            # REQ (the others' pages move on, so it is not cut off again for ever).
            return self._again()
        if covered is None:
            # Everything it matched, another filter matched too, and the page size says
            # nothing: the same page again, alone, where all of it is its own.
            return self._again(alone=True)
        ids_at = {i for t, i in self.seen if t == covered}
        until = self.until
        at_boundary = until is not None and covered >= until
        shared = None
        if not at_boundary:
            next_until, boundary = covered, ids_at
        elif ids_at - self.boundary_ids:
            # Still inside one crowded second but seeing new ids: ask it once more.
            next_until, boundary, shared = until, self.boundary_ids | ids_at, self.boundary_shared
        elif not (self.alone or by_itself) and cap.req_maybe_cut(total, slow):
            # No progress, but the REQ's cap or its time may have stopped it inside this
            # second: once more, riding in the batch's next REQ (the others' pages move on,
            # and what they teach may settle it), then alone, where the answer is all its own.
            return self._again(boundary_ids=self.boundary_ids | ids_at, alone=self.stalled, stalled=True)
        else:
            # No progress: the relay keeps returning the same page, all of it at one second
            # it serves no more of. Paging skips that second; the caller completes it.
            self.crowded = (until, len(self.boundary_ids | ids_at))
            next_until, boundary = until - 1, set()
        since = self.original_filter.since
        if next_until < 0 or (since is not None and next_until < since):
            return self._leaving(None)
        return self._leaving(self._bounded(next_until, boundary, cap.until_shift,
                                           full=cap.filled(len(self.seen)), boundary_shared=shared))

    def _ids_again(self, cap: PageCap, total: int, slow: bool) -> FilterPaginationState | None:
        """On a relay that ignores ``until``, whose filters' pages stop at the first, and
        after a slow answer (a time budget cuts an id fetch as it cuts a page): an exact-id
        answer is complete, its shortfalls residuals, unless the relay may have cut it and
        more is missing than came (it caps every filter, an id filter too: 20 of 300 ids
        asked came on a relay serving 20 a filter, and the rest went to their filters, which
        cannot page there; a slow fetch's rest, found by their filters, would judge a relay
        serving ids not to, as an empty one did: ``next_page``): the ids it did not send are
        asked again. A smaller
        shortfall is the residual's, retried once by id (``decide_residual``): ids hidden
        or gone are not asked again and again. (Elsewhere a cut id page's rest goes to its
        filters' pages, as ids not served by id do.)"""
        if not self.seen or not cap.maybe_cut(len(self.seen), total, slow):
            return None
        rest = self.page_filter.ids - {i for _, i in self.seen}
        if len(rest) <= len(self.seen):
            return None
        return FilterPaginationState(original_filter=self.original_filter,
                                     page_filter=self.page_filter.replace(ids=frozenset(rest)),
                                     pages=self.pages + 1)

    def _unpaged(self, cap: PageCap, total: int, slow: bool, past_until: int) -> None:
        """On a relay that ignores ``until``: no next page. A page past the first leaves
        everything up to its ``until`` unreached (it brought the newest again); a first
        page that may have been cut, everything up to the oldest second it holds for
        certain (or the whole filter, nothing being certain)."""
        original = self.original_filter
        if self.until is not None and self.pages:
            upto = self.until
        elif not cap.maybe_cut(len(self.seen) + past_until, total + past_until, slow):
            return None  # all of it came
        else:
            covered = self.covered_until(cap.per_filter_bound(total, slow)) if self.seen else None
            upto = covered if covered is not None else self.until
        if upto is None:
            self.unpaged = original
        elif original.since is None or upto >= original.since:
            self.unpaged = original.replace(until=upto)
        return None

    def _leaving(self, following: FilterPaginationState | None) -> FilterPaginationState | None:
        """``following`` (the next page, or None: the filter is done), noting in ``passed``
        the second this page was bounded to if it leaves it behind unproven: asked as
        NIP-01 reads ``until``, and no event at it came for this filter alone."""
        until = self.until
        if (not self.until_shift and until is not None and not self.own_at_until
                and (following is None or following.until < until)):
            self.passed = until
        return following

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
                boundary_shared=parts if self.boundary_shared is None else -1,
                full=self.full,
                pages=self.pages,
                until_shift=self.until_shift,
            ))
            start = end
        return pieces

    def within_values(self, most: int) -> list[FilterPaginationState]:
        """This page again as filters of ``most`` values a list at most (a relay refused a
        longer list): each piece its slice of the values (``filter_plan.value_slices``),
        at the same page, restarted; the pieces share the boundary ids, as ``split``'s do."""
        slices = value_slices(self.page_filter, most)
        if slices == [{}]:
            return [self.restarted()]
        return [FilterPaginationState(
            original_filter=self.original_filter.replace(**r), page_filter=self.page_filter.replace(**r),
            boundary_ids=set(self.boundary_ids), boundary_shared=-1 if self.boundary_ids else None,
            alone=self.alone, full=self.full, pages=self.pages, until_shift=self.until_shift,
        ) for r in slices]


@dataclass(frozen=True)
class CrowdedSecond:
    """A second in which a relay holds more events of ``filter`` than it serves in a page:
    ``filter`` is the page's filter bounded to that second (``since`` = ``until``), ``seen``
    how many distinct events of it came; ``again``: the page already asked that second
    alone (NIP-77 fell back to it, or it is a piece of a split)."""

    filter: Filter
    second: int
    seen: int
    again: bool = False
    # not one second: everything of ``filter`` (up to its ``until``, ``second``), which a
    # relay ignoring ``until`` serves no page of (``FilterPaginationState.unpaged``)
    span: bool = False


def exchange_asks(f: Filter, cap: PageCap | None) -> Filter:
    """What a NIP-77 exchange of ``f`` sends: ``until`` one second on unless the relay is
    known to read it as NIP-01 says, and ``since`` one second before. An exchange has no
    page to prove the reading by, and a relay that reads ``until`` (or ``since``) as
    exclusive in REQs reads it so in NEG-OPENs: a window cut past a result cap
    (``result_caps``), a crowded second, would reconcile without its last (first) second
    there, and the events only it holds at that second would never come (the simulator's
    ``--since-exclusive``: seed 8 of a world of small pages and series, a patch series at
    a window's first second). Asked one second wider, such a relay reads the window
    exactly; one that reads it as NIP-01 says reads a second more each way, which the
    windows or pages beside ask too (and the holdings reconciled are those of what is
    asked: nothing held there is fetched again)."""
    if f.since is not None and f.since > 0:
        f = f.replace(since=f.since - 1)
    if f.until is None or (cap is not None and cap.until_inclusive):
        return f
    return f.replace(until=f.until + 1)


def until_probe(event_id: str, created_at: int) -> Filter:
    """A REQ that tells how a relay reads ``until``: an event it served, bounded to its own
    second. Read as NIP-01 says, it comes again; read as exclusive, nothing does."""
    return Filter.make(ids=[event_id], until=created_at)


def is_until_probe(f: Filter) -> bool:
    return f.ids is not None and f.until is not None


def slow_answer(elapsed: float | None) -> bool:
    """An answer (``elapsed`` seconds from REQ to EOSE, None if unknown) slow enough for a
    relay's time budget to have cut it anywhere, before its first event too
    (``constants.TIME_CUT_SUSPECT_SECS``): the one test of slowness, for remote pages, the
    precise probe and the own relay's reads alike."""
    return elapsed is not None and elapsed >= constants.TIME_CUT_SUSPECT_SECS


def slow_page(elapsed: float | None, total: int) -> bool:
    """A page slow enough for a time budget to have cut it (and not empty)."""
    return slow_answer(elapsed) and total > 0


def crowded_second_filter(f: Filter, second: int) -> Filter:
    return f.replace(since=second, until=second)


def one_second(f: Filter) -> bool:
    """Is ``f`` bounded to a single second? Paging by ``until`` cannot complete it."""
    return f.since is not None and f.since == f.until


def split_crowded(f: Filter) -> list[Filter]:
    """``f`` (bounded to one crowded second) as two filters over disjoint halves of a
    dimension it enumerates, whose answers together are its answer: its tag values, else
    its kinds, else its authors. Empty when it enumerates nothing more than one value:
    no NIP-01 filter then selects part of that second."""
    if len(f.tags) == 1 and len(f.tags[0][1]) > 1:
        name, values = f.tags[0]
        ordered = sorted(values)
        half = len(ordered) // 2
        return [f.replace(tags=((name, frozenset(part)),)) for part in (ordered[:half], ordered[half:])]
    for dimension in ("kinds", "authors"):
        values = getattr(f, dimension)
        if values is not None and len(values) > 1:
            ordered = sorted(values)
            half = len(ordered) // 2
            return [f.replace(**{dimension: frozenset(part)}) for part in (ordered[:half], ordered[half:])]
    return []


@dataclass
class PaginationState:
    """Per-filter progress for every OR filter carried by one subscription."""

    filters: list[FilterPaginationState]
    total: int = 0  # events this page brought that matched a filter (once each)

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
        self.total += bool(matched)
        return bool(matched)

    def teach(self, cap: PageCap, elapsed: float | None = None) -> None:
        """What this page shows of the relay's caps (what it served one filter and the REQ)
        and of how it reads ``until``: as NIP-01 says when a page bounded to a second brought
        an event of its own at it, as exclusive when ``_until_read_as_exclusive``.
        ``elapsed``: seconds from the REQ to its EOSE, if known."""
        # (on a relay that ignores ``until``, an event sent for a filter past its ``until``
        # may match another filter of the REQ within its bounds, and count as that one's own:
        # 26 "own" events of a relay serving 20 a filter, whose cut pages then passed for
        # complete (seed 707 of the stress mix). Its own counts teach only where no other
        # filter of the REQ has an ``until``.)
        bounded = sum(s.page_filter.until is not None for s in self.filters)
        for s in self.filters:
            others_bounded = bounded - (s.page_filter.until is not None)
            if not (cap.until_ignored and others_bounded):
                cap.observe(s.own_count)
        cap.observe(0, self.total)
        if cap.until_exclusive or cap.until_inclusive:
            return
        probes = [s for s in self.filters if is_until_probe(s.original_filter)]
        if probes:  # (asked alone: its one event, or nothing)
            if not any(s.seen for s in probes) and slow_answer(elapsed):
                return  # nothing, slowly: a time budget may have stopped it (asked once more: ``next_page``)
            cap.until_inclusive = any(s.seen for s in probes)
            cap.until_exclusive = not cap.until_inclusive
        elif any(not s.until_shift and s.own_at_until for s in self.filters):
            # (read as exclusive, no event at it would come; one another filter of the REQ
            # matched too may have been sent for that one, from a later second)
            cap.until_inclusive = True
        elif self._until_read_as_exclusive(cap, slow_answer(elapsed)):
            # (a slow page may be cut anywhere, before its first event too: one that brought
            # nothing slowly, asked once more (``next_page``), proves nothing of ``until``;
            # taken as whole, it marked a relay reading ``until`` as NIP-01 says as one reading
            # it as exclusive: tests/test_pending.py's property test, a relay stopping cold
            # queries before their first event)
            cap.until_exclusive = True

    def _until_read_as_exclusive(self, cap: PageCap, slow: bool) -> bool:
        """Does this page prove that the relay reads ``until`` as exclusive? Some filter
        was bounded to a second at which its earlier pages saw events, and none of them
        came, though nothing cut the page before them: a relay sends a filter's newest
        events first, so each filter of the REQ that may hold them brought an older event of
        its own (one no other filter of the REQ matched: it was sent for this one), or
        nothing could have cut the REQ. The pieces split from one page are judged
        together, and only all of them at once: which of them holds those events is not
        known. (An event deleted meanwhile says the same; then pages only ask one
        second more than they need.)"""
        groups: dict[tuple, list[FilterPaginationState]] = {}
        for s in self.filters:
            if not s.until_shift and s.until is not None and s.boundary_ids:
                alone = id(s) if s.boundary_shared is None else None  # (its own group)
                groups.setdefault((s.until, frozenset(s.boundary_ids), s.boundary_shared, alone), []).append(s)
        complete = not cap.req_maybe_cut(self.total, slow)
        for (until, _, shared, _), split_from_one in groups.items():
            if shared is not None and len(split_from_one) != shared:
                continue  # some of the pieces are elsewhere: the events may be theirs
            if any(t == until for s in split_from_one for t, _ in s.seen):
                continue
            if complete or all(s.own_min is not None and s.own_min < until for s in split_from_one):
                return True
        return False


# -- residuals after NIP-77 --------------------------------------------------------------


class ResidualDecision(enum.Enum):
    DONE = "done"  # everything advertised arrived
    RETRY_RESIDUAL = "retry_residual"  # ask once more, by id, for the ids still missing
    SEMANTIC_FALLBACK = "semantic_fallback"  # ask them by the filters that found them
    FAIL = "fail"  # give up on the batch; missing ids go to recovery


def serves_by_id(asked: int, delivered: int) -> bool:
    """Did an exact-id pass show that the relay serves its advertised ids by id? More than
    a tenth of them came: what is missing is lag, expiry or deletion. A relay that
    advertises inventory and returns (nearly) nothing for it by id (azzamo.net, snort.social)
    does not, however few ids it was asked: one id it advertised alone and never served was
    a whole repository's announcement."""
    return delivered > asked * RESIDUAL_FALLBACK_MAX_FRACTION


def decide_residual(advertised: int, delivered: int, retried: bool,
                    by_filter_done: bool = False) -> ResidualDecision:
    """What to do after an exact-id fetch pass delivered ``delivered`` of ``advertised``.

    A relay that serves by id (``serves_by_id``) gets one retry for a small residual.
    Whatever is still missing then, and everything a relay that does not serve by id left
    out, is asked once by the filters that found it (an id advertised and not served by
    id is never asked only by id again). What that does not bring either fails the batch
    into missing-event recovery.
    """
    if delivered >= advertised:
        return ResidualDecision.DONE
    if by_filter_done:
        return ResidualDecision.FAIL
    if not retried and serves_by_id(advertised, delivered):
        return ResidualDecision.RETRY_RESIDUAL
    return ResidualDecision.SEMANTIC_FALLBACK


# -- the batch ---------------------------------------------------------------------------


@dataclass
class PendingBatch:
    """Historic sync of ``items`` on one relay; complete when no subscription is outstanding.

    ``outstanding_subs`` holds REQ subscription ids and, for NIP-77, any token the caller
    uses for the negentropy exchange itself (added without filters); ``pagination`` the
    pages of its REQs. Both are written by ``sync.start_queue`` alone (``add_subscription``,
    ``on_eose``, ``split_subscription``, ...), which keeps them in step with the queue.

    Where it is in its life is ``phase``, moved only through ``move`` (``sync.batch_phase``).
    """

    batch_id: int
    items: PendingItems
    method: SyncMethod = SyncMethod.REQ_EOSE
    outstanding_subs: set[str] = field(default_factory=set)
    pagination: dict[str, PaginationState] = field(default_factory=dict)
    # failed for what no REQ reaches there without NIP-77, and for a cause asking again
    # may mend (a subscription closed or stalled before its EOSE): ``mark_failed``
    unreached: bool = False
    failed_otherwise: bool = False
    # NIP-77 hydration: ids the relay advertised that the own relay lacks, and arrivals.
    advertised_ids: set[str] = field(default_factory=set)
    received_ids: set[str] = field(default_factory=set)
    # the NIP-77 filter that advertised each id: what is not served by id is asked by it
    found_by: dict[str, Filter] = field(default_factory=dict)
    residual_asked: set[str] = field(default_factory=set)  # the ids asked so (``sync.unservable``)
    # advertised ids whose fetch by id is queued (``batch_end.fetch_what_the_exchanges_found``:
    # the last exchange's answer, or the last turned into a REQ, asks each once)
    fetching_by_id: set[str] = field(default_factory=set)
    # ids its fetches by id did not bring, their last answer slow enough for a time budget to
    # have cut it before its first event (``slow_answer``): no witness that the relay does
    # not serve ids (``batch_end.judge_ids_served``)
    ids_answered_slowly: set[str] = field(default_factory=set)
    # seconds its pages could not page inside, for the caller to complete another way
    crowded: list[CrowdedSecond] = field(default_factory=list)
    # its filters a relay ignoring ``until`` left unpaged past their first page: no witness
    # that an id they did not bring is not served there (``batch_end.finish``)
    unpaged: set[Filter] = field(default_factory=set)
    # (filter, second) its pages left behind before the connection knew how the relay reads
    # ``until`` (``FilterPaginationState.passed``): asked again if it reads it as exclusive
    unproven_seconds: list[tuple[Filter, int]] = field(default_factory=list)
    # the newest (created_at, id) its pages brought: what a probe of how the relay reads
    # ``until`` asks for (``until_probe``); whether one was asked
    newest_seen: tuple[int, str] | None = None
    until_probed: bool = False
    # filters NIP-77 found mostly missing: fetched by REQ after the last exchange
    fetch_by_filter: list[Filter] = field(default_factory=list)
    # An AddFilters batch whose REQs all still wait for the pacing gate may take in the next
    # AddFilters (``coalescable``), so that their filters share REQs; once ``started``, they
    # queue beside its pages instead.
    coalescable: bool = False
    coalesce_wanted: bool = False  # an AddFilters batch whose methods are still being chosen
    # another relay's first sync of the same repositories (``sync.lead``): ``follower``
    # once it waited for such a batch
    follower: bool = False
    share_all: bool = False  # no lead to wait for after all: NIP-77 for every filter
    # it waits for another shard's lead (``sync.shard``): the end of its wait is the
    # normal case, and the method is chosen per filter from what the own relay then holds
    led_elsewhere: bool = False
    phase: BatchPhase = BatchPhase.QUEUED
    # NIP-77 token -> the own relay's (created_at, id) for its filter, read when NIP-77 was
    # chosen for it: the exchange starts from these instead of asking again
    own_holdings: dict[str, list] = field(default_factory=dict)
    # NIP-77 token -> the part of its filter whose holdings are not in ``own_holdings``:
    # values that joined it after they were read (``batch_end.cover_threads_ahead``)
    read_also: dict[str, Filter] = field(default_factory=dict)
    # NIP-77 token of a check below an exchange's oldest (``result_caps.SilentCap``) -> what
    # that exchange advertised: (its need ids, how many of ours it lacked that old, how many
    # it compared)
    silent_checks: dict[str, tuple[frozenset, int, int]] = field(default_factory=dict)
    # parts of a REQ split to find a filter at fault: merged again they would only be
    # refused (or stall) as a whole once more
    split_parts: set[str] = field(default_factory=set)
    kind: BatchKind = BatchKind.SYNC
    # a poll (kind POLL): when it started, and the tiers (relay_state.PolledCoverage) whose
    # cursor moves there once it is served
    poll_started_at: float | None = None
    poll_tiers: list = field(default_factory=list)
    # a live audit's (``LiveCoverage.run_audits``): the created_at seconds, inclusive, in which
    # an event gsync never had was missed by the live subscriptions
    audit_window: tuple[int, int] | None = None
    # its filters as asked (before any page, split or method): what is asked again when
    # the relay's NIP-77 cannot serve them (residuals) or a batch joins another
    semantic_filters: list[Filter] = field(default_factory=list)
    _retry_asked: int = 0  # residual size when the retry started

    # -- its phase (``sync.batch_phase``)

    def move(self, step: Step) -> BatchPhase:
        """``batch_phase.move``: ``IllegalBatchMove`` if the table has no such move."""
        return batch_phase.move(self, step)

    @property
    def started(self) -> bool:
        """A start of it went: a later AddFilters queues beside it, not re-packing it."""
        return self.phase in batch_phase.STARTED

    @property
    def residual_retried(self) -> bool:
        """Its NIP-77 residual was asked by id once more."""
        return self.phase in (BatchPhase.IDS_RETRIED, BatchPhase.BY_FILTER_AFTER_RETRY)

    @property
    def residual_by_filter(self) -> bool:
        """The ids still missing were asked by their filters."""
        return self.phase in (BatchPhase.BY_FILTER, BatchPhase.BY_FILTER_AFTER_RETRY)

    @property
    def purpose(self) -> str:
        """What its starts are for, for the metric: ``sync`` (layer 1 and AddFilters, which
        carry items to confirm), ``recovery``, or ``other`` (descendants, polls, catch-ups)."""
        if self.kind is BatchKind.RECOVERY:
            return "recovery"
        return "sync" if self.kind is BatchKind.LAYER1 or self.items else "other"

    def record_event(self, sub_id: str, event: Event,
                     matched_indices: tuple[int, ...] | None = None) -> bool:
        """Count ``event`` for every filter of the sub it matches; False if it matches none.
        ``matched_indices`` saves matching again: which of ``filters_of(sub_id)`` it matches
        (the connection checked that already)."""
        if event.id in self.advertised_ids:
            self.received_ids.add(event.id)
        state = self.pagination.get(sub_id)
        return state is not None and state.record(event, matched_indices)

    @property
    def is_complete(self) -> bool:
        return not self.outstanding_subs

    @property
    def failed(self) -> bool:
        """It did not complete (``mark_failed``), for either cause."""
        return self.unreached or self.failed_otherwise

    def mark_failed(self, unreached: bool = False) -> None:
        """The batch did not complete. ``unreached``: for what no REQ reaches on this relay
        without NIP-77 (an unsplittable crowded second, a filter a relay ignoring ``until``
        leaves unpaged): asked again by REQ, it fails again."""
        if unreached:
            self.unreached = True
        else:
            self.failed_otherwise = True

    # -- NIP-77 residuals

    def expect_ids(self, ids: Iterable[str], found_by: Filter | None = None) -> None:
        """Ids the relay advertised (and the own relay lacks): fetched by id next.
        ``found_by``: the filter whose NIP-77 exchange advertised them."""
        ids = set(ids)
        self.advertised_ids |= ids
        if found_by is not None:
            self.found_by.update(dict.fromkeys(ids, found_by))

    def settle(self, ids: Iterable[str]) -> None:
        """Advertised ids that arrived from elsewhere (another relay, another batch) before
        this batch got them: not asked here, so neither missing nor a sign that the relay
        does not serve ids (judged on those, one relay lost NIP-77 for a day, and its next
        batches brought everything again by REQ pages)."""
        for event_id in ids:
            if event_id not in self.received_ids:
                self.advertised_ids.discard(event_id)
                self.found_by.pop(event_id, None)

    def residual_filters(self, ids: Iterable[str]) -> list[Filter]:
        """The filters that found ``ids`` (the batch's own filters for any found otherwise),
        each once, in a stable order."""
        found = [self.found_by.get(i) for i in ids]
        filters = dict.fromkeys(f for f in found if f is not None)
        if None in found:
            filters.update(dict.fromkeys(self.semantic_filters))
        return sorted(filters, key=lambda f: f.to_json())

    def take_crowded(self) -> list[CrowdedSecond]:
        crowded, self.crowded = self.crowded, []
        return crowded

    def residual_ids(self) -> set[str]:
        return self.advertised_ids - self.received_ids

    def residual_decision(self) -> ResidualDecision:
        """Decision for the fetch pass just finished (first pass, or the one retry)."""
        missing = len(self.residual_ids())
        if self.residual_retried:
            asked = self._retry_asked
        else:
            asked = len(self.advertised_ids)
        return decide_residual(asked, asked - missing, self.residual_retried, self.residual_by_filter)

    def first_pass_served_by_id(self) -> bool:
        """Did the first exact-id pass deliver enough to say the relay serves by id?"""
        asked = len(self.advertised_ids)
        if self.residual_retried:
            return True  # it was retried because it did
        return serves_by_id(asked, asked - len(self.residual_ids()))

    def begin_residual_retry(self) -> set[str]:
        """Start the one retry, once the batch moved on ``Step.IDS_ASKED_AGAIN``; returns
        the ids to ask for again."""
        residual = self.residual_ids()
        self._retry_asked = len(residual)
        return residual

