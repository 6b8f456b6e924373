"""Filter builders for the three layers, and how they are packed into REQs within a relay's
limits (SPEC §3 "Budgets"; seed 001 "Filter Building").

Pure. Builders return historic filters (optional ``since``); the live form of any of them is
``filter.replace(limit=0)`` (see ``live``). Limits are duck-typed: anything with the NIP-11
``limitation`` attributes ``max_subscriptions``, ``max_message_length``, ``max_limit``,
``max_subid_length``, ``max_filters`` (each may be None, or the object itself may be None).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .. import constants
from ..constants import (
    CONSOLIDATION_EXCESS,
    CONTROL_PLANE_SLOTS,
    DEFAULT_MAX_SUBSCRIPTIONS,
    LAYER1_KINDS,
    MAX_FILTERS_PER_REQ,
    MAX_MESSAGE_BYTES,
    MAX_TAG_VALUE_BYTES_PER_FILTER,
    MIN_PAGE_CAP,
    PAGE_LIMIT,
    STATE_KIND,
    TRANSIENT_HISTORIC_SLOTS,
)
from ..protocol.filters import Filter, is_plain, json_size
from .repos import SyncLevel, identifier_of

# item sets whose filters are remembered (``_sync_level_aware_filters``): a few per relay
# reconnecting often; each entry as large as one relay's filters
SYNC_FILTERS_MEMO = 128

REPO_TAGS = ("a", "A", "q")  # layer 2: events tagging a repository address
EVENT_TAGS = ("e", "E", "q")  # layer 3 and descendants: events tagging an event id

# What we assume when a relay does not publish max_subid_length: our ids are shorter.
ASSUMED_SUBID_LENGTH = 64
# Room left per filter for what may be added after packing: `"until":<ts>` on the next page
# and a page's `"limit":5000` (``with_page_limit``), or `"limit":0` for the live form. They
# fit with margin.
PER_FILTER_SLACK = 48


def _limit(limits, name: str) -> int | None:
    value = getattr(limits, name, None) if limits is not None else None
    return value if isinstance(value, int) and value > 0 else None


# -- layer builders ----------------------------------------------------------------------


_LAYER1 = Filter.make(kinds=LAYER1_KINDS)  # its JSON made once, shared by those derived from it


def layer1_filter(since: int | None = None) -> Filter:
    """Every repository announcement and user GRASP list: how new repos are discovered."""
    return _LAYER1.replace(since=since)


def chunk_by_tag_bytes(values: Iterable[str], budget: int = MAX_TAG_VALUE_BYTES_PER_FILTER,
                       most: int | None = None):
    """Split values into lists whose serialized size (as ``Filter.tag_value_bytes`` counts
    it: the value as JSON, plus a comma) stays within ``budget``, and of ``most`` values at
    most (the relay's cap on a filter's values, ``values_cap``; None: none). Sorted, so the
    same set always makes the same filters. A single value larger than the budget gets a
    chunk alone.
    """
    ordered = sorted(set(values))
    if _plain_and_equally_long(ordered):
        # Event ids and the like: every value costs the same, so the chunks are slices
        # (roots and thread members come by the ten thousand, on every maintenance tick).
        per_chunk = max(1, budget // (len(ordered[0]) + 3))
        if most is not None:
            per_chunk = min(per_chunk, most)
        return [ordered[i:i + per_chunk] for i in range(0, len(ordered), per_chunk)]
    chunks: list[list[str]] = []
    current: list[str] = []
    used = 0
    for value in ordered:
        cost = json_size(value) + 1
        if current and (used + cost > budget or len(current) == most):
            chunks.append(current)
            current, used = [], 0
        current.append(value)
        used += cost
    if current:
        chunks.append(current)
    return chunks


def _plain_and_equally_long(values: list[str]) -> bool:
    """Non-empty, all of one length, each its length + 2 bytes as JSON (``json_size``)."""
    return bool(values) and len(set(map(len, values))) == 1 and is_plain("".join(values))


def _tag_filters(values, tag_names, since, budget, kinds=None, most=None) -> list[Filter]:
    """A filter of each chunk under each tag: the tags' filters of a chunk share its values
    (one frozenset, and its JSON when they are encoded one after the other)."""
    kinds = None if kinds is None else frozenset(kinds)
    return [
        Filter(kinds=kinds, tags=((name, chunk),), since=since)  # (``Filter.make``'s form, made directly)
        for chunk in map(frozenset, chunk_by_tag_bytes(values, budget, most))
        for name in tag_names
    ]


def state_filters(identifiers, since=None, budget=MAX_TAG_VALUE_BYTES_PER_FILTER, most=None) -> list[Filter]:
    """Repository state (30618) by ``d``: what makes the own relay fetch git data."""
    return _tag_filters(identifiers, ("d",), since, budget, kinds=(STATE_KIND,), most=most)


def repo_tag_filters(repo_addrs, since=None, budget=MAX_TAG_VALUE_BYTES_PER_FILTER, most=None) -> list[Filter]:
    """Layer 2: events tagging a repo address via ``a``, ``A`` or ``q``."""
    return _tag_filters(repo_addrs, REPO_TAGS, since, budget, most=most)


def root_event_filters(ids, since=None, budget=MAX_TAG_VALUE_BYTES_PER_FILTER, most=None) -> list[Filter]:
    """Layer 3: events tagging a root (issue, patch, PR) via ``e``, ``E`` or ``q``."""
    return _tag_filters(ids, EVENT_TAGS, since, budget, most=most)


def descendant_filters(ids, since=None, budget=MAX_TAG_VALUE_BYTES_PER_FILTER, most=None) -> list[Filter]:
    """One more generation: events tagging a direct member of a thread. Same shape as
    layer 3, but ``ids`` are direct members, never roots, and results never feed back in."""
    return _tag_filters(ids, EVENT_TAGS, since, budget, most=most)


def asks_by_repo(f: Filter) -> bool:
    """Layer 2's shape: one of ``REPO_TAGS`` over repository addresses, nothing more."""
    return _one_tag_only(f, REPO_TAGS) and all(":" in v for v in f.tags[0][1])


def asks_by_root(f: Filter) -> bool:
    """Layer 3's shape: one of ``EVENT_TAGS`` over event ids, nothing more."""
    return _one_tag_only(f, EVENT_TAGS) and all(":" not in v for v in f.tags[0][1])


def _one_tag_only(f: Filter, names) -> bool:
    return (len(f.tags) == 1 and f.tags[0][0] in names and f.tags[0][1]
            and (f.ids, f.authors, f.kinds, f.since, f.until, f.limit) == (None,) * 6)


def build_sync_level_aware_filters(
    repos: Mapping[str, SyncLevel],
    root_events: Iterable[str] = (),
    since: int | None = None,
    budget: int = MAX_TAG_VALUE_BYTES_PER_FILTER,
    most: int | None = None,
) -> list[Filter]:
    """State filters for every repo; layers 2 and 3 for Full repos only.

    ``root_events`` must already be limited to Full repos' roots (``derive_relay_targets``
    and ``compute_actions`` do that).
    """
    base = _sync_level_aware_filters(frozenset(repos.items()), frozenset(root_events), budget, most)
    return list(base) if since is None else [f.replace(since=since) for f in base]


@functools.lru_cache(maxsize=SYNC_FILTERS_MEMO)
def _sync_level_aware_filters(repos: frozenset, root_events: frozenset, budget: int,
                              most: int | None) -> tuple[Filter, ...]:
    """``build_sync_level_aware_filters`` without ``since``, remembered: a relay's confirmed
    items are built into the same filters at each of its reconnections (a relay restarting
    every few minutes, its gap fetched with ``since``), by its live and historic sides, and
    their JSON is made once (``Filter.replace`` shares it). Filters are immutable: shared,
    they are never changed (``drop_json`` only forgets JSON, made again when needed)."""
    full = [address for address, level in repos if level is SyncLevel.FULL]
    return tuple(
        state_filters({identifier_of(a) for a, _ in repos}, None, budget, most)
        + repo_tag_filters(full, None, budget, most)
        + root_event_filters(root_events, None, budget, most)
    )


def live(filters: Iterable[Filter]) -> list[Filter]:
    """The live form: ``limit: 0`` asks for no stored events, only new ones."""
    return [f.replace(limit=0) for f in filters]


def live_since(filters: Iterable[Filter], now: float) -> list[Filter]:
    """The live form (``live``) as a relay known to drop live subscriptions is sent it: no
    ``limit``, and ``since`` LIVE_SINCE_MARGIN_SECS back (stored events since then come
    first). ORLY drops every filter whose ``limit`` its stored answer reached, ``limit: 0``
    always, without a word, and keeps one without a ``limit``. Only there: an event dated
    before ``since`` and published later matches no such filter, and comes by the hourly
    look or the daily sync; ``limit: 0`` sends it live."""
    since = int(now) - constants.LIVE_SINCE_MARGIN_SECS
    return [f.replace(limit=None, since=max(since, f.since or since)) for f in filters]


def restrict_to(filters: Iterable[Filter], wanted: Iterable[Filter]) -> list[Filter]:
    """``filters`` narrowed to what ``wanted`` (the coverage the current index asks for)
    still asks: the replacement of a subscription a relay closed, without obsolete items.

    A tag filter keeps the values that some wanted filter of the same kinds and tag carries;
    a filter without tags stays if one of the same kinds is wanted; id filters are not
    derived from the index and stay as they are. Filters left with nothing are dropped.
    """
    values: dict[tuple, set[str]] = {}
    plain: set = set()
    for w in wanted:
        if w.ids is None and len(w.tags) == 1:
            name, vals = w.tags[0]
            values.setdefault((w.kinds, name), set()).update(vals)
        elif w.ids is None and not w.tags:
            plain.add(w.kinds)
    out = []
    for f in filters:
        if f.ids is not None or len(f.tags) > 1:
            out.append(f)
        elif not f.tags:
            if f.kinds in plain:
                out.append(f)
        else:
            name, vals = f.tags[0]
            keep = vals & values.get((f.kinds, name), set())
            if keep == vals:
                out.append(f)
            elif keep:
                out.append(f.replace(tags=((name, frozenset(keep)),)))
    return out


# -- fitting a relay's limits ------------------------------------------------------------


def filters_per_req(limits=None) -> int:
    """Up to 10 OR-ed filters per REQ, fewer if the relay's legacy ``max_filters`` says so."""
    return min(MAX_FILTERS_PER_REQ, _limit(limits, "max_filters") or MAX_FILTERS_PER_REQ)


def page_limit(max_limit: int | None = None) -> int:
    """The ``limit`` pages carry to a relay taking at most ``max_limit`` (its NIP-11
    ``max_limit``, or what a refusal said: nostream refuses a REQ asking more, "Subscription
    rejected: Limit too high"): ``PAGE_LIMIT``, or that if lower, never below
    ``MIN_PAGE_CAP`` (what every page is assumed to hold when more is there)."""
    if not isinstance(max_limit, int) or max_limit <= 0:
        return PAGE_LIMIT
    return max(MIN_PAGE_CAP, min(PAGE_LIMIT, max_limit))


def with_page_limit(filters: Iterable[Filter], limit: int = PAGE_LIMIT) -> list[Filter]:
    """A historic REQ's filters as they go on the wire: each that asks by anything but ids
    carries ``limit`` (``page_limit``: ``PAGE_LIMIT``, or a relay's lower NIP-11 ``max_limit``). NIP-01 promises a filter's newest events, newest
    first, to a filter with a limit; without one a relay may serve its oldest, and paging by
    ``until`` from the oldest seen then skips everything newer, on every sync: nostream, a
    filter without a limit, serves its oldest 500 (``LIMIT 500 ORDER BY created_at ASC``);
    nostr-rs-relay all of them, oldest first. Lowered to a NIP-11 ``max_limit``, a page cut at
    the limit is full though an id fetch taught a larger cap (``PageCap.page_limit``). (An id
    filter asks for what it names: its order does not matter.)"""
    return [f if f.ids is not None or f.limit is not None else f.replace(limit=limit) for f in filters]


def req_length_limit(limits=None) -> int:
    """The longest ``["REQ",…]`` the relay takes: NIP-11 ``max_message_length``, else ours."""
    return _limit(limits, "max_message_length") or MAX_MESSAGE_BYTES


def _subid_length(limits) -> int:
    return min(ASSUMED_SUBID_LENGTH, _limit(limits, "max_subid_length") or ASSUMED_SUBID_LENGTH)


def _req_overhead(limits) -> int:
    return len('["REQ",""]') + _subid_length(limits)  # ``["REQ","<sub id>"]`` (ids need no escaping)


def _filter_cost(f: Filter) -> int:
    return f.serialized_size() + 1 + PER_FILTER_SLACK  # +1 for the separating comma


def tag_value_budget(limits=None) -> int:
    """Tag-value bytes one filter may carry: 32 KB, less if the relay's messages are smaller
    (so a filter alone always fits one REQ)."""
    max_len = _limit(limits, "max_message_length")
    if max_len is None:
        return MAX_TAG_VALUE_BYTES_PER_FILTER
    # Room for the REQ frame, the filter's own keys and the slack; 128 bytes covers
    # `{"kinds":[30618],"#d":[],"since":…}` with margin.
    room = max_len - _req_overhead(limits) - PER_FILTER_SLACK - 128
    return max(1, min(MAX_TAG_VALUE_BYTES_PER_FILTER, room))


def values_cap(limits=None) -> int | None:
    """The most values one list of a filter may hold on the relay (its ids, its authors or
    one tag's): learnt from its refusal of more (``Refusals.learn_max_values``; no NIP-11
    key says it); None: no cap known."""
    return _limit(limits, "max_values")


def value_slices(f: Filter, most: int) -> list[dict]:
    """The selectors of filters that together ask what ``f`` asks, each list of values
    (ids, authors, a tag's) ``most`` long at most: slices of each longer list, sorted (a
    list is a disjunction, so its slices' filters OR back to it; two long lists give every
    pair of their slices). ``Filter.replace`` keywords; one empty dict: ``f`` fits."""
    most = max(1, most)
    out: list[dict] = [{}]
    for name in ("ids", "authors"):
        values = getattr(f, name)
        if values is not None and len(values) > most:
            parts = _slices(values, most)
            out = [dict(r, **{name: part}) for r in out for part in parts]
    if any(len(values) > most for _, values in f.tags):
        tag_sets: list[list] = [[]]
        for name, values in f.tags:
            parts = _slices(values, most) if len(values) > most else [values]
            tag_sets = [t + [(name, part)] for t in tag_sets for part in parts]
        out = [dict(r, tags=tuple(t)) for r in out for t in tag_sets]
    return out


def _slices(values: frozenset[str], most: int) -> list[frozenset[str]]:
    ordered = sorted(values)
    return [frozenset(ordered[i:i + most]) for i in range(0, len(ordered), most)]


def within_values(f: Filter, most: int) -> list[Filter]:
    """``f`` as filters of ``most`` values a list at most (``value_slices``)."""
    slices = value_slices(f, most)
    return [f] if slices == [{}] else [f.replace(**r) for r in slices]


def merge_tag_values(a: Filter, b: Filter, budget: int, most: int | None = None) -> Filter | None:
    """One filter asking for what ``a`` and ``b`` ask, when they differ only in the values
    of their one tag (the same tag) and the union's values fit ``budget`` bytes (and number
    ``most`` at most, ``values_cap``); else
    None. ``{"#e": [r1]}`` and ``{"#e": [r2]}`` → ``{"#e": [r1, r2]}``."""
    if len(a.tags) != 1 or len(b.tags) != 1 or a.tags[0][0] != b.tags[0][0]:
        return None
    if (a.ids, a.authors, a.kinds, a.since, a.until, a.limit) != (b.ids, b.authors, b.kinds, b.since, b.until, b.limit):
        return None
    name, values = a.tags[0]
    union = values | b.tags[0][1]
    if most is not None and len(union) > most:
        return None
    merged = a.replace(tags=((name, union),))
    return merged if merged.tag_value_bytes() <= budget else None


def paging_key(f: Filter):
    """Filters with the same key may share a historic REQ: semantic filters with each
    other (``PendingBatch`` paginates each safely however much they overlap), exact-id
    fetches only with each other."""
    return (f.limit, f.ids is None)


def twins(a: Filter, b: Filter) -> bool:
    """Filters over the same values of one tag each, under different tags (``#e``, ``#E``
    and ``#q`` of the same roots; ``#a``, ``#A``, ``#q`` of the same repositories): what one
    matches, the other mostly matches too (a comment tags its root by ``E`` and ``e``)."""
    if len(a.tags) != 1 or len(b.tags) != 1 or a.tags[0][0] == b.tags[0][0]:
        return False
    values, others = a.tags[0][1], b.tags[0][1]
    return values is others or values == others


def with_twin_before(filters: list[Filter]) -> list[bool]:
    """Per filter, whether the one before it is its twin (``pack_runs``'s ``together``)."""
    return [False] + [twins(a, b) for a, b in itertools.pairwise(filters)]


def pack_runs(costs: list[int], together: list[bool], per_req: int, max_len: int | None,
              overhead: int) -> list[list[int]]:
    """Items in order (their indices) into REQs of at most ``per_req`` items and ``max_len``
    characters (``overhead``, then each item's cost), as few as filling each REQ in turn
    makes; where that count allows, a run of items ``together`` (``together[i]``: item i goes
    with item i - 1) shares one REQ. A relay sends an event once per REQ however many of its
    filters match it (LocalRelay, strfry): twins split across two REQs brought a root's
    comments twice (bench/historic, about 500 copies a split)."""
    n = len(costs)

    def greedy(start: int) -> int:
        count, items, size = 0, 0, overhead
        for c in costs[start:]:
            if not count or items >= per_req or (max_len is not None and size + c > max_len):
                count, items, size = count + 1, 0, overhead
            items, size = items + 1, size + c
        return count

    bound = greedy(0)
    groups: list[list[int]] = []
    group: list[int] = []
    size = overhead
    i = 0
    while i < n:
        j = i + 1
        while j < n and together[j]:
            j += 1
        run = sum(costs[i:j])
        if (group and (len(group) + j - i > per_req or (max_len is not None and size + run > max_len))
                and j - i <= per_req and (max_len is None or overhead + run <= max_len)
                and len(groups) + 1 + greedy(i) <= bound):
            groups.append(group)  # closed early: the run goes whole into the next
            group, size = [], overhead
        for k in range(i, j):
            if group and (len(group) >= per_req or (max_len is not None and size + costs[k] > max_len)):
                groups.append(group)
                group, size = [], overhead
            group.append(k)
            size += costs[k]
        i = j
    if group:
        groups.append(group)
    return groups


def pack_into_reqs(filters: Iterable[Filter], limits=None, key=lambda f: f.limit) -> list[list[Filter]]:
    """Group filters into REQs: at most ``filters_per_req`` each, and the whole
    ``["REQ",<subid>,…]`` message within ``max_message_length``.

    Filters are packed in order; only filters with the same ``key`` share a REQ, and
    ``twins`` next to each other share one where that takes no more REQs (``pack_runs``).
    The default (``limit``) keeps live (limit 0) and historic filters apart; historic REQs
    that paginate pass ``paging_key``. A filter too large on its own still gets a REQ of its
    own (build it with ``tag_value_budget`` to avoid that).
    """
    per_req = filters_per_req(limits)
    max_len = _limit(limits, "max_message_length")
    overhead = _req_overhead(limits)
    by_key: dict[object, list[tuple[int, Filter]]] = {}
    first: dict[int, list[Filter]] = {}  # a REQ by its first filter's place: REQs in order
    for place, f in enumerate(filters):
        by_key.setdefault(key(f), []).append((place, f))
    for members in by_key.values():
        fs = [f for _, f in members]
        costs = [_filter_cost(f) for f in fs]
        for group in pack_runs(costs, with_twin_before(fs), per_req, max_len, overhead):
            first[members[group[0]][0]] = [fs[k] for k in group]
    return [first[place] for place in sorted(first)]


# -- subscription budget -----------------------------------------------------------------


# The fewest subscriptions gsync works with: the reserved slots (layer 1 live and one more,
# one historic) and one live REQ of coverage. A cap learnt from a relay's refusals
# ("too many concurrent REQs") is never set below this.
MIN_SUBSCRIPTIONS = CONTROL_PLANE_SLOTS + TRANSIENT_HISTORIC_SLOTS + 1


@dataclass(frozen=True)
class SubscriptionBudget:
    """How many concurrent subscriptions a relay allows us, and how they are shared.

    Two slots are kept for the control plane (layer-1 live + one) and one for transient
    historic work; the rest is for data-plane live subscriptions.
    """

    max_subscriptions: int

    @classmethod
    def from_limits(cls, limits=None) -> SubscriptionBudget:
        return cls(_limit(limits, "max_subscriptions") or DEFAULT_MAX_SUBSCRIPTIONS)

    @property
    def reserved(self) -> int:
        return CONTROL_PLANE_SLOTS + TRANSIENT_HISTORIC_SLOTS

    @property
    def live_slots(self) -> int:
        """Data-plane live subscriptions that may be open at once (0 on tiny relays)."""
        return max(0, self.max_subscriptions - self.reserved)

    def fits(self, active_live: int, adding: int = 1) -> bool:
        return active_live + adding <= self.live_slots

    def needs_consolidation(self, active_live: int, baseline: int, adding: int = 1) -> bool:
        """Consolidate when fragmentation has grown 70 past the irreducible baseline, or the
        next subscriptions would break the budget and packing everything anew (``baseline``,
        the new coverage included) takes fewer REQs than are open plus the new ones: a budget
        already full of packed coverage gains nothing from being rebuilt (what does not fit
        is polled instead)."""
        if active_live > baseline + CONSOLIDATION_EXCESS:
            return True
        return not self.fits(active_live, adding) and baseline < active_live + adding


# -- polled live coverage ------------------------------------------------------------------


def poll_interval(filter_bytes: int, reqs: int = 1, req_secs: float = 0.0) -> float:
    """How long after one poll of live coverage that did not fit the next may start, for
    polls whose filters serialize to ``filter_bytes`` and go out as ``reqs`` REQs:
    ``POLL_SECS_PER_KIB`` a KiB of them and ``POLL_SECS`` a REQ, whichever is longer, and no
    more than ``POLL_MAX_SECS``. A poll resends every filter, so a large one asked every few
    seconds costs a relay with nothing new megabytes a minute; and each of its REQs is a
    subscription opened and closed and one of the relay's paced starts, so a poll of filters
    that go alone (refused once) asked every 5 s took four of every five starts for the rest
    of the session (seed 515's year, relay5: a busy loop). What it asks reaches back to the
    last poll, so a wider spacing loses nothing, it only delays what the poll finds.
    ``req_secs``: a REQ's share where longer than POLL_SECS (``LiveCoverage.start_poll``:
    twice the relay's pace between starts, so polls take half of it at most, whatever pace
    its query-rate refusals taught): spaced at 5 s a REQ, a poll of a relay paced at 10 s
    began as the last ended, and the relay was asked at its limit all day, every other
    start waiting behind the polls' (the simulator, seed 983 of the 30-relay world: relay24,
    117 filters polled, a REQ every 10 s)."""
    by_size = filter_bytes / 1024 * constants.POLL_SECS_PER_KIB
    per_req = max(constants.POLL_SECS, req_secs)
    return min(constants.POLL_MAX_SECS, max(per_req * max(1, reqs), by_size))


# -- a NIP-77 query past the relay's result cap ------------------------------------------
# strfry refuses a NIP-77 query matching more than its maxSyncEvents ("blocked: too many
# query results"): narrower filters are served. Values split first (each half is a filter
# gsync would send anyway), then time: the range below this floor is one part, kept open
# below (nothing is ever left out), and halving starts above it, where events are.
RESULT_CAP_TIME_FLOOR = 1_640_995_200  # 2022-01-01, before NIP-34


def split_past_result_cap(f: Filter, now: int) -> list[Filter] | None:
    """Two filters that together ask exactly what ``f`` asks, each narrower, for a relay
    that refused ``f``'s NIP-77 query for its number of results; None when ``f`` cannot be
    narrowed (one value and one second): REQ pages then. The tag with the most values is
    halved; with one value per tag, its time range (``since`` or the floor, to ``until`` or
    ``now``) is halved, the lower part keeping ``f``'s open start, the upper its open end."""
    name, values = max(f.tags, key=lambda t: len(t[1]), default=(None, frozenset()))
    if len(values) > 1:
        ordered = sorted(values)
        middle = (len(ordered) + 1) // 2
        others = tuple(t for t in f.tags if t[0] != name)
        return [f.replace(tags=tuple(sorted(others + ((name, frozenset(part)),))))
                for part in (ordered[:middle], ordered[middle:])]
    if f.ids is not None and len(f.ids) > 1:
        ordered = sorted(f.ids)
        middle = (len(ordered) + 1) // 2
        return [f.replace(ids=frozenset(ordered[:middle])), f.replace(ids=frozenset(ordered[middle:]))]
    hi = f.until if f.until is not None else now
    if f.since is not None:
        lo = f.since
    else:
        lo = RESULT_CAP_TIME_FLOOR if hi > RESULT_CAP_TIME_FLOOR else 0
    if hi - lo < 1:
        return None
    middle = lo + (hi - lo) // 2
    return [f.replace(until=middle), f.replace(since=middle + 1)]
