"""The manager: the one greenlet that owns every sync index.

It takes a message off its queue and hands it to the handler for that message's type (a
table, below), and fans its maintenance tick out. The handlers belong to the collaborators
it owns, one object per concern (``build_collaborators``), each given the shared state and
the other collaborators it uses; they call the pure modules for every decision: which repos
and relays (``sync.repos``), what each relay still owes (``sync.targets``), which filters
(``sync.filter_plan``), what an EOSE means (``sync.pending``). Sends go through the relay's
connection object, which queues them for its writer greenlet: the manager never blocks.
"""
from __future__ import annotations

import itertools
import time

from gevent.queue import Empty, Queue

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol import messages as wire
from ...sync.claims import FetchClaims
from ...sync.health import RelayHealthTracker
from ...sync.lead import SharedLead
from ...sync.own_held import OwnHeld
from ...sync.recovery import MissingEventRecovery
from ...sync.relay_state import RelayState, RelayTable
from ...sync.repos import RepoSyncIndex
from ...sync.shard import waits_on_other_shard
from .. import negentropy_sync
from ..delivery import OwnRelayDelivery
from ..handshake import HandshakePool
from ..inbox import (
    BatchWindowClosed,
    CompletionRecheck,
    CooldownEnded,
    DeliveryAnswered,
    DeliveryCaughtUp,
    HandshakeDone,
    HandshakeStarted,
    HistoricSlotDue,
    ImpreciseIgnored,
    NegentropyFinished,
    OwnEvents,
    OwnHeldConfirmed,
    OwnHoldingsRead,
    OwnLanded,
    OwnReadsDue,
    OwnReadsLanded,
    OwnRelayState,
    OwnSubscribed,
    OwnWitnessRead,
    ProbeRefused,
    ProbeWanted,
    RelayDisconnected,
    RemoteEvent,
    RemoteEvents,
    RemoteMessage,
    Stop,
    Tick,
)
from ..own_auth import AuthTags
from ..self_subscriber import SelfSubscriber
from .completion import HistoricCompletion
from .descendants import Descendants
from .effects import GeventEffects
from .historic import HistoricSync
from .lifecycle import RelayLifecycle
from .live import LiveCoverage
from .own_reads import OwnReads
from .own_relay import OwnRelaySide
from .progress import publish as publish_progress
from .progress import read_progress
from .refusals import Refusals
from .saved_state import SavedState

log = get_logger("gsync.manager")


class SyncManager:
    def __init__(self, config, *, clock=time.time, delivery=None, on_ready=None, effects=None):
        """``effects``: the manager's I/O (``effects.GeventEffects`` unless a test gives a
        recorder); ``clock``: wall time, for every decision that reads it."""
        self.config = config
        self.clock = clock
        self.queue: Queue = Queue()
        self.post = self.queue.put
        self.effects = effects or GeventEffects(self.post)
        self.domains = list(config.service.domains)
        self.repos = RepoSyncIndex(config.service.own_relay, self.domains)
        self.ids = itertools.count(1)  # batch, subscription, read and token ids: one counter, never reused
        self.remember_relays(config.sync, config.service.state_dir)
        self.face_own_relay(config, delivery)
        self.build_collaborators(config, on_ready)
        self.last_loop_at = self.effects.monotonic()
        self.queue_peak = 0  # the deepest the inbox has been (a 2 s gauge would miss bursts)
        self.delivery_peak = 0
        self.gauge_values: tuple | None = None  # the manager-wide gauges as last set (update_metrics)
        self.progress_published = None  # the progress they were last set from
        self.handlers = self.dispatch_table()
        for url in config.sync.bootstrap_relays:
            self.lifecycle.register_relay(url).is_bootstrap = True

    def remember_relays(self, sync, state_dir) -> None:
        """What the manager knows of the other relays: their states, health, what an
        earlier process saved, and the work shared between them (recovery, claims, leads)."""
        self.relays = RelayTable()
        self.health = RelayHealthTracker(
            base_backoff=sync.base_backoff_secs, max_backoff=sync.max_backoff_secs,
            proactive_gap=sync.background_start_interval_ms / 1000,
        )
        # state_dir: locked for this process (raises ops.store.StateRefused), then read
        self.saved = SavedState.open(state_dir, self.clock())
        self.rejected = self.saved.load(self.clock())
        self.recovery = MissingEventRecovery(base_delay=sync.recovery_base_secs)
        self.claims = FetchClaims()  # which batch fetches which missing event, across relays
        self.lead = SharedLead()  # batches waiting for another relay's first sync of their repos
        self.handshakes = HandshakePool(
            self.post, self.config.network.allow_private_addresses, workers=sync.handshake_workers
        )

    def face_own_relay(self, config, delivery) -> None:
        """The own relay's side: delivery to it, what it holds, what it shows back."""
        svc, sync = config.service, config.sync
        # what the own relay holds, read once per filter and session (NIP-77 have-sets)
        # (what its reads return tells the thread members: ``Descendants``, made below)
        self.own_held = OwnHeld(constants.OWN_HELD_TTL_SECS, constants.OWN_HELD_MAX_EVENTS,
                                on_learn=lambda entries: self.descendants.note_held(entries))
        # the URL our NIP-42 AUTH names the own relay by, shared by all that connect to it
        auth_tags = AuthTags(svc.own_relay, svc.domains)
        self.delivery = delivery or OwnRelayDelivery(
            svc.own_relay, self.post, auth_secret=config.auth.secret_key,
            max_backlog=sync.delivery_max_backlog, auth_tags=auth_tags,
        )
        self.seen: dict[str, float | None] = {}  # id -> when gsync fetched it (None: seen on the own relay)
        # with shards, it also shows what the other shards stored (``OwnLanded``)
        self.self_sub = SelfSubscriber(svc.own_relay, self.post, log, clock=self.clock, seen=self.seen,
                                       landed=config.cluster.shard.count > 1, held=self.own_held,
                                       auth_secret=config.auth.secret_key, auth_tags=auth_tags)
        # an own relay asking for AUTH to read: the holdings reads answer it too
        negentropy_sync.authenticate_reads(config.auth.secret_key, auth_tags)

    def build_collaborators(self, config, on_ready) -> None:
        """The concerns the manager owns, each given what it reads and writes. Two pairs
        call each other, and the later one of each is reached late: history pumps live
        coverage first, and live coverage starts historic batches (polls, a
        consolidation's gap); history tells the refusals side what the relays' answers
        said, and refusals send history again."""
        self.own_reads = OwnReads(own_held=self.own_held, relays=self.relays, effects=self.effects,
                                  post=self.post, own_relay=config.service.own_relay, ids=self.ids,
                                  clock=self.clock, busy=self.delivery.answering_slowly)
        self.live = LiveCoverage(
            relays=self.relays, health=self.health, effects=self.effects, clock=self.clock,
            start_historic=lambda *args, **kwargs: self.historic.start(*args, **kwargs),
            catch_up=lambda *args: self.historic.catch_up(*args))
        self.completion = HistoricCompletion(sync=config.sync, relays=self.relays, recovery=self.recovery,
                                             effects=self.effects, clock=self.clock,
                                             on_complete=lambda state: self.refusals.prove_values_if_due(state))
        self.historic = HistoricSync(
            sync=config.sync, own_relay=config.service.own_relay, relays=self.relays, repos=self.repos,
            health=self.health, live=self.live, lead=self.lead, claims=self.claims, recovery=self.recovery,
            own_held=self.own_held, own_reads=self.own_reads, seen=self.seen, rejected=self.rejected,
            delivery=self.delivery, own_relay_down=lambda: self.own_relay.down,
            request_served=lambda state: self.refusals.note_request_succeeded(state),
            rate_limited=lambda state, text: self.refusals.note_rate_limited(state, text),
            probe_answered=lambda state, key, batch: self.refusals.probe_answered(state, key, batch),
            completion=self.completion, effects=self.effects, post=self.post, clock=self.clock, ids=self.ids,
            members_of_roots=lambda state, roots: self.descendants.members_of_roots(state, roots),
            check_answer=lambda state, batch, answer, slow: self.refusals.check_answer(state, batch, answer, slow),
            one_filter_found=lambda state: self.refusals.one_filter_found(state),
            held_on_both=lambda state, ids: self.refusals.keep_held_ids(state, ids),
            exchange_ended=lambda state, flt, result: self.refusals.judge_exchange_reach(state, flt, result))
        self.refusals = Refusals(relays=self.relays, repos=self.repos, health=self.health, live=self.live,
                                 historic=self.historic, recovery=self.recovery, seen=self.seen,
                                 rejected=self.rejected,
                                 delivery=self.delivery, effects=self.effects, clock=self.clock,
                                 on_pause=self.saved.save_soon,
                                 on_imprecise_refused=lambda state: self.lifecycle.on_imprecise_refused(state),
                                 on_one_filter=lambda state: self.lifecycle.fresh_start(state, self.clock()))
        self.descendants = Descendants(self.relays, self.live, self.historic.start, self.repos)
        self.lifecycle = RelayLifecycle(
            config=config, relays=self.relays, repos=self.repos, saved=self.saved, health=self.health,
            handshakes=self.handshakes, live=self.live, historic=self.historic, refusals=self.refusals,
            recovery=self.recovery, lead=self.lead, seen=self.seen, delivery=self.delivery,
            effects=self.effects, clock=self.clock)
        self.own_relay = OwnRelaySide(
            own_relay=config.service.own_relay, batch_window_secs=config.sync.batch_window_ms / 1000,
            relays=self.relays, repos=self.repos, domains=self.domains, rejected=self.rejected,
            recovery=self.recovery, claims=self.claims, delivery=self.delivery, own_held=self.own_held,
            seen=self.seen, descendants=self.descendants, historic=self.historic, completion=self.completion,
            apply_dirty=self.lifecycle.apply_dirty, effects=self.effects, post=self.post, clock=self.clock,
            on_ready=lambda: self.became_ready(on_ready), on_loss=self.lifecycle.own_relay_lost,
            on_seen_cleared=self.live.restart_audits, shards=config.cluster.shard.count > 1)

    def dispatch_table(self) -> dict:
        """Inbox message type -> its handler: one per thing that can happen."""
        return {
            HandshakeStarted: self.lifecycle.on_handshake_started,
            HandshakeDone: self.lifecycle.on_handshake_done,
            RemoteEvents: self.on_remote_events,
            RemoteMessage: self.on_remote_message,
            RelayDisconnected: self.lifecycle.on_relay_disconnected,
            ImpreciseIgnored: self.lifecycle.on_imprecise_ignored,
            ProbeWanted: self.lifecycle.on_probe_wanted,
            ProbeRefused: self.lifecycle.on_probe_refused,
            NegentropyFinished: self.historic.on_negentropy_finished,
            OwnHoldingsRead: self.historic.on_own_holdings_read,
            OwnReadsDue: self.own_reads.on_due,
            OwnReadsLanded: self.historic.on_own_reads_landed,
            OwnEvents: self.own_relay.on_own_events,
            OwnHeldConfirmed: self.own_relay.on_own_held_confirmed,
            OwnLanded: self.own_relay.on_own_landed,
            OwnSubscribed: self.own_relay.on_own_subscribed,
            OwnRelayState: self.own_relay.on_own_relay_state,
            OwnWitnessRead: self.own_relay.on_own_witness_read,
            DeliveryAnswered: self.own_relay.on_delivery_answered,
            DeliveryCaughtUp: self.historic.on_delivery_caught_up,
            BatchWindowClosed: self.own_relay.on_batch_window_closed,
            CompletionRecheck: self.completion.on_completion_recheck,
            HistoricSlotDue: self.historic.on_historic_slot_due,
            CooldownEnded: self.refusals.on_cooldown_ended,
            Tick: self.on_tick,
        }

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        self.delivery.start()
        self.handshakes.start()
        self.self_sub.start()
        self._ticker = self.effects.every(constants.MAINTENANCE_TICK_SECS, lambda: Tick(self.clock()))

    def run(self) -> None:
        """Apply messages until ``Stop``. One at a time: no locks around any index."""
        while True:
            self.last_loop_at = self.effects.monotonic()
            try:
                msg = self.queue.get(timeout=1.0)
            except Empty:
                continue
            depth = self.queue.qsize()
            if depth > self.queue_peak:
                self.queue_peak = depth
            if isinstance(msg, Stop):
                return
            try:
                self.apply(msg)
            except Exception:
                log.exception("handler_failed", message=type(msg).__name__)

    def apply(self, msg) -> None:
        """One message, by its handler (``run``'s, and the simulator's)."""
        kind = type(msg)
        if kind is not Tick:
            self.saved.note_message()  # (only time passes on ticks alone: ``SavedState.due``)
        self.handlers[kind](msg)

    def stop(self) -> None:
        self.lifecycle.shut_down()
        self.effects.kill(self._ticker)
        self.self_sub.stop()
        self.handshakes.stop()
        self.save_state(self.clock())

    # -- remote traffic -----------------------------------------------------------------

    def on_remote_events(self, msg: RemoteEvents) -> None:
        try:
            self.apply_remote_events(msg)
        finally:
            if msg.applied is not None:
                msg.applied.set()  # its connection may read the next burst

    def apply_remote_events(self, msg: RemoteEvents) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None:
            return
        state.received_metric.inc(len(msg.events))
        self.health.record_served(state.url)
        if state.current.sub_activity:  # historic REQs that sent something are not stalled
            now = self.clock()
            for sub_id in {e.sub_id for e in msg.events} & state.current.sub_activity.keys():
                state.current.sub_activity[sub_id] = now
        for event in msg.events:
            try:
                self.apply_remote_event(state, event)
            except Exception:  # one bad apple must not cost the rest of the burst
                log.exception("handler_failed", message="RemoteEvent", event_id=event.event.id)

    def apply_remote_event(self, state: RelayState, msg: RemoteEvent) -> None:
        batch_id = state.current.sub_to_batch.get(msg.sub_id)
        if batch_id is not None and batch_id in state.current.pending:
            batch = state.current.pending[batch_id]
            batch.record_event(msg.sub_id, msg.event, msg.matched)
            if batch.audit_window is not None:
                self.live.note_audited(state, batch, msg.event, new=not self.own_relay.had(msg.event.id))
        self.refusals.keep_values_seed(state, msg.event)  # (a known id too: it was served)
        if msg.verified or self.own_relay.checked_late(msg.event):
            self.own_relay.consider_for_delivery(msg.event, state)
            self.descendants.note_direct_member(state, msg.event)

    def on_remote_message(self, msg: RemoteMessage) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None:
            return
        m = msg.message
        if isinstance(m, wire.Eose):
            self.health.record_served(state.url)
            self.refusals.note_served(state, m.sub_id)
            self.historic.on_eose(state, m.sub_id, msg.past_until)
        elif isinstance(m, wire.Closed):
            self.refusals.on_closed(state, m, msg.beside)
        elif isinstance(m, wire.Notice):
            log.info("relay_notice", relay=state.url, text=m.text[:200])
            if wire.is_rate_limit_text(m.text):
                self.refusals.note_rate_limited(state, m.text)
        elif isinstance(m, (wire.Ok, wire.NegErr)):
            self.refusals.note_rate_limit_answer(state, m)

    # -- maintenance --------------------------------------------------------------------

    def waits_on_other_shard(self, follower, waited: float) -> bool:
        """A batch waiting for another shard's lead waits on while that shard is storing
        (``sync.shard.waits_on_other_shard``)."""
        url, batch_id = follower
        state = self.relays.get(url)
        batch = state.current.pending.get(batch_id) if state is not None else None
        if batch is None or not batch.led_elsewhere:
            return False
        landed_at = self.own_relay.other_shard_landed_at
        return waits_on_other_shard(waited, None if landed_at is None else self.clock() - landed_at,
                                    constants.OTHER_SHARD_QUIET_SECS, constants.OTHER_SHARD_WAIT_MAX_SECS)

    def on_tick(self, msg: Tick) -> None:
        now = self.clock()
        expired = self.repos.expire_state_only_repos(now)
        if expired:
            self.lifecycle.drop_repos(expired)
        self.lifecycle.connect_due_relays(now)  # retries relays whose backoff is over
        self.lifecycle.retire_unwanted_relays()
        self.lifecycle.run_daily(now)
        self.lifecycle.end_nip77_rests(now)
        self.historic.on_delivery_caught_up()  # in case its message was lost with a restarted delivery
        self.historic.release_followers(self.lead.overdue(now, constants.FOLLOWER_WAIT_MAX_SECS,
                                                          keep=self.waits_on_other_shard), overdue=True)
        self.historic.run_recovery(now)
        self.refusals.expire_stalled(now)
        self.live.release_overdue_trials(now)
        self.historic.expire_negentropy()
        self.refusals.run_policy_probes(now)
        self.live.run_polls(now)
        self.live.run_audits(now)
        self.descendants.run(now)
        self.own_relay.release_dependents(self.rejected.due(now))  # dated ahead when refused: their time came
        self.own_relay.probe_store(now)  # refused with everything, nothing stored since: does it store again?
        self.own_relay.ask_witnesses_if_due(now)  # back from an outage, its answer failed: ask again
        for event_id in self.rejected.expire(now):
            # refused a week ago: the next copy goes to the own relay again (kept in seen, it
            # counted as delivered: seed 64's 60 days, a comment refused while the own
            # relay, emptied by a restart, lacked its root; the root came back 7 days later,
            # the comment never). One pushed out for room stays in seen: a relay with more
            # refused events than the index holds does not have them offered at every copy.
            self.seen.pop(event_id, None)
        if self.saved.due(now):
            self.save_state(now)
        self.delivery_peak = max(self.delivery_peak, self.delivery.backlog)

    def update_metrics(self, now: float) -> None:
        """The gauges read from the manager's tables (every relay's, the round's progress):
        set when /metrics is scraped (``ops.http``), not on every tick — a tick's worth of
        them cost more than the rest of the tick with many relays and repositories."""
        connected = dead = members = 0
        for state in self.relays.values():
            if state.gauges is None:  # the relay's children, looked up once (every 2 s × relays)
                state.gauges = (*(g.labels(state.url) for g in metrics.PER_RELAY_GAUGES),
                                metrics.STARTS_QUEUED.labels(state.url))
            # paused: set where it changes; status: set here and by the refusals
            connected_g, status_g, failures_g, subscriptions_g, _paused, parked_g, _queued = state.gauges
            status = self.health.status_metric(state.url, now)
            if status != state.status_value:
                status_g.set(status)
                state.status_value = status
            failures = self.health.failures(state.url, now)
            subscriptions = len(state.current.book.subscriptions) if state.current.book else 0
            parked = self.health.parked(state.url, now)
            values = (int(state.status), failures, subscriptions, round(parked[1]) if parked else 0)
            if values != state.gauge_values:  # set only here: unchanged, not set again
                for gauge, value, last in zip((connected_g, failures_g, subscriptions_g, parked_g), values,
                                              state.gauge_values or (None,) * 4, strict=True):
                    if value != last:
                        gauge.set(value)
                state.gauge_values = values
            connected += state.connected
            dead += self.health.is_dead(state.url, now)
            members += len(state.member_roots)
        saved_at = self.saved.saved_at
        self.delivery_peak = max(self.delivery_peak, self.delivery.backlog)
        values = (len(self.relays), len(self.relays), members, self.rejected.bytes,
                  -1 if saved_at is None else max(0.0, now - saved_at), connected, dead, self.queue.qsize(),
                  self.delivery.backlog, self.queue_peak, self.delivery_peak, int(self.own_relay.ready),
                  int(not self.own_relay.down and self.self_sub.connected), len(self.repos),
                  self.config.sync.delivery_max_backlog, len(self.rejected), self.rejected.max_entries,
                  self.config.sync.background_start_interval_ms / 1000)
        if values != self.gauge_values:  # set only here, as the relays' above: unchanged, not set again
            for gauge, value, last in zip(_manager_gauges(), values, self.gauge_values or (None,) * len(values),
                                          strict=True):
                if value != last:
                    gauge.set(value)
            self.gauge_values = values
        progress, works = read_progress(self.relays, self.repos, self.health, self.config.sync, now)
        if progress != self.progress_published:  # (its gauges: unchanged, not set again)
            publish_progress(progress)
            self.progress_published = progress
        for state, work in zip(self.relays.values(), works, strict=True):  # (works: one per relay, in order)
            queued = state.gauges[-1]
            if work.starts_queued != state.queued_value:
                queued.set(work.starts_queued)
                state.queued_value = work.starts_queued

    # -- operators ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """The own relay's first history read is applied (``OwnRelaySide``)."""
        return self.own_relay.ready

    def became_ready(self, then) -> None:
        """The own relay's first read is applied: what it shows is known, so what it lost
        since an earlier process saved is too (``lifecycle.look_for_lost``), and it is asked
        for what it had stored then (``sync.own_witness``); then ``then``."""
        self.lifecycle.look_for_lost(self.saved.take_lost(self.repos), self.clock())
        # (and asked for what it had stored for the last one)
        self.own_relay.ask_witnesses(self.own_relay.witness.restore(self.saved.take_witnesses()))
        if then:
            then()

    def alive_recently(self, within: float) -> bool:
        return self.effects.monotonic() - self.last_loop_at < within

    def set_bootstrap_relays(self, urls) -> None:
        for state in self.relays.values():
            state.is_bootstrap = False
        for url in urls:
            self.lifecycle.register_relay(url).is_bootstrap = True

    def summary(self) -> str:
        connected = sum(1 for s in self.relays.values() if s.connected)
        return (f"{connected}/{len(self.relays)} relays connected, {len(self.repos)} repos, "
                f"{self.delivery.backlog} deliveries in flight")

    def status_snapshot(self) -> dict:
        now = self.clock()
        progress, works = read_progress(self.relays, self.repos, self.health, self.config.sync, now)
        works = {w.url: w for w in works}
        return {
            "own_relay": self.config.service.own_relay,
            "own_relay_up": not self.own_relay.down,
            "ready": self.own_relay.ready,
            "repos": len(self.repos),
            "delivery_backlog": self.delivery.backlog,
            "rejected": len(self.rejected),
            "state": self.state_status(now),
            "peaks": {"manager_queue": self.queue_peak, "handshakes": self.handshakes.peak,
                      "delivery_backlog": self.delivery_peak},
            "progress": progress.as_dict(),
            "relays": [
                {
                    "relay": s.url,
                    "status": s.status.name.lower(),
                    "health": self.health.state(s.url, now).name.lower(),
                    "subscriptions": len(s.current.book.subscriptions) if s.current.book else 0,
                    "subscriptions_peak": s.current.book.peak_subscriptions if s.current.book else 0,
                    "pending_batches": len(s.current.pending),
                    "starts_queued": works[s.url].starts_queued,
                    "pages_expected": works[s.url].pages_expected,
                    "starts_reading_own": works[s.url].starts_reading_own,
                    "paused_coverage": len(s.paused),
                    "events_delivered": s.events_delivered,
                    "bootstrap": s.is_bootstrap,
                    "last_error": s.refused_reason or s.last_error,
                    **self.parked_status(s.url, now),
                }
                for s in sorted(self.relays.values(), key=lambda s: s.url)
            ],
        }

    def state_status(self, now: float) -> dict:
        """state_dir: ``saved_secs_ago`` (its last write), ``save_error`` while saves fail."""
        saved_at = self.saved.saved_at
        return {"path": self.saved.store.path,
                "saved_secs_ago": None if saved_at is None else round(max(0.0, now - saved_at)),
                "save_error": self.saved.save_error}

    def parked_status(self, url: str, now: float) -> dict:
        """``parked`` (how it failed) and ``parked_secs`` (left) for a parked relay."""
        parked = self.health.parked(url, now)
        return {"parked": parked[0], "parked_secs": round(parked[1])} if parked else {}

    # -- state_dir ---------------------------------------------------------------------------

    def save_state(self, now: float) -> None:
        """What changed since the last save goes to state_dir (relays, confirmed items,
        rejected entries): one transaction, rows by change."""
        self.saved.save(self.relays, self.health, self.rejected, now, ready=self.own_relay.ready,
                        witness=self.own_relay.witness)


_MANAGER_GAUGES: tuple = ()


def _manager_gauges() -> tuple:
    """The gauges ``update_metrics`` sets from the manager's own tables, in the order of
    its values (the labelled ones' children looked up once)."""
    global _MANAGER_GAUGES
    if not _MANAGER_GAUGES:
        _MANAGER_GAUGES = (
            metrics.RELAYS_TRACKED, metrics.RELAYS_HELD, metrics.THREAD_MEMBERS, metrics.REJECTED_BYTES,
            metrics.STATE_SAVE_AGE, metrics.RELAYS_CONNECTED, metrics.RELAYS_DEAD,
            metrics.QUEUE_DEPTH.labels("manager"), metrics.QUEUE_DEPTH.labels("delivery"),
            metrics.QUEUE_DEPTH_PEAK.labels("manager"), metrics.QUEUE_DEPTH_PEAK.labels("delivery"),
            metrics.READY, metrics.OWN_RELAY_UP, metrics.REPOSITORIES, metrics.DELIVERY_BACKLOG_LIMIT,
            metrics.REJECTED_ENTRIES, metrics.REJECTED_LIMIT, metrics.BACKGROUND_START_INTERVAL)
    return _MANAGER_GAUGES
