"""The manager fetches each batch as ``sync.method`` prices it (in process, production prices):
NIP-77 only for the filters whose pages would bring back more than its starts are worth, and
followers that wait for another relay's lead only while the wait pays, no longer than it is
worth."""
from __future__ import annotations

import json

from gsync import constants
from gsync.protocol.filters import Filter

from .factory import Author, announcement, comment, issue, state
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


def test_a_re_sync_prices_its_id_fetch_as_likely_not_certain(tmp_path):
    """A re-sync whose #a filter holds 28 events, the others none (bench/historic --mode
    neg-99's descendants): the exchange and a fetch that follows half the time cost less
    than one REQ bringing the 28 again (with a certain fetch, they did not)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on([A], 3))
    h.connect(A)
    held = many(28)
    h.answer_own_reads(held=lambda f: held if any(name == "a" for name, _ in f.tags) else [])
    h.advance(5)
    assert [[name for name, _ in f.tags] for f in exchanges(h, A)] == [["a"]]


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


def test_a_follower_waits_and_checks_the_lead_by_nip77_at_the_remotes_price(tmp_path):
    """Fifty repositories (about 1,000 events, 700 KB of pages) another relay leads: the batch
    waits for the lead, and once the lead's events are held, checks them by NIP-77: its
    exchanges are priced at the remote's work (10 KB), not at a first sync's gate interval
    (90 KB, when it went by pages at once and brought everything again), since the events
    the operator waits for came by the lead."""
    h = ManagerHarness(tmp_path)
    anns = _two_relays(h, 50)
    [(follower_url, _)] = list(h.manager.lead._waits)
    leader_url = A if follower_url == B else B
    h.answer_own_reads()
    h.advance(1.1)
    def asks_repos(url):
        return [r for r in h.historic_reqs(url) if any("#a" in flt for flt in r[2:])]

    assert asks_repos(leader_url) and not asks_repos(follower_url)  # (layer 1 went on both)
    [page] = [r for r in h.historic_reqs(leader_url) if any("#a" in flt for flt in r[2:])]
    who = Author.named("dev")
    h.relay_sends(leader_url, page[1], *(issue(who, ann, subject=f"i{k}")
                                         for ann in anns for k in range(4)))
    for _ in range(3):
        h.eose_all(leader_url)
        h.advance(1.1)
    assert not h.manager.lead._waits  # the lead ended its pages: the follower goes
    h.answer_own_reads()
    h.advance(3.5)
    assert {name for f in exchanges(h, follower_url) for name, _ in f.tags} == {"a"}
    assert not asks_repos(follower_url)


def test_checks_that_would_be_a_relays_last_work_cost_the_operators_wait(tmp_path):
    """Twenty repositories (about 400 events, 280 KB) another relay leads, nothing else queued
    on the follower's relay: its checks would not hide behind other work, and what the lead
    lacked (the demo's world: every relay holds some of its own) would come a gate interval
    later for each; at a first sync's price (90 KB) four of them cost more than the pages:
    the batch goes at once (the demo took 7.6 s instead of 1.9 when it waited)."""
    h = ManagerHarness(tmp_path)
    _two_relays(h, 20)
    assert not h.manager.lead._waits


def test_a_followers_checks_go_after_the_relays_own_leads(tmp_path):
    """What checks another relay's lead brings nothing the operator waits for: queued on a
    relay, it goes after the work that relay leads, even work that came later (a new
    repository only it lists), so it never delays an event's first fetch."""
    h = ManagerHarness(tmp_path, batch_window_ms=100, background_start_interval_ms=1000)
    anns = _two_relays(h, 50)
    [(follower_url, _)] = list(h.manager.lead._waits)
    leader_url = A if follower_url == B else B
    h.answer_own_reads()
    h.advance(1.1)
    [page] = [r for r in h.historic_reqs(leader_url) if any("#a" in flt for flt in r[2:])]
    who = Author.named("dev")
    brought = [issue(who, ann, subject=f"i{k}") for ann in anns for k in range(4)]
    brought += [state(Author.named(f"m{i}"), f"r{i}", created_at=1_700_000_000 + k)
                for i in range(50) for k in range(3)]  # and states, by #d
    h.relay_sends(leader_url, page[1], *brought)
    h.eose_all(leader_url)
    for _ in range(5):  # (a page of 350 is confirmed by the next)
        if not h.manager.lead._waits:
            break
        h.advance(1.1)
        h.eose_all(leader_url)
    assert not h.manager.lead._waits  # the lead's pages ended: the follower reads the own relay
    h.answer_own_reads()
    h.advance(0.01)
    checks = [token for token, _ in h.state(follower_url).current.historic_queue]
    assert checks  # one exchange went, the other waits for the gate
    h.own_relay_holds(announcement(Author.named("solo"), "solo", relays=[follower_url]))
    h.answer_own_reads()
    h.advance(1.0)
    starts = [f for f in h.conn(follower_url).frames if f[0] == "NEG-OPEN"
              or (f[0] == "REQ" and not all(flt.get("limit") == 0 for flt in f[2:]))]
    nxt = starts[-1]
    assert nxt[0] == "REQ" and any("solo" in json.dumps(flt) for flt in nxt[2:])  # the new repository first
    assert not any(f[1] in checks for f in starts)
    assert [token for token, _ in h.state(follower_url).current.historic_queue] == checks  # still queued


def test_a_relay_follows_the_leaders_soon_enough_and_fetches_what_later_ones_lead(tmp_path):
    """Thirty repositories another relay leads with twelve starts queued before them (past
    the longest a wait goes on), thirty a relay leads next: the third relay, listing all,
    waits for the second's lead and fetches the first's thirty itself. (Waiting for both held back what the second would bring as
    soon: it went at once for all sixty, every event fetched twice.)"""
    h = ManagerHarness(tmp_path, background_start_interval_ms=1000)
    C = "wss://c.example"
    anns = [announcement(Author.named(f"{side}{i}"), f"{side}{i}", relays=relays)
            for side, relays in (("x", [A, C]), ("y", [B, C])) for i in range(30)]
    h.own_relay_holds(*anns)
    h.connect(A)
    h.connect(B)
    h.answer_own_reads()
    h.state(A).current.historic_queue.extend((f"busy{i}", [Filter.make(kinds=[1])]) for i in range(12))
    h.connect(C)
    [(url, batch_id)] = list(h.manager.lead._waits)
    assert url == C
    follows = h.state(C).current.pending[batch_id].items.repos
    assert follows and all(address.endswith(tuple(f":y{i}" for i in range(30))) for address in follows)
    led_by_c = {address for key, led in h.manager.lead._leads.items() if key[0] == C for address in led}
    assert led_by_c == {address for address in (a.address for a in anns) if ":x" in address}


def test_a_batch_that_goes_at_once_leads_its_items(tmp_path):
    """Three repositories another relay leads: not worth a wait, the batch goes at once; it
    fetches them, so it leads them too (a later relay may follow it rather than fetch them
    a third time)."""
    h = ManagerHarness(tmp_path)
    anns = _two_relays(h, 3)
    assert not h.manager.lead._waits
    addresses = {a.address for a in anns}
    leaders = {key[0] for key, led in h.manager.lead._leads.items() if addresses <= led}
    assert leaders == {A, B}


def test_a_follower_does_not_wait_for_a_lead_later_than_its_own_pages_are_worth(tmp_path):
    """Fifty repositories another relay leads with six starts queued before them, nothing
    queued on the follower's relay: its own pages would come in a gate interval, the lead's
    in seven, later than the few seconds the saving is worth: the batch goes at once. (With
    four queued there, it waits.)"""
    def waits(busy: int) -> bool:
        h = ManagerHarness(tmp_path / str(busy), background_start_interval_ms=1000)
        h.own_relay_holds(*listed_on([A, B], 50))
        h.connect(A)
        h.answer_own_reads()
        h.state(A).current.historic_queue.extend((f"busy{i}", [Filter.make(kinds=[1])]) for i in range(busy))
        h.connect(B)
        return bool(h.manager.lead._waits)

    assert waits(4)
    assert not waits(6)


def test_a_first_syncs_replies_of_members_are_priced_at_the_remotes_work_alone(tmp_path):
    """A first sync: the thread's pages brought 40 members and 40 replies to them (a nested
    comment tags its root too). The members' replies (a descendants batch, no items of its
    own) lack what a re-sync lacks, so nothing the operator waits for comes by them: their
    starts are worth the remote's work (10 KB), not a first sync's gate interval (90 KB), and
    the replies in hand (held, or on their way) are checked by NIP-77 instead of coming again by pages (the
    demo's world: 36 of the 283 events received)."""
    h = ManagerHarness(tmp_path)
    repo = listed_on([A], 1)[0]
    bug = issue(Author.named("bob"), repo)
    h.own_relay_holds(repo, bug)
    h.connect(A)
    h.answer_own_reads()
    h.advance(1.1)
    [thread] = [r for r in h.historic_reqs(A) if any(bug.id in flt.get("#E", ()) for flt in r[2:])]
    who = Author.named("dev")
    members = [comment(who, bug, content=f"m{k}") for k in range(40)]
    replies = [comment(who, bug, m, content=f"r{k}") for k, m in enumerate(members)]
    h.relay_sends(A, thread[1], *members, *replies)
    h.settle(A)
    member_ids = {m.id for m in members}  # their replies are on their way to the own relay
    h.advance(constants.DESCENDANT_TICK_SECS)
    h.tick()
    h.answer_own_reads()
    h.advance(2)
    checked = [f for f in exchanges(h, A) if member_ids & set(dict(f.tags).get("e", ()))]
    assert checked, "the replies in hand came again by pages"
    assert not [r for r in h.historic_reqs(A) if any(member_ids & set(flt.get("#e", ())) for flt in r[2:])]
