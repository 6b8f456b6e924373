"""Every wait has a deadline (SPEC §5, §8): the own relay's live read (a half-open socket
is found), its history read (a relay dribbling events), a NIP-77 exchange whose greenlet
dies, a historic REQ a relay answers one event at a time and never ends."""
import os
import threading
import time

import pytest

from . import factory as f
from .gsync_proc import ROOT, GsyncProcess
from .relays import publish, wait_until
from .scenario import assert_arrives, bob, our_announcement
from .scripted_relay import _event_dict

SELF = "gsync-self"


def _status(gsync, url):
    return next((r for r in gsync.status()["relays"] if r["relay"] == url), {}).get("status")


def _events(gsync, name):
    return [e for e in gsync.log_events() if e["event"] == name]


@pytest.mark.slow
def test_a_half_open_own_relay_is_found_by_its_unanswered_ping(relay_factory, gsync_factory, scripted):
    live_reqs = []

    def first_live_read_goes_silent(relay, conn, message):
        if isinstance(message, list) and message[:2] == ["REQ", SELF]:
            live_reqs.append(conn.id)
            if len(live_reqs) == 1:
                relay.wait_stopped()  # reads nothing more on this socket: pings go unanswered
                return []
        return None

    own = scripted(page_size=None, on_message=first_live_read_goes_silent)
    remote = relay_factory()
    # announced now: the next session reads the history since the last one, less 15 minutes
    repo = our_announcement(own, [remote], d="half-open", created_at=int(time.time()))
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, bug])
    gsync = gsync_factory(own, [remote], timers={"OWN_IDLE_PING_SECS": 1})
    wait_until(lambda: _events(gsync, "ready"), timeout=15, what="ready")
    publish(own.url, [repo])  # shown live only on a live read that works
    assert_arrives(own, [bug], timeout=20, what="the issue of a repository announced meanwhile")
    lost = _events(gsync, "self_subscription_lost")
    assert lost and "half-open" in lost[0]["detail"]
    assert len(live_reqs) >= 2


@pytest.mark.slow
def test_an_own_relay_closing_the_self_subscription_after_its_eose_is_not_met_twice_a_second(
        relay_factory, gsync_factory, scripted):
    """PEERS.md: some relays close every subscription after its EOSE. Each self-subscription
    session then ends as it begins; the next waits longer each time (10 s at most), and each
    reads the history since the last: what the own relay accepts meanwhile is still found."""
    live_reqs = []

    def closes_after_eose(relay, conn, message):
        if isinstance(message, list) and message[:2] == ["REQ", SELF]:
            live_reqs.append(time.monotonic())
            return [["EOSE", SELF], ["CLOSED", SELF, "error: subscriptions end at EOSE here"]]
        return None

    own = scripted(page_size=None, on_message=closes_after_eose)
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="closes", created_at=int(time.time()))
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, bug])
    gsync = gsync_factory(own, [remote])
    wait_until(lambda: len(live_reqs) >= 2, timeout=15, what="the self-subscription opened twice")
    publish(own.url, [repo])  # never shown live: found by a later session's history read
    assert_arrives(own, [bug], timeout=30, what="the issue of a repository announced meanwhile")
    began = live_reqs[0]
    wait_until(lambda: time.monotonic() - began >= 12, timeout=20, what="12 s")
    within = [t for t in live_reqs if t - began < 12]
    assert 3 <= len(within) <= 6, [round(t - began, 1) for t in live_reqs]  # 0, .5, 1.5, 3.5, 7.5 (+ reads)
    assert len(_events(gsync, "self_subscription_lost")) >= 3


@pytest.mark.slow
def test_a_session_that_ends_before_its_history_read_leaves_the_next_to_read_from_the_same_point(
        relay_factory, gsync_factory, scripted):
    """The own relay drops the self-subscription, and the next session ends too (its live
    read dropped) while its history read is still out: that read never happened, so the
    session after reads from where it would have (the first session's start, less the
    overlap), not from the start of the one that read nothing. An announcement the own
    relay holds dated just inside that overlap is found."""
    hanging = threading.Event()
    sessions = []

    def second_session_dropped_unread(relay, conn, message):
        if not (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 2):
            return None
        if message[1] == SELF:
            sessions.append(time.time())
            if hanging.is_set():
                def drop():  # the history REQ is out by then, unanswered
                    conn.drop()
                    hanging.clear()
                threading.Timer(0.5, drop).start()
                return []
        elif isinstance(message[1], str) and message[1].startswith("own-") and hanging.is_set():
            return []  # never answered
        return None

    own = scripted(page_size=None, on_message=second_session_dropped_unread)
    remote = relay_factory()
    gsync = gsync_factory(own, [remote])
    wait_until(lambda: _events(gsync, "ready"), timeout=15, what="ready")
    first = sessions[0]
    wait_until(lambda: time.time() - first >= 8, timeout=15, what="8 s")
    repo = our_announcement(own, [remote], d="overlap", created_at=int(first) - 897)
    bug = f.issue(bob, repo)
    publish(remote.url, [repo, bug])
    hanging.set()
    own.add(repo)  # stored only: shown to no live subscription
    own.drop_all()
    assert_arrives(own, [bug], timeout=30, what="the issue of the repository found by the third session")
    assert len(sessions) >= 3


@pytest.mark.slow  # 6-16 s under the quick loop's load: the whole suite runs it
def test_an_own_relay_dribbling_its_history_is_read_again_after_the_deadline(relay_factory, gsync_factory,
                                                                              scripted):
    dribbled = []

    def dribble_the_first_history_read(relay, conn, message):
        # gsync's history read (its REQs are "own-…"), not the test's own checks of the
        # relay: one of those dribbled, the test waits for ever (seen in a fresh clone)
        if (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 2
                and isinstance(message[1], str) and message[1].startswith("own-") and not dribbled):
            dribbled.append(conn.id)
            while conn.open and not relay._stopping.is_set():  # one event at a time, no EOSE
                conn.send("EVENT", message[1], _event_dict(repo))
                time.sleep(0.2)
            return []
        return None

    own = scripted(page_size=None, on_message=dribble_the_first_history_read)
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="dribble")
    bug = f.issue(bob, repo)
    own.add(repo)
    publish(remote.url, [repo, bug])
    gsync = gsync_factory(own, [remote], timers={"OWN_HISTORY_DEADLINE_SECS": 2})
    assert_arrives(own, [bug], timeout=20, what="the repository's issue, after a second history read")
    failed = _events(gsync, "self_history_failed")
    assert len(failed) == 1 and "deadline" in failed[0]["detail"]
    assert len(_events(gsync, "ready")) == 1




# The first NIP-77 exchange of the process goes wrong in a way its own code does not expect.
_EXCHANGE_FAULT = '''
import gsync.protocol.negentropy as negentropy

_real, _faults = negentropy.NegentropyClient.reconcile, []


def reconcile(self, message):
    if not _faults:
        _faults.append(1)
        if {how!r} == "dies":
            raise RuntimeError("injected: the exchange greenlet dies")
        import gevent
        gevent.sleep(10 ** 6)  # hangs where its own deadline is never checked
    return _real(self, message)


negentropy.NegentropyClient.reconcile = reconcile
'''


@pytest.mark.slow
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_nip77_exchange_whose_greenlet_dies_or_hangs_does_not_leave_its_batch_pending(
        relay_factory, scripted, tmp_path, how):
    own = relay_factory()
    remote = scripted(negentropy="serve")
    repo = our_announcement(own, [remote], d="neg-fault")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(5)]
    remote.add(repo, *issues)
    publish(own.url, [repo])  # held by the own relay: layer 1 goes by NIP-77
    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(_EXCHANGE_FAULT.format(how=how))
    gsync = GsyncProcess(own, [remote], timers={"NEGENTROPY_DEADLINE_SECS": 1, "NEGENTROPY_GRACE_SECS": 1})
    gsync.env["PYTHONPATH"] = f"{fault}{os.pathsep}{ROOT}"
    try:
        gsync.start()
        assert_arrives(own, issues, timeout=20, what="the issues")
        wait_until(lambda: _status(gsync, remote.url) in ("connected", "connected_historic_sync_failures"),
                   timeout=20, what="the relay's batches all finished (not Syncing for ever)")
        reasons = [e["reason"] for e in _events(gsync, "negentropy_unsupported")]
        expected = "exchange failed: RuntimeError" if how == "dies" else "timeout: past the manager's deadline"
        assert any(r.startswith(expected) for r in reasons), reasons
    finally:
        gsync.terminate()


@pytest.mark.slow
def test_a_relay_dribbling_a_page_one_event_at_a_time_does_not_hold_it_open_for_good(
        relay_factory, gsync_factory, scripted):
    dribbled, closed = [], threading.Event()

    def dribble_the_first_repository_page(relay, conn, message):
        if not isinstance(message, list):
            return None
        if dribbled and message[:2] == ["CLOSE", dribbled[0]]:
            closed.set()
        elif (message[:1] == ["REQ"] and not dribbled
              and any(isinstance(flt, dict) and "#a" in flt and flt.get("limit") != 0 for flt in message[2:])):
            dribbled.append(message[1])

            def dribble():  # alive: an event every 0.25 s, far inside the stall rule; no EOSE
                for event in issues:
                    if closed.is_set() or not conn.open or relay._stopping.is_set():
                        return
                    conn.send("EVENT", message[1], _event_dict(event))
                    time.sleep(0.25)

            threading.Thread(target=dribble, daemon=True).start()
            return []
        return None

    own = relay_factory()
    remote = scripted(on_message=dribble_the_first_repository_page, page_size=500)
    repo = our_announcement(own, [remote], d="dribbling")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(200)]
    remote.add(repo, *issues)
    publish(own.url, [repo])
    gsync = gsync_factory(own, [remote], timers={"REQ_STALL_SECS": 1, "REQ_LIFETIME_SECS": 3,
                                                  "RECOVERY_BASE_SECS": 0.5})
    assert_arrives(own, issues, timeout=20, what="every issue (the page ended, the rest recovered)")
    stalled = [e for e in _events(gsync, "subscription_stalled") if e["sub_id"] == dribbled[0]]
    assert [e["rule"] for e in stalled] == ["lifetime"]


def test_an_own_relay_dribbling_a_holdings_read_sends_its_batch_by_req_pages(relay_factory, gsync_factory,
                                                                             scripted):
    dribbled, closed = [], threading.Event()

    def dribble_the_first_holdings_read(relay, conn, message):
        if not isinstance(message, list):
            return None
        if dribbled and message[:2] == ["CLOSE", dribbled[0]]:
            closed.set()
        elif (message[:1] == ["REQ"] and str(message[1]).startswith("own-") and not dribbled
              and any(isinstance(flt, dict) and "#a" in flt for flt in message[2:])):
            dribbled.append(message[1])

            def dribble():  # what it holds, one event at a time and again, never an EOSE
                while not closed.is_set() and conn.open and not relay._stopping.is_set():
                    conn.send("EVENT", message[1], _event_dict(repo))
                    time.sleep(0.2)

            threading.Thread(target=dribble, daemon=True).start()
            return []
        return None

    own = scripted(page_size=None, on_message=dribble_the_first_holdings_read)
    remote = scripted(negentropy="serve")
    repo = our_announcement(own, [remote], d="holdings")
    issues = [f.issue(bob, repo, subject=f"issue {i}") for i in range(5)]
    own.add(repo)
    remote.add(repo, *issues)
    gsync = gsync_factory(own, [remote], timers={"OWN_READ_DEADLINE_SECS": 2})
    assert_arrives(own, issues, timeout=20, what="the issues, by REQ pages")
    assert dribbled
    reasons = [e["reason"] for e in _events(gsync, "negentropy_own_relay_unavailable")]
    assert any("deadline" in r for r in reasons), reasons
