"""The historic path's decisions, for every relay: what a batch starts with, which method
each filter takes, which queued start goes next, what an EOSE and an exchange's outcome
lead to. Pure: it changes the batches, the start queue (through ``start_queue``, which
alone writes it) and the pure trackers it is given (``lead``, ``claims``, ``recovery``,
``health``), and hands what must cross into I/O or another of the manager's concerns back
as actions (``sync.plan_actions``) for ``io.manager.historic`` to execute, in order. What a
batch's end leads to (residuals, confirmation) is ``sync.batch_end``.

Time comes in as ``now``; what the own relay and the fetch pipeline hold is read through
the lookups it is given (``own_held``, ``seen``, ``rejected``, ``delivery``)."""
from __future__ import annotations

from .. import constants
from ..protocol.filters import Filter
from . import filter_plan, method, start_queue
from .batch_phase import Step
from .pending import BatchKind, CrowdedSecond, PendingBatch, SyncMethod, split_crowded
from .plan_actions import (
    AwaitRead,
    Close,
    Count,
    LogActions,
    OwnKnown,
    ReadOwn,
)
from .repos import identifier_of
from .shard import OTHER_SHARD_LEAD
from .start_queue import StartQueue, is_exchange, is_own_read, queued_of, union_of_holdings
from .targets import PendingItems

# Events of one filter a page brought newer than its ``until`` that show the relay ignores it:
# such a relay sends the filter's newest page again, as many as its cap (10 at the least
# gsync assumes); one stray event (a relay's junk, an unrequested event it matched but for
# its time) is no sign, and marked the relay so for its session: its filters not paged past
# their first page (the simulator's seed 1601 of --slow-unbounded 0.4: an honest relay's
# junk, then 161 events the own relay lost not refilled from it in 6 h)
UNTIL_IGNORED_MIN_PAST = 2


class HistoricPlanner:
    """The decisions of ``HistoricSync``: each entry point changes what it owns and leaves
    its actions in ``todo``, which the manager takes (``take``) and executes. ``move``
    moves a batch's phase (``io.manager.historic.move_batch``: an illegal move is logged,
    raised under test)."""

    def __init__(self, *, sync, queue: StartQueue, relays, repos, health, lead, claims, recovery,
                 own_held, seen, rejected, delivery, move):
        self.sync = sync
        self.queue = queue
        self.relays = relays
        self.repos = repos
        self.health = health
        self.lead = lead
        self.claims = claims
        self.recovery = recovery
        self.own_held = own_held
        self.seen = seen
        self.rejected = rejected
        self.delivery = delivery
        self.move = move
        self.todo: list = []  # the actions asked, in order, until the manager takes them
        self.log = LogActions(self.todo)

    def take(self) -> list:
        todo = self.todo[:]
        self.todo.clear()
        return todo

    # -- a batch's start ------------------------------------------------------------------

    def start(self, state, items: PendingItems, filters, kind: BatchKind, coalesce: bool, leaders, go_now: bool,
              now: float) -> tuple[PendingBatch, bool]:
        """A PendingBatch for ``filters``. Where the relay allows NIP-77 (full history only:
        a ``since`` catch-up is cheaper as a REQ), the own relay's holdings are read first
        and each filter gets the method that spends fewer paced starts on what it lacks
        (``on_own_holdings_read``); otherwise grouped REQ+EOSE at once.

        ``coalesce`` (AddFilters): when an earlier REQ+EOSE batch of AddFilters (or of
        layer 1) on this relay is still pending, this one joins it instead, and their
        filters share REQs with its queued ones: fewer, fuller REQs for the same paced
        starts. Its items then confirm with that batch, as if both had come in one
        AddFilters.

        ``leaders``: batches of other relays leading these items' first sync
        (``lifecycle.start_sync``, ``sync.lead``): this batch waits for them before it reads
        the own relay (``wait_for_leaders``), while the wait pays (``follower_wait``; not
        with ``go_now``: the caller found it does not). Another shard's lead is waited for
        whatever it saves (no word comes from it: only the wait's bound ends it). Without
        leaders, the batch leads its items.

        Filters whose shape the relay refused by policy are left out (``refusals``).
        Returns (the batch, True), or (the pending batch it joined, False)."""
        filters = state.paused.allowed(filters)
        asks_own = kind is not BatchKind.RECOVERY and self.use_negentropy(state, filters, now)
        if coalesce and not asks_own:
            waiting = self.waiting_req_batch(state)
            if waiting is not None:
                self.coalesce_into(state, waiting, items, filters)
                return waiting, False
        if kind is BatchKind.LAYER1:  # every fresh start, quick reconnect and daily sync begins with layer 1
            state.round_started_at = now
        batch = PendingBatch(self.queue.batch_id(), items, kind=kind)
        batch.semantic_filters = list(filters)
        state.current.pending[batch.batch_id] = batch
        wait = self.follower_wait(state, items, leaders, filters) if asks_own and leaders else None
        if wait is not None and (go_now or not (wait.wait or OTHER_SHARD_LEAD in leaders)):
            batch.share_all = True  # waiting would cost more than the pages it saves
            self.lead.lead((state.url, batch.batch_id), items)  # it fetches them: a later relay may follow it
            self.read_own_holdings(state, batch, filters, coalesce, now)
        elif wait is not None:
            self.wait_for_leaders(state, batch, coalesce, leaders, wait.max_secs, now)
        elif asks_own:
            self.lead.lead((state.url, batch.batch_id), items)
            self.read_own_holdings(state, batch, filters, coalesce, now)
        else:
            self.lead.lead((state.url, batch.batch_id), items)
            batch.coalescable = coalesce or kind is BatchKind.LAYER1  # NIP-77 batches never take in REQ work
            self.queue.add_reqs(state, batch, filters)
        return batch, True

    @staticmethod
    def waiting_req_batch(state, besides: PendingBatch | None = None):
        """The latest pending batch that takes in AddFilters, if any."""
        return next((b for b in reversed(state.current.pending.values())
                     if b.coalescable and b is not besides), None)

    def coalesce_into(self, state, batch: PendingBatch, items: PendingItems, filters) -> None:
        """Add an AddFilters to a pending REQ+EOSE batch. None of its REQs started: pack them
        all anew; some did: queue the new filters, sharing REQs with its queued pages. The
        batch leads the new items' first sync (``sync.lead``)."""
        batch.items.add(items)
        self.lead.lead((state.url, batch.batch_id), items)
        batch.semantic_filters += filters
        if batch.started:
            self.queue.add_reqs(state, batch, filters)
        else:
            self.queue.unqueue_batch(state, batch)
            self.queue.add_reqs(state, batch, batch.semantic_filters)
        self.log.debug("batch_coalesced", relay=state.url, batch_id=batch.batch_id, filters=len(batch.semantic_filters))

    def use_negentropy(self, state, filters, now: float) -> bool:
        return self.negentropy_usable(state, now) and all(f.since is None and f.ids is None for f in filters)

    def negentropy_usable(self, state, now: float) -> bool:
        """NIP-77 on this relay: configured, not failed this session, not disabled by a
        rate-limit episode, and what it advertises can be fetched (``serves_ids``)."""
        return (
            self.sync.negentropy
            and state.current.negentropy_ok
            and self.health.negentropy_allowed(state.url)
            and state.serves_ids(now)
        )

    # -- following another relay's lead ---------------------------------------------------

    def wait_for_leaders(self, state, batch: PendingBatch, coalesce: bool, leaders, max_secs: float,
                         now: float) -> None:
        """Other relays are fetching these repositories first: this batch reads the own
        relay's holdings once none of their open pages asks for its items (or they chose
        NIP-77, or ``max_secs`` passed: as long as the wait is worth, ``method.follower_wait``),
        and then takes NIP-77 only where they brought enough to pay for its starts
        (``method.choose_methods``). Nothing of it starts meanwhile."""
        self.move(state, batch, Step.WAITS_FOR_LEAD)
        batch.follower = True
        batch.led_elsewhere = OTHER_SHARD_LEAD in leaders
        batch.coalesce_wanted = coalesce
        self.queue.wait_for(batch, self.queue.lead_wait(batch.batch_id))  # not complete while it waits
        self.lead.wait((state.url, batch.batch_id), leaders, now, batch.items, max_secs)
        self.log.debug("historic_waits_for_lead", relay=state.url, batch_id=batch.batch_id,
                 leaders=sorted({url for url, _ in leaders}))
        if batch.led_elsewhere:
            self.read_ahead(state, batch, now)

    def read_ahead(self, state, batch: PendingBatch, now: float, filters=None) -> None:
        """A batch that waits for another shard's lead reads what it does not know of the
        own relay now (of ``filters``: all of its own by default), with this instance's
        other reads, while the own relay holds little of it: what the other shard stores
        meanwhile is seen live (``OwnLanded``), so once the wait is over its holdings are
        known without reading that shard's events back."""
        filters = batch.semantic_filters if filters is None else filters
        # what is being read will be known in time: the rest is read now
        reads = [read for flt in filters if (read := self.own_held.unread(flt, now)) is not None]
        if reads:
            self.todo.append(ReadOwn(state, batch.batch_id, self.queue.lead_wait(batch.batch_id), [], reads,
                                     False, ahead=True))

    def join_other_shard_wait(self, state, items: PendingItems, filters_of, now: float) -> bool:
        """``items`` another shard leads join the relay's batch that began waiting for
        another shard's lead within OTHER_SHARD_JOIN_SECS, if there is one (else False):
        one batch, its filters (``filters_of(items)``) rebuilt over all its items, instead
        of one per batch window. Once the wait is over, each of its filters carries many
        roots: a few roots' threads, held in full by then, went by REQ pages (a start is
        worth more than a few events brought again) and brought every event again; two
        shards received 9,000 such copies in bench/scale's 20,000-event world. It waits no
        longer for them: a part that joins late waits on while the other shard keeps
        storing (``sync.shard.waits_on_other_shard``), OTHER_SHARD_WAIT_MAX_SECS in all."""
        for batch in reversed(state.current.pending.values()):
            since = self.lead.waiting_since((state.url, batch.batch_id)) if batch.led_elsewhere else None
            if since is not None and now - since < constants.OTHER_SHARD_JOIN_SECS:
                break
        else:
            return False
        added = filters_of(items)
        batch.items.add(items)
        batch.semantic_filters = filters_of(batch.items)
        self.log.debug("historic_joins_other_shard_wait", relay=state.url, batch_id=batch.batch_id,
                       repos=len(items.repos), roots=len(items.root_events))
        self.read_ahead(state, batch, now, added)
        return True

    def follower_wait(self, state, items: PendingItems, leaders, filters) -> method.FollowerWait:
        """Should a batch of ``items`` wait for ``leaders`` (other relays' batches leading
        them), and how long at most? While the pages the lead saves are worth more than the
        exchanges checking it (those of its ``filters`` that no check queued on this relay
        takes in) and the lead comes no later than that is worth (``method.follower_wait``)."""
        queued = max((len(s.current.historic_queue) for s in map(self.relays.get, {url for url, _ in leaders})
                      if s is not None), default=0)
        expected = method.expected_events(len(items.repos), len(items.root_events))
        gate = self.gate_secs()
        checks = [g[0] for token, g in state.current.historic_queue if is_exchange(token)
                  and (b := state.current.pending.get(state.current.sub_to_batch.get(token))) is not None
                  and b.follower]
        budget = filter_plan.tag_value_budget(state.current.limits) // 2
        most = filter_plan.values_cap(state.current.limits)
        adds = sum(1 for f in filters if not any(filter_plan.merge_tag_values(c, f, budget, most) for c in checks))
        own_queued = len(state.current.historic_queue)
        # the checks hide behind the work queued here; past it, each is a gate interval of wait
        # too, for what the other relay lacked (the demo's world: every relay holds its own)
        side_by_side = self.side_by_side()
        start = method.START_BYTES if own_queued >= adds else method.start_bytes(gate, True, side_by_side)
        return method.follower_wait(expected, queued, gate, constants.FOLLOWER_WAIT_MAX_SECS,
                                    adds, start, own_queued, side_by_side)

    def leaders_to_follow(self, state, items: PendingItems, leaders, filters_of) -> set:
        """Of ``leaders`` (other relays' batches leading some of ``items``), those a batch of
        what they lead would wait for (``follower_wait``): all, or the soonest (fewest
        starts queued on their relays) that still pay for the wait. What only later leaders
        lead, this relay fetches too: waiting for the slowest leader held back what the
        others would bring as soon (``filters_of(items)``: the filters of a part)."""
        def queued(key) -> int:
            s = self.relays.get(key[0])
            return len(s.current.historic_queue) if s is not None else 0

        for bound in sorted({queued(k) for k in leaders}, reverse=True):
            kept = {k for k in leaders if queued(k) <= bound}
            _, theirs, followed = self.lead.split(state.url, items, follow=kept.__contains__)
            if theirs and self.follower_wait(state, theirs, followed, filters_of(theirs)).wait:
                return kept
        return set(leaders)  # none pays: all of them, as before (the batch then goes at once)

    def gate_secs(self) -> float:
        return self.sync.background_start_interval_ms / 1000

    def side_by_side(self) -> int:
        """Relays whose historic sync runs now: on a first sync they share what the own relay
        stores, so a gate interval of one of them is worth less of the operator's wait
        (``method.wait_bytes_per_sec``)."""
        return sum(1 for s in self.relays.values() if s.connected and s.current.syncing())

    def release_followers(self, keys, now: float, overdue: bool = False, still_fetching: bool = False) -> None:
        """Batches whose leaders are done: their holdings now. Those that waited too long,
        or whose leaders went on by NIP-77 (``still_fetching``), price in what the leaders
        are still fetching as brought again (``share_all``): their filters take NIP-77 where
        that is worth it, and the claims share the fetches out between the exchanges (by
        REQ pages, read before the leaders' events landed, they brought every event again:
        bench/scale, 0.28 copies per wanted event)."""
        for url, batch_id in keys:
            state = self.relays.get(url)
            batch = state.current.pending.get(batch_id) if state is not None and state.connected else None
            if batch is None:
                continue
            if overdue and batch.led_elsewhere:  # as expected: no word comes from another shard
                self.log.debug("historic_other_shard_waited", relay=state.url, batch_id=batch_id)
            elif overdue:
                self.log.info("historic_lead_waited_too_long", relay=state.url, batch_id=batch_id)
                batch.share_all = True
            elif still_fetching:
                batch.share_all = True
            start_queue.finish_subscription(batch, self.queue.lead_wait(batch_id))
            self.read_own_holdings(state, batch, batch.semantic_filters, batch.coalesce_wanted, now)

    def stop_leading(self, state, batch: PendingBatch, now: float, still_fetching: bool = False) -> None:
        """``batch`` leads no more: complete, or going on by NIP-77 (``still_fetching``)."""
        self.release_followers(self.lead.done((state.url, batch.batch_id)), now, still_fetching=still_fetching)

    def leader_progressed(self, state, batch: PendingBatch, now: float) -> None:
        """A page of a leading batch ended: followers whose repositories and roots none of
        its open pages asks for any more go (``SharedLead.progress``)."""
        key = (state.url, batch.batch_id)
        if not self.lead.has_followers(key):
            return
        values: set[str] = set()
        for sub_id in batch.outstanding_subs:
            pages = batch.pagination.get(sub_id)
            for page in pages.filters if pages is not None else ():
                for _, tag_values in page.page_filter.tags:
                    values |= tag_values

        def still_open(key: str) -> bool:
            return key in values or identifier_of(key) in values  # a state filter asks by d

        self.release_followers(self.lead.progress(key, still_open), now)

    # -- the own relay's holdings, and the method per filter ------------------------------

    def read_own_holdings(self, state, batch: PendingBatch, filters, coalesce: bool, now: float) -> None:
        """Ask the own relay what it holds of each filter, before any paced start is spent
        on them (loopback, unpaced): the answer comes back as a message."""
        self.move(state, batch, Step.READS_OWN)
        token = self.queue.own_read_token(batch.batch_id)
        self.queue.wait_for(batch, token)  # the batch is not complete while its methods are open
        batch.coalesce_wanted = coalesce
        self.ask_own_holdings(state, batch, token, list(filters), now)

    def ask_own_holdings(self, state, batch: PendingBatch, token: str, filters: list, now: float) -> None:
        """Answer the batch from what the session knows of ``filters``, once what it does not
        know is read: with every other batch's unread values, in one merged read
        (``own_reads``). Values a merged read is reading right now are not read twice: the
        batch waits for it (it ends by its deadline whatever the own relay does), then asks
        again."""
        if any(self.own_held.awaits(flt, now) for flt in filters):
            self.todo.append(AwaitRead(state, batch.batch_id, token, filters, batch.follower))
            return
        reads = [self.own_held.missing(flt, now) for flt in filters]  # None: all known
        known = reads.count(None)
        self.todo += [Count("OWN_HOLDINGS", ("known",), known), Count("OWN_HOLDINGS", ("read",), len(filters) - known)]
        self.log.debug("own_holdings", relay=state.url, batch_id=batch.batch_id, known=known, read=len(filters) - known)
        if known == len(filters):  # all known: no read
            self.todo.append(OwnKnown(state, batch.batch_id, token, filters,
                                      [self.own_held.holdings(flt, now) for flt in filters]))
            return
        self.todo.append(ReadOwn(state, batch.batch_id, token, filters, [read for read in reads if read is not None],
                                 batch.follower))

    def holdings_read(self, state, batch: PendingBatch, answer, now: float) -> bool:
        """``answer`` (an ``OwnHoldingsRead``): the own relay's holdings of ``batch``'s
        filters (None: it could not say; read as holding nothing). Per filter: NIP-77 or
        REQ pages (ten filters a start), whichever costs less (``choose_methods``). A batch
        left with REQ pages only may join a pending one, as in ``start``. False when the
        batch is gone into another (nothing of it to finish)."""
        start_queue.finish_subscription(batch, answer.token)
        filters, holdings = answer.filters, answer.holdings
        if holdings is None:
            self.log.warning("negentropy_own_relay_unavailable", relay=state.url, reason=answer.reason)
            holdings = [[] for _ in filters]
        by_neg, by_req = self.choose_methods(state, batch, filters, holdings, now)
        self.move(state, batch, Step.METHODS_CHOSEN)
        if by_neg and not by_req and self.merge_into_waiting_negentropy(state, batch, by_neg, now):
            return False
        for flt, held in by_neg:
            self.queue.add_exchange(state, batch, flt, held)
        if by_neg:
            batch.method = SyncMethod.NEGENTROPY
            # NIP-77 for some of it (a re-sync, a follower, a relay too busy to lead): the
            # other relays' exchanges run beside this one's, the claims share the fetches out.
            self.stop_leading(state, batch, now, still_fetching=True)
        else:
            waiting = self.waiting_req_batch(state, besides=batch) if batch.coalesce_wanted else None
            if waiting is not None:  # as start would have, had it known at once
                state.current.pending.pop(batch.batch_id, None)
                self.move(state, batch, Step.JOINED)
                self.lead.succeed((state.url, batch.batch_id), (state.url, waiting.batch_id))
                self.coalesce_into(state, waiting, batch.items, by_req)
                return False
            batch.coalescable = batch.coalesce_wanted or batch.kind is BatchKind.LAYER1
        if by_req:
            self.queue.add_reqs(state, batch, by_req)
        return True

    @staticmethod
    def reading_own(state) -> bool:
        """Does a batch of the relay await its holdings (a read of loopback, under way)?"""
        return any(map(is_own_read, (token for b in state.current.pending.values() for token in b.outstanding_subs)))

    def choose_methods(self, state, batch: PendingBatch, filters, holdings, now: float):
        """(filters for NIP-77 with what the own relay holds of each, filters for REQ
        pages): the cheapest split, priced by ``method.choose_methods`` from what REQ pages
        would bring again of each filter (``filter_facts``)."""
        allowed = self.use_negentropy(state, filters, now)  # it may have been turned off meanwhile
        since = state.round_started_at  # held before this round: a re-sync, nobody waits for it
        first_sync = not any((self.seen.get(event_id) or -1.0) < since for held in holdings for _, event_id in held)
        # descendants (a batch of thread members' replies, no items of its own): most reply
        # to a member and tag its root, and came with the thread's filters; what they lack
        # is what a re-sync lacks, not what a new filter likely matches (bench/scale N=50:
        # their pages brought 1,807 nested comments again, 0.10 per wanted event; the demo's
        # world 36 of its 283 events received). Nothing the operator waits for comes by them
        # either: their starts are worth the remote's work alone, as a re-sync's
        lacks_most = first_sync and not (batch.kind is BatchKind.SYNC and not batch.items)
        facts = [self.filter_facts(batch, f, held, len(filters), lacks_most)
                 for f, held in zip(filters, holdings, strict=True)]
        start = method.start_bytes(self.gate_secs(), lacks_most and not batch.follower, self.side_by_side())
        choice = method.choose_methods(facts, allowed, start, lacks_most)
        by_neg = [(f, held) for f, held, neg in zip(filters, holdings, choice.negentropy, strict=True) if neg]
        by_req = [f for f, neg in zip(filters, choice.negentropy, strict=True) if not neg]
        self.log.debug("historic_methods_chosen", relay=state.url, batch_id=batch.batch_id,
                 negentropy=len(by_neg), req=len(by_req), held=sum(map(len, holdings)),
                 again=sum(f.again for f in facts), starts=choice.starts, start_bytes=start)
        return by_neg, by_req

    def filter_facts(self, batch: PendingBatch, flt: Filter, held, n_filters: int, first_sync: bool):
        """What REQ pages of ``flt`` would bring again: what the own relay holds of it, what
        is in flight to it, and, for a batch whose leaders are still fetching its items
        (``share_all``: they were too slow to wait for), its share of what they likely
        bring. On a first sync, what it likely holds in all (``method.expected_of``: the
        rest is missing, and NIP-77 fetches it by id, 300 a start). And whether the rejected
        index may match it."""
        fetched = {event_id for _, event_id in held}
        fetched.update(event_id for _, event_id in self.delivery.tracked_matching(flt))
        elsewhere = 0
        if batch.share_all:
            items = batch.items
            elsewhere = method.expected_events(len(items.repos), len(items.root_events)) // max(n_filters, 1)
        expected = method.expected_of(flt) if first_sync else 0
        return method.FilterFacts(frozenset(fetched), elsewhere, self.rejected.any_may_match(flt), expected)

    def merge_into_waiting_negentropy(self, state, batch: PendingBatch, by_neg, now: float) -> bool:
        """A NIP-77-only batch joins the latest pending one none of whose exchanges has
        started: each filter is merged into a queued exchange of the same shape (``#e`` of
        one new root into the ``#e`` of the roots before it), or queued beside them. Each
        exchange takes a paced start whatever it covers; without this, every new root on a
        busy relay (every batch goes NIP-77 there) took three, more than the gate's one a
        second when roots came every two seconds, and the queue never drained while they
        came (bench/soak). The items confirm with the batch they joined. Recovery attempts,
        polls, policy probes and layer 1 keep their own batches (each is judged on its own
        answer). False when no such batch waits."""
        if batch.kind is not BatchKind.SYNC:
            return False
        waiting = next((b for b in reversed(state.current.pending.values())
                        if b is not batch and b.kind is BatchKind.SYNC and b.method is SyncMethod.NEGENTROPY
                        and not b.started and not b.fetch_by_filter and not b.advertised_ids
                        and b.outstanding_subs and all(map(is_exchange, b.outstanding_subs))),
                       None)
        if waiting is None:
            return False
        queued = {token: i for i, token, _ in queued_of(state, waiting)}
        if len(queued) != len(waiting.outstanding_subs):
            return False  # one of them is not in the queue (running, or regrouped)
        queue = state.current.historic_queue
        budget = filter_plan.tag_value_budget(state.current.limits) // 2  # the NEG-OPEN carries more
        most = filter_plan.values_cap(state.current.limits)
        for flt, held in by_neg:
            for token, i in queued.items():
                merged = filter_plan.merge_tag_values(queue[i][1][0], flt, budget, most)
                if merged is not None:
                    self.queue.replace_filters(state, i, token, [merged])
                    waiting.own_holdings[token] = union_of_holdings(waiting.own_holdings.get(token, []), held)
                    break
            else:
                token = self.queue.add_exchange(state, waiting, flt, held)
                queued[token] = len(state.current.historic_queue) - 1
        waiting.items.add(batch.items)
        waiting.semantic_filters += batch.semantic_filters
        state.current.pending.pop(batch.batch_id, None)
        self.move(state, batch, Step.JOINED)
        self.stop_leading(state, batch, now, still_fetching=True)
        self.log.debug("negentropy_batch_merged", relay=state.url, batch_id=batch.batch_id, into=waiting.batch_id,
                 filters=len(by_neg))
        return True

    # -- what the exchanges read besides the own relay's holdings ---------------------------

    def have_beyond_holdings(self, flt: Filter) -> list[tuple[int, str]]:
        """What a NIP-77 have-set for ``flt`` claims besides the own relay's holdings: the
        refused events and those in flight to the own relay that ``flt`` matches (indexed:
        the cost follows the filter, not everything in flight)."""
        return self.rejected.items_matching(flt) + self.delivery.tracked_matching(flt)

    # -- an EOSE ----------------------------------------------------------------------------

    def on_eose(self, state, batch: PendingBatch, sub_id: str, elapsed: float | None, now: float,
                past_until: tuple[int, ...] = ()) -> None:
        """A historic REQ's EOSE: its next pages first in the queue (they finish what was
        started), its crowded seconds completed another way, followers its pages no longer
        ask for released. ``past_until``: per filter, events it brought newer than its
        ``until``: the relay ignores ``until`` (``PageCap.until_ignored``), and they count
        toward what it served each filter."""
        limits = start_queue.batch_limits(state, batch)
        cap = state.current.page_cap
        knew_until_exclusive = cap is not None and cap.until_exclusive
        if max(past_until, default=0) >= UNTIL_IGNORED_MIN_PAST and cap is not None and not cap.until_ignored:
            cap.until_ignored = True
            # what it was judged not to serve by id so far was asked of filters that could not
            # page there (an id page cut at its cap, then its filter's): by id once more
            state.unservable.clear()
            for pending in state.current.pending.values():
                pending.fetching_by_id.clear()
                # ... and what their filters bring then judges nothing: the ids they asked by
                # id come by id again (counted as brought by filter, 453 ids served by id in
                # pages of 20 judged a relay not to serve ids: seed 412 of the stress mix with
                # --notice-refusals 0.5 --oldest-first 0.3)
                pending.residual_asked = set()
            self.log.warning("relay_ignores_until", relay=state.url, batch_id=batch.batch_id, newer=sum(past_until))
        pages = start_queue.on_eose(
            batch, sub_id,
            per_req=filter_plan.filters_per_req(limits),
            pack=lambda filters: filter_plan.pack_into_reqs(filters, limits),
            new_sub_id=self.queue.req_id,
            cap=cap,
            elapsed=elapsed,
            past_until=past_until,
        )
        if cap is not None and cap.until_exclusive and not knew_until_exclusive:
            self.log.info("relay_until_exclusive", relay=state.url, batch_id=batch.batch_id)
        self.todo.append(Close(state, sub_id))
        self.queue.ended(state, sub_id)
        self.queue.add_next_pages(state, batch, pages)
        for crowded in batch.take_crowded():
            self.complete_crowded_second(state, batch, crowded, now)
        self.leader_progressed(state, batch, now)

    def complete_crowded_second(self, state, batch: PendingBatch, crowded: CrowdedSecond, now: float) -> None:
        """A page left a second holding more events of its filter than the relay serves in
        a page (paging by ``until`` cannot go inside a second). Ask that second by NIP-77
        where the relay has it (ordered by id within the second, it pages anything), else
        split the filter on a dimension it enumerates until the pages come back short (a
        piece crowded again is split again). A second nothing splits is left incomplete:
        said in the log and the metric, and the batch fails (the relay's history is not
        complete)."""
        flt = crowded.filter
        if not crowded.again and self.negentropy_usable(state, now):
            outcome = "negentropy"
            self.queue.add_exchange(state, batch, flt, None)
            batch.method = SyncMethod.NEGENTROPY  # its advertised ids are judged as residuals
        elif pieces := split_crowded(flt):
            outcome = "split"
            self.queue.add_reqs(state, batch, pieces, front=True)
        else:
            outcome = "incomplete"
            batch.mark_failed(unreached=True)
            if crowded.span:  # (a relay ignoring until)
                self.log.warning("unpaged_incomplete", relay=state.url, batch_id=batch.batch_id,
                                 until=crowded.second, seen=crowded.seen, filter=flt.to_json()[:300])
            else:
                self.log.warning("crowded_second_incomplete", relay=state.url, batch_id=batch.batch_id,
                                 second=crowded.second, seen=crowded.seen, filter=flt.to_json()[:300])
        if crowded.span:
            self.log.info("unpaged", relay=state.url, batch_id=batch.batch_id, until=crowded.second,
                          seen=crowded.seen, outcome=outcome)
            return
        self.todo.append(Count("CROWDED_SECONDS", (outcome,)))
        self.log.info("crowded_second", relay=state.url, batch_id=batch.batch_id, second=crowded.second,
                 seen=crowded.seen, outcome=outcome)
