"""Every delivery ends: one the own relay refuses without a final word (``error:``, a prefix
no NIP defines) is tried a bounded number of times, then kept as refused, and while it
waits it does not hold historic sync."""
import collections
import threading

import pytest

from gsync import constants
from gsync.sync.delivery_retry import refusal_retry_delay

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, bob, on_own, our_announcement


def test_a_non_final_refusal_is_retried_ten_times_over_about_an_hour_then_given_up():
    delays = [refusal_retry_delay(n) for n in range(1, constants.DELIVERY_MAX_ATTEMPTS + 1)]
    assert delays[-1] is None and None not in delays[:-1]
    assert delays[:3] == [0.5, 2.0, 8.0]  # a passing fault is retried at once
    assert 3000 <= sum(delays[:-1]) <= 5000  # ten attempts over about an hour


@pytest.mark.slow
def test_deliveries_refused_with_error_end_in_the_rejected_index_and_never_hold_historic_sync(
        relay_factory, gsync_factory, scripted):
    offered: dict[str, int] = {}
    lock = threading.Lock()

    def busy_for_some(relay, conn, message):
        if (isinstance(message, list) and message[:1] == ["EVENT"] and isinstance(message[1], dict)
                and "stubborn" in message[1].get("content", "")):
            with lock:
                offered[message[1]["id"]] = offered.get(message[1]["id"], 0) + 1
            return [["OK", message[1]["id"], False, "error: database is busy"]]
        return None

    own = scripted(page_size=None, on_message=busy_for_some)
    remote = relay_factory()
    first = our_announcement(own, [remote], d="first")
    second = our_announcement(own, [remote], d="second")
    # 30 refusals: more than the quarter of a 100-event backlog that holds historic starts
    stubborn = [f.issue(bob, first, content=f"stubborn {i}") for i in range(30)]
    fine = [f.issue(bob, first, content=f"fine {i}") for i in range(5)]
    later = f.issue(bob, second, content="in the repository announced later")
    publish(remote.url, [first, second, *stubborn, *fine, later])
    publish(own.url, [first])
    gsync = gsync_factory(own, [remote], extra={"sync": {"delivery_max_backlog": "100"}},
                          timers={"DELIVERY_RETRY_BASE_SECS": 0.05, "DELIVERY_RETRY_MAX_SECS": 0.2})
    assert_arrives(own, fine, timeout=30, what="the issues the own relay takes")
    publish(own.url, [second])
    assert_arrives(own, [later], timeout=30, what="the history of a repository announced later")
    # Ten attempts each; given up while the own relay stored nothing since its first refusal,
    # one is refused with everything else, and the next store anew releases it for ten more
    # (``second``, or ``later``, read back from the own relay after the thirty were given up:
    # under load, between two reads of the status). So the three are judged at one moment:
    # every stubborn delivery offered, in whole rounds of ten, and all thirty kept as refused
    # (not fetched again), with at least thirty given up.
    ids = {e.id for e in stubborn}

    seen: dict = {}  # the three facts at the last look, for a failure to tell which was short

    def given_up_in_whole_rounds() -> bool:
        with lock:
            seen["offers"] = sorted(collections.Counter(offered.values()).items())
            seen["unoffered"] = len(ids - set(offered))
            rounds = set(offered) == ids and all(
                n % constants.DELIVERY_MAX_ATTEMPTS == 0 for n in offered.values())
        seen["given_up"] = gsync.metric("gsync_deliveries_given_up_total", reason="error")
        seen["rejected"] = gsync.status()["rejected"]
        return rounds and seen["given_up"] >= 30 and seen["rejected"] == 30

    try:
        wait_until(given_up_in_whole_rounds, timeout=30, what="every stubborn delivery given up, kept as refused")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: at the last look {seen}") from None
    given_up = [e for e in gsync.log_events() if e["event"] == "event_rejected"]
    assert len(given_up) >= 30 and all(
        e["reason"].startswith("gave up after 10 attempts: error: database is busy") for e in given_up)


@pytest.mark.slow
@pytest.mark.parametrize("refusal", ["error: no space left on device", "restricted: this relay is read-only",
                                     "auth-required: writes from registered keys only"],
                         ids=["full-disk", "read-only", "auth-required"])
def test_events_refused_while_the_own_relay_refused_everything_go_again_once_it_stores(
        relay_factory, gsync_factory, scripted, refusal):
    """The own relay answers every EVENT with ``refusal``. A full disk (``error:``): each
    delivery is given up after its ten attempts with nothing stored since its first refusal,
    refused with everything else, not for what it is. A relay put read-only (maintenance, a
    write policy switched on for a while), or one asking AUTH of a gsync with no key (the
    operator sets one, or registers it): a final refusal at once, which one answer cannot
    tell from a refusal of that event. Either way, once the own relay stores an event again
    (the disk freed, the relay writable, a new issue comes live), they go to it again at
    once, not a week later when their rejected entries expire."""
    refusing = threading.Event()
    refusing.set()

    def refuse_all(relay, conn, message):
        if (refusing.is_set() and isinstance(message, list) and message[:1] == ["EVENT"]
                and isinstance(message[1], dict)):
            return [["OK", message[1]["id"], False, refusal]]
        return None

    own = scripted(page_size=None, on_message=refuse_all)
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="refusing-all")
    own.add(repo)  # (held before it refused everything)
    issues = [f.issue(bob, repo, content=f"written while refused {i}") for i in range(12)]
    publish(remote.url, [repo, *issues])
    gsync = gsync_factory(own, [remote], timers={"DELIVERY_RETRY_BASE_SECS": 0.05, "DELIVERY_RETRY_MAX_SECS": 0.2})
    wait_until(lambda: gsync.metric("gsync_deliveries_total", outcome="rejected") >= 12,
               timeout=30, what="every delivery refused")
    assert not on_own(own, issues)
    if refusal.startswith("error:"):
        given_up = [e for e in gsync.log_events() if e["event"] == "delivery_given_up"]
        assert len(given_up) >= 12 and all(e["refused_with_all"] for e in given_up), given_up[:2]
    refusing.clear()
    fresh = f.issue(bob, repo, content="once it stores again")
    publish(remote.url, [fresh])
    assert_arrives(own, [fresh, *issues], timeout=30, what="the issues refused while it refused everything")
    assert any(e["event"] == "refused_released" for e in gsync.log_events())


def test_an_own_relay_taking_our_auth_late_stores_every_event_refused_before_it_did(
        relay_factory, gsync_factory, scripted, tmp_path):
    """An own relay asking AUTH for writes as khatru does: its challenge with the first
    refusal, and our AUTH taken a moment after it is read (its signature checked in a
    goroutine while the EVENTs after it are read and refused ``auth-required:``), then OK.
    Every EVENT refused before it took our AUTH, the window in flight when the AUTH went and
    those sent until its OK, goes again: none is refused for good (they were, and waited for
    the own relay to store something else anew, or for a store probe 10 minutes later)."""
    from .test_engine_policies import _key_file

    authed: set[int] = set()
    lock = threading.Lock()

    def writes_after_auth(relay, conn, message):
        if not isinstance(message, list) or not message:
            return None
        if message[0] == "AUTH":
            def taken():
                with lock:
                    authed.add(conn.id)
                conn.send("OK", message[1].get("id", ""), True, "")
            threading.Timer(0.3, taken).start()
            return []
        if message[0] == "EVENT" and isinstance(message[1], dict):
            with lock:
                if conn.id in authed:
                    return None
            return [["AUTH", f"challenge-{conn.id}"], ["OK", message[1]["id"], False, "auth-required: sign in"]]
        return None

    own = scripted(page_size=None, on_message=writes_after_auth)
    remote = relay_factory()
    repo = our_announcement(own, [remote], d="writes-after-auth")
    own.add(repo)
    issues = [f.issue(bob, repo, content=f"issue {i}") for i in range(40)]
    publish(remote.url, [repo, *issues])
    gsync = gsync_factory(own, [remote], extra={"auth": {"key_file": _key_file(tmp_path)}})
    assert_arrives(own, issues, timeout=20, what="every issue, refused before the own relay took our AUTH")
    assert gsync.metric("gsync_deliveries_total", outcome="rejected") == 0
    assert gsync.metric("gsync_deliveries_total", outcome="retry_auth") >= 2
