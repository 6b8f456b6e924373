"""When the manager dials a relay again after it went away (``sync.health`` decides, told by
the manager what each session did): a real ``SyncManager`` with recorded effects and a fake
clock (tests/manager_harness.py), fed the handshakes and answers a relay's connection would
post."""
import random

import pytest

from gsync import constants
from gsync.io.inbox import HandshakeDone, RelayDisconnected
from gsync.sync.relay_state import ConnectionStatus

from .factory import Author, announcement
from .manager_harness import FakeWs, ManagerHarness

A = "wss://a.example"
REPO = announcement(Author.named("u0"), "r0", relays=[A])
TICK = constants.MAINTENANCE_TICK_SECS


def dial_until_up(h, back_at: float, until: float, *, serves: str) -> float | None:
    """Tick as the manager's timer does; each dial it makes is refused while the relay is
    down (before ``back_at``) and taken once it is up; then it answers every REQ with EOSE
    (``serves="eose"``), sends an event on its first (``"events"``), or says nothing.
    When gsync got a session, or None if not before ``until``."""
    while h.clock.now < until:
        h.tick()
        if h.state(A).status is ConnectionStatus.CONNECTING:
            if h.clock.now < back_at:
                h.feed(HandshakeDone(A, h.state(A).attempt, error="connection refused"))
            else:
                h.feed(HandshakeDone(A, h.state(A).attempt, ws=FakeWs()))
                h.advance(1)
                if serves == "eose":
                    h.eose_all(A)
                elif serves == "events":
                    h.relay_sends(A, next(iter(h.conn(A).subscriptions)), REPO)
                return h.clock.now
        due = h.manager.health.next_attempt_at(A, h.clock.now)
        h.advance(max(TICK, min(due, until) - h.clock.now))  # (ticks between change nothing)
    return None


def restarts(h, *, cycles: int, serves: str) -> list[float]:
    """A relay, down for half an hour first (the failure streak grown to a 21-minute wait),
    then restarting every 2-7 minutes, down 5-30 s each time (the simulator's seed 2).
    Seconds gsync stayed away after the relay was back, per restart from its first session
    on (the window it missed entirely counts whole)."""
    rng = random.Random(2)
    away = []
    back_at = h.clock.now + 1800
    for _ in range(cycles):
        down_at = back_at + rng.uniform(120, 420)
        got = dial_until_up(h, back_at, down_at, serves=serves)
        if got is not None or away:
            away.append(down_at - back_at if got is None else got - back_at)
        if got is not None:
            h.advance(down_at - h.clock.now)
            h.feed(RelayDisconnected(A, h.state(A).session, "restarting"))
        back_at = down_at + rng.uniform(5, 30)
    return away


@pytest.mark.parametrize("serves", ["eose", "events"])
def test_a_relay_restarting_every_few_minutes_is_dialled_again_seconds_after_it_is_back(tmp_path, serves):
    """Its sessions serve (EOSE, or events): after the first, gsync is back within the base backoff and a
    tick of the relay's return each time, whatever the streak its hour down had grown. (Before:
    every session shorter than the wait before it grew the streak, and the relay was dialled
    once an hour.)"""
    h = ManagerHarness(tmp_path, bootstrap=[A])
    away = restarts(h, cycles=30, serves=serves)
    assert len(away) >= 20  # (the first windows went by in the streak's wait)
    assert max(away[1:]) <= 30 + constants.BASE_BACKOFF_SECS + TICK, [round(a) for a in away]


def test_a_relay_that_accepts_and_serves_nothing_is_still_backed_off(tmp_path):
    """The same restarts, but its sessions answer nothing: no proof it works, the wait keeps
    the length its half hour down gave it (sessions shorter than the wait grow it)."""
    h = ManagerHarness(tmp_path, bootstrap=[A])
    away = restarts(h, cycles=30, serves="")
    assert away and h.manager.health.backoff(h.manager.health.failures(A, h.clock.now)) >= 1280


# -- a relay dropped by its repositories and listed again ------------------------------------


def lists(h, *relays) -> None:
    """The own relay shows a newer announcement of ``REPO``'s repository listing ``relays``."""
    h.advance(1)
    h.own_relay_holds(announcement(Author.named("u0"), "r0", relays=list(relays), created_at=int(h.clock.now)))


def dial_refused(h, until: float, **refusal) -> list[float]:
    """Ticks until ``until``, every dial of ``A`` failing (``HandshakeDone`` fields: a refused
    connection by default); when ``A`` was dialled."""
    refusal = refusal or {"error": "connection refused"}
    dialled = []
    while h.clock.now < until:
        h.tick()
        state = h.manager.relays.get(A)
        if state is not None and state.status is ConnectionStatus.CONNECTING:
            dialled.append(h.clock.now)
            h.feed(HandshakeDone(A, state.attempt, **refusal))
        due = h.manager.health.next_attempt_at(A, h.clock.now) if state is not None else 0
        h.advance(max(TICK, min(due, until) - h.clock.now))
    return dialled


def test_a_dead_relay_dropped_and_listed_again_is_still_dialled_once_a_day(tmp_path):
    """A relay down for good, dead to gsync (a day of failures), dropped by the one
    repository listing it (retired: it leaves the table) and listed again two minutes later:
    its dead mark comes back with it. Its next dial is its daily attempt, not a new backoff
    from 5 s (about a dozen dials in its first hour, before)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(REPO)
    dial_refused(h, h.clock.now + constants.DEAD_AFTER_SECS + 2 * 3600)
    assert h.manager.health.is_dead(A, h.clock.now)
    lists(h)  # no relay
    h.tick()
    assert A not in h.manager.relays
    h.advance(120)
    lists(h, A)
    back = h.clock.now
    last = h.manager.health.next_attempt_at(A, back) - constants.DEAD_RETRY_SECS
    dialled = dial_refused(h, back + 2 * constants.DEAD_RETRY_SECS)
    assert dialled and dialled[0] >= last + constants.DEAD_RETRY_SECS > back + 3600, dialled[:3]
    assert all(b - a >= constants.DEAD_RETRY_SECS for a, b in zip(dialled, dialled[1:], strict=False)), dialled


def test_a_rate_limited_relay_dropped_and_listed_again_waits_out_its_cooldown(tmp_path):
    """A relay answering the upgrade with 429 and a Retry-After of half an hour, dropped and
    listed again a minute later: not dialled before the half hour is over."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(REPO)
    first = dial_refused(h, h.clock.now + 5, error="429", rate_limited=True, retry_after=1800)
    assert len(first) == 1
    lists(h)
    h.tick()
    assert A not in h.manager.relays
    h.advance(60)
    lists(h, A)
    again = dial_refused(h, first[0] + 3600)
    assert again and again[0] >= first[0] + 1800, again
