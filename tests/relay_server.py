"""Runs one nostr-sdk LocalRelay in its own process (never inside a gevent-patched one).

Started by ``tests/relays.py``: ``python relay_server.py '<json options>'``. Prints
``READY <url>`` once listening, then serves until stdin closes or SIGTERM arrives.

Options (all optional):
  port              loopback port to listen on (required in practice; the parent picks it)
  max_reqs, notes_per_minute   RateLimit (defaults are raised far above LocalRelay's own)
  nip42             "read" | "write" | "both"
  lmdb              directory of an LMDB database (survives restarts); default in memory
  seed_file         JSON-lines file of signed events saved before the relay starts listening
  reject            {"kinds": [...], "ids": [...], "authors": [...], "message": "..."} write policy
  block_queries     text: every REQ / NEG-OPEN is refused with "blocked: <text>"
"""
import asyncio
import json
import signal
import sys

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
    uniffi_set_event_loop,
)


class RejectPolicy(WritePolicy):
    def __init__(self, spec):
        self.kinds = set(spec.get("kinds", []))
        self.ids = set(spec.get("ids", []))
        self.authors = set(spec.get("authors", []))
        self.message = spec.get("message", "not wanted here")

    async def admit_event(self, event, addr):
        try:  # an exception inside a policy panics the relay
            e = json.loads(event.as_json())
            if e["kind"] in self.kinds or e["id"] in self.ids or e["pubkey"] in self.authors:
                return WritePolicyResult.REJECT(self.message)
        except Exception:
            pass
        return WritePolicyResult.ACCEPT()


class BlockQueries(QueryPolicy):
    def __init__(self, message):
        self.message = message

    async def admit_query(self, query, addr):
        return QueryPolicyResult.REJECT(self.message)


async def main(opts):
    uniffi_set_event_loop(asyncio.get_running_loop())
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
    if opts.get("reject"):
        builder = builder.write_policy(RejectPolicy(opts["reject"]))
    if opts.get("block_queries"):
        builder = builder.query_policy(BlockQueries(opts["block_queries"]))
    relay = builder.build()
    await relay.run()
    print("READY", await relay.url(), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:  # the parent closing our stdin (it died) also stops us
        loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.readline() else None)
    except (OSError, ValueError):
        pass
    await stop.wait()
    relay.shutdown()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
