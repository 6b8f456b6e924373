"""The manager fetches each batch as ``sync.method`` prices it (in process, production prices):
NIP-77 only for the filters whose pages would bring back more than its starts are worth, and
followers that wait for another relay's lead only while the wait pays, no longer than it is
worth."""
from __future__ import annotations

from .factory import Author, announcement
from .manager_harness import ManagerHarness

A, B = "wss://a.example", "wss://b.example"


def listed_on(urls, n, name="m"):
    return [announcement(Author.named(f"{name}{i}"), f"r{i}", relays=list(urls)) for i in range(n)]


def exchanges(h, url) -> list:
    conn = h.conn(url)
    return [g.args[2] for g in h.effects.spawned if g.name == "reconcile_filter" and g.args[0] is conn]


def many(n, base=0):
    return [(1_700_000_000 - i, f"{base + i + 1:064x}") for i in range(n)]


def test_nip77_only_for_the_filter_whose_pages_would_bring_back_more_than_its_starts_are_worth(tmp_path):
    """A re-sync: the own relay holds 150 events of the repositories' #a filter and 3 of each
    other filter. Pages of the #a filter would bring back 105 KB, more than its exchange and
    id fetch (two starts, 20 KB); pages of the others, 2 KB each, less than a start each:
    they share one REQ start."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on([A], 3))
    h.connect(A)
    big = many(150)
    h.answer_own_reads(held=lambda f: big if any(name == "a" for name, _ in f.tags) else many(3, 1000))
    h.advance(5)
    neg = exchanges(h, A)
    assert [[name for name, _ in f.tags] for f in neg] == [["a"]]
    asked_by_req = {name for req in h.historic_reqs(A) for flt in req[2:] for name in flt if name.startswith("#")}
    assert {"#d", "#A"} <= asked_by_req
    assert "#a" not in asked_by_req


def test_layer1_and_the_first_addfilters_share_the_first_start(tmp_path):
    """One merged read answers both batches: both choose before the relay pumps, so their REQ
    pages go in one start, as with NIP-77 off (they took two, a gate interval apart)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on([A], 3))
    h.connect(A)
    h.answer_own_reads()
    h.advance(0.1)
    [req] = h.historic_reqs(A)
    names = {name for flt in req[2:] for name in flt}
    assert {"#a", "#d"} <= names and any(flt.get("kinds") == [10317, 30617] for flt in req[2:])


def _two_relays(h, repos):
    anns = listed_on([A, B], repos)
    h.own_relay_holds(*anns)
    h.connect(A)
    h.connect(B)
    return anns


def test_a_small_follower_goes_at_once(tmp_path):
    """Three repositories another relay leads: their pages (about 60 events, 42 KB) are worth
    less than the second until the lead's start (80 KB): the batch goes on its own."""
    h = ManagerHarness(tmp_path)
    _two_relays(h, 3)
    assert not [e for e in h.manager.lead._waits]  # nobody waits
    h.answer_own_reads()
    h.advance(0.1)
    assert h.historic_reqs(A) and h.historic_reqs(B)


def test_a_large_follower_waits_and_no_longer_than_its_pages_are_worth(tmp_path):
    """Fifty repositories another relay leads (about 1,000 events, 700 KB of pages, less the
    exchanges the batch then spends, worth a few seconds): the batch waits for the lead; a
    lead that never ends its pages holds it that long, not FOLLOWER_WAIT_MAX_SECS."""
    h = ManagerHarness(tmp_path)
    _two_relays(h, 50)
    waiting = list(h.manager.lead._waits)
    assert len(waiting) == 1
    follower_url = waiting[0][0]
    worth = h.manager.lead._bounds[waiting[0]]
    assert 1 < worth < 10
    h.answer_own_reads()
    h.advance(worth - 0.5)  # the leader's pages are never answered
    h.tick()
    assert list(h.manager.lead._waits) == waiting
    h.advance(1.0)
    h.tick()
    assert not h.manager.lead._waits  # it went
    h.answer_own_reads()
    h.advance(1.1)
    assert h.historic_reqs(follower_url) or exchanges(h, follower_url)


def test_a_follower_that_would_go_by_pages_after_the_wait_does_not_wait(tmp_path):
    """Twenty repositories (about 400 events, 280 KB): after a wait, their few filters
    would take an exchange each at a first sync's price (90 KB), more than the pages they
    save: the batch goes at once."""
    h = ManagerHarness(tmp_path)
    _two_relays(h, 20)
    assert not h.manager.lead._waits
