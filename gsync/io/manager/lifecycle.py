"""Relay lifecycle (seed 001, "Connection Lifecycle" and "Sync Entry Points"): discover,
connect through the handshake pool, fresh start or quick reconnect, retire.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import random

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol import precise
from ...protocol.nip11 import RelayLimits
from ...sync import filter_plan, status
from ...sync.health import classify_refusal, refuses_a_shape
from ...sync.pending import BatchKind, PageCap
from ...sync.policy import CoveragePauses
from ...sync.relay_state import ConnectionStatus, RelayState
from ...sync.repos import owner_of
from ...sync.shard import OTHER_SHARD_LEAD
from ...sync.status import Fact
from ...sync.targets import PendingItems, compute_actions, relay_needs
from ..inbox import (
    HandshakeDone,
    HandshakeStarted,
    ImpreciseIgnored,
    ProbeRefused,
    ProbeWanted,
    RelayDisconnected,
)
from .coverage import member_filters, sync_filters
from .effects import unsubscribe

log = get_logger("gsync.manager")

LAYER1_LIVE_SUB = "l1-live"


def move_status(state: RelayState, fact: Fact) -> None:
    """``state``'s status after ``fact`` (``sync.status.TRANSITIONS``). A move the table
    does not have is a bug: logged, the status left as it was; raised where
    GSYNC_STRICT_STATUS=1 (the tests)."""
    try:
        status.move(state, fact)
    except status.IllegalMove as exc:
        if os.environ.get("GSYNC_STRICT_STATUS") == "1":
            raise
        log.error("illegal_status_move", relay=state.url, status=exc.status.name, fact=exc.fact.value)


class RelayLifecycle:
    """Which relays are registered, dialled, in session and retired. Owns the relays
    already told they are past ``max_relays`` and whether the manager is stopping (no
    handshake is applied then). Registers into ``relays`` (with what ``saved`` kept of
    each), dials through ``handshakes`` when ``health`` allows, opens connections through
    ``effects`` (reading ``seen`` and ``delivery``'s room); a session's work goes to
    ``live`` and ``historic``, built from ``repos``; what a session leaves goes to
    ``recovery`` and ``lead``; a rate-limited handshake is shown by ``refusals``."""

    def __init__(self, *, config, relays, repos, saved, health, handshakes, live, historic, refusals,
                 recovery, lead, seen, delivery, effects, clock):
        self.config = config  # [cluster] shard, [network] max_relays, [auth] key
        self.relays = relays
        self.repos = repos
        self.saved = saved
        self.health = health
        self.handshakes = handshakes
        self.live = live
        self.historic = historic
        self.refusals = refusals
        self.recovery = recovery
        self.lead = lead
        self.seen = seen
        self.delivery = delivery
        self.effects = effects
        self.clock = clock
        self.capped_relays: set[str] = set()  # over [network] max_relays, already logged
        # Handshake attempts and sessions are numbered across relays, never again in the
        # process: a relay retired and registered again starts a new RelayState, and what
        # its earlier registration left in flight (a handshake, a connection's messages)
        # must not match it.
        self.serials = itertools.count(1)
        self.stopping = False
        # What a retired relay refused by policy (its paused coverage), until its probes are
        # due, ``RETIRED_HEALTH_MAX`` relays at most: listed again meanwhile, it is not asked
        # again what it refused (seed 615 of --own-full 1: a relay asked for lost repositories
        # was retired as its layer 1 waited for a full disk, listed again a minute later, and
        # asked a refused #q at once, four times)
        self.retired_pauses: dict[str, CoveragePauses] = {}

    def shut_down(self) -> None:
        """The manager stops: no handshake is applied any more, every connection closes."""
        self.stopping = True
        for state in self.relays.values():
            if state.current.link is not None:
                self.effects.close(state.current.link, "shutting down")

    def register_relay(self, url: str) -> RelayState:
        """``url``'s state, registered (saved memory restored) if it was not yet; a
        throw-away refused state for another shard's relay or one past ``max_relays``."""
        state = self.relays.get(url)
        if state is None:
            if not self.config.cluster.shard.owns(url):
                # Another instance's relay ([cluster] shard): never registered, never dialled.
                return RelayState(url, refused_reason="another shard")
            if len(self.relays) >= self.config.network.max_relays:
                if url not in self.capped_relays:  # asked again every tick: say it once
                    self.capped_relays.add(url)
                    log.warning("relay_cap_reached", relay=url,
                                max_relays=self.config.network.max_relays)
                return RelayState(url, refused_reason="relay cap")
            state = self.relays[url] = RelayState(url)
            state.received_metric = metrics.EVENTS_RECEIVED.labels(url)
            now = self.clock()
            if self.health.readmit(url, now):  # retired lately: what holds its next dial back
                log.info("relay_health_kept", relay=url, failures=self.health.failures(url, now),
                         dead=self.health.is_dead(url, now),
                         next_dial_secs=round(self.health.next_attempt_at(url, now) - now))
            self.saved.restore(state, self.health)  # what an earlier process learnt of it
            kept = self.retired_pauses.pop(url, None)
            if kept is not None and not state.paused and kept.last_due() > now:
                state.paused = kept
            log.info("relay_registered", relay=url)
        return state

    def wanted(self, state: RelayState) -> bool:
        """A bootstrap relay, or one some repo lists (a ``derive_relay_targets`` target, read
        from the relay → repos listing). What a relay confirmed is work only while a repo
        still asks it of that relay: a relay no repository lists has none left (SPEC §8)."""
        return (state.is_bootstrap or bool(self.repos.repos_listing(state.url))
                or self.clock() < state.lost_until)

    def look_for_lost(self, lost: dict[str, frozenset[str]], now: float) -> None:
        """Once, the own relay's first read applied: ``lost`` (relay → the repositories it
        confirmed to an earlier process, ``SavedState.take_lost``) were announced on the own
        relay and are not any more (its database emptied or restored from an older copy
        while gsync was stopped, or before a restart). Nothing it shows lists those relays for
        them, and what they confirmed is not held any more: each starts fresh (at once if
        connected, else at its next connection, dialled for that alone if nothing else
        wants it), as its daily sync would. Its whole layer 1 brings their announcements,
        and one listing our service goes to the own relay as any, bringing its repository
        back; their history is then not taken as confirmed."""
        for url in lost:
            state = self.register_relay(url)
            if state.refused_reason:
                continue  # another shard's, or past max_relays
            state.lost_until = now + constants.LOST_LOOK_SECS
            state.announcements_synced = False  # a fresh start at its next connection
            if state.connected:
                self.fresh_start(state, now)
        if lost:
            log.info("lost_repositories_asked", relays=len(lost), repositories=len(set().union(*lost.values())))

    def own_relay_lost(self, now: float) -> None:
        """The own relay, back from an outage, lost events it had stored (``sync.own_witness``):
        how many, and from when, is unknown. Every relay starts fresh (at once if connected,
        else at its next connection), as its daily sync would: NIP-77 moves only what the own
        relay lacks, REQ pages bring everything again (``duplicate`` where it is held)."""
        started = 0
        for state in self.relays.values():
            if state.refused_reason:
                continue
            state.announcements_synced = False  # a fresh start at its next connection
            if state.connected:
                self.fresh_start(state, now)
                started += 1
        log.info("relays_started_fresh", reason="own relay lost events", connected=started,
                 relays=len(self.relays))

    def connect_due_relays(self, now: float) -> None:
        listed = self.repos.listed_relays()
        if not self.relays.keys() >= listed:  # (a set comparison in C: on most ticks every one is)
            for url in list(listed):
                if url not in self.relays:
                    self.register_relay(url)
        if self.capped_relays:  # said once per relay while it waits for room, not for ever
            self.capped_relays.intersection_update(listed)
        disconnected = ConnectionStatus.DISCONNECTED  # (most are connected: picked out at every tick)
        for state in [s for s in self.relays.values() if s.status is disconnected and not s.refused_reason]:
            if not self.wanted(state):
                continue
            if self.health.should_attempt_connection(state.url, now):
                state.attempt = next(self.serials)
                move_status(state, Fact.DIALLED)
                self.handshakes.request(state.url, state.attempt)

    def retire_unwanted_relays(self) -> None:
        """A relay with no work leaves every table, connected or not (dead, refused,
        never reached): its state, health, recovery, saved memory and metric series, so
        tables follow the work and never uptime, and ``max_relays`` counts relays with work
        (SPEC §8). A connected one first finishes what it has pending."""
        if self.relays.keys() <= self.repos.listed_relays():
            return  # every one is listed (a set comparison in C: on most ticks none goes)
        for state in list(self.relays.values()):
            if self.wanted(state) or (state.connected and state.current.pending):
                continue
            log.info("relay_retired", relay=state.url, connected=state.connected)
            if state.current.link is not None:
                self.effects.close(state.current.link, "no work left")
            move_status(state, Fact.RETIRED)
            self.end_session(state)
            del self.relays[state.url]
            self.health.retire(state.url, self.clock())  # (what holds its next dial back stays a while)
            self.keep_pauses(state)
            self.recovery.forget(state.url)
            self.saved.forget(state.url)
            metrics.forget_relay(state.url)

    def keep_pauses(self, state: RelayState) -> None:
        """``state`` retired: its paused coverage is kept until its probes are due (the
        oldest retirement going first past ``RETIRED_HEALTH_MAX``)."""
        kept = self.retired_pauses
        kept.pop(state.url, None)
        now = self.clock()
        if state.paused and state.paused.last_due() > now:
            kept[state.url] = state.paused
        for url in [u for u, pauses in kept.items() if pauses.last_due() <= now]:
            del kept[url]
        while len(kept) > constants.RETIRED_HEALTH_MAX:
            del kept[next(iter(kept))]

    def on_handshake_started(self, msg: HandshakeStarted) -> None:
        if msg.relay in self.relays:  # not one retired meanwhile: it would be tracked again
            self.health.record_attempt_started(msg.relay, self.clock())

    def on_handshake_done(self, msg: HandshakeDone) -> None:
        state = self.relays.get(msg.relay)
        now = self.clock()
        if state is None or msg.attempt != state.attempt or self.stopping:
            if msg.ws is not None:
                msg.ws.close()
            return
        if msg.ws is not None and msg.ws.peer_closed():  # closed since: no session on it, a retry
            msg.ws.close()
            msg.error = "socket closed before the manager applied the handshake"
        if msg.error:
            self.handshake_failed(state, msg, now)
        else:
            self.begin_session(state, msg, now)

    def handshake_failed(self, state: RelayState, msg: HandshakeDone, now: float) -> None:
        """Back to Disconnected: refused for good (SSRF guard), parked, or a failure the
        backoff counts; a rate-limit answer holds the redial until its cooldown."""
        metrics.CONNECTION_ATTEMPTS.labels(msg.relay, "failure").inc()
        move_status(state, Fact.HANDSHAKE_FAILED)
        state.last_error = msg.error
        if msg.refused:
            state.refused_reason = msg.error
            log.warning("relay_refused", relay=msg.relay, reason=msg.error)
        else:
            self.health.record_failure(msg.relay, now, permanent=msg.permanent)
            log.info("relay_connect_failed", relay=msg.relay, reason=msg.error)
            if msg.permanent:
                log.warning("relay_parked", relay=msg.relay, reason=msg.error, kind=msg.permanent,
                            park_secs=constants.PERMANENT_FAILURE_PARK_SECS)
        if msg.rate_limited:  # no redial before the cooldown, nor before it asked
            self.health.record_rate_limited(msg.relay, now, query_rate=False, at_least=msg.retry_after)
            log.warning("relay_rate_limited", relay=msg.relay, text=msg.error,
                        cooldown_secs=round(self.health.cooldown_remaining(msg.relay, now)))
            self.refusals.update_health_metric(state, now)

    def begin_session(self, state: RelayState, msg: HandshakeDone, now: float) -> None:
        """A new session on the handshake's socket (its limits lowered by what the relay
        taught us), then a fresh start or a quick reconnect (seed 001)."""
        metrics.CONNECTION_ATTEMPTS.labels(msg.relay, "success").inc()
        self.health.record_success(msg.relay, now)
        state.session = next(self.serials)
        limits = self.with_learned_limits(state, msg.limits)
        probe = (not state.precise_queries and msg.limits is not None and precise.may_limit(msg.limits.software)
                 and bool(self.repos.repos_listing(state.url)))
        state.begin_session(
            *self.effects.connection(msg.relay, msg.ws, state.session, auth_secret=self.config.auth.secret_key,
                                     seen=self.seen, room=self.delivery.room_for(msg.relay), probe=probe),
            limits=limits,
            page_cap=PageCap(page_limit=filter_plan.page_limit(limits.max_limit)),  # learnt again: the relay may have changed
        )
        self.ask_precisely(state)
        if reason := nip77_barred(state, now):
            self.historic.disable_negentropy(state, reason, expected=True)
        move_status(state, Fact.HANDSHAKE_DONE)
        fresh = state.should_fresh_start(now)
        log.info("relay_connected", relay=msg.relay, fresh_start=fresh)
        if fresh:
            if state.daily_near(now):
                self.start_day(state, now)  # this fresh start is the daily's: not run again minutes later
            self.fresh_start(state, now)
        else:
            self.quick_reconnect(state, now)
        self.historic.fetch_waiting_refetches(state)
        state.last_connected = now
        state.disconnected_at = None
        if state.next_daily_at is None:
            state.next_daily_at = now + random.uniform(constants.DAILY_MIN_SECS, constants.DAILY_MAX_SECS)

    def listing_authors(self, url: str) -> set[str]:
        """The owners of the repositories listing ``url``: what a precise layer 1 asks there."""
        return {owner for owner in map(owner_of, self.repos.repos_listing(url)) if owner}

    def ask_precisely(self, state: RelayState) -> None:
        """A relay answering only precise queries has its session's book make them so, with
        the owners of the repositories listing it now (at each session and fresh start); one
        that refused filters that may bring notes, its tag and ids filters only, without them
        (``precise.NOTES_EXCLUDED``); one that does both, both."""
        book = state.current.book
        if state.precise_queries:
            book.precise_authors = frozenset(self.listing_authors(state.url))
        elif state.precise_refused:
            book.precise_authors = frozenset()  # (its kinds filters were not refused: as they are)
        else:
            book.precise_authors = None  # (a refusal of notes forgotten: ``start_day``)
        book.precise_kinds = precise.NOTES_EXCLUDED if state.precise_refused else precise.PRECISE_KINDS
        book.precise_ids = state.precise_refused

    def new_precise_authors(self, state: RelayState) -> bool:
        """A relay answering only precise queries is asked announcements by the owners of the
        repositories listing it: has one listing it anew someone new as its owner? Then its
        sync starts again with that owner asked too (``fresh_start``), not at the next daily
        (the simulator's seed 5 of a year with --precise-only: an owner's second repository,
        announced there alone, waited for it)."""
        known = state.current.book.precise_authors
        return state.precise_queries and known is not None and not self.listing_authors(state.url) <= known

    def on_probe_wanted(self, msg: ProbeWanted) -> None:
        """An imprecise REQ came back with nothing from a relay that may answer those so: the
        precise probe goes as the relay's next paced start (``HistoricSync.pump``)."""
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None or state.precise_queries:
            return
        turn = state.precise_probes - 1 if msg.again else state.precise_probes  # (again: the same filter)
        chosen = precise.probe_turn(precise.probe_sources(msg.filters, self.listing_authors(state.url)), turn)
        state.current.probe_source, made = chosen[0] if chosen else (None, None)
        state.current.probe = [made] if chosen else None
        state.precise_probes = turn + 1
        self.historic.pump(state)

    def on_probe_refused(self, msg: ProbeRefused) -> None:
        """The relay refused the precise probe. Refused for its shape (a policy, said so), the
        shape of the filter the probe was made from (``Session.probe_source``) is paused
        there, as a REQ of that shape refused alone would pause it: a relay answering only
        precise queries refuses that shape only when asked it precisely, and gsync's
        imprecise REQs asking it (answered with nothing) went on (the simulator's seed 2501
        of a 50-relay world, ``refused_asked_again``)."""
        state = self.relays.in_session(msg.relay, msg.session)
        source = state.current.probe_source if state is not None else None
        if source is None:
            return
        reason = f"{msg.prefix}: {msg.text}"[:200]
        if refuses_a_shape(classify_refusal(msg.prefix, msg.text), reason):
            self.refusals.pause_coverage(state, source, reason)

    def on_imprecise_ignored(self, msg: ImpreciseIgnored) -> None:
        """The relay answered an imprecise REQ with nothing and a precise probe with
        something (``protocol.precise``): from now on (this session and the next, saved) it
        is asked precise filters only, and its sync starts again so."""
        state = self.relays.get(msg.relay)
        if state is None or msg.session != state.session or state.current.link is None or state.precise_queries:
            return
        state.precise_queries = True
        self.fresh_start(state, self.clock())  # (asked precisely from now: ``ask_precisely``)
        log.warning("relay_answers_only_precise_queries", relay=state.url,
                    authors=len(state.current.book.precise_authors))

    def on_imprecise_refused(self, state: RelayState) -> None:
        """The relay refused a filter that may bring notes without naming authors, and served
        it without them (``protocol.precise``: khatru's AntiSyncBots): from now on (saved) its
        tag and ids filters ask NIP-34's kinds but notes, and its sync starts again so."""
        state.precise_refused_at = self.clock()
        self.fresh_start(state, self.clock())  # (asked so from now: ``ask_precisely``)

    def on_relay_disconnected(self, msg: RelayDisconnected) -> None:
        state = self.relays.get(msg.relay)
        if state is None or msg.session != state.session or state.current.link is None:
            return
        now = self.clock()
        log.info("relay_disconnected", relay=msg.relay, reason=msg.reason)
        # Said with status 1009, or twice in a row without a word (one such hang-up may be
        # any other outage that came at that moment).
        state.silent_long_hangups = state.silent_long_hangups + 1 if msg.sent_too_long and not msg.said_too_big else 0
        if msg.said_too_big or state.silent_long_hangups >= 2:
            self.learn_message_length(state, msg.sent_too_long)
            state.silent_long_hangups = 0
        move_status(state, Fact.CONNECTION_LOST)
        state.disconnected_at = now
        state.last_connected = now
        state.last_error = msg.reason
        self.end_session(state)
        self.recovery.cancel_attempt(msg.relay)  # its batch is gone: not left in flight
        self.health.record_disconnect(msg.relay, now, misbehaved=msg.misbehaved)

    def end_session(self, state: RelayState, keep_connection: bool = False) -> None:
        """The relay's session is over (``RelayState.end_session``): its batches are
        abandoned, what they claimed and did not get goes to the relays that skipped it,
        and batches of other relays that waited for them stop waiting."""
        batches = list(state.current.pending.values())
        for batch in batches:
            self.historic.release_claims(state, batch)
            self.lead.forget((state.url, batch.batch_id))
        state.end_session(keep_connection)
        for batch in batches:
            self.historic.release_followers(self.lead.done((state.url, batch.batch_id)))

    def apply_dirty(self, dirty: set[str]) -> None:
        """New work for the relays whose targets changed; new relays get dialled. The cost
        follows the dirty relays' repos (a purgatory answer must not walk every repo)."""
        states = [self.register_relay(url) for url in dirty]
        for state in states:
            self.recompute(state, since=None)
        if any(s.status is ConnectionStatus.DISCONNECTED and not s.refused_reason for s in states):
            self.connect_due_relays(self.clock())  # now, not at the next maintenance tick

    def drop_repos(self, dropped: dict[str, set[str]]) -> None:
        """Repositories the index no longer holds (a purgatory announcement never accepted,
        past its window: ``RepoSyncIndex.expire_state_only_repos``; address → the relays it
        listed): no relay owes them any more. They leave each relay's confirmed and pending
        items, so that nothing rebuilds their coverage, and a connected relay's live
        coverage is rebuilt without them (``LiveCoverage.consolidate``). A relay left with
        no work is retired by the next ``retire_unwanted_relays``."""
        by_relay: dict[str, set[str]] = {}
        for address, relays in dropped.items():
            for url in relays:
                by_relay.setdefault(url, set()).add(address)
        for url, addresses in by_relay.items():
            state = self.relays.get(url)
            if state is None:
                continue
            held = [state.confirmed, *(b.items for b in state.current.pending.values())]
            if not any(a in items.repos for items in held for a in addresses):
                continue
            for items in held:
                for address in addresses:
                    items.repos.pop(address, None)
            log.info("repos_dropped", relay=url, repos=len(addresses), connected=state.connected)
            if state.connected and state.current.data_live_subs() and self.wanted(state):
                self.live.consolidate(state)  # (one left with no work is retired, not rebuilt)
        self.apply_dirty(set(by_relay))

    def learn_message_length(self, state: RelayState, sent: int) -> None:
        """The relay hung up just after a message ``sent`` bytes long: its read limit, most
        likely. Later sessions send messages of half that at most (REQs packed and filters
        chunked within it, NIP-77 frames too), never less than MIN_LEARNED_MESSAGE_BYTES:
        sent again at every reconnect, the same message would never get through."""
        allowed = max(constants.MIN_LEARNED_MESSAGE_BYTES, sent // 2)
        if allowed >= filter_plan.req_length_limit(state.current.limits):  # the session's: learnt ones in
            return
        state.max_message_learned = allowed
        log.warning("message_length_lowered", relay=state.url, max_message_length=allowed, sent=sent)

    @staticmethod
    def with_learned_limits(state: RelayState, limits):
        """The session's limits: what the relay published, lowered by what it taught us
        (in earlier sessions, or before a restart). A relay that published none has what
        gsync assumes (``RelayLimits()``, as ``nip11_fetch`` gives it), and is taught the same:
        a session's limits are never None (``Refusals.learn_*`` lower them)."""
        if limits is None:
            limits = RelayLimits()
        learned = state.max_message_learned
        if learned is not None and learned < filter_plan.req_length_limit(limits):
            limits = dataclasses.replace(limits, max_message_length=learned)
        if state.max_filters_learned is not None and (
                limits.max_filters is None or state.max_filters_learned < limits.max_filters):
            limits = dataclasses.replace(limits, max_filters=state.max_filters_learned)
        budget = filter_plan.SubscriptionBudget.from_limits(limits).max_subscriptions
        if state.max_subscriptions_learned is not None and state.max_subscriptions_learned < budget:
            limits = dataclasses.replace(limits, max_subscriptions=state.max_subscriptions_learned)
        if state.max_values_learned is not None:
            limits = dataclasses.replace(limits, max_values=state.max_values_learned)
        return limits

    def run_daily(self, now: float) -> None:
        """A connected relay's daily sync is due (a random 20-28 h after the last): a fresh
        start on the same connection."""
        for state in self.relays.values():
            if state.next_daily_at and now >= state.next_daily_at and state.connected:
                self.start_day(state, now)
                if not nip77_barred(state, now):
                    # NIP-77 turned off on this connection (a NOTICE, a rate-limit episode)
                    # is tried again: a connection that lasts days kept it off for good, and
                    # what only NIP-77 reaches (a relay ignoring until) never came (seed 523)
                    self.allow_negentropy(state)
                self.fresh_start(state, now)

    def end_ids_rest(self, state: RelayState, now: float) -> None:
        """A connected relay's day of REQ pages after it advertised ids and served none of
        them by id (``RelayState.ids_unserved_at``) is over: if batches left what REQ pages
        cannot reach there (``unreached``), a fresh start asks it by NIP-77 now. The day ends
        23-25 h before the next daily sync comes, so that sync fell inside it half the time,
        and the next one brought it: the simulator's seed 2109 of a stress world, an import
        of 158 events on a relay ignoring ``until``, 2.6 days late (its daily sync came 36 s
        before the rest ended)."""
        unserved_at = state.ids_unserved_at
        if unserved_at is None or now - unserved_at < constants.IDS_UNSERVED_RETRY_SECS or not state.connected:
            return
        state.ids_unserved_at = None
        if state.unreached and not nip77_barred(state, now) and not self.health.limits_query_rate(state.url):
            log.info("ids_unserved_rest_over", relay=state.url)
            self.fresh_start(state, now)

    def end_nip77_rests(self, now: float) -> None:
        """A connected relay's day of rest from NIP-77 (advertised and not served) is over:
        its connection tries NIP-77 again, as a new session would, and if batches left what
        REQ pages cannot reach there (``RelayState.unreached``: an import on a relay ignoring
        ``until``), a fresh start runs now rather than at the next daily sync (seed 707 of the stress
        mix: an import waited from 50 minutes before the rest ended to the next daily). The day
        of REQ pages after ids unserved ends alike (``end_ids_rest``)."""
        for state in self.relays.values():
            self.end_ids_rest(state, now)
            failed_at = state.nip77_failed_at
            if failed_at is None or now - failed_at < constants.NIP77_RETRY_SECS or not state.connected:
                continue
            state.nip77_failed_at = None
            if nip77_barred(state, now) or self.health.limits_query_rate(state.url):
                continue  # (or NIP-77 is off for this session by the reactive gate: SPEC §5)
            # (a session begun after the rest ended tried NIP-77 already; what the rest left
            # unreached, its quick reconnect does not ask again: the fresh start below does)
            self.allow_negentropy(state)
            log.info("negentropy_rest_over", relay=state.url, fresh_start=state.unreached)
            if state.unreached:
                self.fresh_start(state, now)

    def allow_negentropy(self, state: RelayState) -> None:
        """NIP-77 may be tried again on ``state``'s connection, as in a new session."""
        state.current.negentropy_ok = True
        self.health.allow_negentropy(state.url)

    @staticmethod
    def start_day(state: RelayState, now: float) -> None:
        """A relay's daily fresh start (or a fresh start at reconnect shortly before it):
        the next one a random 23-25 h later, and what was unservable there asked again; live
        drops last seen a month ago or more are forgotten, and so is a refusal of notes found
        a month ago or more (``constants.NOTES_REFUSAL_REMEMBERED_SECS``: asked with them
        again, a relay still refusing them is found so again, a relay that stopped is not
        asked without them for good). A
        subscription cap learnt a week ago or more is forgotten: the relay's next session
        opens up to what its NIP-11 says (or the default) and learns it again if refused
        (``constants.LEARNT_CAP_SECS``); a cap on a filter's values likewise."""
        state.next_daily_at = now + random.uniform(constants.DAILY_MIN_SECS, constants.DAILY_MAX_SECS)
        log.info("daily_sync", relay=state.url)
        state.unservable.clear()  # asked again: it may be served now
        state.filters_answered = False  # (software changes: its answers are judged again)
        state.filters_proof_asked = False
        state.filters_reach = 0
        state.reach_proof_asked = False
        state.reach_proof_slow = 0
        state.values_reach, state.values_empty, state.values_seed, state.values_proof_asked = 0, 0, None, False
        if state.live_dropped_at is not None and now - state.live_dropped_at >= constants.LIVE_DROPS_REMEMBERED_SECS:
            state.live_dropped_at = None
        if state.precise_refused and now - state.precise_refused_at >= constants.NOTES_REFUSAL_REMEMBERED_SECS:
            log.info("relay_notes_asked_again", relay=state.url)
            state.precise_refused_at = None
        learnt_at = state.subscriptions_learned_at
        if state.max_subscriptions_learned is not None and (
                learnt_at is None or now - learnt_at >= constants.LEARNT_CAP_SECS):
            log.info("subscription_cap_forgotten", relay=state.url, max_subscriptions=state.max_subscriptions_learned)
            state.max_subscriptions_learned = state.subscriptions_learned_at = None
        if state.max_values_learned is not None and (
                state.values_learned_at is None or now - state.values_learned_at >= constants.LEARNT_CAP_SECS):
            log.info("values_cap_forgotten", relay=state.url, max_values=state.max_values_learned)
            state.max_values_learned = state.values_learned_at = None

    def fresh_start(self, state: RelayState, now: float) -> None:
        """The relay's sync starts again from nothing on its live connection (its daily
        sync, a handshake's, or any other: ``Fact.FRESH_START``). It is syncing until its
        batches end: its completion (``HistoricCompletion``) then dates it, and the hourly
        live look counts from that (before, only the daily sync moved the status: any other
        fresh start left it Connected, never completed, and the looks stopped until the next
        day; the simulator's seed 903 of a 20-relay world, a reaction on a relay dropping
        live subscriptions came 5 h late)."""
        move_status(state, Fact.FRESH_START)
        # It runs on a live connection: close every subscription it abandons, historic ones
        # included (a NIP-77 exchange closes itself when it ends).
        for sub_id in list(state.current.book.subscriptions):
            unsubscribe(self.effects, state.current, sub_id)
        self.end_session(state, keep_connection=True)
        state.new_members |= state.reopen_members  # their whole history too, on the next tick
        state.reopen_members = set()
        state.clear_confirmed()
        if state.current.negentropy_ok:
            state.unreached = False  # (what was left is reached now, or marked again)
        self.recovery.forget(state.url)  # the full history below finds whatever is missing
        state.historic_sync_completed_at = None
        self.ask_precisely(state)  # (the owners of the repositories listing it now: each day)
        with self.pump_held(state):
            self.subscribe_layer1(state, since=None)
            self.recompute(state, since=None)

    def quick_reconnect(self, state: RelayState, now: float) -> None:
        since = int(state.last_connected or now) - constants.RECONNECT_OVERLAP_SECS
        with self.pump_held(state):
            self.subscribe_layer1(state, since=since)
            if state.confirmed:
                # Confirmed items stay confirmed; their live filters come back and the gap
                # is fetched with since.
                self.start_sync(state, state.confirmed.copy(), since=since, confirm=False)
            self.reopen_members(state, since)
            self.recompute(state, since=None)

    def reopen_members(self, state: RelayState, since: int) -> None:
        """The thread members of the last session (or process): their descendants' live
        coverage again, and what came since (as for confirmed items: not their whole
        history again)."""
        if not state.reopen_members:
            return
        ids, state.reopen_members = state.reopen_members, set()
        state.current.members |= ids
        filters = member_filters(state, ids)
        self.live.open_members(state, filters)
        self.historic.start(state, PendingItems(), [f.replace(since=since) for f in filters])

    @contextlib.contextmanager
    def pump_held(self, state: RelayState):
        """Build a (re)connection's batches, then start them: queued together, layer 1
        and the AddFilters after it share REQs (one paced start less per connection)."""
        state.current.pump_held = True
        try:
            yield
        finally:
            state.current.pump_held = False
        self.historic.pump(state)

    def recompute(self, state: RelayState, since: int | None) -> None:
        """derive_relay_targets → compute_actions → start_sync, for one connected relay."""
        if not state.connected:
            return
        if state.precise_queries and self.new_precise_authors(state):
            self.fresh_start(state, self.clock())  # (its own recompute asks the rest)
            return
        targets = {state.url: relay_needs(self.repos, state.url)}
        pending = {state.url: [b.items for b in state.current.pending.values()]}
        confirmed = {state.url: state.confirmed}
        for action in compute_actions(targets, pending, confirmed, {state.url}):
            items = action.items
            if since is None:
                self.take_threads_ahead(state, items)
            if items:
                self.start_sync(state, items, since=since)

    def take_threads_ahead(self, state: RelayState, items: PendingItems) -> None:
        """New roots of ``items`` whose threads a batch of this session reconciled before
        they were known (``batch_end.cover_threads_ahead``; live coverage opened then):
        no sync of their own, they confirm with that batch (or are confirmed, that batch
        done). They leave ``items``."""
        taken = state.current.threads_ahead.take(items.root_events, self.clock())
        for root, batch_id in taken.items():
            batch = state.current.pending.get(batch_id)
            (batch.items if batch is not None else state.confirmed).root_events.add(root)
        if taken:
            items.root_events -= taken.keys()
            log.debug("threads_ahead_taken", relay=state.url, roots=len(taken))

    def subscribe_layer1(self, state: RelayState, since: int | None) -> None:
        live = filter_plan.layer1_filter().replace(limit=0)
        if not state.paused.is_filter_paused(live):
            self.live.open(state, LAYER1_LIVE_SUB, [live], control=True)
        self.historic.start(state, PendingItems(), [filter_plan.layer1_filter(since)], kind=BatchKind.LAYER1)

    def start_sync(self, state: RelayState, items: PendingItems, since: int | None, confirm=True) -> None:
        """Live and historic subscriptions for new items (``handle_new_sync_filters``).

        A first sync (no ``since``) that NIP-77 could serve goes in two batches when other
        relays already lead some of its items (``sync.lead``): one leading the rest, one
        waiting for those leaders; in one, when a leader's relay has too much queued for a
        wait to pay (``sync.method.follower_wait``). With shards, what another shard leads
        (``split_led_elsewhere``) goes in a batch of its own that waits for that shard's
        events to reach the own relay."""
        filters = sync_filters(state, items, since)
        if not filters:
            return
        leaders = ()
        if confirm and since is None and self.historic.use_negentropy(state, filters):
            mine, theirs, leaders = self.lead.split(state.url, items)
            if theirs:  # follow the leaders soon enough to wait for; lead the rest too
                follow = self.historic.plan.leaders_to_follow(state, items, leaders,
                                                             lambda i: sync_filters(state, i, since))
                mine, theirs, leaders = self.lead.split(state.url, items, follow=follow.__contains__)
            mine, elsewhere = self.split_led_elsewhere(state, mine)
            too_slow = bool(theirs) and self.historic.leaders_too_slow(
                state, theirs, leaders, sync_filters(state, theirs, since))
            if elsewhere or (theirs and not too_slow):
                if too_slow:  # as below: no wait, what the leaders bring priced in
                    mine.add(theirs)
                    split = ((mine, leaders), (elsewhere, (OTHER_SHARD_LEAD,)))
                else:
                    split = ((mine, ()), (theirs, leaders), (elsewhere, (OTHER_SHARD_LEAD,)))
                # the live filters are the parts' own: one copy of their values
                parts = [(part, sync_filters(state, part, since) if part else [], led_by)
                         for part, led_by in split]
                self.live.subscribe(state, filter_plan.live(f for _, fs, _ in parts for f in fs), items)
                for part, part_filters, led_by in parts:
                    if not part_filters or (led_by == (OTHER_SHARD_LEAD,)
                                            and self.historic.join_other_shard_wait(state, part)):
                        continue  # (joined the batch already waiting for another shard)
                    self.historic.start(state, part, part_filters, coalesce=True, leaders=led_by,
                                        go_now=too_slow and led_by is leaders)
                return
        self.live.subscribe(state, filter_plan.live(filters), items)
        # leaders too slow to wait for (``HistoricSync.start``): nothing to split
        self.historic.start(state, items if confirm else PendingItems(), filters, coalesce=True,
                            leaders=leaders, go_now=bool(leaders))

    def split_led_elsewhere(self, state: RelayState, items: PendingItems) -> tuple[PendingItems, PendingItems]:
        """(what this shard leads of ``items``, what another shard's relay leads:
        ``Shard.split_led_elsewhere``). One instance leads everything."""
        shard = self.config.cluster.shard
        if shard.count == 1:
            return items, PendingItems()

        def relays_of(address: str):
            needs = self.repos.get(address)
            return needs.relays if needs is not None else None

        roots = {}
        if items.root_events:
            for address in self.repos.repos_listing(state.url):
                needs = self.repos.get(address)
                roots.update(dict.fromkeys(needs.root_events & items.root_events, address))
        return shard.split_led_elsewhere(items, relays_of, roots.get)


def nip77_barred(state: RelayState, now: float) -> str | None:
    """Why a new session of ``state`` (a connection, or the daily fresh start on one) does
    not try NIP-77 (None: it does): its NIP-11 says it has none (no NEG-OPEN, no 15 s
    wait), or it said it has and did not serve it within a day."""
    nips = getattr(state.current.limits, "supported_nips", None)
    if nips and 77 not in nips:
        return "NIP-11 supported_nips does not list 77"
    if state.nip77_resting(now):
        return f"NIP-77 advertised and not served {round(now - state.nip77_failed_at)} s ago"
    return None
