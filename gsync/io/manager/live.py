"""Live coverage (``limit: 0``) within the relay's subscription and filter-size budgets:
packing, consolidation, and polling what does not fit. Live REQs bypass the proactive
pacing gate, not the rate-limit cooldown nor the reactive gate (SPEC §5: it is shared):
they wait in the relay's live queue for those.
"""
from __future__ import annotations

import dataclasses

from ... import constants
from ...ops.logging import get_logger
from ...protocol import messages as wire
from ...sync import filter_plan
from ...sync.relay_state import LiveSub, RelayState
from ...sync.targets import PendingItems

log = get_logger("gsync.manager")


class LiveCoverage:
    """Mixin of ``SyncManager``: its state lives on the manager (``core.SyncManager``)."""

    def subscribe_live(self, state: RelayState, live_filters, items: PendingItems) -> None:
        """Live coverage for new ``items`` (``live_filters`` is their live form). Called
        before their historic batch exists, so a consolidation must add them itself."""
        groups = filter_plan.pack_into_reqs(live_filters, state.limits)
        budget = filter_plan.SubscriptionBudget.from_limits(state.limits)
        active = sum(1 for sub in state.live_subs.values() if not sub.control)
        # The baseline (every live filter of the relay rebuilt and packed: the manager's
        # largest cost at 50 relays) matters only past CONSOLIDATION_EXCESS live
        # subscriptions; below that, no baseline could make fragmentation the reason.
        baseline = self.live_baseline(state) if active > constants.CONSOLIDATION_EXCESS else 0
        if budget.needs_consolidation(active, baseline, adding=len(groups)):
            self.consolidate(state, items)
            return
        self.open_live_groups(state, groups)

    def open_live_groups(self, state: RelayState, groups, slots: int | None = None,
                         rebuilt_at: float | None = None, descendants: bool = False) -> None:
        """Open live REQs while the relay's subscription and filter-size budgets allow;
        coverage that does not fit is polled on the maintenance cadence instead. ``slots``:
        the data-plane subscriptions still free (default: what the budget leaves beside the
        live subscriptions already open), so no caller can open past it. Core coverage (not
        ``descendants``) that does not fit takes the room of descendant subscriptions first,
        which are polled instead (SPEC §3: they give way)."""
        if slots is None:
            budget = filter_plan.SubscriptionBudget.from_limits(state.limits)
            slots = budget.live_slots - sum(1 for sub in state.live_subs.values() if not sub.control)
        live_bytes = sum(state.conn.filter_bytes.get(s, 0) for s in state.live_subs)
        for group in groups:
            group = state.paused.allowed(group)
            if not group:
                continue
            size = wire.req_size("live-00000000", group)
            if not descendants and (slots <= 0 or live_bytes + size > constants.MAX_LIVE_FILTER_BYTES):
                freed_bytes, freed_slots = self.evict_descendants(
                    state, live_bytes + size - constants.MAX_LIVE_FILTER_BYTES, 1 - slots)
                live_bytes -= freed_bytes
                slots += freed_slots
            if slots <= 0 or live_bytes + size > constants.MAX_LIVE_FILTER_BYTES:
                self.poll_instead(state, group)
                continue
            self.open_live(state, f"live-{next(self._ids)}", group, rebuilt_at=rebuilt_at,
                           descendants=descendants)
            live_bytes += size
            slots -= 1

    def open_live(self, state: RelayState, sub_id: str, filters, control: bool = False,
                  rebuilt_at: float | None = None, descendants: bool = False) -> None:
        """Register a live subscription and send it as soon as the gates allow."""
        state.live_subs[sub_id] = LiveSub(tuple(filters), control, rebuilt_at, descendants)
        state.live_queue.append(sub_id)
        self.pump_live(state)

    def pump_live(self, state: RelayState) -> bool:
        """Send queued live REQs while no cooldown holds them and the reactive gate allows
        (no proactive gate: live coverage is not background work). False while they wait."""
        while state.live_queue:
            now = self.clock()
            wait = self.health.may_start_live(state.url, now)
            if wait > 0:
                self.wake_pump_in(state, wait)
                return False
            sub_id = state.live_queue.pop(0)
            live = state.live_subs.get(sub_id)
            if live is None or sub_id in state.conn.subscriptions:
                continue  # closed by a consolidation while it waited, or already out
            filters = state.paused.allowed(live.filters)
            if not filters:
                del state.live_subs[sub_id]
                continue
            if len(filters) < len(live.filters):
                state.live_subs[sub_id] = dataclasses.replace(live, filters=tuple(filters))
            self.health.record_start(state.url, now, background=False)
            state.conn.subscribe(sub_id, filters)
        return True

    def evict_descendants(self, state: RelayState, bytes_needed: int, slots_needed: int) -> tuple[int, int]:
        """Close descendant live subscriptions (largest first, polled from now on) until
        ``bytes_needed`` filter bytes and ``slots_needed`` subscriptions are free, or none is
        left. Returns the bytes and subscriptions freed."""
        freed = closed = 0
        subs = sorted((s for s, sub in state.live_subs.items() if sub.descendants),
                      key=lambda s: -state.conn.filter_bytes.get(s, 0))
        for sub_id in subs:
            if freed >= bytes_needed and closed >= slots_needed:
                break
            freed += state.conn.filter_bytes.get(sub_id, 0)
            closed += 1
            self.poll_instead(state, state.live_subs.pop(sub_id).filters)
            state.conn.unsubscribe(sub_id)  # not sent yet: pump_live skips it
        return freed, closed

    def poll_instead(self, state: RelayState, filters) -> None:
        if not state.polled:
            log.warning("live_coverage_polled", relay=state.url, reason="relay budget")
        state.polled.extend(f.replace(limit=None) for f in filters)
        if state.poll_cursor is None:
            state.poll_cursor = self.clock()

    def run_polls(self, now: float) -> None:
        """Live coverage that did not fit: one EOSE-closing batch per relay on a cadence set
        by what it sends (``filter_plan.poll_interval``), from the last successful poll
        with an overlap (SPEC §3, direct-member fallback). Not while the relay's historic
        sync runs (up to ``POLL_DEFER_SECS``): its batches fetch the same history, and the
        gate's starts are theirs."""
        for state in self.relays.values():
            if not (state.connected and state.polled) or state.poll_batch in state.pending:
                continue
            if now - (state.poll_started_at or 0) < state.poll_every:
                continue
            last = state.poll_started_at or state.poll_cursor or now
            if self.syncing_batches(state) and now - last < constants.POLL_DEFER_SECS:
                continue
            since = int(state.poll_cursor or now) - constants.POLL_OVERLAP_SECS
            state.poll_started_at = now
            state.polled = state.paused.allowed(state.polled)
            every = filter_plan.poll_interval(wire.req_size("poll", state.polled))
            if round(every) != round(state.poll_every):
                log.info("live_coverage_poll_cadence", relay=state.url, every_secs=round(every),
                         filters=len(state.polled))
            state.poll_every = every
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

    def consolidate(self, state: RelayState, adding: PendingItems | None = None) -> None:
        """Replace fragmented live subscriptions with the fewest that cover everything.

        The design waits for pending batches first; here live coverage is rebuilt from
        confirmed *and* pending items at once (plus ``adding``, the items whose arrival
        triggered this), so nothing in flight loses its live stream. What does not fit the
        relay's budget is polled (logged). Events the old subscriptions had already sent are
        kept (the connection still knows their filters until the relay's CLOSED); the
        moment between the swap is fetched again, with the usual 15-minute overlap.
        """
        for sub_id in [s for s, sub in state.live_subs.items() if not sub.control]:
            del state.live_subs[sub_id]
            state.conn.unsubscribe(sub_id)
        state.polled = []
        wanted = self.desired_live_items(state)
        if adding is not None:
            wanted.add(adding)
        live = filter_plan.live(self.filters_for(state, wanted, None))
        groups = filter_plan.pack_into_reqs(live, state.limits)
        budget = filter_plan.SubscriptionBudget.from_limits(state.limits)
        self.open_live_groups(state, groups, slots=budget.live_slots)
        if state.members:  # thread replies after the core coverage: they give way first
            self.open_descendant_live(state, self.descendant_filters_for(state, state.members))
        # Between our CLOSEs and the new REQs the relay sends nothing new: fetch that gap
        # (SPEC §4 asks this of layer 1; every layer has the same gap).
        self.catch_up(state, wanted, int(self.clock()) - constants.RECONNECT_OVERLAP_SECS)
        log.info("consolidated", relay=state.url, live_subscriptions=len(state.live_subs) - 1,
                 polled_filters=len(state.polled))
