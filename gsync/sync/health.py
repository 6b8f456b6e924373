"""RelayHealthTracker: when to (re)connect to a relay, and how fast to ask it for things
(SPEC §5; seed 001 "Health Tracking").

Pure: every method takes ``now`` (float seconds). One tracker for all relays, keyed by
relay URL. Time-driven transitions (a connection becoming stable, a cooldown ending) are
applied lazily whenever the tracker is consulted, so there is no timer to forget.

Two independent concerns, kept apart because they recover differently:

- connection health: failure streak → exponential backoff → Dead after 24 h;
- rate limiting: a 65 s cooldown, then Probing; plus the pacing gates for query starts.

Policy refusals (coverage a relay refused for good) are ``policy``'s: they pause a filter's
shape, not the relay.

``MisbehaviourBudget`` is the per-session rule that decides when a misbehaving relay is hung
up on (its hang-up then counts as a connection failure here).
"""
from __future__ import annotations

import datetime
import email.utils
import enum
from dataclasses import dataclass

from ..constants import (
    BASE_BACKOFF_SECS,
    DEAD_AFTER_SECS,
    DEAD_RETRY_SECS,
    MAX_BACKOFF_SECS,
    PERMANENT_FAILURE_PARK_SECS,
    PROACTIVE_GATE_SECS,
    PROVEN_SESSION_SECS,
    QUERY_PACE_KEEP_SECS,
    RATE_LIMIT_COOLDOWN_MAX_SECS,
    RATE_LIMIT_COOLDOWN_SECS,
    REACTIVE_GATE_MAX_SECS,
    REACTIVE_GATE_START_SECS,
    RETIRED_HEALTH_MAX,
    STABILITY_SECS,
)
from ..protocol.messages import is_filter_shape_refusal, is_rate_limit_text

# How far apart a relay's background starts have actually gone (``start_pace``, read by the
# progress estimate: answers slower than the gate, or delivery holding history, make starts
# slower than the gate allows): a moving average of the gaps between them, the latest
# weighing PACE_WEIGHT; a gap over PACE_IDLE_SECS was a relay with nothing to start, not a
# slow one, and is left out.
PACE_WEIGHT = 0.2
PACE_IDLE_SECS = 30.0


class HealthState(enum.Enum):
    HEALTHY = "healthy"
    DISCONNECTED = "disconnected"
    DEGRADED = "degraded"
    DEAD = "dead"
    RATE_LIMITED = "rate_limited"
    PROBING = "probing"  # cooldown over; the next request tells whether it is lifted


# ngit_sync_relay_status values, as the seed's dashboards expect. Probing has no value of its
# own there: until a request succeeds the relay is still rate limited.
STATUS_METRIC = {
    HealthState.HEALTHY: 1,
    HealthState.DISCONNECTED: 2,
    HealthState.DEGRADED: 3,
    HealthState.DEAD: 4,
    HealthState.RATE_LIMITED: 5,
    HealthState.PROBING: 5,
}


# -- refusals ----------------------------------------------------------------------------


class Refusal(enum.Enum):
    RATE_LIMIT = "rate_limit"
    POLICY = "policy"  # blocked / restricted: this relay will not serve that coverage
    AUTH = "auth"  # auth-required: authenticate (if we can), then retry
    UNSUPPORTED = "unsupported"  # the relay cannot run that filter
    OTHER = "other"


_PREFIX_REFUSALS = {
    "rate-limited": Refusal.RATE_LIMIT,
    "blocked": Refusal.POLICY,
    "restricted": Refusal.POLICY,
    "auth-required": Refusal.AUTH,
    "unsupported": Refusal.UNSUPPORTED,
    "invalid": Refusal.UNSUPPORTED,  # a filter this relay cannot run
}


def split_prefix(message: str) -> tuple[str, str]:
    """NIP-01 machine-readable prefix: ``"blocked: you are banned"`` → ("blocked", "you are banned")."""
    head, sep, rest = message.partition(":")
    if sep and head and " " not in head.strip():
        return head.strip().lower(), rest.strip()
    return "", message.strip()


def classify_refusal(prefix: str, text: str = "") -> Refusal:
    """What a CLOSED / NOTICE / OK false / NEG-ERR is telling us.

    Rate-limit wording wins over a policy prefix: a throttle misread as policy would pause
    that coverage for a day, a policy refusal misread as throttle only costs a cooldown.
    Wording about the REQ's shape ("too many filters") is not a rate, whatever its prefix
    but ``rate-limited``: read as one, the same REQ came back after every cooldown, refused
    every time, and the relay synced nothing more.
    """
    prefix = prefix.strip().lower()
    if prefix == "rate-limited" or is_rate_limit_text(text):
        return Refusal.RATE_LIMIT
    if is_filter_shape_refusal(text):
        return Refusal.UNSUPPORTED
    return _PREFIX_REFUSALS.get(prefix, Refusal.OTHER)


def refuses_a_shape(kind: Refusal, text: str) -> bool:
    """A refusal of what a filter asks (its kinds and tags), not of its size: a policy
    (``blocked:``, ``restricted:``), or ``unsupported:``/``invalid:`` said by prefix rather
    than in wording about size ("too many filters", "filter too large")."""
    return kind is Refusal.POLICY or (kind is Refusal.UNSUPPORTED and not is_filter_shape_refusal(text))


def retry_after_secs(value: str | None, now: float) -> float | None:
    """Seconds an HTTP ``Retry-After`` asks us to wait (RFC 9110: delay-seconds or an
    HTTP-date; ``now`` is wall-clock time), at least 0; None when absent or unreadable.
    The caller bounds it (a relay cannot ask for a year)."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(int(value)) if len(value) <= 12 else 1e12
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT; the obsolete forms may not say so
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


# HTTP answers to the websocket upgrade that say "try again" (a timeout, a rate, a restart
# in progress); any other answer than 101 says no websocket is served there (404, 403, 502).
_TRANSIENT_HTTP = frozenset({408, 425, 429, 500, 503, 504})


def permanent_http_status(status: int | None) -> bool:
    """An HTTP status answering the websocket upgrade that no retry in seconds fixes."""
    return status is not None and 300 <= status and status not in _TRANSIENT_HTTP


# -- per-relay record --------------------------------------------------------------------


@dataclass
class _RelayHealth:
    # connection health
    failures: int = 0  # consecutive; cleared only by a stable connection
    first_failure_at: float | None = None  # start of the continuous-failure streak
    last_failure_at: float | None = None
    attempt_in_flight: bool = False
    # sessions in a row gsync hung up on for misbehaviour; a stable session does not clear
    # it (a relay may misbehave only once it is settled), a session that ends otherwise does
    misbehaviour_streak: int = 0
    # a permanent error (DNS, TLS, an HTTP answer that is no upgrade): no attempt before
    # ``parked_until``, whatever the backoff says; cleared by a successful handshake
    parked_until: float | None = None
    parked_reason: str = ""
    connected: bool = False
    connected_since: float | None = None
    # rate limiting (outlives connections: reconnecting does not lift a relay's limit)
    cooldown_until: float | None = None
    probing: bool = False
    # cooldowns in a row, each refused for rate at the first request after the last (none
    # served between), and when the last ended: the next one is twice as long
    cooldowns_in_a_row: int = 0
    cooldown_ended_at: float | None = None
    # pacing, per connection session
    reactive_gap: float | None = None  # None until a query-rate refusal this session
    last_start_at: float | None = None
    last_background_start_at: float | None = None
    start_pace: float | None = None  # seconds between background starts lately (PACE_WEIGHT)
    negentropy_disabled: bool = False
    served: bool = False  # this session answered something (an EOSE, an event)
    # the pace its query-rate refusals taught (outlives sessions: ``QUERY_PACE_KEEP_SECS``
    # after the last such refusal), and when that refusal came
    learned_gap: float | None = None
    learned_at: float | None = None


_UNKNOWN = _RelayHealth()  # the record of a relay not tracked (read, never written)


def _small_count(value) -> int:
    """A saved count of cooldowns in a row, as the doubling reads it (past 16 it changes
    nothing); anything else, a record edited by hand, is none."""
    return min(value, 16) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class RelayHealthTracker:
    def __init__(
        self,
        base_backoff: float = BASE_BACKOFF_SECS,
        max_backoff: float = MAX_BACKOFF_SECS,
        proactive_gap: float = PROACTIVE_GATE_SECS,
    ):
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.proactive_gap = proactive_gap
        self._relays: dict[str, _RelayHealth] = {}
        # Relays retired with a record that still holds their next dial back (``retire``):
        # url -> (kept until, the record, retired at, dead then), oldest retirement first
        self._retired: dict[str, tuple[float, _RelayHealth, float, bool]] = {}

    def _get(self, relay: str) -> _RelayHealth:
        h = self._relays.get(relay)
        if h is None:  # (not setdefault: that built a record at every read, 264k a month of the simulator)
            h = self._relays[relay] = _RelayHealth()
        return h

    def _settle(self, h: _RelayHealth, now: float) -> None:
        """Apply the transitions that only need time to pass."""
        if h.connected and h.failures and now - h.connected_since >= STABILITY_SECS:
            h.failures, h.first_failure_at = 0, None  # survived 5 min: the streak is over
        if h.cooldown_until is not None and now >= h.cooldown_until:
            h.cooldown_ended_at, h.cooldown_until, h.probing = h.cooldown_until, None, True

    def retire(self, relay: str, now: float) -> None:
        """``relay`` leaves the table (no repository lists it). What holds its next dial
        back goes with it only after a while: a failure streak (and its dead clock), a
        cooldown, a park, a misbehaviour streak are kept ``DEAD_RETRY_SECS`` (at least to
        the cooldown's or park's end), so a relay dropped and listed again (an announcement
        edited back, a repository moved) is dialled as it would have been had it stayed: a
        dead relay once a day, a rate-limited one after its cooldown, a failing one after
        its backoff (the time out of the table, when nothing dialled it, does not count
        toward its dead mark: ``readmit``). At most
        ``RETIRED_HEALTH_MAX`` relays are kept, the oldest retirement going first; a record
        with nothing to hold back is not kept."""
        h = self._relays.pop(relay, None)
        self._retired.pop(relay, None)
        if h is None:
            return
        self._settle(h, now)
        if h.connected:  # in session when retired: it works, whatever streak it had
            h.failures, h.first_failure_at, h.last_failure_at = 0, None, None
        if not (h.failures or h.cooldown_until is not None or h.parked_until is not None
                or h.misbehaviour_streak):
            return
        kept = _RelayHealth(
            failures=h.failures, first_failure_at=h.first_failure_at, last_failure_at=h.last_failure_at,
            misbehaviour_streak=h.misbehaviour_streak, parked_until=h.parked_until,
            parked_reason=h.parked_reason, cooldown_until=h.cooldown_until, probing=h.probing,
            cooldowns_in_a_row=h.cooldowns_in_a_row, cooldown_ended_at=h.cooldown_ended_at,
        )
        until = max(now + DEAD_RETRY_SECS, h.cooldown_until or 0.0, h.parked_until or 0.0)
        self._retired[relay] = (until, kept, now, self._is_dead(h, now))
        for url, (expires, *_) in list(self._retired.items()):
            if expires > now and len(self._retired) <= RETIRED_HEALTH_MAX:
                break
            del self._retired[url]

    def readmit(self, relay: str, now: float) -> bool:
        """``relay`` is registered again: what ``retire`` kept of it, if it is still kept
        (True then)."""
        entry = self._retired.pop(relay, None)
        if entry is None or entry[0] <= now:
            return False
        _, h, retired_at, was_dead = entry
        if not was_dead and h.first_failure_at is not None:
            # No dial tried it while it was out of the table: its dead clock stood still
            # (a relay failing an hour, retired, listed again a day later is not dead).
            h.first_failure_at += now - retired_at
        self._relays[relay] = h  # (over any record a read made meanwhile)
        return True

    def snapshot(self, relay: str, fields) -> dict:
        """The named fields of ``relay``'s record (what outlives the process: ``sync.memory``)."""
        h = self._relays.get(relay) or _RelayHealth()
        return {name: getattr(h, name) for name in fields}

    def values(self, relay: str, getter) -> tuple:
        """``getter`` (an ``operator.attrgetter`` of field names) of ``relay``'s record: what
        ``snapshot`` reads, as a tuple."""
        h = self._relays.get(relay)
        return getter(h if h is not None else _UNKNOWN)

    def restore(self, relay: str, saved: dict) -> None:
        """Fields saved by ``snapshot`` in an earlier process: a dead relay stays dead, a
        failing one keeps its backoff, a cooldown runs to its end, a query pace its refusals
        taught spaces its starts for the rest of its week (a deploy would otherwise send the
        first sync after it at the proactive gate into the limit, and lose NIP-77 to it)."""
        h = self._get(relay)
        h.failures = int(saved.get("failures") or 0)
        h.misbehaviour_streak = int(saved.get("misbehaviour_streak") or 0)
        for name in ("first_failure_at", "last_failure_at", "cooldown_until", "learned_gap", "learned_at",
                     "cooldown_ended_at"):
            value = saved.get(name)
            try:
                setattr(h, name, None if value is None else float(value))
            except (TypeError, ValueError):
                setattr(h, name, None)  # (a record edited by hand: that field forgotten)
        if h.learned_gap is not None:
            h.learned_gap = min(max(h.learned_gap, 0.0), REACTIVE_GATE_MAX_SECS)
        # a row of cooldowns goes on where it was (a deploy in the middle of a relay's limit of
        # minutes began it again at 65 s: one more refused request a minute)
        h.cooldowns_in_a_row = _small_count(saved.get("cooldowns_in_a_row"))
        h.probing = saved.get("probing") is True
        if not h.failures:
            h.first_failure_at = h.last_failure_at = None

    # -- connection health

    def backoff(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.base_backoff * 2 ** (failures - 1), self.max_backoff)

    def record_attempt_started(self, relay: str, now: float) -> None:
        """A handshake worker took the attempt (queued attempts are not yet attempts)."""
        self._get(relay).attempt_in_flight = True

    def record_success(self, relay: str, now: float) -> None:
        """Handshake succeeded: a new session. The failure streak stays until it is stable."""
        h = self._get(relay)
        h.attempt_in_flight = False
        h.connected, h.connected_since = True, now
        h.parked_until, h.parked_reason = None, ""
        # Pacing gates and the NIP-77 verdict belong to the session; the cooldown does not.
        h.reactive_gap = h.last_start_at = h.last_background_start_at = h.start_pace = None
        h.negentropy_disabled = h.served = False

    def record_served(self, relay: str) -> None:
        """The session answered a request (an EOSE, an event): it does real work, it is no
        relay that accepts and drops (``record_disconnect``)."""
        h = self._relays.get(relay)
        if h is not None and h.connected:
            h.served = True

    def record_failure(self, relay: str, now: float, permanent: str = "") -> None:
        """A connection attempt failed (including a stale success found closed).
        ``permanent``: how, when no retry in seconds fixes it (``"dns"``, ``"tls"``,
        ``"http 404"``): the relay is parked for PERMANENT_FAILURE_PARK_SECS."""
        h = self._get(relay)
        self._settle(h, now)
        h.attempt_in_flight = False
        h.connected, h.connected_since = False, None
        self._add_failure(h, now)
        if permanent:
            h.parked_until, h.parked_reason = now + PERMANENT_FAILURE_PARK_SECS, permanent

    def parked(self, relay: str, now: float) -> tuple[str, float] | None:
        """(how it failed, seconds left) while the relay is parked for a permanent error."""
        h = self._get(relay)
        if h.parked_until is None or now >= h.parked_until:
            return None
        return h.parked_reason, h.parked_until - now

    def record_disconnect(self, relay: str, now: float, *, misbehaved: bool = False) -> None:
        """An established connection ended. Before it was stable (5 min) that is a failure:
        a relay that accepts and drops must back off, not be redialled in a tight loop. Two
        kinds of session say otherwise, and restart the dead clock (the relay is not failing
        continuously):

        - one that served (``record_served``) for ``PROVEN_SESSION_SECS``: the relay works,
          whatever the streak was. The streak starts again from one, so the next dial waits
          the base backoff and the dials that fail while it restarts double from there: a
          relay that restarts every few minutes is redialled seconds after it is back. (The
          failed dials of one restart grew the streak, and a session had to outlast the
          wait before it to keep it level; the wait shortened the session; only 5 stable
          minutes cleared it: such a relay was redialled once an hour.)
        - one that lasted as long, and as long as the wait before it, without serving: the
          streak goes on without growing.

        A relay that refuses connections, or accepts and drops (or serves and drops) within
        a minute, still backs off to the cap. A hang-up for misbehaviour is a failure however
        long the session lasted, and the backoff grows with every such hang-up in a row: a
        relay that keeps misbehaving is dialled less and less often."""
        h = self._get(relay)
        if not h.connected:
            return  # already recorded (a failed attempt, or a repeated notification)
        self._settle(h, now)
        lasted = now - h.connected_since
        was_stable = lasted >= STABILITY_SECS
        h.connected, h.connected_since = False, None
        if misbehaved:
            h.misbehaviour_streak += 1
            self._add_failure(h, now)
            h.failures = max(h.failures, h.misbehaviour_streak)
            return
        h.misbehaviour_streak = 0
        if was_stable:
            return
        if h.served and lasted >= PROVEN_SESSION_SECS:
            h.failures = 1
            h.first_failure_at = h.last_failure_at = now
        elif lasted >= max(PROVEN_SESSION_SECS, self.backoff(h.failures)):
            h.failures = max(h.failures, 1)
            h.first_failure_at = h.last_failure_at = now
        else:
            self._add_failure(h, now)

    def _add_failure(self, h: _RelayHealth, now: float) -> None:
        h.failures += 1
        h.last_failure_at = now
        if h.first_failure_at is None:
            h.first_failure_at = now

    def failures(self, relay: str, now: float) -> int:
        h = self._get(relay)
        self._settle(h, now)
        return h.failures

    def is_dead(self, relay: str, now: float) -> bool:
        h = self._get(relay)
        self._settle(h, now)
        return self._is_dead(h, now)

    @staticmethod
    def _is_dead(h: _RelayHealth, now: float) -> bool:
        return (
            not h.connected
            and h.first_failure_at is not None
            and now - h.first_failure_at >= DEAD_AFTER_SECS
        )

    def next_attempt_at(self, relay: str, now: float) -> float:
        """Earliest time a connection attempt is allowed (``now`` if it is allowed now)."""
        h = self._get(relay)
        self._settle(h, now)
        return self._earliest(h, now)

    def should_attempt_connection(self, relay: str, now: float) -> bool:
        """``next_attempt_at(relay, now) <= now`` for one not connected nor being dialled
        (asked of every disconnected relay at every tick: dead ones gather in a long-running
        table)."""
        h = self._get(relay)
        if h.connected or h.attempt_in_flight:
            return False
        self._settle(h, now)
        return self._earliest(h, now) <= now

    def _earliest(self, h: _RelayHealth, now: float) -> float:
        """The latest of ``now``, the backoff's (or a dead relay's) retry, the cooldown's
        end and the park's (each compared where it is read: no ``max`` call per tick)."""
        earliest = now
        if h.failures and h.last_failure_at is not None:
            retry = h.last_failure_at + (DEAD_RETRY_SECS if self._is_dead(h, now) else self.backoff(h.failures))
            if retry > earliest:
                earliest = retry
        if h.cooldown_until is not None and h.cooldown_until > earliest:
            earliest = h.cooldown_until
        if h.parked_until is not None and h.parked_until > earliest:
            earliest = h.parked_until
        return earliest

    def state(self, relay: str, now: float) -> HealthState:
        h = self._get(relay)
        self._settle(h, now)
        if h.cooldown_until is not None:
            return HealthState.RATE_LIMITED
        if h.probing:
            return HealthState.PROBING
        if self._is_dead(h, now):
            return HealthState.DEAD
        if h.failures:
            return HealthState.DEGRADED  # failing, or recovered but not yet stable
        return HealthState.HEALTHY if h.connected else HealthState.DISCONNECTED

    def status_metric(self, relay: str, now: float) -> int:
        return STATUS_METRIC[self.state(relay, now)]

    # -- rate limiting and pacing

    def record_rate_limited(self, relay: str, now: float, *, query_rate: bool = True,
                            at_least: float | None = None) -> None:
        """The relay refused for rate. A refusal inside the cooldown does not extend it; one
        after it starts a new cooldown (a new episode). ``query_rate``: it limits how often
        we start queries, so pace all starts and stop NIP-77 (whose frames we cannot pace).
        ``at_least``: seconds the relay itself asked for (an HTTP ``Retry-After``), kept up
        to the longest backoff even inside a cooldown."""
        h = self._get(relay)
        self._settle(h, now)
        asked = now + min(at_least, self.max_backoff) if at_least else now
        if h.cooldown_until is not None:
            h.cooldown_until = max(h.cooldown_until, asked)
            return
        # still limited at the first requests after the last cooldown, nothing served since:
        # a limit of minutes, not one window; the next cooldown is twice as long (each probe
        # a cooldown apart was one more refused request: 7 in 6 minutes, seed 13 of
        # --fault-scale 3 with --per-filter 0.3)
        again = (h.probing and h.cooldown_ended_at is not None
                 and now - h.cooldown_ended_at < RATE_LIMIT_COOLDOWN_MAX_SECS)
        h.cooldowns_in_a_row = h.cooldowns_in_a_row + 1 if again else 0
        cooldown = max(RATE_LIMIT_COOLDOWN_SECS, min(RATE_LIMIT_COOLDOWN_SECS * 2 ** min(h.cooldowns_in_a_row, 16),
                                                     RATE_LIMIT_COOLDOWN_MAX_SECS))
        h.cooldown_until, h.probing = max(now + cooldown, asked), False
        if query_rate:
            h.reactive_gap = (
                REACTIVE_GATE_START_SECS
                if h.reactive_gap is None
                else min(h.reactive_gap * 2, REACTIVE_GATE_MAX_SECS)
            )
            h.negentropy_disabled = True
            # refused at the pace learnt before: slower than that too (seed 592 of the
            # stress mix: a relay allowing 20 queries then one per 2 s refused every daily
            # sync's burst, and NIP-77 with it, for 19 days)
            learned = h.reactive_gap if self._pace_kept(h, now) is None else max(
                h.reactive_gap, min(2 * h.learned_gap, REACTIVE_GATE_MAX_SECS))
            h.learned_gap, h.learned_at = learned, now

    def record_request_succeeded(self, relay: str, now: float) -> None:
        """A request completed normally: a probe after the cooldown has passed (the next
        cooldown is the first of a row again)."""
        h = self._get(relay)
        self._settle(h, now)
        h.probing = False
        h.cooldowns_in_a_row = 0

    def is_rate_limited(self, relay: str, now: float) -> bool:
        h = self._get(relay)
        self._settle(h, now)
        return h.cooldown_until is not None

    def cooldown_remaining(self, relay: str, now: float) -> float:
        h = self._get(relay)
        self._settle(h, now)
        return 0.0 if h.cooldown_until is None else h.cooldown_until - now

    def limits_query_rate(self, relay: str) -> bool:
        """Did this session's connection refuse us for query rate (the reactive gate is on)?"""
        return self._get(relay).reactive_gap is not None

    def negentropy_allowed(self, relay: str) -> bool:
        return not self._get(relay).negentropy_disabled

    def disable_negentropy(self, relay: str) -> None:
        """NEG-ERR, no answer in 15 s, or a NOTICE about it: not for this session."""
        self._get(relay).negentropy_disabled = True

    def allow_negentropy(self, relay: str) -> None:
        """A new session on the same connection (the daily fresh start): NIP-77 may be
        tried again."""
        self._get(relay).negentropy_disabled = False

    def wait_before_start(self, relay: str, now: float, *, background: bool) -> float:
        """Seconds to wait before starting a query (0: start now).

        During a cooldown nothing starts. The reactive gate (after a query-rate refusal)
        spaces every start; the proactive gate spaces only background starts — historic,
        pagination, retries, NIP-77 rounds — at 1 s. Live subscriptions bypass it.
        """
        h = self._get(relay)
        self._settle(h, now)
        ready = now
        if h.cooldown_until is not None:
            ready = max(ready, h.cooldown_until)
        if h.reactive_gap is not None and h.last_start_at is not None:
            ready = max(ready, h.last_start_at + h.reactive_gap)
        if background and h.last_background_start_at is not None:
            gap = max(self.proactive_gap, self._pace_kept(h, now) or 0.0)
            ready = max(ready, h.last_background_start_at + gap)
        return ready - now

    @staticmethod
    def _pace_kept(h: _RelayHealth, now: float) -> float | None:
        """The query pace ``h``'s refusals taught, if one came within QUERY_PACE_KEEP_SECS."""
        if h.learned_at is None or now - h.learned_at >= QUERY_PACE_KEEP_SECS:
            return None
        return h.learned_gap

    def start_interval(self, relay: str, now: float) -> float:
        """Seconds between background starts on ``relay`` now: the proactive gate, or the
        reactive one after a query-rate refusal, or the pace its refusals taught, if longer."""
        h = self._relays.get(relay)  # reading adds no record
        if h is None:
            return self.proactive_gap
        return max(self.proactive_gap, h.reactive_gap or 0.0, self._pace_kept(h, now) or 0.0)

    def start_pace(self, relay: str) -> float | None:
        """Seconds between ``relay``'s background starts lately, as they went (None: fewer
        than two this session)."""
        h = self._relays.get(relay)
        return h.start_pace if h else None

    def may_start_background(self, relay: str, now: float) -> float:
        return self.wait_before_start(relay, now, background=True)

    def may_start_live(self, relay: str, now: float) -> float:
        return self.wait_before_start(relay, now, background=False)

    def record_start(self, relay: str, now: float, *, background: bool) -> None:
        h = self._get(relay)
        h.last_start_at = now
        if background:
            last, h.last_background_start_at = h.last_background_start_at, now
            gap = None if last is None else now - last
            if gap is not None and gap <= PACE_IDLE_SECS:
                h.start_pace = gap if h.start_pace is None else h.start_pace + PACE_WEIGHT * (gap - h.start_pace)


# -- misbehaviour --------------------------------------------------------------------------


class MisbehaviourBudget:
    """Misbehaviour points of one relay session: a token bucket (constants.MISBEHAVIOUR_*).

    It starts full; every dropped frame or event (and every NOTICE) spends a point; it
    refills at ``refill_per_sec`` up to ``capacity``. ``spend`` says False once it is
    overdrawn: the connection hangs up.
    """

    def __init__(self, capacity: float, refill_per_sec: float, now: float):
        self.capacity = capacity
        self.refill_per_sec = refill_per_sec
        self.points = float(capacity)
        self._at = now

    def spend(self, now: float, points: float = 1.0) -> bool:
        self.points = min(self.capacity, self.points + (now - self._at) * self.refill_per_sec)
        self._at = now
        self.points -= points
        return self.points >= 0
