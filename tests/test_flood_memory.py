"""Memory is bounded by design, not by luck (SPEC §6): three relays flood gsync at once.

- unrequested: valid signed events no filter asked for (dropped before any signature check,
  each costing the relay a misbehaviour point: it is hung up on, again and again);
- duplicates: the event gsync asked for, sent 150,000 times over (read and dropped as known);
- new: 6,000 genuine state events of the repository (kind 30618, five refs each),
  all at once: requested and new, they must be delivered, so only the delivery backlog's
  pushback keeps them out of memory. (State events, not issues: every new issue is a new
  root, which rightly grows what gsync syncs; that is the own relay's content, not a flood.)
  What each delivered event leaves is work, not flood: its id in ``seen``, its entry in
  ``own_held`` and its index, its verified signature, about 0.7 KB of resident memory each
  (the floods without it grew 3.4-3.8 MB; offering 3,000 of these, 11.7-12.2 MB; 6,000,
  12.8-15.1). So the flood offers as many as the bound's slack holds, and the measure waits
  until all were sent, whatever the machine's pace: with 20,000 and the measure taken at
  5 s, a loaded machine (a slower flood, more of them delivered within it) grew 24-27 MB
  against the 19.7 MB bound.

gsync's resident memory may grow by at most the bound below above what it used before the
floods, and an honest relay's live events keep arriving within seconds. bench/flood runs the
unrequested and duplicate floods at 1,000,000 events.

The bound, from the design (docs/design.md, "Hostile relays and memory"): per flooding connection
one read (256 KiB), its parsed bursts (the reader reads on only while fewer than two wait in the manager),
ids it verified: about 2 MB each; plus the delivery backlog, 1,000 events and at most one
burst (256 KiB of frames) per connection past it, each event in memory about four times its
JSON; plus ids delivered (``seen``) and the allocator's slack: 8 MB.
"""
from __future__ import annotations

import threading
import time

import pytest

from . import factory as f
from . import hostile
from .gsync_proc import memory_kb
from .relays import publish, wait_until
from .scenario import assert_arrives, on_own, our_announcement

BACKLOG = 1_000
DUPLICATES = 150_000
NEW_EVENTS = 6_000  # five backlogs' worth: pushback must hold most of them out
PER_CONNECTION_MB = 2.0
SLACK_MB = 8.0


def growth_bound_mb(connections: int, event_json_bytes: float) -> float:
    backlog_events = BACKLOG + connections * (256 * 1024 / event_json_bytes)
    return connections * PER_CONNECTION_MB + backlog_events * 4 * event_json_bytes / 2**20 + SLACK_MB


@pytest.mark.slow
@pytest.mark.long
def test_floods_leave_memory_bounded_and_the_honest_relay_on_time(relay_factory, scripted, gsync_factory):
    own, honest = relay_factory(), relay_factory()
    gate = threading.Event()
    dup_sent, new_sent, unrequested_sent = hostile.Counter(), hostile.Counter(), hostile.Counter()
    spam: list = []  # filled once the repository exists
    unrequested = scripted(**hostile.floods_unrequested(
        hostile.unrequested_notes(1_000), total=1_000_000, sent=unrequested_sent, gate=gate))
    duplicates = scripted(**hostile.floods_duplicates(total=DUPLICATES, sent=dup_sent, gate=gate))
    new = scripted(**hostile.floods_new(spam, sent=new_sent, gate=gate))
    repo = our_announcement(own, [honest, unrequested, duplicates, new], d="flooded")
    spammer = f.Author.named("spammer")
    spam += [f.state(spammer, "flooded", refs={f"refs/heads/b{j}": f"{i:040x}" for j in range(5)})
             for i in range(NEW_EVENTS)]
    bound_mb = growth_bound_mb(3, sum(len(e.to_json()) for e in spam[:100]) / 100)
    history = [f.issue(f.Author.named("bob"), repo, subject=f"history {i}") for i in range(10)]
    publish(honest.url, [repo, *history])
    duplicates.add(repo)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [honest, unrequested, duplicates, new],
                          extra={"sync": {"delivery_max_backlog": str(BACKLOG)}, "log": {"level": "info"}})
    assert_arrives(own, history, what="the honest relay's history")
    wait_until(lambda: all(r.connections for r in (unrequested, duplicates, new)), timeout=30,
               what="gsync on every flooder")
    time.sleep(1)
    before = memory_kb(gsync.proc.pid)["rss"]

    gate.set()
    delays = []
    live_author = f.Author.named("honest-live")
    started = time.monotonic()
    while dup_sent.value < DUPLICATES or new_sent.value < NEW_EVENTS or time.monotonic() - started < 5:
        assert time.monotonic() - started < 90, (f"the floods stalled: {dup_sent.value:,} duplicates, "
                                                 f"{new_sent.value:,} new events sent")
        comment = f.comment(live_author, history[0], content=f"live {len(delays)}")
        publish(honest.url, [comment])
        published = time.monotonic()
        wait_until(lambda c=comment: on_own(own, [c]), timeout=30, interval=0.05,
                   what="a live comment from the honest relay")
        delays.append(time.monotonic() - published)
    peak = memory_kb(gsync.proc.pid)["hwm"]

    growth_mb = (peak - before) / 1024
    assert growth_mb < bound_mb, (
        f"RSS grew {growth_mb:.1f} MB (bound {bound_mb:.1f}); new events sent "
        f"{new_sent.value:,}, backlog {gsync.status()['delivery_backlog']}")
    assert max(delays) < 5.0, delays
    # The floods did happen, and went where they should.
    wait_until(lambda: gsync.metric("gsync_remote_events_total", relay=duplicates.url) >= DUPLICATES,
               timeout=30, what="every duplicate read")
    assert new_sent.value >= 5 * BACKLOG  # far more than the backlog holds were offered
    assert gsync.metric("gsync_relay_hangups_total", reason="misbehaving") >= 1
    assert gsync.metric("gsync_events_dropped_total", reason="own_relay_backlog_full") == 0
    assert gsync.proc.poll() is None
    gsync.proc.kill()  # not SIGTERM: its drain would deliver the rest of the new events first
