"""gsync/sync/one_filter.py: which answers could come from a relay answering one filter a
REQ, which of their filters to ask alone, and how."""
from gsync.protocol import messages as wire
from gsync.protocol.filters import Filter
from gsync.sync import one_filter


def test_an_answer_one_filter_explains_is_suspect_and_the_others_are_candidates():
    # the first filter matches all it brought: it may be all the relay answered; the third
    # matched nothing; the second matched some (answered, or cut by a cap of its own)
    assert one_filter.unserved_candidates([{"x", "y"}, {"y"}, set()]) == [2]
    # two filters matching all of it (#e and #E of top-level comments): the rest are candidates
    assert one_filter.unserved_candidates([{"x"}, {"x"}, set(), set()]) == [2, 3]
    assert one_filter.unserved_candidates([{"x"}, {"x"}]) == []


def test_nothing_brought_leaves_every_filter_a_candidate():
    assert one_filter.unserved_candidates([set(), set(), set()]) == [0, 1, 2]


def test_an_answer_that_needs_two_filters_proves_more_than_one_answered():
    assert one_filter.unserved_candidates([{"x"}, {"y"}]) is None
    assert one_filter.unserved_candidates([{"x", "z"}, {"y", "z"}, set()]) is None


def test_a_req_of_one_filter_is_never_suspect():
    assert one_filter.unserved_candidates([set()]) is None
    assert one_filter.unserved_candidates([]) is None


def test_layer_1_is_probed_first_then_repository_tags_then_the_rest():
    filters = [Filter(tags=(("q", ("30617:p:d",)),)), Filter(kinds=(30618,), tags=(("d", ("d",)),)),
               Filter(tags=(("a", ("30617:p:d",)),)), Filter(kinds=(30617, 10317)),
               Filter(tags=(("A", ("30617:p:d",)),))]
    assert one_filter.probe_order(filters, [0, 1, 2, 3, 4]) == [3, 2, 4, 0, 1]
    assert one_filter.probe_order(filters, [4, 0]) == [4, 0]
    # a filter on a later page was answered before: the others first
    paged = [filters[3].replace(until=100), *filters[1:3]]
    assert one_filter.probe_order(paged, [0, 1, 2]) == [2, 1, 0]


def test_a_probe_asks_one_event_no_newer_than_the_answer_could_have_brought():
    flt = Filter(tags=(("a", ("30617:p:d",)),), limit=5000)
    assert one_filter.probe_filter(flt, 1000) == flt.replace(limit=1, until=1000)
    paged = flt.replace(until=900)  # a page's: older than the second it is bounded to
    assert one_filter.probe_filter(paged, 1000).until == 899
    assert one_filter.probe_filter(paged, 800).until == 800


# -- the proof outlives the session (in one process: tests/manager_harness.py) --------------

def probes_sent(h, url: str) -> list:
    """The one-filter probes sent to ``url`` this session: REQs of one filter asking one event."""
    return [r for r in h.historic_reqs(url) if len(r) == 3 and r[2].get("limit") == 1]


def answer_everything_empty(h, url: str) -> None:
    for _ in range(8):
        h.answer_own_reads()
        h.advance(1.1)
        h.eose_all(url)


def test_a_relay_proven_to_answer_several_filters_is_probed_again_only_after_its_daily_start(tmp_path):
    """A relay reconnecting every few minutes spent up to three starts a session on probes
    though its first session had proven it answers every filter of a REQ."""
    from gsync.io.inbox import RelayDisconnected

    from .factory import Author, announcement, issue
    from .manager_harness import ManagerHarness

    a = "wss://several.example"
    owner = Author.named("several-owner")
    h = ManagerHarness(tmp_path)
    ann = announcement(owner, "several", relays=[a])
    h.own_relay_holds(ann)
    h.connect(a)
    h.answer_own_reads()
    h.advance(1.1)
    first = h.historic_reqs(a)[0]
    assert len(first) > 3  # several filters in one REQ
    h.relay_sends(a, first[1], ann, issue(Author.named("several-dev"), ann))  # layer 1's and #a's
    h.relay_says(a, wire.Eose(first[1]))
    answer_everything_empty(h, a)
    assert h.state(a).filters_answered

    h.feed(RelayDisconnected(a, h.state(a).session, "gone"))
    h.advance(60)
    h.connect(a)  # a quick reconnect: its answers are all empty, one filter "explains" each
    answer_everything_empty(h, a)
    assert h.historic_reqs(a) and not probes_sent(h, a)

    h.advance(h.state(a).next_daily_at - h.clock.now + 1)
    h.tick()  # the daily fresh start: its answers are judged again
    answer_everything_empty(h, a)
    assert probes_sent(h, a)
