"""The manager: the one greenlet that owns every sync index.

It takes a message off its queue and hands it to the handler for that message's type (a
table, below). Handlers are short and call the pure modules for every decision: which repos
and relays (``sync.repos``), what each relay still owes (``sync.targets``), which filters
(``sync.filter_plan``), what an EOSE means (``sync.pending``). Sends go through the relay's
connection object, which queues them for its writer greenlet: the manager never blocks.
"""
from __future__ import annotations

import itertools
import os
import random
import time

import gevent
from gevent.queue import Empty, Queue

from .. import constants
from ..ops import metrics
from ..ops.logging import get_logger
from ..protocol import messages as wire
from ..protocol.filters import Filter
from ..sync import filter_plan
from ..sync.health import RelayHealthTracker
from ..sync.pending import PendingBatch, ResidualDecision, SyncMethod
from ..sync.recovery import MissingEventRecovery
from ..sync.rejected import RejectedIndex
from ..sync.relay_state import ConnectionStatus, LiveSub, RelayState
from ..sync.repos import RepoSyncIndex, SyncLevel, should_forward_layer1
from ..sync.targets import PendingItems, compute_actions, derive_relay_targets
from . import negentropy_sync
from .connection import RelayConnection
from .delivery import OwnRelayDelivery
from .events import (
    BatchWindowClosed,
    CompletionRecheck,
    DeliveryAnswered,
    HandshakeDone,
    HandshakeStarted,
    HistoricSlotDue,
    NegentropyFinished,
    OwnEvent,
    OwnRelayState,
    OwnSubscribed,
    RelayDisconnected,
    RemoteEvent,
    RemoteMessage,
    Stop,
    Tick,
)
from .handshake import HandshakePool
from .self_subscriber import SelfSubscriber

log = get_logger("gsync.manager")

LAYER1_LIVE_SUB = "l1-live"
SEEN_CAPACITY = 500_000  # ids already handed to delivery: dedupe across relays
MAX_HISTORIC_SUBS = 4
REJECTED_SAVE_SECS = 60.0  # the cold tier is written at most this often (and at stop)  # concurrent historic REQs per relay, within the transient budget


def _is_capacity_refusal(text: str) -> bool:
    """"active subscriptions exceed max size": too much open at once, not too fast."""
    lowered = text.lower()
    return "exceed" in lowered and ("size" in lowered or "max" in lowered)


class SyncManager:
    def __init__(self, config, *, clock=time.time, delivery=None, on_ready=None):
        self.config = config
        self.clock = clock
        self.queue: Queue = Queue()
        self.post = self.queue.put
        svc, sync, net = config.service, config.sync, config.network
        self.domains = list(svc.domains)
        self.repos = RepoSyncIndex(svc.own_relay, self.domains)
        self.relays: dict[str, RelayState] = {}
        self.health = RelayHealthTracker(
            base_backoff=sync.base_backoff_secs, max_backoff=sync.max_backoff_secs,
            proactive_gap=sync.background_start_interval_ms / 1000,
        )
        self.rejected = self._load_rejected()
        self.rejected_saved_at = 0.0
        self.recovery = MissingEventRecovery(base_delay=sync.recovery_base_secs)
        self.delivery = delivery or OwnRelayDelivery(
            svc.own_relay, self.post, auth_secret=config.auth.secret_key
        )
        self.self_sub = SelfSubscriber(svc.own_relay, self.post, log, clock=clock)
        self.handshakes = HandshakePool(
            self.post, net.allow_private_addresses, workers=sync.handshake_workers
        )
        self.own_batch: list = []
        self.own_window_open = False
        self.own_down_since: float | None = None
        self.ready = False
        self.on_ready = on_ready
        self.seen: dict[str, None] = {}
        self._ids = itertools.count(1)
        self._stopping = False
        self.last_loop_at = time.monotonic()
        self.handlers = {
            HandshakeStarted: self.on_handshake_started,
            HandshakeDone: self.on_handshake_done,
            RemoteEvent: self.on_remote_event,
            RemoteMessage: self.on_remote_message,
            RelayDisconnected: self.on_relay_disconnected,
            NegentropyFinished: self.on_negentropy_finished,
            OwnEvent: self.on_own_event,
            OwnSubscribed: self.on_own_subscribed,
            OwnRelayState: self.on_own_relay_state,
            DeliveryAnswered: self.on_delivery_answered,
            BatchWindowClosed: self.on_batch_window_closed,
            CompletionRecheck: self.on_completion_recheck,
            HistoricSlotDue: self.on_historic_slot_due,
            Tick: self.on_tick,
        }
        for url in sync.bootstrap_relays:
            self.relay(url).is_bootstrap = True

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        self.delivery.start()
        self.handshakes.start()
        self.self_sub.start()
        self._ticker = gevent.spawn(self._tick_loop)

    def run(self) -> None:
        """Apply messages until ``Stop``. One at a time: no locks around any index."""
        while True:
            self.last_loop_at = time.monotonic()
            try:
                msg = self.queue.get(timeout=1.0)
            except Empty:
                continue
            if isinstance(msg, Stop):
                return
            handler = self.handlers.get(type(msg))
            try:
                handler(msg)
            except Exception:
                log.exception("handler_failed", message=type(msg).__name__)

    def _tick_loop(self) -> None:
        while True:
            gevent.sleep(constants.MAINTENANCE_TICK_SECS)
            self.post(Tick(self.clock()))

    def stop(self) -> None:
        self._stopping = True
        self._ticker.kill(block=False)
        self.self_sub.stop()
        self.handshakes.stop()
        for state in self.relays.values():
            if state.conn is not None:
                state.conn.close("shutting down")
        self._save_rejected()

    # -- relays -------------------------------------------------------------------------

    def relay(self, url: str) -> RelayState:
        state = self.relays.get(url)
        if state is None:
            if len(self.relays) >= self.config.network.max_relays:
                log.warning("relay_cap_reached", relay=url, max_relays=self.config.network.max_relays)
                return RelayState(url, refused_reason="relay cap")
            state = self.relays[url] = RelayState(url)
            state.received_metric = metrics.EVENTS_RECEIVED.labels(url)
            log.info("relay_registered", relay=url)
        return state

    def wanted(self, state: RelayState, targets) -> bool:
        return state.is_bootstrap or state.url in targets or bool(state.confirmed)

    def connect_due_relays(self, now: float) -> None:
        targets = derive_relay_targets(self.repos)
        for url in list(targets):
            self.relay(url)
        for state in list(self.relays.values()):
            if state.refused_reason or state.status != ConnectionStatus.DISCONNECTED:
                continue
            if not self.wanted(state, targets):
                continue
            if self.health.should_attempt_connection(state.url, now):
                state.attempt += 1
                state.status = ConnectionStatus.CONNECTING
                self.handshakes.request(state.url, state.attempt)

    def retire_unwanted_relays(self) -> None:
        targets = derive_relay_targets(self.repos)
        for state in list(self.relays.values()):
            if state.connected and not self.wanted(state, targets) and not state.pending:
                log.info("relay_retired", relay=state.url)
                state.conn.close("no work left")
                state.conn = None
                state.status = ConnectionStatus.DISCONNECTED
                del self.relays[state.url]
                self.health.forget(state.url)
                metrics.forget_relay(state.url)

    def on_handshake_started(self, msg: HandshakeStarted) -> None:
        self.health.record_attempt_started(msg.relay, self.clock())

    def on_handshake_done(self, msg: HandshakeDone) -> None:
        state = self.relays.get(msg.relay)
        now = self.clock()
        if state is None or msg.attempt != state.attempt or self._stopping:
            if msg.ws is not None:
                msg.ws.close()
            return
        if msg.ws is not None and not getattr(msg.ws, "connected", False):
            msg.error = "socket closed before the manager applied the handshake"
        if msg.error:
            metrics.CONNECTION_ATTEMPTS.labels(msg.relay, "failure").inc()
            state.status = ConnectionStatus.DISCONNECTED
            state.last_error = msg.error
            if msg.refused:
                state.refused_reason = msg.error
                log.warning("relay_refused", relay=msg.relay, reason=msg.error)
            else:
                self.health.record_failure(msg.relay, now)
                log.info("relay_connect_failed", relay=msg.relay, reason=msg.error)
            return
        metrics.CONNECTION_ATTEMPTS.labels(msg.relay, "success").inc()
        self.health.record_success(msg.relay, now)
        state.session += 1
        state.limits = msg.limits
        state.conn = RelayConnection(
            msg.relay, msg.ws, state.session, self.post, auth_secret=self.config.auth.secret_key,
            known_ids=self.seen,
        )
        state.conn.start()
        state.status = ConnectionStatus.SYNCING
        fresh = state.should_fresh_start(now)
        log.info("relay_connected", relay=msg.relay, fresh_start=fresh)
        if fresh:
            self.fresh_start(state, now)
        else:
            self.quick_reconnect(state, now)
        state.last_connected = now
        state.disconnected_at = None
        if state.next_daily_at is None:
            state.next_daily_at = now + random.uniform(constants.DAILY_MIN_SECS, constants.DAILY_MAX_SECS)

    def on_relay_disconnected(self, msg: RelayDisconnected) -> None:
        state = self.relays.get(msg.relay)
        if state is None or msg.session != state.session or state.conn is None:
            return
        now = self.clock()
        log.info("relay_disconnected", relay=msg.relay, reason=msg.reason)
        state.conn = None
        state.status = ConnectionStatus.DISCONNECTED
        state.disconnected_at = now
        state.last_connected = now
        state.last_error = msg.reason
        state.clear_pending()
        state.clear_live()
        self.health.record_disconnect(msg.relay, now)

    # -- sync entry points (seed 001, "Sync Entry Points") --------------------------------

    def fresh_start(self, state: RelayState, now: float) -> None:
        for sub_id in list(state.live_subs):  # the daily sync runs on a live connection
            state.conn.unsubscribe(sub_id)
        state.clear_live()
        state.clear_pending()
        state.clear_confirmed()
        state.historic_sync_completed_at = None
        self.subscribe_layer1(state, since=None)
        self.recompute(state, since=None)

    def quick_reconnect(self, state: RelayState, now: float) -> None:
        state.clear_pending()
        since = int(state.last_connected or now) - constants.RECONNECT_OVERLAP_SECS
        self.subscribe_layer1(state, since=since)
        if state.confirmed:
            # Confirmed items stay confirmed; their live filters come back and the gap is
            # fetched with since.
            self.start_sync(state, state.confirmed.copy(), since=since, confirm=False)
        self.recompute(state, since=None)

    def recompute(self, state: RelayState, since: int | None) -> None:
        """derive_relay_targets → compute_actions → start_sync, for one connected relay."""
        if not state.connected:
            return
        targets = derive_relay_targets(self.repos)
        pending = {state.url: [b.items for b in state.pending.values()]}
        confirmed = {state.url: state.confirmed}
        for action in compute_actions(targets, pending, confirmed, {state.url}):
            self.start_sync(state, action.items, since=since)

    def subscribe_layer1(self, state: RelayState, since: int | None) -> None:
        live = filter_plan.layer1_filter().replace(limit=0)
        state.live_subs[LAYER1_LIVE_SUB] = LiveSub((live,), control=True)
        state.conn.subscribe(LAYER1_LIVE_SUB, [live])
        self.start_historic(state, PendingItems(), [filter_plan.layer1_filter(since)], layer1=True)

    def start_sync(self, state: RelayState, items: PendingItems, since: int | None, confirm=True) -> None:
        """Live and historic subscriptions for new items (``handle_new_sync_filters``)."""
        filters = self.filters_for(state, items, since)
        if not filters:
            return
        self.subscribe_live(state, filter_plan.live(filters))
        self.start_historic(state, items if confirm else PendingItems(), filters)

    def filters_for(self, state: RelayState, items: PendingItems, since: int | None):
        budget = filter_plan.tag_value_budget(state.limits)
        return filter_plan.build_sync_level_aware_filters(
            items.repos, items.root_events, since=since, budget=budget
        )

    def subscribe_live(self, state: RelayState, live_filters) -> None:
        groups = filter_plan.pack_into_reqs(live_filters, state.limits)
        budget = filter_plan.SubscriptionBudget.from_limits(state.limits)
        active = sum(1 for sub in state.live_subs.values() if not sub.control)
        baseline = self.live_baseline(state)
        if budget.needs_consolidation(active, baseline, adding=len(groups)):
            self.consolidate(state)
            return
        self.open_live_groups(state, groups)

    def open_live_groups(self, state: RelayState, groups, slots: int | None = None) -> None:
        """Open live REQs while the relay's subscription and filter-size budgets allow;
        coverage that does not fit is polled on the maintenance cadence instead."""
        live_bytes = sum(state.conn.filter_bytes.get(s, 0) for s in state.live_subs)
        for group in groups:
            size = len(wire.req("live-00000000", group))
            if (slots is not None and slots <= 0) or live_bytes + size > constants.MAX_LIVE_FILTER_BYTES:
                self.poll_instead(state, group)
                continue
            sub_id = f"live-{next(self._ids)}"
            state.live_subs[sub_id] = LiveSub(tuple(group))
            state.conn.subscribe(sub_id, group)
            live_bytes += size
            if slots is not None:
                slots -= 1

    def poll_instead(self, state: RelayState, filters) -> None:
        if not state.polled:
            log.warning("live_coverage_polled", relay=state.url, reason="relay budget",
                        poll_secs=constants.POLL_SECS)
        state.polled.extend(f.replace(limit=None) for f in filters)
        if state.poll_cursor is None:
            state.poll_cursor = self.clock()

    def run_polls(self, now: float) -> None:
        """Live coverage that did not fit: one EOSE-closing batch per relay on the cadence,
        from the last successful poll with an overlap (SPEC §3, direct-member fallback)."""
        for state in self.relays.values():
            if not (state.connected and state.polled) or state.poll_batch in state.pending:
                continue
            if now - (state.poll_started_at or 0) < constants.POLL_SECS:
                continue
            since = int(state.poll_cursor or now) - constants.POLL_OVERLAP_SECS
            state.poll_started_at = now
            batch = self.start_historic(state, PendingItems(), [f.replace(since=since) for f in state.polled])
            batch.poll_started_at = now
            state.poll_batch = batch.batch_id

    def desired_live_items(self, state: RelayState) -> PendingItems:
        items = state.confirmed.copy()
        for batch in state.pending.values():
            items.add(batch.items)
        return items

    def live_baseline(self, state: RelayState) -> int:
        wanted = self.filters_for(state, self.desired_live_items(state), None)
        return filter_plan.live_baseline(wanted, state.limits)

    def consolidate(self, state: RelayState) -> None:
        """Replace fragmented live subscriptions with the fewest that cover everything.

        The design waits for pending batches first; here live coverage is rebuilt from
        confirmed *and* pending items at once, so nothing in flight loses its live stream.
        What does not fit the relay's budget is left to historic sync (logged).
        """
        for sub_id in [s for s, sub in state.live_subs.items() if not sub.control]:
            del state.live_subs[sub_id]
            state.conn.unsubscribe(sub_id)
        state.polled = []
        live = filter_plan.live(self.filters_for(state, self.desired_live_items(state), None))
        groups = filter_plan.pack_into_reqs(live, state.limits)
        budget = filter_plan.SubscriptionBudget.from_limits(state.limits)
        self.open_live_groups(state, groups, slots=budget.live_slots)
        log.info("consolidated", relay=state.url, live_subscriptions=len(state.live_subs) - 1,
                 polled_filters=len(state.polled))

    def start_historic(self, state: RelayState, items: PendingItems, filters, layer1=False,
                       recovery=False) -> PendingBatch:
        """A PendingBatch for ``filters``: NIP-77 per filter where the relay allows it (full
        history only: a ``since`` catch-up is cheaper as a REQ), else grouped REQ+EOSE."""
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
            self.queue_reqs(state, batch, filters)
        self.pump_historic(state)
        if batch.is_complete:
            self.finish_batch(state, batch)
        return batch

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
        would be fetched could not be delivered (the catch-up after the outage covers it).
        """
        if not state.connected or self.own_down_since is not None:
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
            self.health.record_start(state.url, now, background=True)
            if sub_id.startswith("neg"):
                self.start_negentropy(state, sub_id, group[0])
            else:
                state.conn.subscribe(sub_id, group)
            open_historic += 1

    def start_negentropy(self, state: RelayState, token: str, flt: Filter) -> None:
        state.neg_running.add(token)
        extra = self.rejected.items() + self.delivery.tracked_items
        gevent.spawn(
            negentropy_sync.reconcile_filter,
            state.conn, self.config.service.own_relay, flt, extra, self.post,
            batch_id=state.sub_to_batch[token], token=token,
        )

    def on_historic_slot_due(self, msg: HistoricSlotDue) -> None:
        state = self._current(msg.relay, msg.session)
        if state is not None:
            state.slot_wakeup_scheduled = False
            self.pump_historic(state)

    # -- remote traffic -----------------------------------------------------------------

    def _current(self, relay: str, session: int) -> RelayState | None:
        state = self.relays.get(relay)
        if state is None or state.session != session or state.conn is None:
            return None
        return state

    def on_remote_event(self, msg: RemoteEvent) -> None:
        state = self._current(msg.relay, msg.session)
        if state is None:
            return
        state.received_metric.inc()
        batch_id = state.sub_to_batch.get(msg.sub_id)
        if batch_id is not None and batch_id in state.pending:
            state.pending[batch_id].record_event(msg.sub_id, msg.event)
        if msg.verified:
            self.consider_for_delivery(msg.event, state)

    def consider_for_delivery(self, event, state: RelayState | None = None) -> None:
        if event.id in self.seen or event.id in self.rejected:
            return
        if event.kind in filter_plan.LAYER1_KINDS and not should_forward_layer1(
            event, self.repos, self.domains
        ):
            metrics.DROPS.labels("layer1_not_ours").inc()
            log.debug("event_dropped", reason="layer1_not_ours", event_id=event.id, kind=event.kind)
            # Remembered like a refusal, so NIP-77 does not fetch it again; a maintainer added
            # later re-delivers it (redeliver_unblocked).
            self.rejected.add(event, self.clock())
            return
        self.seen[event.id] = None
        for url in self.recovery.clear_arrived((event.id,)):
            self.promote_if_recovered(url)
        if len(self.seen) > SEEN_CAPACITY:
            for old in itertools.islice(list(self.seen), SEEN_CAPACITY // 10):
                del self.seen[old]
        self.delivery.submit(event)
        if state is not None:
            state.events_delivered += 1

    def on_remote_message(self, msg: RemoteMessage) -> None:
        state = self._current(msg.relay, msg.session)
        if state is None:
            return
        m = msg.message
        if isinstance(m, wire.Eose):
            self.on_eose(state, m.sub_id)
        elif isinstance(m, wire.Closed):
            self.on_closed(state, m)
        elif isinstance(m, wire.Notice):
            log.info("relay_notice", relay=state.url, text=m.text[:200])
            if wire.is_rate_limit_text(m.text):
                self.note_rate_limited(state, m.text)

    def on_eose(self, state: RelayState, sub_id: str) -> None:
        batch_id = state.sub_to_batch.get(sub_id)
        if batch_id is None:
            return  # live subscriptions get an immediate EOSE: nothing to do
        batch = state.pending.get(batch_id)
        if batch is None:
            return
        next_page = batch.on_eose(sub_id)
        state.conn.unsubscribe(sub_id)
        state.sub_to_batch.pop(sub_id, None)
        if next_page:
            new_id = f"h{batch_id}-{next(self._ids)}"
            batch.rename_subscription(sub_id, new_id)
            state.sub_to_batch[new_id] = batch_id
            state.historic_queue.insert(0, (new_id, next_page))
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

    def _resubscribe_live(self, state, session, sub_id, live) -> None:
        if state.session == session and state.connected:
            state.live_subs[sub_id] = live
            state.conn.subscribe(sub_id, live.filters)

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
                missing = batch.residual_ids() - self.seen.keys()
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

    def confirm_batch(self, state: RelayState, batch: PendingBatch) -> None:
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
            # Several filters of a batch match the same events (a comment tags its root with
            # both E and e): each id is fetched once, by the first batch that expects it.
            expected = set().union(*(b.advertised_ids for b in state.pending.values()))
            need = set(result.need_ids) - self.seen.keys() - expected
            log.debug("negentropy_done", relay=state.url, batch_id=batch.batch_id, need=len(need),
                      have=len(result.have_ids), rounds=result.rounds)
            batch.expect_ids(need)
        else:
            if result.own_relay_failed:
                log.warning("negentropy_own_relay_unavailable", relay=state.url, reason=result.reason)
            else:
                self.disable_negentropy(state, result.reason)
            self.queue_reqs(state, batch, [msg.filter], front=True)
        if batch.advertised_ids and not any(sub.startswith("neg") for sub in batch.outstanding_subs):
            # The batch's last exchange: fetch everything it found at once, in as few REQs
            # as the 300-id cap allows (each REQ start is paced).
            self.queue_id_fetches(state, batch, batch.advertised_ids - self.seen.keys())
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

    # -- missing-event recovery (SPEC §4) -----------------------------------------------

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

    # -- own relay ----------------------------------------------------------------------

    def on_own_event(self, msg: OwnEvent) -> None:
        self.own_batch.append(msg.event)
        self.seen.setdefault(msg.event.id, None)
        # The first history read is one batch, however long it takes: one AddFilters per
        # relay instead of a drip of them.
        if not self.own_window_open and self.ready:
            self.own_window_open = True
            gevent.spawn_later(self.config.sync.batch_window_ms / 1000, self.post, BatchWindowClosed(0))

    def on_batch_window_closed(self, msg: BatchWindowClosed) -> None:
        """A closed self-subscription window updates RepoSyncIndex and emits AddFilters."""
        events, self.own_batch, self.own_window_open = self.own_batch, [], False
        now = self.clock()
        dirty: set[str] = set()
        new_maintainers: set[str] = set()
        for event in sorted(events, key=lambda e: e.kind != 30617):  # announcements first
            if event.kind == 30617:
                before = self.repos.maintainers_of(event.d_tag)
                dirty |= self.repos.apply_announcement(event, SyncLevel.FULL, now)
                new_maintainers |= self.repos.maintainers_of(event.d_tag) - before
            else:
                dirty |= self.repos.apply_root_event(event)
        self.redeliver_unblocked(new_maintainers)
        log.info("self_batch_processed", events=len(events), repos=len(self.repos), dirty_relays=len(dirty))
        self.apply_dirty(dirty)

    def apply_dirty(self, dirty: set[str]) -> None:
        targets = derive_relay_targets(self.repos)
        for url in dirty:
            state = self.relay(url)
            if not state.connected:
                continue
            pending = {url: [b.items for b in state.pending.values()]}
            for action in compute_actions(targets, pending, {url: state.confirmed}, {url}):
                self.start_sync(state, action.items, since=None)
        self.connect_due_relays(self.clock())

    def redeliver_unblocked(self, maintainers: set[str]) -> None:
        if not maintainers:
            return
        hot, cold = self.rejected.take_by_author(maintainers)
        for event in hot:
            self.seen.pop(event.id, None)
            self.consider_for_delivery(event)
        if cold:
            for state in self.relays.values():
                if state.connected:
                    for start in range(0, len(cold), constants.MAX_IDS_PER_REQ):
                        ids = cold[start:start + constants.MAX_IDS_PER_REQ]
                        self.start_historic(state, PendingItems(), [Filter.make(ids=ids)])

    def on_own_subscribed(self, msg: OwnSubscribed) -> None:
        if not self.ready:
            self.ready = True
            self.on_batch_window_closed(BatchWindowClosed(self.clock()))
            log.info("ready", own_relay=self.config.service.own_relay)
            if self.on_ready:
                self.on_ready()

    def on_own_relay_state(self, msg: OwnRelayState) -> None:
        if not msg.up:
            self.own_down_since = msg.at
            log.warning("own_relay_down", since=msg.at)
            return
        since = self.own_down_since
        self.own_down_since = None
        log.info("own_relay_up", down_since=since)
        if since is None:
            return
        for state in self.relays.values():
            self.pump_historic(state)
        # Catch up everything that may have been held back or dropped while it was down.
        catch_up = int(since) - constants.RECONNECT_OVERLAP_SECS
        for state in self.relays.values():
            if state.connected:
                self.start_historic(state, PendingItems(), [filter_plan.layer1_filter(catch_up)])
                if state.confirmed:
                    self.start_sync(state, state.confirmed.copy(), since=catch_up, confirm=False)

    def on_delivery_answered(self, msg: DeliveryAnswered) -> None:
        now = self.clock()
        if msg.outcome == "rejected":
            self.rejected.add(msg.event, now)
            log.info("event_rejected", event_id=msg.event.id, kind=msg.event.kind, reason=msg.reason[:200])
        elif msg.outcome == "purgatory" and msg.event.kind == 30617:
            self.apply_dirty(self.repos.apply_announcement(msg.event, SyncLevel.STATE_ONLY, now))

    # -- maintenance --------------------------------------------------------------------

    def on_tick(self, msg: Tick) -> None:
        now = self.clock()
        self.apply_dirty(self.repos.expire_state_only(now))  # also retries due relays
        self.retire_unwanted_relays()
        for state in self.relays.values():
            if state.connected and state.next_daily_at and now >= state.next_daily_at:
                state.next_daily_at = now + random.uniform(constants.DAILY_MIN_SECS, constants.DAILY_MAX_SECS)
                log.info("daily_sync", relay=state.url)
                state.status = ConnectionStatus.SYNCING
                self.fresh_start(state, now)
        self.run_recovery(now)
        self.run_polls(now)
        self.rejected.expire(now)
        if self.rejected.dirty and now - self.rejected_saved_at >= REJECTED_SAVE_SECS:
            self._save_rejected()
        self.update_metrics(now)

    def update_metrics(self, now: float) -> None:
        connected = dead = 0
        for state in self.relays.values():
            metrics.RELAY_CONNECTED.labels(state.url).set(int(state.status))
            metrics.RELAY_STATUS.labels(state.url).set(self.health.status_metric(state.url, now))
            metrics.RELAY_FAILURES.labels(state.url).set(self.health.failures(state.url, now))
            metrics.SUBSCRIPTIONS.labels(state.url).set(len(state.conn.subscriptions) if state.conn else 0)
            connected += state.connected
            dead += self.health.is_dead(state.url, now)
        metrics.RELAYS_TRACKED.set(len(self.relays))
        metrics.RELAYS_CONNECTED.set(connected)
        metrics.RELAYS_DEAD.set(dead)
        metrics.QUEUE_DEPTH.labels("manager").set(self.queue.qsize())
        metrics.QUEUE_DEPTH.labels("delivery").set(self.delivery.backlog)

    # -- operators ------------------------------------------------------------------------

    def alive_recently(self, within: float) -> bool:
        return time.monotonic() - self.last_loop_at < within

    def set_bootstrap_relays(self, urls) -> None:
        for state in self.relays.values():
            state.is_bootstrap = False
        for url in urls:
            self.relay(url).is_bootstrap = True

    def summary(self) -> str:
        connected = sum(1 for s in self.relays.values() if s.connected)
        return (f"{connected}/{len(self.relays)} relays connected, {len(self.repos)} repos, "
                f"{self.delivery.backlog} deliveries in flight")

    def status_snapshot(self) -> dict:
        now = self.clock()
        return {
            "own_relay": self.config.service.own_relay,
            "own_relay_up": self.own_down_since is None,
            "ready": self.ready,
            "repos": len(self.repos),
            "delivery_backlog": self.delivery.backlog,
            "rejected": len(self.rejected),
            "relays": [
                {
                    "relay": s.url,
                    "status": s.status.name.lower(),
                    "health": self.health.state(s.url, now).name.lower(),
                    "subscriptions": len(s.conn.subscriptions) if s.conn else 0,
                    "pending_batches": len(s.pending),
                    "events_delivered": s.events_delivered,
                    "bootstrap": s.is_bootstrap,
                    "last_error": s.refused_reason or s.last_error,
                }
                for s in sorted(self.relays.values(), key=lambda s: s.url)
            ],
        }

    # -- rejected index persistence -------------------------------------------------------

    def _rejected_path(self) -> str:
        return os.path.join(self.config.service.state_dir, "rejected.json")

    def _load_rejected(self) -> RejectedIndex:
        try:
            with open(self._rejected_path()) as fh:
                return RejectedIndex.loads(fh.read(), self.clock())
        except OSError:
            return RejectedIndex()

    def _save_rejected(self) -> None:
        self.rejected_saved_at = self.clock()
        path = self._rejected_path()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".tmp", "w") as fh:
                fh.write(self.rejected.dumps())
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log.warning("state_save_failed", path=path, reason=str(exc))
