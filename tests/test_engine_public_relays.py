"""Public relays are not friendly (issue #11, SPEC §4-§5): they rate-limit queries, refuse
filters by policy, require NIP-42, cap subscriptions, and some never answer.

Real LocalRelays with query policies (``gsync.ops.localrelay``: ``query_rate``,
``refuse_tags``, ``query_log`` — the relay's own record of every filter it was asked) where
a real relay can do it; scripted relays for the rest. Long timers are shortened with the
test-only ``GSYNC_TEST_TIMERS`` (``gsync_factory(timers=…)``), never through ``conf/``.
"""
from __future__ import annotations

import json
import threading
import time

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, on_own, our_announcement

alice, bob, carol = f.Author.named("alice"), f.Author.named("bob"), f.Author.named("carol")


def relay_queries(path) -> list[dict]:
    """Every filter the relay was asked, in order: ``{"t", "addr", "filter", "ok"}``."""
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


def status_of(gsync, url) -> dict:
    return next((r for r in gsync.status()["relays"] if r["relay"] == url), {})


def events_named(gsync, name, relay=None) -> list[dict]:
    return [e for e in gsync.log_events()
            if e.get("event") == name and (relay is None or e.get("relay") == relay)]


class Sampler:
    """Samples ``probe()`` every ``interval`` seconds in a thread until stopped."""

    def __init__(self, probe, interval=0.1):
        self.samples: list[tuple[float, object]] = []
        self._probe, self._interval = probe, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), self._probe()))
            except Exception:
                pass
            time.sleep(self._interval)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5)
        return self.samples


# -- rate limits -------------------------------------------------------------------------------

COOLDOWN = 3.0  # RATE_LIMIT_COOLDOWN_SECS under test (65 s in production)


def test_rate_limited_relay_cools_down_paces_its_starts_and_converges(relay_factory, gsync_factory,
                                                                       tmp_path):
    """A relay admitting 20 filters a second per connection. gsync's first burst goes past
    it; from the first refusal nothing at all is asked — live REQs included — until the
    cooldown is over, and then the reactive gate (one start per 0.6 s, at most ten filters
    each) stays under the limit: refusals stop after the first episode. The relay is rate
    limited (5), then Probing, then healthy again, and every event arrives."""
    queries = tmp_path / "queries.jsonl"
    own = relay_factory()
    remote = relay_factory(query_rate={"max": 20, "window_secs": 1}, query_log=str(queries))
    repos = [our_announcement(own, [remote], d=f"busy-{n}") for n in range(40)]
    issues = [f.issue(bob, repo, subject=f"issue {i}") for repo in repos for i in range(40)]
    publish(remote.url, [*repos, *issues])
    publish(own.url, repos)
    started = time.time()
    gsync = gsync_factory(own, [remote], timers={"RATE_LIMIT_COOLDOWN_SECS": COOLDOWN})
    health = Sampler(lambda: gsync.metric("ngit_sync_relay_status", relay=remote.url))

    refused = wait_until(lambda: [q for q in relay_queries(queries) if not q["ok"]], timeout=30,
                         what="the relay's first rate-limit refusal")
    first_refusal = refused[0]["t"]
    # A new root while the relay cools down: its live REQ must wait for the cooldown too.
    late = f.issue(carol, repos[-1], subject="found during the cooldown", created_at=int(time.time()))
    publish(remote.url, [late])
    publish(own.url, [late])

    assert_arrives(own, [*issues, late], timeout=90, what="every issue through the rate limit")
    converged = time.time() - started
    wait_until(lambda: status_of(gsync, remote.url).get("health") == "healthy", timeout=20,
               what="the relay healthy again")
    samples = health.stop()

    asked = relay_queries(queries)
    refusals = [q["t"] for q in asked if not q["ok"]]
    # One episode: what was already on its way when the first refusal was sent, nothing after.
    assert max(refusals) - first_refusal < 0.5, [round(t - first_refusal, 2) for t in refusals]
    # The cooldown held everything, live REQs too (the late root's live REQ among them).
    during = [q for q in asked if first_refusal + 0.5 < q["t"] < first_refusal + COOLDOWN - 0.2]
    assert not during, during[:3]
    after = [q for q in asked if q["t"] > first_refusal + COOLDOWN - 0.2]
    assert any(late.id in json.dumps(q["filter"]) and q["filter"].get("limit") == 0 for q in after), \
        "no live REQ for the late root after the cooldown"
    # 5 (rate limited) while cooling down, then Probing, then back to healthy (1).
    assert 5 in [v for _, v in samples], samples[-5:]
    names = [e["event"] for e in gsync.log_events() if e.get("relay") == remote.url
             and e["event"] in ("relay_rate_limited", "relay_probing", "relay_rate_limit_lifted")]
    assert names == ["relay_rate_limited", "relay_probing", "relay_rate_limit_lifted"], names
    assert gsync.metric("ngit_sync_relay_status", relay=remote.url) == 1
    print(f"\nrate-limited relay: {len(refusals)} refusals, all within "
          f"{max(refusals) - first_refusal:.2f} s of the first; converged in {converged:.1f} s; "
          f"{len(asked)} filters asked")


# -- policy refusals ---------------------------------------------------------------------------

PROBE = 8.0  # POLICY_PROBE_SECS under test (24 h in production)


def _asks_for(q: dict, tag: str) -> bool:
    return f"#{tag}" in q["filter"]


def test_a_refused_tag_is_paused_through_consolidation_reconnect_and_daily_then_probed_once(
        relay_factory, gsync_factory, tmp_path):
    """A relay that refuses every filter with ``#q`` (and so every REQ carrying one). The
    REQs are split until the ``#q`` filter is alone; everything packed beside it completes;
    the ``#q`` shape is never asked again — not by a consolidation, a quick reconnect or the
    daily fresh start — until its one probe after the (shortened) 24 h."""
    queries = tmp_path / "queries.jsonl"
    own = relay_factory()
    remote = relay_factory(refuse_tags={"tags": ["q"], "message": "no quotes here"},
                           query_log=str(queries), lmdb=str(tmp_path / "remote-db"))
    repo = our_announcement(own, [remote], d="no-quotes")
    bugs = [f.issue(bob, repo, subject=f"bug {i}") for i in range(3)]
    replies = [f.comment(alice, bug, content="seen it") for bug in bugs]
    quoted = f.quote(carol, repo.address, content="only reachable by #q")
    publish(remote.url, [repo, *bugs, *replies, quoted])
    publish(own.url, [repo])
    gsync = gsync_factory(
        own, [remote],
        extra={"sync": {"batch_window_ms": "100", "base_backoff_secs": "1"}},
        timers={"POLICY_PROBE_SECS": PROBE, "DAILY_MIN_SECS": 6, "DAILY_MAX_SECS": 6.5},
    )
    assert_arrives(own, [*bugs, *replies], timeout=30, what="everything but the refused #q coverage")
    first_q = next(q["t"] for q in relay_queries(queries) if _asks_for(q, "q"))

    # New roots, one self-subscription batch each, until the live budget (20, LocalRelay
    # serves no NIP-11) makes gsync consolidate.
    news = []
    while not events_named(gsync, "consolidated") and len(news) < 30:
        news.append(f.issue(bob, repo, subject=f"new {len(news)}", created_at=int(time.time())))
        publish(own.url, news[-1:])
        time.sleep(0.25)
    assert events_named(gsync, "consolidated"), "no consolidation"
    remote.kill()
    remote.start()  # same port, same database: a quick reconnect
    wait_until(lambda: [e["fresh_start"] for e in events_named(gsync, "relay_connected")] == [True, False],
               timeout=20, what="a quick reconnect")
    wait_until(lambda: events_named(gsync, "daily_sync"), timeout=20, what="the daily fresh start")
    late = f.comment(alice, news[-1], content="after the daily sync", created_at=int(time.time()))
    publish(remote.url, [late])
    assert_arrives(own, [late], timeout=20, what="live coverage after all that")
    wait_until(lambda: [q for q in relay_queries(queries) if _asks_for(q, "q") and q["t"] > first_q + 3],
               timeout=PROBE + 10, what="the probe after the pause")
    time.sleep(2)

    asked_q = [q["t"] - first_q for q in relay_queries(queries) if _asks_for(q, "q")]
    assert all(not q["ok"] for q in relay_queries(queries) if _asks_for(q, "q"))
    discovery = [t for t in asked_q if t < 1.5]
    probes = [t for t in asked_q if t >= 1.5]
    assert len(discovery) <= 8, asked_q  # the halving, in the live and the historic REQ
    assert len(probes) == 1 and probes[0] >= PROBE - 0.5, asked_q
    assert len(events_named(gsync, "coverage_probe")) == 1
    paused = events_named(gsync, "coverage_paused")
    assert {e["coverage"] for e in paused} == {"#q"}, paused
    assert status_of(gsync, remote.url)["status"] == "connected"
    assert not on_own(own, [quoted])
    print(f"\n#q asked {len(asked_q)} times, at {[round(t, 2) for t in asked_q]} s")


# -- nothing waits forever -----------------------------------------------------------------------

STALL = 1.5  # REQ_STALL_SECS under test (30 s in production)


def _is_historic_req_with(message, key: str) -> bool:
    return (isinstance(message, list) and message[:1] == ["REQ"]
            and any(isinstance(flt, dict) and key in flt and flt.get("limit") != 0 for flt in message[2:]))


def test_a_relay_that_never_ends_one_filter_fails_that_batch_into_recovery(relay_factory, gsync_factory,
                                                                         scripted):
    """A relay that never answers a historic REQ carrying ``#E`` (no events, no EOSE). The
    REQ is closed after the stall bound and split until ``#E`` is alone; everything packed
    with it completes; the batch fails (not stuck in Syncing) into recovery, which gets it
    once the relay answers again, and the relay is Connected."""
    hanging = {"on": True}
    silent: list[str] = []

    def never_ends_E(relay, conn, message):
        if hanging["on"] and _is_historic_req_with(message, "#E"):
            silent.append(message[1])
            return []  # no events, no EOSE: ever
        return None

    own = relay_factory()
    remote = scripted(page_size=500, on_message=never_ends_E)
    repo = our_announcement(own, [remote], d="no-eose")
    bugs = [f.issue(bob, repo, subject=f"bug {i}") for i in range(3)]
    # Reachable only by #E: NIP-22 tags of the thread root, without the lowercase parent.
    upper_only = [alice.sign(1111, [["E", bug.id, "", bob.pubkey], ["K", "1621"]], "root only")
                  for bug in bugs]
    replies = [f.comment(alice, bug, content="seen it") for bug in bugs]
    remote.add(repo, *bugs, *upper_only, *replies)
    publish(own.url, [repo, *bugs])
    started = time.monotonic()
    gsync = gsync_factory(own, [remote], extra={"sync": {"recovery_base_secs": "1", "negentropy": "false"}},
                          timers={"REQ_STALL_SECS": STALL, "MAINTENANCE_TICK_SECS": 0.25})

    assert_arrives(own, replies, timeout=30, what="the coverage packed beside #E")
    wait_until(lambda: status_of(gsync, remote.url).get("status") == "connected_historic_sync_failures",
               timeout=30, what="the batch failed (not stuck in Syncing)")
    failed_after = time.monotonic() - started
    wait_until(lambda: events_named(gsync, "recovery_attempt"), timeout=15, what="recovery taking over")
    assert not on_own(own, upper_only)
    # Every REQ the relay left silent was closed by gsync (its slot and the relay's freed).
    wait_until(lambda: set(silent) <= {m[1] for m in remote.messages("CLOSE")}, timeout=10,
               what="a CLOSE for every silent REQ")
    assert any(len(m) == 3 for m in remote.messages("REQ") if m[1] in silent), \
        "the silent REQ was never split down to the #E filter alone"

    healed = time.monotonic()
    hanging["on"] = False
    assert_arrives(own, upper_only, timeout=30, what="recovery fetching the #E coverage")
    wait_until(lambda: status_of(gsync, remote.url).get("status") == "connected", timeout=30,
               what="the relay promoted back to Connected")
    recovered_after = time.monotonic() - healed
    print(f"\nno-EOSE relay: batch failed {failed_after:.1f} s after start (stall bound {STALL} s); "
          f"Connected {recovered_after:.1f} s after the relay answered again")
