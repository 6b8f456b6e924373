"""gsync/io/connection.py without sockets: what a relay connection hands the manager."""
import json

import gevent

from gsync import constants
from gsync.io.connection import MAX_UNAPPLIED_BURSTS, RelayConnection
from gsync.io.inbox import RemoteEvents
from gsync.protocol import wsframes
from gsync.protocol.filters import Filter, FilterSet
from tests import factory as f


class _Bursts:
    """A websocket whose every read is a burst of one EVENT for subscription "s"."""

    def __init__(self, events):
        self.frames = [(wsframes.OP_TEXT, f'["EVENT","s",{e.to_json()}]'.encode()) for e in events]
        self.reads = 0
        self.connected = True

    def settimeout(self, timeout):
        pass

    def recv_burst(self):
        self.reads += 1
        if not self.frames:
            gevent.sleep(60)
        return [self.frames.pop(0)]

    def close(self, timeout=1):
        self.connected = False


def test_a_reader_waits_while_its_bursts_are_not_applied():
    """However many relays send at once, the manager's queue holds at most a couple of
    bursts per connection: the reader stops reading (the socket pushes back) until the
    manager has taken them."""
    alice = f.Author.named("alice")
    events = [alice.sign(1, [], f"note {i}") for i in range(10)]
    posted = []
    conn = RelayConnection("ws://relay.example", _Bursts(events), 1, posted.append)
    conn.subscriptions["s"] = FilterSet([Filter.make(kinds=[1])])
    conn.start()
    gevent.sleep(0.05)
    bursts = [m for m in posted if isinstance(m, RemoteEvents)]
    assert len(bursts) == MAX_UNAPPLIED_BURSTS
    bursts[0].applied.set()  # the manager applied the oldest
    gevent.sleep(0.05)
    assert len([m for m in posted if isinstance(m, RemoteEvents)]) == MAX_UNAPPLIED_BURSTS + 1
    for _ in range(10):
        for m in posted:
            if isinstance(m, RemoteEvents):
                m.applied.set()
        gevent.sleep(0.01)
    assert sum(len(m.events) for m in posted if isinstance(m, RemoteEvents)) == 10
    conn.close()


def test_filters_of_ended_subscriptions_are_bounded_by_their_size_not_by_the_session():
    """A session of days CLOSEs thousands of REQs, and relays rarely answer CLOSE with CLOSED:
    what is kept to read their late events is bounded in bytes, the newest kept."""
    from gsync.io import connection

    sent = []
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append)
    roots = [f"{i:064x}" for i in range(400)]
    for n in range(200):  # each REQ about 27 KB: 400 root ids
        conn.subscribe(f"h{n}", [Filter.make(kinds=[1], tags={"e": roots})])
        conn.unsubscribe(f"h{n}")
    kept = conn._closing
    assert 0 < kept.bytes <= connection.ENDED_FILTER_BYTES
    assert len(kept) < 20
    assert kept.get("h199") is not None and kept.get("h0") is None  # the newest stay
    closing = sorted(kept._filters)
    for sub_id in closing:  # the relay answers CLOSED: they move to the ended ones, still bounded
        conn._handle_frame(f'["CLOSED","{sub_id}",""]'.encode())
    assert len(conn._closing) == 0 and conn._closing.bytes == 0
    assert 0 < conn._ended.bytes <= connection.ENDED_FILTER_BYTES
    conn.forget("never-opened")  # nothing to end: nothing kept, nothing dropped
    assert sorted(conn._ended._filters) == closing


def test_what_a_relay_sent_past_each_filters_until_is_told_with_the_eose_filter_by_filter():
    """A relay that ignores ``until`` sends the newest events again; dropped, they are told
    with the EOSE per filter of the REQ (``RemoteMessage.past_until``): they fill that
    filter's page as much as those kept (seed 707 of the stress mix)."""
    from gsync.io.inbox import RemoteMessage

    sent = []
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append)
    bob = f.Author.named("bob")
    repo_a, repo_b = f.repo_addr(bob, "a"), f.repo_addr(bob, "b")
    issues = [f.issue(bob, repo_a, created_at=2000 + i) for i in range(3)] + [f.issue(bob, repo_b, created_at=2000)]
    kept = f.issue(bob, repo_a, created_at=900)
    conn.subscribe("h1", [Filter.make(tags={"a": [repo_a]}, until=1000),
                          Filter.make(tags={"a": [repo_b]}, until=1000)])
    for event in [*issues, kept]:
        conn._handle_frame(f'["EVENT","h1",{event.to_json()}]'.encode())
    conn._handle_frame(b'["EOSE","h1"]')
    eose, = [m for m in sent if isinstance(m, RemoteMessage)]
    assert eose.past_until == (3, 1)


def test_an_event_published_while_a_page_is_read_is_no_sign_that_until_is_ignored():
    """A relay that matches live events without their time bounds sends an event published
    while a page is open on it, dated about now, past the page's ``until``. Told as "past
    until", it would mark a relay that reads ``until`` as NIP-01 says as one ignoring it, for
    the session (its filters then not paged past their first page). A relay that ignores
    ``until`` sends its stored newest again, dated before: those are told."""
    import time as clock

    from gsync.io.inbox import RemoteMessage

    sent = []
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append)
    bob = f.Author.named("bob")
    repo = f.repo_addr(bob, "a")
    now = int(clock.time())
    until = now - 2 * 86400
    live = f.issue(bob, repo, created_at=now - 3)
    stored = f.issue(bob, repo, created_at=now - 86400)
    for events, told in (([live], ()), ([live, stored], (1,))):
        conn.subscribe("h1", [Filter.make(tags={"a": [repo]}, until=until)])
        for event in events:
            conn._handle_frame(f'["EVENT","h1",{event.to_json()}]'.encode())
        conn._handle_frame(b'["EOSE","h1"]')
        eose = [m for m in sent if isinstance(m, RemoteMessage)][-1]
        assert eose.past_until == told
        conn.unsubscribe("h1")


def test_a_precise_probe_proves_only_with_an_event_the_empty_req_asked_for_inside_its_bounds():
    """On a relay of a make that may answer imprecise REQs with nothing: the probe's event
    proves the relay ignored the REQ that came back empty only if that REQ asked for it
    (one of its imprecise filters matches it), a second inside its time bounds: a relay
    reading ``until`` as exclusive never sends an event at its very second (the simulator's
    seed 1501 of --rs-software: a relay answering every query so marked)."""
    from gsync.io.inbox import ImpreciseIgnored, ProbeWanted

    bob = f.Author.named("bob")
    repo = f.repo_addr(bob, "a")
    t = 1_700_000_000
    for probe_event, proves in ((f.issue(bob, repo, created_at=t - 5), True),
                                (f.issue(bob, repo, created_at=t), False),  # at until's second
                                (f.issue(bob, f.repo_addr(bob, "b"), created_at=t - 5), False)):  # not asked
        sent = []
        conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
        conn.subscribe("h1", [Filter.make(tags={"a": [repo]}, until=t)])
        conn._handle_frame(b'["EOSE","h1"]')
        assert any(isinstance(m, ProbeWanted) for m in sent)
        conn.send(conn.book.probe_frame("probe", [Filter.make(ids=[probe_event.id])]))
        conn._handle_frame(f'["EVENT","probe",{probe_event.to_json()}]'.encode())
        conn._handle_frame(b'["EOSE","probe"]')
        assert any(isinstance(m, ImpreciseIgnored) for m in sent) is proves


def test_a_relay_that_answered_an_imprecise_req_is_not_probed_that_session():
    """A relay limiting scrapers answers any REQ holding an imprecise filter with nothing:
    one that brought an event on such a REQ does not, and a later empty one (replies to
    roots that have none) sends no probe this session (the simulator's relays naming
    nostr-rs-relay and answering everything were probed every hour)."""
    from gsync.io.inbox import ProbeWanted

    bob = f.Author.named("bob")
    repo = f.repo_addr(bob, "a")
    for answered_first, probed in ((False, True), (True, False)):
        sent = []
        conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
        if answered_first:
            conn.subscribe("h1", [Filter.make(tags={"a": [repo]})])
            conn._handle_frame(f'["EVENT","h1",{f.issue(bob, repo).to_json()}]'.encode())
            conn._handle_frame(b'["EOSE","h1"]')
        conn.subscribe("h2", [Filter.make(tags={"e": ["ab" * 32]})])
        conn._handle_frame(b'["EOSE","h2"]')
        assert any(isinstance(m, ProbeWanted) for m in sent) is probed


def test_a_probe_answered_slowly_with_nothing_is_asked_once_more():
    """A time budget may stop the probe before its first event, as it stops a page: the same
    probe once more (``ProbeWanted.again``), once (the simulator's seed 1508: a slow relay
    answering only precise queries, its first probe cut so, unproven for days)."""
    from gsync.io.inbox import ProbeWanted

    bob = f.Author.named("bob")
    repo = f.repo_addr(bob, "a")
    sent = []
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
    conn.subscribe("h1", [Filter.make(tags={"a": [repo]})])
    conn._handle_frame(b'["EOSE","h1"]')
    for slow in (True, True):
        conn.send(conn.book.probe_frame("probe", [Filter.make(tags={"a": [repo]}, kinds=[1621], limit=5)]))
        if slow:
            conn.book.probe_sent_at -= constants.TIME_CUT_SUSPECT_SECS + 1
        conn._handle_frame(b'["EOSE","probe"]')
    wanted = [m for m in sent if isinstance(m, ProbeWanted)]
    assert [m.again for m in wanted] == [False, True]  # the first, then once more; not again
    assert wanted[1].filters == wanted[0].filters


def test_a_req_asking_history_whole_has_its_filters_probed_one_after_another():
    """An empty REQ asking history whole (no ``since``: a sync's first page) has each of its
    imprecise filters probed in turn, the next as soon as the last brought nothing; one asking
    the last hour (``since``) one a PROBE_AGAIN_SECS. And a REQ asking history whole is a
    trigger of its own: a probe of the last hour's REQs a minute before does not hold it
    back (the simulator's seed 2102: the daily sync's first page, the only REQ asking an old
    issue's ``#a``, came back empty minutes after an hourly look's probe, and went unprobed)."""
    from gsync.io.inbox import ProbeRefused, ProbeWanted

    bob = f.Author.named("bob")
    repo = f.repo_addr(bob, "a")
    shapes = [{"a": [repo]}, {"A": [repo]}, {"q": [repo]}]

    def probes(conn, sent, since):
        """The probes an empty REQ of ``shapes`` (``since``) wants, each answered with nothing."""
        wanted = lambda: [m for m in sent if isinstance(m, ProbeWanted)]  # noqa: E731
        before = answered = len(wanted())
        conn.subscribe("h1", [Filter.make(tags=t, since=since) for t in shapes])
        conn._handle_frame(b'["EOSE","h1"]')
        conn.unsubscribe("h1")
        while answered < len(wanted()):
            answered += 1
            conn.send(conn.book.probe_frame(f"probe{answered}", [Filter.make(tags=shapes[0], kinds=[1621], limit=5)]))
            conn._handle_frame(f'["EOSE","probe{answered}"]'.encode())
        return wanted()[before:]

    sent = []
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
    assert len(probes(conn, sent, None)) == len(shapes)  # whole: each filter, one after another
    for said, chained in (('["CLOSED","probe","blocked: #a queries are not allowed here"]', True),
                          ('["CLOSED","probe","rate-limited: slow down"]', False),
                          ('["NOTICE","blocked: #a queries are not allowed here"]', True)):  # (naming nothing)
        sent = []  # a probe refused: the next goes, but not after a refusal for our rate
        conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
        conn.subscribe("h1", [Filter.make(tags=t) for t in shapes])
        conn._handle_frame(b'["EOSE","h1"]')
        conn.send(conn.book.probe_frame("probe", [Filter.make(tags=shapes[0], kinds=[1621], limit=5)]))
        conn._handle_frame(said.encode())
        assert len([m for m in sent if isinstance(m, ProbeWanted)]) == (2 if chained else 1), said
        assert conn.book.probe_sub is None  # (ended)
        refused = [m for m in sent if isinstance(m, ProbeRefused)]  # (told: its shape may be paused)
        assert [(m.prefix, m.text) for m in refused] == [(json.loads(said)[-1].split(":")[0],
                                                          json.loads(said)[-1].split(": ", 1)[1])]
    sent = []  # a REQ waiting for its answer, sent just before the probe: as likely its
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
    conn.subscribe("h1", [Filter.make(tags=t) for t in shapes])
    conn._handle_frame(b'["EOSE","h1"]')
    conn.subscribe("h2", [Filter.make(tags=shapes[0])])
    conn.send(conn.book.probe_frame("probe", [Filter.make(tags=shapes[0], kinds=[1621], limit=5)]))
    conn._handle_frame(b'["NOTICE","blocked: #a queries are not allowed here"]')
    assert conn.book.probe_sub == "probe" and len([m for m in sent if isinstance(m, ProbeWanted)]) == 1
    sent = []
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, sent.append, probe=True)
    assert len(probes(conn, sent, 1_700_000_000)) == 1  # the last hour: one
    assert len(probes(conn, sent, None)) == len(shapes)  # then history whole: its own trigger


def test_a_subscription_the_relay_closed_is_not_closed_again_by_us():
    """A relay that closes every REQ after its EOSE (PEERS.md): its CLOSED is read before the
    manager, done with the EOSE, asks to CLOSE the subscription; no CLOSE goes for it (a frame
    the relay reads as about no subscription). One still open is closed as ever, and one the
    relay closed and we opened again under its id is open again."""
    conn = RelayConnection("ws://relay.example", _Bursts([]), 1, lambda msg: None)
    sent = []
    conn.send = sent.append
    for sub_id in ("h1", "h2", "live-1"):
        conn.subscribe(sub_id, [Filter.make(kinds=[1621])])
    for sub_id in ("h1", "live-1"):
        conn._handle_frame(f'["EOSE","{sub_id}"]'.encode())
        conn._handle_frame(f'["CLOSED","{sub_id}",""]'.encode())
    conn.subscribe("live-1", [Filter.make(kinds=[1621])])  # (sent again after its cooldown)
    sent.clear()
    for sub_id in ("h1", "h2", "live-1"):
        conn.unsubscribe(sub_id)
    assert sent == ['["CLOSE","h2"]', '["CLOSE","live-1"]']
    assert conn.book.closed_by_relay == {}
