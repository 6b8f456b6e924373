"""A relay's NIP-77 result cap (strfry's ``maxSyncEvents``: ``["NEG-ERR", sub, "blocked:
too many query results", cap]``): what is known of it, and the pieces a refused filter is cut
into so that they fit under it at once.

NEG-OPEN is all or nothing: a filter matching more events than the cap is refused whole, and
each refusal costs a paced start. Halving blindly (by time, from 2022 to now) refused 34
times to sync 169 hourly events under a cap of 10 (tests/test_result_cap_e2e.py; 46 in the
world issue 40 measured): every level above the events' days was refused once, every level
within them as many times as it had parts. What is known instead:

- the own relay's holdings of the filter (and what is in flight to it): how many, and when.
  The remote rarely lacks what we hold, so they show where its events are;
- the relay's cap: the number strfry puts in its NEG-ERR, or else learnt (``ResultCap``):
  the most events an exchange there was served for, the fewest a refused one was expected
  to match.

``cut_past_cap`` cuts the refused filter into time windows (``since``/``until``) by the
holdings, each holding at most ``FILL`` of the cap (room for events we lack) and at most
half of what was refused; the windows meet, each ending at its last held second. Where
the filter was open (before the first held event, after the last: history the own relay
never had, events new since it synced) REQ pages ask: NIP-77 would find nothing held
there, and the same events come for fewer starts. A window refused again is cut again
the same way, so only what is refused again is halved (and its siblings, not started yet,
holding as many, before their start: ``cut_before_start``). A filter of which the own relay
holds too little to be worth the exchanges goes by REQ pages whole (``pages_pay``).

Pure: the manager passes what the own relay holds and the time.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..constants import FETCH_BY_FILTER_MAX_HELD_FRACTION
from ..protocol.filters import Filter
from ..protocol.negentropy import INFINITY
from .filter_plan import split_past_result_cap

# The smallest silent NIP-77 cap guarded against (``SilentCap``): relays built on khatru
# compare a filter's newest events only, as many as their store's query gives (the sqlite
# backend's default: 100; khatru's ``UseEventstore``: twenty times the relay's query limit).
SILENT_CAP_MIN = 50
# The software a relay's NIP-11 names (``software``, a URL) known to say when it cuts
# (strfry's NEG-ERR past ``maxSyncEvents``) or to have no NIP-77: no exchange there is checked.
UNCUT_SOFTWARE = ("strfry", "nostr-rs-relay")

# A window holds at most this fraction of the cap of the own relay's events: the remote
# holds some we lack (a re-sync's new events, a follower's not yet fetched), and a window
# refused again costs a start and a cut.
FILL = 0.8
# However small the cap and large the holdings, one refusal queues at most this many
# exchanges (windows refused again are cut again): the queue grows with the work, never
# with a tiny cap.
MAX_WINDOWS = 64


@dataclass
class ResultCap:
    """What one relay's NIP-77 result cap is known to be (a few numbers per relay, kept
    over sessions): the cap it ``reported`` in its last refusal, the most events an exchange
    there was served for (``passed``), and the fewest a refused filter was expected to match
    (``refused``: the own relay's holdings of it, a lower estimate). And the latest refusal
    of a window (``refused_window``: its filter but for the time, and what the own relay
    held of it): that window's siblings, cut alike, are cut again before their start."""

    reported: int | None = None
    passed: int = 0
    refused: int | None = None
    refused_window: tuple[Filter, int] | None = None
    silent: SilentCap = field(default_factory=lambda: SilentCap())

    def note_refused(self, reported: int | None, expected: int, f: Filter | None = None) -> None:
        """A NEG-OPEN of ``f`` refused for its number of results; ``reported``: the cap the
        relay gave (None if none); ``expected``: what the own relay holds of ``f``."""
        if reported is not None:
            self.reported = reported
        if expected > 0 and (self.refused is None or expected < self.refused):
            self.refused = expected
        if f is not None and f.since is not None and f.until is not None and expected > 0:
            self.refused_window = (_timeless(f), expected)

    def refused_like(self, f: Filter, held: int) -> bool:
        """Is ``f`` a sibling of the latest window refused (a window of the same filter),
        holding as many? The relay holds more than we do there too."""
        if self.refused_window is None or f.since is None or f.until is None:
            return False
        timeless, refused_held = self.refused_window
        return held >= refused_held and _timeless(f) == timeless

    def note_passed(self, size: int, held: int) -> None:
        """An exchange served over ``size`` events (the relay's, as the exchange found
        them), of which the own relay held ``held``: the cap is at least ``size``, and a
        filter holding as many as one refused was served (that estimate was low)."""
        self.passed = max(self.passed, size)
        if self.refused is not None and held >= self.refused:
            self.refused = None

    def limit(self) -> int | None:
        """How many events a NIP-77 query may match here, as far as known: the reported
        cap; else between the most served and the fewest refused (halfway down from the
        refused when nothing served comes near: a halving, by counts); None when nothing is
        known."""
        if self.reported is not None:
            return self.reported
        if self.refused is None:
            return None
        return max(self.passed, self.refused // 2, 1)  # a served one above it: the estimate was low


@dataclass(frozen=True)
class Cut:
    """A refused filter, cut: ``exchanges`` by NIP-77 (each expected to fit), ``pages`` by
    REQ pages (where the own relay holds nothing). Together they ask exactly what the
    filter asked."""

    exchanges: list[Filter]
    pages: list[Filter]


def pages_pay(held: int, limit: int | None) -> bool:
    """REQ pages for a refused filter of which the own relay holds ``held`` events? When it
    holds nothing, or at most a ``FETCH_BY_FILTER_MAX_HELD_FRACTION`` of what the relay
    then holds besides (more than ``limit``): pages bring those few again in one start, as
    after an exchange that found a filter mostly missing (``pending.fetch_by_filter``),
    where NIP-77 would spend two exchanges or more to save them."""
    if held == 0:
        return True
    return limit is not None and held <= FETCH_BY_FILTER_MAX_HELD_FRACTION * (limit + 1 - held)


def cut_past_cap(f: Filter, held_times: Iterable[int], limit: int | None) -> Cut | None:
    """``f``, refused for matching more than the relay's result cap, cut by what is known:
    ``held_times`` (the ``created_at`` of what the own relay holds of ``f``, and has in
    flight) and ``limit`` (``ResultCap.limit``, None when unknown). None when the holdings
    cannot cut it (all in the one second ``f`` already is): REQ pages, or a blind split."""
    times = sorted(t for t in held_times if _in_range(f, t))
    if pages_pay(len(times), limit):
        return Cut([], [f])
    per_window = math.ceil(len(times) / 2)  # at least a halving of what was refused
    if limit is not None:
        per_window = min(per_window, max(1, int(limit * FILL)))
    per_window = max(per_window, math.ceil(len(times) / MAX_WINDOWS))
    groups = _groups(times, per_window)
    # each window from the second after the one before's last held second to its own last
    # held second; the outer ones to f's ends. (An exchange asks one second past its window
    # where the relay's reading of ``until`` is not known, ``pending.exchange_asks``: that
    # second holds nothing of ours, so the relay counts no more of it than of the window.)
    starts = [groups[0][0] if f.since is None else f.since] + [last + 1 for _, last in groups[:-1]]
    ends = [last for _, last in groups[:-1]] + [groups[-1][1] if f.until is None else f.until]
    windows = list(zip(starts, ends, strict=True))
    below, above = f.since is None, f.until is None  # open: by pages
    if windows == [(f.since, f.until)]:  # one second held, in a window: pages around it
        windows, below, above = groups, True, True
        if windows == [(f.since, f.until)]:
            return None
    pages = []
    if below and (f.since is None or f.since < groups[0][0]):
        pages.append(f.replace(until=groups[0][0] - 1))
    if above and (f.until is None or f.until > groups[-1][1]):
        pages.append(f.replace(since=groups[-1][1] + 1))
    return Cut([f.replace(since=since, until=until) for since, until in windows], pages)


def _in_range(f: Filter, t: int) -> bool:
    return (f.since is None or t >= f.since) and (f.until is None or t <= f.until)


def _groups(times: list[int], per_window: int) -> list[tuple[int, int]]:
    """(first, last) seconds of consecutive held events, at most ``per_window`` to a group
    (a second holding more is a group alone: time cannot cut it)."""
    groups: list[tuple[int, int]] = []
    first = last = None
    count = 0
    for t, n in sorted(Counter(times).items()):
        if first is not None and count + n > per_window:
            groups.append((first, last))
            first, count = None, 0
        if first is None:
            first = t
        last, count = t, count + n
    if first is not None:
        groups.append((first, last))
    return groups


def cut_before_start(cap: ResultCap, f: Filter, held: Iterable[tuple[int, str]]) -> Cut | None:
    """A NIP-77 exchange about to start for ``f`` on a relay whose cap is known (from an
    earlier refusal there), cut now rather than a refused start later, when the own relay
    alone holds more of ``f`` than the cap (``held``: what it holds and has in flight), or
    when ``f`` is a window of an earlier cut holding as many as one refused here (its
    siblings were cut alike: the relay holds more than we do in them). None: it may go as
    it is."""
    limit = cap.limit()
    if limit is None:
        return None
    times = _times(held)
    if len(times) <= limit and not cap.refused_like(f, len(times)):
        return None
    return cut_past_cap(f, times, limit)


def after_refusal(cap: ResultCap, f: Filter, held: Iterable[tuple[int, str]] | None,
                  reported: int | None, now: int) -> Cut:
    """What to ask instead of ``f``, which the relay's NIP-77 refused for its number of
    results (``reported``: the cap it gave, if any): cut by the own relay's ``held``
    ((created_at, id) of what it holds of ``f`` and has in flight; None when not known),
    ``cap`` learning from the refusal; halved blindly (``filter_plan.split_past_result_cap``)
    only when nothing is known or the holdings cannot cut it; REQ pages when nothing can."""
    times = None if held is None else _times(held)
    if times is not None:
        cap.note_refused(reported, len(times), f)
        cut = cut_past_cap(f, times, cap.limit())
        if cut is not None:
            return cut
    elif reported is not None:
        cap.note_refused(reported, 0)
    halves = split_past_result_cap(f, now)
    return Cut([], [f]) if halves is None else Cut(halves, [])


def _timeless(f: Filter) -> Filter:
    return f.replace(since=None, until=None)


def _times(held: Iterable[tuple[int, str]]) -> list[int]:
    """The created_at of each id once (the own relay's holdings and what is in flight to
    it overlap)."""
    return list({event_id: t for t, event_id in held}.values())


@dataclass
class SilentCap:
    """What is known of a relay's NIP-77 comparing only a filter's newest events and saying
    nothing of the rest (khatru relays: the negentropy vector is the store's query, capped
    as any query there). An event older than what it compares is never advertised: one the
    own relay lacks was never fetched from there, by any number of exchanges.

    So an exchange that compared at least ``SILENT_CAP_MIN`` events, as many as any exchange
    there compared (``most``: a cap cuts every query at the same number, so one that compared
    fewer than another did was not cut) and more than any proved whole, is checked: the same
    filter again, bounded to the second of the oldest event it compared
    (``NegentropyOutcome.oldest``). A relay without such a cap compares there only what it
    did already; one with it compares older events, and is cut at the number the first
    compared (``cut``). The checks stop once one proves a size whole (``whole``: every
    exchange comparing no more is whole), and go on, below each oldest, for as long as the
    exchanges of a cut relay compare its cap. (One cap a relay, the same for every query, as
    khatru's: a relay cutting some queries lower than others is not guarded against.)"""

    whole: int = 0  # the most events an exchange compared that a check proved whole
    cut: int | None = None  # what a check proved an exchange cut at
    most: int = 0  # the most events an exchange there compared, checked or not

    def check_wanted(self, advertised: int, software: str = "") -> bool:
        """Should an exchange that compared ``advertised`` events be checked below its oldest,
        on a relay whose NIP-11 names ``software``? On one naming software that says when it
        cuts, or never does, not; on any other, when it compared as many as any exchange
        there (``most``, which it then counts in) and more than any proven whole. (Until
        2026-12-07 only numbers that looked configured were, multiples of 50 and powers of
        two, but on khatru: a cap of 77 or 130 on other software left older events
        unadvertised for good, the simulator's seeds 1 and 4 of ``--days 10 --relays 10
        --repos 40 --neg-silent-caps 1 --imports 0.5`` with such caps.)"""
        most, self.most = self.most, max(self.most, advertised)
        if advertised < SILENT_CAP_MIN:
            return False
        if self.cut is not None:
            return advertised >= self.cut
        if advertised <= self.whole or any(name in software.lower() for name in UNCUT_SOFTWARE):
            return False
        return advertised >= most

    def note_check(self, advertised: int, found_more: bool) -> None:
        """A check of an exchange that compared ``advertised`` events ``found_more`` (events
        the relay holds and did not compare) or not."""
        if found_more:
            self.cut = advertised if self.cut is None else min(self.cut, advertised)
        else:
            self.whole = max(self.whole, advertised)


def oldest_compared(common_min: int | None, needs: bool, need_before: int | None,
                    need_after: int | None) -> int | None:
    """A second the oldest event an exchange compared was created at, or after (None: not
    known): the oldest it compared that we hold (``common_min``), and what bounds those
    we lack (``needs``): below ``need_before`` (``negentropy.INFINITY``: past our newest)
    and at or above ``need_after``."""
    if not needs:
        return common_min
    if need_before is not None and need_before < INFINITY:
        return need_before if common_min is None else min(common_min, need_before)
    if common_min is not None and need_after is not None and need_after >= common_min:
        return common_min  # (all of them newer than some held: the held one is the oldest)
    return None


def found_more(compared: frozenset[str], first_have_upto: int, check) -> bool:
    """Did the check (a ``NegentropyOutcome`` of the filter bounded to the first exchange's
    oldest second) find events the relay holds that the first exchange did not compare
    (``compared``: its need ids, and ours it compared): an id outside them, or fewer of ours
    it lacks there than the first said (``first_have_upto``)? (A relay that ignores ``until``
    compares its newest again: those are in ``compared``, not more.)"""
    return any(i not in compared for i in check.need_ids) or len(check.have_ids) < first_have_upto
