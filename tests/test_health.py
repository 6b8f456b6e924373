"""RelayHealthTracker: backoff, Dead, stability, rate-limit cooldown, pacing gates
and refusal classification (SPEC §5). Time is passed in; nothing sleeps."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gsync.sync.health import (
    HealthState,
    MisbehaviourBudget,
    Refusal,
    RelayHealthTracker,
    classify_refusal,
    permanent_http_status,
    retry_after_secs,
    split_prefix,
)

R = "wss://relay.example"
H = 3600.0
DAY = 24 * H


def classify_message(message: str) -> Refusal:
    """A refusal's whole text: its prefix split off, then both read."""
    return classify_refusal(*split_prefix(message))


def tracker():
    return RelayHealthTracker(base_backoff=5.0, max_backoff=3600.0)


def fail(t, now, times=1):
    for _ in range(times):
        t.record_attempt_started(R, now)
        t.record_failure(R, now)


def connect(t, now):
    t.record_attempt_started(R, now)
    t.record_success(R, now)


# -- connection health -------------------------------------------------------------------


def test_new_relay_is_disconnected_and_may_connect_now():
    t = tracker()
    assert t.state(R, 0) is HealthState.DISCONNECTED
    assert t.should_attempt_connection(R, 0)
    assert t.next_attempt_at(R, 0) == 0
    assert t.status_metric(R, 0) == 2


def test_connected_without_failures_is_healthy():
    t = tracker()
    connect(t, 0)
    assert t.state(R, 1) is HealthState.HEALTHY
    assert t.status_metric(R, 1) == 1
    assert not t.should_attempt_connection(R, 1)


def test_backoff_doubles_from_base_and_is_capped():
    t = tracker()
    assert [t.backoff(n) for n in (0, 1, 2, 3, 4)] == [0, 5, 10, 20, 40]
    assert t.backoff(20) == 3600


def test_failure_backs_off_from_the_failure_time():
    t = tracker()
    fail(t, 100)
    assert t.state(R, 100) is HealthState.DEGRADED
    assert t.status_metric(R, 100) == 3
    assert t.next_attempt_at(R, 100) == 105
    assert not t.should_attempt_connection(R, 104.9)
    assert t.should_attempt_connection(R, 105)
    fail(t, 105)
    assert t.next_attempt_at(R, 105) == 115
    assert t.failures(R, 105) == 2


def test_no_second_attempt_while_one_is_in_flight():
    t = tracker()
    t.record_attempt_started(R, 0)
    assert not t.should_attempt_connection(R, 1000)


def test_constructor_backoff_settings_are_used():
    t = RelayHealthTracker(base_backoff=1.0, max_backoff=3.0)
    for _ in range(5):
        t.record_failure(R, 0)
    assert t.next_attempt_at(R, 0) == 3.0


def test_dead_after_24h_of_continuous_failure_then_daily_attempts():
    t = tracker()
    fail(t, 0)
    now = 0.0
    while now < DAY:
        now = t.next_attempt_at(R, now)
        fail(t, now)
    assert t.state(R, now) is HealthState.DEAD
    assert t.status_metric(R, now) == 4
    assert t.next_attempt_at(R, now) == now + DAY
    assert not t.should_attempt_connection(R, now + DAY - 1)
    assert t.should_attempt_connection(R, now + DAY)


def test_not_dead_before_24h():
    t = tracker()
    fail(t, 0)
    fail(t, DAY - 1)
    assert t.state(R, DAY - 1) is HealthState.DEGRADED


def test_recovered_connection_is_degraded_until_stable():
    t = tracker()
    fail(t, 0, times=3)
    connect(t, 100)
    assert t.state(R, 100) is HealthState.DEGRADED
    assert t.failures(R, 399) == 3
    assert t.state(R, 400) is HealthState.HEALTHY  # survived 5 minutes
    assert t.failures(R, 400) == 0


def test_short_lived_recovery_continues_the_failure_streak():
    t = tracker()
    fail(t, 0, times=3)
    connect(t, 100)
    t.record_disconnect(R, 130)  # 30 s: before the stability period, and not a minute
    assert t.failures(R, 130) == 4
    assert t.next_attempt_at(R, 130) == 130 + 40


def test_a_relay_that_accepts_and_drops_backs_off_to_the_cap():
    t = tracker()
    now = 0.0
    for _ in range(20):
        connect(t, now)
        t.record_disconnect(R, now + 1)
        now = t.next_attempt_at(R, now + 1)
    assert t.backoff(t.failures(R, now)) == 3600


def test_a_session_that_worked_longer_than_the_wait_keeps_the_streak_level():
    t = tracker()
    fail(t, 0, times=3)  # waiting 20 s
    connect(t, 100)
    t.record_disconnect(R, 280)  # three minutes: not stable, but it worked
    assert t.failures(R, 280) == 3  # continued, not cleared ...
    assert t.state(R, 280) is HealthState.DEGRADED
    assert t.next_attempt_at(R, 280) == 280 + 20  # ... and not grown


def test_a_relay_restarting_every_three_minutes_is_redialled_after_seconds_not_an_hour():
    t = tracker()
    now = 0.0
    for _ in range(30):  # an hour and a half: up three minutes, down five seconds
        connect(t, now)
        now += 180
        t.record_disconnect(R, now)
        back = now + 5
        while True:
            now = t.next_attempt_at(R, now)
            if now >= back:
                break
            t.record_attempt_started(R, now)
            t.record_failure(R, now)  # refused while it restarts
    assert now - back <= 180  # never away longer than it stays up
    assert t.state(R, now) is HealthState.DEGRADED
    assert not t.is_dead(R, now + DAY - 200)  # not failing continuously: never dead


# -- a session that served: the relay works (record_served) ------------------------------


def serve(t, now, lasted, served=True):
    """A session from ``now`` that answered something a second in (if ``served``), ended
    ``lasted`` seconds later by the relay."""
    connect(t, now)
    if served:
        t.record_served(R)
    t.record_disconnect(R, now + lasted)
    return now + lasted


def restarting_relay(t, up: float, down: float, cycles: int, now: float = 0.0):
    """A relay up ``up`` seconds, then down ``down`` (restarting), ``cycles`` times; gsync
    dials whenever the tracker allows, a dial while it is down fails, a session serves.
    Returns, per restart, (seconds gsync stayed away after the relay was back, the session's
    length), and the time the last cycle ended."""
    cycles_seen = []
    back = now  # the relay is up from here
    for _ in range(cycles):
        now = t.next_attempt_at(R, now)
        while now < back:  # dialled while it restarts: refused
            t.record_attempt_started(R, now)
            t.record_failure(R, now)
            now = t.next_attempt_at(R, now)
        down_at = back + up
        if now >= down_at:  # missed the whole window
            cycles_seen.append((now - back, 0.0))
        else:
            serve(t, now, down_at - now)
            cycles_seen.append((now - back, down_at - now))
        back = down_at + down
        now = max(now, down_at)
    return cycles_seen, now


@pytest.mark.parametrize("streak", [0, 3, 12])
@pytest.mark.parametrize("down", [5, 13, 30])
@pytest.mark.parametrize("up", [120, 180, 299, 420])
def test_a_relay_restarting_every_few_minutes_is_redialled_seconds_after_it_is_back(up, down, streak):
    """Seed 2 of the simulator (tests/test_sim.py): restarts every 2-7 minutes, 5-30 s each.
    Whatever streak it started with (12: the hour's cap), gsync is back within the restart's
    own length and the base backoff of the relay's return, every time, and it never turns Dead."""
    t = tracker()
    fail(t, 0, times=streak)
    start = t.next_attempt_at(R, 0)
    cycles, end = restarting_relay(t, up, down, cycles=int(DAY // (up + down)) + 2, now=start)
    away = [a for a, _ in cycles[1:]]
    assert max(away) <= down + 5, away
    assert min(length for _, length in cycles) >= up - down - 5
    assert not t.is_dead(R, end)


def test_a_session_that_served_a_minute_starts_the_streak_again_from_one():
    t = tracker()
    fail(t, 0, times=12)  # at the cap
    assert t.backoff(t.failures(R, 0)) == 3600
    end = serve(t, 3600, 60)
    assert t.failures(R, end) == 1
    assert t.next_attempt_at(R, end) == end + 5
    fail(t, end + 5)  # a dial while it restarts: the streak doubles from there
    assert t.next_attempt_at(R, end + 5) == end + 5 + 10
    assert t.state(R, end + 5) is HealthState.DEGRADED


@pytest.mark.parametrize("lasted", [1, 30, 59.9])
def test_a_session_that_served_less_than_a_minute_grows_the_streak(lasted):
    t = tracker()
    fail(t, 0, times=3)
    end = serve(t, 100, lasted)
    assert t.failures(R, end) == 4
    assert t.next_attempt_at(R, end) == end + 40


def test_a_relay_that_serves_and_drops_within_a_minute_backs_off_to_the_cap():
    """It answers (an EOSE), then hangs up: a relay that crashes on a request, say."""
    t = tracker()
    now = 0.0
    for _ in range(20):
        now = t.next_attempt_at(R, serve(t, now, 30))
    assert t.backoff(t.failures(R, now)) == 3600


def test_a_session_that_served_nothing_does_not_start_the_streak_again():
    t = tracker()
    fail(t, 0, times=5)  # waiting 80 s
    end = serve(t, 100, 70, served=False)  # over a minute, shorter than the wait: grows
    assert t.failures(R, end) == 6
    end = serve(t, end + 160, 200, served=False)  # not stable, longer than its 160 s wait: level
    assert t.failures(R, end) == 6
    assert t.next_attempt_at(R, end) == end + 160


def test_served_is_the_session_s_own():
    """A session that served does not lend it to the next one, nor does an answer read
    while disconnected count (a late frame of the session that ended)."""
    t = tracker()
    fail(t, 0, times=6)
    end = serve(t, 200, 120)  # served, two minutes: back to one
    assert t.failures(R, end) == 1
    t.record_served(R)  # disconnected: ignored
    end = serve(t, end + 5, 30, served=False)  # half a minute, nothing served: grows
    assert t.failures(R, end) == 2
    end = serve(t, end + 10, 61, served=False)  # a minute, unserved: level (longer than 10 s)
    assert t.failures(R, end) == 2


def test_a_relay_refusing_after_its_last_served_session_backs_off_to_the_cap_then_is_dead():
    t = tracker()
    now = serve(t, 0, 120)
    waits = []
    while not t.is_dead(R, now):
        nxt = t.next_attempt_at(R, now)
        waits.append(nxt - now)
        now = nxt
        fail(t, now)
    assert waits[:4] == [5, 10, 20, 40] and max(waits) == 3600
    assert DAY <= now - 120 <= DAY + 3600  # 24 h of continuous failure after it served
    assert t.next_attempt_at(R, now) == now + DAY


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["refused", "session"]), st.integers(0, 600), st.booleans()),
                max_size=40))
def test_the_rule_over_any_history(history):
    """Over any history of refused dials and sessions (of any length, serving or not), at
    the earliest time the tracker allows: after a session that served for a minute and
    ended before stability the next wait is the base; after one that was stable, none; a
    refused dial doubles the wait, up to the cap; a session under a minute never shortens
    it; no wait is ever over the cap."""
    t = tracker()
    now = 0.0
    for what, lasted, served in history:
        before = t.failures(R, now)
        now = t.next_attempt_at(R, now)
        if what == "refused":
            fail(t, now)
            assert t.failures(R, now) == before + 1
            assert t.next_attempt_at(R, now) - now == min(5 * 2 ** before, 3600)
            continue
        end = serve(t, now, lasted, served)
        wait = t.next_attempt_at(R, end) - end
        if lasted >= 300:
            assert wait == 0 and t.failures(R, end) == 0
        elif served and lasted >= 60:
            assert wait == 5 and t.failures(R, end) == 1
        elif lasted < 60:
            assert t.failures(R, end) == before + 1
            assert wait == min(5 * 2 ** before, 3600)
        assert 0 <= wait <= 3600
        now = end


def test_a_first_drop_after_a_working_session_waits_the_base_backoff():
    t = tracker()
    connect(t, 0)
    t.record_disconnect(R, 120)
    assert t.failures(R, 120) == 1
    assert t.next_attempt_at(R, 120) == 125


def test_short_lived_recovery_does_not_restart_the_dead_clock():
    t = tracker()
    fail(t, 0)
    connect(t, DAY - 100)
    t.record_disconnect(R, DAY - 50)
    assert t.state(R, DAY) is HealthState.DEAD


def test_stable_connection_dropping_is_just_disconnected():
    t = tracker()
    connect(t, 0)
    t.record_disconnect(R, 1000)
    assert t.state(R, 1000) is HealthState.DISCONNECTED
    assert t.should_attempt_connection(R, 1000)


def test_a_hang_up_for_misbehaviour_is_a_failure_even_after_a_stable_session():
    t = tracker()
    connect(t, 0)
    t.record_disconnect(R, 1000, misbehaved=True)
    assert t.failures(R, 1000) == 1
    assert not t.should_attempt_connection(R, 1004)
    assert t.should_attempt_connection(R, 1005)
    connect(t, 1005)
    t.record_disconnect(R, 1006, misbehaved=True)  # and again: the backoff doubles
    assert t.next_attempt_at(R, 1006) == 1006 + 10


def test_misbehaving_only_once_settled_still_backs_off_further_each_time():
    t = tracker()
    now = 0
    for streak in range(1, 5):
        connect(t, now)
        now += 600  # stable (5 min) before it misbehaves: the failure streak is cleared ...
        assert t.failures(R, now) == 0
        t.record_disconnect(R, now, misbehaved=True)
        # ... but not the misbehaviour streak
        assert t.next_attempt_at(R, now) == now + 5 * 2 ** (streak - 1)
        now = t.next_attempt_at(R, now)
    connect(t, now)
    t.record_disconnect(R, now + 600)  # a session that ends without misbehaving
    connect(t, now + 601)
    t.record_disconnect(R, now + 1201, misbehaved=True)
    assert t.next_attempt_at(R, now + 1201) == now + 1201 + 5  # the streak started over


def test_repeated_disconnect_notification_counts_once():
    t = tracker()
    connect(t, 0)
    t.record_disconnect(R, 10)
    t.record_disconnect(R, 11)
    assert t.failures(R, 11) == 1


def test_relays_are_tracked_independently():
    t = tracker()
    fail(t, 0)
    assert t.state("wss://other.example", 0) is HealthState.DISCONNECTED


# -- rate limiting ------------------------------------------------------------------------


def test_a_query_rate_refusal_marks_the_session_until_the_next_connection():
    t = tracker()
    connect(t, 0)
    assert not t.limits_query_rate(R)
    t.record_rate_limited(R, 10)
    assert t.limits_query_rate(R)
    t.record_disconnect(R, 20)
    connect(t, 400)
    assert not t.limits_query_rate(R)


def test_rate_limit_cooldown_is_65s_then_probing_until_a_success():
    t = tracker()
    connect(t, 0)
    t.record_rate_limited(R, 10)
    assert t.state(R, 10) is HealthState.RATE_LIMITED
    assert t.status_metric(R, 10) == 5
    assert t.cooldown_remaining(R, 10) == 65
    assert t.state(R, 75) is HealthState.PROBING
    assert not t.is_rate_limited(R, 75)
    t.record_request_succeeded(R, 76)
    assert t.state(R, 76) is HealthState.HEALTHY


def test_repeats_inside_the_cooldown_do_not_extend_it():
    t = tracker()
    t.record_rate_limited(R, 0)
    t.record_rate_limited(R, 30)
    t.record_rate_limited(R, 64)
    assert t.is_rate_limited(R, 64.9)
    assert not t.is_rate_limited(R, 65)


def test_refusal_while_probing_starts_a_new_cooldown_twice_as_long_up_to_the_most():
    """Still limited at the first request after a cooldown: a limit of minutes, not one
    window, so each cooldown in a row doubles (65, 130, 260, 520, then 600 s), and a request
    served ends the row, as does a cooldown long over (seed 13 of --fault-scale 3: a relay
    limited for 10 minutes was asked once every 65 s)."""
    from gsync.constants import RATE_LIMIT_COOLDOWN_MAX_SECS

    t = tracker()
    t.record_rate_limited(R, 0)
    now, lengths = 0.0, []
    for _ in range(5):
        now += t.cooldown_remaining(R, now) + 5
        t.record_rate_limited(R, now)
        assert t.state(R, now) is HealthState.RATE_LIMITED
        lengths.append(t.cooldown_remaining(R, now))
    assert lengths == [130, 260, 520, RATE_LIMIT_COOLDOWN_MAX_SECS, RATE_LIMIT_COOLDOWN_MAX_SECS]
    now += t.cooldown_remaining(R, now) + 5
    t.record_request_succeeded(R, now)  # served: the row is over
    t.record_rate_limited(R, now + 1)
    assert t.cooldown_remaining(R, now + 1) == 65
    now += 66 + RATE_LIMIT_COOLDOWN_MAX_SECS  # nothing asked since its end: a new episode
    t.record_rate_limited(R, now)
    assert t.cooldown_remaining(R, now) == 65


def test_reconnecting_does_not_lift_a_rate_limit():
    t = tracker()
    connect(t, 0)
    t.record_rate_limited(R, 1)
    t.record_disconnect(R, 2)
    t.record_success(R, 3)
    assert t.is_rate_limited(R, 3)


def test_rate_limited_relay_is_not_redialled_during_cooldown():
    t = tracker()
    t.record_rate_limited(R, 0)
    assert t.next_attempt_at(R, 0) == 65


def test_a_retry_after_longer_than_the_cooldown_is_kept_up_to_the_longest_backoff():
    t = tracker()
    t.record_rate_limited(R, 0, query_rate=False, at_least=300)
    assert t.next_attempt_at(R, 0) == 300
    t.record_rate_limited(R, 100, query_rate=False, at_least=900)  # inside: it may ask for more
    assert t.next_attempt_at(R, 100) == 1000
    t.record_rate_limited(R, 200, query_rate=False, at_least=10)  # ... never for less
    assert t.next_attempt_at(R, 200) == 1000
    other = "wss://other.example"
    t.record_rate_limited(other, 0, query_rate=False, at_least=10)  # shorter: the 65 s stand
    assert t.next_attempt_at(other, 0) == 65
    t.record_rate_limited("wss://greedy.example", 0, at_least=1e12)
    assert t.next_attempt_at("wss://greedy.example", 0) == 3600  # max_backoff
    assert t.negentropy_allowed(R)  # a refused handshake says nothing about query rate


@pytest.mark.parametrize("value, secs", [
    (None, None), ("", None), ("120", 120.0), (" 7 ", 7.0), ("0", 0.0),
    ("-5", None), ("1.5", None), ("soon", None), ("\u0663", None),  # an Arabic-Indic 3
    ("9" * 40, 1e12),
    ("Thu, 01 Jan 1970 00:02:00 GMT", 20.0),  # HTTP-date, now = 100
    ("Thursday, 01-Jan-70 00:02:00 GMT", 20.0),  # RFC 850
    ("Thu Jan  1 00:02:00 1970", 20.0),  # asctime, no zone: GMT
    ("Thu, 01 Jan 1970 00:00:10 GMT", 0.0),  # already past
])
def test_retry_after_is_seconds_or_an_http_date(value, secs):
    assert retry_after_secs(value, 100.0) == secs


# -- pacing gates -------------------------------------------------------------------------


def test_proactive_gate_spaces_background_starts_one_second():
    t = tracker()
    connect(t, 0)
    assert t.may_start_background(R, 10) == 0
    t.record_start(R, 10, background=True)
    assert t.may_start_background(R, 10.25) == pytest.approx(0.75)
    assert t.may_start_background(R, 11) == 0


def test_live_starts_bypass_the_proactive_gate():
    t = tracker()
    connect(t, 0)
    t.record_start(R, 10, background=True)
    assert t.may_start_live(R, 10) == 0


def test_query_rate_refusal_gates_all_starts_and_doubles_per_episode():
    t = tracker()
    connect(t, 0)
    t.record_rate_limited(R, 0)
    t.record_start(R, 65, background=False)
    assert t.may_start_live(R, 65) == pytest.approx(0.6)
    t.record_rate_limited(R, 70)  # a distinct later episode (its cooldown twice as long)
    end = 70 + t.cooldown_remaining(R, 70)
    t.record_start(R, end, background=False)
    assert t.may_start_live(R, end) == pytest.approx(1.2)
    now = end + 5
    for _ in range(10):
        t.record_rate_limited(R, now)
        now += t.cooldown_remaining(R, now) + 1
    t.record_start(R, now, background=False)
    assert t.may_start_live(R, now) == pytest.approx(10.0)


def test_the_pace_query_rate_refusals_taught_spaces_later_sessions_background_starts_for_a_week():
    """Seed 592 of the stress mix: a relay allowing 20 queries, then one per 2 s, refused
    every session's (and daily sync's) burst at the proactive gate, NIP-77 with it, and an
    import only NIP-77 reaches there never came in 19 days. The gap its refusals taught
    spaces later sessions' background starts (live ones as the proactive gate does: not),
    doubles if refused at it, and is forgotten a week after the last such refusal."""
    from gsync.constants import QUERY_PACE_KEEP_SECS

    t = tracker()
    connect(t, 0)
    now = 0.0
    for _ in range(3):  # three episodes: 0.6, 1.2, 2.4 s
        t.record_rate_limited(R, now)
        now += t.cooldown_remaining(R, now) + 1
    t.record_disconnect(R, now)
    connect(t, now + 100)
    now += 100
    t.record_request_succeeded(R, now)  # (the new session is served: its limit is over)
    assert t.limits_query_rate(R) is False and t.negentropy_allowed(R)  # (a new session)
    t.record_start(R, now, background=True)
    assert t.may_start_background(R, now) == pytest.approx(2.4)
    assert t.may_start_live(R, now) == 0
    assert t.start_interval(R, now) == pytest.approx(2.4)
    t.record_rate_limited(R, now + 1)  # refused at that pace: slower still
    t.record_start(R, now + 70, background=True)
    assert t.may_start_background(R, now + 70) == pytest.approx(4.8)
    later = now + 1 + QUERY_PACE_KEEP_SECS
    t.record_disconnect(R, later - 10)
    connect(t, later)
    t.record_start(R, later, background=True)
    assert t.may_start_background(R, later) == pytest.approx(1.0)  # the proactive gate alone


def test_nothing_starts_during_the_cooldown():
    t = tracker()
    connect(t, 0)
    t.record_rate_limited(R, 0)
    assert t.may_start_live(R, 5) == 60
    assert t.may_start_background(R, 5) == 60


def test_query_rate_refusal_disables_nip77_for_the_session():
    t = tracker()
    connect(t, 0)
    assert t.negentropy_allowed(R)
    t.record_rate_limited(R, 1)
    assert not t.negentropy_allowed(R)
    t.record_disconnect(R, 2)
    t.record_success(R, 100)  # a new session
    assert t.negentropy_allowed(R)
    assert t.may_start_live(R, 100) == 0  # the reactive gate reset too


def test_non_query_rate_limit_keeps_nip77_and_no_reactive_gate():
    t = tracker()
    connect(t, 0)
    t.record_rate_limited(R, 1, query_rate=False)
    assert t.negentropy_allowed(R)
    t.record_start(R, 70, background=False)
    assert t.may_start_live(R, 70) == 0


def test_disable_negentropy_after_neg_err():
    t = tracker()
    connect(t, 0)
    t.disable_negentropy(R)
    assert not t.negentropy_allowed(R)


# -- refusal classification --------------------------------------------------------------


@pytest.mark.parametrize(
    "message, kind",
    [
        ("rate-limited: slow down", Refusal.RATE_LIMIT),
        ("error: too many concurrent REQs", Refusal.RATE_LIMIT),
        ("Too Many Requests", Refusal.RATE_LIMIT),
        ("you are being throttled", Refusal.RATE_LIMIT),
        ("please slow down", Refusal.RATE_LIMIT),
        ("blocked: too many queries", Refusal.RATE_LIMIT),  # rate wording wins over policy
        ("blocked: you are banned", Refusal.POLICY),
        ("restricted: members only", Refusal.POLICY),
        ("auth-required: we only serve authenticated users", Refusal.AUTH),
        ("unsupported: filter contains unknown elements", Refusal.UNSUPPORTED),
        ("invalid: unindexed tag", Refusal.UNSUPPORTED),
        ("error: could not connect to the database", Refusal.OTHER),
        ("", Refusal.OTHER),
        # about the REQ's shape, not its rate: split, never a cooldown (whose REQ would be
        # refused again after every one)
        ("error: too many filters", Refusal.UNSUPPORTED),
        ("ERROR: bad req: too many filters", Refusal.UNSUPPORTED),
        ("invalid: filter too large", Refusal.UNSUPPORTED),
        ("error: too many tags in one filter", Refusal.UNSUPPORTED),
        ("error: max filters per subscription is 5", Refusal.UNSUPPORTED),
        ("rate-limited: too many filters", Refusal.RATE_LIMIT),  # the prefix says what it is
    ],
)
def test_classify_message(message, kind):
    assert classify_message(message) is kind


def test_classify_refusal_takes_prefix_and_text():
    assert classify_refusal("BLOCKED", "nope") is Refusal.POLICY
    assert classify_refusal("rate-limited") is Refusal.RATE_LIMIT


def test_split_prefix():
    assert split_prefix("blocked: you are banned") == ("blocked", "you are banned")
    assert split_prefix("no prefix here") == ("", "no prefix here")
    assert split_prefix("error at 10:30 today") == ("", "error at 10:30 today")


# -- misbehaviour budget ------------------------------------------------------------------


def test_the_budget_allows_a_burst_then_refuses():
    b = MisbehaviourBudget(capacity=5, refill_per_sec=1.0, now=0)
    assert all(b.spend(0) for _ in range(5))
    assert not b.spend(0)


def test_the_budget_refills_with_time_up_to_its_capacity():
    b = MisbehaviourBudget(capacity=5, refill_per_sec=2.0, now=0)
    for _ in range(5):
        b.spend(0)
    assert b.spend(0.5) and not b.spend(0.5)  # one point back after half a second
    assert all(b.spend(1000) for _ in range(5))  # long quiet: full again, not more
    assert not b.spend(1000)


def test_a_slow_steady_trickle_never_overdraws_the_budget():
    b = MisbehaviourBudget(capacity=10, refill_per_sec=10.0, now=0)
    assert all(b.spend(i * 0.1) for i in range(10_000))  # 10 a second, for 1,000 s


# -- permanent failures ------------------------------------------------------------------


@pytest.mark.parametrize("status,permanent", [(404, True), (403, True), (502, True), (410, True),
                                              (301, True), (400, True), (429, False), (503, False),
                                              (500, False), (504, False), (408, False), (None, False)])
def test_an_upgrade_answer_is_permanent_unless_it_says_try_again(status, permanent):
    assert permanent_http_status(status) is permanent


def test_a_permanent_failure_parks_the_relay_for_12_hours_past_any_backoff():
    t = tracker()
    t.record_attempt_started(R, 0)
    t.record_failure(R, 0, permanent="http 404")
    assert t.next_attempt_at(R, 1) == 12 * H
    assert t.parked(R, 1) == ("http 404", 12 * H - 1)
    assert not t.should_attempt_connection(R, 12 * H - 1)
    assert t.should_attempt_connection(R, 12 * H)
    assert t.parked(R, 12 * H) is None


def test_a_transient_failure_after_a_park_does_not_extend_it_and_a_success_clears_it():
    t = tracker()
    t.record_attempt_started(R, 0)
    t.record_failure(R, 0, permanent="dns")
    fail(t, 12 * H)  # the attempt after the park: a timeout this time
    assert t.parked(R, 12 * H) is None
    assert t.next_attempt_at(R, 12 * H) < 13 * H  # the usual backoff
    t.record_attempt_started(R, 0)
    t.record_failure(R, 0, permanent="tls")
    connect(t, 1)
    assert t.parked(R, 2) is None


# -- a relay retired and listed again ---------------------------------------------------------


def dead(t, now=0.0):
    """``R`` failing from ``now`` until dead; the time of its last failure."""
    fail(t, now)
    while now < now + DAY and t.state(R, now) is not HealthState.DEAD:
        now = t.next_attempt_at(R, now)
        fail(t, now)
    return now


def test_a_dead_relay_retired_and_readmitted_within_a_day_is_still_dead():
    t = tracker()
    last = dead(t)
    t.retire(R, last + 60)
    assert t.state(R, last + 60) is HealthState.DISCONNECTED  # out of the table: nothing of it
    t.readmit(R, last + 120)
    assert t.state(R, last + 120) is HealthState.DEAD
    assert t.next_attempt_at(R, last + 120) == last + DAY  # its daily attempt, not a dial at once


def test_a_relay_readmitted_after_its_retired_record_ran_out_starts_clean():
    t = tracker()
    last = dead(t)
    t.retire(R, last)
    t.readmit(R, last + DAY + 1)
    assert t.state(R, last + DAY + 1) is HealthState.DISCONNECTED
    assert t.should_attempt_connection(R, last + DAY + 1)


def test_a_rate_limited_relay_retired_and_readmitted_waits_out_its_cooldown():
    t = tracker()
    connect(t, 0)
    t.record_rate_limited(R, 10, query_rate=False, at_least=H)  # a Retry-After of an hour
    t.retire(R, 20)
    t.readmit(R, 30 * 60)
    assert t.is_rate_limited(R, 30 * 60)
    assert not t.should_attempt_connection(R, 30 * 60)
    assert t.should_attempt_connection(R, 10 + H)


def test_a_relay_retired_in_a_row_of_cooldowns_goes_on_with_the_row_when_readmitted():
    t = tracker()
    t.record_rate_limited(R, 0)
    t.record_rate_limited(R, 70)  # the first request after the cooldown, refused: 130 s
    t.retire(R, 80)
    t.readmit(R, 90)
    t.record_rate_limited(R, 205)  # refused again at the first request after it
    assert t.cooldown_remaining(R, 205) == 260


def test_a_failing_relay_keeps_its_backoff_and_dead_clock_through_retirement():
    t = tracker()
    fail(t, 0, times=6)  # a 160 s wait
    t.retire(R, 1)
    t.readmit(R, 2)
    assert t.next_attempt_at(R, 2) == 160.0
    assert t.failures(R, 2) == 6
    fail(t, DAY)
    assert t.state(R, DAY) is HealthState.DEGRADED  # failing a day, one second of it out of the table
    fail(t, DAY + 1)
    assert t.state(R, DAY + 1) is HealthState.DEAD


def test_a_healthy_relay_or_one_retired_in_session_leaves_nothing_behind():
    t = tracker()
    connect(t, 0)
    t.retire(R, 10)
    assert R not in t._retired
    fail(t, 20, times=3)
    connect(t, 30)  # back, not yet stable: its streak would stay
    t.retire(R, 40)  # but it was in session: it works
    assert R not in t._retired
    t.readmit(R, 50)
    assert t.failures(R, 50) == 0 and t.should_attempt_connection(R, 50)


def test_retired_records_are_bounded_and_expire(monkeypatch):
    from gsync.sync import health
    monkeypatch.setattr(health, "RETIRED_HEALTH_MAX", 3)
    t = tracker()
    for i in range(5):
        url = f"wss://r{i}.example"
        t.record_failure(url, i)
        t.retire(url, i)
    assert list(t._retired) == [f"wss://r{i}.example" for i in (2, 3, 4)]  # the oldest went
    t.record_failure("wss://late.example", DAY + 2.5)
    t.retire("wss://late.example", DAY + 2.5)  # those retired a day before it have run out
    assert list(t._retired) == ["wss://r3.example", "wss://r4.example", "wss://late.example"]
    t.readmit("wss://r4.example", DAY + 5)  # ran out: nothing comes back
    assert t.failures("wss://r4.example", DAY + 5) == 0 and "wss://r4.example" not in t._retired


def test_a_failing_relay_out_of_the_table_for_a_day_is_not_dead_when_readmitted():
    """Seed 11's 30 days (neglected_relay, day 22.17): relay2 failing for five hours,
    retired, up again while out of the table, listed again a day after it began failing.
    Nothing dialled it meanwhile: the time out does not count toward its dead mark, its
    backoff is over, it is dialled at once (dead, it would have waited a day)."""
    t = tracker()
    fail(t, 0, times=15)
    t.retire(R, 5 * H)
    t.readmit(R, 26 * H)
    assert t.state(R, 26 * H) is HealthState.DEGRADED
    assert t.should_attempt_connection(R, 26 * H)
    fail(t, 26 * H)
    assert t.state(R, 26 * H) is HealthState.DEGRADED  # failing 5 h of the 26, as far as gsync saw
