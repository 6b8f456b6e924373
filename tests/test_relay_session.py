"""What lives in a relay's session (``RelaySession``) goes with it, and what outlives it is
handed to the next one (``RelayState.end_session``): tested on a real ``SyncManager`` with
recorded effects and a fake clock (tests/manager_harness.py)."""
from gsync import constants
from gsync.io.inbox import HandshakeDone, RelayDisconnected
from gsync.sync.relay_state import ConnectionStatus

from .factory import Author, announcement, comment, issue
from .manager_harness import START, FakeWs, ManagerHarness

A = "wss://a.example"



def test_a_quick_reconnect_opens_its_thread_members_coverage_again_since_the_gap(tmp_path):
    """A thread member's descendants were covered in the last session: the next one asks
    for them again, live and since the gap (not their whole history)."""
    h = ManagerHarness(tmp_path)
    repo = announcement(Author.named("u0"), "r0", relays=[A])
    bug = issue(Author.named("bob"), repo)
    h.own_relay_holds(repo, bug)
    h.connect(A)
    h.answer_own_reads()
    h.settle(A)
    member = comment(Author.named("alice"), bug)
    h.relay_sends(A, "live-3", member)
    h.advance(constants.DESCENDANT_TICK_SECS)
    h.tick()
    h.settle(A)
    assert h.replies_asked(A, member.id)
    h.feed(RelayDisconnected(A, h.state(A).session, "gone"))
    h.advance(60)  # back within 15 minutes: a quick reconnect
    h.tick()
    h.feed(HandshakeDone(A, h.state(A).attempt, ws=FakeWs()))
    for _ in range(5):
        h.answer_own_reads()
        h.advance(1.1)
    asks = h.replies_asked(A, member.id)
    assert any(all(flt.get("limit") == 0 for flt in r[2:]) for r in asks), "no live coverage again"
    history = [r for r in asks if not all(flt.get("limit") == 0 for flt in r[2:])]
    assert history and all("since" in flt for r in history for flt in r[2:]), "not since the gap"



def test_the_daily_fresh_start_drops_the_last_rounds_work_and_ends_connected(tmp_path):
    """The daily sync starts a new session on the live connection: a historic REQ of the
    last one, never answered, is closed and its batch goes with that session, so the new
    round completes (Connected) once its own work is done."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*[announcement(Author.named(f"u{i}"), f"r{i}", relays=[A]) for i in range(3)])
    conn = h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    silent = h.historic_reqs(A)[-1][1]  # never answered
    h.advance(constants.DAILY_MAX_SECS - h.clock.now + START + 1)
    h.tick()
    assert h.state(A).status is ConnectionStatus.SYNCING
    assert silent not in conn.subscriptions
    h.settle(A)
    assert h.conn(A) is conn
    assert h.state(A).status is ConnectionStatus.CONNECTED
