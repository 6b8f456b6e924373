"""The own relay's side: what it accepted (self-subscription batches → RepoSyncIndex →
AddFilters), what we deliver to it and its answers, its outages, the rejected index.
"""
from __future__ import annotations

import itertools
import os

import gevent

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol.filters import Filter
from ...sync import filter_plan
from ...sync.descendants import full_root_ids
from ...sync.have_index import RejectedHave
from ...sync.relay_state import ConnectionStatus, RelayState
from ...sync.repos import SyncLevel, should_forward_layer1
from ...sync.targets import PendingItems, compute_actions, relay_needs
from ..events import (
    BatchWindowClosed,
    DeliveryAnswered,
    OwnEvent,
    OwnRelayState,
    OwnSubscribed,
)

log = get_logger("gsync.manager")

SEEN_CAPACITY = 500_000  # ids already handed to delivery: dedupe across relays
REJECTED_SAVE_SECS = 60.0  # the cold tier is written at most this often (and at stop)


class OwnRelaySide:
    """Mixin of ``SyncManager``: its state lives on the manager (``core.SyncManager``)."""

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
        self.claims.arrived(event.id)
        if self.recovery.is_missing(event.id):
            for url in self.recovery.clear_arrived((event.id,)):
                self.promote_if_recovered(url)
        if len(self.seen) > SEEN_CAPACITY:
            for old in list(itertools.islice(self.seen, SEEN_CAPACITY // 10)):  # oldest tenth
                del self.seen[old]
        if not self.delivery.submit(event) and not self.delivery.is_tracked(event.id):
            del self.seen[event.id]  # dropped for backlog (counted): a later copy may go through
            return
        if state is not None:
            state.events_delivered += 1

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
        self.root_ids = full_root_ids(self.repos)
        self.redeliver_unblocked(new_maintainers)
        log.info("self_batch_processed", events=len(events), repos=len(self.repos), dirty_relays=len(dirty))
        self.apply_dirty(dirty)

    def apply_dirty(self, dirty: set[str]) -> None:
        """New work for the relays whose targets changed; new relays get dialled. The cost
        follows the dirty relays' repos (a purgatory answer must not walk every repo)."""
        for url in dirty:
            state = self.relay(url)
            if not state.connected:
                continue
            targets = {url: relay_needs(self.repos, url)}
            pending = {url: [b.items for b in state.pending.values()]}
            for action in compute_actions(targets, pending, {url: state.confirmed}, {url}):
                self.start_sync(state, action.items, since=None)
        if any(s.status is ConnectionStatus.DISCONNECTED and not s.refused_reason
               for s in map(self.relay, dirty)):
            self.connect_due_relays(self.clock())  # now, not at the next maintenance tick

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
            if state.connected:  # its live subscriptions stayed open: history only
                self.catch_up(state, state.confirmed.copy(), catch_up)

    def on_delivery_answered(self, msg: DeliveryAnswered) -> None:
        now = self.clock()
        if msg.outcome == "rejected":
            self.rejected.add(msg.event, now)
            log.info("event_rejected", event_id=msg.event.id, kind=msg.event.kind, reason=msg.reason[:200])
        elif msg.outcome == "purgatory" and msg.event.kind == 30617:
            self.apply_dirty(self.repos.apply_announcement(msg.event, SyncLevel.STATE_ONLY, now))

    def _rejected_path(self) -> str:
        return os.path.join(self.config.service.state_dir, "rejected.json")

    def _load_rejected(self) -> RejectedHave:
        try:
            with open(self._rejected_path()) as fh:
                return RejectedHave.loads(fh.read(), self.clock())
        except OSError:
            return RejectedHave()

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

