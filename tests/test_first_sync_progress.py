"""A first sync an operator can watch (issue 39): ``/status``, ``gsync status`` and the gauges
say how far it has come and how long it has left, and the estimate holds up against what the
sync then takes, under SPEC §5's default gate (one background start a second per relay)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gsync.ops import status as status_cmd

from . import factory as f
from .gsync_proc import ROOT
from .relays import publish, wait_until
from .scenario import our_announcement

alice, bob = f.Author.named("alice"), f.Author.named("bob")
REPOS, ISSUES = 18, 300


def gsync_status(gsync) -> str:
    """``gsync status`` against the running instance, as an operator types it."""
    result = subprocess.run([sys.executable, f"{ROOT}/bin/gsync", "status", "--config", gsync.config_path],
                            capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
@pytest.mark.long
def test_a_first_sync_shows_its_progress_and_a_time_left_that_holds(relay_factory, gsync_factory):
    """A new gsync in front of an own relay that holds most of its repositories' history
    already: 18 repositories on one remote, 5,400 issues and 1,800 comments, 49 in 50 of them
    on the own relay. Every filter goes by NIP-77, one filter a start, a start a second: about
    40 s. At a quarter of the way the time left it showed is within ±50 % of what it then
    took. (The estimate of a history paged by REQ, which holds one page in the queue at a
    time, is rougher: sync.progress.)"""
    own, remote = relay_factory(), relay_factory()
    repos = [our_announcement(own, [remote], d=f"watched-{i}") for i in range(REPOS)]
    history = []
    for repo in repos:
        for n in range(ISSUES):
            bug = f.issue(bob, repo, subject=f"bug {n}")
            history.append(bug)
            if n % 3 == 0:
                history.append(f.comment(alice, bug, content="seen it too"))
    publish(remote.url, [*repos, *history])
    held = [e for i, e in enumerate(history) if i % 50]  # 49 in 50: NIP-77 for every filter
    history = [e for i, e in enumerate(history) if not i % 50]
    publish(own.url, [*repos, *held])
    gsync = gsync_factory(own, [remote], extra={"sync": {"background_start_interval_ms": "1000"},
                                                "log": {"level": "info"}})
    began = time.monotonic()
    samples = []  # (seconds since start, /status)

    def synced() -> bool:
        status = gsync.status()
        samples.append((time.monotonic() - began, status))
        progress = status["progress"]
        return progress["relays_synced"] == 1 and progress["relays_syncing"] == 0

    wait_until(lambda: gsync.status()["progress"]["starts_queued"] > 0, timeout=60, interval=0.1,
               what="the first sync under way")
    during = gsync_status(gsync)
    seconds_left_gauge = gsync.metric("gsync_sync_seconds_left")
    queued_gauge = gsync.metric("gsync_starts_queued", relay=remote.url)
    wait_until(synced, timeout=240, interval=0.5, what="the first sync done")
    took = samples[-1][0]
    at, quarter = min(samples, key=lambda s: abs(s[0] - took / 4))
    estimate, actual = quarter["progress"]["secs_left"], took - at
    print(f"\nfirst sync took {took:.1f} s; at {at:.1f} s it said {estimate} s left, "
          f"{actual:.1f} s were: ratio {estimate / actual:.2f}")
    print("gsync status at a quarter of the way:\n" + status_cmd.render(quarter))
    print("gsync status while syncing (the command):\n" + during)
    after = gsync_status(gsync)
    print("gsync status once synced (the command):\n" + after)
    for t, s in samples[::4]:
        print(f"  {t:5.1f} s  {status_cmd.progress_lines(s)[0]}")
    assert took >= 30, f"the first sync took {took:.1f} s: not a world the gate dominates"
    assert 0.5 * actual <= estimate <= 1.5 * actual, (at, estimate, actual)

    # What was shown during the sync, and once it was done
    assert quarter["progress"]["repos_total"] == REPOS
    assert quarter["progress"]["relays_total"] == 1 and quarter["progress"]["relays_synced"] == 0
    assert quarter["progress"]["events_delivered"] < len(history)
    assert quarter["relays"][0]["starts_queued"] == quarter["progress"]["starts_queued"]
    assert during.splitlines()[1].startswith(f"syncing: 0/{REPOS} repos complete, 0/1 relays synced, ")
    assert " left (slowest: " in during.splitlines()[1]
    assert seconds_left_gauge > 0 and queued_gauge >= 0
    done = samples[-1][1]["progress"]
    assert (done["repos_complete"], done["relays_synced"], done["secs_left"]) == (REPOS, 1, 0)
    assert done["events_delivered"] >= len(history)  # what the own relay lacked, and some again
    assert after.splitlines()[1] == (f"synced: {REPOS}/{REPOS} repos complete, 1/1 relays synced, "
                                     f"{done['events_delivered']:,} events delivered")
    assert gsync.metric("gsync_sync_repositories_complete") == REPOS
    assert gsync.metric("gsync_sync_relays_synced") == 1
    assert gsync.metric("gsync_sync_seconds_left") == 0
