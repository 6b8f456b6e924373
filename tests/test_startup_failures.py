"""Failures at start that are the machine's, not gsync's: a full disk under ``state_dir``, a
``state_dir`` or database gsync may not write, a metrics port another process holds. Each one
is ``gsync run`` exiting with its documented code (``ops.cli``) and one line on stderr naming
the cause and the fix, never a traceback; and the database is never moved aside: once the
cause is gone, the next start reads every relay row and rejected entry it held. A disk that
fills while gsync runs is not a failure at start: gsync runs on, and the save age and
``gsync status`` show it.

The disk is real: a 512 KiB tmpfs mounted for the test (root only; CI runs as root), filled
to the last block, or remounted read-only, or the database file alone bind-mounted
read-only (root ignores permission bits, so a file's mode cannot make it unwritable).
Without the privilege to mount, those tests are skipped, saying why.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import types

import pytest

from gsync.io.manager.saved_state import LEGACY_MIGRATED, SAVED_AT
from gsync.ops import exits
from gsync.ops.status import render
from gsync.ops.store import DB_NAME, StateStore
from gsync.sync.rejected import RejectedIndex

from . import factory as f
from .forks import ROOT, gsync_env
from .relays import free_port, wait_until

RELAYS = ("wss://a.example.com", "wss://b.example.com")
REFUSALS = 40


class _Log:
    def warning(self, *args, **kwargs):
        pass

    info = debug = error = warning


@pytest.fixture
def disk():
    """A 512 KiB file system of its own."""
    path = tempfile.mkdtemp(prefix="gsync-disk-")
    os.chmod(path, 0o755)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "gsync-test", path],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here (root only): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)
        os.rmdir(path)


def _seed(state_dir: str) -> None:
    """A database as a gsync that ran a while leaves it: relays' memory, refusals."""
    store = StateStore.open(state_dir, _Log())
    now = time.time()
    index = RejectedIndex()
    alice = f.Author.named("alice")
    for i in range(REFUSALS):
        index.add(f.issue(alice, f.repo_addr(alice, "proj"), content=f"n{i}"), now - i, RELAYS[0])
    puts, _ = index.take_changes()
    store.save(now, rejected_puts=puts, relays={url: {"v": 1} for url in RELAYS},
               meta={LEGACY_MIGRATED: "1", SAVED_AT: repr(now)})
    store.close()


def _intact(state_dir: str) -> None:
    """The database is where it was, healthy, with every row it held."""
    assert not [n for n in os.listdir(state_dir) if ".bad-" in n], os.listdir(state_dir)
    db = sqlite3.connect(f"file:{os.path.join(state_dir, DB_NAME)}?mode=ro", uri=True)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM rejected").fetchone()[0] == REFUSALS
        assert {url for url, in db.execute("SELECT url FROM relays")} == set(RELAYS)
    finally:
        db.close()


def _config(where: str, state_dir: str, metrics_port: int | None = None) -> str:
    path = os.path.join(where, "gsync.ini")
    with open(path, "w") as fh:
        fh.write("[service]\nown_relay = ws://127.0.0.1:1\ndomain = 127.0.0.1:1\n"
                 f"state_dir = {state_dir}\n[metrics]\n"
                 f"listen = {'' if metrics_port is None else f'127.0.0.1:{metrics_port}'}\n")
    os.chmod(path, 0o644)
    return path


def _run(config: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "bin", "gsync"), "run", "--config", config],
                          capture_output=True, text=True, timeout=60, env=gsync_env())


def _one_line(result: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """gsync exited with ``code``, and said why in one stderr line holding ``words``."""
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1, (result.returncode, output)
    for word in words:
        assert word in lines[0], (word, lines[0])
    for line in result.stdout.splitlines():  # its logs: nothing else went wrong, nothing moved
        assert json.loads(line)["level"] == "info", line
    return lines[0]


def _starts_with_everything(config: str) -> dict:
    """A gsync started on ``config`` loads every relay row and refusal; stopped again."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bin", "gsync"), "run", "--config", config],
                                stdout=out, stderr=subprocess.STDOUT, env=gsync_env())
        try:
            def loaded():
                assert proc.poll() is None, f"gsync exited with {proc.returncode}"
                out.seek(0)
                return next((e for e in map(json.loads, out.read().splitlines()[:-1] or ["{}"])
                             if e.get("event") == "state_loaded"), None)

            event = wait_until(loaded, timeout=30, what="state_loaded")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert (event["relays"], event["rejected"]) == (len(RELAYS), REFUSALS), event
    return event


def _fill(path: str) -> str:
    filler = os.path.join(path, "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    assert os.statvfs(path).f_bavail == 0
    return filler


def test_a_full_disk_at_start_exits_5_in_one_line_and_keeps_the_database(disk):
    state_dir = os.path.join(disk, "state")
    _seed(state_dir)
    config = _config(tempfile.mkdtemp(prefix="gsync-conf-"), state_dir)
    filler = _fill(disk)

    line = _one_line(_run(config), exits.EXIT_STATE_DISK, f"state_dir {state_dir} is full",
                     "free space there, then start gsync again")
    assert "Traceback" not in line
    os.remove(filler)  # the operator frees space
    _intact(state_dir)
    _starts_with_everything(config)


def test_a_read_only_state_dir_exits_4_in_one_line_and_keeps_the_database(disk):
    state_dir = os.path.join(disk, "state")
    _seed(state_dir)
    config = _config(tempfile.mkdtemp(prefix="gsync-conf-"), state_dir)
    subprocess.run(["mount", "-o", "remount,ro", disk], check=True)

    _one_line(_run(config), exits.EXIT_STATE_UNWRITABLE, f"cannot write {state_dir}",
              "Read-only file system", "writable by the user gsync runs as")
    subprocess.run(["mount", "-o", "remount,rw", disk], check=True)
    _intact(state_dir)
    _starts_with_everything(config)


def test_a_read_only_database_in_a_writable_state_dir_exits_4_in_one_line(disk):
    """gsync.db alone is read-only (a read-only bind mount of the file: root ignores
    permission bits); before, gsync ran on and every save failed."""
    state_dir = os.path.join(disk, "state")
    _seed(state_dir)
    config = _config(tempfile.mkdtemp(prefix="gsync-conf-"), state_dir)
    db = os.path.join(state_dir, DB_NAME)
    subprocess.run(["mount", "--bind", db, db], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", db], check=True)
        _one_line(_run(config), exits.EXIT_STATE_UNWRITABLE, f"cannot write {db}",
                  "writable by the user gsync runs as")
    finally:
        subprocess.run(["umount", db], check=True)
    _intact(state_dir)
    _starts_with_everything(config)


def test_a_busy_metrics_port_exits_6_in_one_line_and_lets_the_state_dir_go(tmp_path):
    state_dir = str(tmp_path / "state")
    _seed(state_dir)
    port = free_port()
    config = _config(str(tmp_path), state_dir, port)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        _one_line(_run(config), exits.EXIT_METRICS_PORT_BUSY, f"[metrics] listen 127.0.0.1:{port}",
                  "in use by another process", "another port")
    _intact(state_dir)
    _starts_with_everything(config)  # the lock went with the failed start


@pytest.mark.slow  # 3-7 s on a loaded machine: a gsync that saves, fails to, then saves again
def test_a_disk_that_fills_while_running_shows_in_the_save_age_and_in_gsync_status(disk, gsync_factory):
    """gsync runs on (it syncs; saves wait), but the save age grows from the last write, so
    the alert (GsyncStateNotSaved) can fire, and ``gsync status`` says why; once there is
    space again the next save writes what waited. (No own relay: nothing here crosses to one.)"""
    own = types.SimpleNamespace(url="ws://127.0.0.1:1", port=1)
    state_dir = os.path.join(disk, "state")
    gsync = gsync_factory(own, extra={"service": {"state_dir": state_dir}},
                          timers={"STATE_SAVE_SECS": 0.2, "STATE_QUIET_SAVE_SECS": 0.2})
    wait_until(lambda: 0 <= gsync.metric("gsync_state_save_age_seconds") < 1, timeout=10, what="saving")
    filler = _fill(disk)

    wait_until(lambda: "state_save_failed" in [e["event"] for e in gsync.log_events()], timeout=10,
               what="a failed save")
    wait_until(lambda: gsync.metric("gsync_state_save_age_seconds") > 1, timeout=10, what="the age growing")
    shown = _status_text(gsync)
    assert "STATE NOT SAVED for " in shown and state_dir in shown, shown
    assert gsync.status()["state"]["save_error"]

    os.remove(filler)
    wait_until(lambda: 0 <= gsync.metric("gsync_state_save_age_seconds") < 1, timeout=10, what="saved again")
    assert "STATE NOT SAVED" not in _status_text(gsync)
    assert gsync.terminate() == 0


def _status_text(gsync) -> str:
    """What ``gsync status`` prints for this instance (its /status, rendered as the command does)."""
    return render(gsync.status())
