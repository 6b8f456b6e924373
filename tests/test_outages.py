"""Outages lose nothing (SPEC §2, §4): the own relay away for 30 s during live sync, and a
remote killed and restarted in the middle of its historic sync. Relays with an LMDB database
come back on the same port with their data, as a restarted relay would."""
from __future__ import annotations

import time

import pytest

from . import factory as f
from .relays import free_port, publish, wait_until, write_seed_file
from .scenario import assert_arrives, our_announcement

bob, carol = f.Author.named("bob"), f.Author.named("carol")

OWN_OUTAGE_SECS = 30


class _Endpoint:
    """A relay's address before the relay exists (the announcement must name it)."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"ws://127.0.0.1:{port}"


@pytest.mark.slow
@pytest.mark.long
def test_own_relay_away_for_30s_during_live_sync_loses_nothing(relay_factory, gsync_factory, tmp_path):
    own = relay_factory(lmdb=str(tmp_path / "own-db"))
    a, b = relay_factory(), relay_factory()
    repo = our_announcement(own, [a, b], d="outage")
    roots = [f.issue(bob, repo, subject=f"before {i}") for i in range(5)]
    publish(a.url, [repo, *roots])
    publish(b.url, [repo])
    publish(own.url, [repo])
    gsync = gsync_factory(own, [a, b], extra={"sync": {"base_backoff_secs": "1"}})
    assert_arrives(own, roots, what="the history before the outage")
    wait_until(lambda: all(r["status"] == "connected" for r in gsync.status()["relays"]),
               timeout=60, what="live sync on both remotes")

    # Killed mid-delivery: a burst of replies is on its way when the own relay dies.
    burst = [f.comment(carol, roots[0], content=f"burst {i}", created_at=int(time.time()))
             for i in range(600)]
    publish(a.url, burst)
    wait_until(lambda: gsync.metric("ngit_sync_events_synced_total") >= len(roots) + 1,
               timeout=30, interval=0.02, what="the burst under way")
    own.kill()
    during: list = list(burst)
    new_roots: list = []
    started = time.monotonic()
    while time.monotonic() - started < OWN_OUTAGE_SECS:
        # Every second, with that moment's created_at: a new issue on one remote (a new
        # root), a reply to an older root on it, and on the other remote a reply to an issue
        # made during the outage (only a layer-3 subscription made after the outage, once
        # the own relay holds that issue, can find it).
        n, now = len(new_roots), int(time.time())
        issue = f.issue(carol, repo, subject=f"during the outage {n}", created_at=now)
        reply = f.comment(bob, roots[n % len(roots)], content=f"reply {n}", created_at=now)
        publish(a.url, [issue, reply])
        during += [issue, reply]
        if new_roots:
            late = f.comment(bob, new_roots[-1], content=f"on a new root {n}", created_at=now)
            publish(b.url, [late])
            during.append(late)
        new_roots.append(issue)
        time.sleep(1)
    assert gsync.proc.poll() is None
    assert any(e.get("event") == "own_relay_down" for e in gsync.log_events())

    own.start()  # same port, same database
    assert_arrives(own, during, timeout=120, what=f"all {len(during)} events made during the outage")
    assert_arrives(own, roots, timeout=10, what="the history, still there")
    assert gsync.proc.poll() is None


@pytest.mark.slow
@pytest.mark.long
def test_a_remote_killed_and_restarted_during_its_historic_sync_loses_nothing(
        relay_factory, gsync_factory, tmp_path):
    own = relay_factory()
    port = free_port()
    repo = our_announcement(own, [_Endpoint(port)], d="restart-remote")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(3000)]
    remote = relay_factory(port=port, lmdb=str(tmp_path / "remote-db"),
                           seed_file=write_seed_file([repo, *issues], str(tmp_path)))
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], extra={"sync": {"base_backoff_secs": "1",
                                                         "negentropy": "false"}})
    wait_until(lambda: gsync.metric("ngit_sync_events_synced_total") >= 300, timeout=60,
               interval=0.05, what="historic sync under way")
    remote.kill()
    synced_at_kill = gsync.metric("ngit_sync_events_synced_total")
    time.sleep(1)
    remote.start()  # same port, same database
    assert synced_at_kill < len(issues), "historic sync finished before the kill: vacuous"
    assert_arrives(own, issues, timeout=120, what="every issue after the remote's restart")
    assert len([e for e in gsync.log_events() if e.get("event") == "relay_connected"]) >= 2
    assert gsync.proc.poll() is None
