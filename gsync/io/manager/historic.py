"""Historic sync, executed: the gate every historic start waits at (the relay's pacing and
budget, live REQs first, the own relay up, delivery's backlog), the starts themselves (a
REQ sent, a NIP-77 exchange spawned) and the messages that answer them. What to start and
what an answer leads to is decided by the planner (``sync.planner``, ``sync.batch_end``),
which alone writes the start queue (``sync.start_queue``); its actions (``sync.plan_actions``)
are executed here, in order."""
from __future__ import annotations

import os

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol import messages as wire
from ...protocol.filters import Filter
from ...sync import batch_end, batch_phase, filter_plan, start_queue
from ...sync import plan_actions as act
from ...sync.batch_phase import Step
from ...sync.pending import BatchKind, PendingBatch, slow_answer
from ...sync.planner import HistoricPlanner
from ...sync.relay_state import RelayState, RunningExchange
from ...sync.start_queue import StartQueue, is_exchange, share_queued_reqs  # noqa: F401 (test_pending's)
from ...sync.targets import PendingItems
from .. import negentropy_sync
from ..inbox import (
    DeliveryCaughtUp,
    HistoricSlotDue,
    NegentropyFinished,
    OwnHoldingsRead,
    OwnReadsLanded,
)
from .coverage import member_filters, sync_filters
from .effects import unsubscribe
from .own_reads import OwnReadWaiter

log = get_logger("gsync.manager")


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
    """Every relay's historic batches: decided by the planner (``plan``, over ``lead``,
    ``claims``, ``recovery``, ``own_held``, ``seen``, ``rejected``, ``delivery``, ``repos``),
    started through the gate (``health``'s pacing, ``live`` REQs first, the own relay up,
    delivery's backlog: held here), answered through ``own_reads``, ``effects`` and ``post``.
    What the relays' answers say of their rate and policy goes to the refusals side
    (``request_served``, ``rate_limited``, ``probe_answered``); a relay's end of historic
    sync to ``completion``."""

    def __init__(self, *, sync, own_relay: str, relays, repos, health, live, lead, claims, recovery,
                 own_held, own_reads, seen, rejected, delivery, own_relay_down, request_served,
                 rate_limited, probe_answered, completion, effects, post, clock, ids,
                 members_of_roots=lambda state, roots: None,
                 check_answer=lambda state, batch, answer, slow: False, one_filter_found=lambda state: None,
                 held_on_both=lambda state, ids: None, exchange_ended=lambda state, flt, result: None):
        self.sync = sync  # [sync]: negentropy on or off, the batch window
        self.own_relay = own_relay
        self.relays = relays
        self.health = health
        self.live = live
        self.recovery = recovery
        self.own_held = own_held
        self.own_reads = own_reads
        # ``Descendants.members_of_roots``: the members known of the roots a batch asks for
        # are watched on its relay too
        self.members_of_roots = members_of_roots
        self.delivery = delivery
        self.own_relay_down = own_relay_down
        self.request_served = request_served
        self.rate_limited = rate_limited
        self.probe_answered = probe_answered
        # ``Refusals.check_answer`` / ``one_filter_found``: a relay answering one filter a REQ
        self.check_answer = check_answer
        # ``Refusals.judge_exchange_reach``: an exchange that compared something proves how
        # wide a list of tag values the relay reads
        self.exchange_ended = exchange_ended
        self.one_filter_found = one_filter_found
        # ``Refusals.keep_held_ids``: events an exchange found on both sides, for that proof
        self.held_on_both = held_on_both
        self.completion = completion  # the relay's historic sync done, recovered
        self.effects = effects
        self.post = post
        self.clock = clock
        self.queue = StartQueue(ids)  # the start queues' only writer, and their ids'
        self.plan = HistoricPlanner(sync=sync, queue=self.queue, relays=relays, repos=repos, health=health,
                                    lead=lead, claims=claims, recovery=recovery, own_held=own_held, seen=seen,
                                    rejected=rejected, delivery=delivery, move=move_batch)
        # historic starts wait while delivery is this far behind, and are held now
        self.backlog_high_water = int(sync.delivery_max_backlog * constants.DELIVERY_HIGH_WATER_FRACTION)
        self.held_for_delivery = False
        self.landing: dict[str, RelayState] | None = None  # relays to pump once a read's answers are out

    # -- what the planner asks --------------------------------------------------------------

    def execute(self) -> None:
        """Do what the planner asked, in order."""
        for a in self.plan.take():
            if isinstance(a, act.Log):
                getattr(log, a.level)(a.event, **a.fields)
            elif isinstance(a, act.Count):
                metric = getattr(metrics, a.metric)
                (metric.labels(*a.labels) if a.labels else metric).inc(a.n)
            elif isinstance(a, act.ReadOwn):
                self.own_reads.queue(OwnReadWaiter(a.state.url, a.state.session, a.batch_id, a.token, a.filters,
                                                   a.reads, a.follower, ahead=a.ahead))
            elif isinstance(a, act.AwaitRead):
                self.own_reads.await_read(OwnReadWaiter(a.state.url, a.state.session, a.batch_id, a.token,
                                                        a.filters, [], a.follower))
            elif isinstance(a, act.OwnKnown):
                self.post(OwnHoldingsRead(a.state.url, a.state.session, a.batch_id, a.token, a.filters, a.holdings))
            elif isinstance(a, act.Close):
                unsubscribe(self.effects, a.state.current, a.sub_id)
            elif isinstance(a, act.Pump):
                self.pump(a.state)
            elif isinstance(a, act.ExchangesEnded):
                batch_end.fetch_what_the_exchanges_found(self.plan, a.state, a.batch)
            elif isinstance(a, act.Advance):
                self.advance(a.state, a.batch, pump=a.pump)
            elif isinstance(a, act.Served):
                self.request_served(a.state)
            elif isinstance(a, act.RateLimited):
                self.rate_limited(a.state, a.reason)
            elif isinstance(a, act.CoverLive):
                self.live.subscribe(a.state, a.filters, a.items)
            elif isinstance(a, act.Confirmed):
                if a.probed is not None:
                    self.probe_answered(a.state, a.probed, a.batch)
                self.completion.check(a.state)
            elif isinstance(a, act.RecoveryFinished):
                self.completion.promote_if_recovered(a.state.url)
                self.completion.check(a.state)

    def advance(self, state: RelayState, batch: PendingBatch | None, pump: bool = True) -> None:
        """Pump, then finish ``batch`` (judge its residuals, confirm it: ``batch_end.finish``)
        if nothing of it is outstanding any more."""
        if pump:
            self.pump(state)
        if batch is not None and batch.is_complete:
            self.finish_batch(state, batch)

    def finish_batch(self, state: RelayState, batch: PendingBatch) -> None:
        batch_end.finish(self.plan, state, batch, self.clock())
        self.execute()

    # -- batches ------------------------------------------------------------------------------

    def start(self, state: RelayState, items: PendingItems, filters,
              kind: BatchKind = BatchKind.SYNC, coalesce=False, leaders=(), go_now=False) -> PendingBatch:
        """A PendingBatch for ``filters`` (``HistoricPlanner.start``), pumped."""
        batch, new = self.plan.start(state, items, filters, kind, coalesce, leaders, go_now, self.clock())
        self.execute()
        threads = [f for f in filters if filter_plan.asks_by_root(f)]
        if threads:
            # the members known of these roots are watched there too (``Descendants``); REQ
            # pages read none of the own relay: the members it holds (published to it
            # directly) are read for them all the same, and learnt
            self.members_of_roots(state, {root for f in threads for root in f.tags[0][1]})
            if kind is not BatchKind.RECOVERY and not self.use_negentropy(state, filters):
                self.own_reads.learn(threads)
        if new:
            self.advance(state, batch)
        return batch

    def join_other_shard_wait(self, state: RelayState, items: PendingItems) -> bool:
        joined = self.plan.join_other_shard_wait(state, items, lambda i: sync_filters(state, i, None), self.clock())
        self.execute()
        return joined

    def catch_up(self, state: RelayState, items: PendingItems, since: int) -> None:
        """Historic only, confirming nothing: what ``items``' live subscriptions (still open,
        or just replaced) may have missed since ``since``, and layer 1 with it. A filter an
        earlier catch-up of the relay still has queued, unstarted, from no later a time, is
        not queued again: that one asks what this one would, later. A relay whose pace
        spaces its starts 10 s apart takes minutes over a catch-up of a hundred REQs, and a
        full budget may be rebuilt once a minute (``CONSOLIDATION_MIN_SECS``), each rebuild
        with its catch-up: its queue grew for good, its sync never ended (the simulator's
        seed 983, by a rebuild every ten minutes)."""
        session = state.current
        session.catch_up_batches = [i for i in session.catch_up_batches if i in session.pending]
        queued: dict = {}  # a queued catch-up filter without its since -> the earliest since
        for batch_id in session.catch_up_batches:
            for _, _, group in start_queue.queued_of(state, session.pending[batch_id]):
                for f in group:
                    key = f.replace(since=None)
                    queued[key] = min(queued.get(key, f.since), f.since)
        filters = sync_filters(state, items, since)
        if session.members:
            filters += [f.replace(since=since) for f in member_filters(state, session.members)]
        for part in ([filter_plan.layer1_filter(since)], filters):
            left = [f for f in part if queued.get(f.replace(since=None), since + 1) > since]
            if len(left) < len(part):
                log.debug("catch_up_queued_already", relay=state.url, filters=len(part) - len(left))
            if left:
                session.catch_up_batches.append(self.start(state, PendingItems(), left).batch_id)

    def use_negentropy(self, state: RelayState, filters) -> bool:
        return self.plan.use_negentropy(state, filters, self.clock())

    def leaders_too_slow(self, state: RelayState, items: PendingItems, leaders, filters) -> bool:
        return not self.plan.follower_wait(state, items, leaders, filters).wait

    def release_followers(self, keys, overdue: bool = False) -> None:
        self.plan.release_followers(keys, self.clock(), overdue)
        self.execute()

    def release_claims(self, state: RelayState, batch: PendingBatch) -> None:
        batch_end.release_claims(self.plan, state, batch, self.clock())

    def recover_ids(self, url: str, found: dict) -> None:
        batch_end.recover_ids(self.plan, url, found, self.clock())

    def disable_negentropy(self, state: RelayState, reason: str, expected: bool = False) -> None:
        batch_end.disable_negentropy(self.plan, state, reason, expected)
        self.execute()

    def exchanges_to_reqs(self, state: RelayState) -> None:
        batch_end.exchanges_to_reqs(self.plan, state)
        self.execute()

    # -- the gate, and the starts ---------------------------------------------------------------

    def pump(self, state: RelayState) -> None:
        """Start queued historic REQs while the relay's budget and pacing allow.

        Every historic, pagination, id-fetch and retry start is a background start: the
        health tracker's gates space them (1 s per connection, longer after a rate-limit
        refusal, none during a cooldown). Nothing starts while the own relay is down: what
        would be fetched could not be delivered (the catch-up after the outage covers it);
        nor while delivery is more than a quarter of its backlog limit behind. Live REQs
        waiting for the gates go first (``LiveCoverage.pump``). Which queued start goes is
        the planner's (``HistoricPlanner.next_start``).
        """
        if (state.current.pump_held or not state.connected or not self.live.pump(state)
                or self.own_relay_down() or self.delivery_holds_history()):
            return
        limit, open_historic = start_queue.slots(state, state.current.book.subscriptions)
        while (state.current.historic_queue or state.current.probe is not None) and open_historic < limit:
            now = self.clock()
            wait = self.health.may_start_background(state.url, now)
            if wait > 0:
                self.live.wake_pump_in(state, wait)
                return
            if state.current.probe is not None:
                self.send_probe(state, now)
                continue
            start = start_queue.next_start(self.plan, state, open_historic > 0, state.current.book.open_filter_bytes, now)
            self.execute()
            if start is act.AGAIN:
                continue
            if start is None:
                return
            self.send_historic_start(state, start, now)
            open_historic += 1

    def on_historic_slot_due(self, msg: HistoricSlotDue) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is not None:
            self.live.woken(state)
            self.pump(state)

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

    def send_probe(self, state: RelayState, now: float) -> None:
        """The precise probe (``protocol.precise``), one paced background start; the reader
        takes its answer (``RelayConnection._probe_answered``)."""
        probe, state.current.probe = state.current.probe, None
        self.health.record_start(state.url, now, background=True)
        self.effects.send(state.current.link, state.current.book.probe_frame(f"probe-{state.session}", probe))

    def send_historic_start(self, state: RelayState, start: act.Start, now: float) -> None:
        """One paced background start: a NIP-77 exchange or a historic REQ."""
        sub_id, group, batch = start.sub_id, start.filters, start.batch
        self.health.record_start(state.url, now, background=True)
        log.debug("historic_started", relay=state.url, sub_id=sub_id, filters=len(group),
                  batch_id=state.current.sub_to_batch[sub_id])
        purpose = batch.purpose if batch is not None else "other"
        if is_exchange(sub_id):
            metrics.BACKGROUND_STARTS.labels(state.url, "negentropy", purpose).inc()
            self.start_negentropy(state, sub_id, group[0], *start.holdings, asks=start.asks)
        else:
            metrics.BACKGROUND_STARTS.labels(state.url, "req", purpose).inc()
            state.current.historic_sent_at[sub_id] = now
            group = filter_plan.with_page_limit(group, state.current.page_cap.page_limit)
            self.effects.send(state.current.link, state.current.book.req_frame(sub_id, group))
            state.current.sub_activity[sub_id] = now

    def start_negentropy(self, state: RelayState, token: str, flt: Filter, held, also,
                         asks: Filter | None = None) -> None:
        batch_id = state.current.sub_to_batch[token]
        started: list = []
        limit = negentropy_sync.frame_size_limit(filter_plan.req_length_limit(state.current.limits))
        asks = state.current.book.precise(flt if asks is None else asks)  # (as its REQs: ``protocol.precise``)
        handle = self.effects.spawn_on(
            state.current.link, negentropy_sync.reconcile_filter, self.own_relay, flt, self.plan.have_beyond_holdings(asks),
            self.post, batch_id=batch_id, token=token, held=held, read_also=also,
            frame_size_limit=limit, busy=self.delivery.answering_slowly, started=started, asks=asks,
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
                self.effects.send(state.current.link, wire.neg_close(token))
                log.warning("negentropy_overdue", relay=state.url, token=token, batch_id=run.batch_id)
                self.on_negentropy_finished(NegentropyFinished(
                    state.url, state.session, run.batch_id, token, run.filter,
                    negentropy_sync.NegentropyOutcome(False, reason="timeout: past the manager's deadline")))

    # -- answers --------------------------------------------------------------------------------

    def on_own_reads_landed(self, msg: OwnReadsLanded) -> None:
        """A merged read of the own relay landed (``own_reads``): each batch it answers
        chooses its methods (those that awaited its values ask again), then each relay pumps
        once: its first start carries every batch the read answered, not the first alone."""
        self.landing = {}
        try:
            self.own_reads.land(msg, answer=self.on_own_holdings_read, ask_again=self.ask_own_holdings)
        finally:
            landed, self.landing = self.landing, None
        for state in landed.values():
            self.pump(state)

    def ask_own_holdings(self, state: RelayState, batch: PendingBatch, token: str, filters: list) -> None:
        self.plan.ask_own_holdings(state, batch, token, filters, self.clock())
        self.execute()

    def on_own_holdings_read(self, msg: OwnHoldingsRead) -> None:
        """A batch's methods are chosen (``HistoricPlanner.holdings_read``); the relay pumps
        then (once a merged read's answers are all out), unless another of its batches awaits
        its holdings: that answer pumps, and the next start carries both."""
        state = self.relays.in_session(msg.relay, msg.session)
        batch = state and state.current.pending.get(msg.batch_id)
        if batch is None or msg.token not in batch.outstanding_subs:
            return
        still_its_own = self.plan.holdings_read(state, batch, msg, self.clock())
        self.execute()
        if self.landing is not None:
            self.landing[state.url] = state
        self.advance(state, batch if still_its_own else None,
                     pump=self.landing is None and not self.plan.reading_own(state))

    def on_eose(self, state: RelayState, sub_id: str, past_until: tuple[int, ...] = ()) -> None:
        self.request_served(state)
        state.current.sub_activity.pop(sub_id, None)
        batch = state.current.pending.get(state.current.sub_to_batch.get(sub_id, -1))
        if batch is None:
            return  # live subscriptions get an immediate EOSE: nothing more to do
        sent_at = state.current.historic_sent_at.pop(sub_id, None)
        elapsed = None if sent_at is None else self.clock() - sent_at
        if sent_at is not None:
            log.debug("historic_page_done", relay=state.url, sub_id=sub_id, batch_id=batch.batch_id,
                      events=batch.pagination[sub_id].total if sub_id in batch.pagination else 0,
                      secs=round(elapsed, 3))
        slow = slow_answer(elapsed)
        one_filter = self.check_answer(state, batch, batch.pagination.get(sub_id), slow)
        self.plan.on_eose(state, batch, sub_id, elapsed, self.clock(), past_until)
        self.execute()
        self.advance(state, batch)
        if one_filter and state.current.link is not None:
            self.one_filter_found(state)

    def on_negentropy_finished(self, msg: NegentropyFinished) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None:
            return
        run = state.current.neg_running.pop(msg.token, None)
        if run is None:
            return  # answered already (the manager's deadline, or its greenlet's death)
        batch = batch_end.exchange_finished(self.plan, state, msg, run.epoch, self.clock())
        self.exchange_ended(state, msg.filter, msg.result)
        self.execute()
        self.advance(state, batch)
        if msg.result.held_both:
            self.held_on_both(state, msg.result.held_both)

    # -- recovery and refetches --------------------------------------------------------

    def run_recovery(self, now: float) -> None:
        for url in self.recovery.due_relays(now):
            state = self.relays.get(url)
            ids = self.recovery.next_attempt(url, now, connected=bool(state and state.connected))
            if ids is None:
                continue
            filters = self.recovery.attempt_filters(url)
            log.info("recovery_attempt", relay=url, ids=len(ids), filters=len(filters))
            if ids:
                most = filter_plan.values_cap(state.current.limits) if state is not None else None
                filters = [*start_queue.id_filters(ids, most or len(ids)), *filters]
            batch = self.start(state, PendingItems(), filters, kind=BatchKind.RECOVERY)
            batch.expect_ids(self.recovery.awaited(url))

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
        """Fetch ``ids`` by id from ``state``'s relay: refused events released once what they
        waited for arrived, with no filter behind them, so an id page the relay cuts loses
        the rest until the next daily sync (relay0 of seed 10 of the stress mix serves 100 a
        filter and was asked 222 in one). No more ids to a filter than the connection has
        seen the relay serve one (``start_queue.ids_per_filter``), the filters of one batch,
        as many to a REQ as the relay takes (``filter_plan.filters_per_req``)."""
        per = start_queue.ids_per_filter(state.current.page_cap, alone=True,
                                         most=filter_plan.values_cap(state.current.limits))
        step = per * filter_plan.filters_per_req(state.current.limits)
        ids = list(ids)
        for i in range(0, len(ids), step):
            self.start(state, PendingItems(), start_queue.id_filters(ids[i:i + step], per))
