"""Own-relay holdings reads merged across batches and relays (issue 26): the pure plan
(``sync.own_reads.merged_reads``), and a real ``SyncManager`` (tests/manager_harness.py)
whose waiting batches, of one relay and of two, are answered by one read per tag."""
import pytest

from gsync.io.inbox import OwnReadsLanded
from gsync.io.own_query import HeldItems
from gsync.protocol.filters import Filter
from gsync.sync.filter_plan import MAX_TAG_VALUE_BYTES_PER_FILTER
from gsync.sync.own_reads import merged_reads

from .factory import Author, announcement, issue
from .manager_harness import ManagerHarness

A, B = "wss://a.example", "wss://b.example"
ID = "ab" * 32


def tag(name, *values, kinds=None, **more):
    return Filter.make(kinds=kinds, tags={name: list(values)}, **more)


# -- the plan (pure) -----------------------------------------------------------------------


def test_filters_alike_but_for_their_tag_values_are_read_as_one_carrying_every_value_once():
    reads = [tag("a", "x", "y"), tag("a", "y", "z"), tag("A", "x"), tag("d", "r1", kinds=[30618]),
             tag("d", "r2", kinds=[30618]), tag("e", "1" * 64)]
    out = merged_reads(reads, MAX_TAG_VALUE_BYTES_PER_FILTER)
    assert out == [tag("a", "x", "y", "z"), tag("A", "x"), tag("d", "r1", "r2", kinds=[30618]),
                   tag("e", "1" * 64)]


def test_kinds_authors_and_tag_name_keep_filters_apart():
    reads = [tag("d", "r", kinds=[30618]), tag("d", "r", kinds=[30617]), tag("a", "x", kinds=[1]),
             Filter.make(kinds=[1], authors=["f" * 64], tags={"a": ["x"]}), tag("q", "x")]
    assert merged_reads(reads, MAX_TAG_VALUE_BYTES_PER_FILTER) == reads


def test_filters_that_cannot_merge_are_read_as_they_are_and_once():
    layer1 = Filter.make(kinds=[30617, 10317])
    bounded = tag("a", "x", since=5)
    two_tags = Filter.make(tags={"a": ["x"], "e": [ID]})
    by_id = Filter.make(ids=[ID])
    reads = [layer1, bounded, tag("a", "y"), layer1, two_tags, by_id, two_tags]
    assert merged_reads(reads, MAX_TAG_VALUE_BYTES_PER_FILTER) == [layer1, bounded, tag("a", "y"), two_tags, by_id]


def test_the_values_are_chunked_by_the_budget_and_each_chunk_fits_it():
    ids = [f"{i:064x}" for i in range(1_000)]
    reads = [tag("e", *ids[i:i + 10]) for i in range(0, 1_000, 10)]
    budget = 67 * 100  # 100 ids a filter
    out = merged_reads(reads, budget)
    assert len(out) == 10
    assert all(f.tag_value_bytes() <= budget for f in out)
    assert sorted(v for f in out for v in f.tags[0][1]) == ids


def test_nothing_to_read_is_no_read():
    assert merged_reads([], MAX_TAG_VALUE_BYTES_PER_FILTER) == []


# -- the manager ---------------------------------------------------------------------------


def repos(url, names):
    """One owner per repository; each announcement lists ``url`` only."""
    return [announcement(Author.named(f"owner-{n}"), n, relays=[url]) for n in names]


def address(ann) -> str:
    return next(f"30617:{ann.pubkey}:{t[1]}" for t in ann.tags if t[0] == "d")


def reads_in_flight(h) -> list:
    return h.own_reads()


def tag_values(flt, name):
    return next((set(values) for n, values in flt.tags if n == name), set())


def land(h, g, held_events=()):
    """The merged read ``g`` ends: the own relay held ``held_events`` (those each read's
    filter matches are its answer)."""
    h.effects.spawned.remove(g)
    _own, reads, _post = g.args
    holdings = [HeldItems(e.to_dict() for e in held_events if flt.matches(e)) for flt in reads]
    h.feed(OwnReadsLanded(g.kwargs["read_id"], list(reads), holdings, "", g.kwargs["epoch"]))


def reconciles(h, url):
    """The NIP-77 exchanges started on ``url``: (filter, the have-set it was given)."""
    conn = h.conn(url)
    return [(g.args[2], g.kwargs["held"]) for g in h.effects.spawned
            if g.name == "reconcile_filter" and g.args[0] is conn]


def test_batches_of_one_relay_and_of_two_waiting_on_the_same_tags_make_one_read_and_each_gets_its_own_answer(tmp_path):
    h = ManagerHarness(tmp_path)
    on_a, on_b = repos(A, ["a0", "a1", "a2"]), repos(B, ["b0", "b1", "b2"])
    h.own_relay_holds(*on_a, *on_b)
    h.connect(A)
    h.connect(B)
    # Layer 1 and the repositories' batch of each relay (4 batches, 10 filters) wait for the
    # window: no read yet.
    assert not reads_in_flight(h)
    h.close_own_read_window()
    [first] = reads_in_flight(h)
    reads = first.args[1]
    by_tag = {flt.tags[0][0] if flt.tags else None: flt for flt in reads}
    assert len(reads) == len(by_tag) == 5  # layer 1, #a, #A, #q, #d: one read each
    addresses = {address(ann) for ann in on_a + on_b}
    assert tag_values(by_tag["a"], "a") == addresses
    assert tag_values(by_tag["d"], "d") == {"a0", "a1", "a2", "b0", "b1", "b2"}

    # While it is under way, both relays get a new repository (a batch each): they wait for it.
    late_a, late_b = repos(A, ["a3"]), repos(B, ["b3", "b4"])
    h.own_relay_holds(*late_a, *late_b)
    assert reads_in_flight(h) == [first]

    # The own relay holds issues of a1 and of b2, enough for NIP-77 to pay (``sync.method``):
    # each relay's #a exchange gets its own.
    held_a = [issue(Author.named("x"), on_a[1], created_at=1_700_000_000 + i) for i in range(150)]
    held_b = [issue(Author.named("y"), on_b[2], created_at=1_700_001_000 + i) for i in range(150)]
    land(h, first, held_a + held_b)
    h.advance(4)  # the pacing gate: one start a second on each relay
    neg_a = {flt.tags[0][0]: held for flt, held in reconciles(h, A) if flt.tags}
    neg_b = {flt.tags[0][0]: held for flt, held in reconciles(h, B) if flt.tags}
    assert sorted(neg_a.get("a") or ()) == sorted((e.created_at, e.id) for e in held_a)
    assert sorted(neg_b.get("a") or ()) == sorted((e.created_at, e.id) for e in held_b)

    # The two late batches are read together, once, right after: only what nobody read yet.
    [second] = reads_in_flight(h)
    second_by_tag = {flt.tags[0][0]: flt for flt in second.args[1] if flt.tags}
    assert tag_values(second_by_tag["a"], "a") == {address(ann) for ann in late_a + late_b}
    assert tag_values(second_by_tag["d"], "d") == {"a3", "b3", "b4"}
    assert all(len(flt.tags) == 1 for flt in second.args[1])  # layer 1 is known: not read again
    land(h, second)
    h.advance(3)
    assert not reads_in_flight(h)
    # nothing held of the late repositories: their batches go by REQ pages
    asked = {v for url in (A, B) for frame in h.historic_reqs(url) for flt in frame[2:]
             for v in flt.get("#a", ())}
    assert {address(ann) for ann in late_a + late_b} <= asked


@pytest.mark.parametrize("how", ["answered", "died"])
def test_a_merged_read_that_fails_answers_every_batch_waiting_on_it_and_teaches_nothing(tmp_path, how):
    """The read fails by its own answer (past its deadline), or its greenlet dies (the
    effects report it: ``on_death``)."""
    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*repos(A, ["a0"]), *repos(B, ["b0"]))
    h.connect(A)
    h.connect(B)
    h.close_own_read_window()
    [g] = reads_in_flight(h)
    h.effects.spawned.remove(g)
    if how == "answered":
        h.feed(OwnReadsLanded(g.kwargs["read_id"], list(g.args[1]), None, "own relay query past its 120 s deadline",
                              g.kwargs["epoch"]))
    else:
        for died in g.dead_callbacks:
            died(ConnectionRefusedError("own relay away"))
        h.feed(h.manager.queue.get_nowait())  # what the callback posted
    h.advance(3)
    # both relays' batches went on by REQ pages (no NIP-77), none waits for a read
    assert h.historic_reqs(A) and h.historic_reqs(B)
    assert not [g for g in h.effects.spawned if g.name == "reconcile_filter"]
    assert not h.manager.own_reads.flying and not h.manager.own_reads.queued
    assert h.manager.own_held.units == 0  # nothing learnt: read again next time


# -- what is known without a read ------------------------------------------------------------


def test_layer_one_is_known_from_the_self_subscriptions_whole_history_read(tmp_path):
    """The self-subscription's first history read (whole, not since a reconnect) also asks
    layer 1's kinds: layer 1's holdings are then known, and no relay's layer-1 exchange
    reads them again (each shard read every announcement for it)."""
    from gsync.io.inbox import OwnEvents, OwnSubscribed
    from gsync.sync.filter_plan import layer1_filter
    from gsync.sync.own_held import HeldEntry

    h = ManagerHarness(tmp_path)
    on_a = repos(A, ["l0", "l1"])
    h.feed(OwnEvents(on_a))
    h.feed(OwnSubscribed(reconnect=False, layer1=[(ann.id, HeldEntry.of(ann)) for ann in on_a]))
    h.connect(A)
    h.close_own_read_window()
    asked = [flt for g in reads_in_flight(h) for flt in g.args[1]]
    assert asked and all(flt.tags for flt in asked)  # the repositories' filters; not layer 1
    known = h.manager.own_held.holdings(layer1_filter(), h.clock.now)
    assert sorted(known) == sorted((ann.created_at, ann.id) for ann in on_a)


def test_the_descendants_of_a_member_the_own_relay_stores_anew_are_known_without_a_read(tmp_path):
    """A direct member of a thread that gsync sends the own relay, not knowing it held,
    has no replies there but those stored from then on, which delivery confirms as they
    are stored: its descendant filters (#e, #E, #q) need no read, even while it waits in
    the delivery backlog (its members' batch reads within seconds, the backlog drains at
    the own relay's pace). One the own relay answered ``duplicate`` to was held already:
    read."""
    from gsync import constants
    from gsync.io.inbox import OwnHeldConfirmed
    from gsync.sync.own_held import HeldEntry

    from .factory import comment

    h = ManagerHarness(tmp_path)
    [ann] = repos(A, ["m0"])
    root = issue(Author.named("m-dev"), ann)
    h.own_relay_holds(ann, root)
    h.connect(A)
    h.settle(A)
    fresh, held = (comment(Author.named("m-reply"), root, content=f"member {i}") for i in range(2))
    h.relay_sends(A, "some-sub", fresh, held)
    h.feed(OwnHeldConfirmed([(held.id, HeldEntry.of(held))], stored_anew=[]))  # fresh: no answer yet
    h.advance(constants.DESCENDANT_TICK_SECS)
    h.tick()  # the members' descendant batch
    h.close_own_read_window()
    asked = {value for g in reads_in_flight(h) for flt in g.args[1] for _, values in flt.tags for value in values}
    assert held.id in asked
    assert fresh.id not in asked


# -- a read's pages, over a socket -----------------------------------------------------------


def test_a_read_of_an_own_relay_serving_a_filter_without_a_limit_oldest_first_reads_it_whole(scripted):
    """An own relay that serves a filter without a ``limit`` its oldest events, oldest first
    (nostream): a read paged by ``until`` from the oldest seen read its first page only.
    Pages ask with a limit: 250 events over pages of 100, all read."""
    _read_whole(scripted, 250, page_size=100, oldest_first=True)


def _read_whole(scripted, n: int, **knobs) -> None:
    """An own relay (``knobs``) holding ``n`` issues of a repository: one read of the
    repository's ``#a`` brings every one."""
    from gsync.io.own_query import history_pages
    from gsync.io.ws import connect

    repo = announcement(Author.named("owner"), "r")
    base = 1_700_000_000
    issues = [issue(Author.named("bob"), repo, subject=f"issue {i}", created_at=base + 60 * i) for i in range(n)]
    own = scripted(*issues, **knobs)
    ws = connect(own.url, timeout=5)
    try:
        read = {e["id"] for page in history_pages(ws, tag("a", repo.address)) for e in page}
    finally:
        ws.close()
    assert read == {e.id for e in issues}


@pytest.mark.parametrize("cuts", [{"query_budget": ([40, 15], 0.6)}, {"first_cut_to_nothing": (0.6, 1621)}],
                         ids=["cut-anywhere", "cut-to-nothing"])
def test_a_read_of_an_own_relay_that_stops_slow_queries_reads_it_whole(scripted, monkeypatch, cuts):
    """An own relay under load that stops slow queries cuts a page anywhere: after 40 events
    and then 15 in turn (15, fewer than the 40 it served, read as the end), or before the
    first (nothing, read as nothing there). A slow page is confirmed by the next, a slow
    nothing asked once more: 120 issues, all read."""
    from gsync import constants

    monkeypatch.setattr(constants, "TIME_CUT_SUSPECT_SECS", 0.4)
    _read_whole(scripted, 120, page_size=500, **cuts)
