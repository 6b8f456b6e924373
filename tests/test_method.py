"""sync.method: every choice of how a batch is fetched, priced in starts and bytes."""
from __future__ import annotations

import pytest

from gsync.sync import method as M
from gsync.sync.method import FilterFacts


def held(n: int, prefix: str = "e") -> frozenset[str]:
    return frozenset(f"{prefix}{i}" for i in range(n))


# -- what a start is worth ---------------------------------------------------------------


def test_a_start_is_the_remotes_work_off_a_first_sync():
    assert M.start_bytes(1.0, first_sync=False) == M.START_BYTES


def test_on_a_first_sync_a_start_is_also_the_operators_gate_interval():
    assert M.start_bytes(1.0, first_sync=True) == M.START_BYTES + M.WAIT_BYTES_PER_SEC
    assert M.start_bytes(0.0, first_sync=True) == M.START_BYTES  # the gate off


def test_relays_syncing_side_by_side_share_what_the_own_relay_stores():
    """One relay alone, or two (the demo): its gate interval is the operator's wait. Fifty
    at once (bench/scale) are held to what the own relay stores: a gate interval of one of
    them is worth its share of that, and a start costs little more than the remote's work."""
    assert M.wait_bytes_per_sec(1) == M.WAIT_BYTES_PER_SEC
    assert M.wait_bytes_per_sec(2) == M.WAIT_BYTES_PER_SEC
    assert M.wait_bytes_per_sec(50) == pytest.approx(M.OWN_STORE_BYTES_PER_SEC / 50)
    assert M.start_bytes(1.0, True, 2) == M.start_bytes(1.0, True)
    assert M.START_BYTES < M.start_bytes(1.0, True, 50) < M.START_BYTES + 4_000
    assert M.start_bytes(1.0, False, 50) == M.START_BYTES


def test_a_follower_of_many_relays_syncing_at_once_waits_for_its_lead():
    """bench/scale, 50 relays: a follower of five repositories with nothing queued on its
    relay went at once, its four checks priced at a gate interval each (90 KB); with fifty
    relays syncing, the gate is not what the operator waits for, and it waits."""
    expected = M.expected_events(5, 0)
    alone = M.start_bytes(1.0, True)
    assert not M.follower_wait(expected, 0, 1.0, 10.0, filters=4, start=alone, own_queued=0).wait
    crowded = M.start_bytes(1.0, True, 50)
    wait = M.follower_wait(expected, 0, 1.0, 10.0, filters=4, start=crowded, own_queued=0, side_by_side=50)
    assert wait.wait
    saved = expected * M.EVENT_BYTES - 4 * crowded - M.OWN_READ_BYTES
    assert wait.max_secs == pytest.approx(1.0 + saved / M.wait_bytes_per_sec(50))  # a second's wait costs little


# -- NIP-77 or REQ pages -----------------------------------------------------------------


def test_nothing_held_goes_by_req_pages():
    choice = M.choose_methods([FilterFacts(), FilterFacts(), FilterFacts()])
    assert choice.negentropy == (False, False, False)
    assert choice.starts == 1  # ten filters share a start


def test_a_re_sync_of_large_filters_goes_by_nip77():
    """bench/historic --mode neg-99: every filter mostly held; REQ pages would bring it all."""
    filters = [FilterFacts(held(2000, "a")), FilterFacts(held(1500, "b"))]
    choice = M.choose_methods(filters)
    assert choice.negentropy == (True, True)
    assert choice.starts == 3  # two exchanges, one id fetch
    assert choice.bytes_down == 3500 * M.NEG_ITEM_BYTES


def test_a_few_held_events_are_not_worth_a_start_each():
    """The demo's follower: 28 events held over four filters; one REQ start brings them
    again for less than four exchanges and an id fetch."""
    filters = [FilterFacts(held(10, "a")), FilterFacts(held(8, "b")), FilterFacts(held(6, "c")),
               FilterFacts(held(4, "d"))]
    assert M.choose_methods(filters).negentropy == (False,) * 4


def test_only_the_filters_worth_their_start_go_by_nip77():
    big, small = FilterFacts(held(3000, "a")), FilterFacts(held(3, "b"))
    choice = M.choose_methods([small, big, FilterFacts()])
    assert choice.negentropy == (False, True, False)
    assert choice.starts == 1 + 2  # the REQ of the other two; the exchange and its id fetch


def test_overlapping_filters_count_an_event_once_on_the_req_side():
    """A comment matches its root's #E and #e: one REQ brings it once. Counted twice,
    20 events look like 40 and pay for NIP-77; they do not."""
    same = held(20)
    choice = M.choose_methods([FilterFacts(same), FilterFacts(same)])
    assert choice.negentropy == (False, False)
    assert choice.bytes_down == 20 * M.EVENT_BYTES
    assert M.choose_methods([FilterFacts(same), FilterFacts(held(20, "x"))]).negentropy == (True, True)


def test_the_operators_wait_tips_a_first_sync_to_req_pages():
    """160 events that REQ pages bring again: worth three more starts of the remote's work,
    not three more seconds of an operator's wait."""
    filters = [FilterFacts(held(60, "a")), FilterFacts(held(55, "b")), FilterFacts(held(45, "c"))]
    assert M.choose_methods(filters, start=M.START_BYTES).negentropy == (True, True, True)
    first_sync = M.start_bytes(1.0, first_sync=True)
    assert M.choose_methods(filters, start=first_sync).negentropy == (False, False, False)


def test_on_a_first_sync_what_nip77_would_find_missing_costs_its_id_fetches():
    """A new root's thread: 250 events held (statuses that came with the repository's pages)
    of the 1,000 it likely has. NIP-77 would take its exchange and three id fetches, REQ
    pages one start: at a re-sync's price of a start NIP-77 still pays, not at a first
    sync's."""
    thread = FilterFacts(held(250), expected=1000)
    assert thread.missing == 750
    resync = M.choose_methods([thread])
    assert resync.negentropy == (True,) and resync.starts == 1 + 3
    assert M.choose_methods([thread], start=M.start_bytes(1.0, True)).negentropy == (False,)


def test_a_re_sync_expects_no_id_fetch():
    """bench/historic --mode neg-99's descendants: the replies to 161 new thread members, 28
    held, of #e; nothing of #E and #q. Priced with an id fetch as well as the exchange,
    one REQ bringing the 28 again looked cheaper; on a re-sync a fetch follows only what
    is found, half the time: the exchange costs less than the copies."""
    filters = [FilterFacts(held(28)), FilterFacts(), FilterFacts()]
    assert M.choose_methods(filters, first_sync=True).negentropy == (False, False, False)
    resync = M.choose_methods(filters, first_sync=False)
    assert resync.negentropy == (True, False, False)
    assert resync.starts == 1 + 1  # the exchange, the REQ of the other two
    assert resync.likely_starts == M.RESYNC_FETCH_ODDS  # and the fetch, if it finds anything
    # a few held events alone: one REQ start brings them for less than the exchange and its likely fetch
    assert M.choose_methods([FilterFacts(held(3))], first_sync=False).negentropy == (False,)


def test_what_a_filter_likely_holds_comes_from_what_it_asks_for():
    from gsync.protocol.filters import Filter

    roots = Filter.make(kinds=[1111], tags={"E": [f"{i:064x}" for i in range(10)]})
    repos = Filter.make(kinds=[1621], tags={"a": [f"30617:{'0' * 64}:r{i}" for i in range(4)]})
    assert M.expected_of(roots) == 10 * M.EVENTS_PER_ROOT
    assert M.expected_of(repos) == 4 * M.EVENTS_PER_REPO
    assert M.expected_of(Filter.make(kinds=[30617])) == 0


def test_what_another_relay_is_fetching_counts_as_brought_again():
    """A batch whose leaders were too slow to wait for: their share of what they fetch."""
    filters = [FilterFacts(elsewhere=150), FilterFacts(elsewhere=150)]
    assert M.choose_methods(filters).negentropy == (True, True)
    assert M.choose_methods([FilterFacts(elsewhere=5)] * 2).negentropy == (False, False)


def test_refused_events_force_nip77_whatever_the_price():
    """A REQ would bring refused events back (SPEC §5: never fetched again)."""
    choice = M.choose_methods([FilterFacts(refused=True), FilterFacts()])
    assert choice.negentropy == (True, False)


def test_without_nip77_everything_goes_by_req_pages():
    choice = M.choose_methods([FilterFacts(held(5000), refused=True)], negentropy_allowed=False)
    assert choice.negentropy == (False,)
    assert M.choose_methods([], True).negentropy == ()


def test_req_pages_start_count_follows_the_page_cap():
    assert M.req_starts([]) == 0
    assert M.req_starts([0] * 10) == 1
    assert M.req_starts([0] * 11) == 2
    assert M.req_starts([499, 500]) == 1  # 1 + 2 pages


# -- after NIP-77: by id or by the filter ------------------------------------------------


@pytest.mark.parametrize("need, again, by_filter", [
    (0, 0, False),
    (300, 0, False),  # one id fetch does it
    (301, 0, True),  # a fresh own relay: pages (one start for what two id fetches take)
    (1000, 40, True),  # one start of pages, 28 KB again, against four id fetches
    (1000, 50, False),  # the pages would bring back more than the id fetches cost
    (19_800, 20_000, False),  # the 99 % case: by id
])
def test_missing_events_come_by_id_or_by_the_filter(need, again, by_filter):
    assert M.fetch_missing_by_filter(need, again) is by_filter


# -- waiting for another relay's lead ----------------------------------------------------


def test_a_follower_waits_when_the_lead_comes_as_soon_as_its_own_pages_would():
    """10 repositories, ~200 events, 140 KB of pages; checking the lead's work afterwards
    takes four exchanges at the remote's price (40 KB) and a read: the lead, as far away
    as the batch's own pages, costs no wait; it waits as long as its own pages would have
    taken, and what the saving is worth beyond that."""
    wait = M.follower_wait(M.expected_events(10, 0), leader_queued=2, gate_secs=1.0, cap_secs=10.0,
                           filters=4, own_queued=2)
    assert wait.wait
    saved = M.expected_events(10, 0) * M.EVENT_BYTES - 4 * M.START_BYTES - M.OWN_READ_BYTES
    assert wait.max_secs == pytest.approx(3.0 + saved / M.WAIT_BYTES_PER_SEC)


def test_a_follower_goes_on_its_own_when_the_lead_is_later_than_its_saving_is_worth():
    expected = M.expected_events(10, 0)
    assert M.follower_wait(expected, leader_queued=1, gate_secs=1.0, cap_secs=10.0, filters=4, own_queued=0).wait
    assert not M.follower_wait(expected, leader_queued=5, gate_secs=1.0, cap_secs=10.0, filters=4,
                               own_queued=0).wait


def test_the_exchanges_checking_the_lead_are_the_remotes_work_only():
    """The events come by the lead meanwhile: the exchanges that check it, queued behind the
    relay's own leads, are priced at a start's remote work, not at a first sync's gate
    interval too (90 KB: 200 events' pages would not pay for four of them)."""
    first = M.start_bytes(1.0, first_sync=True)
    assert M.follower_wait(M.expected_events(10, 0), 0, 1.0, 10.0, filters=4, own_queued=0).wait
    assert not M.follower_wait(M.expected_events(10, 0), 0, 1.0, 10.0, filters=4, start=first, own_queued=0).wait


def test_a_small_follower_goes_on_its_own():
    """Two roots' threads (6 events): their copies cost less than the three exchanges and the
    read that would check the lead."""
    assert not M.follower_wait(M.expected_events(0, 2), 0, 1.0, 10.0, filters=3, own_queued=0).wait
    assert not M.follower_wait(M.expected_events(2, 0), 0, 1.0, 10.0, filters=4, own_queued=0).wait


def test_a_followers_wait_is_bounded():
    """Another shard's lead sends no word: the wait ends when it stops paying, not at the cap."""
    wait = M.follower_wait(M.expected_events(3, 0), leader_queued=0, gate_secs=0.02, cap_secs=10.0, own_queued=0)
    assert wait.max_secs == pytest.approx(0.02 + (3 * M.EVENTS_PER_REPO * M.EVENT_BYTES - M.OWN_READ_BYTES)
                                          / M.WAIT_BYTES_PER_SEC)
    assert wait.max_secs < 1.0
    assert M.follower_wait(M.expected_events(500, 0), 0, 1.0, 10.0, own_queued=0).max_secs == 10.0
