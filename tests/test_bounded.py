"""Bounded by the work, never by uptime (SPEC §8): relays nobody lists any more leave every
table and metric series, connected or not, and never keep a new relay out of ``max_relays``."""
import pytest

from . import factory as f
from .relays import free_port, publish, wait_until
from .scenario import alice, assert_arrives, bob, our_announcement


class _Nowhere:
    """An address nothing listens on."""

    def __init__(self):
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"


@pytest.mark.slow
def test_relay_churn_leaves_no_trace_and_never_shuts_a_new_relay_out(relay_factory, gsync_factory):
    own = relay_factory()
    healthy = relay_factory()
    gsync = gsync_factory(own, [healthy], extra={"network": {"max_relays": "40", "allow_private_addresses": "true"}},
                          timers={"MAINTENANCE_TICK_SECS": 0.5})
    wait_until(lambda: any(e["event"] == "ready" for e in gsync.log_events()), timeout=15, what="ready")
    # One repository announced six times, each version listing 16 relays where nothing
    # listens, the last version none of them: 96 dead relays seen, more than max_relays.
    dead_urls = []
    for version in range(6):
        dead = [_Nowhere() for _ in range(16)]
        dead_urls += [d.url for d in dead]
        publish(own.url, [our_announcement(own, dead, d="churn", created_at=f.next_created_at() + 100 * version)])
        urls = {d.url for d in dead}
        wait_until(lambda urls=urls: urls <= {r["relay"] for r in gsync.status()["relays"]},
                   timeout=15, what=f"version {version}'s relays registered")
    publish(own.url, [our_announcement(own, [], d="churn", created_at=f.next_created_at() + 1000)])
    wait_until(lambda: not gsync.status()["relays"], timeout=15, what="every dead relay retired")

    repo = our_announcement(own, [healthy], d="after-churn", author=alice)
    bug = f.issue(bob, repo)
    publish(healthy.url, [repo, bug])
    publish(own.url, [repo])
    assert_arrives(own, [bug], timeout=20, what="the new repository's history")
    wait_until(lambda: [r["status"] for r in gsync.status()["relays"]] == ["connected"], timeout=20,
               what="the new relay synced")
    reply = f.comment(alice, bug, content="live")
    publish(healthy.url, [reply])
    assert_arrives(own, [reply], timeout=20, what="a live reply on the new relay")

    text = gsync.get("/metrics")
    left = [url for url in dead_urls if url in text]
    assert not left, f"{len(left)} dead relays still have series, e.g. {left[:2]}"
    assert gsync.metric("ngit_sync_relays_tracked_total") == 1
    assert not [e for e in gsync.log_events() if e["event"] == "relay_cap_reached"
                and e["relay"] == healthy.url]
