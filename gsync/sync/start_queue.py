"""A relay's queue of historic starts and the ids they go by: the one place both are
written. ``HistoricSync`` and ``Refusals`` change the queue only through ``StartQueue``. Pure.

A session's queue is ``RelaySession.historic_queue``: ``(sub id, filters)`` entries in start
order, each an outstanding subscription of the batch ``RelaySession.sub_to_batch`` names
(``PendingBatch.outstanding_subs``, with its pages in ``PendingBatch.pagination``): the three
are kept in step here. An entry's kind is its id's type, minted here alone: a ``ReqId`` (a
REQ of filter pages, ``h…``) or an ``ExchangeToken`` (a NIP-77 exchange of one filter,
``neg…``). A batch's other outstanding marks, never queued, are an ``OwnReadToken`` (its
methods wait for the own relay's holdings, ``own…``) and a ``LeadWait`` (it waits for
other relays' lead on its items, ``lead…``). An id that comes back from a relay is a plain
string: its kind is that of the id it equals here.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator

from ..constants import MAX_FILTERS_PER_REQ, MAX_IDS_PER_REQ, MAX_OPEN_FILTER_BYTES, MIN_PAGE_CAP
from ..protocol.filters import Filter
from ..protocol.nip11 import RelayLimits
from . import filter_plan, one_filter, result_caps
from .batch_phase import Step
from .pending import (
    BatchKind,
    CrowdedSecond,
    FilterPaginationState,
    PageCap,
    PaginationState,
    PendingBatch,
    crowded_second_filter,
    exchange_asks,
    slow_answer,
    until_probe,
)
from .plan_actions import AGAIN, Advance, ExchangesEnded, Start
from .policy import regroup_parts

MAX_HISTORIC_SUBS = 4  # concurrent historic REQs per relay, within the transient budget


class ReqId(str):
    """A historic REQ's subscription id."""

    __slots__ = ()


class ExchangeToken(str):
    """A NIP-77 exchange's token (its NEG-OPEN's subscription id)."""

    __slots__ = ()


class OwnReadToken(str):
    """A batch waits for what the own relay holds of its filters (its methods are chosen then)."""

    __slots__ = ()


class LeadWait(str):
    """A batch waits for other relays' batches leading its items (``sync.lead``)."""

    __slots__ = ()


def is_exchange(sub_id: str) -> bool:
    return isinstance(sub_id, ExchangeToken)


def is_own_read(sub_id: str) -> bool:
    return isinstance(sub_id, OwnReadToken)


def req_bytes(sub_id: str, filters: Iterable[Filter] = ()) -> int:
    """Bytes of the REQ ``["REQ",<sub_id>,<filter>,…]`` that a queued start sends
    (``protocol.messages.req``), measured without building it: the queue's one measure of
    its REQs, for sharing them out (``repack``), filling one (``fill_by_splitting``) and the
    open filters' bytes (``next_start``). Its ids are minted here, plain ASCII: as JSON
    each is itself in quotes. A filter adds its JSON and a comma."""
    return 10 + len(sub_id) + sum(f.serialized_size() + 1 for f in filters)


def union_of_holdings(a, b) -> list:
    """Two holdings lists ((created_at, id) pairs) as one, each id once."""
    union = {event_id: (at, event_id) for at, event_id in a}
    union.update((event_id, (at, event_id)) for at, event_id in b)
    return list(union.values())


class StartQueue:
    """Every relay's start queue, written through these methods only, and the ids of what
    is queued, minted from ``ids`` (the manager's counter: unique among its tokens)."""

    def __init__(self, ids: Iterator[int]):
        self.ids = ids
        # REQ ids from a counter of their own: the REQs a sync sends are named alike
        # whatever else it minted ids for (own-relay reads, exchanges), and every EVENT frame
        # carries one back (the demo's world: 160 bytes more down with NIP-77 on, its REQs
        # the same, numbered after its own-relay reads)
        self.req_ids = itertools.count(1)

    # -- ids ------------------------------------------------------------------------------

    def batch_id(self) -> int:
        return next(self.ids)

    def req_id(self) -> ReqId:
        return ReqId(f"h{next(self.req_ids)}")

    def exchange_token(self, batch_id: int) -> ExchangeToken:
        return ExchangeToken(f"neg{batch_id}-{next(self.ids)}")

    def own_read_token(self, batch_id: int) -> OwnReadToken:
        return OwnReadToken(f"own{batch_id}-{next(self.ids)}")

    @staticmethod
    def lead_wait(batch_id: int) -> LeadWait:
        return LeadWait(f"lead{batch_id}")

    # -- adding ---------------------------------------------------------------------------

    def add_reqs(self, state, batch: PendingBatch, filters, front: bool = False) -> None:
        """``filters`` as REQs of ``batch``, packed within the relay's limits, at the end
        (or first: ``front``), then sharing REQs with the batch's queued ones."""
        self.add_packed(state, batch, pack(state, filters, batch), front)

    def add_packed(self, state, batch: PendingBatch, groups, front: bool = False) -> None:
        """``groups`` (``pack``) as REQs of ``batch``, as ``add_reqs``."""
        session = state.current
        shift = session.page_cap.until_shift if session.page_cap is not None else 0
        entries = []
        for group in groups:
            sub_id = self.req_id()
            entries.append((sub_id, add_subscription(batch, sub_id, group, shift)))
            session.sub_to_batch[sub_id] = batch.batch_id
        if front:
            session.historic_queue[0:0] = entries
        else:
            session.historic_queue.extend(entries)
        share_queued_reqs(state, batch)

    def add_exchange(self, state, batch: PendingBatch, flt: Filter, held) -> ExchangeToken:
        """One NIP-77 exchange for ``flt``, last; ``held`` (what the own relay holds of it,
        or None: the exchange reads it) is kept for it, so it is not asked again."""
        token = self.exchange_token(batch.batch_id)
        add_subscription(batch, token)
        batch.own_holdings[token] = held
        state.current.sub_to_batch[token] = batch.batch_id
        state.current.historic_queue.append((token, [flt]))
        return token

    def add_id_fetches(self, state, batch: PendingBatch, ids) -> None:
        """Id fetches finish a batch already started: first, as the next pages are
        (appended, a steady stream of new batches would starve them), one filter a REQ
        (relays cap ids per filter and per REQ). On a relay that ignores ``until``, no more
        ids a filter than it has served a filter: a cut id page is asked again there
        (``FilterPaginationState._ids_again``), each time with the ids it hides."""
        per = ids_per_filter(state.current.page_cap, most=filter_plan.values_cap(state.current.limits))
        for flt in reversed(id_filters(ids, per)):
            self.add_reqs(state, batch, [flt], front=True)

    def add_cut(self, state, batch: PendingBatch, cut, pages) -> None:
        """A filter's pieces past the relay's result cap (``result_caps``), first in the
        queue: they finish what was started (``pages``: its REQ pages packed, ``pack``)."""
        if pages:
            self.add_packed(state, batch, pages, front=True)
        queue = state.current.historic_queue
        tail = len(queue)
        for part in cut.exchanges:
            self.add_exchange(state, batch, part, None)  # each exchange reads its own holdings
        parted = queue[tail:]
        del queue[tail:]
        queue[0:0] = parted

    def add_next_pages(self, state, batch: PendingBatch, pages) -> None:
        """Pages after an EOSE (``on_eose`` named them: ``req_id``), first:
        they finish what was started."""
        for new_id, _ in pages:
            state.current.sub_to_batch[new_id] = batch.batch_id
        state.current.historic_queue[0:0] = pages
        share_queued_reqs(state, batch)

    def wait_for(self, batch: PendingBatch, mark: str) -> None:
        """``batch`` is not complete while it waits (an own read, a lead): ``mark`` is out."""
        add_subscription(batch, mark)

    # -- changing what is queued ----------------------------------------------------------

    def again_first(self, state, batch: PendingBatch, sub_id: str, filters) -> None:
        """A REQ the relay refused for rate or capacity: the same page again, first, under
        a new id (what it delivered so far is forgotten: it comes again)."""
        new_id = self.req_id()
        rename_subscription(batch, sub_id, new_id)
        restart_page(batch, new_id)
        state.current.sub_to_batch[new_id] = batch.batch_id
        state.current.historic_queue.insert(0, (new_id, filters))

    def split_first(self, state, batch: PendingBatch, sub_id: str, groups) -> list:
        """``sub_id``'s filters again as several REQs, first: ``groups`` are indices into
        its filters, one REQ each (``split_subscription``). Returns them."""
        entries = split_subscription(batch, sub_id, [(self.req_id(), g) for g in groups if g])
        for new_id, _ in entries:
            state.current.sub_to_batch[new_id] = batch.batch_id
        state.current.historic_queue[0:0] = entries
        return entries

    def split_values_first(self, state, batch: PendingBatch, sub_id: str, most: int) -> list:
        """``sub_id``'s filters again, first, none holding more than ``most`` values in one
        list (the relay refused more: ``Refusals.learn_max_values``), each piece at the page
        its filter was on (``FilterPaginationState.within_values``), as many to a REQ as
        the session packs. Returns the REQs ``(sub id, filters)``."""
        old = batch.pagination.pop(sub_id, None)
        batch.outstanding_subs.discard(sub_id)
        pieces = [p for s in (old.filters if old else ()) for p in s.within_values(most)]
        per = filter_plan.filters_per_req(batch_limits(state, batch))
        entries = []
        for i in range(0, len(pieces), per):
            group = pieces[i:i + per]
            new_id = self.req_id()
            batch.outstanding_subs.add(new_id)
            batch.pagination[new_id] = PaginationState(group)
            state.current.sub_to_batch[new_id] = batch.batch_id
            entries.append((new_id, [s.page_filter for s in group]))
        state.current.historic_queue[0:0] = entries
        return entries

    def unqueue_batch(self, state, batch: PendingBatch) -> None:
        """Every queued start of ``batch`` (none started) goes: it is packed anew."""
        queued = set(batch.outstanding_subs)
        state.current.historic_queue = [e for e in state.current.historic_queue if e[0] not in queued]
        for sub_id in queued:
            _unqueued(state.current, batch, sub_id)

    def drop_windows_of(self, state, batch: PendingBatch, timeless: Filter) -> list[Filter]:
        """The queued exchanges of ``batch`` asking ``timeless`` bounded in time go, unstarted
        (with what they held of the own relay); their filters are returned."""
        session = state.current
        kept, dropped = [], []
        for sub_id, group in session.historic_queue:
            if (is_exchange(sub_id) and session.sub_to_batch.get(sub_id) == batch.batch_id
                    and group[0].replace(since=None, until=None) == timeless):
                dropped.append(group[0])
                _unqueued(session, batch, sub_id)
            else:
                kept.append((sub_id, group))
        session.historic_queue = kept
        return dropped

    def exchanges_to_reqs(self, state) -> list:
        """NIP-77 is off: exchanges still queued become REQs of their batches (returned,
        each once, in order)."""
        session = state.current
        queued = [(t, g) for t, g in session.historic_queue if is_exchange(t)]
        session.historic_queue = [e for e in session.historic_queue if not is_exchange(e[0])]
        batches = {}
        for token, group in queued:
            batch = session.pending.get(session.sub_to_batch.get(token, -1))
            _unqueued(session, batch, token)
            if batch is not None:
                self.add_reqs(state, batch, group)
                batches[batch.batch_id] = batch
        return list(batches.values())

    def replace_filters(self, state, index: int, sub_id: str, filters) -> None:
        state.current.historic_queue[index] = (sub_id, filters)

    def by_priority(self, state) -> None:
        """Queued work re-derived after a rate-limit cooldown: in ``start_priority`` order."""
        state.current.historic_queue.sort(key=lambda entry: state.current.start_priority(entry[0]))

    # -- taking ---------------------------------------------------------------------------

    @staticmethod
    def to_front(state, index: int) -> None:
        queue = state.current.historic_queue
        if index:
            queue.insert(0, queue.pop(index))

    @staticmethod
    def drop_first(state) -> tuple:
        """The first entry leaves the queue (it starts, or it is stale)."""
        return state.current.historic_queue.pop(0)

    @staticmethod
    def drop_first_of(state, batch: PendingBatch | None, sub_id: str) -> None:
        """The first entry (``sub_id``) goes without starting, and with it the batch's
        subscription (what it held of the own relay too)."""
        state.current.historic_queue.pop(0)
        _unqueued(state.current, batch, sub_id)

    @staticmethod
    def ended(state, sub_id: str) -> int | None:
        """``sub_id`` ended (answered, closed, stalled): it names no batch any more.
        Returns the batch it was of."""
        return state.current.sub_to_batch.pop(sub_id, None)


def _unqueued(session, batch: PendingBatch | None, sub_id: str) -> None:
    """``sub_id`` left the queue without starting: it names no batch any more, and what its
    batch kept for it goes (the own relay's holdings read for it, a part of its filter still
    to read, a check's record)."""
    session.sub_to_batch.pop(sub_id, None)
    if batch is not None:
        for kept in (batch.own_holdings, batch.read_also, batch.silent_checks):
            kept.pop(sub_id, None)
        finish_subscription(batch, sub_id)


def pack(state, filters, batch: PendingBatch | None = None) -> list[list[Filter]]:
    """``filters`` as REQs within the relay's limits as ``batch`` packs them
    (``filter_plan.pack_into_reqs``, ``batch_limits``)."""
    return filter_plan.pack_into_reqs(filters, batch_limits(state, batch), key=filter_plan.paging_key)


def batch_limits(state, batch: PendingBatch | None) -> RelayLimits | None:
    """The relay's limits as ``batch``'s REQs are packed (a poll's: ``poll_limits``; a live
    look's: ``look_limits``)."""
    if batch is not None and batch.kind is BatchKind.POLL:
        return poll_limits(state)
    if batch is not None and batch.kind is BatchKind.AUDIT:
        return look_limits(state)
    return state.current.limits


def poll_limits(state) -> RelayLimits | None:
    """The relay's limits as a poll's REQs are packed: one filter a REQ on a relay polled
    filter by filter (``one_filter.polls_filter_by_filter``), whatever it takes."""
    limits = state.current.limits
    if not one_filter.polls_filter_by_filter(state):
        return limits
    return dataclasses.replace(limits if limits is not None else RelayLimits(), max_filters=1)


def look_limits(state) -> RelayLimits | None:
    """The relay's limits as a live look's REQs are packed: one filter a REQ on a relay
    looked at filter by filter (``one_filter.looks_filter_by_filter``), whatever it takes."""
    limits = state.current.limits
    if not one_filter.looks_filter_by_filter(state):
        return limits
    return dataclasses.replace(limits if limits is not None else RelayLimits(), max_filters=1)


def ids_per_filter(cap: PageCap | None, alone: bool = False, most: int | None = None) -> int:
    """Ids to one filter of an id fetch: as many as relays take, unless what a cut id page
    leaves goes nowhere; then no more than the connection has seen the relay serve a filter:
    on a relay that ignores ``until`` (``FilterPaginationState._ids_again`` asks the rest
    again there), and, once it has seen any, for ids with no filter behind them (``alone``:
    refused events fetched again, ``HistoricSync.fetch_ids``). Never more than the relay
    takes in one filter (``most``: ``filter_plan.values_cap``)."""
    served = cap.filter_served if cap is not None else 0
    bounded = served > 0 if alone else cap is not None and cap.until_ignored
    per = max(MIN_PAGE_CAP, min(MAX_IDS_PER_REQ, served)) if bounded else MAX_IDS_PER_REQ
    return per if most is None else max(1, min(per, most))


def id_filters(ids, per: int = MAX_IDS_PER_REQ) -> list[Filter]:
    """``ids`` by id, in order, as many to a filter as relays take (``per``)."""
    ids = sorted(ids)
    return [Filter.make(ids=ids[i:i + per]) for i in range(0, len(ids), per)]


def share_queued_reqs(state, batch: PendingBatch) -> None:
    """Queued REQs of one batch (next pages, first pages of a later AddFilters) are
    packed again filter by filter, in queue order, ten to a REQ within the relay's
    message size: every start carries as many filter pages as it can, the pages that
    finish what was started first, and a REQ of next pages takes first pages along
    rather than waiting to be filled by splitting (``HistoricSync.fill_before_start``).
    Exact-id fetches and pages that must go alone stay as they are."""
    session = state.current
    shared = [sub_id for sub_id, _ in session.historic_queue
              if session.sub_to_batch.get(sub_id) == batch.batch_id and may_share(batch, sub_id)]
    if len(shared) < 2:
        return
    per_req = filter_plan.filters_per_req(batch_limits(state, batch))
    if per_req == 1 and all(len(batch.pagination[sub_id].filters) == 1 for sub_id in shared):
        return  # one filter a REQ, each alone already: nothing to share (a relay answering one
        # filter a REQ polls hundreds of them an hour, and each page repacked them all)
    groups = repack(batch, shared, per_req, filter_plan.req_length_limit(session.limits))
    if groups is None:
        return  # (packed for limits lowered since: they go as they are)
    kept = []
    for sub_id, group in session.historic_queue:
        if sub_id in groups:
            kept.append((sub_id, groups[sub_id]))
        elif sub_id in shared:
            session.sub_to_batch.pop(sub_id, None)  # its filters went to earlier REQs
        else:
            kept.append((sub_id, group))
    session.historic_queue = kept


def queued_of(state, batch: PendingBatch) -> Iterable[tuple[int, str, list]]:
    """(index, id, filters) of each queued start of ``batch``."""
    for i, (sub_id, group) in enumerate(state.current.historic_queue):
        if state.current.sub_to_batch.get(sub_id) == batch.batch_id:
            yield i, sub_id, group


# -- the next start ------------------------------------------------------------------------


def next_start(plan, state, open_any: bool, open_bytes: int, now: float):
    """The queued start that goes now (``Start``), taken from the queue; ``AGAIN`` when
    a regroup left its batch with nothing outstanding (it is finished: ``Advance``,
    then the queue asked again); None when nothing may go: the queue is empty, what is
    queued waits for exchanges to answer (``first_startable``), or the REQ would pass
    the open filters' bytes (one open historic REQ must end first). What goes first is
    decided before the queue changes (``before_start``)."""
    session = state.current
    while session.historic_queue:
        ready = before_start(plan, state, now)
        if ready is None:
            return None  # thread starts waiting for their batch's layer-2 exchanges: those pump
        first, sub_id, group, parts, cut, pages = ready
        plan.queue.to_front(state, first)
        if sub_id not in session.sub_to_batch:
            plan.queue.drop_first(state)
            continue
        if parts is not None:
            regrouped = regroup(plan, state, sub_id, parts)
            if is_exchange(sub_id) and not any(map(is_exchange, regrouped.outstanding_subs)):
                # its last exchange, dropped: what the others found is fetched now, as at the
                # last one's answer (seed 13's year judged a relay not to serve ids it was
                # never asked by id)
                plan.todo += [ExchangesEnded(state, regrouped), Advance(state, regrouped, pump=False)]
                return AGAIN
            if regrouped.is_complete:
                plan.todo.append(Advance(state, regrouped, pump=False))
                return AGAIN
            continue
        batch = session.pending.get(session.sub_to_batch[sub_id])
        if cut is not None:
            plan.queue.drop_first_of(state, batch, sub_id)
            plan.log.info("negentropy_filter_cut", relay=state.url, batch_id=batch.batch_id, parts=len(cut.exchanges),
                          pages=len(cut.pages), limit=state.result_cap.limit())
            plan.queue.add_cut(state, batch, cut, pages)
            continue
        group = fill_before_start(plan, state, batch, sub_id, group)
        if open_any and open_bytes + req_bytes(sub_id, group) > MAX_OPEN_FILTER_BYTES:
            return None  # wait for a historic REQ to finish and free room
        plan.queue.drop_first(state)
        if batch is not None and not batch.started:
            plan.move(state, batch, Step.FIRST_START)  # a later AddFilters queues beside it
        if not is_exchange(sub_id):
            return Start(sub_id, group, batch)
        asks = exchange_asks(group[0], session.page_cap)
        return Start(sub_id, group, batch, exchange_holdings(plan, batch, sub_id, group[0], now, asks), asks)
    return None


def before_start(plan, state, now: float):
    """The queued start that may go first (``first_startable``; None: none may) and what
    the relay taught us since it was queued says of it, decided before the queue changes:
    ``(index, id, filters, parts, cut, pages)``. ``parts`` (``policy.regroup_parts``): a REQ that
    meets shapes paused, stalled or refused goes as these REQs (an exchange not at all; a
    probe's own filter stays as it is). ``cut`` (``result_caps.cut_before_start``): an
    exchange, on a relay whose result cap is known, for a filter the own relay alone holds
    more of than that, goes as these pieces now, not one refusal later (its holdings: what
    its batch read for it, else what the session knows; unknown, the exchange reads them
    and a refusal cuts it if one comes), ``pages`` its REQ pages packed (``pack``). Each
    is None when the start goes as it is."""
    first = first_startable(state)
    if first is None:
        return None
    session = state.current
    sub_id, group = session.historic_queue[first]
    batch_id = session.sub_to_batch.get(sub_id)
    if batch_id is None:
        return first, sub_id, group, None, None, None  # stale: it is dropped
    parts = None
    if batch_id not in session.probes and (state.paused or session.stalled_shapes or state.paused.refused_any):
        parts = regroup_parts(state.paused, session.stalled_shapes, group)
    batch = session.pending.get(batch_id)
    held = None
    # (not on a relay that ignores ``until``: neither windows nor pages shrink what it
    # counts; a cut to a REQ page came back unpaged, went to NIP-77 and was cut again, a
    # start each, 2,000 an hour: seed 277. The exchange goes, and a refusal splits it by
    # what it enumerates, ``batch_end.split_past_result_cap``.)
    page_cap = session.page_cap
    if (parts is None and batch is not None and is_exchange(sub_id) and state.result_cap.limit() is not None
            and not (page_cap is not None and page_cap.until_ignored)):
        held = batch.own_holdings.get(sub_id)
        if held is None:
            held = plan.own_held.holdings(group[0], now)
    cut = pages = None
    if held is not None:
        cut = result_caps.cut_before_start(state.result_cap, group[0], [*held, *plan.have_beyond_holdings(group[0])])
    if cut is not None:
        pages = filter_plan.pack_into_reqs(cut.pages, session.limits, key=filter_plan.paging_key)
    return first, sub_id, group, parts, cut, pages


def first_startable(state) -> int | None:
    """Where the first queued start that may go now is: the first, unless it asks for
    threads (``#e``/``#E``/``#q`` of roots: an exchange, or a REQ with such a filter) for a
    batch whose layer-2 exchanges have not all answered; what those find missing may be
    roots, whose threads then join it (``cover_threads_ahead``) instead of taking a round
    of their own. They end by their deadline, and pump again when they do. None: all
    that is queued waits so. A follower's starts (checks of another relay's lead) go after
    the relay's own leads, and a check below an exchange's oldest (``SilentCap``: almost
    always whole) after every other sync start, before upkeep: it takes a gate interval no
    sync start wanted (its batch fetches what the other exchanges found meanwhile)."""
    queue, session = state.current.historic_queue, state.current
    layer2 = None  # batches with a layer-2 exchange queued or running
    follower = None  # the first startable entry of a follower's batch: after the others
    check = None  # the first check below an exchange's oldest (``SilentCap``): after the rest
    for i, (sub_id, group) in enumerate(queue):
        if any(map(filter_plan.asks_by_root, group)):
            if layer2 is None:
                layer2 = {run.batch_id for run in session.neg_running.values()
                          if filter_plan.asks_by_repo(run.filter)}
                layer2.update(session.sub_to_batch[token] for token, g in queue if token in session.sub_to_batch
                              and is_exchange(token) and filter_plan.asks_by_repo(g[0]))
            if session.sub_to_batch.get(sub_id) in layer2:
                continue
        batch = session.pending.get(session.sub_to_batch.get(sub_id))
        if batch is not None and sub_id in batch.silent_checks:
            check = i if check is None else check
            continue
        if batch is not None and batch.kind.upkeep and check is not None:
            return check  # (before upkeep: polls and probes come back, the check once)
        if batch is None or not batch.follower:  # a stale entry (None) goes: pump drops it
            return i
        if follower is None:
            follower = i
    return follower if follower is not None else check


def regroup(plan, state, sub_id: str, parts) -> PendingBatch:
    """The first queued start (``sub_id``) goes as ``parts`` (``policy.regroup_parts``):
    a REQ as several, first; an exchange not at all. Its batch."""
    session = state.current
    batch = session.pending[session.sub_to_batch[sub_id]]
    plan.queue.drop_first_of(state, None, sub_id)
    if is_exchange(sub_id):
        finish_subscription(batch, sub_id)
    else:
        plan.queue.split_first(state, batch, sub_id, parts)
    return batch


def fill_before_start(plan, state, batch: PendingBatch | None, sub_id: str, group: list[Filter]) -> list[Filter]:
    """The REQ about to start: its filters that filled their last page are split into
    the room left (``fill_by_splitting``), within the relay's message size.
    Not towards a relay that refused us for query rate: more filters for the same
    events would only bring its next refusal sooner."""
    if batch is None or is_exchange(sub_id) or plan.health.limits_query_rate(state.url):
        return group
    group = fill_by_splitting(batch, sub_id, filter_plan.filters_per_req(batch_limits(state, batch)),
                                    filter_plan.req_length_limit(state.current.limits))
    plan.queue.replace_filters(state, 0, sub_id, group)
    return group


def exchange_holdings(plan, batch: PendingBatch | None, token: str, flt: Filter, now: float,
                      asks: Filter | None = None):
    """(what the own relay holds of ``flt``, a part of it whose holdings are not known)
    for an exchange about to start: what its batch read for it, with what is now known
    of values that joined it since; else what the session knows (None: the exchange
    reads it). ``asks``: what its NEG-OPEN sends, when that reaches past ``flt``
    (``exchange_asks``): the session's knowledge of it first, so that what the own relay
    holds in the second beyond is not found missing."""
    held = batch.own_holdings.pop(token, None) if batch is not None else None
    also = batch.read_also.pop(token, None) if batch is not None else None
    if asks is not None and asks != flt and (known := plan.own_held.holdings(asks, now)) is not None:
        return known, None
    if held is None:
        return plan.own_held.holdings(asks or flt, now), None
    if also is not None and (known := plan.own_held.holdings(also, now)) is not None:
        return union_of_holdings(held, known), None
    return held, also


def slots(state, open_subs) -> tuple[int, int]:
    """(historic REQs and exchanges the relay may have open at once, those open):
    what its subscription budget leaves beside live coverage, 1 to MAX_HISTORIC_SUBS;
    and its historic REQs among ``open_subs`` (the connection's) with the NIP-77
    exchanges running."""
    session = state.current
    budget = filter_plan.SubscriptionBudget.from_limits(session.limits)
    room = budget.max_subscriptions - len(session.live_subs) - 1
    return (max(1, min(MAX_HISTORIC_SUBS, room)),
            len(session.neg_running) + sum(1 for s in session.sub_to_batch if s in open_subs))


# -- a batch's subscriptions: its outstanding ids and their pages -------------------------
# (``PendingBatch.outstanding_subs`` and ``PendingBatch.pagination`` are written here alone)


def add_subscription(batch: PendingBatch, sub_id: str, filters: Iterable[Filter] = (),
                     until_shift: int = 0) -> list[Filter]:
    """``sub_id`` outstanding in ``batch``, paging ``filters``; returns the filters to send
    (``until`` one second on where the relay reads it as exclusive: ``until_shift``)."""
    batch.outstanding_subs.add(sub_id)
    states = [FilterPaginationState.start(f, until_shift) for f in filters]
    if states:
        batch.pagination[sub_id] = PaginationState(states)
    return [s.page_filter for s in states]


def finish_subscription(batch: PendingBatch, sub_id: str) -> None:
    """The caller's own end for a filterless entry (e.g. the NIP-77 exchange)."""
    batch.outstanding_subs.discard(sub_id)
    batch.pagination.pop(sub_id, None)


def rename_subscription(batch: PendingBatch, old: str, new: str) -> None:
    """Carry pagination over when the next page is sent under a fresh subscription id."""
    if old in batch.outstanding_subs:
        batch.outstanding_subs.discard(old)
        batch.outstanding_subs.add(new)
    if old in batch.pagination:
        batch.pagination[new] = batch.pagination.pop(old)


def restart_page(batch: PendingBatch, sub_id: str) -> None:
    """The current page will be sent again (its sub was refused for rate): forget what
    it delivered so far, or re-delivered events would be counted twice."""
    state = batch.pagination.get(sub_id)
    if state is not None:
        state.filters = [s.restarted() for s in state.filters]


def split_subscription(batch: PendingBatch, sub_id: str, parts) -> list[tuple[str, list[Filter]]]:
    """Send ``sub_id``'s filters again as several REQs: ``parts`` is ``(new sub id,
    indices into its filters)`` each; filters in no part are dropped. For a REQ the
    relay refused or never finished as a whole, to find the filter at fault. Each
    part restarts the page it was on. Returns ``(new sub id, filters)`` to queue."""
    state = batch.pagination.pop(sub_id, None)
    batch.outstanding_subs.discard(sub_id)
    out = []
    for new_id, indices in parts:
        group = [state.filters[i].restarted() for i in indices] if state else []
        if not group:
            continue
        batch.outstanding_subs.add(new_id)
        batch.pagination[new_id] = PaginationState(group)
        batch.split_parts.add(new_id)
        out.append((new_id, [s.page_filter for s in group]))
    return out


def may_share(batch: PendingBatch, sub_id: str) -> bool:
    """May this (queued) subscription share a REQ with others of the batch? Not an
    exact-id fetch (relays cap those per REQ too), nor a page that must go alone."""
    state = batch.pagination.get(sub_id)
    return state is not None and sub_id not in batch.split_parts and not any(
        s.alone or s.page_filter.ids is not None for s in state.filters)


def repack(batch: PendingBatch, sub_ids: list[str], per_req: int = MAX_FILTERS_PER_REQ,
           max_chars: int | None = None) -> dict[str, list[Filter]] | None:
    """Queued subscriptions (none started, all ``may_share``) share out their filters
    again, in order, into as few REQs as ``per_req`` filters and ``max_chars`` of
    ``["REQ",…]`` allow, twins together where that takes no more (``filter_plan.pack_runs``):
    the first subscriptions take them, the rest end. Returns sub id -> filters for those
    that carry some. (Filling in order is optimal where each original REQ fit; one packed
    before the relay's limits were lowered may not: then more REQs would come out than went
    in, and nothing is repacked, None. The simulator's seed 978 of a 30-relay world with
    value caps: slices of a refused filter packed ten to a REQ, repacked for looks one filter
    a REQ, and the manager's handler raised.)"""
    states = [s for sid in sub_ids for s in batch.pagination[sid].filters]
    frame = max(req_bytes(sid) for sid in sub_ids)
    flts = [s.page_filter for s in states]
    costs = [f.serialized_size() + 1 for f in flts]  # as req_bytes counts
    groups = list(filter_plan.pack_runs(costs, filter_plan.with_twin_before(flts), per_req, max_chars, frame))
    if len(groups) > len(sub_ids):
        return None
    names = iter(sub_ids)
    out: dict[str, list[Filter]] = {}
    for group in groups:
        name = next(names)
        batch.pagination[name].filters = [states[k] for k in group]
        out[name] = [flts[k] for k in group]
    for name in names:
        finish_subscription(batch, name)
    return out


def filters_of(batch: PendingBatch, sub_id: str) -> list[Filter]:
    state = batch.pagination.get(sub_id)
    return state.page_filters if state else []


def fill_by_splitting(batch: PendingBatch, sub_id: str, per_req: int = MAX_FILTERS_PER_REQ,
                      max_chars: int | None = None) -> list[Filter]:
    """Just before ``sub_id`` starts: its filters that filled their last page are split
    by value (``split_for_throughput``) into the slots of the REQ that nothing else
    took, as many as ``max_chars`` of ``["REQ",…]`` allow. The pieces replace the
    filters in its pagination. Returns its filters. Not for a REQ that must stay as it
    is (``may_share``: an id fetch, a page alone)."""
    state = batch.pagination.get(sub_id)
    if state is None or not may_share(batch, sub_id) or not any(s.full for s in state.filters):
        return filters_of(batch, sub_id)
    for slots in range(per_req, len(state.filters), -1):
        pieces = split_for_throughput(state.filters, slots)
        if len(pieces) == len(state.filters):
            break  # nothing divides further (single values)
        if max_chars is None or req_bytes(sub_id, [p.page_filter for p in pieces]) <= max_chars:
            state.filters = pieces
            break
    return state.page_filters


def on_eose(batch: PendingBatch, sub_id: str, per_req: int = MAX_FILTERS_PER_REQ, pack=None,
            new_sub_id=None, cap: PageCap | None = None,
            elapsed: float | None = None, past_until: tuple[int, ...] = ()) -> list[tuple[str, list[Filter]]]:
    """The next pages after ``sub_id``'s EOSE, as ``(sub_id, filters)`` REQs to send;
    empty when every filter of the sub is done. Each REQ is an outstanding sub of the
    batch. The first keeps ``sub_id`` unless ``new_sub_id`` (a callable) names them all;
    ``pack`` groups filters into REQs (default: one REQ, ``per_req`` filters at most).
    ``cap`` is the relay's ``PageCap``, kept per connection: this page teaches it too.
    ``elapsed``: seconds from the REQ to its EOSE (a slow page may have been cut).
    ``past_until``: per filter, events the relay sent newer than its ``until`` (one that
    ignores it: they count toward what it served the filter).
    Pages that filled stay whole here; ``fill_by_splitting`` splits them when their
    REQ is about to start.
    """
    state = batch.pagination.get(sub_id)
    finish_subscription(batch, sub_id)
    if state is None:
        return []
    cap = cap or PageCap()
    state.teach(cap, elapsed)
    for s in state.filters:  # (an id's last answer decides: a quick one that lacked it is a witness)
        if s.page_filter.ids is not None:
            lacking = s.page_filter.ids - {i for _, i in s.seen}
            if slow_answer(elapsed):
                batch.ids_answered_slowly |= lacking
            else:
                batch.ids_answered_slowly -= lacking
    by_itself = len(state.filters) == 1
    past_until = past_until or (0,) * len(state.filters)  # (none told: none past)
    continuing = [n for n in (s.next_page(cap, state.total, elapsed, by_itself, past)
                              for s, past in zip(state.filters, past_until, strict=False)) if n]
    continuing += _unproven_seconds_again(batch, state, cap, ending=not continuing and not batch.outstanding_subs)
    batch.crowded += [
        CrowdedSecond(crowded_second_filter(s.original_filter, s.crowded[0]), *s.crowded,
                      again=s.one_second)
        for s in state.filters if s.crowded is not None]
    for s in state.filters:
        if s.unpaged is not None:
            batch.crowded.append(CrowdedSecond(s.unpaged, s.unpaged.until or 0, len(s.seen), span=True))
            batch.unpaged.add(s.original_filter)
    by_filter = {s.page_filter: s for s in continuing if not s.alone}
    pack = pack or (lambda fs: [fs[i:i + per_req] for i in range(0, len(fs), per_req)])
    groups = [[s] for s in continuing if s.alone]
    if by_filter:
        groups += [[by_filter[f] for f in group] for group in pack(list(by_filter))]
    names = new_sub_id or _first_then_numbered(sub_id)
    pages = []
    for group in groups:
        name = names()
        batch.outstanding_subs.add(name)
        batch.pagination[name] = PaginationState(group)
        pages.append((name, [s.page_filter for s in group]))
    return pages


def _unproven_seconds_again(batch: PendingBatch, state: PaginationState, cap: PageCap, ending: bool) -> list:
    """The seconds this batch's pages left behind before the connection knew how the relay
    reads ``until`` (``FilterPaginationState.passed``), asked again once each where they
    may be missing: bounded as the relay reads it once it is known to read it as
    exclusive; none once it is known to read it as NIP-01 says. A batch that would end
    (``ending``) not knowing asks first (``pending.until_probe``), alone; if that does not
    tell, they are asked with ``until`` one second on, what either reading serves them with."""
    if cap.until_inclusive:
        batch.unproven_seconds.clear()
        return []
    batch.unproven_seconds += [(s.original_filter, s.passed) for s in state.filters if s.passed is not None]
    newest = [max(s.seen) for s in state.filters if s.seen] + [batch.newest_seen] * (batch.newest_seen is not None)
    if newest:
        batch.newest_seen = max(newest)
    if not batch.unproven_seconds or not (cap.until_exclusive or ending):
        return []
    if not cap.until_exclusive and not batch.until_probed and batch.newest_seen is not None:
        # Ending, not knowing: one event it served, bounded to its second, tells.
        batch.until_probed = True
        probe = FilterPaginationState.start(until_probe(batch.newest_seen[1], batch.newest_seen[0]))
        probe.alone = True
        return [probe]
    seconds, batch.unproven_seconds = batch.unproven_seconds, []
    # (``until`` one second on: exclusive, as the relay reads it; not known, what either serves)
    return [FilterPaginationState.start(f.replace(since=second, until=second), 1) for f, second in seconds]


def on_closed(batch: PendingBatch, sub_id: str) -> list[Filter]:
    """The relay ended a sub before EOSE: the batch cannot complete cleanly. Returns the
    filters the sub was carrying, for the caller's log or rebuild."""
    filters = filters_of(batch, sub_id)
    if sub_id in batch.outstanding_subs:
        batch.mark_failed()
    finish_subscription(batch, sub_id)
    return filters


def split_for_throughput(states: list[FilterPaginationState], per_req: int):
    """Split the filters that filled a page so that, with the others of their REQ (kept
    whole), they fill one REQ of ``per_req`` filters: the full ones share the slots left
    as evenly as they divide."""
    full = [s for s in states if s.full]
    rest = [s for s in states if not s.full]
    if not full:
        return rest
    share, extra = divmod(max(0, per_req - len(rest)), len(full))
    return [piece for i, s in enumerate(full) for piece in s.split(share + (i < extra))] + rest


def _first_then_numbered(sub_id: str):
    count = 0

    def name() -> str:
        nonlocal count
        count += 1
        return sub_id if count == 1 else f"{sub_id}.{count}"
    return name
