"""Relays that refuse, throttle or go silent (SPEC §5): what the manager does about it.

- **Rate limits.** A ``rate-limited:`` / "too many" answer (NOTICE, CLOSED, OK, NEG-ERR)
  starts the 65 s cooldown; a repeat inside it changes nothing. Meanwhile nothing starts,
  live or historic (``LiveCoverage.pump`` and ``HistoricSync.pump`` ask the health
  tracker's gates, whose reactive gap then spaces every later start), and queued NIP-77
  exchanges become REQs: NIP-77 is off for the session. When it ends the relay is Probing,
  its queued work is re-derived — live REQs narrowed to what the index still wants, history
  in priority order — and the first request the relay serves lifts the state.
- **Subscription caps.** A CLOSED saying too many are open ("too many concurrent REQs")
  is a count, not a rate: the relay's cap is learnt from how many were open (never below
  ``MIN_SUBSCRIPTIONS``), live coverage is consolidated within it, and the refused REQ goes
  out again. One that cannot lower the cap further is read as a rate limit.
- **Policy refusals.** CLOSED ``blocked:``, ``restricted:``, ``unsupported:``/``invalid:``,
  and ``auth-required:`` that the connection could not answer (no key, or AUTH refused). A
  relay refuses a whole REQ for one filter, and judges its shape: the REQ is split into one
  REQ per shape (``sync.policy.by_shape``), each sent again through the gates, so the
  refused shape is asked once more, alone; a REQ of one shape refused pauses that shape on
  that relay (``sync.policy``), everything packed with it completes, one probe asks again
  after 24 h, and from then on the shape goes alone in any REQ. A tag or ids filter that may
  bring notes, refused alone, is asked once more without them (``protocol.precise``: khatru's
  AntiSyncBots): served so, it is asked once more as it was (``check_imprecise``: served, a
  refusal that ended meanwhile is no policy of the relay's, and the shape is restored);
  refused so again, every pause such a refusal explains is lifted, and the relay's sync
  starts again asking without notes (``imprecise_refused``). A session that ends first
  leaves its shapes to the next (``resume_kinds_probes``). A refusal worded about size
  ("too many filters", "filter too large") is split in halves instead. An
  ``auth-required:`` is about us, not a filter: every filter of the REQ is paused. Until a
  shape's verdict, the first live REQ asking it alone is its trial: other live REQs of that
  shape wait for its EOSE or CLOSED, at most ``REQ_STALL_SECS`` (``sync.policy.Trials``).
- **Any other CLOSED** of a live subscription: its replacement is rebuilt from the current
  index (obsolete items dropped) and the gap fetched with ``since``.
- **One filter a REQ, silently.** An answer one of its REQ's filters explains whole (or
  none) may come from a relay that answers one filter a REQ: its other filters are asked
  alone for their newest event (``sync.one_filter``); one answered so with an event the REQ
  did not bring, and the relay is asked one filter a REQ from now on (saved) and its sync
  starts again (``check_answer``).
- **Stalls.** A historic REQ with neither EOSE nor events for ``REQ_STALL_SECS`` is closed
  on the relay; one of several filters is split like a refusal, a single filter fails its
  batch into missing-event recovery, and its shape goes alone in later REQs of the session.
"""
from __future__ import annotations

import dataclasses

from ... import constants
from ...ops import metrics
from ...ops.logging import get_logger
from ...protocol import messages as wire
from ...protocol import precise
from ...protocol.filters import Filter
from ...sync import filter_plan, one_filter, start_queue, values_reach
from ...sync.health import HealthState, Refusal, classify_refusal, refuses_a_shape
from ...sync.pending import BatchKind, PageCap, PendingBatch
from ...sync.policy import by_shape, coverage_key, describe, halves
from ...sync.relay_state import RelayState
from ...sync.targets import PendingItems, derive_relay_targets
from ..inbox import CooldownEnded
from .coverage import member_filters, sync_filters
from .effects import unsubscribe
from .lifecycle import LAYER1_LIVE_SUB
from .live import live_groups

log = get_logger("gsync.manager")

KINDS_PROBE_AGAIN = 2  # kinds probes asked again after one went unanswered, a session
REACH_PROOF_SLOW_AGAIN = 2  # reach proofs asked again after a slow answer, a day (``reach_proof_answered``)
# A cap lowered on a NOTICE naming no REQ is not lowered on another within this (the same
# burst's refusals, read across the consolidation the first caused: ``learn_max_subscriptions``)
GUESSED_CAP_SETTLE_SECS = 5.0


class KindsProbe(tuple):
    """A probe's mark in ``RelaySession.probes`` (beside the paused shapes' coverage probes):
    the refused shape ``probe_kinds`` asks again without notes."""

    __slots__ = ()


class ImpreciseCheck(tuple):
    """A probe's mark in ``RelaySession.probes``: the refused shape whose kinds probe was
    served, asked once more as it was (``check_imprecise``)."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True)
class FiltersProbe:
    """A probe's mark in ``RelaySession.probes``: a filter of a suspect answer asked alone
    (``check_answer``), with what that answer brought and the filters still to ask;
    ``answers``: the filters a REQ the relay answers if this one brings what the answer
    lacked (1: the first, or the last, alone; more: the first or last few of a daily proof's)."""

    brought: frozenset[str]
    rest: tuple = ()
    answers: int = 1


@dataclasses.dataclass(frozen=True)
class ReachProof:
    """The mark in ``RelaySession.probes`` of the daily proof of a relay proven to answer
    several filters: ``ids``, one a filter, in the REQ's order (``Refusals.ask_filters_proof``)."""

    ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ValuesProof:
    """The mark in ``RelaySession.probes`` of a proof of how wide a list of tag values a
    relay reads (``sync.values_reach``): its seed asked among ``width`` values; served at
    ``served_at`` at most so far (0: not yet), not at ``unserved_at``."""

    seed: values_reach.ValuesSeed
    width: int
    served_at: int = 0
    unserved_at: int = 0
    slow: int = 0  # answers that came slowly (a time budget may have cut them), asked again


# The mark in ``RelaySession.probes`` of the REQ asking two events a relay holds in two
# filters (``Refusals.ask_filters_proof``)
FILTERS_PROOF = "filters proof"
CAPACITY = "capacity"  # too much open at once: not a rate, not a policy
SUBSCRIPTIONS = "subscriptions"  # too many open at once: the relay's cap, learnt


def _is_capacity_refusal(text: str) -> bool:
    """"active subscriptions exceed max size": too much open at once, not too fast."""
    lowered = text.lower()
    return "exceed" in lowered and ("size" in lowered or "max" in lowered)


def says_rate_limited(prefix: wire.Prefix, text: str) -> bool:
    return prefix is wire.Prefix.RATE_LIMITED or wire.is_rate_limit_text(text)


def refusal_of(closed: wire.Closed) -> Refusal | str:
    """What a CLOSED tells: SUBSCRIPTIONS, CAPACITY, or a ``Refusal`` (rate wording wins
    over a prefix)."""
    if wire.says_too_many_subscriptions(closed.text):
        return SUBSCRIPTIONS
    if _is_capacity_refusal(closed.text):
        return CAPACITY
    return classify_refusal(closed.prefix.value, closed.text)


class Refusals:
    """What the manager does when a relay refuses, throttles or goes silent. Its state is on
    each ``RelayState`` (pauses, learnt caps) and session (probes, stalled shapes), in
    ``relays``; the rate-limit episodes are in ``health``. What it sends again goes through
    ``live`` and ``historic`` (which ask it back: ``note_request_succeeded``,
    ``note_rate_limited``, ``probe_answered``); what a stall loses, to ``recovery`` (less
    what ``seen`` says arrived); the stall clocks stand still while ``delivery`` holds
    reading; ``repos`` says what is still wanted."""

    def __init__(self, *, relays, repos, health, live, historic, recovery, seen, delivery, effects, clock,
                 rejected=(),
                 on_pause=lambda: None, on_imprecise_refused=lambda state: None,
                 on_one_filter=lambda state: None):
        self.relays = relays
        self.repos = repos
        self.health = health
        self.live = live
        self.historic = historic
        self.recovery = recovery
        self.seen = seen
        self.rejected = rejected  # (ids the own relay refused: no proof asks them, ``ask_filters_proof``)
        self.delivery = delivery
        self.effects = effects
        self.clock = clock
        self.on_pause = on_pause  # a new pause: saved soon (``SavedState.save_soon``)
        # a filter refused for the notes it may bring: ``RelayLifecycle.on_imprecise_refused``
        self.on_imprecise_refused = on_imprecise_refused
        # a relay found answering one filter a REQ: its sync starts again (``RelayLifecycle.fresh_start``)
        self.on_one_filter = on_one_filter
        self.stall_checked_at = clock()  # historic REQs' clocks stand still while delivery holds reading

    # -- CLOSED ---------------------------------------------------------------------------

    def on_closed(self, state: RelayState, closed: wire.Closed, beside: int | None = None) -> None:
        """A CLOSED: the relay's, or one its connection made of a refusing NOTICE (``beside``:
        how many others were open when its REQ went, read before the connection closed it;
        for the relay's own, the book has it still)."""
        sub_id = closed.sub_id
        if sub_id not in state.current.sub_to_batch and sub_id not in state.current.live_subs:
            return  # already finished (some relays close an ids-only REQ after its EOSE)
        guessed = beside is not None  # (a NOTICE's REQ is the connection's guess)
        if not guessed:
            beside = state.current.book.open_beside.get(sub_id, 0)
        state.current.book.forget(sub_id)
        state.current.sub_activity.pop(sub_id, None)
        state.current.historic_sent_at.pop(sub_id, None)
        reason = f"{closed.prefix.value}: {closed.text}"[:200]
        if closed.prefix is wire.Prefix.NONE and not closed.text.strip():
            # no reason: how relays closing every subscription after its EOSE end each one
            # (a warning for each was hundreds a day); what follows is logged (``live_rebuilt``,
            # ``live_coverage_polled``)
            log.info("subscription_closed", relay=state.url, sub_id=sub_id, reason=reason)
        else:
            log.warning("subscription_closed", relay=state.url, sub_id=sub_id, reason=reason)
        kind = refusal_of(closed)
        if kind is SUBSCRIPTIONS and not self.learn_max_subscriptions(state, beside, guessed, closed.text):
            kind = Refusal.RATE_LIMIT  # we hold no more than the least we can work with
        if kind is SUBSCRIPTIONS:
            metrics.REFUSALS.labels("subscriptions").inc()
        elif kind is CAPACITY:
            metrics.REFUSALS.labels("capacity").inc()
        elif kind is Refusal.RATE_LIMIT:
            metrics.REFUSALS.labels("rate_limited").inc()
            self.note_rate_limited(state, closed.text)
        else:
            metrics.REFUSALS.labels(closed.prefix.value).inc()
        batch_id = self.historic.queue.ended(state, sub_id)
        if kind is Refusal.UNSUPPORTED and wire.says_too_many_filters(closed.text):
            self.learn_max_filters(state, sub_id, batch_id)
        if batch_id is not None:
            self.historic_closed(state, batch_id, sub_id, kind, reason)
        else:
            self.live_closed(state, sub_id, kind, reason)

    def note_served(self, state: RelayState, sub_id: str) -> None:
        """An EOSE: a shape under suspicion (``CoveragePauses.suspect``) served alone is
        cleared."""
        if not state.paused.suspects:
            return
        live = state.current.live_subs.get(sub_id)
        if live is not None:
            state.paused.served(live.filters)
            if sub_id in state.current.trials:
                self.live.pump(state)  # a verdict: live REQs of its shape that waited for it go
            return
        batch = state.current.pending.get(state.current.sub_to_batch.get(sub_id))
        if batch is not None:
            state.paused.served(start_queue.filters_of(batch, sub_id))

    def learn_max_filters(self, state: RelayState, sub_id: str, batch_id: int | None) -> None:
        """A REQ of n filters refused for "too many filters": from now on this session
        packs at most n // 2 to a REQ (its halves are sent again, split, as for any refused
        REQ of several filters), so that every later REQ is not refused and split too."""
        if batch_id is not None:
            batch = state.current.pending.get(batch_id)
            refused = len(start_queue.filters_of(batch, sub_id)) if batch is not None else 0
        else:
            live = state.current.live_subs.get(sub_id)
            refused = len(live.filters) if live is not None else 0
        if refused < 2:
            return
        allowed = max(1, refused // 2)
        if state.lower_max_filters(allowed):
            log.info("filters_per_req_lowered", relay=state.url, max_filters=allowed, refused=refused)

    def learn_max_values(self, state: RelayState, filters, reason: str) -> int | None:
        """A REQ refused for its size where a list of a filter is at fault (``policy.values_cap_after``:
        "too many values in filter", strfry's "total filter items too large", or a lone
        filter "too large"): the values a list may hold from now on, half its longest
        (``RelayState.learn_values_cap``); the caller sends the REQ again sliced within it.
        Filters are built within it from then on (``filter_plan.values_cap``), so a relay
        that caps a filter's values at 100 refuses a batch once, not every filter of it.
        Read as a shape's refusal, the filter was paused for a day: a relay capping values
        served no repository listed beside a hundred others. None: nothing to slice."""
        most, lowered = state.learn_values_cap(filters, reason, self.clock())
        if lowered:
            log.info("values_cap_lowered", relay=state.url, max_values=most, reason=reason)
        return most

    def learn_page_limit(self, state: RelayState, reason: str) -> bool:
        """A REQ refused for the ``limit`` its pages carry, saying the most it takes
        (nostream without NIP-11: "Limit too high: … less than or equal to 500"): this
        session's pages ask that (never below ``MIN_PAGE_CAP``), and the REQ goes again
        (True). False when that is no lower than what they ask already."""
        allowed = wire.limit_allowed(reason)
        cap = state.current.page_cap
        if allowed is None or filter_plan.page_limit(allowed) >= cap.page_limit:
            return False
        cap.page_limit = filter_plan.page_limit(allowed)
        log.info("page_limit_lowered", relay=state.url, limit=cap.page_limit)
        return True

    def learn_max_subscriptions(self, state: RelayState, beside: int = 0, guessed: bool = False,
                                text: str = "") -> bool:
        """A REQ refused for the number open ("too many concurrent REQs"): the relay holds
        as many as were open when it went (``beside``: its REQ was refused on arrival) or
        are open now (a relay ending an older one for a newer), whichever is more, whatever
        its NIP-11 says (or we assumed without one). The session's budget is lowered to
        that, and live coverage past it is consolidated into fewer REQs (what still does not
        fit is polled). False when the budget cannot go lower (it is there already, or at
        ``MIN_SUBSCRIPTIONS``): the refusal is read as a rate limit then, so that a REQ
        refused again and again cannot loop. (The number open now alone: a refusal read
        after a consolidation had closed several took the few left for the cap, 5 where
        the relay held 10, saved, and the live coverage past it polled every 10 s for as
        long as the session lasted: the simulator, seed 2 of 6 relays and 20 repositories.)
        ``guessed``: the refusal came in a NOTICE naming no REQ, taken for the last one sent.
        Within GUESSED_CAP_SETTLE_SECS of a cap such a NOTICE lowered, another is read as a
        rate limit: it is the same burst's, and the REQ it is taken for may have gone since,
        with fewer open beside it (the lowering closed and reopened the live REQs: seed 703
        of bench/README's per-filter world, a learnt cap judged again, 11 then 8 where the
        relay holds 10). A count the refusal names (``text``: "must be less than or equal to
        10") is the cap, whichever REQ it is read for, within what was open."""
        now = self.clock()
        session = state.current
        # (the refused REQ is forgotten already)
        open_now = max(beside, len(state.current.book.subscriptions))
        said = wire.subscriptions_allowed(text, open_now) if text else None
        if said is not None:
            open_now, guessed = said, False
        elif text and wire.subscriptions_allowed(text, 1 << 30) is not None:
            return False  # a cap above what was open beside the REQ it is read for (a NOTICE
            # of a burst, taken for a REQ sent since): nothing to learn, a rate limit
        elif guessed and session.cap_guessed_at is not None and now - session.cap_guessed_at < GUESSED_CAP_SETTLE_SECS:
            return False
        # (no NIP-11 document: what gsync assumed, lowered, ``with_learned_limits``; seed 82's
        # year, a relay capped at 10 read as rate-limited for as long as its connection lasted)
        limits = state.current.limits
        budget = filter_plan.SubscriptionBudget.from_limits(limits)
        allowed = max(filter_plan.MIN_SUBSCRIPTIONS, open_now)
        if allowed >= budget.max_subscriptions:
            return False
        state.current.limits = dataclasses.replace(limits, max_subscriptions=allowed)
        state.max_subscriptions_learned = allowed  # later sessions and restarts start there
        if guessed:
            session.cap_guessed_at = now
        state.subscriptions_learned_at = now  # (for a week: ``Lifecycle.start_day``)
        log.info("subscriptions_cap_lowered", relay=state.url, max_subscriptions=allowed,
                 was=budget.max_subscriptions)
        live = state.current.data_live_subs()
        if live > filter_plan.SubscriptionBudget(allowed).live_slots:
            self.live.consolidate(state)
        return True

    def historic_closed(self, state: RelayState, batch_id: int, sub_id: str, kind, reason: str) -> None:
        batch = state.current.pending.get(batch_id)
        if batch is None:
            return
        if isinstance(state.current.probes.get(batch_id), ValuesProof):
            # refused: no evidence, and its shape is the proof's own, no coverage to pause
            del state.current.probes[batch_id]
            start_queue.finish_subscription(batch, sub_id)
            self.historic.advance(state, batch)
            return
        filters = start_queue.filters_of(batch, sub_id)
        if kind not in (CAPACITY, SUBSCRIPTIONS, Refusal.RATE_LIMIT, Refusal.AUTH) and filters and (
                self.learn_page_limit(state, reason)):
            self.historic.queue.again_first(state, batch, sub_id, filters)  # asking less
            self.historic.pump(state)
            return
        if kind in (CAPACITY, SUBSCRIPTIONS, Refusal.RATE_LIMIT) and filters:
            # The same page again once the cooldown and the reactive gate allow it.
            self.historic.queue.again_first(state, batch, sub_id, filters)
            self.historic.pump(state)
            return
        if kind is Refusal.UNSUPPORTED and filters and (most := self.learn_max_values(state, filters, reason)):
            self.historic.queue.split_values_first(state, batch, sub_id, most)  # pages kept
            self.historic.pump(state)
            return
        if kind in (Refusal.POLICY, Refusal.UNSUPPORTED, Refusal.AUTH) and filters:
            about_shape = refuses_a_shape(kind, reason)
            if kind is Refusal.AUTH or len(filters) == 1 or (about_shape and len(by_shape(filters)) == 1):
                probed = state.current.probes.get(batch_id)
                if isinstance(probed, (ImpreciseCheck, KindsProbe)) and kind is Refusal.AUTH:
                    # about us, not the shape nor its notes: no verdict (its batch, ending
                    # unrefused, would have been taken for served); asked so again in the
                    # next session (``resume_kinds_probes``)
                    del state.current.probes[batch_id]
                    probed = None
                if isinstance(probed, ImpreciseCheck):
                    del state.current.probes[batch_id]  # refused as it was, served without notes
                    self.imprecise_refused(state)
                elif isinstance(probed, KindsProbe) and filters[0].kinds == precise.NOTES_EXCLUDED:
                    # (not another REQ of its batch: an id fetch of what NIP-77 found of it)
                    del state.current.probes[batch_id]  # refused without notes too: about the shape
                    state.paused.kinds_refused(tuple(probed))
                    log.info("coverage_kinds_refused", relay=state.url, coverage=describe(tuple(probed)),
                             reason=reason)
                    self.probe_kinds_of_paused(state)  # (another refused shape may tell)
                else:
                    for f in filters:
                        self.pause_coverage(state, f, reason, shape_at_fault=kind is not Refusal.AUTH)
                    if kind is not Refusal.AUTH:
                        self.probe_kinds(state, filters[0])
                start_queue.finish_subscription(batch, sub_id)  # not a failure: the relay will not serve it
            else:
                if about_shape:
                    state.paused.suspect(filters)
                self.split_historic(state, batch, sub_id, filters, shapes=about_shape)
        else:
            start_queue.on_closed(batch, sub_id)
            if batch_id not in state.current.probes:
                state.unrelated_failure = True
        self.historic.advance(state, batch)

    def split_historic(self, state: RelayState, batch: PendingBatch, sub_id: str, filters,
                       shapes: bool = False) -> None:
        """Send a refused or stalled REQ of several filters again as two, or as one per
        shape (``shapes``: a refusal of a shape), to find the one at fault (filters whose
        shape was paused meanwhile are left out)."""
        keep = [i for i, f in enumerate(filters) if not state.paused.is_filter_paused(f)]
        groups = ([[keep[j] for j in group] for group in by_shape([filters[i] for i in keep])]
                  if shapes else halves(keep))
        entries = self.historic.queue.split_first(state, batch, sub_id, groups)
        log.info("subscription_split", relay=state.url, sub_id=sub_id,
                 parts=[len(group) for _, group in entries])

    def live_closed(self, state: RelayState, sub_id: str, kind, reason: str) -> None:
        live = state.current.live_subs.pop(sub_id, None)
        if live is None:
            return
        if kind is CAPACITY:
            state.current.capacity_refused = True
            self.live.poll_instead(state, live.filters, fresh=live.fresh)
        elif kind is SUBSCRIPTIONS:
            # The cap is learnt (and coverage consolidated, if it had to be): again within it.
            if live.control:
                self.live.open(state, sub_id, live.filters, control=True)
            else:
                self.live.open_groups(state, [live.filters], descendants=live.descendants,
                                      fresh=int(live.fresh))
        elif kind is Refusal.RATE_LIMIT:
            # It waits out the cooldown in the live queue; the cooldown's end rebuilds it.
            state.current.live_subs[sub_id] = live
            state.current.live_queue.append(sub_id)
            self.live.pump(state)
        elif kind is Refusal.UNSUPPORTED and (most := self.learn_max_values(state, live.filters, reason)):
            pieces = [p for f in live.filters for p in filter_plan.within_values(f, most)]
            groups = live_groups(state, pieces)
            self.live.open_groups(state, groups, descendants=live.descendants, fresh=len(groups) if live.fresh else 0)
        elif kind in (Refusal.POLICY, Refusal.UNSUPPORTED, Refusal.AUTH):
            about_shape = refuses_a_shape(kind, reason)
            if kind is Refusal.AUTH or len(live.filters) == 1 or (about_shape and len(by_shape(live.filters)) == 1):
                for f in live.filters:
                    self.pause_coverage(state, f, reason, shape_at_fault=kind is not Refusal.AUTH)
                if kind is not Refusal.AUTH:
                    self.probe_kinds(state, live.filters[0].replace(limit=None))
                if sub_id in state.current.trials:
                    self.live.pump(state)  # a verdict: what waited for it is dropped (paused)
            else:
                keep = state.paused.allowed(live.filters)
                if about_shape:
                    state.paused.suspect(keep)
                    self.live.separate_queued(state)
                groups = [[keep[i] for i in group] for group in by_shape(keep)] if about_shape else halves(keep)
                self.live.open_groups(state, [group for group in groups if group])
        else:
            self.rebuild_live(state, sub_id, live)

    def rebuild_live(self, state: RelayState, sub_id: str, live) -> None:
        """A live REQ the relay closed (not for rate, policy or size): its replacement from
        the current index, and the gap fetched with ``since``. One closed again within a
        minute of its rebuild is polled instead: no REQ/CLOSED loop."""
        now = self.clock()
        filters = state.paused.allowed(filter_plan.restrict_to(live.filters, self.wanted_live_filters(state)))
        if not filters:
            return
        if live.rebuilt_at is not None and now - live.rebuilt_at < constants.LIVE_REBUILD_MIN_SECS:
            if not state.current.live_not_kept:
                state.current.live_not_kept = True
                if state.said_before("live_coverage_polled", "live subscriptions not kept"):
                    log.debug("live_coverage_polled", relay=state.url, reason="live subscriptions not kept")
                else:
                    log.warning("live_coverage_polled", relay=state.url, reason="live subscriptions not kept")
            self.live.poll_instead(state, filters)
            return
        log.info("live_rebuilt", relay=state.url, sub_id=sub_id, filters=len(filters))
        if live.control:
            self.live.open(state, sub_id, filters, control=True, rebuilt_at=now)
        else:
            self.live.open_groups(state, live_groups(state, filters), rebuilt_at=now)
        since = int(now) - constants.RECONNECT_OVERLAP_SECS
        self.historic.start(state, PendingItems(), [f.replace(limit=None, since=since) for f in filters])

    def wanted_live_filters(self, state: RelayState):
        """The live coverage the current index asks of this relay (policy pauses aside)."""
        targets = derive_relay_targets(self.repos).get(state.url) or PendingItems()
        targets.root_events |= state.current.threads_ahead.roots(self.clock())  # not roots yet
        wanted = filter_plan.live(sync_filters(state, targets, None, allowed_only=False)) if targets else []
        if state.current.members:
            wanted += filter_plan.live(member_filters(state, state.current.members, allowed_only=False))
        return wanted + [filter_plan.layer1_filter().replace(limit=0)]

    # -- policy pauses and their probe ------------------------------------------------------

    def pause_coverage(self, state: RelayState, f, reason: str, shape_at_fault: bool = True) -> None:
        key = coverage_key(f)
        if state.paused.pause(key, self.clock(), shape_at_fault=shape_at_fault):
            log.warning("coverage_paused", relay=state.url, coverage=describe(key), reason=reason,
                        probe_secs=constants.POLICY_PROBE_SECS)
            self.on_pause()
        metrics.PAUSED_COVERAGE.labels(state.url).set(len(state.paused))

    def run_policy_probes(self, now: float) -> None:
        for state in self.relays.values():
            if state.paused and state.connected:
                for key in state.paused.due_probes(now):
                    self.probe_coverage(state, key)
                self.resume_kinds_probes(state)

    def resume_kinds_probes(self, state: RelayState) -> None:
        """Paused shapes that may have been refused for the notes they may bring and have no
        verdict yet (``CoveragePauses.kinds_refused``) are suspects of every session, not
        only the one that saw them refused: a fresh start or a new connection ended the last
        one's probe (seed 9009 of a precise-only world: relay7, refusing notes, was found to
        answer one filter a REQ while the probe's check was queued; its sync started again
        and five shapes stayed paused a day). Each is asked without notes, one at a time
        (``probe_kinds``), once a session."""
        if state.precise_refused:
            return
        session = state.current
        unjudged = {key for key in state.paused.keys() if precise.shape_may_be_refused_for_kinds(*key)
                    and not state.paused.is_kinds_refused(key)} - session.kinds_suspects
        if unjudged:
            session.kinds_suspects |= unjudged
            self.probe_kinds_of_paused(state)

    def coverage_filters(self, state: RelayState, key):
        """Every historic filter of shape ``key`` the current index asks of this relay."""
        targets = derive_relay_targets(self.repos).get(state.url)
        filters = sync_filters(state, targets, None, allowed_only=False) if targets else []
        if state.current.members:
            filters += member_filters(state, state.current.members, allowed_only=False)
        filters.append(filter_plan.layer1_filter())
        return [f for f in filters if coverage_key(f) == key]

    def probe_coverage(self, state: RelayState, key) -> None:
        """One REQ, of one filter of the paused shape: served, the shape is restored."""
        filters = self.coverage_filters(state, key)
        if not filters:
            state.paused.probe_passed(key)  # nothing of that shape is wanted any more
            metrics.PAUSED_COVERAGE.labels(state.url).set(len(state.paused))
            return
        log.info("coverage_probe", relay=state.url, coverage=describe(key))
        batch = PendingBatch(self.historic.queue.batch_id(), PendingItems(), kind=BatchKind.PROBE)
        state.current.pending[batch.batch_id] = batch
        state.current.probes[batch.batch_id] = key
        self.historic.queue.add_reqs(state, batch, filters[:1])
        self.historic.pump(state)

    def probe_kinds(self, state: RelayState, f) -> None:
        """``f``, refused alone by policy, may have been refused for the notes it may bring
        (``precise.may_be_refused_for_kinds``): asked once more without them, one REQ (one
        such probe out at a time; a relay asked so already is not asked)."""
        if state.precise_refused or not precise.may_be_refused_for_kinds(f):
            return
        state.current.kinds_suspects.add(coverage_key(f))
        if (state.paused.is_kinds_refused(coverage_key(f))
                or any(isinstance(p, KindsProbe) for p in state.current.probes.values())):
            return
        batch = PendingBatch(self.historic.queue.batch_id(), PendingItems(), kind=BatchKind.PROBE)
        state.current.pending[batch.batch_id] = batch
        state.current.probes[batch.batch_id] = KindsProbe(coverage_key(f))
        log.info("coverage_kinds_probe", relay=state.url, coverage=describe(coverage_key(f)))
        self.historic.queue.add_reqs(state, batch, [precise.kinds_probe(f)])
        self.historic.pump(state)

    def probe_kinds_of_paused(self, state: RelayState) -> None:
        """The next paused shape that may have been refused for the notes it may bring, not
        asked without them yet this session: asked so (``probe_kinds``)."""
        for key in sorted(state.current.kinds_suspects, key=repr):
            if state.paused.is_paused(key) and not state.paused.is_kinds_refused(key):
                filters = self.coverage_filters(state, key)
                if filters:
                    self.probe_kinds(state, filters[0])
                    return

    def kinds_probe_answered(self, state: RelayState, key: KindsProbe, batch: PendingBatch) -> None:
        """The probe of ``probe_kinds`` was answered. Served, the relay may refuse filters
        that may bring notes without naming authors, or the refusal may have ended meanwhile
        (a policy of an hour): the shape is asked once more as it was (``check_imprecise``)."""
        if batch.failed_otherwise:
            # no answer is no yes; asked again, twice at most a session (its REQ may have
            # stalled beside others a NOTICE refused, naming none: seed 593 of own-relay faults
            # with --anti-sync-bots and --limit-refusals), then the shape stays paused
            state.current.kinds_probes_unanswered += 1
            if state.current.kinds_probes_unanswered <= KINDS_PROBE_AGAIN:
                self.probe_kinds_of_paused(state)
            return
        self.check_imprecise(state, tuple(key))

    def check_imprecise(self, state: RelayState, key) -> None:
        """``key``, refused, was served without notes: one REQ asks it once more as it was,
        one filter. Refused again, the relay refuses filters that may bring notes
        (``imprecise_refused``); served, with events or none, the refusal is over (a relay
        refusing notes refuses this: khatru's AntiSyncBots) and the shape restored
        (``probe_answered``); unanswered, asked again as a kinds probe is. Taken for the
        relay's at once before, a refusal of ``#a`` that ended before its kinds probe (the
        simulator's seed 4003, day 112.09: a policy of an hour) left that relay's notes
        unasked for ever (saved)."""
        filters = self.coverage_filters(state, key)
        if not filters:
            return  # nothing of it wanted now: no evidence either way (paused until its probe)
        batch = PendingBatch(self.historic.queue.batch_id(), PendingItems(), kind=BatchKind.PROBE)
        state.current.pending[batch.batch_id] = batch
        state.current.probes[batch.batch_id] = ImpreciseCheck(key)
        log.info("coverage_imprecise_check", relay=state.url, coverage=describe(key))
        self.historic.queue.add_reqs(state, batch, filters[:1])
        self.historic.pump(state)

    def imprecise_refused(self, state: RelayState) -> None:
        """The relay refuses filters that may bring notes without naming authors, and serves
        them without notes: every pause such a refusal explains is lifted, and the relay is
        asked so from now on (``RelayLifecycle.on_imprecise_refused``)."""
        # the shapes this session's refusals paused that may be about notes, but those refused
        # without them too (older pauses, a probe of their own tells, asked without notes now)
        explained = {key for key in state.current.kinds_suspects if not state.paused.is_kinds_refused(key)}
        lifted = state.paused.lift(explained.__contains__)
        metrics.PAUSED_COVERAGE.labels(state.url).set(len(state.paused))
        if any(key[2] for key in lifted):
            # its id fetches were refused for the same reason, not left unserved: NIP-77 again
            # (``batch_end.judge_ids_served``: seed 503 of the stress mix with --anti-sync-bots)
            state.ids_unserved_at = None
        log.warning("relay_refuses_imprecise_queries", relay=state.url, lifted=[describe(k) for k in lifted])
        self.on_imprecise_refused(state)

    # -- relays answering one filter a REQ ----------------------------------------------------

    def check_answer(self, state: RelayState, batch: PendingBatch, answer, slow: bool = False) -> bool:
        """A historic REQ's EOSE (``answer``: its ``PaginationState``). A probe's: the relay
        answers one filter a REQ when it brought an event the suspect answer lacked (True:
        ``one_filter_found`` after the EOSE is taken), else the next filter is asked. Another
        REQ of two filters or more, not possibly cut short: suspect when one of its filters
        explains all it brought (``sync.one_filter``), and then its filters that matched
        nothing are asked alone, one at a time; proven to answer more than one (by any answer,
        cut short or not), the relay is suspected no more before its next daily fresh start."""
        session = state.current
        if answer is None:
            return False
        self.keep_served_ids(state, answer)
        self.prove_if_due(state)
        probe = session.probes.get(batch.batch_id)
        if isinstance(probe, ValuesProof):
            del session.probes[batch.batch_id]
            self.values_proof_answered(state, probe, answer, slow)
            return False
        self.judge_values_reach(state, answer, slow)
        if isinstance(probe, FiltersProbe):
            # judged on its own REQ's answer alone (later pages of its batch, an until probe
            # on a relay reading until as exclusive, go as any batch's)
            del session.probes[batch.batch_id]
            got = {event_id for s in answer.filters for _, event_id in s.seen}
            if got - probe.brought:
                if probe.answers > 1:
                    self.few_filters_found(state, probe.answers)
                    return False
                return True
            state.forget_proof_ids(i for s in answer.filters for i in s.page_filter.ids or () if i not in got)
            if probe.rest:
                self.probe_filters(state, probe.brought, probe.rest)
            return False
        if isinstance(probe, ReachProof):
            del session.probes[batch.batch_id]
            self.reach_proof_answered(state, probe, answer, slow)
            return False
        # (a proof's suspect answer is probed whatever the session spent, and not taken for
        # one a cap or the relay's time cut: each of its two filters asks for one event)
        proof = probe is FILTERS_PROOF
        if proof:
            del session.probes[batch.batch_id]
        if state.filters_answered or len(answer.filters) < 2:
            return False  # (proven, or nothing to judge)
        seen = [frozenset(event_id for _, event_id in s.seen) for s in answer.filters]
        candidates = one_filter.unserved_candidates(seen)
        if candidates is None:  # (proof, though a cap may have cut it; whatever probes are left)
            state.filters_answered = True
            return False
        if (not candidates or (session.one_filter_probes >= one_filter.PROBES_PER_SESSION and not proof)
                or ((session.page_cap or PageCap()).req_maybe_cut(answer.total, slow) and not proof)
                or any(isinstance(p, FiltersProbe) for p in session.probes.values())):
            return False  # (one suspect answer at a time)
        newest = int(self.clock()) - one_filter.PROBE_MARGIN_SECS
        filters = [s.page_filter for s in answer.filters]
        order = one_filter.probe_order(filters, candidates)
        # (a proof's filter asks again an event served before it: nothing stored since can
        # answer it, and the event may be newer than the margin)
        probes = tuple(filters[i] if proof else one_filter.probe_filter(filters[i], newest) for i in order)
        self.probe_filters(state, frozenset().union(*seen), probes, spare=proof)
        return False

    @staticmethod
    def keep_served_ids(state: RelayState, answer) -> None:
        """Two ids the relay served lately (``RelayState.proof_ids``), for the proof a relay
        polled one filter a REQ is asked once a day (``one_filter.asks_filters_proof``):
        without it, one that keeps no live subscription and whose answers never needed two
        filters pays a REQ a filter every poll, all day. And the last ten it served
        (``reach_ids``), for the proof of its reach (``one_filter.reach_to_prove``)."""
        served = [event_id for s in reversed(answer.filters) for _, event_id in s.seen[-2:]]  # (this page's last)
        if served:
            state.proof_ids = tuple(dict.fromkeys((*served, *state.proof_ids)))[:2]
            state.proof_served = tuple(dict.fromkeys((*served, *state.proof_served)))[:2]
            more = [event_id for s in reversed(answer.filters) for _, event_id in s.seen[-constants.MAX_FILTERS_PER_REQ:]]
            state.reach_ids = tuple(dict.fromkeys((*more, *state.reach_ids)))[:constants.MAX_FILTERS_PER_REQ]

    def keep_held_ids(self, state: RelayState, held: tuple[str, ...]) -> None:
        """Ids a NIP-77 exchange found on both sides (``NegentropyOutcome.held_both``): the
        relay holds them (its fingerprints over them matched ours). One that syncs by NIP-77 with
        nothing missing serves no event, and a quiet one brings nothing to its polls: its
        proof never came, and it was polled one filter a REQ all month (the simulator, seed
        1020 of the default world: relay6, 6-7 REQs every 5 minutes, a third of the seed's
        messages). Served ids go first: these fill in only while fewer than two are known."""
        if len(state.proof_ids) < 2:
            state.proof_ids = tuple(dict.fromkeys((*state.proof_ids, *held)))[:2]
        self.prove_if_due(state)

    def prove_if_due(self, state: RelayState) -> None:
        """The proof asked when ``one_filter.asks_filters_proof`` says it is due."""
        if one_filter.asks_filters_proof(state, self.rejected, self.clock()):
            self.ask_filters_proof(state)

    def ask_filters_proof(self, state: RelayState) -> None:
        """One REQ asking each of two events the relay holds in a filter of its own
        (``{"ids": [a]}``, ``{"ids": [b]}``). Both served prove it answers several filters a
        REQ (``check_answer``: no one filter explains the answer); one alone makes the answer
        suspect, and the other is probed alone as any suspect answer's; none proves nothing
        (an event deleted since, a relay not serving by id): its polls stay one filter a REQ,
        and the proof is asked again after its next daily fresh start. A relay proven to
        answer several is asked as many events it served as gsync packs filters into a REQ
        there (``one_filter.reach_to_prove``): every one served proves it answers them all;
        only the first few or the last few, the one next to them is asked alone, and served
        so, the relay answers that many filters a REQ."""
        batch = PendingBatch(self.historic.queue.batch_id(), PendingItems(), kind=BatchKind.PROBE)
        state.current.pending[batch.batch_id] = batch
        reach = one_filter.reach_to_prove(state, self.rejected, self.clock()) if state.filters_answered else ()
        if reach:
            state.reach_proof_asked = True
        else:
            state.filters_proof_asked = True
        ids = reach or state.proof_ids
        state.current.probes[batch.batch_id] = ReachProof(ids) if reach else FILTERS_PROOF
        log.info("filters_proof_asked", relay=state.url, filters=len(ids))
        self.historic.queue.add_packed(state, batch, [[Filter.make(ids=[event_id]) for event_id in ids]])
        self.historic.pump(state)

    def probe_filters(self, state: RelayState, brought: frozenset[str], probes: tuple, spare: bool = False,
                      answers: int = 1) -> None:
        """The first of ``probes`` asked alone (one REQ), the rest kept for after its
        answer; none past ``one_filter.PROBES_PER_SESSION`` a session, but the one a proof's
        suspect answer asks for (``spare``: a day's, ``ask_filters_proof``). ``answers``:
        the filters a REQ the relay answers if it serves it (``FiltersProbe``)."""
        session = state.current
        if not probes or (session.one_filter_probes >= one_filter.PROBES_PER_SESSION and not spare):
            return
        session.one_filter_probes += 1
        batch = PendingBatch(self.historic.queue.batch_id(), PendingItems(), kind=BatchKind.PROBE)
        session.pending[batch.batch_id] = batch
        session.probes[batch.batch_id] = FiltersProbe(brought, probes[1:], answers)
        log.info("one_filter_probe", relay=state.url, filter=probes[0].to_json()[:300])
        self.historic.queue.add_reqs(state, batch, [probes[0]])
        self.historic.pump(state)

    def reach_proof_answered(self, state: RelayState, proof: ReachProof, answer, slow: bool) -> None:
        """The daily proof of a relay proven to answer several filters (``ask_filters_proof``):
        every id served proves it answers that many a REQ (``filters_reach``); only the first
        few or the last few (``one_filter.answered_run``), the one next to them is asked alone
        (a relay answering a few filters of a REQ serves it so; an event deleted since, hidden
        on read, does not), whatever the session's
        probes spent; anything else proves nothing, and so does an answer that came slowly (a
        relay stopping slow queries cuts anywhere: asked again an hour later, twice at most
        a day, ``RelayState.reach_proof_slow``) or to a piece of the REQ (refused, split)."""
        if slow and state.reach_proof_slow < REACH_PROOF_SLOW_AGAIN:
            state.reach_proof_slow += 1  # (asked again a live look's interval later)
            state.reach_proof_asked = False
            state.reach_proof_again_at = self.clock() + constants.LIVE_AUDIT_SECS
        if slow or len(answer.filters) != len(proof.ids):
            return
        got = {event_id for s in answer.filters for _, event_id in s.seen}
        served = [event_id in got for event_id in proof.ids]
        if all(served):
            state.filters_reach = len(served)
            return
        run = one_filter.answered_run(served)
        if run is not None:
            answers, next_to = run
            rest = Filter.make(ids=[proof.ids[next_to]])
            self.probe_filters(state, frozenset(got), (rest,), spare=True, answers=answers)
        else:
            state.forget_proof_ids(i for i, ok in zip(proof.ids, served, strict=True) if not ok)

    # -- relays reading few tag values a filter (``sync.values_reach``) ----------------------

    def keep_values_seed(self, state: RelayState, event) -> None:
        """A served event: the seed of the relay's next proof of its values' reach, if it
        has none since its last daily fresh start, or none by ``d`` (``values_reach.seed_of``:
        an announcement's or a state's ``d``, which nothing else a sync asks carries, is
        the one a proof asks by first); not one the own relay refused (asked again, it is
        downloaded again for nothing). Every served event, until one by ``d`` is kept."""
        kept = state.values_seed
        if kept is not None and kept.name == "d":
            return
        seed = values_reach.seed_of(event, values_reach.SEED_TAGS if kept is None else ("d",))
        if seed is not None and seed.event_id not in self.rejected:
            state.values_seed = seed

    def judge_values_reach(self, state: RelayState, answer, slow: bool) -> None:
        """A historic REQ's answer: each filter that brought something proves the relay
        reads lists of its tag values that wide; the widest that brought nothing is kept for
        the proof, asked once the relay's sync has completed (``prove_values_if_due``: by then
        its NIP-77 exchanges have told their part). An answer a time budget may have cut
        proves nothing either way."""
        if slow:
            return
        for s in answer.filters:
            width = values_reach.tag_width(s.page_filter)
            if s.seen:
                state.values_reach = max(state.values_reach, width)
            else:
                state.values_empty = max(state.values_empty, width)
        if state.historic_sync_completed_at is not None:
            self.prove_values_if_due(state)

    @staticmethod
    def judge_exchange_reach(state: RelayState, flt, result) -> None:
        """A NIP-77 exchange over ``flt`` that compared something (found the relay holding
        what the own relay lacks, or holding some of what it holds) proves the relay reads
        its list that wide."""
        if result.ok and (result.need_ids or result.held_both or result.held > len(result.have_ids)):
            state.values_reach = max(state.values_reach, values_reach.tag_width(flt))

    def prove_values_if_due(self, state: RelayState) -> None:
        """The day's proof (``sync.values_reach``), when a filter wider than the reach brought
        nothing: not on a relay judged not to serve ids, nor by a tag the relay refused a
        filter of, nor with a seed it did not serve by id since or one the own relay refused
        (asked again, it is downloaded again for nothing)."""
        seed = state.values_seed
        if (state.values_empty <= max(1, state.values_reach) or state.values_proof_asked or seed is None
                or state.ids_unserved_at is not None or state.current.link is None):
            return
        if seed.event_id in state.unservable or seed.event_id in self.rejected or state.paused.refuses_tag(seed.name):
            state.values_seed = None  # (the next event served may seed it)
            return
        state.values_proof_asked = True
        self.ask_values_proof(state, ValuesProof(seed, state.values_empty))

    def ask_values_proof(self, state: RelayState, proof: ValuesProof) -> None:
        """The proof's seed asked among ``proof.width`` tag values, one REQ of one filter."""
        batch = PendingBatch(self.historic.queue.batch_id(), PendingItems(), kind=BatchKind.PROBE)
        state.current.pending[batch.batch_id] = batch
        state.current.probes[batch.batch_id] = proof
        log.info("values_proof_asked", relay=state.url, values=proof.width)
        self.historic.queue.add_reqs(state, batch, [values_reach.proof_filter(proof.seed, proof.width)])
        self.historic.pump(state)

    def values_proof_answered(self, state: RelayState, proof: ValuesProof, answer, slow: bool) -> None:
        """Served, the relay reads that wide; not, narrower is asked (``values_reach.
        next_width``), until the width it reads is found: its lists are cut to that from
        now on, as a refusal of more teaches (kept a week), and its sync starts again. A
        slow answer (a time budget may have cut it) is asked again, twice at most a proof."""
        if slow:
            if proof.slow < REACH_PROOF_SLOW_AGAIN:
                self.ask_values_proof(state, dataclasses.replace(proof, slow=proof.slow + 1))
            return
        served = any(event_id == proof.seed.event_id for s in answer.filters for _, event_id in s.seen)
        if served:
            state.values_reach = max(state.values_reach, proof.width)
            served_at, unserved_at = proof.width, proof.unserved_at
            if not unserved_at:
                return  # (as wide as gsync asked: proven)
        else:
            served_at, unserved_at = proof.served_at, proof.width
        width = values_reach.next_width(served_at, unserved_at, state.values_reach if not served_at else 0)
        if width is not None:
            self.ask_values_proof(state, ValuesProof(proof.seed, width, served_at, unserved_at))
            return
        if not served_at:
            state.values_seed = None  # (deleted since, or hidden: no evidence)
            return
        limits = state.current.limits
        if limits.max_values is not None and limits.max_values <= served_at:
            return
        state.current.limits = dataclasses.replace(limits, max_values=served_at)
        state.max_values_learned, state.values_learned_at = served_at, self.clock()
        log.warning("relay_reads_few_values", relay=state.url, max_values=served_at, unserved=unserved_at)
        self.on_one_filter(state)

    def few_filters_found(self, state: RelayState, answers: int) -> None:
        """The relay answered a filter alone that it left unanswered next to the first or
        last ``answers`` of a REQ: it answers that many a REQ and drops the rest without a
        word. From now on (saved) it is asked so, and its sync starts again so."""
        if not state.lower_max_filters(answers):
            return
        log.warning("relay_answers_few_filters", relay=state.url, max_filters=answers)
        self.on_one_filter(state)

    def one_filter_found(self, state: RelayState) -> None:
        """The relay answered a filter alone with what a REQ of several did not bring: it
        answers one filter a REQ. From now on (saved) it is asked one a REQ, and its sync
        starts again so."""
        state.lower_max_filters(1)
        log.warning("relay_answers_one_filter", relay=state.url)
        self.on_one_filter(state)

    def probe_answered(self, state: RelayState, key, batch: PendingBatch) -> None:
        if isinstance(key, (FiltersProbe, ReachProof, ValuesProof)) or key is FILTERS_PROOF:
            return  # unanswered (its REQ refused or stalled): no evidence either way
        if isinstance(key, KindsProbe):
            self.kinds_probe_answered(state, key, batch)
            return
        if isinstance(key, ImpreciseCheck):
            if batch.failed_otherwise:
                # no answer is neither: asked again, as an unanswered kinds probe is, then the
                # shape stays paused until its probe (taken for a refusal, the relay was asked
                # without notes for good on no evidence)
                state.current.kinds_probes_unanswered += 1
                if state.current.kinds_probes_unanswered <= KINDS_PROBE_AGAIN:
                    self.check_imprecise(state, tuple(key))
                return
            key = tuple(key)
            state.current.kinds_suspects.discard(key)
            state.paused.lift(key.__eq__)
            log.info("coverage_refusal_ended", relay=state.url, coverage=describe(key))
            self.restore_coverage(state, key)
            self.probe_kinds_of_paused(state)  # (the next refused shape: over too, or another tale)
            return
        if not state.paused.is_probing(key):
            return  # refused again: paused another day (pause_coverage said so)
        if batch.failed_otherwise:
            # no answer is no yes, nor a no: asked again in an hour (a slow relay's answer
            # came 10 s after its REQ stalled, and the shape stayed paused a day more)
            state.paused.pause(key, self.clock(), probe_in=constants.POLICY_PROBE_UNANSWERED_SECS)
            return
        # (failed only as unreached, the relay served the shape: what it left unpaged, a relay
        # ignoring until, is NIP-77's, ``state.unreached``; seed 239 of the per-filter stress
        # mix: taken as no answer, #a stayed paused a day more, and a repository only that
        # relay lists with it)
        state.paused.probe_passed(key)
        log.info("coverage_restored", relay=state.url, coverage=describe(key))
        self.restore_coverage(state, key)

    def restore_coverage(self, state: RelayState, key) -> None:
        """Paused coverage of shape ``key``, served again: its live REQs open and its history
        is fetched."""
        metrics.PAUSED_COVERAGE.labels(state.url).set(len(state.paused))
        filters = self.coverage_filters(state, key)
        if key == coverage_key(filter_plan.layer1_filter()):
            self.live.open(state, LAYER1_LIVE_SUB, filter_plan.live(filters), control=True)
        else:
            self.live.open_groups(state, live_groups(state, filter_plan.live(filters)))
        self.historic.start(state, PendingItems(), filters)

    # -- rate limits ------------------------------------------------------------------------

    def note_rate_limited(self, state: RelayState, text: str) -> None:
        """A new episode starts the cooldown; a refusal inside it changes nothing."""
        now = self.clock()
        if self.health.is_rate_limited(state.url, now):
            return
        self.health.record_rate_limited(state.url, now)
        cooldown = self.health.cooldown_remaining(state.url, now)
        log.warning("relay_rate_limited", relay=state.url, text=text[:200], cooldown_secs=round(cooldown))
        self.update_health_metric(state, now)
        if state.current.link is not None:
            self.historic.exchanges_to_reqs(state)  # NIP-77 is off for the session
        self.effects.later(cooldown, CooldownEnded(state.url))

    def on_cooldown_ended(self, msg: CooldownEnded) -> None:
        state = self.relays.get(msg.relay)
        if state is None:
            return
        now = self.clock()
        if self.health.state(state.url, now) is not HealthState.PROBING:
            return
        log.info("relay_probing", relay=state.url)
        self.update_health_metric(state, now)
        if state.connected:
            self.rederive_queued(state)
            self.historic.pump(state)

    def rederive_queued(self, state: RelayState) -> None:
        """What waited out the cooldown goes out anew: live REQs narrowed to what the index
        still wants (first: they carry new events), then history in priority order."""
        queued = [s for s in state.current.live_queue if s in state.current.live_subs]
        if queued:
            wanted = self.wanted_live_filters(state)
            for sub_id in queued:
                live = state.current.live_subs[sub_id]
                filters = state.paused.allowed(filter_plan.restrict_to(live.filters, wanted))
                if filters:
                    state.current.live_subs[sub_id] = dataclasses.replace(live, filters=tuple(filters))
                else:
                    del state.current.live_subs[sub_id]
        self.historic.queue.by_priority(state)

    def note_request_succeeded(self, state: RelayState) -> None:
        """A request was served: a relay Probing after its cooldown is back to its state."""
        now = self.clock()
        if self.health.state(state.url, now) is HealthState.PROBING:
            self.health.record_request_succeeded(state.url, now)
            log.info("relay_rate_limit_lifted", relay=state.url,
                     health=self.health.state(state.url, now).value)
            self.update_health_metric(state, now)

    def note_rate_limit_answer(self, state: RelayState, message) -> None:
        """OK (to our AUTH) and NEG-ERR after its exchange ended can say "slow down" too."""
        if says_rate_limited(message.prefix, message.text):
            self.note_rate_limited(state, f"{message.prefix.value}: {message.text}")

    def update_health_metric(self, state: RelayState, now: float) -> None:
        state.status_value = self.health.status_metric(state.url, now)  # (update_metrics sets it only if changed)
        metrics.RELAY_STATUS.labels(state.url).set(state.status_value)

    # -- stalls ---------------------------------------------------------------------------

    def expire_stalled(self, now: float) -> None:
        """Historic REQs silent for ``REQ_STALL_SECS``, or open for ``REQ_LIFETIME_SECS``
        however lively. While delivery holds reading back, the time is ours: it does not
        count (each REQ's clock moves on with it)."""
        held = not self.delivery.room.is_set()
        elapsed, self.stall_checked_at = now - self.stall_checked_at, now
        for state in self.relays.values():
            if not (state.current.sub_activity and state.connected):
                continue
            for sub_id, last in list(state.current.sub_activity.items()):
                sent_at = state.current.historic_sent_at.get(sub_id)
                if held:
                    state.current.sub_activity[sub_id] = now
                    if sent_at is not None:
                        state.current.historic_sent_at[sub_id] = sent_at + elapsed
                elif now - last >= constants.REQ_STALL_SECS:
                    self.on_stalled(state, sub_id)
                elif sent_at is not None and now - sent_at >= constants.REQ_LIFETIME_SECS:
                    self.on_stalled(state, sub_id, lifetime=True)

    def on_stalled(self, state: RelayState, sub_id: str, lifetime: bool = False) -> None:
        state.current.sub_activity.pop(sub_id, None)
        state.current.historic_sent_at.pop(sub_id, None)
        batch_id = self.historic.queue.ended(state, sub_id)
        unsubscribe(self.effects, state.current, sub_id)  # the relay frees it, and so do we
        log.warning("subscription_stalled", relay=state.url, sub_id=sub_id, batch_id=batch_id,
                    secs=constants.REQ_LIFETIME_SECS if lifetime else constants.REQ_STALL_SECS,
                    rule="lifetime" if lifetime else "silence")
        batch = state.current.pending.get(batch_id)
        if batch is not None:
            filters = start_queue.filters_of(batch, sub_id)
            if len(filters) > 1:
                self.split_historic(state, batch, sub_id, filters)
            else:
                self.fail_into_recovery(state, batch, sub_id, filters)
        self.historic.advance(state, batch)

    def fail_into_recovery(self, state: RelayState, batch: PendingBatch, sub_id: str, filters) -> None:
        """The batch failed; what the stalled REQ owed goes to missing-event recovery: its
        ids (not the residual retry's any more), with the filter that found each (by id once
        more, then by it: seed 10's year asked an id the relay hides by id twice more), or
        the filter itself."""
        start_queue.on_closed(batch, sub_id)
        state.current.stalled_shapes.update(coverage_key(f) for f in filters)  # later REQs send it alone
        if batch.kind is BatchKind.RECOVERY:
            return  # a recovery attempt: finish_recovery counts it as one without progress
        if batch.kind is BatchKind.PROBE:
            # a question put to the relay, owing no events: no answer is its answer
            # (``probe_answered``: paused another day, asked again, no evidence). Recovered, it
            # was asked again outside the probe's rules, a refused shape minutes after its
            # refusal (the simulator's seed 901 of a 20-relay world)
            return
        now = self.clock()
        ids = set().union(*(f.ids for f in filters if f.ids is not None))
        if ids:
            missing = ids - batch.received_ids - self.seen.keys()
            batch.advertised_ids -= missing
            self.historic.recover_ids(state.url, {i: batch.found_by.get(i) for i in missing})
        self.recovery.add_missing_filters(state.url, [f for f in filters if f.ids is None], now)
