"""Live coverage polled for want of subscription room, beside live subscriptions that
fragmented as coverage came a little at a time (thread members, one small REQ a tick), in
one process (tests/manager_harness.py): one consolidation packs it live, and the polls stop.
Found by the simulator (seed 4's year, day 244: a relay allowing 10 subscriptions, its
members' coverage polled every 5 s for hours, ``busy_loop``)."""
from gsync.io.manager.coverage import member_filters
from gsync.protocol.nip11 import RelayLimits

from .factory import Author, announcement
from .manager_harness import ManagerHarness

A = "wss://a.example"
owner = Author.named("owner")


def polls_sent(h, since: float) -> int:
    return sum(1 for at, _ in h.historic_reqs(A, times=True) if at >= since)


def test_polled_coverage_beside_fragmented_subscriptions_is_consolidated_and_no_longer_polled(tmp_path):
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(announcement(owner, "r", relays=[A]))
    h.connect(A, limits=RelayLimits(max_subscriptions=10))
    h.settle(A)
    state, live = h.state(A), h.manager.live
    for n in range(12):  # thread members one at a time, as descendants.run opens them
        ids = {f"{n + 1:064x}"}
        state.current.members |= ids
        live.open_members(state, member_filters(state, ids), fresh=True)
    assert state.fresh_polled.filters, "past the budget: polled"
    assert state.current.data_live_subs() == 7, "the budget full of one-member REQs"
    start = h.clock.now
    for _ in range(360):  # an hour, its polls answered with nothing
        h.advance(10)
        h.tick()
        h.eose_all(A)
    assert not (state.fresh_polled.filters or state.polled.filters), "all of it live"
    assert state.current.data_live_subs() < 7, "packed"
    assert polls_sent(h, start + 1800) == 0, "no polls the second half hour"
    assert polls_sent(h, start) < 150
