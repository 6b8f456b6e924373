"""RelaySyncIndex entries: confirmed sync state and connection lifecycle of one relay.

Pure data plus the small rules that read it (the 15-minute quick-reconnect rule, the status
values the ``ngit_sync_relay_connected`` metric exports). The manager owns these; only it
mutates them.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from ..constants import (
    DAILY_MAX_SECS,
    DAILY_MIN_SECS,
    IDS_UNSERVED_RETRY_SECS,
    NIP77_RETRY_SECS,
    QUICK_RECONNECT_SECS,
    THREADS_AHEAD_MAX,
    THREADS_AHEAD_SECS,
)
from ..protocol.filters import Filter
from .pending import BatchKind, PendingBatch
from .policy import CoveragePauses, Trials, values_cap_after
from .result_caps import ResultCap
from .status import ConnectionStatus
from .targets import ConfirmedItems
from .threads_ahead import ThreadsAhead
from .unservable import UnservableIds
from .values_reach import ValuesSeed

_DIGITS = re.compile(r"\d+")  # (``RelayState.said_before``: the numbers of a reason aside)
SAID_MAX = 16  # reasons said once a relay (``RelayState.said``)


class ChangeTrackedDict(dict):
    """A dict that says whether it changed since ``changed`` was last set False (every
    mutator sets it): a save writes its rows again only then, instead of comparing them
    all at every save (``io.manager.saved_state``)."""

    changed = True

    def __setitem__(self, key, value):
        self.changed = True
        super().__setitem__(key, value)

    def __delitem__(self, key):
        self.changed = True
        super().__delitem__(key)

    def __ior__(self, other):
        self.changed = True
        return super().__ior__(other)

    def clear(self):
        self.changed = True
        super().clear()

    def pop(self, *args):
        self.changed = True
        return super().pop(*args)

    def popitem(self):
        self.changed = True
        return super().popitem()

    def setdefault(self, key, default=None):
        self.changed = True
        return super().setdefault(key, default)

    def update(self, *args, **kwargs):
        self.changed = True
        super().update(*args, **kwargs)


_SYNCING = ConnectionStatus.SYNCING  # (an enum member looked up on its class costs 3x the compare: every tick reads it per relay)


@dataclass
class LiveSub:
    filters: tuple
    control: bool = False  # layer 1: never closed by consolidation
    rebuilt_at: float | None = None  # opened again after the relay closed it
    descendants: bool = False  # thread replies: give their room to core coverage when short
    fresh: bool = False  # opened for new coverage: polled apart from the rest if it must be
    # (fresh) when its REQ first went: an event dated before is its coverage's history,
    # fetched by a batch of its own, not what the live subscription missed (``live_since``)
    opened_at: float | None = None


@dataclass
class PolledCoverage:
    """Live coverage that did not fit a relay's budget, asked for by polls instead
    (``LiveCoverage.run_polls``), each since its last successful one less the overlap."""

    filters: list = field(default_factory=list)
    cursor: float | None = None  # when its last successful poll started (kept over sessions)
    started_at: float | None = None  # when its latest poll started
    every: float = 0.0  # seconds between its poll starts (filter_plan.poll_interval)
    added_at: float | None = None  # when its oldest filter came

    def add(self, filters, now: float) -> None:
        if not self.filters:
            self.added_at = now
        self.filters.extend(filters)
        if self.cursor is None:
            self.cursor = now

    def absorb(self, other: PolledCoverage) -> None:
        """Take ``other``'s filters, asked for from the earlier of the two cursors."""
        self.filters.extend(other.filters)
        cursors = [c for c in (self.cursor, other.cursor) if c is not None]
        self.cursor = min(cursors) if cursors else None
        if self.added_at is None:
            self.added_at = other.added_at
        other.filters, other.added_at, other.started_at = [], None, None

    def clear(self) -> None:
        """Its filters are gone (live coverage rebuilt, and what does not fit is about to
        come back): the cursor stays, and so does the cadence (``started_at``, ``every``):
        a rebuild must not bring the next poll forward, nor end its deferral while
        historic sync runs."""
        self.filters, self.added_at = [], None


@dataclass
class RunningExchange:
    """A NIP-77 exchange the manager started (``neg_running``): its handle (the manager's
    ``Effects`` map it to the greenlet running it), what it was for, and when it was queued
    and took its turn (monotonic seconds; ``started`` gets the time appended by the greenlet
    itself)."""

    handle: Any
    batch_id: int
    filter: Any
    queued_at: float
    started: list = field(default_factory=list)
    epoch: int = 0  # ``OwnHeld.forgotten`` when it was started: what it read is kept if unchanged

    def overdue(self, now: float, deadline: float, grace: float, queue_secs: float) -> bool:
        """Past the manager's deadline, whatever its greenlet is doing."""
        if self.started:
            return now - self.started[0] > deadline + grace
        return now - self.queued_at > queue_secs


@dataclass
class RelaySession:
    """What lives in one session of a relay, and goes with it: created when a handshake
    succeeds (``lifecycle.on_handshake_done``), dropped when the session ends
    (``RelayState.end_session``: a disconnect, a retirement, or a fresh start on the same
    connection, which keeps only the connection and what it taught us: ``renewed``). While
    the relay is disconnected an idle one (no connection, nothing pending) stands in, so
    nothing is cleared by hand and readers need no ``None`` check."""

    # its connection: a handle that only ``Effects`` sends on and closes (it owns the socket),
    # and what is open on it (``protocol.subscription_book.SubscriptionBook``, pure)
    link: Any = None
    book: Any = None
    limits: Any = None  # the relay's published limits, lowered by what it taught us
    page_cap: Any = None  # pending.PageCap: what this session taught us of its page size
    negentropy_ok: bool = True  # a NIP-77 verdict holds for one session (SPEC §4)
    pending: dict[int, PendingBatch] = field(default_factory=dict)
    sub_to_batch: dict[str, int] = field(default_factory=dict)
    live_subs: dict[str, LiveSub] = field(default_factory=dict)
    # live sub ids registered in live_subs, waiting for the pacing gate (cooldown, reactive)
    live_queue: list = field(default_factory=list)
    # (sub id or NIP-77 token, filters) waiting for a slot
    historic_queue: list = field(default_factory=list)
    # the precise probe to send as the next paced start (``protocol.precise``), if wanted, and
    # the filter of the empty REQ it was made from (its shape paused if the probe is refused)
    probe: list | None = None
    probe_source: Filter | None = None
    historic_sent_at: dict = field(default_factory=dict)  # historic sub id -> when its REQ went
    neg_running: dict = field(default_factory=dict)  # NIP-77 token → RunningExchange
    # historic sub id → when it last showed life (sent, or an event): stalled ones time out
    sub_activity: dict = field(default_factory=dict)
    stalled_shapes: set = field(default_factory=set)  # coverage keys that stalled alone
    # live REQs asking a suspect shape alone (``CoveragePauses.suspect``), whose verdict
    # other live REQs of that shape wait for, at most REQ_STALL_SECS (``policy.Trials``)
    trials: Trials = field(default_factory=Trials)
    probes: dict = field(default_factory=dict)  # batch id → the coverage key it probes
    # shapes paused this session by a refusal that may be about the notes they may bring
    # (``Refusals.probe_kinds``), and how many of its probes went unanswered
    kinds_suspects: set = field(default_factory=set)
    kinds_probes_unanswered: int = 0
    # the probes spent on answers one of their filters explains (``sync.one_filter``)
    one_filter_probes: int = 0
    # when a refusal in a NOTICE naming no REQ last lowered the subscription cap
    # (``Refusals.learn_max_subscriptions``: another such within seconds is the same burst's)
    cap_guessed_at: float | None = None
    # direct members of threads seen from this relay whose descendants' coverage this
    # session has open (their replies are fetched too); the next one reopens them
    members: set = field(default_factory=set)
    # ids whose threads this session's exchanges reconciled before they were known roots
    threads_ahead: ThreadsAhead = field(default_factory=lambda: ThreadsAhead(THREADS_AHEAD_SECS, THREADS_AHEAD_MAX))
    poll_batch: int | None = None  # the poll in flight (one at a time)
    consolidated_at: float | None = None  # this session's last consolidation
    catch_up_batches: list = field(default_factory=list)  # catch-ups' batches (``HistoricSync.catch_up``)
    consolidation_due: bool = False  # one was skipped for being too soon after the last
    polled_checked_at: float | None = None  # polled coverage last looked at (``consolidate_polled``)
    # live and polled REQs a consolidation for fragmentation was counted to take (``fragmented``),
    # and how many more the last one took than counted
    packing_counted: int | None = None
    packing_overshoot: int = 0
    # the relay refused a live REQ for its total filter size ("exceed max size"): what it
    # made polled stays so this session (``LiveCoverage.bring_live``)
    capacity_refused: bool = False
    # the relay closed a live REQ again within LIVE_REBUILD_MIN_SECS of its rebuild (one that
    # closes every subscription after its EOSE, PEERS.md): what it made polled stays so this
    # session, polled no more often than LIVE_NOT_KEPT_POLL_SECS (``LiveCoverage``)
    live_not_kept: bool = False
    # the live audit (``LiveCoverage.run_audits``): when the last began, its batch while it
    # runs, and the events it found the live subscriptions missed
    audited_at: float | None = None
    audit_batch: int | None = None
    live_missed: int = 0
    # Timers this session scheduled: their messages are ignored once it is gone, so a new
    # session must start without these flags (a relay stuck in Syncing for ever).
    completion_check_scheduled: bool = False
    slot_wakeup_scheduled: bool = False
    # While a (re)connection builds its first batches (layer 1, then AddFilters): nothing
    # starts, so layer 1 shares its first REQ with what follows instead of going alone.
    pump_held: bool = False

    def renewed(self) -> RelaySession:
        """A new session on the same connection (the daily fresh start): the connection and
        what it taught us (limits, page size, the NIP-77 verdict) stay; the work goes."""
        return RelaySession(link=self.link, book=self.book, limits=self.limits, page_cap=self.page_cap,
                            negentropy_ok=self.negentropy_ok)

    def start_priority(self, sub_id: str) -> tuple:
        """Where a queued historic start goes when queued work is re-derived (after a
        rate-limit cooldown): discovery (layer 1) first, then what was started (pages of
        running batches), then new batches oldest first, then recovery, polls and probes."""
        batch = self.pending.get(self.sub_to_batch.get(sub_id, -1))
        if batch is None:
            return (4, 0)
        if batch.kind is BatchKind.LAYER1:
            return (0, batch.batch_id)
        if batch.kind.upkeep:
            return (3, batch.batch_id)
        return (1 if batch.started else 2, batch.batch_id)

    def syncing(self) -> bool:
        """Historic sync still running: a batch other than a recovery attempt, a poll or a
        policy probe (those run for as long as a relay is connected: they are upkeep)."""
        return any(not b.kind.upkeep for b in self.pending.values())

    def live_filter_bytes(self) -> int:
        """What the live subscriptions' filters take on the wire (MAX_LIVE_FILTER_BYTES
        bounds it)."""
        return sum(self.book.filter_bytes.get(s, 0) for s in self.live_subs)

    def data_live_subs(self) -> int:
        """Live subscriptions open for data (layer 1's control subscription aside): what the
        relay's subscription budget counts."""
        return sum(1 for sub in self.live_subs.values() if not sub.control)


@dataclass
class RelayState:
    """What outlives a session of one relay (confirmed coverage, learnt limits, policy
    pauses, poll cursors, thread members to reopen, health-side timestamps); what lives in
    one is ``current``, a ``RelaySession``."""

    url: str
    is_bootstrap: bool = False
    status: ConnectionStatus = ConnectionStatus.DISCONNECTED  # changed by status.move only
    confirmed: ConfirmedItems = field(default_factory=ConfirmedItems)
    last_connected: float | None = None
    disconnected_at: float | None = None
    announcements_synced: bool = False
    # it confirmed repositories to an earlier process that the own relay no longer shows: it
    # starts fresh, its layer 1 bringing their announcements (``lifecycle.look_for_lost``),
    # and is wanted for that alone until then (a day; its layer 1 done, LOST_SETTLE_SECS
    # more); 0: never so
    lost_until: float = 0.0
    historic_sync_completed_at: float | None = None
    # the session in use (an idle one while disconnected), and its number: messages and
    # timers carry the number, and those of an ended session are ignored
    current: RelaySession = field(default_factory=RelaySession)
    session: int = 0
    attempt: int = 0
    # the longest message this relay takes, learnt from its hang-ups (kept over sessions),
    # and how many sessions in a row it ended, without a word, just after a long message
    max_message_learned: int | None = None
    silent_long_hangups: int = 0
    # REQ shape and subscription caps it refused past (kept over sessions and restarts)
    max_filters_learned: int | None = None
    max_subscriptions_learned: int | None = None
    subscriptions_learned_at: float | None = None  # when (judged again a week later: LEARNT_CAP_SECS)
    max_values_learned: int | None = None  # the values one list of a filter may hold
    values_learned_at: float | None = None  # when (judged again a week later: LEARNT_CAP_SECS)
    # its NIP-77 result cap, as far as refusals and served exchanges told (kept over sessions)
    result_cap: ResultCap = field(default_factory=ResultCap)
    refused_reason: str = ""  # the SSRF guard said no: never dialled again
    round_started_at: float = 0.0  # the latest fresh start, quick reconnect or daily sync
    batch_failures: bool = False
    unrelated_failure: bool = False  # a failure recovery cannot fix (e.g. a refused sub)
    # coverage this relay refused by policy (outlives sessions; the probes out for it are
    # the session's)
    paused: CoveragePauses = field(default_factory=CoveragePauses)
    # thread members found in a session, whose coverage the next descendants tick opens
    # (kept if the session ends first)
    new_members: set = field(default_factory=set)
    member_roots: dict = field(default_factory=ChangeTrackedDict)  # member → the roots it is one of
    # members whose coverage went with the last session (or the last process): reopened
    # by the next connection (lifecycle.reopen_members)
    reopen_members: set = field(default_factory=set)
    descendants_started_at: float | None = None
    # Live coverage that did not fit the relay's budget, polled instead (LiveCoverage.run_polls):
    # what came in the last FRESH_POLL_SECS (new repositories, roots, thread members: where
    # new events are likely) apart from the rest, each tier on the cadence its size allows.
    # Their cursors outlive sessions; their filters are rebuilt by each session.
    fresh_polled: PolledCoverage = field(default_factory=PolledCoverage)
    polled: PolledCoverage = field(default_factory=PolledCoverage)
    # refused ids released meanwhile, to fetch again by id once this relay is connected
    refetch_ids: set = field(default_factory=set)
    # when the relay last advertised ids through NIP-77 and served (nearly) none of them by
    # id (kept over sessions): its batches go by REQ+EOSE until IDS_UNSERVED_RETRY_SECS pass
    ids_unserved_at: float | None = None
    # it answers only precise queries (``protocol.precise``: nostr-rs-relay's limit_scrapers),
    # found by a probe (``lifecycle.on_imprecise_ignored``); kept over sessions
    precise_queries: bool = False
    # precise probes asked of it (``precise.probe_turn``: their filters take turns); in memory
    precise_probes: int = 0
    # it refused, in words, filters that may bring notes without naming authors, and served
    # the same without them (``protocol.precise``: khatru's AntiSyncBots): its tag and ids
    # filters ask ``precise.NOTES_EXCLUDED`` (``Refusals.imprecise_refused``): when it was
    # found (``precise_refused``); kept over sessions and restarts, and forgotten at the first
    # daily sync NOTES_REFUSAL_REMEMBERED_SECS after it (``lifecycle.start_day``)
    precise_refused_at: float | None = None
    # an answer needed two of its REQ's filters: it answers more than one a REQ (``sync.
    # one_filter``): not suspected again, nor probed, before its next daily fresh start
    # (``lifecycle.start_day``); kept over sessions and restarts (a relay reconnecting every
    # few minutes spent up to PROBES_PER_SESSION starts on each session)
    filters_answered: bool = False
    # two ids it holds (served lately by any historic answer, or else found on both sides by
    # a NIP-77 exchange), and whether they were asked back in one REQ of two filters since its
    # last daily fresh start (``Refusals.ask_filters_proof``): a relay polled one filter a REQ
    # for want of that proof is proven so, by one REQ a day
    proof_ids: tuple[str, ...] = ()
    proof_served: tuple[str, ...] = ()  # the last two of them the relay served (``keep_served_ids``)
    # the last MAX_FILTERS_PER_REQ ids it served: a relay proven to answer several filters
    # is asked as many in one REQ once a day, a filter each, to prove it answers as many as
    # gsync packs into a REQ there (``one_filter.reach_to_prove``)
    reach_ids: tuple[str, ...] = ()
    filters_proof_asked: bool = False
    # the most filters of one REQ its daily proof found answered, every one (``Refusals.
    # check_answer``); 0 until proven so since its last daily fresh start
    filters_reach: int = 0
    # whether that proof was asked since its last daily fresh start (apart from the proof of
    # two: a relay proven by that one is asked this one the same day: the simulator's seed
    # 822 of an every-behaviour world with --filter-caps, a relay reading three filters
    # proven by two at day 0, and what the own relay lost at day 0.16 asked of it ten
    # filters a REQ until the next day)
    reach_proof_asked: bool = False
    # answers to that proof that came slowly (a relay stopping slow queries cuts anywhere:
    # they prove nothing) since its last daily fresh start; each is asked again a live look's
    # interval later (``reach_proof_again_at``), ``REACH_PROOF_SLOW_AGAIN`` times at most
    # (the simulator's seed 865 of the every-behaviour world: relay6, reading three filters
    # a REQ within a query budget, served one of ten at day 0.075; what the own relay lost at
    # day 0.27 was asked of it eight and ten filters a REQ, and a state never came back)
    reach_proof_slow: int = 0
    reach_proof_again_at: float = 0.0
    # the widest list of tag values of a filter that brought something since its last daily
    # fresh start (by a REQ, or compared by NIP-77): it reads lists that wide (``sync.
    # values_reach``); an event it served with a tag value, a proof's seed (kept from its
    # first answer after that start); and whether the proof that a filter wider than the
    # reach brought nothing calls for (once its sync completed) was asked then
    values_reach: int = 0
    values_empty: int = 0  # the widest that brought nothing since then
    values_seed: ValuesSeed | None = None
    values_proof_asked: bool = False
    # when an hourly live look last found events its live subscriptions missed (the relay, or
    # a proxy before it, drops them without a word: ``LiveCoverage.audited``); kept over
    # sessions and restarts, forgotten LIVE_DROPS_REMEMBERED_SECS after it (``lifecycle.
    # start_day``). While it is known, its live REQs go with ``since`` and no ``limit``
    # (``filter_plan.live_since``: ORLY keeps those), and while the relay is not proven to
    # answer several filters of a REQ, its looks go one filter a REQ
    # (``one_filter.looks_filter_by_filter``)
    live_dropped_at: float | None = None
    # ids it advertised and served neither by id nor by their filter: not asked here again
    # before its next daily fresh start (``lifecycle.run_daily``), kept over sessions
    unservable: UnservableIds = field(default_factory=UnservableIds)
    # when this relay, listing 77 in its NIP-11, last failed NIP-77 (refused it, or never
    # answered): kept over sessions, so NIP-77 is tried there at most once a NIP77_RETRY_SECS
    nip77_failed_at: float | None = None
    # what the operator was told of this relay's ways (``said_before``): each once, not at
    # every session or daily sync (a flapping relay without NIP-77 logged a warning every
    # reconnection, 300 in ten days). SAID_MAX keys at most (a reason may be a relay's own
    # text, new at each session), gone with the relay
    said: set = field(default_factory=set)
    # a batch left what no REQ reaches here without NIP-77 (``PendingBatch.unreached``) since
    # the last fresh start with NIP-77 usable: synced again when NIP-77 comes back
    # (``lifecycle.end_nip77_rests``); kept over restarts, as the rest is (``nip77_failed_at``)
    unreached: bool = False
    next_daily_at: float | None = None
    last_error: str = ""
    events_delivered: int = 0
    received_metric: Any = None  # the relay's gsync_remote_events_total child, kept
    gauges: Any = None  # its children of metrics.PER_RELAY_GAUGES and STARTS_QUEUED, kept
    gauge_values: tuple | None = None  # what update_metrics last set of them (unchanged: not set again)
    queued_value: int | None = None  # the same, of STARTS_QUEUED
    status_value: int | None = None  # the same, of RELAY_STATUS (set by update_metrics and the refusals)

    @property
    def precise_refused(self) -> bool:
        """Is it asked without notes (``precise_refused_at``)?"""
        return self.precise_refused_at is not None

    @property
    def connected(self) -> bool:
        return self.current.link is not None and self.status >= _SYNCING

    def serves_ids(self, now: float) -> bool:
        """May what its NIP-77 advertises be fetched by id? Not for a day after it failed to."""
        return self.ids_unserved_at is None or now - self.ids_unserved_at >= IDS_UNSERVED_RETRY_SECS
    def nip77_resting(self, now: float) -> bool:
        """NIP-77 failed here, advertised and not served, less than NIP77_RETRY_SECS ago:
        REQ+EOSE only, whatever the session."""
        return self.nip77_failed_at is not None and now - self.nip77_failed_at < NIP77_RETRY_SECS

    def should_fresh_start(self, now: float) -> bool:
        """First connect, or away for more than 15 minutes: confirmed state is too stale."""
        if self.last_connected is None or not self.announcements_synced:
            return True
        return self.disconnected_at is None or now - self.disconnected_at > QUICK_RECONNECT_SECS

    def daily_near(self, now: float) -> bool:
        """Is the daily fresh start due, or due within its spread (DAILY_MAX_SECS less
        DAILY_MIN_SECS)? A fresh start at reconnect then is that day's: the whole history is
        not run again minutes later (seed 13's year: two minutes later, an id the relay hides
        asked by id a fourth time within 24 h)."""
        return self.next_daily_at is not None and now >= self.next_daily_at - (DAILY_MAX_SECS - DAILY_MIN_SECS)

    def learn_values_cap(self, filters, reason: str, now: float) -> tuple[int | None, bool]:
        """A REQ (or NEG-OPEN) of ``filters`` was refused for ``reason``: the values a list of
        a filter may hold, to slice them at (``policy.values_cap_after``; None: nothing to
        slice), and whether that lowered the cap known: this session's filters are built
        within it from now on, and later sessions' for a week (``Lifecycle.start_day``)."""
        limits = self.current.limits
        known = limits.max_values if limits is not None else None
        most = values_cap_after(filters, reason, known)
        if most is None or limits is None or (known is not None and most >= known):
            return most, False
        self.current.limits = dataclasses.replace(limits, max_values=most)
        self.max_values_learned, self.values_learned_at = most, now
        return most, True

    def forget_proof_ids(self, ids) -> None:
        """``ids`` went unserved when asked alone, or in a proof whose answer no relay's
        filter reading explains: hidden on read or deleted since, no proof any more (asked
        in the next day's proof, and alone after it, such an id was asked by id four times
        in 16 h: the simulator, seed 829 of the every-behaviour world, relay8)."""
        gone = set(ids)
        self.proof_ids = tuple(i for i in self.proof_ids if i not in gone)
        self.proof_served = tuple(i for i in self.proof_served if i not in gone)
        self.reach_ids = tuple(i for i in self.reach_ids if i not in gone)

    def lower_max_filters(self, most: int) -> bool:
        """The relay answers ``most`` filters of a REQ at most (it refused more, or read only
        that many): this session packs no more, and later sessions and restarts start there
        (``max_filters_learned``). False when that is no lower than what is known."""
        limits = self.current.limits
        if limits.max_filters is not None and limits.max_filters <= most:
            return False
        self.current.limits = dataclasses.replace(limits, max_filters=most)
        self.max_filters_learned = most
        return True

    def said_before(self, event: str, reason: str) -> bool:
        """Whether ``event`` was logged for ``reason`` here before (its numbers aside); from
        now on it has been. A relay's lasting ways are said once at info or warning, then at
        debug."""
        key = (event, _DIGITS.sub("#", reason[:200]))
        if key in self.said or len(self.said) >= SAID_MAX:
            return True  # (past SAID_MAX, whatever else the relay says is at debug)
        self.said.add(key)
        return False

    def begin_session(self, link, book, limits, page_cap) -> RelaySession:
        """A handshake succeeded: a new session on the connection ``link`` (``book``: what it has open)."""
        self.current = RelaySession(link=link, book=book, limits=limits, page_cap=page_cap)
        return self.current

    def end_session(self, keep_connection: bool = False) -> RelaySession:
        """The current session is over (a disconnect, a retirement, or with
        ``keep_connection`` a fresh start on the same connection): the object goes, and
        everything in it. Returned, for the manager to release its batches' claims and
        followers (``lifecycle.end_session``). What must outlive it is handed over here:
        its thread members' coverage is reopened by the next session (since the gap on a
        quick reconnect, whole on a fresh start); policy probes it had out will never be
        answered (probed again on the next chance); polled coverage keeps its cursor (the
        next session polls from the last successful poll, with the overlap) and polls at
        once."""
        ended = self.current
        self.current = ended.renewed() if keep_connection else RelaySession()
        self.reopen_members |= ended.members
        if ended.probes:
            self.paused.abandon_probes()
        for tier in (self.fresh_polled, self.polled):
            tier.clear()
            tier.started_at = None  # a new session polls at once, from the cursor
        return ended

    def clear_confirmed(self) -> None:
        self.confirmed = ConfirmedItems()
        self.announcements_synced = False
        self.batch_failures = False
        self.unrelated_failure = False


class RelayTable(dict):
    """Every relay the manager knows, by URL (``dict[str, RelayState]``): the one piece of
    state the manager's collaborators all share, handed to each of them."""

    def in_session(self, url: str, session: int) -> RelayState | None:
        """``url``'s state while ``session`` is its current, connected one (else None: a
        message or timer of an ended session)."""
        state = self.get(url)
        if state is None or state.session != session or state.current.link is None:
            return None
        return state
