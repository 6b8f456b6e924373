#!/usr/bin/env python3
"""The comparator of ``bench/scale``: a simple threaded syncer doing gsync's historic job.

    python bench/_threaded_syncer.py JOB.json

Plain threads and websocket-client, no gevent, no checks beyond JSON. Every (relay, slice of
its repositories) is a job for a pool of fetcher threads: one connection, per repository one
REQ for its state and layer-2 events (``#d``, ``#a``, ``#A``, ``#q``), then one for the roots
found (``#e``, ``#E``, ``#q``), each filter paged with ``until`` while it fills a page. Events
go through a global seen-set to publisher threads, each with its own connection to the own
relay, a window of EVENTs in flight and a fresh connection every few thousand frames
(LocalRelay's per-connection budget). It prints one JSON line with its figures when every
job is done and every event is answered.

It fetches every repository from every relay that lists it (no NIP-77, no cross-relay
dedupe of fetches): the baseline gsync's "events received per event wanted" is held to.
"""
from __future__ import annotations

import json
import queue
import resource
import sys
import threading
import time
import uuid

import websocket

PAGE = 500  # LocalRelay's cap per filter per REQ
REQS_PER_CONNECTION = 300  # well under LocalRelay's ~1,200 REQs a minute per connection
REPOS_PER_JOB = 100
ROOT_KINDS = (1617, 1618, 1621)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.received = 0
        self.reqs = 0
        self.published = 0
        self.accepted = 0
        self.errors = 0


def _connect(url: str) -> websocket.WebSocket:
    return websocket.create_connection(url, timeout=60, enable_multithread=True)


def _matches(flt: dict, ev: dict) -> bool:
    if "kinds" in flt and ev["kind"] not in flt["kinds"]:
        return False
    if "until" in flt and ev["created_at"] > flt["until"]:
        return False
    for key, values in flt.items():
        if key.startswith("#"):
            name = key[1]
            if not any(len(t) >= 2 and t[0] == name and t[1] in values for t in ev["tags"]):
                return False
    return True


class Fetcher:
    def __init__(self, url: str, stats: Stats, offer):
        self.url, self.stats, self.offer = url, stats, offer
        self.ws = None
        self.reqs = 0

    def _ws(self):
        if self.ws is None or self.reqs >= REQS_PER_CONNECTION:
            self.close()
            self.ws = _connect(self.url)
            self.reqs = 0
        return self.ws

    def close(self):
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None

    def query(self, filters: list[dict]) -> list[dict]:
        """Every event of ``filters``, paging each filter that filled its page."""
        out: dict[str, dict] = {}
        todo = list(filters)
        while todo:
            ws = self._ws()
            sub = uuid.uuid4().hex[:12]
            ws.send(json.dumps(["REQ", sub, *todo]))
            self.reqs += 1
            page: list[dict] = []
            while True:
                msg = json.loads(ws.recv())
                if msg[0] == "EVENT" and msg[1] == sub:
                    page.append(msg[2])
                elif msg[0] == "EOSE" and msg[1] == sub:
                    break
                elif msg[0] == "CLOSED" and msg[1] == sub:
                    time.sleep(1)
                    self.close()
                    page = None
                    break
            if page is None:
                continue  # refused (rate): the same REQ again on a fresh connection
            ws.send(json.dumps(["CLOSE", sub]))
            with self.stats.lock:
                self.stats.received += len(page)
                self.stats.reqs += 1
            for ev in page:
                out[ev["id"]] = ev
            nxt = []
            for flt in todo:
                mine = [ev["created_at"] for ev in page if _matches(flt, ev)]
                if len(mine) >= PAGE:
                    nxt.append(dict(flt, until=min(mine)))  # inclusive: the boundary again
            todo = nxt
        self.offer(list(out.values()))
        return list(out.values())

    def sync_repo(self, address: str, d: str) -> None:
        found = self.query([{"kinds": [30618], "#d": [d]}, {"#a": [address]}, {"#A": [address]},
                            {"#q": [address]}])
        roots = [ev["id"] for ev in found if ev["kind"] in ROOT_KINDS
                 and any(t[:2] == ["a", address] for t in ev["tags"])]
        if roots:
            self.query([{"#e": roots}, {"#E": roots}, {"#q": roots}])


class Publisher(threading.Thread):
    WINDOW = 200
    FRAMES_PER_CONNECTION = 4000

    def __init__(self, url: str, inbox: queue.Queue, stats: Stats):
        super().__init__(daemon=True)
        self.url, self.inbox, self.stats = url, inbox, stats

    def run(self):
        ws, frames = None, 0
        while True:
            batch = [self.inbox.get()]
            if batch[0] is None:
                return
            while len(batch) < self.WINDOW:
                try:
                    nxt = self.inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self.inbox.put(None)
                    break
                batch.append(nxt)
            while batch:
                waiting = {ev["id"]: ev for ev in batch}
                retry = []
                try:
                    if ws is None or frames >= self.FRAMES_PER_CONNECTION:
                        if ws is not None:
                            ws.close()
                        ws, frames = _connect(self.url), 0
                    for ev in batch:
                        ws.send(json.dumps(["EVENT", ev]))
                    frames += len(batch)
                    while waiting:
                        msg = json.loads(ws.recv())
                        if msg[0] == "OK" and msg[1] in waiting:
                            ev = waiting.pop(msg[1])
                            if msg[2]:
                                with self.stats.lock:
                                    self.stats.accepted += 1
                            elif "rate-limited" in msg[3]:
                                retry.append(ev)
                            else:
                                with self.stats.lock:
                                    self.stats.errors += 1
                except Exception:
                    ws = None  # dropped (frame budget): what is unanswered again, on a new one
                    time.sleep(0.2)
                batch = retry + list(waiting.values())
                if retry:
                    time.sleep(0.5)


def main(job_path: str) -> int:
    with open(job_path) as fh:
        job = json.load(fh)
    stats = Stats()
    outbox: queue.Queue = queue.Queue()
    seen: set[str] = set()
    seen_lock = threading.Lock()

    def offer(events):
        fresh = []
        with seen_lock:
            for ev in events:
                if ev["id"] not in seen:
                    seen.add(ev["id"])
                    fresh.append(ev)
        with stats.lock:
            stats.published += len(fresh)
        for ev in fresh:
            outbox.put(ev)

    t0 = time.monotonic()
    publishers = [Publisher(job["own"], outbox, stats) for _ in range(job.get("publishers", 4))]
    for p in publishers:
        p.start()
    jobs: queue.Queue = queue.Queue()
    for url, repos in job["relays"].items():
        for start in range(0, len(repos), REPOS_PER_JOB):
            jobs.put((url, repos[start:start + REPOS_PER_JOB]))

    def fetch_worker():
        while True:
            try:
                url, repos = jobs.get_nowait()
            except queue.Empty:
                return
            fetcher = Fetcher(url, stats, offer)
            try:
                for address, d in repos:
                    fetcher.sync_repo(address, d)
            finally:
                fetcher.close()

    workers = [threading.Thread(target=fetch_worker, daemon=True) for _ in range(job.get("threads", 16))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    fetched_at = time.monotonic() - t0
    for _ in publishers:
        outbox.put(None)
    for p in publishers:
        p.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "wall_s": time.monotonic() - t0, "fetched_s": fetched_at, "received": stats.received,
        "reqs": stats.reqs, "published": stats.published, "accepted": stats.accepted,
        "errors": stats.errors, "cpu_s": usage.ru_utime + usage.ru_stime,
        "maxrss_mb": usage.ru_maxrss / 1024,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
