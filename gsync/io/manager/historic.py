"""Historic sync: PendingBatches, NIP-77 first then REQ+EOSE with pagination, the pacing
gate, residuals after NIP-77, missing-event recovery, and the Syncing → Connected check.
"""
from __future__ import annotations

import gevent

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol import messages as wire
from ...protocol.filters import Filter
from ...sync import filter_plan
from ...sync.pending import PendingBatch, ResidualDecision, SyncMethod, fetch_by_filter
from ...sync.relay_state import ConnectionStatus, RelayState
from ...sync.targets import PendingItems
from .. import negentropy_sync
from ..events import (
    CompletionRecheck,
    HistoricSlotDue,
    NegentropyFinished,
)

log = get_logger("gsync.manager")

MAX_HISTORIC_SUBS = 4  # concurrent historic REQs per relay, within the transient budget


def _is_capacity_refusal(text: str) -> bool:
    """"active subscriptions exceed max size": too much open at once, not too fast."""
    lowered = text.lower()
    return "exceed" in lowered and ("size" in lowered or "max" in lowered)


class HistoricSync:
    """Mixin of ``SyncManager``: its state lives on the manager (``core.SyncManager``)."""

    def start_historic(self, state: RelayState, items: PendingItems, filters, layer1=False,
                       recovery=False, coalesce=False) -> PendingBatch:
        """A PendingBatch for ``filters``: NIP-77 per filter where the relay allows it (full
        history only: a ``since`` catch-up is cheaper as a REQ), else grouped REQ+EOSE.

        ``coalesce`` (AddFilters): when an earlier AddFilters batch on this relay has not
        started any REQ yet (the pacing gate holds it), this one joins it instead, and their
        filters are packed together: fewer, fuller REQs for the same paced starts. Its items
        then confirm with that batch, as if both had come in one AddFilters."""
        if coalesce and not self.use_negentropy(state, filters):
            waiting = next((b for b in reversed(state.pending.values())
                            if b.coalescable and not b.started), None)
            if waiting is not None:
                self.coalesce_into(state, waiting, items, filters)
                return waiting
        batch = PendingBatch(next(self._ids), items)
        batch.layer1 = layer1
        batch.recovery = recovery
        batch.semantic_filters = list(filters)
        state.pending[batch.batch_id] = batch
        if self.use_negentropy(state, filters):
            batch.method = SyncMethod.NEGENTROPY
            for flt in filters:
                token = f"neg{batch.batch_id}-{next(self._ids)}"
                batch.add_subscription(token)
                state.sub_to_batch[token] = batch.batch_id
                state.historic_queue.append((token, [flt]))
        else:
            batch.coalescable = coalesce  # NIP-77 batches never take in REQ work
            self.queue_reqs(state, batch, filters)
        self.pump_historic(state)
        if batch.is_complete:
            self.finish_batch(state, batch)
        return batch

    def coalesce_into(self, state: RelayState, batch: PendingBatch, items: PendingItems, filters) -> None:
        """Add an AddFilters to a batch none of whose REQs started, and pack them anew."""
        batch.items.add(items)
        batch.semantic_filters += filters
        queued = set(batch.outstanding_subs)
        state.historic_queue = [e for e in state.historic_queue if e[0] not in queued]
        for sub_id in queued:
            batch.finish_subscription(sub_id)
            state.sub_to_batch.pop(sub_id, None)
        self.queue_reqs(state, batch, batch.semantic_filters)
        log.debug("batch_coalesced", relay=state.url, batch_id=batch.batch_id,
                  filters=len(batch.semantic_filters))

    def use_negentropy(self, state: RelayState, filters) -> bool:
        return (
            self.config.sync.negentropy
            and state.negentropy_ok
            and self.health.negentropy_allowed(state.url)
            and all(f.since is None and f.ids is None for f in filters)
        )

    def queue_reqs(self, state: RelayState, batch: PendingBatch, filters, front=False) -> None:
        groups = filter_plan.pack_into_reqs(filters, state.limits, key=filter_plan.paging_key)
        entries = []
        for group in groups:
            sub_id = f"h{batch.batch_id}-{next(self._ids)}"
            batch.add_subscription(sub_id, group)
            state.sub_to_batch[sub_id] = batch.batch_id
            entries.append((sub_id, group))
        if front:
            state.historic_queue[0:0] = entries
        else:
            state.historic_queue.extend(entries)

    def pump_historic(self, state: RelayState) -> None:
        """Start queued historic REQs while the relay's budget and pacing allow.

        Every historic, pagination, id-fetch and retry start is a background start: the
        health tracker's gates space them (1 s per connection, longer after a rate-limit
        refusal, none during a cooldown). Nothing starts while the own relay is down: what
        would be fetched could not be delivered (the catch-up after the outage covers it);
        nor while delivery is more than a quarter of its backlog limit behind.
        """
        if not state.connected or self.own_down_since is not None:
            return
        if self.delivery.backlog >= self.backlog_high_water:
            self.historic_held = True  # the tick pumps again once delivery caught up
            return
        budget = filter_plan.SubscriptionBudget.from_limits(state.limits)
        room = budget.max_subscriptions - len(state.live_subs) - 1
        limit = max(1, min(MAX_HISTORIC_SUBS, room))
        open_historic = len(state.neg_running) + sum(
            1 for s in state.sub_to_batch if s in state.conn.subscriptions
        )
        while state.historic_queue and open_historic < limit:
            now = self.clock()
            wait = self.health.may_start_background(state.url, now)
            if wait > 0:
                if not state.slot_wakeup_scheduled:
                    state.slot_wakeup_scheduled = True
                    gevent.spawn_later(wait, self.post, HistoricSlotDue(state.url, state.session))
                return
            sub_id, group = state.historic_queue[0]
            if sub_id not in state.sub_to_batch:
                state.historic_queue.pop(0)
                continue
            size = len(wire.req(sub_id, group))
            if open_historic and state.conn.open_filter_bytes + size > constants.MAX_OPEN_FILTER_BYTES:
                return  # wait for a historic REQ to finish and free room
            state.historic_queue.pop(0)
            batch = state.pending.get(state.sub_to_batch[sub_id])
            if batch is not None:
                batch.started = True  # from now on it takes in no other AddFilters
            self.health.record_start(state.url, now, background=True)
            if sub_id.startswith("neg"):
                self.start_negentropy(state, sub_id, group[0])
            else:
                state.conn.subscribe(sub_id, group)
            open_historic += 1

    def start_negentropy(self, state: RelayState, token: str, flt: Filter) -> None:
        state.neg_running.add(token)
        extra = self.have_beyond_holdings(flt)
        gevent.spawn(
            negentropy_sync.reconcile_filter,
            state.conn, self.config.service.own_relay, flt, extra, self.post,
            batch_id=state.sub_to_batch[token], token=token,
        )

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
        state = self._current(msg.relay, msg.session)
        if state is not None:
            state.slot_wakeup_scheduled = False
            self.pump_historic(state)

    def on_eose(self, state: RelayState, sub_id: str) -> None:
        batch_id = state.sub_to_batch.get(sub_id)
        if batch_id is None:
            return  # live subscriptions get an immediate EOSE: nothing to do
        batch = state.pending.get(batch_id)
        if batch is None:
            return
        pages = batch.on_eose(
            sub_id,
            per_req=filter_plan.filters_per_req(state.limits),
            pack=lambda filters: filter_plan.pack_into_reqs(filters, state.limits),
            new_sub_id=lambda: f"h{batch_id}-{next(self._ids)}",
            cap=state.page_cap,
        )
        state.conn.unsubscribe(sub_id)
        state.sub_to_batch.pop(sub_id, None)
        for new_id, _ in pages:
            state.sub_to_batch[new_id] = batch_id
        state.historic_queue[0:0] = pages  # next pages first: they finish what was started
        self.pump_historic(state)
        if batch.is_complete:
            self.finish_batch(state, batch)

    def on_closed(self, state: RelayState, closed: wire.Closed) -> None:
        sub_id = closed.sub_id
        if sub_id not in state.sub_to_batch and sub_id not in state.live_subs:
            return  # already finished (some relays close an ids-only REQ after its EOSE)
        state.conn.forget(sub_id)
        log.warning("subscription_closed", relay=state.url, sub_id=sub_id,
                    reason=f"{closed.prefix.value}: {closed.text}"[:200])
        capacity = _is_capacity_refusal(closed.text)
        rate_limited = not capacity and (
            closed.prefix is wire.Prefix.RATE_LIMITED or wire.is_rate_limit_text(closed.text)
        )
        if capacity:
            metrics.REFUSALS.labels("capacity").inc()
        elif rate_limited:
            self.note_rate_limited(state, closed.text)
            metrics.REFUSALS.labels("rate_limited").inc()
        else:
            metrics.REFUSALS.labels(closed.prefix.value).inc()
        batch_id = state.sub_to_batch.pop(sub_id, None)
        if batch_id is not None and batch_id in state.pending:
            batch = state.pending[batch_id]
            filters = batch.filters_of(sub_id)
            if (rate_limited or capacity) and filters:
                # The same page again once the cooldown and the reactive gate allow it.
                new_id = f"h{batch_id}-{next(self._ids)}"
                batch.rename_subscription(sub_id, new_id)
                batch.restart_page(new_id)
                state.sub_to_batch[new_id] = batch_id
                state.historic_queue.insert(0, (new_id, filters))
                self.pump_historic(state)
                return
            batch.on_closed(sub_id)
            state.unrelated_failure = True
            if batch.is_complete:
                self.finish_batch(state, batch)
            return
        live = state.live_subs.pop(sub_id, None)
        if live is not None and capacity:
            self.poll_instead(state, live.filters)
        elif live is not None and rate_limited:
            gevent.spawn_later(constants.RATE_LIMIT_COOLDOWN_SECS, self._resubscribe_live,
                               state, state.session, sub_id, live)

    def note_rate_limited(self, state: RelayState, text: str) -> None:
        now = self.clock()
        if not self.health.is_rate_limited(state.url, now):
            log.warning("relay_rate_limited", relay=state.url, text=text[:200],
                        cooldown_secs=constants.RATE_LIMIT_COOLDOWN_SECS)
        self.health.record_rate_limited(state.url, now)

    def finish_batch(self, state: RelayState, batch: PendingBatch) -> None:
        """All subscriptions answered. After NIP-77, judge what the id fetches delivered
        (SPEC §4 residuals) before the items are confirmed."""
        if batch.recovery:
            self.finish_recovery(state, batch)
            return
        if batch.advertised_ids and batch.method is SyncMethod.NEGENTROPY:
            decision = batch.residual_decision()
            if decision is ResidualDecision.RETRY_RESIDUAL:
                self.queue_id_fetches(state, batch, batch.begin_residual_retry())
                self.pump_historic(state)
                return
            if decision is ResidualDecision.SEMANTIC_FALLBACK:
                log.warning("negentropy_ids_not_served", relay=state.url, batch_id=batch.batch_id,
                            advertised=len(batch.advertised_ids), delivered=len(batch.received_ids))
                batch.switch_to_req_eose()
                self.queue_reqs(state, batch, batch.semantic_filters)
                self.pump_historic(state)
                return
            if decision is ResidualDecision.FAIL:
                missing = self.not_seen(batch.residual_ids())
                if missing:
                    batch.mark_failed()
                    self.recovery.add_missing(state.url, missing, self.clock())
                    log.warning("batch_incomplete", relay=state.url, batch_id=batch.batch_id,
                                missing=len(missing))
        self.confirm_batch(state, batch)

    def queue_id_fetches(self, state: RelayState, batch: PendingBatch, ids) -> None:
        ids = sorted(ids)
        filters = [Filter.make(ids=ids[i:i + constants.MAX_IDS_PER_REQ])
                   for i in range(0, len(ids), constants.MAX_IDS_PER_REQ)]
        for flt in filters:  # one filter per REQ: relays cap results per filter and per REQ
            self.queue_reqs(state, batch, [flt])

    def release_claims(self, state: RelayState, batch: PendingBatch) -> None:
        """The batch is done with: what it claimed and did not get goes, for recovery, to
        the relays that skipped it (never lost because one relay failed)."""
        now = self.clock()
        for relay, ids in self.claims.release(state.url, batch.batch_id).items():
            self.recovery.add_missing(relay, ids, now)

    def drop_pending(self, state: RelayState) -> None:
        """Every batch of the relay is abandoned (disconnect, fresh start, reconnect)."""
        for batch in state.pending.values():
            self.release_claims(state, batch)
        state.clear_pending()

    def confirm_batch(self, state: RelayState, batch: PendingBatch) -> None:
        self.release_claims(state, batch)
        state.pending.pop(batch.batch_id, None)
        if batch.batch_id == state.poll_batch and not batch.failed:
            state.poll_cursor = batch.poll_started_at
        state.confirmed.add(batch.items)
        if getattr(batch, "layer1", False):
            state.announcements_synced = True
        if batch.failed:
            state.batch_failures = True
        log.debug("batch_confirmed", relay=state.url, batch_id=batch.batch_id, failed=batch.failed,
                  method=batch.method.value)
        self.check_historic_complete(state)

    def check_historic_complete(self, state: RelayState) -> None:
        """Double check (seed 001): no pending batch now, and still none 6 s later."""
        if state.pending or state.completion_check_scheduled or state.status != ConnectionStatus.SYNCING:
            return
        state.completion_check_scheduled = True
        delay = self.config.sync.batch_window_ms / 1000 + 1
        gevent.spawn_later(delay, self.post, CompletionRecheck(state.url, state.session))

    def on_completion_recheck(self, msg: CompletionRecheck) -> None:
        state = self._current(msg.relay, msg.session)
        if state is None:
            return
        state.completion_check_scheduled = False
        if state.pending or state.status != ConnectionStatus.SYNCING:
            return
        state.status = (
            ConnectionStatus.CONNECTED_HISTORIC_SYNC_FAILURES
            if state.batch_failures
            else ConnectionStatus.CONNECTED
        )
        state.historic_sync_completed_at = self.clock()
        log.info("historic_sync_complete", relay=state.url, status=state.status.name)

    def on_negentropy_finished(self, msg: NegentropyFinished) -> None:
        state = self._current(msg.relay, msg.session)
        if state is None:
            return
        state.neg_running.discard(msg.token)
        batch = state.pending.get(msg.batch_id)
        state.sub_to_batch.pop(msg.token, None)
        result = msg.result
        if batch is None:
            self.pump_historic(state)
            return
        batch.finish_subscription(msg.token)
        if result.ok:
            metrics.NEGENTROPY_BYTES.labels(state.url, "up").inc(result.bytes_up)
            metrics.NEGENTROPY_BYTES.labels(state.url, "down").inc(result.bytes_down)
            metrics.NEGENTROPY_ROUNDS.labels(state.url).inc(result.rounds)
            # Several filters match the same events (a comment tags its root with both E
            # and e; repositories list several relays): each id is fetched once, by the
            # first batch that claims it; the others wait for it (``FetchClaims``).
            need = self.claims.claim(state.url, batch.batch_id,
                                     (i for i in result.need_ids if i not in self.seen))
            log.debug("negentropy_done", relay=state.url, batch_id=batch.batch_id, need=len(need),
                      advertised=len(result.need_ids), have=len(result.have_ids),
                      rounds=result.rounds, held=result.held)
            if fetch_by_filter(len(need), result.held):
                log.debug("negentropy_fetch_by_filter", relay=state.url, batch_id=batch.batch_id,
                          need=len(need), held=result.held)
                batch.fetch_by_filter.append(msg.filter)
            else:
                batch.expect_ids(need)
        else:
            if result.own_relay_failed:
                log.warning("negentropy_own_relay_unavailable", relay=state.url, reason=result.reason)
            else:
                self.disable_negentropy(state, result.reason)
            self.queue_reqs(state, batch, [msg.filter], front=True)
        if not any(sub.startswith("neg") for sub in batch.outstanding_subs):
            # The batch's last exchange: fetch everything it found at once, in as few REQs
            # as the caps allow (each REQ start is paced): mostly-missing filters by their
            # pages, sharing REQs, the rest by id, 300 a REQ.
            if batch.fetch_by_filter:
                filters, batch.fetch_by_filter = batch.fetch_by_filter, []
                self.queue_reqs(state, batch, filters)
            if batch.advertised_ids:
                self.queue_id_fetches(state, batch, self.not_seen(batch.advertised_ids))
        self.pump_historic(state)
        if batch.is_complete:
            self.finish_batch(state, batch)

    def disable_negentropy(self, state: RelayState, reason: str) -> None:
        """NIP-77 is not usable on this relay for this session: REQ+EOSE from now on."""
        if state.negentropy_ok:
            log.warning("negentropy_unsupported", relay=state.url, reason=reason[:200])
        state.negentropy_ok = False
        self.health.disable_negentropy(state.url)
        # Exchanges still queued become REQs.
        queued = [(t, g) for t, g in state.historic_queue if t.startswith("neg")]
        state.historic_queue = [e for e in state.historic_queue if not e[0].startswith("neg")]
        for token, group in queued:
            batch = state.pending.get(state.sub_to_batch.pop(token, -1))
            if batch is not None:
                batch.finish_subscription(token)
                self.queue_reqs(state, batch, group)

    def run_recovery(self, now: float) -> None:
        for url in self.recovery.due_relays(now):
            state = self.relays.get(url)
            ids = self.recovery.next_attempt(url, now, connected=bool(state and state.connected))
            if not ids:
                continue
            log.info("recovery_attempt", relay=url, ids=len(ids))
            batch = self.start_historic(state, PendingItems(), [Filter.make(ids=ids)], recovery=True)
            batch.expect_ids(ids)

    def finish_recovery(self, state: RelayState, batch: PendingBatch) -> None:
        self.release_claims(state, batch)
        state.pending.pop(batch.batch_id, None)
        dropped = self.recovery.record_result(state.url, batch.received_ids, self.clock())
        if dropped:
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
            state.status = ConnectionStatus.CONNECTED
            state.batch_failures = False
            log.info("relay_recovered", relay=url)

