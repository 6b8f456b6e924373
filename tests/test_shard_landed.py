"""Shards learn what the other shards stored from the own relay's live stream, not by reading
it back (issue 40: two shards read the own relay 1.9-2.7 times as often as one instance).

In process (tests/manager_harness.py): a batch that waits for another shard's lead reads the
own relay at once, while it holds little, and what the other shard stores meanwhile comes
live (``OwnLanded``); once the wait is over, the batch's holdings are known without a read,
and its exchange is given what the other shard brought. End to end (the socket is the
subject): the self-subscriber of a shard shows what another client stored on a real own
relay, and skips what the instance already knows is held."""
from gsync.io.inbox import OwnLanded
from gsync.protocol.filters import Filter
from gsync.protocol.urls import normalize_relay_url as normalize_url
from gsync.sync.batch_phase import BatchPhase
from gsync.sync.own_held import HeldEntry
from gsync.sync.shard import Shard, lead_relay

from .factory import Author, announcement, comment, issue
from .manager_harness import ManagerHarness
from .test_own_reads import address, land, reconciles

SHARD = Shard(0, 2)


def split_world():
    """(a relay of this shard, one of the other's, an announcement listing both that the
    other shard leads)."""
    owner = Author.named("landed-owner")
    here = next(u for i in range(100) if SHARD.owns(u := f"wss://here{i}.example"))
    there = next(u for i in range(100) if not SHARD.owns(u := f"wss://there{i}.example"))
    for i in range(100):
        ann = announcement(owner, f"landed-{i}", relays=[here, there])
        if lead_relay(address(ann), [normalize_url(here), normalize_url(there)]) == normalize_url(there):
            return here, there, ann
    raise AssertionError("no repository led by the other shard")


def test_a_batch_following_another_shard_reads_ahead_and_then_knows_what_that_shard_stored(tmp_path):
    from gsync import constants

    here, _there, ann = split_world()
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    follower = next(b for b in h.state(here).current.pending.values() if b.led_elsewhere)
    assert follower.phase is BatchPhase.FOLLOWING

    # The waiting batch's values are read now, with layer 1's: the own relay holds nothing yet.
    h.close_own_read_window()
    reads = h.own_reads()
    read_tags = {name for g in reads for flt in g.args[1] for name, _ in flt.tags}
    assert "a" in read_tags
    for g in reads:
        land(h, g)

    # The other shard stores the repository's history meanwhile: seen live, not read.
    # (enough of it that NIP-77 pays at production prices, sync.method)
    root = issue(Author.named("landed-dev"), ann)
    reply = comment(Author.named("landed-dev"), root)
    more = [issue(Author.named("landed-dev"), ann, subject=f"bug {i}") for i in range(150)]
    h.feed(OwnLanded([(e.id, HeldEntry.of(e)) for e in (root, reply, *more)]))
    assert root.id in h.manager.seen

    h.advance(constants.FOLLOWER_WAIT_MAX_SECS)
    h.tick()  # the wait is over: no word comes from another shard
    h.close_own_read_window()
    assert h.own_reads() == []  # known: nothing read back
    for _ in range(4):
        h.advance(1.1)  # the pacing gate: each exchange starts
    assert h.own_reads() == []
    assert follower.phase is BatchPhase.STARTED  # it read its holdings, chose NIP-77, started
    by_a = [held for flt, held in reconciles(h, here) if any(name == "a" for name, _ in flt.tags)]
    assert by_a and all(root.id in {i for _, i in held} for held in by_a)


def test_a_batch_following_another_shard_waits_on_while_that_shard_is_storing(tmp_path):
    """Past its usual bound, the batch waits while another shard stores (its backlog drains
    at the own relay's pace), until that shard is quiet, or OTHER_SHARD_WAIT_MAX_SECS."""
    from gsync import constants

    here, _there, ann = split_world()

    def waiting(h) -> bool:
        return any(b.led_elsewhere and f"lead{b.batch_id}" in b.outstanding_subs
                   for b in h.state(here).current.pending.values())

    def stores(h, n: int) -> None:  # another shard stores an issue of some repository
        event = issue(Author.named("landed-dev"), f"30617:{'ab' * 32}:other", subject=f"n{n}")
        h.feed(OwnLanded([(event.id, HeldEntry.of(event))]))

    # storing on: it waits past its 10 s, up to the most
    h = ManagerHarness(tmp_path / "busy", shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    h.answer_own_reads()
    assert waiting(h)
    for n in range(int(constants.OTHER_SHARD_WAIT_MAX_SECS) - 2):
        h.advance(1)
        stores(h, n)
        h.tick()
        if n >= constants.FOLLOWER_WAIT_MAX_SECS:
            assert waiting(h), n
    h.advance(3)
    h.tick()
    assert not waiting(h)

    # the other shard went quiet: it goes OTHER_SHARD_QUIET_SECS after its last store
    h = ManagerHarness(tmp_path / "quiet", shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    h.answer_own_reads()
    h.advance(constants.FOLLOWER_WAIT_MAX_SECS - 1)
    stores(h, 0)
    h.advance(2)
    h.tick()
    assert waiting(h)  # past 10 s, stored 2 s ago
    h.advance(constants.OTHER_SHARD_QUIET_SECS)
    h.tick()
    assert not waiting(h)


def test_a_root_another_shard_stored_has_its_thread_known_without_a_read(tmp_path):
    """A new root the other shard stored (seen by the self-subscription and live): its
    thread holds only what is stored from now on, which comes live too, so its thread
    filters need no read of the own relay."""
    from gsync.io.inbox import OwnEvents

    here, _there, _ann = split_world()
    ann = announcement(Author.named("landed-owner"), "landed-alone", relays=[here])
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    h.settle(here)
    root = issue(Author.named("landed-dev"), ann)
    h.feed(OwnEvents([root]))  # as the subscriber posts a burst: the self-subscription's first
    h.feed(OwnLanded([(root.id, HeldEntry.of(root))]))
    h.advance(h.config.sync.batch_window_ms / 1000)  # the window: the root's AddFilters
    h.close_own_read_window()
    asked = [flt for g in h.own_reads() for flt in g.args[1]]
    assert not [flt for flt in asked if any(root.id in values for _, values in flt.tags)]
    for _ in range(3):
        h.advance(1.1)  # the pacing gate
    threads = [flt for flt, _ in reconciles(h, here) if any(root.id in values for _, values in flt.tags)]
    reqs = [r for r in h.reqs(here) if any(root.id in v for flt in r[2:] for v in flt.values() if isinstance(v, list))]
    assert threads or reqs  # the thread is asked for


def test_what_landed_is_not_asked_again_by_recovery_and_settles_its_claim(tmp_path):
    here, _there, ann = split_world()
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    event = issue(Author.named("landed-dev"), ann)
    h.manager.claims.claim(here, 1, [event.id])
    h.manager.recovery.add_missing(here, [event.id], h.clock())
    h.feed(OwnLanded([(event.id, HeldEntry.of(event))]))
    assert not h.manager.recovery.is_missing(event.id)
    assert len(h.manager.claims) == 0


_SUBSCRIBERS = """
import gevent.monkey; gevent.monkey.patch_all()
import json, sys
from gsync.io.inbox import OwnEvents, OwnLanded, OwnSubscribed
from gsync.io.self_subscriber import SelfSubscriber
from gsync.ops.logging import get_logger

def post_as(landed):
    def post(msg):
        if isinstance(msg, OwnSubscribed):  # with the layer-1 holdings its history read told
            print(json.dumps([landed, "subscribed", sorted(i for i, _ in msg.layer1 or ())]), flush=True)
        elif isinstance(msg, OwnEvents):
            print(json.dumps([landed, "events", [e.id for e in msg.events]]), flush=True)
        elif isinstance(msg, OwnLanded):
            print(json.dumps([landed, "landed", [[i, e.kind, list(map(list, e.tags))] for i, e in msg.entries]]), flush=True)
    return post

for landed in (True, False):
    SelfSubscriber(sys.argv[1], post_as(landed), get_logger("test"), landed=landed, held={sys.argv[2]}).start()
gevent.sleep(60)
"""


def test_a_shards_self_subscriber_shows_what_others_stored_and_skips_what_it_knows_is_held(relay_factory):
    """A real own relay, and two self-subscribers (a shard's, one instance's) in a gevent
    process of their own: another client stores two roots after their history is read.
    The shard's subscriber posts the one its instance did not know as held (``OwnLanded``)
    and skips the one it knows is held (its own delivery, answered OK); one instance opens
    no such stream. Both still show both roots through the self-subscription. Their whole
    history reads told layer 1's holdings: the announcement and a user's GRASP list (10317)
    the own relay held, not its roots."""
    import json
    import subprocess
    import sys
    import threading

    from .forks import gsync_env
    from .relays import publish, wait_until

    own = relay_factory()
    ann = announcement(Author.named("landed-owner"), "landed-e2e")
    grasp_list = Author.named("landed-owner").sign(10317, [["g", "wss://grasp.example"]])
    publish(own.url, [ann, grasp_list])
    known, other = issue(Author.named("landed-dev"), ann), issue(Author.named("landed-dev"), ann, subject="two")
    child = subprocess.Popen([sys.executable, "-c", _SUBSCRIBERS, own.url, known.id], stdout=subprocess.PIPE, text=True,
                             env=gsync_env())
    lines: list = []
    reader = threading.Thread(  # its log lines go to stdout too
        target=lambda: lines.extend(json.loads(line) for line in child.stdout if line.startswith("[")), daemon=True)
    reader.start()

    def said(landed, what):
        return [line[2] if len(line) > 2 else True for line in list(lines) if line[:2] == [landed, what]]

    try:
        wait_until(lambda: said(True, "subscribed") and said(False, "subscribed"), timeout=20, what="the history reads")
        assert said(True, "subscribed") == said(False, "subscribed") == [sorted([ann.id, grasp_list.id])]
        publish(own.url, [known, other])  # stored (and broadcast) in this order
        wait_until(lambda: any(other.id in [e[0] for e in m] for m in said(True, "landed")), timeout=20,
                   what="the other client's root, live")
        for landed in (True, False):
            wait_until(lambda lt=landed: {known.id, other.id} <= {i for ids in said(lt, "events") for i in ids},
                       timeout=20, what="both roots through the self-subscription")
        [[(event_id, kind, tags)]] = said(True, "landed")  # the known one was skipped
        assert event_id == other.id and kind == other.kind and ["a", address(ann)] in tags
        assert said(False, "landed") == []
    finally:
        child.kill()
        child.wait()


def test_roots_another_shard_leads_wait_in_one_batch_and_then_go_by_nip77(tmp_path):
    """Roots of a repository another shard leads, discovered a batch window apart, join the
    batch already waiting for that shard instead of each waiting in a batch of its own. Once
    the wait is over and the other shard stored their threads, their thread filters go by
    NIP-77 (what the own relay holds is not brought again); a batch of each root's thread
    alone, a few comments held, went by REQ pages, every comment brought again (bench/scale
    --shards 2: 9,000 copies)."""
    from gsync import constants

    here, _there, ann = split_world()
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    h.answer_own_reads()
    dev = Author.named("landed-dev")
    waves = [[issue(dev, ann, subject=f"wave {w} root {i}") for i in range(3)] for w in range(3)]
    threads = {root.id: [comment(dev, root, content=f"c{j}") for j in range(6)] for wave in waves for root in wave}
    for wave in waves:  # the other shard stores roots: seen live, and by the self-subscription
        h.feed(OwnLanded([(e.id, HeldEntry.of(e)) for e in wave]))
        h.own_relay_holds(*wave)
        h.answer_own_reads()

    waiting = [b for b in h.state(here).current.pending.values() if b.led_elsewhere]
    assert len(waiting) == 1
    assert {root.id for wave in waves for root in wave} <= waiting[0].items.root_events

    # the other shard stores their threads meanwhile: seen live
    h.feed(OwnLanded([(e.id, HeldEntry.of(e)) for thread in threads.values() for e in thread]))
    h.advance(constants.FOLLOWER_WAIT_MAX_SECS + constants.OTHER_SHARD_QUIET_SECS)
    h.tick()  # the wait is over
    h.answer_own_reads()
    for _ in range(8):
        h.advance(1.1)  # the pacing gate: each exchange starts
    comments = [e for thread in threads.values() for e in thread]
    by_nip77 = [flt for flt, _ in reconciles(h, here) if any(flt.matches(e) for e in comments)]
    asked = [Filter.make(kinds=f.get("kinds"), tags={k[1:]: v for k, v in f.items() if k.startswith("#")})
             for r in h.historic_reqs(here) for f in r[2:]]
    assert by_nip77
    assert not [flt for flt in asked if any(flt.matches(e) for e in comments)]  # none comes again


def test_a_batch_following_another_shard_reads_ahead_what_no_read_under_way_asks(tmp_path):
    """Two relays of this shard list a repository another shard leads; the second lists one
    more. The second's waiting batch reads that one now, beside the read of the first's
    values under way (which it does not read twice), not once its wait is over, when the
    own relay holds what the other shard stored of it meanwhile."""
    owner = Author.named("landed-owner")
    here = [u for i in range(200) if SHARD.owns(u := f"wss://here{i}.example")][:2]
    there = next(u for i in range(100) if not SHARD.owns(u := f"wss://there{i}.example"))

    def led_there(name: str, relays: list[str]):
        for i in range(200):
            ann = announcement(owner, f"{name}-{i}", relays=relays)
            if lead_relay(address(ann), [normalize_url(u) for u in relays]) == normalize_url(there):
                return ann
        raise AssertionError("no repository led by the other shard")

    shared = led_there("shared", [here[0], here[1], there])
    second = led_there("second", [here[1], there])
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(shared, second)
    h.connect(here[0])
    h.close_own_read_window()
    flying = h.own_reads()
    assert any(address(shared) in values for g in flying for flt in g.args[1] for _, values in flt.tags)
    h.connect(here[1])  # its batch waits too, while the first read is under way
    for g in flying:
        land(h, g)  # the reads queued meanwhile go now
    h.close_own_read_window()
    later = [flt for g in h.own_reads() for flt in g.args[1]]
    asked = {v for flt in later for _, values in flt.tags for v in values}
    assert address(second) in asked  # read ahead now
    assert address(shared) not in asked  # being read already


def test_a_member_both_shards_fetched_keeps_its_descendants_known_though_answered_duplicate(tmp_path):
    """With shards, the own relay's ``duplicate`` mostly means another shard stored the
    event a moment before (both fetched it): what tags it comes through the landed stream
    as for any event stored anew, so its descendants are not read (reading them brought
    back what that shard stored). One instance reads them (test_own_reads)."""
    from gsync import constants
    from gsync.io.inbox import OwnHeldConfirmed

    from .factory import comment

    here, _there, _ann = split_world()
    ann = announcement(Author.named("landed-owner"), "landed-both", relays=[here])
    root = issue(Author.named("landed-dev"), ann)
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(ann, root)
    h.connect(here)
    h.settle(here)
    member = comment(Author.named("landed-reply"), root, content="fetched by both shards")
    h.relay_sends(here, "some-sub", member)
    h.feed(OwnHeldConfirmed([(member.id, HeldEntry.of(member))], stored_anew=[]))  # duplicate
    h.advance(constants.DESCENDANT_TICK_SECS)
    h.tick()  # the member's descendant batch
    h.close_own_read_window()
    asked = {value for g in h.own_reads() for flt in g.args[1] for _, values in flt.tags for value in values}
    assert member.id not in asked


def test_what_the_own_relay_refused_with_everything_goes_again_once_another_shard_stores(tmp_path):
    """A shard's refused events waiting for the own relay to store anew (put read-only, a
    full disk) go again when another shard's event lands there: it stores again, whether
    or not this shard has stored anything since."""
    from gsync.io.inbox import DeliveryAnswered

    here, _there, ann = split_world()
    h = ManagerHarness(tmp_path, shard=SHARD)
    h.own_relay_holds(ann)
    h.connect(here)
    refused = issue(Author.named("landed-dev"), ann, subject="refused while read-only")
    h.feed(DeliveryAnswered(refused, "rejected", "restricted: read-only", here, True))
    assert refused.id in h.manager.rejected
    other = issue(Author.named("landed-dev"), ann, subject="stored by the other shard")
    h.feed(OwnLanded([(other.id, HeldEntry.of(other))]))
    assert refused.id not in h.manager.rejected and h.manager.delivery.is_tracked(refused.id)


def test_the_own_relays_stream_is_read_in_gulps_not_event_by_event(relay_factory):
    """Another client stores 120 roots one at a time, 5 ms apart: the own relay sends each
    as it stores it. Both self-subscribers (a shard's, with the landed stream, and one
    instance's) show every one, in a few messages each: the stream is read in gulps
    (``constants.OWN_STREAM_GULP_SECS``), not one socket read, one wake-up and one message to
    the manager per event (with shards, that cost each instance more CPU than all it parsed:
    bench/scale N = 50, two shards 1.68x one instance's CPU, 1.12-1.16x read in gulps)."""
    import json
    import subprocess
    import sys
    import threading
    import time

    from .forks import gsync_env
    from .relays import _connect, publish, wait_until

    own = relay_factory()
    ann = announcement(Author.named("landed-owner"), "landed-gulps")
    publish(own.url, [ann])
    roots = [issue(Author.named("landed-dev"), ann, subject=f"gulp {i}") for i in range(120)]
    child = subprocess.Popen([sys.executable, "-c", _SUBSCRIBERS, own.url, "0" * 64], stdout=subprocess.PIPE,
                             text=True, env=gsync_env())
    lines: list = []
    reader = threading.Thread(
        target=lambda: lines.extend(json.loads(line) for line in child.stdout if line.startswith("[")), daemon=True)
    reader.start()

    def posts(landed, what):
        return [line[2] for line in list(lines) if line[:2] == [landed, what]]

    try:
        wait_until(lambda: posts(True, "subscribed") and posts(False, "subscribed"), timeout=20,
                   what="the history reads")
        ws = _connect(own.url)
        try:
            for root in roots:
                ws.send('["EVENT",' + root.to_json() + "]")
                assert json.loads(ws.recv())[:3] == ["OK", root.id, True]
                time.sleep(0.005)
        finally:
            ws.close()
        wanted = {r.id for r in roots}
        for landed, what in ((True, "landed"), (True, "events"), (False, "events")):
            wait_until(lambda lt=landed, w=what: wanted <= {e[0] if w == "landed" else e
                                                            for m in posts(lt, w) for e in m},
                       timeout=20, what=f"every root ({'shard' if landed else 'instance'}, {what})")
            assert len(posts(landed, what)) <= len(roots) // 5, (landed, what, len(posts(landed, what)))
    finally:
        child.kill()
        child.wait()
