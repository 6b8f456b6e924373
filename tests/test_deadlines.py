"""Every wait has a deadline (SPEC §5, §8): the own relay's live read (a half-open socket
is found), its history read (a relay dribbling events), a NIP-77 exchange whose greenlet
dies, a historic REQ a relay answers one event at a time and never ends."""
import time

from . import factory as f
from .relays import publish, wait_until
from .scenario import assert_arrives, bob, our_announcement
from .scripted_relay import _event_dict

SELF = "gsync-self"


def _events(gsync, name):
    return [e for e in gsync.log_events() if e["event"] == name]


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


def test_an_own_relay_dribbling_its_history_is_read_again_after_the_deadline(relay_factory, gsync_factory,
                                                                              scripted):
    dribbled = []

    def dribble_the_first_history_read(relay, conn, message):
        if (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 2
                and message[1] != SELF and not dribbled):
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


