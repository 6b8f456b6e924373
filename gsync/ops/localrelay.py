"""A nostr-sdk ``LocalRelay`` on a loopback port, in a process of its own (for ``gsync demo``).

LocalRelay runs on asyncio and must never share a process with gevent's monkey patching, so
``LocalRelayProcess`` starts ``python -m gsync.ops.localrelay '<json options>'``; that child
prints ``READY <url>`` once it listens and serves until SIGTERM or until its stdin closes
(the parent died). Only the child imports ``nostr_sdk`` (the optional extra ``gsync[demo]``).

Options: ``port`` (required), ``max_reqs`` and ``notes_per_minute`` (LocalRelay's own
defaults — 60 events a minute — are far too low for seeding or for an own relay that gsync
writes to, so they are raised unless given), ``write_delay_ms`` (a slow relay: every EVENT
waits that long before it is accepted), ``nip42`` (``read`` | ``write`` | ``both``),
``lmdb`` (a database directory that survives restarts; default in memory), ``seed_file``
(JSON lines of signed events saved before the relay listens), ``reject`` (``{"kinds",
"ids", "ids_file", "authors", "message"}``: refused with ``blocked:``; ``ids_file`` lists
ids, one a line, read at every event, so a test can lift a refusal while the relay runs), ``block_queries`` (every REQ
and NEG-OPEN refused with that text), ``block_id_queries`` (only filters with ``ids``
refused, with that text: a relay that advertises events but will not serve them by id) and
``query_delay_ms`` (every REQ and NEG-OPEN waits that long: a slow relay). The test suite
uses all of them.

Query policies, for relays that are not friendly (LocalRelay sends each refusal as
``CLOSED``/``NEG-ERR`` ``"blocked: <text>"``, and refuses a whole REQ for one filter):
``refuse_tags`` (``{"tags": ["q"], "message": …}``: every filter using one of those tags),
``query_rate`` (``{"max": N, "window_secs": W, "message": …}``: per connection, a filter
beyond N admitted in the last W seconds is refused, by default with
``rate-limited: too many queries``), ``anti_sync_bots`` (true: a filter naming no ``authors``
whose ``kinds`` are missing or hold 1 is refused, as khatru's ``AntiSyncBots`` policy does:
"an author must be specified to get their kind:1 notes") and ``query_log`` (a file that gets one JSON line per
filter asked, ``{"t", "addr", "filter", "ok"}``: what the relay saw, for a test to judge).

``relays`` (a list of option sets, each with its own ``port``; the other top-level options
apply to every one unless it sets its own) runs several LocalRelays in one child, seeded
concurrently: a benchmark with hundreds of relays (``bench/scale``) needs tens of processes,
not hundreds. Its READY line lists every URL. ``LocalRelayGroup`` starts such a child.
"""
from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time

INSTALL_HINT = "pip install 'gsync[demo]'"


def available() -> bool:
    """True when nostr-sdk (LocalRelay) is installed."""
    return importlib.util.find_spec("nostr_sdk") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _package_root() -> str:
    """The directory holding the ``gsync`` package, so the child imports this same gsync."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def child_env() -> dict:
    """The environment for child processes: this gsync first on the import path."""
    env = dict(os.environ)
    paths = [_package_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class LocalRelayProcess:
    def __init__(self, port: int | None = None, *, log_path: str | None = None, **options):
        self.port = port or free_port()
        self.log_path = log_path
        self.options = dict(options, port=self.port)
        self.url = f"ws://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.ports = [self.port]

    def launch(self):
        """The relay's child process (a ``subprocess.Popen``, or anything with its ``stdin``,
        ``stdout``, ``poll``, ``wait``, ``terminate`` and ``kill``)."""
        # stderr goes to a file (or nowhere), never to a pipe nobody reads.
        err = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "gsync.ops.localrelay", json.dumps(self.options)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                text=True, env=child_env(),
            )
        finally:
            if self.log_path:
                err.close()

    def start(self, timeout: float = 20.0) -> LocalRelayProcess:
        self.proc = self.launch()
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            self.stop()
            detail = line.strip() or "no READY line"
            if self.log_path:
                with open(self.log_path, errors="replace") as fh:
                    detail = fh.read().strip()[-500:] or detail
            raise RuntimeError(f"LocalRelay on port {self.port} did not start: {detail}")
        deadline = time.monotonic() + timeout
        waiting = list(self.ports)
        while waiting and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", waiting[0]), timeout=1).close()
                waiting.pop(0)
            except OSError:
                time.sleep(0.05)
        if not waiting:
            return self
        self.stop()
        raise RuntimeError(f"LocalRelay on port {waiting[0]} is not accepting connections")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except Exception:
                pass


class LocalRelayGroup(LocalRelayProcess):
    """Several LocalRelays in one child process (option ``relays``): ``urls``, ``ports``.
    ``relays`` is a list of option sets; each gets a free port unless it names one."""

    def __init__(self, relays: list[dict], *, log_path: str | None = None, **options):
        relays = [dict(r, port=r.get("port") or free_port()) for r in relays]
        super().__init__(relays[0]["port"], log_path=log_path, **options)
        self.options["relays"] = relays
        self.ports = [r["port"] for r in relays]
        self.urls = [f"ws://127.0.0.1:{p}" for p in self.ports]


# -- the child ------------------------------------------------------------------------------


async def _serve(opts: dict) -> None:
    import asyncio
    import signal

    from nostr_sdk import uniffi_set_event_loop

    uniffi_set_event_loop(asyncio.get_running_loop())
    if opts.get("relays"):
        common = {k: v for k, v in opts.items() if k not in ("relays", "port")}
        relays = await asyncio.gather(*(_build(dict(common, **one)) for one in opts["relays"]))
    else:
        relays = [await _build(opts)]
    urls = []
    for relay in relays:
        await relay.run()
        urls.append(await relay.url())
    print("READY", *urls, flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:  # the parent closing our stdin (it died) stops us too
        loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.readline() else None)
    except (OSError, ValueError):
        pass
    await stop.wait()
    for relay in relays:
        relay.shutdown()


async def _build(opts: dict):
    """One LocalRelay from its options, seeded, not yet running."""
    import asyncio

    from nostr_sdk import (
        Event,
        LocalRelayBuilder,
        LocalRelayBuilderNip42,
        LocalRelayBuilderNip42Mode,
        NostrLmdb,
        QueryPolicy,
        QueryPolicyResult,
        RateLimit,
        WritePolicy,
        WritePolicyResult,
    )

    class Writes(WritePolicy):
        """Slow writes (``write_delay_ms``) and refusals (``reject``). An exception inside a
        policy panics the relay, so every path is guarded."""

        def __init__(self, delay: float, reject: dict, grasp_domain: str | None = None):
            self.delay = delay
            self.grasp_domain = grasp_domain
            self.kinds = set(reject.get("kinds", []))
            self.ids = set(reject.get("ids", []))
            self.ids_file = reject.get("ids_file")
            self.authors = set(reject.get("authors", []))
            self.message = reject.get("message", "not wanted here")

        def refused_ids(self) -> set:
            """``ids``, and those listed in ``ids_file`` now (read at every event: a test
            lifts or imposes a refusal while the relay runs)."""
            if not self.ids_file:
                return self.ids
            try:
                with open(self.ids_file) as fh:
                    return self.ids | set(fh.read().split())
            except OSError:
                return self.ids

        async def admit_event(self, event, addr):
            try:
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.kinds or self.ids or self.ids_file or self.authors or self.grasp_domain:
                    e = json.loads(event.as_json())
                    if e["kind"] in self.kinds or e["id"] in self.refused_ids() or e["pubkey"] in self.authors:
                        return WritePolicyResult.REJECT(self.message)
                    if self.grasp_domain and e["kind"] == 30617 and not _lists_domain(e, self.grasp_domain):
                        return WritePolicyResult.REJECT("announcement does not list this relay")
            except BaseException:
                pass
            return WritePolicyResult.ACCEPT()

    class Queries(QueryPolicy):
        """``block_queries``, ``block_id_queries``, ``query_delay_ms``, ``refuse_tags``,
        ``query_rate``, ``anti_sync_bots`` and ``query_log``. LocalRelay asks once per filter of a REQ (and per
        NEG-OPEN); every path is guarded (an exception inside a policy panics the relay)."""

        def __init__(self, opts: dict):
            self.block = opts.get("block_queries")
            self.block_ids = opts.get("block_id_queries")
            self.anti_sync_bots = bool(opts.get("anti_sync_bots"))
            self.delay = float(opts.get("query_delay_ms", 0)) / 1000
            refuse = opts.get("refuse_tags") or {}
            self.tags = {"#" + t for t in refuse.get("tags", [])}
            self.tags_message = refuse.get("message", "this relay does not serve that tag")
            rate = opts.get("query_rate") or {}
            self.max = int(rate.get("max", 0))
            self.window = float(rate.get("window_secs", 60))
            self.rate_message = rate.get("message", "rate-limited: too many queries")
            self.admitted: dict[str, list[float]] = {}
            self.log = open(opts["query_log"], "a", buffering=1) if opts.get("query_log") else None

        def decide(self, flt: dict, addr: str) -> str | None:
            if self.block:
                return self.block
            if self.block_ids and "ids" in flt:
                return self.block_ids
            if self.anti_sync_bots and not flt.get("authors") and (not flt.get("kinds") or 1 in flt["kinds"]):
                return "an author must be specified to get their kind:1 notes"
            if self.tags & flt.keys():
                return self.tags_message
            if self.max:
                now = time.monotonic()
                recent = [t for t in self.admitted.get(addr, []) if now - t < self.window]
                if len(recent) >= self.max:
                    self.admitted[addr] = recent
                    return self.rate_message
                self.admitted[addr] = recent + [now]
            return None

        async def admit_query(self, query, addr):
            refusal = None
            try:
                if self.delay:
                    await asyncio.sleep(self.delay)
                flt = json.loads(query.as_json())
                refusal = self.decide(flt, str(addr))
                if self.log is not None:
                    self.log.write(json.dumps({"t": time.time(), "addr": str(addr), "filter": flt,
                                               "ok": refusal is None}) + "\n")
            except BaseException:
                pass
            if refusal is not None:
                return QueryPolicyResult.REJECT(refusal)
            return QueryPolicyResult.ACCEPT()

    builder = LocalRelayBuilder().addr("127.0.0.1").port(int(opts["port"]))
    builder = builder.rate_limit(
        RateLimit(
            max_reqs=int(opts.get("max_reqs", 100_000)),
            notes_per_minute=int(opts.get("notes_per_minute", 10_000_000)),
        )
    )
    if opts.get("nip42"):
        mode = getattr(LocalRelayBuilderNip42Mode, opts["nip42"].upper())
        builder = builder.nip42(LocalRelayBuilderNip42(mode=mode))
    if opts.get("lmdb") or opts.get("seed_file"):
        db = await NostrLmdb.open(opts.get("lmdb") or opts["seed_file"] + ".lmdb")
        if opts.get("seed_file"):
            with open(opts["seed_file"]) as fh:
                lines = [line for line in fh if line.strip()]
            for start in range(0, len(lines), 1000):  # concurrent saves share LMDB commits
                chunk = lines[start : start + 1000]
                await asyncio.gather(*(db.save_event(Event.from_json(line)) for line in chunk))
        builder = builder.database(db)
    if opts.get("write_delay_ms") or opts.get("reject") or opts.get("grasp_domain"):
        delay = float(opts.get("write_delay_ms", 0)) / 1000
        builder = builder.write_policy(Writes(delay, opts.get("reject") or {}, opts.get("grasp_domain")))
    if any(opts.get(k) for k in ("block_queries", "block_id_queries", "query_delay_ms",
                                  "refuse_tags", "query_rate", "query_log", "anti_sync_bots")):
        builder = builder.query_policy(Queries(opts))
    return builder.build()


def _lists_domain(announcement: dict, domain: str) -> bool:
    """A GRASP-01 relay's check of an announcement (``grasp_domain``): a clone URL and a
    relay URL on its host, as a GRASP relay's write policy runs on every event it gets."""
    def hosts(name, schemes):
        return {v.split("://", 1)[1].split("/", 1)[0].lower() for t in announcement["tags"]
                if t and t[0] == name for v in t[1:] if isinstance(v, str) and v.startswith(schemes)}
    return domain in hosts("clone", ("http://", "https://")) and domain in hosts("relays", ("ws://", "wss://"))


def main(argv: list[str] | None = None) -> int:
    import asyncio

    argv = sys.argv[1:] if argv is None else argv
    if not available():
        print(f"LocalRelay needs nostr-sdk: {INSTALL_HINT}", file=sys.stderr, flush=True)
        return 1
    asyncio.run(_serve(json.loads(argv[0]) if argv else {"port": free_port()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
