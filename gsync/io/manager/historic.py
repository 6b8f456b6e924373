"""Historic sync: PendingBatches, the method per filter (NIP-77 or REQ+EOSE pages, as
``sync.method`` prices them; on a repository several relays list, the first relay's batch
leads and the others wait for it while that pays: ``sync.lead``), pagination on the page caps
each connection learns, the pacing gate, residuals after NIP-77, missing-event recovery, and
the Syncing → Connected check.
"""
from __future__ import annotations

import os

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol import messages as wire
from ...protocol.filters import Filter
from ...sync import batch_phase, filter_plan, method, result_caps
from ...sync.batch_phase import Step
from ...sync.pending import (
    BatchKind,
    CrowdedSecond,
    PendingBatch,
    ResidualDecision,
    SyncMethod,
    is_negentropy_token,
    negentropy_token,
    one_second,
    split_crowded,
)
from ...sync.policy import by_shape, coverage_key
from ...sync.relay_state import ConnectionStatus, RelayState, RunningExchange
from ...sync.repos import identifier_of
from ...sync.shard import OTHER_SHARD_LEAD
from ...sync.status import Fact
from ...sync.targets import PendingItems
from ...sync.unservable import ids_not_served
from .. import negentropy_sync
from ..inbox import (
    CompletionRecheck,
    DeliveryCaughtUp,
    HistoricSlotDue,
    NegentropyFinished,
    OwnHoldingsRead,
    OwnReadsLanded,
)
from .coverage import member_filters, sync_filters
from .lifecycle import move_status
from .own_reads import OwnReadWaiter

log = get_logger("gsync.manager")

MAX_HISTORIC_SUBS = 4  # concurrent historic REQs per relay, within the transient budget


def move_batch(state: RelayState, batch: PendingBatch, step: Step) -> None:
    """``batch``'s phase after ``step`` (``sync.batch_phase.TRANSITIONS``). A move the
    table does not have is a bug: logged, the phase left as it was; raised where
    GSYNC_STRICT_STATUS=1 (the tests), as ``lifecycle.move_status``."""
    try:
        batch.move(step)
    except batch_phase.IllegalBatchMove as exc:
        if os.environ.get("GSYNC_STRICT_STATUS") == "1":
            raise
        log.error("illegal_batch_move", relay=state.url, batch_id=batch.batch_id, phase=exc.phase.name,
                  step=exc.step.value)


class HistoricSync:
    """Every relay's historic batches, their queue and their paced starts (on each
    ``RelayState`` and session, in ``relays``), and whether delivery's backlog holds them
    (owned here). Batches are shared out across relays through ``lead`` (who fetches a
    repository first) and ``claims`` (who fetches a missing event); what none served goes
    to ``recovery``. The method per filter reads the own relay's holdings (``own_held``,
    through ``own_reads``), what was fetched (``seen``), refused (``rejected``) and is in
    flight (``delivery``); ``repos`` says which relays list a repository. Starts wait for
    the relay's gates in ``health``, for ``live`` REQs (pumped first), and while
    ``own_relay_down()``; exchanges run through ``effects`` and answer through ``post``.
    What a relay's answers say of its rate and policy goes back to the refusals side:
    ``request_served(state)``, ``rate_limited(state, text)``, ``probe_answered(state,
    key, batch)``."""

    def __init__(self, *, sync, own_relay: str, relays, repos, health, live, lead, claims, recovery,
                 own_held, own_reads, seen, rejected, delivery, own_relay_down, request_served,
                 rate_limited, probe_answered, effects, post, clock, ids):
        self.sync = sync  # [sync]: negentropy on or off, the batch window
        self.own_relay = own_relay
        self.relays = relays
        self.repos = repos
        self.health = health
        self.live = live
        self.lead = lead
        self.claims = claims
        self.recovery = recovery
        self.own_held = own_held
        self.own_reads = own_reads
        self.seen = seen
        self.rejected = rejected
        self.delivery = delivery
        self.own_relay_down = own_relay_down
        self.request_served = request_served
        self.rate_limited = rate_limited
        self.probe_answered = probe_answered
        self.effects = effects
        self.post = post
        self.clock = clock
        self.ids = ids  # the manager's counter: batch, sub and token ids
        # historic starts wait while delivery is this far behind, and are held now
        self.backlog_high_water = int(sync.delivery_max_backlog * constants.DELIVERY_HIGH_WATER_FRACTION)
        self.held_for_delivery = False
        self.landing: dict[str, RelayState] | None = None  # relays to pump once a read's answers are out

    def start(self, state: RelayState, items: PendingItems, filters,
              kind: BatchKind = BatchKind.SYNC, coalesce=False, leaders=(), go_now=False) -> PendingBatch:
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

        Filters whose shape the relay refused by policy are left out (``refusals``)."""
        filters = state.paused.allowed(filters)
        asks_own = kind is not BatchKind.RECOVERY and self.use_negentropy(state, filters)
        if coalesce and not asks_own:
            waiting = self.waiting_req_batch(state)
            if waiting is not None:
                self.coalesce_into(state, waiting, items, filters)
                return waiting
        if kind is BatchKind.LAYER1:  # every fresh start, quick reconnect and daily sync begins with layer 1
            state.round_started_at = self.clock()
        batch = PendingBatch(next(self.ids), items, kind=kind)
        batch.semantic_filters = list(filters)
        state.current.pending[batch.batch_id] = batch
        wait = self.follower_wait(state, items, leaders, filters) if asks_own and leaders else None
        if wait is not None and (go_now or not (wait.wait or OTHER_SHARD_LEAD in leaders)):
            batch.share_all = True  # waiting would cost more than the pages it saves
            self.lead.lead((state.url, batch.batch_id), items)  # it fetches them: a later relay may follow it
            self.read_own_holdings(state, batch, filters, coalesce)
        elif wait is not None:
            self.wait_for_leaders(state, batch, coalesce, leaders, wait.max_secs)
        elif asks_own:
            self.lead.lead((state.url, batch.batch_id), items)
            self.read_own_holdings(state, batch, filters, coalesce)
        else:
            self.lead.lead((state.url, batch.batch_id), items)
            batch.coalescable = coalesce or kind is BatchKind.LAYER1  # NIP-77 batches never take in REQ work
            self.queue_reqs(state, batch, filters)
        self.pump(state)
        if batch.is_complete:
            self.finish_batch(state, batch)
        return batch

    @staticmethod
    def waiting_req_batch(state: RelayState, besides: PendingBatch | None = None):
        """The latest pending batch that takes in AddFilters, if any."""
        return next((b for b in reversed(state.current.pending.values())
                     if b.coalescable and b is not besides), None)

    def wait_for_leaders(self, state: RelayState, batch: PendingBatch, coalesce: bool, leaders,
                         max_secs: float) -> None:
        """Other relays are fetching these repositories first: this batch reads the own
        relay's holdings once none of their open pages asks for its items (or they chose
        NIP-77, or ``max_secs`` passed: as long as the wait is worth, ``method.follower_wait``),
        and then takes NIP-77 only where they brought enough to pay for its starts
        (``method.choose_methods``). Nothing of it starts meanwhile."""
        move_batch(state, batch, Step.WAITS_FOR_LEAD)
        batch.follower = True
        batch.led_elsewhere = OTHER_SHARD_LEAD in leaders
        batch.coalesce_wanted = coalesce
        batch.add_subscription(f"lead{batch.batch_id}")  # not complete while it waits
        self.lead.wait((state.url, batch.batch_id), leaders, self.clock(), batch.items, max_secs)
        log.debug("historic_waits_for_lead", relay=state.url, batch_id=batch.batch_id,
                  leaders=sorted({url for url, _ in leaders}))
        if batch.led_elsewhere:
            self.read_ahead(state, batch)

    def read_ahead(self, state: RelayState, batch: PendingBatch) -> None:
        """A batch that waits for another shard's lead reads what it does not know of the
        own relay now, with this instance's other reads, while the own relay holds little of
        it: what the other shard stores meanwhile is seen live (``OwnLanded``), so once the
        wait is over its holdings are known without reading that shard's events back."""
        now = self.clock()
        filters = batch.semantic_filters
        if any(self.own_held.awaits(flt, now) for flt in filters):
            return  # being read: its answer will be known in time
        reads = [read for flt in filters if (read := self.own_held.missing(flt, now)) is not None]
        if reads:
            self.own_reads.queue(OwnReadWaiter(state.url, state.session, batch.batch_id, f"lead{batch.batch_id}",
                                               [], reads, False, ahead=True))

    def follower_wait(self, state: RelayState, items: PendingItems, leaders, filters) -> method.FollowerWait:
        """Should a batch of ``items`` wait for ``leaders`` (other relays' batches leading
        them), and how long at most? While the pages the lead saves are worth more than the
        exchanges checking it (those of its ``filters`` that no check queued on this relay
        takes in) and the lead comes no later than that is worth (``method.follower_wait``)."""
        queued = max((len(s.current.historic_queue) for s in map(self.relays.get, {url for url, _ in leaders})
                      if s is not None), default=0)
        expected = method.expected_events(len(items.repos), len(items.root_events))
        gate = self.gate_secs()
        checks = [g[0] for token, g in state.current.historic_queue if is_negentropy_token(token)
                  and (b := state.current.pending.get(state.current.sub_to_batch.get(token))) is not None
                  and b.follower]
        budget = filter_plan.tag_value_budget(state.current.limits) // 2
        adds = sum(1 for f in filters if not any(filter_plan.merge_tag_values(c, f, budget) for c in checks))
        own_queued = len(state.current.historic_queue)
        # the checks hide behind the work queued here; past it, each is a gate interval of wait
        # too, for what the other relay lacked (the demo's world: every relay holds its own)
        start = method.START_BYTES if own_queued >= adds else method.start_bytes(gate, first_sync=True)
        return method.follower_wait(expected, queued, gate, constants.FOLLOWER_WAIT_MAX_SECS,
                                    adds, start, own_queued)

    def gate_secs(self) -> float:
        return self.sync.background_start_interval_ms / 1000

    def leaders_to_follow(self, state: RelayState, items: PendingItems, leaders, filters_of) -> set:
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

    def leaders_too_slow(self, state: RelayState, items: PendingItems, leaders, filters) -> bool:
        return not self.follower_wait(state, items, leaders, filters).wait

    def release_followers(self, keys, overdue: bool = False) -> None:
        """Batches whose leaders are done: their holdings now. Those that waited too long
        take NIP-77 for every filter: the leaders are still fetching, and the claims
        share the fetches out between the exchanges."""
        for url, batch_id in keys:
            state = self.relays.get(url)
            batch = state.current.pending.get(batch_id) if state is not None and state.connected else None
            if batch is None:
                continue
            if overdue and batch.led_elsewhere:  # as expected: no word comes from another shard
                log.debug("historic_other_shard_waited", relay=url, batch_id=batch_id)
            elif overdue:
                log.info("historic_lead_waited_too_long", relay=url, batch_id=batch_id)
                batch.share_all = True
            batch.finish_subscription(f"lead{batch_id}")
            self.read_own_holdings(state, batch, batch.semantic_filters, batch.coalesce_wanted)

    def stop_leading(self, state: RelayState, batch: PendingBatch) -> None:
        self.release_followers(self.lead.done((state.url, batch.batch_id)))

    def leader_progressed(self, state: RelayState, batch: PendingBatch) -> None:
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

        self.release_followers(self.lead.progress(key, still_open))

    def read_own_holdings(self, state: RelayState, batch: PendingBatch, filters, coalesce: bool) -> None:
        """Ask the own relay what it holds of each filter, before any paced start is spent
        on them (loopback, unpaced), in a greenlet: the answer comes back as a message."""
        move_batch(state, batch, Step.READS_OWN)
        token = f"own{batch.batch_id}-{next(self.ids)}"
        batch.add_subscription(token)  # the batch is not complete while its methods are open
        batch.coalesce_wanted = coalesce
        self.ask_own_holdings(state, batch, token, list(filters))

    def ask_own_holdings(self, state: RelayState, batch: PendingBatch, token: str, filters: list) -> None:
        """Answer the batch from what the session knows of ``filters``, once what it does not
        know is read: with every other batch's unread values, in one merged read
        (``own_reads``). Values a merged read is reading right now are not read twice: the
        batch waits for it (it ends by its deadline whatever the own relay does), then asks
        again."""
        now = self.clock()
        if any(self.own_held.awaits(flt, now) for flt in filters):
            self.own_reads.await_read(OwnReadWaiter(state.url, state.session, batch.batch_id, token, filters,
                                                    [], batch.follower))
            return
        reads = [self.own_held.missing(flt, now) for flt in filters]  # None: all known
        known = reads.count(None)
        metrics.OWN_HOLDINGS.labels("known").inc(known)
        metrics.OWN_HOLDINGS.labels("read").inc(len(filters) - known)
        log.debug("own_holdings", relay=state.url, batch_id=batch.batch_id, known=known,
                  read=len(filters) - known)
        if known == len(filters):  # all known: no read
            self.post(OwnHoldingsRead(state.url, state.session, batch.batch_id, token, filters,
                                      [self.own_held.holdings(flt, now) for flt in filters]))
            return
        self.own_reads.queue(OwnReadWaiter(state.url, state.session, batch.batch_id, token, filters,
                                           [read for read in reads if read is not None], batch.follower))

    def on_own_reads_landed(self, msg: OwnReadsLanded) -> None:
        """A merged read of the own relay landed (``own_reads``): each batch it answers
        chooses its methods, and those that awaited its values ask again. Each relay pumps
        once all of them chose: a relay's first start then carries every batch the read
        answered (layer 1 and the first AddFilters share a REQ, as with NIP-77 off), not the
        first batch's alone with the others a gate interval behind."""
        self.landing = {}
        try:
            self.own_reads.land(msg, answer=self.on_own_holdings_read, ask_again=self.ask_own_holdings)
        finally:
            landed, self.landing = self.landing, None
        for state in landed.values():
            self.pump(state)

    def pump_after_choice(self, state: RelayState) -> None:
        """Pump, or, while a merged read's answers are handed out, once they all are; not
        while another batch of the relay awaits its holdings (a read of loopback, under
        way): its answer pumps, and the relay's next start carries both."""
        if self.landing is not None:
            self.landing[state.url] = state
        elif not any(token.startswith("own") for b in state.current.pending.values()
                     for token in b.outstanding_subs):
            self.pump(state)

    def on_own_holdings_read(self, msg: OwnHoldingsRead) -> None:
        """Per filter: NIP-77 or REQ pages (ten filters a start), whichever costs less
        (``choose_methods``). A batch left with REQ pages only may join a pending one, as in
        ``start``."""
        state = self.relays.in_session(msg.relay, msg.session)
        batch = state and state.current.pending.get(msg.batch_id)
        if batch is None or msg.token not in batch.outstanding_subs:
            return
        batch.finish_subscription(msg.token)
        if msg.holdings is None:
            log.warning("negentropy_own_relay_unavailable", relay=state.url, reason=msg.reason)
            holdings = [[] for _ in msg.filters]
        else:
            holdings = msg.holdings
        by_neg, by_req = self.choose_methods(state, batch, msg.filters, holdings)
        move_batch(state, batch, Step.METHODS_CHOSEN)
        if by_neg and not by_req and self.merge_into_waiting_negentropy(state, batch, by_neg):
            self.pump_after_choice(state)
            return
        for flt, held in by_neg:
            self.queue_negentropy(state, batch, flt, held)
        if by_neg:
            batch.method = SyncMethod.NEGENTROPY
            # NIP-77 for some of it (a re-sync, a follower, a relay too busy to lead): the
            # other relays' exchanges run beside this one's, the claims share the fetches out.
            self.stop_leading(state, batch)
        else:
            waiting = self.waiting_req_batch(state, besides=batch) if batch.coalesce_wanted else None
            if waiting is not None:  # as start would have, had it known at once
                state.current.pending.pop(batch.batch_id, None)
                move_batch(state, batch, Step.JOINED)
                self.lead.succeed((state.url, batch.batch_id), (state.url, waiting.batch_id))
                self.coalesce_into(state, waiting, batch.items, by_req)
                self.pump_after_choice(state)
                return
            batch.coalescable = batch.coalesce_wanted or batch.kind is BatchKind.LAYER1
        if by_req:
            self.queue_reqs(state, batch, by_req)
        self.pump_after_choice(state)
        if batch.is_complete:
            self.finish_batch(state, batch)

    def choose_methods(self, state: RelayState, batch: PendingBatch, filters, holdings):
        """(filters for NIP-77 with what the own relay holds of each, filters for REQ
        pages): the cheapest split, priced by ``method.choose_methods`` from what REQ pages
        would bring again of each filter (``filter_facts``)."""
        allowed = self.use_negentropy(state, filters)  # it may have been turned off meanwhile
        since = state.round_started_at  # held before this round: a re-sync, nobody waits for it
        first_sync = not any((self.seen.get(event_id) or -1.0) < since for held in holdings for _, event_id in held)
        facts = [self.filter_facts(state, batch, f, held, len(filters), first_sync)
                 for f, held in zip(filters, holdings, strict=True)]
        start = method.start_bytes(self.gate_secs(), first_sync and not batch.follower)
        choice = method.choose_methods(facts, allowed, start, first_sync)
        by_neg = [(f, held) for f, held, neg in zip(filters, holdings, choice.negentropy, strict=True) if neg]
        by_req = [f for f, neg in zip(filters, choice.negentropy, strict=True) if not neg]
        log.debug("historic_methods_chosen", relay=state.url, batch_id=batch.batch_id,
                  negentropy=len(by_neg), req=len(by_req), held=sum(map(len, holdings)),
                  again=sum(f.again for f in facts), starts=choice.starts, start_bytes=start)
        return by_neg, by_req

    def filter_facts(self, state: RelayState, batch: PendingBatch, flt: Filter, held, n_filters: int,
                     first_sync: bool):
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

    def listed_elsewhere(self, state: RelayState, batch: PendingBatch) -> bool:
        """Does another relay list a repository of this batch (of this relay, for a batch
        of roots only)? What that relay fetched may then be most of a filter here."""
        for address in batch.items.repos or self.repos.repos_listing(state.url):
            needs = self.repos.get(address)
            if needs is not None and len(needs.relays) > 1:
                return True
        return False

    def merge_into_waiting_negentropy(self, state: RelayState, batch: PendingBatch, by_neg) -> bool:
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
                        and b.outstanding_subs and all(map(is_negentropy_token, b.outstanding_subs))),
                       None)
        if waiting is None:
            return False
        queued = {token: i for i, (token, _) in enumerate(state.current.historic_queue)
                  if token in waiting.outstanding_subs}
        if len(queued) != len(waiting.outstanding_subs):
            return False  # one of them is not in the queue (running, or regrouped)
        budget = filter_plan.tag_value_budget(state.current.limits) // 2  # the NEG-OPEN carries more
        for flt, held in by_neg:
            for token, i in queued.items():
                merged = filter_plan.merge_tag_values(state.current.historic_queue[i][1][0], flt, budget)
                if merged is not None:
                    state.current.historic_queue[i] = (token, [merged])
                    waiting.own_holdings[token] = union_of_holdings(waiting.own_holdings.get(token, []), held)
                    break
            else:
                self.queue_negentropy(state, waiting, flt, held)
                queued[state.current.historic_queue[-1][0]] = len(state.current.historic_queue) - 1
        waiting.items.add(batch.items)
        waiting.semantic_filters += batch.semantic_filters
        state.current.pending.pop(batch.batch_id, None)
        move_batch(state, batch, Step.JOINED)
        self.stop_leading(state, batch)
        log.debug("negentropy_batch_merged", relay=state.url, batch_id=batch.batch_id,
                  into=waiting.batch_id, filters=len(by_neg))
        return True

    def queue_negentropy(self, state: RelayState, batch: PendingBatch, flt: Filter, held) -> None:
        """One NIP-77 exchange for ``flt``, waiting for its paced start; ``held`` (what the
        own relay holds of it, just read) is kept for it, so it is not asked again."""
        token = negentropy_token(batch.batch_id, next(self.ids))
        batch.add_subscription(token)
        batch.own_holdings[token] = held
        state.current.sub_to_batch[token] = batch.batch_id
        state.current.historic_queue.append((token, [flt]))

    def coalesce_into(self, state: RelayState, batch: PendingBatch, items: PendingItems, filters) -> None:
        """Add an AddFilters to a pending REQ+EOSE batch. None of its REQs started: pack them
        all anew; some did: queue the new filters, sharing REQs with its queued pages. The
        batch leads the new items' first sync (``sync.lead``)."""
        batch.items.add(items)
        self.lead.lead((state.url, batch.batch_id), items)
        batch.semantic_filters += filters
        if batch.started:
            self.queue_reqs(state, batch, filters)
        else:
            queued = set(batch.outstanding_subs)
            state.current.historic_queue = [e for e in state.current.historic_queue if e[0] not in queued]
            for sub_id in queued:
                batch.finish_subscription(sub_id)
                state.current.sub_to_batch.pop(sub_id, None)
            self.queue_reqs(state, batch, batch.semantic_filters)
        log.debug("batch_coalesced", relay=state.url, batch_id=batch.batch_id,
                  filters=len(batch.semantic_filters))

    def use_negentropy(self, state: RelayState, filters) -> bool:
        return self.negentropy_usable(state) and all(f.since is None and f.ids is None for f in filters)

    def negentropy_usable(self, state: RelayState) -> bool:
        """NIP-77 on this relay: configured, not failed this session, not disabled by a
        rate-limit episode, and what it advertises can be fetched (``serves_ids``)."""
        return (
            self.sync.negentropy
            and state.current.negentropy_ok
            and self.health.negentropy_allowed(state.url)
            and state.serves_ids(self.clock())
        )

    def queue_reqs(self, state: RelayState, batch: PendingBatch, filters, front=False) -> None:
        groups = filter_plan.pack_into_reqs(filters, state.current.limits, key=filter_plan.paging_key)
        entries = []
        for group in groups:
            sub_id = f"h{batch.batch_id}-{next(self.ids)}"
            batch.add_subscription(sub_id, group)
            state.current.sub_to_batch[sub_id] = batch.batch_id
            entries.append((sub_id, group))
        if front:
            state.current.historic_queue[0:0] = entries
        else:
            state.current.historic_queue.extend(entries)
        share_queued_reqs(state, batch)

    def pump(self, state: RelayState) -> None:
        """Start queued historic REQs while the relay's budget and pacing allow.

        Every historic, pagination, id-fetch and retry start is a background start: the
        health tracker's gates space them (1 s per connection, longer after a rate-limit
        refusal, none during a cooldown). Nothing starts while the own relay is down: what
        would be fetched could not be delivered (the catch-up after the outage covers it);
        nor while delivery is more than a quarter of its backlog limit behind. Live REQs
        waiting for the gates go first (``LiveCoverage.pump``).
        """
        if (state.current.pump_held or not state.connected or not self.live.pump(state)
                or self.own_relay_down()):
            return
        if self.delivery_holds_history():
            return
        limit, open_historic = self.historic_slots(state), self.open_historic(state)
        while state.current.historic_queue and open_historic < limit:
            now = self.clock()
            wait = self.health.may_start_background(state.url, now)
            if wait > 0:
                self.live.wake_pump_in(state, wait)
                return
            first = self.first_startable(state)
            if first is None:
                return  # thread starts waiting for their batch's layer-2 exchanges: those pump
            if first:
                state.current.historic_queue.insert(0, state.current.historic_queue.pop(first))
            sub_id, group = state.current.historic_queue[0]
            if sub_id not in state.current.sub_to_batch:
                state.current.historic_queue.pop(0)
                continue
            if ((state.paused or state.current.stalled_shapes or state.paused.refused_any)
                    and self.regroup_before_start(state, sub_id, group)):
                continue
            batch = state.current.pending.get(state.current.sub_to_batch[sub_id])
            if is_negentropy_token(sub_id) and self.cut_before_start(state, batch, sub_id, group[0]):
                continue
            group = self.fill_before_start(state, batch, sub_id, group)
            size = wire.req_size(sub_id, group)
            if open_historic and state.current.conn.open_filter_bytes + size > constants.MAX_OPEN_FILTER_BYTES:
                return  # wait for a historic REQ to finish and free room
            state.current.historic_queue.pop(0)
            if batch is not None and not batch.started:
                move_batch(state, batch, Step.FIRST_START)  # a later AddFilters queues beside it
            self.send_historic_start(state, batch, sub_id, group, now)
            open_historic += 1

    @staticmethod
    def first_startable(state: RelayState) -> int | None:
        """Where the first queued start that may go now is: the first, unless it asks for
        threads (``#e``/``#E``/``#q`` of roots: an exchange, or a REQ with such a filter) for a
        batch whose layer-2 exchanges have not all answered; what those find missing may be
        roots, whose threads then join it (``cover_threads_ahead``) instead of taking a round
        of their own. They end by their deadline, and pump again when they do. None: all
        that is queued waits so."""
        queue, session = state.current.historic_queue, state.current
        layer2 = None  # batches with a layer-2 exchange queued or running
        follower = None  # the first startable entry of a follower's batch: after the others
        for i, (sub_id, group) in enumerate(queue):
            if any(map(filter_plan.asks_by_root, group)):
                if layer2 is None:
                    layer2 = {run.batch_id for run in session.neg_running.values()
                              if filter_plan.asks_by_repo(run.filter)}
                    layer2.update(session.sub_to_batch[token] for token, g in queue if token in session.sub_to_batch
                                  and is_negentropy_token(token) and filter_plan.asks_by_repo(g[0]))
                if session.sub_to_batch.get(sub_id) in layer2:
                    continue
            batch = session.pending.get(session.sub_to_batch.get(sub_id))
            if batch is None or not batch.follower:  # a stale entry (None) goes: pump drops it
                return i
            if follower is None:
                follower = i
        return follower

    def catch_up(self, state: RelayState, items: PendingItems, since: int) -> None:
        """Historic only, confirming nothing: what ``items``' live subscriptions (still open,
        or just replaced) may have missed since ``since``, and layer 1 with it."""
        self.start(state, PendingItems(), [filter_plan.layer1_filter(since)])
        filters = sync_filters(state, items, since)
        if state.current.members:
            filters += [f.replace(since=since) for f in member_filters(state, state.current.members)]
        if filters:
            self.start(state, PendingItems(), filters)

    def on_delivery_caught_up(self, msg: DeliveryCaughtUp | None = None) -> None:
        """Historic starts held while delivery was behind go again."""
        if not self.held_for_delivery:
            return
        if self.delivery.backlog >= self.backlog_high_water:
            if msg is not None:  # behind again by the time this was read
                self.delivery.wake_below(self.backlog_high_water // 2)
            return
        self.held_for_delivery = False
        for state in self.relays.values():
            self.pump(state)

    def delivery_holds_history(self) -> bool:
        """Delivery is more than its high-water mark behind: historic starts wait."""
        if self.delivery.backlog < self.backlog_high_water:
            return False
        if not self.held_for_delivery:
            self.held_for_delivery = True
            # DeliveryCaughtUp pumps again once half of it is delivered: a mark with room
            # below it, or a backlog hovering at the mark would pump every relay per OK.
            self.delivery.wake_below(self.backlog_high_water // 2)
        return True

    @staticmethod
    def historic_slots(state: RelayState) -> int:
        """Historic REQs and exchanges the relay may have open at once: what its
        subscription budget leaves beside live coverage, 1 to MAX_HISTORIC_SUBS."""
        budget = filter_plan.SubscriptionBudget.from_limits(state.current.limits)
        room = budget.max_subscriptions - len(state.current.live_subs) - 1
        return max(1, min(MAX_HISTORIC_SUBS, room))

    @staticmethod
    def open_historic(state: RelayState) -> int:
        """Historic REQs open on the connection, and NIP-77 exchanges running."""
        return len(state.current.neg_running) + sum(
            1 for s in state.current.sub_to_batch if s in state.current.conn.subscriptions
        )

    def send_historic_start(self, state: RelayState, batch, sub_id: str, group, now: float) -> None:
        """One paced background start: a NIP-77 exchange or a historic REQ."""
        self.health.record_start(state.url, now, background=True)
        log.debug("historic_started", relay=state.url, sub_id=sub_id, filters=len(group),
                  batch_id=state.current.sub_to_batch[sub_id])
        purpose = batch.purpose if batch is not None else "other"
        if is_negentropy_token(sub_id):
            metrics.BACKGROUND_STARTS.labels(state.url, "negentropy", purpose).inc()
            self.start_negentropy(state, sub_id, group[0])
        else:
            metrics.BACKGROUND_STARTS.labels(state.url, "req", purpose).inc()
            state.current.historic_sent_at[sub_id] = now
            state.current.conn.subscribe(sub_id, group)
            state.current.sub_activity[sub_id] = now

    def fill_before_start(self, state: RelayState, batch: PendingBatch | None, sub_id: str,
                          group: list[Filter]) -> list[Filter]:
        """The REQ about to start: its filters that filled their last page are split into
        the room left (``PendingBatch.fill_by_splitting``), within the relay's message size.
        Not towards a relay that refused us for query rate: more filters for the same
        events would only bring its next refusal sooner."""
        if batch is None or is_negentropy_token(sub_id) or self.health.limits_query_rate(state.url):
            return group
        group = batch.fill_by_splitting(sub_id, filter_plan.filters_per_req(state.current.limits),
                                        filter_plan.req_length_limit(state.current.limits))
        state.current.historic_queue[0] = (sub_id, group)
        return group

    def regroup_before_start(self, state: RelayState, sub_id: str, group) -> bool:
        """A queued REQ meets what the relay taught us since it was queued: shapes it
        refused by policy go (a probe's own filter stays), and a shape that stalled on this
        connection, or that the relay refused once (``CoveragePauses.goes_alone``), goes
        alone, so that it cannot hold or take down the rest. True if it changed."""
        batch_id = state.current.sub_to_batch[sub_id]
        if batch_id in state.current.probes:
            return False
        keep = [i for i, f in enumerate(group) if not state.paused.is_filter_paused(f)]
        alone = [i for i in keep
                 if coverage_key(group[i]) in state.current.stalled_shapes or state.paused.goes_alone(group[i])]
        rest = [i for i in keep if i not in alone]
        apart = [[alone[j] for j in idx] for idx in by_shape([group[i] for i in alone])]  # (no rest: a REQ a shape)
        parts = [rest, *([i] for i in alone)] if rest else apart if len(apart) > 1 else [keep]
        if parts == [list(range(len(group)))]:
            return False
        state.current.historic_queue.pop(0)
        del state.current.sub_to_batch[sub_id]
        batch = state.current.pending[batch_id]
        if is_negentropy_token(sub_id):
            batch.finish_subscription(sub_id)
        else:
            entries = batch.split_subscription(
                sub_id, [(f"h{batch_id}-{next(self.ids)}", part) for part in parts if part])
            for new_id, _ in entries:
                state.current.sub_to_batch[new_id] = batch_id
            state.current.historic_queue[0:0] = entries
        if batch.is_complete:
            self.finish_batch(state, batch)
        return True

    def start_negentropy(self, state: RelayState, token: str, flt: Filter) -> None:
        batch_id = state.current.sub_to_batch[token]
        batch = state.current.pending.get(batch_id)
        held = batch.own_holdings.pop(token, None) if batch is not None else None
        also = batch.read_also.pop(token, None) if batch is not None else None
        if held is None:
            held, also = self.own_held.holdings(flt, self.clock()), None  # None: the exchange reads it
        elif also is not None and (known := self.own_held.holdings(also, self.clock())) is not None:
            held, also = union_of_holdings(held, known), None
        started: list = []
        handle = self.effects.spawn(
            negentropy_sync.reconcile_filter,
            state.current.conn, self.own_relay, flt, self.have_beyond_holdings(flt),
            self.post, batch_id=batch_id, token=token, held=held, read_also=also,
            frame_size_limit=negentropy_sync.frame_size_limit(filter_plan.req_length_limit(state.current.limits)),
            busy=self.delivery.answering_slowly,
            started=started,
        )
        state.current.neg_running[token] = RunningExchange(handle, batch_id, flt, self.effects.monotonic(), started,
                                                           epoch=self.own_held.forgotten)
        relay, session = state.url, state.session

        def died(exc) -> None:  # its answer will never come: this is it
            self.post(NegentropyFinished(relay, session, batch_id, token, flt, negentropy_sync.NegentropyOutcome(
                False, reason=f"exchange failed: {type(exc).__name__}: {str(exc)[:100]}")))

        self.effects.on_death(handle, died)

    def expire_negentropy(self) -> None:
        """Exchanges past the manager's deadline end as unanswered ones do, whatever their
        greenlet is doing (SPEC §5: every wait has a deadline)."""
        now = self.effects.monotonic()
        for state in self.relays.values():
            if not state.current.neg_running or not state.connected:
                continue
            for token, run in list(state.current.neg_running.items()):
                if not run.overdue(now, constants.NEGENTROPY_DEADLINE_SECS, constants.NEGENTROPY_GRACE_SECS,
                                   constants.NEGENTROPY_QUEUE_SECS):
                    continue
                self.effects.kill(run.handle)
                self.effects.send(state.current.conn, wire.neg_close(token))
                log.warning("negentropy_overdue", relay=state.url, token=token, batch_id=run.batch_id)
                self.on_negentropy_finished(NegentropyFinished(
                    state.url, state.session, run.batch_id, token, run.filter,
                    negentropy_sync.NegentropyOutcome(False, reason="timeout: past the manager's deadline")))

    def not_seen(self, ids) -> set[str]:
        """``ids`` not yet handed to delivery. (``set - dict.keys()`` would walk the whole
        dedupe index, hundreds of thousands of ids, for a batch's few hundred.)"""
        seen = self.seen
        return {i for i in ids if i not in seen}

    def have_beyond_holdings(self, flt: Filter) -> list[tuple[int, str]]:
        """What a NIP-77 have-set for ``flt`` claims besides the own relay's holdings: the
        refused events and those in flight to the own relay that ``flt`` matches (indexed:
        the cost follows the filter, not everything in flight)."""
        return self.rejected.items_matching(flt) + self.delivery.tracked_matching(flt)

    def on_historic_slot_due(self, msg: HistoricSlotDue) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is not None:
            self.live.woken(state)
            self.pump(state)

    def on_eose(self, state: RelayState, sub_id: str) -> None:
        self.request_served(state)
        state.current.sub_activity.pop(sub_id, None)
        batch_id = state.current.sub_to_batch.get(sub_id)
        if batch_id is None:
            return  # live subscriptions get an immediate EOSE: nothing more to do
        batch = state.current.pending.get(batch_id)
        if batch is None:
            return
        sent_at = state.current.historic_sent_at.pop(sub_id, None)
        if sent_at is not None:
            log.debug("historic_page_done", relay=state.url, sub_id=sub_id, batch_id=batch_id,
                      events=batch.pagination[sub_id].total if sub_id in batch.pagination else 0,
                      secs=round(self.clock() - sent_at, 3))
        pages = batch.on_eose(
            sub_id,
            per_req=filter_plan.filters_per_req(state.current.limits),
            pack=lambda filters: filter_plan.pack_into_reqs(filters, state.current.limits),
            new_sub_id=lambda: f"h{batch_id}-{next(self.ids)}",
            cap=state.current.page_cap,
            elapsed=None if sent_at is None else self.clock() - sent_at,
        )
        state.current.conn.unsubscribe(sub_id)
        state.current.sub_to_batch.pop(sub_id, None)
        for new_id, _ in pages:
            state.current.sub_to_batch[new_id] = batch_id
        state.current.historic_queue[0:0] = pages  # next pages first: they finish what was started
        for crowded in batch.take_crowded():
            self.complete_crowded_second(state, batch, crowded)
        share_queued_reqs(state, batch)
        self.leader_progressed(state, batch)
        self.pump(state)
        if batch.is_complete:
            self.finish_batch(state, batch)

    def complete_crowded_second(self, state: RelayState, batch: PendingBatch, crowded: CrowdedSecond) -> None:
        """A page left a second holding more events of its filter than the relay serves in
        a page (paging by ``until`` cannot go inside a second). Ask that second by NIP-77
        where the relay has it (ordered by id within the second, it pages anything), else
        split the filter on a dimension it enumerates until the pages come back short (a
        piece crowded again is split again). A second nothing splits is left incomplete:
        said in the log and the metric, and the batch fails (the relay's history is not
        complete)."""
        flt = crowded.filter
        if not crowded.again and self.negentropy_usable(state):
            outcome = "negentropy"
            self.queue_negentropy(state, batch, flt, None)
            batch.method = SyncMethod.NEGENTROPY  # its advertised ids are judged as residuals
        elif pieces := split_crowded(flt):
            outcome = "split"
            self.queue_reqs(state, batch, pieces, front=True)
        else:
            outcome = "incomplete"
            batch.mark_failed()
            log.warning("crowded_second_incomplete", relay=state.url, batch_id=batch.batch_id,
                        second=crowded.second, seen=crowded.seen, filter=flt.to_json()[:300])
        metrics.CROWDED_SECONDS.labels(outcome).inc()
        log.info("crowded_second", relay=state.url, batch_id=batch.batch_id, second=crowded.second,
                 seen=crowded.seen, outcome=outcome)

    def finish_batch(self, state: RelayState, batch: PendingBatch) -> None:
        """All subscriptions answered. After NIP-77, judge what the id fetches delivered
        (SPEC §4 residuals) before the items are confirmed. Once: a batch a pump already
        finished (its last answer came in the same message) is left alone."""
        if state.current.pending.get(batch.batch_id) is not batch:
            return
        if batch.kind is BatchKind.RECOVERY:
            self.finish_recovery(state, batch)
            return
        batch.settle([i for i in batch.residual_ids() if i in self.seen])
        self.judge_by_filter(state, batch)
        if batch.advertised_ids:
            decision = batch.residual_decision()
            if decision is ResidualDecision.RETRY_RESIDUAL:
                move_batch(state, batch, Step.IDS_ASKED_AGAIN)
                self.queue_id_fetches(state, batch, batch.begin_residual_retry())
                self.pump(state)
                return
            if decision is ResidualDecision.SEMANTIC_FALLBACK:
                self.ask_residual_by_filter(state, batch)
                return
            if decision is ResidualDecision.FAIL:
                missing = self.not_seen(batch.residual_ids())
                unanswered = self.filter_unanswered(state, batch, missing)
                if missing - unanswered:
                    self.note_unservable(state, {i: batch.found_by.get(i) for i in missing - unanswered},
                                         batch.items.repos)
                if unanswered:
                    self.recover_residual(state, batch, unanswered)
        self.confirm_batch(state, batch)

    def ask_residual_by_filter(self, state: RelayState, batch: PendingBatch) -> None:
        """Ids the relay advertised and did not serve by id are asked by the filters that
        found them (REQ pages), once. Of at least ``IDS_NOT_SERVED_MIN_ADVERTISED`` ids, a
        relay that served (nearly) none by id does not serve ids (``ids_not_served``);
        fewer are judged by what their filters bring (``judge_by_filter``)."""
        missing = self.not_seen(batch.residual_ids())
        if not batch.residual_retried:
            self.judge_ids_served(state, batch, brought_by_filter=None)
        move_batch(state, batch, Step.ASKED_BY_FILTER)
        batch.residual_asked = set(missing)
        if missing:
            filters = batch.residual_filters(missing)
            log.info("negentropy_ids_asked_by_filter", relay=state.url, batch_id=batch.batch_id,
                     missing=len(missing), filters=len(filters))
            self.queue_reqs(state, batch, filters, front=True)
            self.pump(state)
        if batch.is_complete:
            self.finish_batch(state, batch)

    def filter_unanswered(self, state: RelayState, batch: PendingBatch, ids: set[str]) -> set[str]:
        """Of ``ids``, asked by their filters, those whose filter's REQ never finished (the
        batch failed, and the filter went to recovery: ``refusals.fail_into_recovery``): not
        judged unservable, recovered instead."""
        if not batch.failed or not ids:
            return set()
        unfinished = self.recovery.pending_filters(state.url)
        return {i for i in ids if any(f in unfinished for f in batch.residual_filters([i]))}

    def recover_residual(self, state: RelayState, batch: PendingBatch, missing: set[str]) -> None:
        """Ids whose filter's REQ did not finish go to missing-event recovery."""
        self.recover_ids(state.url, {i: batch.found_by.get(i) for i in missing})
        log.warning("batch_incomplete", relay=state.url, batch_id=batch.batch_id, missing=len(missing))

    def recover_ids(self, url: str, found: dict) -> None:
        """Missing-event recovery for ``found`` (id -> the filter that found it on ``url``,
        or None): by id where the relay serves ids, by those filters where it does not
        (asked by id again, they would only come back empty)."""
        now = self.clock()
        state = self.relays.get(url)
        if state is not None:
            found = {i: flt for i, flt in found.items() if i not in state.unservable}
        self.recovery.add_missing(url, found, now, found_by=found,
                                  by_id_first=state is None or state.serves_ids(now))

    def judge_ids_served(self, state: RelayState, batch: PendingBatch, brought_by_filter: int | None) -> None:
        """A relay that does not serve by id what its NIP-77 advertises
        (``unservable.ids_not_served``, on the batch's first id pass and, once asked, what
        the filters brought) is remembered so: its next batches go by REQ+EOSE from the start
        (``RelayState.serves_ids``), for a day."""
        advertised = len(batch.advertised_ids)
        by_id = advertised - len(batch.residual_asked or batch.residual_ids())
        if not ids_not_served(advertised, by_id, brought_by_filter) or not state.serves_ids(self.clock()):
            return
        state.ids_unserved_at = self.clock()
        log.warning("relay_ids_not_served", relay=state.url, batch_id=batch.batch_id,
                    advertised=advertised, delivered=by_id, by_filter=brought_by_filter)

    def judge_by_filter(self, state: RelayState, batch: PendingBatch) -> None:
        """The filters asked for what the first id pass did not serve have answered
        (judged once)."""
        if batch.residual_asked and not batch.residual_retried:
            self.judge_ids_served(state, batch, len(batch.residual_asked & batch.received_ids))
        batch.residual_asked = set()

    def note_unservable(self, state: RelayState, found: dict, repos=()) -> None:
        """``found`` (id -> the filter that failed to bring it, or None) came neither by id
        nor by that filter: unservable on this relay (``sync.unservable``). Counted, not asked
        there again before its next daily fresh start, and asked by id (never by a whole
        filter) from the other relays listing its repository: those the filter names, else
        ``repos`` (the batch's)."""
        new = state.unservable.add(i for i in found if i not in self.seen)
        if not new:
            return
        metrics.EVENTS_UNSERVABLE.labels(state.url).inc(len(new))
        elsewhere: dict[str, dict] = {}
        for event_id in new:
            for url in self.relays_listing(found[event_id], repos) - {state.url}:
                elsewhere.setdefault(url, {})[event_id] = None
        log.warning("events_unservable", relay=state.url, ids=len(new), sample=new[:3],
                    asked_elsewhere=len(elsewhere))
        now = self.clock()
        for url, ids in elsewhere.items():
            other = self.relays.get(url)
            # (not one that does not serve ids: it syncs by REQ pages, which brought it if it had it)
            if other is not None and other.serves_ids(now):
                self.recover_ids(url, ids)

    def relays_listing(self, flt: Filter | None, repos=()) -> set[str]:
        """The relays listing the repositories ``flt`` asks by address (else ``repos``)."""
        addresses = [v for name, values in (flt.tags if flt is not None else ()) if name in filter_plan.REPO_TAGS
                     for v in values if v in self.repos] or repos
        return {url for address in addresses if (needs := self.repos.get(address)) is not None
                for url in needs.relays}

    def refetch_refused(self, relay: str, ids: list[str]) -> None:
        """Fetch released cold ids from the relay they came from; if it is not connected,
        when it connects. Entries saved without their relay ask every connected relay."""
        state = self.relays.get(relay)
        if state is None:
            targets = [s for s in self.relays.values() if s.connected]
        elif not state.connected:
            state.refetch_ids.update(ids)
            return
        else:
            targets = [state]
        for target in targets:
            self.fetch_ids(target, ids)

    def fetch_waiting_refetches(self, state: RelayState) -> None:
        """On (re)connect: released ids that waited for this relay."""
        if state.refetch_ids:
            ids, state.refetch_ids = state.refetch_ids, set()
            self.fetch_ids(state, ids)

    def fetch_ids(self, state: RelayState, ids) -> None:
        """Fetch ``ids`` by id from ``state``'s relay, as many to a REQ as relays take."""
        ids = sorted(ids)
        for start in range(0, len(ids), constants.MAX_IDS_PER_REQ):
            self.start(state, PendingItems(), [Filter.make(ids=ids[start:start + constants.MAX_IDS_PER_REQ])])

    def queue_id_fetches(self, state: RelayState, batch: PendingBatch, ids) -> None:
        """Id fetches finish a batch already started: they go before newer work, as the next
        pages do (appended, a steady stream of new batches would starve them)."""
        ids = sorted(ids)
        filters = [Filter.make(ids=ids[i:i + constants.MAX_IDS_PER_REQ])
                   for i in range(0, len(ids), constants.MAX_IDS_PER_REQ)]
        for flt in reversed(filters):  # one filter per REQ: relays cap per filter and per REQ
            self.queue_reqs(state, batch, [flt], front=True)

    def release_claims(self, state: RelayState, batch: PendingBatch) -> None:
        """The batch is done with: what it claimed and did not get goes, for recovery, to
        the relays that skipped it (never lost because one relay failed)."""
        for relay, found in self.claims.release(state.url, batch.batch_id).items():
            self.recover_ids(relay, found)

    def confirm_batch(self, state: RelayState, batch: PendingBatch) -> None:
        self.release_claims(state, batch)
        state.current.pending.pop(batch.batch_id, None)
        move_batch(state, batch, Step.CONFIRMED)
        self.stop_leading(state, batch)
        if batch.kind is BatchKind.POLL and not batch.failed:
            for tier in batch.poll_tiers:
                tier.cursor = batch.poll_started_at
        state.confirmed.add(batch.items)
        if batch.failed:
            state.current.threads_ahead.drop_batch(batch.batch_id)
        if batch.kind is BatchKind.LAYER1:
            state.announcements_synced = True
        if batch.failed:
            state.batch_failures = True
        log.debug("batch_confirmed", relay=state.url, batch_id=batch.batch_id, failed=batch.failed,
                  method=batch.method.value)
        probed = state.current.probes.pop(batch.batch_id, None)
        if probed is not None:
            self.probe_answered(state, probed, batch)
        self.check_historic_complete(state)

    def check_historic_complete(self, state: RelayState) -> None:
        """Double check (seed 001): no pending batch now, and still none 6 s later."""
        if (state.current.syncing() or state.current.completion_check_scheduled
                or state.status != ConnectionStatus.SYNCING):
            return
        state.current.completion_check_scheduled = True
        delay = self.sync.batch_window_ms / 1000 + 1
        self.effects.later(delay, CompletionRecheck(state.url, state.session))

    def on_completion_recheck(self, msg: CompletionRecheck) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None:
            return
        state.current.completion_check_scheduled = False
        if state.current.syncing() or state.status != ConnectionStatus.SYNCING:
            return
        move_status(state, Fact.HISTORIC_DONE_WITH_FAILURES if state.batch_failures else Fact.HISTORIC_DONE)
        state.historic_sync_completed_at = self.clock()
        log.info("historic_sync_complete", relay=state.url, status=state.status.name)
        self.promote_if_recovered(state.url)  # recovery may have finished before this check

    def on_negentropy_finished(self, msg: NegentropyFinished) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None:
            return
        run = state.current.neg_running.pop(msg.token, None)
        if run is None:
            return  # answered already (the manager's deadline, or its greenlet's death)
        if msg.result.read_also is not None and run.epoch == self.own_held.forgotten:
            part, entries = msg.result.read_also  # new values' holdings: other relays' exchanges use them
            self.own_held.learn(part, entries, self.clock())
        batch = state.current.pending.get(msg.batch_id)
        state.current.sub_to_batch.pop(msg.token, None)
        result = msg.result
        if batch is None:
            self.pump(state)
            return
        batch.finish_subscription(msg.token)
        if result.ok:
            self.negentropy_served(state, batch, msg.filter, result)
        elif result.failure == "too-many-results":
            self.split_past_result_cap(state, batch, msg.filter, result)
        else:
            self.negentropy_failed(state, batch, msg.filter, result)
        if not any(map(is_negentropy_token, batch.outstanding_subs)):
            self.fetch_what_the_exchanges_found(state, batch)
        self.pump(state)
        if batch.is_complete:
            self.finish_batch(state, batch)

    def negentropy_served(self, state: RelayState, batch: PendingBatch, flt, result) -> None:
        """An exchange for ``flt`` ended: what it found missing is claimed (fetched once,
        across relays), then fetched by id, or by the filter's pages where it lacks most."""
        self.request_served(state)
        state.nip77_failed_at = None
        metrics.NEGENTROPY_BYTES.labels(state.url, "up").inc(result.bytes_up)
        metrics.NEGENTROPY_BYTES.labels(state.url, "down").inc(result.bytes_down)
        metrics.NEGENTROPY_ROUNDS.labels(state.url).inc(result.rounds)
        state.result_cap.note_passed(result.held + result.beyond - len(result.have_ids) + len(result.need_ids),
                                     result.held + result.beyond)
        # Several filters match the same events (a comment tags its root with both E
        # and e; repositories list several relays): each id is fetched once, by the
        # first batch that claims it; the others wait for it (``FetchClaims``).
        # (not what the relay served neither by id nor by filter already: ``sync.unservable``)
        need = self.claims.claim(state.url, batch.batch_id,
                                 (i for i in result.need_ids if i not in self.seen and i not in state.unservable),
                                 flt)
        log.debug("negentropy_done", relay=state.url, batch_id=batch.batch_id, need=len(need),
                  advertised=len(result.need_ids), have=len(result.have_ids),
                  rounds=result.rounds, held=result.held)
        self.cover_threads_ahead(state, batch, flt, result.need_ids)
        # By the filter's pages where it lacks most of what the relay advertised
        # (not a one-second filter: its REQ pages are what could not complete it). Its
        # pages would bring again what is held, in flight, refused, or fetched elsewhere;
        # and not where other relays list the repositories too: their exchanges and
        # pages run meanwhile, and only fetches by id keep to the claims (by filter,
        # bench/scale's 50 relays received 2.7 copies for each event fetched so).
        again = result.held + result.beyond + len(result.need_ids) - len(need)
        if (method.fetch_missing_by_filter(len(need), again) and not one_second(flt)
                and not (batch.follower or batch.share_all or self.listed_elsewhere(state, batch))):
            log.debug("negentropy_fetch_by_filter", relay=state.url, batch_id=batch.batch_id,
                      need=len(need), held=result.held)
            batch.fetch_by_filter.append(flt)
        else:
            batch.expect_ids(need, found_by=flt)

    def negentropy_failed(self, state: RelayState, batch: PendingBatch, flt, result) -> None:
        """An exchange for ``flt`` failed: ``flt`` goes by REQ pages, at the front. Unless
        the own relay's side failed, NIP-77 is off for the session (for a day where it was
        advertised and not served)."""
        if result.own_relay_failed:
            log.warning("negentropy_own_relay_unavailable", relay=state.url, reason=result.reason)
        else:
            if wire.is_rate_limit_text(result.reason):  # NEG-ERR "rate-limited: …"
                self.rate_limited(state, result.reason)
            elif result.rounds == 0 and (77 in getattr(state.current.limits, "supported_nips", ())
                                         or result.reason.startswith("timeout")):
                # refused where it says it serves NIP-77, or never answered at all: not
                # again for a day, restarts included (a slow exchange that had answers,
                # or a NEG-ERR from a relay that never said it serves NIP-77, holds for
                # its session only)
                self.remember_nip77_unserved(state, result.reason)
            self.disable_negentropy(state, result.reason)
        self.queue_reqs(state, batch, [flt], front=True)

    def cover_threads_ahead(self, state: RelayState, batch: PendingBatch, flt: Filter, found) -> None:
        """``found``: what a layer-2 exchange (``flt``) found the own relay lacks. Roots
        among it would each take a round of their own once fetched and stored: exchanges of
        their threads (``#e``, ``#E``, ``#q``), then a fetch by id of what those find. So
        the ids join this batch's thread filters that have not started, if each shape the
        relay takes has a place (``thread_places``; else nothing changes: roots take their
        round). They are covered live from now (an exchange sees up to its start, the root
        is known later) and noted (``RelaySession.threads_ahead``): a root the own relay
        stores then confirms with this batch (``RelayLifecycle.take_threads_ahead``). Most
        ids are not roots: they cost their bytes in the filters, and their threads' live
        coverage for ``THREADS_AHEAD_SECS``."""
        if batch.kind is not BatchKind.SYNC or not found or not filter_plan.asks_by_repo(flt):
            return
        session, now = state.current, self.clock()
        ids = set(found) - batch.items.root_events
        if not ids or len(ids) > session.threads_ahead.room(now):
            return
        items = PendingItems(root_events=ids)
        wanted = sync_filters(state, items, None)  # a thread filter of each shape the relay takes
        if not wanted or len(wanted) != len({f.tags[0][0] for f in wanted}):
            return  # more than one filter of a shape: too many ids to join
        places = self.thread_places(state, batch, wanted)
        if places is None:
            return
        joins, by_req = places
        for i, token, merged, part in joins:
            session.historic_queue[i] = (token, [merged])
            earlier = batch.read_also.get(token)
            batch.read_also[token] = part if earlier is None else filter_plan.merge_tag_values(earlier, part, 1 << 62)
        if by_req:
            self.queue_reqs(state, batch, by_req)  # shares a queued REQ (``thread_places``)
        session.threads_ahead.note(ids, now, batch.batch_id)
        self.live.subscribe(state, filter_plan.live(wanted), items)
        log.debug("threads_ahead", relay=state.url, batch_id=batch.batch_id, ids=len(ids),
                  exchanges=[token for _, token, _, _ in joins], by_req=len(by_req))

    def thread_places(self, state: RelayState, batch: PendingBatch, wanted):
        """Where each of ``wanted`` (new values' thread filters, one of each shape) joins
        the batch without a start more: an exchange of its shape not started, with room for
        the values (what the own relay holds of them is read when it starts:
        ``PendingBatch.read_also``); else a REQ of the batch not started, with a filter's
        room (its pages bring the values' threads). (exchanges as (queue index, token,
        merged filter, part), REQ filters), or None where one has no place."""
        session = state.current
        budget = filter_plan.tag_value_budget(session.limits) // 2  # as merge_into_waiting_negentropy
        queued = [(i, token, group[0]) for i, (token, group) in enumerate(session.historic_queue)
                  if token in batch.outstanding_subs and is_negentropy_token(token)
                  and filter_plan.asks_by_root(group[0])]
        joins, by_req = [], []
        for part in wanted:
            join = next(((i, token, merged) for i, token, waiting in queued
                         if (merged := filter_plan.merge_tag_values(waiting, part, budget)) is not None), None)
            if join is None:
                by_req.append(part)
            else:
                joins.append((*join, part))
        if by_req:
            reqs = [group for sub_id, group in session.historic_queue
                    if session.sub_to_batch.get(sub_id) == batch.batch_id and not is_negentropy_token(sub_id)
                    and batch.may_share(sub_id)]
            if len(by_req) > len(reqs) * filter_plan.filters_per_req(session.limits) - sum(map(len, reqs)):
                return None
        return joins, by_req

    def fetch_what_the_exchanges_found(self, state: RelayState, batch: PendingBatch) -> None:
        # The batch's last exchange: fetch everything it found at once, in as few REQs
        # as the caps allow (each REQ start is paced): mostly-missing filters by their
        # pages, sharing REQs, the rest by id, 300 a REQ.
        if batch.fetch_by_filter:
            filters, batch.fetch_by_filter = batch.fetch_by_filter, []
            self.queue_reqs(state, batch, filters, front=True)
        if batch.advertised_ids:
            batch.settle([i for i in batch.advertised_ids if i in self.seen])
            self.queue_id_fetches(state, batch, self.not_seen(batch.advertised_ids))

    def split_past_result_cap(self, state: RelayState, batch: PendingBatch, flt: Filter, result) -> None:
        """The relay's NIP-77 refused ``flt`` for matching too many events (strfry past its
        ``maxSyncEvents``): NIP-77 stays on, and ``flt`` is cut by what the own relay holds
        of it and the relay's cap as known (``result_caps.after_refusal``): time windows
        expected to fit, reconciled first in the queue, and REQ pages where nothing is held."""
        now = self.clock()
        held = self.own_held.holdings(flt, now)
        if held is not None:
            held += self.have_beyond_holdings(flt)
        cut = result_caps.after_refusal(state.result_cap, flt, held, result.cap, int(now))
        log.info("negentropy_filter_split", relay=state.url, batch_id=batch.batch_id, parts=len(cut.exchanges),
                 pages=len(cut.pages), limit=state.result_cap.limit(), reason=result.reason[:200])
        self.queue_cut(state, batch, cut)

    def cut_before_start(self, state: RelayState, batch: PendingBatch | None, token: str, flt: Filter) -> bool:
        """An exchange about to start on a relay whose result cap is known, for a filter the
        own relay alone holds more of than that: cut now (``result_caps.cut_before_start``),
        not one refusal later. True if it was (its pieces are first in the queue)."""
        if batch is None or state.result_cap.limit() is None:
            return False
        held = batch.own_holdings.get(token)
        if held is None:
            held = self.own_held.holdings(flt, self.clock())
        if held is None:
            return False  # the exchange reads it: known after a refusal, if one comes
        cut = result_caps.cut_before_start(state.result_cap, flt, [*held, *self.have_beyond_holdings(flt)])
        if cut is None:
            return False
        state.current.historic_queue.pop(0)
        del state.current.sub_to_batch[token]
        batch.own_holdings.pop(token, None)
        batch.finish_subscription(token)
        log.info("negentropy_filter_cut", relay=state.url, batch_id=batch.batch_id, parts=len(cut.exchanges),
                 pages=len(cut.pages), limit=state.result_cap.limit())
        self.queue_cut(state, batch, cut)
        return True

    def queue_cut(self, state: RelayState, batch: PendingBatch, cut) -> None:
        """A filter's pieces past the result cap, first in the queue: they finish what was
        started."""
        if cut.pages:
            self.queue_reqs(state, batch, cut.pages, front=True)
        tail = len(state.current.historic_queue)
        for part in cut.exchanges:
            self.queue_negentropy(state, batch, part, None)  # each exchange reads its own holdings
        parted = state.current.historic_queue[tail:]
        del state.current.historic_queue[tail:]
        state.current.historic_queue[0:0] = parted

    def remember_nip77_unserved(self, state: RelayState, reason: str) -> None:
        """The relay lists 77 in its NIP-11 and did not serve it (refused, or no answer
        before the deadline): later sessions go by REQ+EOSE until NIP77_RETRY_SECS have
        passed (``RelayState.nip77_resting``), instead of each spending up to the deadline."""
        if state.nip77_failed_at is None:
            log.warning("negentropy_advertised_not_served", relay=state.url, reason=reason[:200],
                        retry_secs=constants.NIP77_RETRY_SECS)
        state.nip77_failed_at = self.clock()

    def disable_negentropy(self, state: RelayState, reason: str) -> None:
        """NIP-77 is not usable on this relay for this session: REQ+EOSE from now on."""
        if state.current.negentropy_ok:
            log.warning("negentropy_unsupported", relay=state.url, reason=reason[:200])
        state.current.negentropy_ok = False
        self.health.disable_negentropy(state.url)
        self.requeue_negentropy_as_reqs(state)

    def requeue_negentropy_as_reqs(self, state: RelayState) -> None:
        """NIP-77 is off: exchanges still queued become REQs."""
        queued = [(t, g) for t, g in state.current.historic_queue if is_negentropy_token(t)]
        state.current.historic_queue = [e for e in state.current.historic_queue if not is_negentropy_token(e[0])]
        for token, group in queued:
            batch = state.current.pending.get(state.current.sub_to_batch.pop(token, -1))
            if batch is not None:
                batch.finish_subscription(token)
                batch.own_holdings.pop(token, None)
                batch.read_also.pop(token, None)
                self.queue_reqs(state, batch, group)

    def run_recovery(self, now: float) -> None:
        for url in self.recovery.due_relays(now):
            state = self.relays.get(url)
            ids = self.recovery.next_attempt(url, now, connected=bool(state and state.connected))
            if ids is None:
                continue
            filters = self.recovery.attempt_filters(url)
            log.info("recovery_attempt", relay=url, ids=len(ids), filters=len(filters))
            if ids:
                filters = [Filter.make(ids=ids), *filters]
            batch = self.start(state, PendingItems(), filters, kind=BatchKind.RECOVERY)
            batch.expect_ids(self.recovery.awaited(url))

    def finish_recovery(self, state: RelayState, batch: PendingBatch) -> None:
        self.release_claims(state, batch)
        state.current.pending.pop(batch.batch_id, None)
        move_batch(state, batch, Step.CONFIRMED)
        dropped, unservable = self.recovery.record_result(state.url, batch.received_ids, self.clock(),
                                                          filters_done=not batch.failed)
        if unservable:
            self.note_unservable(state, unservable)
        if dropped:
            metrics.EVENTS_UNRECOVERED.inc(len(dropped))
            log.warning("recovery_gave_up", relay=state.url, dropped=len(dropped))
        self.promote_if_recovered(state.url)
        self.check_historic_complete(state)

    def promote_if_recovered(self, url: str) -> None:
        state = self.relays.get(url)
        if (
            state is not None
            and state.status == ConnectionStatus.CONNECTED_HISTORIC_SYNC_FAILURES
            and self.recovery.is_fully_recovered(url)
            and not state.unrelated_failure
        ):
            move_status(state, Fact.RECOVERED)
            state.batch_failures = False
            log.info("relay_recovered", relay=url)


def share_queued_reqs(state: RelayState, batch: PendingBatch) -> None:
    """Queued REQs of one batch (next pages, first pages of a later AddFilters) are
    packed again filter by filter, in queue order, ten to a REQ within the relay's
    message size: every start carries as many filter pages as it can, the pages that
    finish what was started first, and a REQ of next pages takes first pages along
    rather than waiting to be filled by splitting (``fill_before_start``). Exact-id
    fetches and pages that must go alone stay as they are."""
    shared = [sub_id for sub_id, _ in state.current.historic_queue
              if state.current.sub_to_batch.get(sub_id) == batch.batch_id and batch.may_share(sub_id)]
    if len(shared) < 2:
        return
    groups = batch.repack(shared, filter_plan.filters_per_req(state.current.limits),
                          filter_plan.req_length_limit(state.current.limits))
    kept = []
    for sub_id, group in state.current.historic_queue:
        if sub_id in groups:
            kept.append((sub_id, groups[sub_id]))
        elif sub_id in shared:
            state.current.sub_to_batch.pop(sub_id, None)  # its filters went to earlier REQs
        else:
            kept.append((sub_id, group))
    state.current.historic_queue = kept


def union_of_holdings(a, b) -> list:
    """Two holdings lists ((created_at, id) pairs) as one, each id once."""
    union = {event_id: (at, event_id) for at, event_id in a}
    union.update((event_id, (at, event_id)) for at, event_id in b)
    return list(union.values())
