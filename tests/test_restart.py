"""A deploy is not a first start (SPEC §5, "What survives a restart"): gsync stopped or
killed while synced comes back with a quick reconnect to every relay it had just left, asks
nothing a relay refused, leaves dead relays alone; and its state_dir is its own."""
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from . import factory as f
from .gsync_proc import ROOT, GsyncProcess
from .relays import free_port, publish, wait_until
from .scenario import assert_arrives, bob, our_announcement


class _Endpoint:
    """An address nothing listens on: a dead relay."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"ws://127.0.0.1:{port}"


def _refuse_quotes(relay, conn, message):
    """A relay whose policy refuses any REQ asking for ``#q``."""
    if isinstance(message, list) and message[:1] == ["REQ"] and any(
            isinstance(flt, dict) and "#q" in flt for flt in message[2:]):
        return [["CLOSED", message[1], "blocked: quotes are not served here"]]
    return None


def _status(gsync, url):
    return next((r for r in gsync.status()["relays"] if r["relay"] == url), {})


def _asks_quotes(relay, since=0):
    return sum(1 for _, filters in relay.reqs()[since:] for flt in filters if "#q" in flt)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_restart_reconnects_quickly_asks_nothing_refused_and_leaves_dead_relays_alone(
        relay_factory, gsync_factory, scripted, tmp_path, how):
    own = relay_factory()
    remote = scripted(negentropy="serve")
    picky = scripted(on_message=_refuse_quotes)
    dead = _Endpoint(free_port())
    repo = our_announcement(own, [remote, picky, dead], d="restart")
    bug = f.issue(bob, repo)
    reply = f.comment(bob, bug, content="first")
    remote.add(repo, bug, reply)
    picky.add(repo, bug)
    publish(own.url, [repo])
    settings = {"service": {"state_dir": str(tmp_path / "state")}, "sync": {"base_backoff_secs": "1"},
                "network": {"allow_private_addresses": f"127.0.0.1:{remote.port}, 127.0.0.1:{picky.port},"
                                                      f" 127.0.0.1:{dead.port}"}}
    timers = {"STATE_SAVE_SECS": 0.5, "STATE_QUIET_SAVE_SECS": 0.5, "DEAD_AFTER_SECS": 2, "DEAD_RETRY_SECS": 3600}
    first = gsync_factory(own, [remote, picky], extra=settings, timers=timers)
    assert_arrives(own, [bug, reply], timeout=30, what="the first sync")

    def settled():
        return (_status(first, remote.url).get("status") == "connected"
                and _status(first, picky.url).get("paused_coverage", 0) >= 1
                and _status(first, picky.url).get("status") in ("connected", "connected_historic_sync_failures")
                and _status(first, dead.url).get("health") == "dead"
                # the thread member's descendants asked (a loaded machine can take a while)
                and any(reply.id in flt.get("#e", []) for _, filters in remote.reqs() for flt in filters))

    wait_until(settled, timeout=30, what="synced, #q paused on the picky relay, the dead relay dead, "
               "the member's descendants asked")
    # A save after that (every 0.5 s here; ``state_saved`` is logged only when something
    # changed, so the save's age is what tells): the metric is refreshed on the 2 s tick.
    settled_at = time.monotonic()
    wait_until(lambda: 0 <= first.metric("gsync_state_save_age_seconds")
               < time.monotonic() - settled_at - 2.5, timeout=20, what="a save after that")
    if how == "sigkill":
        first.proc.kill()
        first.proc.wait()
    first.terminate()
    reqs_before, negs_before = len(remote.reqs()), len(remote.messages("NEG-OPEN"))
    picky_before = len(picky.reqs())
    later = f.comment(bob, bug, reply, content="while gsync was away", created_at=int(time.time()))
    # tags only the thread member it answers: found through the member's descendants
    descendant = f.Author.named("carol").sign(1, [["e", reply.id]], "me too", int(time.time()))
    remote.add(later, descendant)

    second = gsync_factory(own, [remote, picky], extra=settings, timers=timers)
    assert_arrives(own, [later, descendant], timeout=30, what="what was published while gsync was away")
    wait_until(lambda: _status(second, remote.url).get("status") == "connected", timeout=30,
               what="the remote synced again")
    connected = {e["relay"]: e["fresh_start"] for e in second.log_events() if e["event"] == "relay_connected"}
    assert connected == {remote.url: False, picky.url: False}, connected
    # Quick reconnect: every historic filter has a since (or names ids), NIP-77 too; the
    # thread member's descendants too (the member came back from state_dir).
    for _, filters in remote.reqs()[reqs_before:]:
        for flt in filters:
            assert "since" in flt or "ids" in flt or flt.get("limit") == 0, flt
    assert any(reply.id in flt.get("#e", []) for _, filters in remote.reqs()[reqs_before:] for flt in filters), \
        "the member's descendants were not asked"
    for message in remote.messages("NEG-OPEN")[negs_before:]:
        assert "since" in message[2], message
    assert _asks_quotes(picky, picky_before) == 0, "refused coverage asked again"
    assert len(picky.reqs()) > picky_before  # it was synced, without #q
    assert not [e for e in second.log_events() if e.get("relay") == dead.url
                and e["event"] in ("relay_connect_failed", "relay_connected")], "the dead relay was dialled"
    assert _status(second, dead.url).get("health") == "dead"


@pytest.mark.slow
def test_repositories_the_own_relay_lost_while_gsync_was_stopped_come_back_from_the_relays_that_gave_them(
        relay_factory, gsync_factory, scripted, tmp_path):
    """The own relay's database emptied while gsync was stopped (a relay in memory restarted;
    a disk restored from an older copy): after the restart it shows nothing, so nothing
    lists the remote; but the remote gave the earlier process the repository's history, and
    is asked for its announcement again: the repository and its history come back."""
    own = relay_factory()
    remote = scripted()
    repo = our_announcement(own, [remote], d="lost")
    bug = f.issue(bob, repo)
    reply = f.comment(bob, bug, content="kept on the remote")
    remote.add(repo, bug, reply)
    publish(own.url, [repo])
    settings = {"service": {"state_dir": str(tmp_path / "state")}, "sync": {"base_backoff_secs": "1"}}
    first = gsync_factory(own, [remote], extra=settings)
    assert_arrives(own, [bug, reply], timeout=30, what="the first sync")
    wait_until(lambda: _status(first, remote.url).get("status") == "connected", timeout=30,
               what="the remote synced")
    first.terminate()  # saves at stop
    own.restart()  # in memory: it comes back empty
    second = gsync_factory(own, [remote], extra=settings)
    assert_arrives(own, [repo, bug, reply], timeout=30, what="the repository, back from the remote")
    assert any(e["event"] == "lost_repositories_asked" for e in second.log_events())


def _run_once(config_path: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "bin", "gsync"), "run", "--config", config_path],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))


def test_a_second_instance_on_the_same_state_dir_exits_with_one_clear_line(relay_factory, gsync_factory,
                                                                           tmp_path):
    own = relay_factory()
    settings = {"service": {"state_dir": str(tmp_path / "state")}}
    first = gsync_factory(own, extra=settings)
    other = GsyncProcess(own, extra=settings)
    result = _run_once(other.config_path)
    assert result.returncode == 3
    assert f"state_dir {tmp_path / 'state'} is in use by another gsync (pid {first.proc.pid})" in result.stderr
    assert first.get("/healthz").startswith("ok")  # the first one goes on


def test_state_written_by_a_newer_gsync_is_refused_and_a_corrupt_one_set_aside(relay_factory, gsync_factory,
                                                                                tmp_path):
    own = relay_factory()
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    db = sqlite3.connect(state_dir / "gsync.db")
    db.execute("PRAGMA user_version = 999")
    db.close()
    settings = {"service": {"state_dir": str(state_dir)}}
    result = _run_once(GsyncProcess(own, extra=settings).config_path)
    assert result.returncode == 3 and "written by a newer gsync (schema 999" in result.stderr
    assert os.path.getsize(state_dir / "gsync.db") > 0  # kept, never dropped

    (state_dir / "gsync.db").write_bytes(b"\xff\xfe not a database " * 200)
    (state_dir / "rejected.json").write_bytes(b'{"cold": "\xff"}')
    gsync = gsync_factory(own, extra=settings)
    wait_until(lambda: "ready" in [e["event"] for e in gsync.log_events()], timeout=20, what="ready")
    moved = [e for e in gsync.log_events() if e["event"] == "state_moved_aside"]
    assert len(moved) == 2, moved
    assert sorted(n.split(".bad-")[0] for n in os.listdir(state_dir) if ".bad-" in n) == ["gsync.db", "rejected.json"]
