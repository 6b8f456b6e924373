"""Real relays for tests: nostr-sdk LocalRelay in a subprocess on a free loopback port.

``start_relay(**options)`` returns a ``RelayProcess`` (options: ``gsync/ops/localrelay.py``). ``publish`` and ``fetch_all`` are plain blocking websocket clients used to seed and
inspect relays; they never go through gsync's code, so they can judge it.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import tempfile
import time
import uuid

import websocket

from gsync.ops import localrelay
from gsync.ops.localrelay import LocalRelayProcess

from . import forks
from .factory import Author

# Ports for relays and gsync's metrics endpoint. Alone, the kernel picks a free one (bind to
# port 0). Under pytest-xdist, workers pick at the same time, and a port chosen that way is
# only free until someone binds it: each worker takes ports from a range of its own below
# the ephemeral range (32768-60999 on Linux), which neither the other workers nor any
# outgoing connection can be handed.
# GSYNC_TEST_PORT_BASE moves the ranges, for two test runs side by side on one machine.
PORTS_PER_WORKER = 1000
_WORKER_PORTS_BASE = int(os.environ.get("GSYNC_TEST_PORT_BASE", "21000"))
_next = itertools.count()
_kernel_port = localrelay.free_port  # bind to port 0


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return _kernel_port()
    base = _WORKER_PORTS_BASE + int(worker[2:]) * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = base + next(_next) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # still held by an earlier test's relay (or its TIME_WAIT)
        return port
    raise RuntimeError(f"no free port in {base}-{base + PORTS_PER_WORKER - 1}")


localrelay.free_port = free_port  # LocalRelayProcess without a port picks it here too


class RelayProcess(LocalRelayProcess):
    """gsync's LocalRelay launcher (``gsync.ops.localrelay``), plus what tests do to relays."""

    def __init__(self, options: dict):
        options = dict(options)
        super().__init__(options.pop("port", None), **options)

    def launch(self):
        """Forked from this worker's warm relay process (``tests/forks.py``): a new
        interpreter per relay costs the suite more CPU than anything else it does."""
        return forks.fork_relay(self.options, self.log_path, localrelay.child_env())

    def kill(self) -> None:
        """Die abruptly, as a crashed relay would (no close frames)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> RelayProcess:
        self.stop()
        return self.start()


def start_relay(**options) -> RelayProcess:
    return RelayProcess(options).start()


def start_relays(*option_sets: dict) -> list[RelayProcess]:
    """Start several relays at once: seeding large databases runs in parallel."""
    import threading

    relays = [RelayProcess(o) for o in option_sets]
    threads = [threading.Thread(target=r.start) for r in relays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in relays:
        if r.proc is None:
            raise RuntimeError(f"relay on port {r.port} did not start")
    return relays


def write_seed_file(events, directory: str | None = None) -> str:
    """Events saved straight into the relay's database before it listens: fast seeding."""
    fd, path = tempfile.mkstemp(suffix=".jsonl", dir=directory)
    with os.fdopen(fd, "w") as fh:
        for e in events:
            fh.write((e if isinstance(e, str) else e.to_json()) + "\n")
    return path


# -- blocking clients ---------------------------------------------------------------------


def _connect(url: str, timeout: float = 10.0) -> websocket.WebSocket:
    # websocket-client checks every received frame's UTF-8 in pure Python unless told not
    # to (a third of a test's CPU publishing events: one check per OK); recv() still decodes
    # text strictly.
    return websocket.create_connection(url, timeout=timeout, enable_multithread=False, skip_utf8_validation=True)


def publish(url: str, events, per_connection: int = 4000, timeout: float = 60.0,
            secret: str | None = None) -> dict:
    """Send events (objects, dicts or their JSON) and wait for every OK. Returns {event_id:
    (accepted, message)}. ``secret``: a key to answer a relay asking for NIP-42 AUTH to write
    (the events it refused so are sent again once it took it).

    LocalRelay drops a connection after about 6,000 client frames in a burst, so large sets
    go over several connections.
    """
    events = [e if isinstance(e, str) else e.to_json() if hasattr(e, "to_json") else json.dumps(e) for e in events]
    results: dict = {}
    for start in range(0, len(events), per_connection):
        chunk = events[start : start + per_connection]
        ws = _connect(url, timeout)
        try:
            for text in chunk:
                ws.send('["EVENT",' + text + "]")
            deadline = time.monotonic() + timeout
            want = len(chunk)
            got = 0
            challenge, refused = None, {}
            by_id = {json.loads(text)["id"]: text for text in chunk} if secret else {}
            while got < want and time.monotonic() < deadline:
                msg = json.loads(ws.recv())
                if msg[0] == "AUTH":
                    challenge = msg[1]
                elif msg[0] == "OK" and secret and not msg[2] and msg[3].startswith("auth-required") and msg[1] in by_id:
                    refused[msg[1]] = by_id.pop(msg[1])
                    got += 1
                elif msg[0] == "OK":
                    results[msg[1]] = (msg[2], msg[3])
                    got += 1
            if refused:
                _authenticate(ws, url, secret, challenge, timeout)
                for text in refused.values():
                    ws.send('["EVENT",' + text + "]")
                while len(refused) and time.monotonic() < deadline:
                    msg = json.loads(ws.recv())
                    if msg[0] == "OK" and refused.pop(msg[1], None) is not None:
                        results[msg[1]] = (msg[2], msg[3])
        finally:
            ws.close()
    return results


def _authenticate(ws, url: str, secret: str, challenge: str | None, timeout: float) -> None:
    """NIP-42: answer ``challenge`` (or the next one the relay sends) and wait for its OK."""
    deadline = time.monotonic() + timeout
    while challenge is None:
        msg = json.loads(ws.recv())
        if msg[0] == "AUTH":
            challenge = msg[1]
        elif time.monotonic() > deadline:
            raise RuntimeError("no AUTH challenge")
    auth = Author(secret).sign(22242, [["relay", url], ["challenge", challenge]], created_at=int(time.time()))
    ws.send('["AUTH",' + auth.to_json() + "]")
    while time.monotonic() < deadline:
        msg = json.loads(ws.recv())
        if msg[0] == "OK" and msg[1] == auth.id:
            if not msg[2]:
                raise RuntimeError(f"AUTH refused: {msg}")
            return
    raise RuntimeError("no OK to our AUTH")


def fetch_all(url: str, filt: dict, timeout: float = 30.0, secret: str | None = None) -> list[dict]:
    """Every event matching ``filt``, paginating with ``until`` past the relay's per-REQ cap
    (and asking for long id lists in chunks, which the cap applies to as well). ``secret``:
    a key to answer a relay asking for NIP-42 AUTH to read."""
    ids = filt.get("ids")
    if ids is not None and len(ids) > 400:
        chunks = [dict(filt, ids=ids[i : i + 400]) for i in range(0, len(ids), 400)]
        return [e for chunk in chunks for e in fetch_all(url, chunk, timeout, secret)]
    seen: dict[str, dict] = {}
    ws = _connect(url, timeout)
    challenge, authed = None, False
    try:
        until = filt.get("until")
        while True:
            f = dict(filt)
            if until is not None:
                f["until"] = until
            sub = uuid.uuid4().hex[:16]
            ws.send(json.dumps(["REQ", sub, f]))
            page: list[dict] = []
            while True:
                msg = json.loads(ws.recv())
                if msg[0] == "EVENT" and msg[1] == sub:
                    page.append(msg[2])
                elif msg[0] == "EOSE" and msg[1] == sub:
                    break
                elif msg[0] == "AUTH":
                    challenge = msg[1]
                elif msg[0] == "CLOSED" and msg[1] == sub and secret and not authed and "auth-required" in msg[2]:
                    _authenticate(ws, url, secret, challenge, timeout)
                    authed = True
                    sub = uuid.uuid4().hex[:16]
                    ws.send(json.dumps(["REQ", sub, f]))
                elif msg[0] == "CLOSED" and msg[1] == sub:
                    raise RuntimeError(f"fetch refused: {msg}")
            ws.send(json.dumps(["CLOSE", sub]))
            new = [e for e in page if e["id"] not in seen]
            for e in page:
                seen[e["id"]] = e
            if not new or "ids" in filt:
                break
            until = min(e["created_at"] for e in page)
    finally:
        ws.close()
    return list(seen.values())


def count_on(url: str, filt: dict, timeout: float = 10.0) -> int:
    """How many events one REQ returns (LocalRelay caps a REQ at 500): a cheap progress probe,
    instead of reading every match."""
    ws = _connect(url, timeout)
    try:
        sub = uuid.uuid4().hex[:12]
        ws.send(json.dumps(["REQ", sub, filt]))
        n = 0
        while True:
            msg = json.loads(ws.recv())
            if msg[0] == "EVENT" and msg[1] == sub:
                n += 1
            elif msg[0] in ("EOSE", "CLOSED") and msg[1] == sub:
                return n
    finally:
        ws.close()


def ids_on(url: str, filt: dict | None = None, secret: str | None = None) -> set[str]:
    return {e["id"] for e in fetch_all(url, filt or {}, secret=secret)}


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
