"""SharedLead: which batches wait for another relay's first sync of their repositories."""
from gsync.sync.lead import SharedLead


def waiting(lead, key) -> bool:
    """Is ``key`` waiting for a leader? (The manager never asks: it is told when a wait ends.)"""
    return key in lead._waits


A1, A2, B1, C1 = ("ws://a", 1), ("ws://a", 2), ("ws://b", 3), ("ws://c", 4)


def test_a_follower_goes_when_its_last_leader_is_done():
    lead = SharedLead()
    lead.wait(C1, [A1, B1], now=0.0)
    assert waiting(lead, C1) and len(lead) == 1
    assert lead.done(A1) == []  # B1 still leads
    assert waiting(lead, C1)
    assert lead.done(B1) == [C1]
    assert not waiting(lead, C1) and len(lead) == 0
    assert lead.done(B1) == []  # reported once


def test_followers_of_one_leader_go_together_in_the_order_they_began_waiting():
    lead = SharedLead()
    lead.wait(B1, [A1], now=0.0)
    lead.wait(C1, [A1], now=0.5)
    assert lead.done(A1) == [B1, C1]


def test_nothing_to_wait_for_is_no_wait():
    lead = SharedLead()
    lead.wait(A1, [], now=0.0)
    lead.wait(A2, [A2], now=0.0)  # never itself
    assert len(lead) == 0 and not waiting(lead, A1)


def test_a_leader_that_joined_another_batch_passes_its_followers_on():
    lead = SharedLead()
    lead.wait(B1, [A1], now=0.0)
    lead.succeed(A1, A2)  # A1's AddFilters joined A2's pending batch
    assert lead.done(A1) == []
    assert waiting(lead, B1)
    assert lead.done(A2) == [B1]


def test_a_dropped_follower_is_forgotten_and_its_leaders_keep_no_trace():
    lead = SharedLead()
    lead.wait(C1, [A1, B1], now=0.0)
    lead.forget(C1)
    assert len(lead) == 0
    assert lead.done(A1) == [] and lead.done(B1) == []
    assert lead._followers == {}


def test_a_follower_waits_at_most_max_secs():
    lead = SharedLead()
    lead.wait(B1, [A1], now=10.0)
    lead.wait(C1, [A1], now=20.0)
    assert lead.overdue(39.9, max_secs=30) == []
    assert lead.overdue(40.0, max_secs=30) == [B1]
    assert lead.overdue(40.0, max_secs=30) == []
    assert lead.overdue(50.0, max_secs=30) == [C1]
    assert lead.done(A1) == []  # nobody waits any more


def _items(repos=(), roots=()):
    from gsync.sync.repos import SyncLevel
    from gsync.sync.targets import SyncItems

    return SyncItems({a: SyncLevel.FULL for a in repos}, set(roots))


def test_an_addfilters_is_split_into_what_it_leads_and_what_it_follows():
    lead = SharedLead()
    lead.lead(A1, _items(repos=["r1", "r2"], roots=["x"]))
    lead.lead(B1, _items(repos=["r2", "r3"]))
    mine, theirs, leaders = lead.split("ws://c", _items(repos=["r1", "r3", "r4"], roots=["x", "y"]))
    assert set(mine.repos) == {"r4"} and mine.root_events == {"y"}
    assert set(theirs.repos) == {"r1", "r3"} and theirs.root_events == {"x"}
    assert leaders == {A1, B1}
    # a relay never follows itself: its own batches lead nothing for it
    mine, theirs, leaders = lead.split("ws://a", _items(repos=["r1", "r2"]))
    assert set(mine.repos) == {"r1"} and set(theirs.repos) == {"r2"} and leaders == {B1}


def test_what_only_leaders_too_late_lead_is_fetched_as_well():
    """``follow`` names the leaders soon enough to wait for: what only the others lead goes
    with what this relay leads."""
    lead = SharedLead()
    lead.lead(A1, _items(repos=["r1", "r2"], roots=["x"]))
    lead.lead(B1, _items(repos=["r2", "r3"]))
    mine, theirs, leaders = lead.split("ws://c", _items(repos=["r1", "r2", "r3"], roots=["x"]),
                                       follow={B1}.__contains__)
    assert set(mine.repos) == {"r1"} and mine.root_events == {"x"}
    assert set(theirs.repos) == {"r2", "r3"} and leaders == {B1}


def test_a_leader_done_leads_nothing_any_more():
    lead = SharedLead()
    lead.lead(A1, _items(repos=["r1"], roots=["x"]))
    assert len(lead._leads) == 1
    lead.done(A1)
    mine, theirs, leaders = lead.split("ws://b", _items(repos=["r1"], roots=["x"]))
    assert not theirs and leaders == set() and set(mine.repos) == {"r1"}
    assert len(lead._leads) == 0 and lead._led_by == {}


def test_a_coalesced_leader_hands_what_it_led_to_the_batch_it_joined():
    lead = SharedLead()
    lead.lead(A1, _items(repos=["r1"]))
    lead.lead(A2, _items(repos=["r2"]))
    lead.succeed(A1, A2)
    _, theirs, leaders = lead.split("ws://b", _items(repos=["r1", "r2"]))
    assert set(theirs.repos) == {"r1", "r2"} and leaders == {A2}
    lead.done(A2)
    assert lead._led_by == {} and len(lead._leads) == 0


def test_a_follower_goes_once_its_leader_asks_for_none_of_its_items():
    """The leader took in later AddFilters and goes on; its follower need not wait for
    those, only for the pages that ask for what it follows."""
    lead = SharedLead()
    lead.lead(A1, _items(repos=["r1", "r2"]))
    lead.wait(B1, [A1], now=0.0, items=_items(repos=["r1"]))
    lead.wait(C1, [A1], now=0.0, items=_items(repos=["r2"]))
    assert lead.progress(A1, still_open=lambda key: True) == []
    assert lead.progress(A1, still_open=lambda key: key == "r2") == [B1]
    assert waiting(lead, C1) and not waiting(lead, B1)
    assert lead.done(A1) == [C1]


def test_progress_on_one_leader_leaves_the_wait_for_another():
    lead = SharedLead()
    lead.wait(C1, [A1, B1], now=0.0, items=_items(repos=["r1"]))
    assert lead.progress(A1, still_open=lambda key: False) == []
    assert waiting(lead, C1)
    assert lead.progress(B1, still_open=lambda key: False) == [C1]
    assert len(lead) == 0 and lead._followers == {} and lead._wanted == {}
