"""The own relay's side: what it accepted (self-subscription batches → RepoSyncIndex →
AddFilters), what we deliver to it and its answers, its outages, the rejected index.
"""
from __future__ import annotations

import itertools

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol.event import is_authentic
from ...sync import filter_plan
from ...sync.descendants import full_root_ids
from ...sync.own_witness import OwnWitness
from ...sync.rejected import (
    OWN_STORES_KEY,
    author_key,
    event_key,
    maintainer_key,
    repo_addresses,
    repo_key,
)
from ...sync.relay_state import RelayState
from ...sync.repos import SyncLevel, list_tag_values, should_forward_layer1
from .. import negentropy_sync
from ..inbox import (
    BatchWindowClosed,
    DeliveryAnswered,
    OwnEvents,
    OwnHeldConfirmed,
    OwnLanded,
    OwnRelayState,
    OwnSubscribed,
    OwnWitnessRead,
)

# the source of what goes to the own relay from gsync's memory, not from a relay
# (``offer_lost_announcements``)
FROM_MEMORY = "memory"

log = get_logger("gsync.manager")

SEEN_CAPACITY = 500_000  # ids already handed to delivery: dedupe across relays
# refused ids released to be fetched again, remembered (``OwnRelaySide.released``) for two
# live audits' intervals at most, and at most this many
RELEASED_KEPT_SECS = 2 * constants.LIVE_AUDIT_SECS
RELEASED_KEPT_MAX = 10_000


class OwnRelaySide:
    """What the own relay shows (the self-subscription's batches, its outages) and answers
    (delivery's outcomes): owned here, the batch window, when it went down and whether the
    first read made the manager ready (``on_ready``). Events go to ``delivery`` once
    (``seen``, shared with the connections and the self-subscription; not what
    ``rejected`` holds); what they change lands in ``repos``, ``descendants`` (the roots
    of Full repositories), ``recovery`` and ``claims``, in what the session knows the own
    relay holds (``own_held``) and, for the relays whose targets changed, in
    ``apply_dirty``; refused events released again are fetched through ``historic``."""

    def __init__(self, *, own_relay: str, batch_window_secs: float, relays, repos, domains, rejected,
                 recovery, claims, delivery, own_held, seen, descendants, historic, completion, apply_dirty,
                 effects, post, clock, on_ready, on_loss, on_seen_cleared=lambda: None, shards: bool = False):
        self.own_relay = own_relay
        self.batch_window_secs = batch_window_secs
        self.relays = relays
        self.repos = repos
        self.domains = domains
        self.rejected = rejected
        self.recovery = recovery
        self.claims = claims
        self.delivery = delivery
        self.own_held = own_held
        self.seen = seen
        self.descendants = descendants
        self.historic = historic
        self.completion = completion
        self.apply_dirty = apply_dirty
        self.effects = effects
        self.post = post
        self.clock = clock
        self.on_ready = on_ready
        self.ready = False  # the own relay's first history read is applied
        self.batch: list = []  # events of the self-subscription's open window
        # ids of those only delivery's duplicate: answers showed (OwnEvents.duplicates): the
        # own relay may hold a newer one of their address instead
        self.batch_unheld: set[str] = set()
        self.window_open = False
        self.down_since: float | None = None
        self.other_shard_landed_at: float | None = None  # another shard's last store seen (OwnLanded)
        self.shards = shards  # one of several instances ([cluster] shard)
        self.roots_version = -1  # of ``repos`` when the descendants' roots were last set
        # repository address -> (when its announcement may be offered again, the gap):
        # ``offer_lost_announcements``; repositories of the index only, dropped as each is shown
        self.reoffered: dict[str, tuple[float, float]] = {}
        self.witness = OwnWitness()  # a few events it stored, asked back after an outage
        self.witness_due: float | None = None  # when to ask them again (its answer failed)
        # refused ids released to be fetched again by id (``_offer_again``), and when: no
        # longer seen nor refused, yet they came (``had``: a live audit bringing one before
        # its fetch, or after a relay not serving ids, is no evidence of a miss).
        # RELEASED_KEPT_SECS at most, RELEASED_KEPT_MAX entries.
        self.released: dict[str, float] = {}
        self.on_loss = on_loss  # it lost events: every relay starts fresh
        # ``seen`` was emptied (the own relay back from an outage): what was had before is
        # no longer told from what never came (``LiveCoverage.restart_audits``)
        self.on_seen_cleared = on_seen_cleared

    @property
    def down(self) -> bool:
        """The own relay is unreachable (delivery said so, ``on_own_relay_state``)."""
        return self.down_since is not None

    def consider_for_delivery(self, event, state: RelayState | None = None) -> None:
        if event.id in self.seen or event.id in self.rejected:
            return
        source = state.url if state is not None else ""
        if event.kind in filter_plan.LAYER1_KINDS and not should_forward_layer1(
            event, self.repos, self.domains
        ):
            metrics.DROPS.labels("layer1_not_ours").inc()
            log.debug("event_dropped", reason="layer1_not_ours", event_id=event.id, kind=event.kind)
            # Remembered like a refusal, so NIP-77 does not fetch it again; a maintainer added
            # later re-delivers it (release_dependents).
            self.rejected.add(event, self.clock(), source)
            return
        # when it was fetched: what the own relay holds only thanks to this sync round's own
        # fetches says nothing of what the next filter lacks (HistoricPlanner.choose_methods)
        now = self.seen[event.id] = self.clock()
        self.claims.arrived(event.id)
        if self.recovery.is_missing(event.id):
            for url in self.recovery.clear_arrived((event.id,)):
                self.completion.promote_if_recovered(url)
        self.trim_seen()
        if not self.delivery.submit(event, source) and not self.delivery.is_tracked(event.id):
            del self.seen[event.id]  # dropped for backlog (counted): a later copy may go through
            return
        if event.id not in self.own_held:  # not known to be there: stored anew, most likely
            self.own_held.new_threads((event.id,), now)
        if state is not None:
            state.events_delivered += 1

    def trim_seen(self) -> None:
        """The dedupe index stays under SEEN_CAPACITY, whatever adds to it."""
        if len(self.seen) > SEEN_CAPACITY:
            for old in list(itertools.islice(self.seen, SEEN_CAPACITY // 10)):  # oldest tenth
                del self.seen[old]

    def on_own_events(self, msg: OwnEvents) -> None:
        self.batch += msg.events
        for event in msg.events:
            if event.id in msg.duplicates:
                self.batch_unheld.add(event.id)
            else:  # shown held (the self-subscription, or stored anew)
                self.batch_unheld.discard(event.id)
        seen = self.seen
        for event in msg.events:
            seen.setdefault(event.id, None)
        self.trim_seen()
        self.witness.stored((event.id, event) for event in msg.events if event.id not in msg.duplicates)
        # The first history read is one batch, however long it takes: one AddFilters per
        # relay instead of a drip of them.
        if not self.window_open and self.ready:
            self.window_open = True
            self.effects.later(self.batch_window_secs, BatchWindowClosed(0))

    def on_batch_window_closed(self, msg: BatchWindowClosed) -> None:
        """A closed self-subscription window updates RepoSyncIndex and emits AddFilters."""
        events, self.batch, self.window_open = self.batch, [], False
        unheld, self.batch_unheld = self.batch_unheld, set()
        # once each: a root gsync delivered comes with the own relay's OK and again live
        events = list({event.id: event for event in events}.values())
        now = self.clock()
        dirty: set[str] = set()
        arrived: set[str] = set()  # release keys of what the own relay now accepts
        for event in sorted(events, key=lambda e: e.kind != 30617):  # announcements first
            if event.kind == 30617:
                if event.id not in unheld:  # (shown, or stored anew: not a duplicate: answer)
                    self.reoffered.pop(event.address, None)
                arrived |= self.announcement_arrivals(event)
                dirty |= self.apply_announcement(event, now, held=event.id not in unheld)
            else:
                dirty |= self.repos.apply_root_event(event)
                if event.kind in constants.ROOT_KINDS:  # held again after the own relay lost it, too
                    arrived.add(event_key(event.id))
        if self.repos.roots_version != self.roots_version:  # (a walk over every root otherwise)
            self.roots_version = self.repos.roots_version
            arrived |= {event_key(root) for root in self.descendants.set_roots(full_root_ids(self.repos))}
        if not msg.first_read:
            self.release_dependents(arrived)
        log.info("self_batch_processed", events=len(events), repos=len(self.repos), dirty_relays=len(dirty))
        self.apply_dirty(dirty)

    def apply_announcement(self, event, now: float, held: bool) -> set[str]:
        """An announcement the own relay showed (``held``: not only answered ``duplicate:``):
        into the repository index; the dirty relays. Said when it shows the own relay lost
        the one followed (``RepoSyncNeeds.held_instead``)."""
        needs = self.repos.get(event.address)
        held_before = needs.held_instead if needs is not None else ""
        dirty = self.repos.apply_announcement(event, SyncLevel.FULL, now, held=held)
        if needs is not None and needs.held_instead not in ("", held_before):
            log.info("announcement_lost_by_own_relay", repo=event.address, followed=needs.announcement_id,
                     held=needs.held_instead, relays=len(needs.relays))
        return dirty

    def offer_lost_announcements(self, event, now: float) -> None:
        """``event`` names repositories gsync follows (or references their threads: a
        comment, its issue), and the own relay refused it: it may
        have lost their announcements (one in memory restarted empty, one restored from an
        older copy), and no relay may hold the one followed any more (published to the own
        relay alone, or to relays that lost it since: then no daily sync brings it back). The
        one followed goes to the own relay again, from memory: stored, the repository is back
        and what waited on it goes again (``release_dependents``); held still, the own relay
        answers ``duplicate:``. At once, then no sooner than ``ANNOUNCEMENT_REOFFER_SECS``,
        doubling while its repository's events are refused (a relay put read-only refuses
        everything), to ``ANNOUNCEMENT_REOFFER_MAX_SECS``; afresh once it is shown again."""
        for address in dict.fromkeys([*repo_addresses(event), *self.descendants.repositories_of(event)]):
            needs = self.repos.get(address)
            announcement = needs.announcement if needs is not None else None
            if announcement is None or announcement.id == event.id or announcement.id in self.rejected:
                continue
            due, gap = self.reoffered.get(address, (float("-inf"), 0.0))
            if now < due:
                continue
            gap = min(max(2 * gap, constants.ANNOUNCEMENT_REOFFER_SECS), constants.ANNOUNCEMENT_REOFFER_MAX_SECS)
            self.reoffered[address] = (now + gap, gap)
            if len(self.reoffered) > 2 * len(self.repos) + 100:  # (repositories gone from the index)
                self.reoffered = {a: v for a, v in self.reoffered.items() if a in self.repos}
            log.info("announcement_offered_again", repo=address, announcement_id=announcement.id,
                     refused_id=event.id)
            # (straight to delivery: the own relay showed it, so whether it lists this relay
            # is not the question ``consider_for_delivery`` would ask of a fetched one)
            self.seen[announcement.id] = now
            self.delivery.submit(announcement, FROM_MEMORY)

    def announcement_arrivals(self, event) -> set[str]:
        """Release keys an accepted announcement satisfies (call before applying it): its
        repository, and maintainers it adds for its ``d``. The repository even when gsync
        holds it as accepted already: an own relay that lost the announcement (one in memory
        restarted) refused the repository's events meanwhile, and takes them again now."""
        return {repo_key(event.address)} | self.maintainer_arrivals(event)

    def maintainer_arrivals(self, event) -> set[str]:
        needs = self.repos.get(event.address)
        if needs is not None and needs.announcement_id == event.id:
            return set()  # the announcement applied already: its maintainers are known (the own relay's re-reads)
        added = set(list_tag_values(event, "maintainers")) - self.repos.maintainers_of(event.d_tag)
        return {maintainer_key(pubkey, event.d_tag) for pubkey in added} | {
            author_key(pubkey) for pubkey in added  # entries saved before keys existed
        }

    def release_dependents(self, arrived: set[str]) -> None:
        """Refused events that were waiting for what just ``arrived`` (release keys, see
        ``sync.rejected``) go to the own relay again: at once while their full event is in
        the hot tier, else fetched again by id from the relay each came from."""
        if not arrived:
            return
        hot, cold = self.rejected.take_dependents(arrived, self.clock())
        self._offer_again(hot, cold)
        if hot or cold:
            log.info("refused_released", redelivered=len(hot), refetched=len(cold))

    def stores_again(self) -> None:
        """The own relay stored an event anew (this instance's, or another shard's): what it
        refused with everything else goes to it again, and its probes start over."""
        self.rejected.own_stored()
        if self.rejected.waits_on(OWN_STORES_KEY):
            self.release_dependents({OWN_STORES_KEY})

    def stored_events(self, event_ids) -> None:
        """Events the own relay stored anew: what it refused for want of them goes to it
        again. The self-subscription shows roots and announcements (``on_batch_window_closed``
        releases theirs); a thread member, a comment, it does not: a reply refused as an
        orphan while its comment was on its way (the own relay refilled after a loss, the
        reply offered first) waited for its entry to expire once its releases by stores ran
        out (the simulator's seed 511 of a world with --member-replies)."""
        waits_on = self.rejected.waits_on
        arrived = {key for key in map(event_key, event_ids) if waits_on(key)}
        if arrived:
            self.release_dependents(arrived)

    def probe_store(self, now: float) -> None:
        """Refused with everything else and nothing stored anew since for a while: one of
        those events goes to the own relay again (``RejectedIndex.take_store_probe``), as
        nothing else would show that it stores again in a quiet hour."""
        if self.down:
            return
        hot, cold = self.rejected.take_store_probe(now)
        if hot or cold:
            log.info("own_store_probed", event_id=hot[0][0].id if hot else cold[0][0], refetched=not hot)
            self._offer_again(hot, cold)

    def _offer_again(self, hot: list, cold: list) -> None:
        """Refused events taken from the rejected index go to the own relay again: at once
        (``hot``: their full event kept), or fetched again by id (``cold``)."""
        for event, relay in hot:
            self.seen.pop(event.id, None)
            self.consider_for_delivery(event, self.relays.get(relay))
        by_relay: dict[str, list[str]] = {}
        now = self.clock()
        released = self.released
        for event_id, relay in cold:
            self.seen.pop(event_id, None)  # else the copy fetched again counts as known
            by_relay.setdefault(relay, []).append(event_id)
            released.pop(event_id, None)
            released[event_id] = now
        while released and (len(released) > RELEASED_KEPT_MAX
                            or now - next(iter(released.values())) > RELEASED_KEPT_SECS):
            del released[next(iter(released))]
        for relay, ids in by_relay.items():
            self.historic.refetch_refused(relay, ids)

    def had(self, event_id: str) -> bool:
        """Did ``event_id`` reach gsync before (as far as what it keeps tells)? Seen, refused
        or dropped as not ours (the rejected index: an announcement of a repository not
        listing us, every hour on a public relay), or refused and released to be fetched again
        (an event dated ahead, its time come, on a relay not serving ids: the simulator, seed 6
        of the suite's world)."""
        return event_id in self.seen or event_id in self.rejected or event_id in self.released

    def checked_late(self, event) -> bool:
        """The connection skips the checks of ids it knows (delivered, or refused). One
        wanted again since (released from the rejected index) is checked here instead."""
        if event.id in self.seen or event.id in self.rejected:
            return False
        return is_authentic(event)

    def on_own_subscribed(self, msg: OwnSubscribed) -> None:
        if msg.layer1 is not None and not self.down:  # layer 1's holdings, read whole
            self.own_held.learn(filter_plan.layer1_filter(), msg.layer1, self.clock())
        if not self.ready:
            self.ready = True
            self.on_batch_window_closed(BatchWindowClosed(self.clock(), first_read=True))
            log.info("ready", own_relay=self.own_relay)
            if self.on_ready:
                self.on_ready()

    def on_own_relay_state(self, msg: OwnRelayState) -> None:
        if not msg.up:
            self.down_since = msg.at
            # it may come back with less than it held (a relay in memory: nothing)
            self.own_held.forget()
            log.warning("own_relay_down", since=msg.at)
            return
        since = self.down_since
        self.down_since = None
        log.info("own_relay_up", down_since=since)
        if since is None:
            return
        # What it answered OK to before may be gone (a relay in memory comes back empty, one
        # that crashed loses what it had not written): nothing fetched before counts as
        # delivered any more, so the catch-up below (and any later sync) delivers it again;
        # what it still holds comes back "duplicate". Cleared in place: connections and the
        # self-subscription read the same map.
        self.seen.clear()
        self.on_seen_cleared()
        for state in self.relays.values():
            self.historic.pump(state)
        # Catch up everything that may have been held back or dropped while it was down.
        catch_up = int(since) - constants.RECONNECT_OVERLAP_SECS
        for state in self.relays.values():
            if state.connected:  # its live subscriptions stayed open: history only
                self.historic.catch_up(state, state.confirmed.copy(), catch_up)
        # What it stored long before the outage is beyond that window: is it still there?
        self.ask_witnesses()

    def ask_witnesses(self, asked: list[str] | None = None) -> None:
        """The own relay is back: ask it for a few events it had stored (``asked``; by
        default ``sync.own_witness``'s sample); ``on_own_witness_read`` judges the answer."""
        self.witness_due = None
        if asked is None:
            asked = self.witness.sample()
        if not asked:
            return
        handle = self.effects.spawn(negentropy_sync.ask_back, self.own_relay, asked, self.witness.filters(asked),
                                    self.post)

        def died(exc) -> None:
            self.post(OwnWitnessRead(asked, None, f"own relay query failed: {type(exc).__name__}"))

        self.effects.on_death(handle, died)

    def on_own_witness_read(self, msg: OwnWitnessRead) -> None:
        """Any witness gone: the own relay lost what it stored, how much is unknown, and
        every relay starts fresh (``on_loss``); NIP-77 moves only what it lacks. Unanswered:
        asked again in OWN_WITNESS_RETRY_SECS (another outage asks at its end)."""
        if self.down:
            return
        now = self.clock()
        if msg.held is None:
            log.warning("own_witnesses_unread", reason=msg.reason[:200])
            self.witness_due = now + constants.OWN_WITNESS_RETRY_SECS
            return
        gone = self.witness.judge(msg.asked, msg.held)
        if gone:
            log.warning("own_relay_lost_events", asked=len(msg.asked), missing=len(gone), example=gone[0])
            metrics.OWN_RELAY_LOSSES.inc()
            self.on_loss(now)

    def ask_witnesses_if_due(self, now: float) -> None:
        if self.witness_due is not None and now >= self.witness_due and not self.down:
            self.ask_witnesses()

    def on_own_held_confirmed(self, msg: OwnHeldConfirmed) -> None:
        """What the own relay stored is held. An event it stored anew had nothing tagging
        it there but what gsync delivers from now on (joining here as it is answered): a
        new root's thread filters, a new member's descendant filters, are known without a
        read (``OwnHeld.new_threads``; marked already when gsync sent it, not knowing it
        held). (What someone publishes there directly meanwhile is not known: fetched
        again, answered ``duplicate``; never claimed and missing.) The new roots' threads
        were three own-relay reads per root batch and relay, most of what gsync read of its
        own relay in a first sync (bench/scale); the members' descendants, read while
        the members waited in the delivery backlog, were four fifths of what was left (80
        of 103 REQs; 23 left). One answered ``duplicate`` was held before: what tags it is
        read; but not with shards, where ``duplicate`` mostly means another shard stored
        it a moment before (both fetched it), and its thread then comes through the landed
        stream like any (reading it brought back what that shard stored)."""
        if msg.stored_anew:  # (a duplicate answered is only a read)
            self.stores_again()
            self.stored_events(msg.stored_anew)
        self.witness.stored(msg.entries)
        if not self.down:
            self.own_held.confirm(msg.entries)
            anew = set(msg.stored_anew)
            self.own_held.new_threads(anew, self.clock())
            if len(anew) < len(msg.entries) and not self.shards:
                self.own_held.not_new([event_id for event_id, _ in msg.entries if event_id not in anew])

    def on_own_landed(self, msg: OwnLanded) -> None:
        """New events the own relay stored, seen live: with shards, mostly what another
        shard delivered; alone, thread members published to it directly. Held (a filter another shard led is then known without
        reading the own relay again) and seen (not fetched here again: claims settle,
        recovery stops asking). A root (or direct member) stored anew had no thread (no
        descendants) there but what is stored from now on, which comes the same way: its
        thread filters are known without a read, as for one this instance stored
        (``OwnHeld.new_threads``). One a broadcast missed is only fetched again."""
        if self.down:
            return
        self.own_held.confirm(msg.entries)
        self.witness.stored(msg.entries)
        seen, now = self.seen, self.clock()
        others = [(event_id, entry) for event_id, entry in msg.entries if seen.get(event_id) is None]
        if not others:  # this instance's own deliveries
            return
        self.other_shard_landed_at = now  # another shard is storing
        self.stores_again()
        self.stored_events(event_id for event_id, _ in others)
        arrived = [event_id for event_id, _ in others if event_id not in seen]
        for event_id in arrived:
            seen[event_id] = None
            self.claims.arrived(event_id)
        recovered = [event_id for event_id in arrived if self.recovery.is_missing(event_id)]
        if recovered:
            for url in self.recovery.clear_arrived(recovered):
                self.completion.promote_if_recovered(url)
        self.own_held.new_threads([event_id for event_id, _ in others], now)
        self.descendants.note_held(others)  # members published to the own relay directly
        self.trim_seen()

    def on_delivery_answered(self, msg: DeliveryAnswered) -> None:
        now = self.clock()
        if msg.outcome == "rejected":
            if msg.source != FROM_MEMORY:  # (one offered again from memory waits its gap instead:
                # kept as refused, a release would fetch it from every relay, it having none)
                self.rejected.add(msg.event, now, msg.source, until_own_stores=msg.until_own_stores,
                                  repos=self.descendants.repositories_of(msg.event))
            log.info("event_rejected", event_id=msg.event.id, kind=msg.event.kind, reason=msg.reason[:200])
            self.offer_lost_announcements(msg.event, now)
        elif msg.outcome == "purgatory" and msg.event.kind == 30617:
            # A GRASP relay counts announcements it holds when it checks maintainers.
            arrived = self.maintainer_arrivals(msg.event)
            self.apply_dirty(self.repos.apply_announcement(msg.event, SyncLevel.STATE_ONLY, now))
            self.release_dependents(arrived)
        elif msg.outcome == "purgatory":
            # The relay still holds the repository (and restarted its clock for it).
            self.repos.note_state_in_purgatory(msg.event, now)
