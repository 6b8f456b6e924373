"""Shared helpers for the benchmarks in ``bench/``.

- ``build_dataset``: a deterministic NIP-34 data set (repositories, roots, replies) signed for
  real, with the announcements listing our service and one remote relay.
- ``seed_lmdb``: writes signed events into a fresh LMDB directory in a subprocess, with many
  concurrent ``save_event`` calls (about 5x faster than the relay harness's one-at-a-time
  ``seed_file`` path); the relay is then started with ``start_relay(lmdb=DIR)``.
- ``Proxy``: a loopback TCP proxy subprocess in front of a relay that counts bytes in each
  direction, one listening port per consumer, so gsync and the comparator are measured the
  same way.
- ``cpu_seconds``: utime + stime of a process from ``/proc/<pid>/stat``; ``memory_kb``:
  its resident set now and at its peak (``VmRSS``, ``VmHWM`` from ``/proc/<pid>/status``).
- ``ArrivalWatcher``: a live subscription on the own relay that notes when each event first
  appears there (re-subscribing across own-relay outages), for delivery delays.
- ``floor_cost``: CPU seconds of json.loads + ``parse_event`` (id + BIP-340 check) per event.

Run as a script, this file is the proxy (``proxy TARGET_PORT N``) or the LMDB seeder
(``seed-lmdb DIR JSONL``); neither mode imports gevent.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.gsync_proc import memory_kb  # noqa: E402, F401 (re-exported)

BASE_CREATED_AT = 1_700_000_000
ROOT_KINDS = (1617, 1618, 1621)


# -- data set ------------------------------------------------------------------------------


@dataclass
class Dataset:
    events: list = field(default_factory=list)  # gsync.protocol.event.Event, oldest first
    announcements: list = field(default_factory=list)
    repos: dict = field(default_factory=dict)  # address -> SyncLevel.FULL
    root_ids: list = field(default_factory=list)
    kinds: dict = field(default_factory=dict)  # kind -> count
    layer2_only: int = 0  # reachable by state / #a (not needing layer 3)
    layer3_only: int = 0  # reachable only through a root id (e/E/q)

    @property
    def ids(self) -> set:
        return {e.id for e in self.events}

    def json_lines(self, events=None) -> list[str]:
        return [e.to_json() for e in (self.events if events is None else events)]


def build_dataset(n_events: int, n_repos: int, domain: str, remote_url: str,
                  n_authors: int = 24) -> Dataset:
    """``n_events`` events in ``n_repos`` repositories: per repo one announcement (listing
    ``domain`` as clone + relay, and ``remote_url``), one state, about a fifth roots (issues,
    root patches, PRs; ``a``-tagged) and the rest replies reaching a root by ``e``/``E``/``q``
    (NIP-22 comments, some nested; statuses; PR updates; kind-1 quotes).

    Deterministic: fixed keys (``Author.named``), fixed unique ``created_at`` values (so
    ``until`` pagination is exact), a seeded RNG. Only the announcements' ids depend on
    ``domain`` and ``remote_url``. Signatures use fresh aux randomness (BIP-340 allows it).
    """
    from gsync.sync.repos import SyncLevel
    from tests import factory as f

    if n_events < 3 * n_repos:
        raise ValueError("need at least 3 events per repository (announcement, state, root)")
    people = [f.Author.named(f"bench-dev-{i:02d}") for i in range(n_authors)]
    rng = random.Random(f"gsync-bench/{n_events}/{n_repos}")
    clock = iter(range(BASE_CREATED_AT, BASE_CREATED_AT + 10 * n_events))
    ds = Dataset()

    per_repo = [n_events // n_repos + (1 if i < n_events % n_repos else 0) for i in range(n_repos)]
    plans = []  # per repo: list of step kinds after announcement + state
    for total in per_repo:
        roots = max(1, round(total / 5))
        roots = min(roots, total - 2)
        replies = total - 2 - roots
        plans.append(["root"] * roots + ["reply"] * replies)

    repos = []
    for i in range(n_repos):
        owner = people[i % n_authors]
        d = f"bench-{i:04d}"
        ann = f.announcement(
            owner, d, clone=[f"http://{domain}/{owner.pubkey}/{d}.git"],
            relays=[f"ws://{domain}", remote_url], created_at=next(clock),
        )
        ds.announcements.append(ann)
        ds.events.append(ann)
        ds.repos[ann.address] = SyncLevel.FULL
        repos.append({"ann": ann, "owner": owner, "d": d, "roots": [], "comments": {}})
    for r in repos:
        ds.events.append(f.state(r["owner"], r["d"], created_at=next(clock)))
        ds.layer2_only += 1

    root_makers = (
        lambda a, repo, n: f.issue(a, repo, subject=f"issue {n}", created_at=next(clock)),
        lambda a, repo, n: f.patch(a, repo, content=f"From {n:040x} Mon Sep 17 00:00:00 2001\n"
                                   f"Subject: [PATCH] change {n}\n\n---\n", created_at=next(clock)),
        lambda a, repo, n: f.pr(a, repo, subject=f"feature {n}",
                                commit=hashlib.sha1(f"{n}".encode()).hexdigest(),
                                created_at=next(clock)),
    )
    reply_weights = [("comment", 45), ("nested", 20), ("status", 12), ("quote", 10), ("update", 13)]
    reply_types = [t for t, w in reply_weights for _ in range(w)]

    longest = max(len(p) for p in plans)
    for step in range(longest):
        for i, r in enumerate(repos):
            if step >= len(plans[i]):
                continue
            who = people[rng.randrange(n_authors)]
            if plans[i][step] == "root":
                ev = root_makers[len(r["roots"]) % 3](who, r["ann"], len(ds.root_ids))
                r["roots"].append(ev)
                ds.root_ids.append(ev.id)
                ds.layer2_only += 1
            else:
                root = r["roots"][rng.randrange(len(r["roots"]))]
                kind = rng.choice(reply_types)
                if kind == "update" and root.kind != 1618:
                    kind = "comment"
                if kind == "nested" and not r["comments"].get(root.id):
                    kind = "comment"
                if kind == "comment":
                    ev = f.comment(who, root, content=f"reply {step}", created_at=next(clock))
                    r["comments"].setdefault(root.id, []).append(ev)
                    ds.layer3_only += 1
                elif kind == "nested":
                    parent = rng.choice(r["comments"][root.id])
                    ev = f.comment(who, root, parent, content=f"nested {step}",
                                   created_at=next(clock))
                    r["comments"][root.id].append(ev)
                    ds.layer3_only += 1
                elif kind == "status":
                    ev = f.status(who, root, rng.choice((1630, 1631, 1632, 1633)),
                                  created_at=next(clock))
                    ds.layer2_only += 1  # statuses carry the repo's `a` tag too
                elif kind == "quote":
                    ev = f.quote(who, root, content=f"see nostr:{root.id[:8]}",
                                 created_at=next(clock))
                    ds.layer3_only += 1
                else:
                    ev = f.pr_update(who, root, commit=hashlib.sha1(f"u{step}{i}".encode()).hexdigest(),
                                     created_at=next(clock))
                    ds.layer2_only += 1  # PR updates carry `a` as well as `E`
            ds.events.append(ev)
    for e in ds.events:
        ds.kinds[e.kind] = ds.kinds.get(e.kind, 0) + 1
    assert len(ds.events) == n_events, (len(ds.events), n_events)
    return ds


# -- seeding an LMDB database -----------------------------------------------------------------


def start_gsync(g, entry: str | None = None, profile: bool = False) -> None:
    """``g.start()`` (a ``tests.gsync_proc.GsyncProcess``), or the same through one of this
    directory's instrumented entry points (``_gsync_eventlog.py``: every remote event logged,
    ``_gsync_profiled.py``: cProfile written at SIGTERM, ...)."""
    if entry is None:
        g.start()
        return
    from tests.relays import wait_until
    g._log = open(g.log_path, "ab")
    env = dict(g.env, GSYNC_PROFILE_OUT=g.profile_path) if profile else g.env
    g.proc = subprocess.Popen([sys.executable, os.path.join(HERE, entry), "run", "--config", g.config_path],
                              stdout=g._log, stderr=subprocess.STDOUT, env=env)
    wait_until(g._endpoint_up, timeout=30, what="gsync metrics endpoint")


def write_jsonl(lines, directory: str) -> str:
    path = os.path.join(directory, f"seed-{time.monotonic_ns()}.jsonl")
    with open(path, "w") as fh:
        for line in lines:
            fh.write(line + "\n")
    return path


def seed_lmdb_start(directory: str, jsonl_path: str) -> subprocess.Popen:
    """Start filling ``directory`` (a new LMDB) from a JSON-lines file; ``seed_lmdb_wait``."""
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "seed-lmdb", directory, jsonl_path],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def seed_lmdb_wait(proc: subprocess.Popen, expected: int, timeout: float = 120) -> None:
    out, err = proc.communicate(timeout=timeout)
    words = out.split()
    if proc.returncode != 0 or len(words) < 2 or words[0] != "SEEDED" or int(words[1]) != expected:
        raise RuntimeError(f"seeding failed (want {expected}): {out!r} {err[-2000:]!r}")


async def _seed_lmdb_main(directory: str, jsonl_path: str) -> None:
    import asyncio

    from nostr_sdk import Event, Filter, NostrLmdb

    db = await NostrLmdb.open(directory)
    sem = asyncio.Semaphore(20000)  # concurrent saves are batched by nostr-lmdb's ingester

    async def save(line):
        async with sem:
            await db.save_event(Event.from_json(line))

    with open(jsonl_path) as fh:
        lines = [line for line in fh if line.strip()]
    await asyncio.gather(*(save(line) for line in lines))
    print("SEEDED", await db.count(Filter()), flush=True)


# -- byte-counting TCP proxy ---------------------------------------------------------------


class Proxy:
    """``python _common.py proxy TARGET_PORT N`` in a subprocess: N listening ports, each
    forwarding to 127.0.0.1:TARGET_PORT with its own byte counters (``up`` = client to relay,
    ``down`` = relay to client, TCP payload bytes, websocket framing and HTTP included)."""

    def __init__(self, target_port: int, listeners: int, trace: str | None = None):
        """``trace``: a file to write, for the first listener, one JSON line per websocket
        text frame (``t`` is time.monotonic(), comparable across processes): client frames
        (``up``) and relay frames (``down``) other than EVENT, which are only counted;
        200 characters of head and 120 of tail."""
        cmd = [sys.executable, os.path.abspath(__file__), "proxy", str(target_port), str(listeners)]
        if trace:
            cmd.append(trace)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"proxy did not start: {line!r}")
        self.ports = [int(p) for p in line[1:]]
        self.urls = [f"ws://127.0.0.1:{p}" for p in self.ports]

    def stats(self) -> list[dict]:
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Endpoint:
    """Something GsyncProcess accepts as a remote (``.port``, ``.url``): a proxy port."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"ws://127.0.0.1:{port}"


def _filter_shapes(payload: bytes) -> list[str]:
    """A REQ's (or NEG-OPEN's) filters in short: tag names with their value counts, since,
    until, limit; enough to see how starts were spent without the ids."""
    try:
        msg = json.loads(payload)
    except ValueError:
        return []
    shapes = []
    for f in msg[2:]:
        if not isinstance(f, dict):
            continue
        shapes.append(" ".join(
            f"{k}={len(v)}" if isinstance(v, list) and k != "kinds" else f"{k}={v}"
            for k, v in f.items()))
    return shapes


class _WsFrames:
    """One direction of a websocket connection (after the HTTP upgrade), cut into frames.
    Best effort: a connection that is not a websocket is ignored (``dead``)."""

    def __init__(self, direction: str):
        self.dir = direction
        self.buf = b""
        self.in_http = True
        self.dead = False

    def feed(self, data: bytes):
        """Yield ``(payload, bytes on the wire)`` per complete frame; the payload (still
        masked: ``unmask`` it) of an uncompressed text frame, else None."""
        if self.dead:
            return
        self.buf += data
        if self.in_http:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > 65536:
                    self.dead = True
                return
            head = self.buf[:end]
            if self.dir == "down" and b" 101 " not in head.split(b"\r\n", 1)[0]:
                self.dead = True
                return
            self.buf = self.buf[end + 4:]
            self.in_http = False
        while len(self.buf) >= 2:
            b0, b1 = self.buf[0], self.buf[1]
            n, pos = b1 & 0x7F, 2
            if n == 126:
                if len(self.buf) < 4:
                    return
                n, pos = int.from_bytes(self.buf[2:4], "big"), 4
            elif n == 127:
                if len(self.buf) < 10:
                    return
                n, pos = int.from_bytes(self.buf[2:10], "big"), 10
            self.mask = None
            if b1 & 0x80:
                if len(self.buf) < pos + 4:
                    return
                self.mask, pos = self.buf[pos:pos + 4], pos + 4
            if len(self.buf) < pos + n:
                return
            payload, self.buf = self.buf[pos:pos + n], self.buf[pos + n:]
            text = b0 & 0x0F == 1 and not b0 & 0x40  # not compressed
            yield (payload if text else None), pos + n

    def unmask(self, payload: bytes) -> bytes:
        if self.mask is None:
            return payload
        n = len(payload)
        key = (self.mask * (n // 4 + 1))[:n]
        return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def bytes_by_kind(before: dict, after: dict, direction: str = "up") -> dict[str, int]:
    """Bytes up by ``up_kind`` (``direction="down"``: down by ``down_kind``) between two
    ``Proxy.stats()`` readings of one listener."""
    key = f"{direction}_by"
    was = before.get(key, {})
    return {k: v - was.get(k, 0) for k, v in after.get(key, {}).items() if v - was.get(k, 0)}


def up_kind(payload: bytes) -> str:
    """What a client frame spends bytes up on: ``live`` (a REQ whose filters all have
    ``limit: 0``), ``req`` (history), ``nip77`` (NEG-OPEN, NEG-MSG, NEG-CLOSE), ``other``
    (CLOSE, AUTH, EVENT)."""
    if payload.startswith(b'["NEG-'):
        return "nip77"
    if not payload.startswith(b'["REQ"'):
        return "other"
    try:
        filters = json.loads(payload)[2:]
    except ValueError:
        return "other"
    live = filters and all(isinstance(f, dict) and f.get("limit") == 0 for f in filters)
    return "live" if live else "req"


def down_kind(payload: bytes) -> str:
    """What a relay frame spends bytes down on: ``event`` (EVENT), ``nip77`` (NEG-MSG,
    NEG-ERR), ``other`` (EOSE, CLOSED, OK, NOTICE, AUTH)."""
    if payload.startswith(b'["EVENT"'):
        return "event"
    return "nip77" if payload.startswith(b'["NEG-') else "other"


class _KindCounter:
    """Bytes up by ``up_kind`` into ``counter["up_by"]``, or down by ``down_kind`` into
    ``counter["down_by"]`` (frames on the wire, headers and masks included; the HTTP
    upgrade, and connections that are no websocket (NIP-11), are in none)."""

    def __init__(self, counter: dict, direction: str = "up"):
        self.frames = _WsFrames(direction)
        self.classify = up_kind if direction == "up" else down_kind
        self.by = counter.setdefault(f"{direction}_by", {})

    def feed(self, data: bytes) -> None:
        for payload, size in self.frames.feed(data):
            kind = "other" if payload is None else self.classify(self.frames.unmask(payload))
            self.by[kind] = self.by.get(kind, 0) + size


class _FrameTracer:
    """Logs one direction's text frames, one JSON line each (see ``Proxy``)."""

    def __init__(self, out, conn: int, direction: str, t0: float):
        self.out, self.conn, self.dir, self.t0 = out, conn, direction, t0
        self.frames = _WsFrames(direction)
        self.events = 0
        self.per_sub: dict[str, int] = {}  # EVENTs by subscription, reported with its EOSE

    def feed(self, data: bytes) -> None:
        for payload, _ in self.frames.feed(data):
            if payload is None:
                continue
            if self.dir == "down" and payload.startswith(b'["EVENT"'):
                self.events += 1
                sub = payload[10:payload.find(b'"', 10)].decode(errors="replace")
                self.per_sub[sub] = self.per_sub.get(sub, 0) + 1
                continue
            payload = self.frames.unmask(payload)
            n = len(payload)
            record = {"t": round(time.monotonic(), 3), "conn": self.conn,
                      "dir": self.dir, "len": n, "head": payload[:200].decode(errors="replace")}
            if n > 200:
                record["tail"] = payload[-120:].decode(errors="replace")
            if payload.startswith((b'["REQ"', b'["NEG-OPEN"')):
                record["filters"] = _filter_shapes(payload)
            elif payload.startswith(b'["EOSE"'):
                sub = record["head"][9:record["head"].find('"', 9)]
                record["events"] = self.per_sub.pop(sub, 0)
            self.out.write(json.dumps(record) + "\n")


async def _proxy_main(target_port: int, listeners: int, trace_path: str | None = None) -> None:
    import asyncio

    counters = [{"up": 0, "down": 0, "connections": 0} for _ in range(listeners)]
    trace = open(trace_path, "w") if trace_path else None
    t0 = time.monotonic()

    async def pump(reader, writer, counter, key, *tracers):
        try:
            while True:
                data = await reader.read(262144)
                if not data:
                    break
                counter[key] += len(data)
                for tracer in tracers:
                    if tracer is not None:
                        tracer.feed(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                writer.close()
            except OSError:
                pass

    def handler(index):
        async def handle(client_reader, client_writer):
            counters[index]["connections"] += 1
            try:
                relay_reader, relay_writer = await asyncio.open_connection("127.0.0.1", target_port)
            except OSError:
                client_writer.close()
                return
            conn = counters[index]["connections"]
            up = down = None
            if trace is not None and index == 0:
                up = _FrameTracer(trace, conn, "up", t0)
                down = _FrameTracer(trace, conn, "down", t0)
            await asyncio.gather(
                pump(client_reader, relay_writer, counters[index], "up", up,
                     _KindCounter(counters[index])),
                pump(relay_reader, client_writer, counters[index], "down", down,
                     _KindCounter(counters[index], "down")),
            )
            if down is not None and down.events:
                trace.write(json.dumps({"t": round(time.monotonic(), 3), "conn": conn,
                                        "dir": "down", "events": down.events}) + "\n")
        return handle

    servers = [await asyncio.start_server(handler(i), "127.0.0.1", 0) for i in range(listeners)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print("READY", *ports, flush=True)

    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def on_stdin():
        line = sys.stdin.readline()
        if not line:
            done.set()
        elif line.strip() == "stats":
            if trace is not None:
                trace.flush()
            sys.stdout.write(json.dumps(counters) + "\n")
            sys.stdout.flush()

    loop.add_reader(sys.stdin.fileno(), on_stdin)
    await done.wait()


# -- measuring ---------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of ``pid`` (not its children), in seconds: in the process, and in the
    kernel on its behalf (socket I/O, mostly)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (not its children), in seconds."""
    return sum(cpu_times(pid))


class ArrivalWatcher:
    """When each expected event first appears on a relay: a thread asks the relay for the
    ids still missing every ``interval`` seconds (by id, so an outage of the relay or any
    ``created_at`` does not matter). Arrival times are known to within ``interval`` plus
    one query."""

    def __init__(self, url: str, interval: float = 0.25):
        import threading

        self.url = url
        self.interval = interval
        self.published: dict[str, float] = {}  # id -> monotonic time it was published
        self.first_seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ArrivalWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def expect(self, event_id: str, published_at: float) -> None:
        with self._lock:
            self.published[event_id] = published_at

    @property
    def missing(self) -> set[str]:
        with self._lock:
            return set(self.published) - set(self.first_seen)

    def delays(self) -> list[float]:
        with self._lock:
            return [self.first_seen[i] - t for i, t in self.published.items() if i in self.first_seen]

    def _run(self) -> None:
        from tests.relays import fetch_all

        while not self._stop.wait(self.interval):
            missing = sorted(self.missing)
            if not missing:
                continue
            try:
                found = fetch_all(self.url, {"ids": missing}, timeout=5)
            except Exception:
                continue  # the relay is down: ask again next time
            now = time.monotonic()
            with self._lock:
                for event in found:
                    self.first_seen.setdefault(event["id"], now)


def floor_cost(json_strings: list[str]) -> dict:
    """CPU seconds per 1,000 events for what gsync must do at least for each remote event:
    json.loads + parse_event (types, id recomputed, BIP-340 signature verified)."""
    from gsync.protocol import event as ev

    ev._xonly_key.cache_clear()
    ev._signed.cache_clear()
    out = {}
    for label, checks in (("full", {}), ("no_sig", {"check_sig": False})):
        t = time.process_time()
        for s in json_strings:
            ev.parse_event(json.loads(s), **checks)
        out[label] = (time.process_time() - t) / len(json_strings) * 1000
    out["sig"] = out["full"] - out["no_sig"]
    return out


if __name__ == "__main__":
    import asyncio

    if sys.argv[1] == "proxy":
        asyncio.run(_proxy_main(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:5]))
    elif sys.argv[1] == "seed-lmdb":
        asyncio.run(_seed_lmdb_main(sys.argv[2], sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
