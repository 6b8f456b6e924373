"""The manager's decisions, in one process: a real ``SyncManager`` with recorded effects and a
fake clock (tests/manager_harness.py), fed the messages its greenlets would post. What
crosses a socket is tested against real relays elsewhere; here, what the manager decides to
send, and when."""
from gsync.io.events import HandshakeDone, RelayDisconnected
from gsync.sync.relay_state import ConnectionStatus

from .manager_harness import FakeWs, ManagerHarness

A = "wss://a.example"


def settle(h, url):
    """Own-relay reads answered (it holds nothing), every page ended empty, until nothing
    is left to start; then the completion check's wait."""
    for _ in range(20):
        h.answer_own_reads()
        h.advance(1.1)  # the pacing gate
        if not h.conn(url).subscriptions.keys() - h.state(url).live_subs.keys():
            if not h.effects.spawned or all(g.name != "read_holdings" for g in h.effects.spawned):
                break
        h.eose_all(url)
    h.advance(10)


def test_a_relay_moves_from_dialled_to_syncing_to_connected_and_back(tmp_path):
    h = ManagerHarness(tmp_path, bootstrap=[A])
    h.tick()
    assert h.state(A).status is ConnectionStatus.CONNECTING
    h.feed(HandshakeDone(A, h.state(A).attempt, ws=FakeWs()))
    assert h.state(A).status is ConnectionStatus.SYNCING
    settle(h, A)
    assert h.state(A).status is ConnectionStatus.CONNECTED
    h.feed(RelayDisconnected(A, h.state(A).session, "gone"))
    assert h.state(A).status is ConnectionStatus.DISCONNECTED


def test_a_failed_handshake_goes_back_to_disconnected_and_is_dialled_after_its_backoff(tmp_path):
    h = ManagerHarness(tmp_path, bootstrap=[A])
    h.tick()
    first = h.state(A).attempt
    h.feed(HandshakeDone(A, first, error="connection refused"))
    assert h.state(A).status is ConnectionStatus.DISCONNECTED
    h.tick()
    assert h.state(A).attempt == first  # backing off
    h.advance(h.config.sync.max_backoff_secs + 1)
    h.tick()
    assert h.state(A).status is ConnectionStatus.CONNECTING
    assert h.state(A).attempt == first + 1


def test_first_connection_starts_fresh_and_a_quick_reconnect_asks_since_the_gap(tmp_path):
    h = ManagerHarness(tmp_path, bootstrap=[A])
    conn = h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    first = [f for f in h.reqs(A) if f[1].startswith("h")]
    assert first and all("since" not in flt for f in first for flt in f[2:])  # whole history
    settle(h, A)
    h.feed(RelayDisconnected(A, h.state(A).session, "gone"))
    h.advance(60)  # back within 15 minutes: a quick reconnect
    h.tick()
    h.feed(HandshakeDone(A, h.state(A).attempt, ws=FakeWs()))
    assert h.conn(A) is not conn
    h.answer_own_reads()
    h.advance(1.1)
    again = [f for f in h.reqs(A) if f[1].startswith("h")]
    assert again and all("since" in flt for f in again for flt in f[2:])
