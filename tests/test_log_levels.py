"""What an operator reads at info and above: a relay's normal ways said once or as
information, warnings kept for what needs looking at (the simulator's logs, ``bench/simulate
--logs``, showed hundreds a day of both below)."""
from structlog.testing import capture_logs

from gsync.io.inbox import HandshakeDone, RelayDisconnected
from gsync.protocol import messages as wire
from gsync.protocol.nip11 import RelayLimits

from .factory import Author, announcement
from .manager_harness import FakeWs, ManagerHarness

A = "wss://a.example"


def test_a_relay_without_nip77_is_said_so_once_not_at_every_reconnection(tmp_path):
    """A flapping relay whose NIP-11 lists no 77 logged ``negentropy_unsupported`` as a
    warning at every reconnection (the simulator, seed 5: 308 in ten days). Known before
    asking, it is information, said once; later sessions say it at debug."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(Author.named("u"), "r", relays=[A]))
    no77 = RelayLimits(supported_nips=frozenset({1, 11}))
    with capture_logs() as logs:
        h.connect(A, limits=no77)
        for _ in range(3):
            state = h.state(A)
            h.feed(RelayDisconnected(A, state.session, "gone"))
            h.advance(60)
            h.tick()
            h.feed(HandshakeDone(A, state.attempt, ws=FakeWs(), limits=no77))
    said = [e["log_level"] for e in logs if e["event"] == "negentropy_unsupported"]
    assert said == ["info", "debug", "debug", "debug"], said


def test_a_subscription_closed_without_a_reason_is_information_and_one_refused_a_warning(tmp_path):
    """Relays closing every subscription after its EOSE send a CLOSED with no reason for
    each: the simulator's seed 5 logged 166 warnings in ten days for one such relay."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(Author.named("u"), "r", relays=[A]))
    h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    live = [req[1] for req in h.reqs(A) if req[1] in h.state(A).current.live_subs]
    assert len(live) >= 2, h.reqs(A)
    with capture_logs() as logs:
        h.relay_says(A, wire.Closed(live[0], wire.Prefix.NONE, ""))
        h.relay_says(A, wire.Closed(live[1], wire.Prefix.BLOCKED, "#a queries are not allowed here"))
    said = [(e["log_level"], e["sub_id"]) for e in logs if e["event"] == "subscription_closed"]
    assert said == [("info", live[0]), ("warning", live[1])], said


def test_live_coverage_polled_is_a_warning_once_a_relay_not_at_every_daily_sync(tmp_path):
    """A relay closing every subscription after its EOSE is found so again at each daily
    sync: the simulator's seed 5, with no faults, logged the warning for two relays every day."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(Author.named("u"), "r", relays=[A]))
    h.connect(A)
    with capture_logs() as logs:
        for day in range(3):
            if day:
                h.manager.lifecycle.fresh_start(h.state(A), h.clock.now)
            for _ in range(4):  # closed at once, rebuilt, closed again within the minute: polled
                h.answer_own_reads()
                h.advance(1.1)
                for sub_id in list(h.state(A).current.live_subs):
                    h.relay_says(A, wire.Closed(sub_id, wire.Prefix.NONE, ""))
            assert h.state(A).current.live_not_kept
            h.advance(86_400)
    said = [e["log_level"] for e in logs if e["event"] == "live_coverage_polled"
            and e["reason"] == "live subscriptions not kept"]
    assert said[0] == "warning" and set(said[1:]) == {"debug"} and len(said) >= 3, said


def test_what_is_said_once_a_relay_is_bounded_whatever_the_relay_says():
    """A reason may be a relay's own text (a NEG-ERR's), new at every session: past
    SAID_MAX the rest is said at debug, and the set holds no more."""
    from gsync.sync.relay_state import SAID_MAX, RelayState

    state = RelayState(A)
    said = [state.said_before("negentropy_unsupported", f"error: {word}") for word in
            (f"{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(100))]
    assert said[:SAID_MAX] == [False] * SAID_MAX and all(said[SAID_MAX:])
    assert len(state.said) == SAID_MAX
    assert state.said_before("negentropy_unsupported", "error: aa")  # (said, and numbers aside alike)
