"""``gsync demo``: a self-contained sandbox synced before your eyes, in well under a minute.

It starts three nostr-sdk LocalRelays on loopback — the *own relay* and two *remote* relays —
seeds the remotes with NIP-34 repositories (announcements, repository state, issues, patch
series, pull requests and their updates, comments, statuses) plus one repository that does
not list this relay, publishes the announcements to the own relay (as if it had accepted
them), and runs gsync against them as a subprocess (``python -m gsync.ops.cli run``), exactly
as ``gsync run`` runs in production. Once a second it shows how many of the events have
reached the own relay and what gsync's ``/status`` says of each remote relay; at the end a
summary per kind and per relay, then it stops gsync (SIGTERM, which drains deliveries) and the
relays, and removes its temporary directory.

LocalRelay is the optional extra ``gsync[demo]``. Every relay runs in a process of its own
(asyncio must not share a process with gevent); nothing listens beyond 127.0.0.1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field

from ..sync.progress import progress_line
from . import localrelay

KIND_NAMES = {
    30617: "repository announcement",
    30618: "repository state",
    1621: "issue",
    1617: "patch",
    1618: "pull request",
    1619: "pull request update",
    1111: "comment",
    1630: "status: open",
    1631: "status: applied/merged",
    1632: "status: closed",
    1633: "status: draft",
}
REPO_NAMES = ("hello-nostr", "grasp-tools", "tiny-git", "relay-kit", "ngit-notes", "patchwork",
              "lmdb-lite", "sigchain", "nip34-docs", "webhooks", "cli-kit", "gitstr")
PEOPLE = ("alice", "bob", "carol", "dave")
DEFAULT_REPOS = 6
DEFAULT_TIMEOUT = 50.0
STOP_DEADLINE = 25.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gsync demo",
        description="Sync a sandbox (an own relay and two remote relays on loopback, seeded with "
                    "NIP-34 repositories) with live progress, then print a summary.",
    )
    parser.add_argument("--repos", type=int, default=DEFAULT_REPOS, metavar="N",
                        help=f"repositories to seed, 1-{len(REPO_NAMES)} (default {DEFAULT_REPOS})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECS",
                        help=f"give up after this long (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (gsync's config and log)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.repos <= len(REPO_NAMES):
        print(f"gsync demo: --repos must be between 1 and {len(REPO_NAMES)}", file=sys.stderr)
        return 2
    if not localrelay.available():
        print("gsync demo needs nostr-sdk's LocalRelay, an optional extra:\n"
              f"    {localrelay.INSTALL_HINT}", file=sys.stderr)
        return 1
    demo = Demo(repos=args.repos, timeout=args.timeout, keep=args.keep)
    try:
        return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", flush=True)
        return 130
    except Exception as exc:  # a relay that will not start, a port taken…
        print(f"\ngsync demo failed: {exc}", file=sys.stderr, flush=True)
        demo.show_log_tail()
        return 1
    finally:
        demo.shutdown()


# -- the seeded world -------------------------------------------------------------------------


@dataclass
class Seed:
    """What goes where. ``expected`` must reach the own relay; ``foreign`` must not."""

    remote_a: list = field(default_factory=list)
    remote_b: list = field(default_factory=list)
    own: list = field(default_factory=list)
    expected: dict = field(default_factory=dict)  # id -> kind
    foreign: dict = field(default_factory=dict)  # id -> kind
    repos: list = field(default_factory=list)


class _Authors:
    def __init__(self):
        from ..protocol.event import generate_secret, public_key

        self.secret = {name: generate_secret() for name in PEOPLE}
        self.pubkey = {name: public_key(s) for name, s in self.secret.items()}
        self.clock = int(time.time()) - 30 * 86400  # a month of history

    def sign(self, who: str, kind: int, tags, content: str = ""):
        from ..protocol.event import sign_event

        self.clock += 97
        return sign_event(self.secret[who], created_at=self.clock, kind=kind, tags=tags, content=content)


def build_seed(own_host: str, remote_a: str, remote_b: str, repos: int) -> Seed:
    """NIP-34 repositories listing ``own_host`` (our service), spread over the two remotes."""
    people = _Authors()
    seed = Seed()

    def put(event, where: str, expected: bool = True) -> None:
        if "a" in where:
            seed.remote_a.append(event)
        if "b" in where:
            seed.remote_b.append(event)
        (seed.expected if expected else seed.foreign)[event.id] = event.kind

    for i in range(repos):
        owner, other = PEOPLE[i % 2], PEOPLE[(i + 1) % 4]
        helper = PEOPLE[(i + 2) % 4]
        d = REPO_NAMES[i]
        pk = people.pubkey[owner]
        remotes = [remote_a, remote_b] if i % 3 != 2 else [remote_a]  # some list only one
        where_all = "ab" if len(remotes) == 2 else "a"
        repo = people.sign(owner, 30617, [
            ["d", d], ["name", d], ["description", f"{d}: a demo repository"],
            ["clone", f"http://{own_host}/{pk}/{d}.git"],
            ["relays", f"ws://{own_host}", *remotes],
            ["maintainers", people.pubkey[helper]],
        ])
        seed.repos.append(d)
        seed.own.append(repo)
        put(repo, where_all)
        addr = f"30617:{pk}:{d}"
        repo_tags = [["a", addr], ["p", pk]]
        put(people.sign(owner, 30618, [["d", d], ["refs/heads/main", os.urandom(20).hex()],
                                       ["HEAD", "ref: refs/heads/main"]]), "b" if where_all == "ab" and i % 2 else "a")
        # Each event on one remote or both — only remotes that this repository lists.
        spread = iter(["a", "b", "ab"] * 20 if where_all == "ab" else ["a"] * 60)

        def root_thread(root, comments: int, status_kind: int | None) -> None:
            put(root, next(spread))
            parent = root
            for c in range(comments):
                who = (other, owner, helper)[c % 3]
                tags = [["E", root.id, "", root.pubkey], ["K", str(root.kind)], ["P", root.pubkey],
                        ["e", parent.id, "", parent.pubkey], ["k", str(parent.kind)],
                        ["p", parent.pubkey]]
                parent = people.sign(who, 1111, tags, f"comment {c + 1}")
                put(parent, next(spread))
            if status_kind is not None:
                put(people.sign(owner, status_kind, [["e", root.id, "", "root"], ["p", root.pubkey],
                                                     ["a", addr], ["p", pk]]), next(spread))

        for n in range(3):
            bug = people.sign(other, 1621, [*repo_tags, ["subject", f"{d}: issue {n + 1}"]],
                              "steps to reproduce: …")
            root_thread(bug, comments=n + 1, status_kind=1632 if n == 0 else None)
        for n in range(2):
            first = people.sign(helper, 1617, [*repo_tags, ["t", "root"]],
                                f"From 0000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH {n + 1}/2] fix\n")
            root_thread(first, comments=1, status_kind=1631 if n == 0 else 1630)
            follow = people.sign(helper, 1617, [*repo_tags, ["e", first.id, "", "reply"]],
                                 "Subject: [PATCH 2/2] tests\n")
            put(follow, next(spread))
        pull = people.sign(other, 1618, [*repo_tags, ["subject", f"{d}: add a feature"],
                                         ["c", os.urandom(20).hex()],
                                         ["clone", "https://git.example.com/fork.git"]])
        root_thread(pull, comments=2, status_kind=1633 if i % 2 else None)
        put(people.sign(other, 1619, [*repo_tags, ["E", pull.id], ["P", pull.pubkey],
                                      ["c", os.urandom(20).hex()],
                                      ["clone", "https://git.example.com/fork.git"]]), next(spread))

    # A repository that does not list this relay: gsync must leave it alone.
    theirs = people.sign("dave", 30617, [
        ["d", "elsewhere"], ["name", "elsewhere"],
        ["clone", "https://git.example.org/dave/elsewhere.git"], ["relays", "wss://relay.example.org"],
    ])
    put(theirs, "a", expected=False)
    put(people.sign("carol", 1621, [["a", theirs.address], ["p", theirs.pubkey],
                                    ["subject", "not ours"]]), "a", expected=False)
    return seed


# -- tiny blocking clients ----------------------------------------------------------------------


def _connect(url: str, timeout: float = 10.0):
    import websocket

    return websocket.create_connection(url, timeout=timeout, enable_multithread=False)


def publish(url: str, events, timeout: float = 30.0) -> int:
    """Send every event, wait for every OK; returns how many were accepted."""
    ws = _connect(url)
    try:
        for event in events:
            ws.send('["EVENT",' + event.to_json() + "]")
        accepted, answered, deadline = 0, 0, time.monotonic() + timeout
        while answered < len(events) and time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg[0] == "OK":
                answered += 1
                accepted += bool(msg[2])
        return accepted
    finally:
        ws.close()


class OwnRelayProbe:
    """Which of the expected ids the own relay holds, over one kept-open connection."""

    def __init__(self, url: str):
        self.url = url
        self.ws = None

    def present(self, ids) -> set[str]:
        ids = list(ids)
        try:
            if self.ws is None:
                self.ws = _connect(self.url)
            found: set[str] = set()
            for start in range(0, len(ids), 400):  # LocalRelay caps a REQ at 500 events
                sub = uuid.uuid4().hex[:12]
                self.ws.send(json.dumps(["REQ", sub, {"ids": ids[start:start + 400]}]))
                while True:
                    msg = json.loads(self.ws.recv())
                    if msg[0] == "EVENT" and msg[1] == sub:
                        found.add(msg[2]["id"])
                    elif msg[0] in ("EOSE", "CLOSED") and msg[1] == sub:
                        break
                self.ws.send(json.dumps(["CLOSE", sub]))
            return found
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        ws, self.ws = self.ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:
                pass


def _http_get(url: str, timeout: float = 2.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def _metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


# -- the demo -----------------------------------------------------------------------------------


class Demo:
    def __init__(self, repos: int = DEFAULT_REPOS, timeout: float = DEFAULT_TIMEOUT, keep: bool = False,
                 out=None):
        self.repos = repos
        self.timeout = timeout
        self.keep = keep
        self.out = out or sys.stdout
        self.tty = hasattr(self.out, "isatty") and self.out.isatty()
        self.dir = tempfile.mkdtemp(prefix="gsync-demo-")
        self.log_path = os.path.join(self.dir, "gsync.log")
        self.relays: list[localrelay.LocalRelayProcess] = []
        self.gsync: subprocess.Popen | None = None
        self.probe: OwnRelayProbe | None = None
        self.metrics_url = ""
        self.failed = False

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # -- setup ------------------------------------------------------------------------------

    def start_relays(self):
        relay_log = os.path.join(self.dir, "relays.log")
        own, a, b = (localrelay.LocalRelayProcess(log_path=relay_log) for _ in range(3))
        for relay in (own, a, b):
            relay.start()
            self.relays.append(relay)
        return own, a, b

    def write_config(self, own, remotes) -> str:
        metrics_port = localrelay.free_port()
        self.metrics_url = f"http://127.0.0.1:{metrics_port}"
        path = os.path.join(self.dir, "gsync.ini")
        allow = ", ".join(f"127.0.0.1:{r.port}" for r in remotes)
        with open(path, "w") as fh:
            fh.write(
                "# written by `gsync demo`\n"
                f"[service]\nown_relay = {own.url}\ndomain = 127.0.0.1:{own.port}\n"
                f"state_dir = {os.path.join(self.dir, 'state')}\n"
                "[sync]\nbatch_window_ms = 500\nbase_backoff_secs = 1\n"
                f"[network]\nallow_private_addresses = {allow}\n"
                f"[metrics]\nlisten = 127.0.0.1:{metrics_port}\n"
                "[log]\nlevel = info\nformat = json\n"
            )
        return path

    def start_gsync(self, config_path: str) -> None:
        with open(self.log_path, "ab") as log:
            self.gsync = subprocess.Popen(
                [sys.executable, "-m", "gsync.ops.cli", "run", "--config", config_path],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=localrelay.child_env(),
            )

    # -- run --------------------------------------------------------------------------------

    def run(self) -> int:
        began = time.monotonic()
        self.say("gsync demo: an own relay and two remote relays on 127.0.0.1 (nostr-sdk LocalRelay)")
        own, a, b = self.start_relays()
        self.say(f"  own relay   {own.url}")
        self.say(f"  remote A    {a.url}")
        self.say(f"  remote B    {b.url}")
        seed = build_seed(f"127.0.0.1:{own.port}", a.url, b.url, self.repos)
        publish(a.url, seed.remote_a)
        publish(b.url, seed.remote_b)
        publish(own.url, seed.own)
        Counter(seed.expected.values())
        self.say(f"seeded {len(seed.repos)} repositories listing this relay: {len(seed.remote_a)} events "
                 f"on remote A, {len(seed.remote_b)} on remote B ({len(seed.expected)} distinct), plus "
                 f"1 repository that lists another relay; the own relay holds only the "
                 f"{len(seed.own)} announcements")
        self.say(f"starting gsync (config and log in {self.dir})")
        self.start_gsync(self.write_config(own, [a, b]))
        started = time.monotonic()
        self.probe = OwnRelayProbe(own.url)
        done_at = self.watch(seed, started)
        elapsed = (done_at or time.monotonic()) - started
        present = self.probe.present(list(seed.expected) + list(seed.foreign))
        status, metrics_text = self._status(), self._metrics()
        self.summary(seed, present, status, metrics_text, elapsed)
        code = self.stop_gsync()
        complete = set(seed.expected) <= present and not (set(seed.foreign) & present)
        if not complete or code != 0:
            self.failed = True
            self.show_log_tail()
        total = time.monotonic() - began
        self.say(f"demo finished in {total:.1f} s: "
                 + ("everything synced, gsync stopped cleanly" if not self.failed
                    else "NOT everything synced or gsync did not stop cleanly (see above)"))
        return 0 if not self.failed else 1

    def watch(self, seed: Seed, started: float) -> float | None:
        """Progress once a second until every expected event is on the own relay and every remote
        relay has finished its historic sync. The time everything arrived, or None on timeout."""
        wanted = list(seed.expected)
        arrived_at = None
        while True:
            now = time.monotonic()
            if self.gsync.poll() is not None:
                raise RuntimeError(f"gsync exited early with code {self.gsync.returncode}")
            try:
                have = len(self.probe.present(wanted))
            except Exception:
                have = 0
            status = self._status()
            relays = status.get("relays", []) if status else []
            self.progress(now - started, have, len(wanted), status)
            if have == len(wanted) and arrived_at is None:
                arrived_at = now
            settled = relays and all(r.get("status") == "connected" for r in relays)
            if arrived_at is not None and (settled or now - arrived_at > 10):
                self.progress_end()
                return arrived_at
            if now - started > self.timeout:
                self.progress_end()
                self.say(f"timed out after {self.timeout:g} s")
                return None
            time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))

    def progress(self, secs: float, have: int, total: int, status: dict | None) -> None:
        width = 24
        filled = int(width * have / total) if total else width
        bar = "#" * filled + "." * (width - filled)
        if not status:
            relays = "gsync starting…"
        elif status.get("relays") and status.get("progress"):
            relays = progress_line(status["progress"])  # what `gsync status` prints
        else:
            relays = ("ready, waiting for repositories" if status.get("ready")
                      else "subscribing to the own relay…")
        line = f"[{secs:5.1f}s] own relay [{bar}] {have:4d}/{total} events  {relays}"
        if self.tty:  # one line, rewritten in place: never wider than the terminal
            width = shutil.get_terminal_size((120, 24)).columns - 1
            if len(line) > width:
                line = line[: max(width - 1, 0)] + "…"
            self.out.write("\r\x1b[K" + line)
            self.out.flush()
        else:
            self.say(line)

    def progress_end(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()

    def summary(self, seed: Seed, present: set, status: dict | None, metrics_text: str,
                elapsed: float) -> None:
        expected = seed.expected
        got = [i for i in expected if i in present]
        self.say("")
        self.say(f"SUMMARY — {len(got)} of {len(expected)} events of {len(seed.repos)} repositories "
                 f"reached the own relay in {elapsed:.1f} s")
        by_kind_total = Counter(expected.values())
        by_kind_got = Counter(expected[i] for i in got)
        self.say(f"  {'kind':<6} {'what':<26} {'seeded':>7} {'synced':>7}")
        order = list(KIND_NAMES)
        for kind in sorted(by_kind_total, key=lambda k: (order.index(k) if k in order else len(order), k)):
            name = KIND_NAMES.get(kind, "")
            self.say(f"  {kind:<6} {name:<26} {by_kind_total[kind]:>7} {by_kind_got[kind]:>7}")
        self.say(f"  {'':<6} {'total':<26} {len(expected):>7} {len(got):>7}")
        self.say("")
        a_ids = {e.id for e in seed.remote_a}
        b_ids = {e.id for e in seed.remote_b}
        seeded = {}
        if status:
            remotes = sorted(status.get("relays", []), key=lambda r: r["relay"])
            ports = {r.port: ids for r, ids in zip(self.relays[1:], (a_ids, b_ids), strict=False)}
            self.say(f"  {'remote relay':<24} {'status':<11} {'health':<10} {'holds':>6} {'delivered':>10}")
            for r in remotes:
                port = int(r["relay"].rsplit(":", 1)[-1])
                held = ports.get(port, set())
                seeded[r["relay"]] = len(held)
                self.say(f"  {r['relay']:<24} {r['status']:<11} {r['health']:<10} {len(held):>6} "
                         f"{r['events_delivered']:>10}")
            self.say("  (delivered: events gsync fetched first from that relay and sent to the own "
                     "relay; the rest came from the other one)")
        else:
            self.failed = True
            self.say("  gsync's /status did not answer")
        leaked = set(seed.foreign) & present
        self.say("")
        self.say(f"  not copied: {len(seed.foreign)} events of 1 repository that does not list this "
                 f"relay — {'correct' if not leaked else f'WRONG, {len(leaked)} were copied'}")
        if metrics_text:
            synced = _metric(metrics_text, "ngit_sync_events_synced_total")
            delivered = _metric(metrics_text, "gsync_deliveries_total", outcome="delivered")
            duplicate = _metric(metrics_text, "gsync_deliveries_total", outcome="duplicate")
            attempts = _metric(metrics_text, "ngit_sync_connection_attempts_total", result="success")
            self.say(f"  metrics: ngit_sync_events_synced_total {synced:g}, deliveries delivered "
                     f"{delivered:g} / duplicate {duplicate:g}, successful connections {attempts:g}")
        if len(got) < len(expected):
            missing = Counter(expected[i] for i in expected if i not in present)
            self.say("  MISSING: " + ", ".join(f"{n} × {KIND_NAMES.get(k, k)}" for k, n in missing.items()))

    def _status(self) -> dict | None:
        try:
            return json.loads(_http_get(self.metrics_url + "/status"))
        except Exception:
            return None

    def _metrics(self) -> str:
        try:
            return _http_get(self.metrics_url + "/metrics")
        except Exception:
            return ""

    # -- teardown ---------------------------------------------------------------------------

    def stop_gsync(self) -> int:
        """SIGTERM (deliveries drain), as systemd stops it; the exit code."""
        proc, self.gsync = self.gsync, None
        if proc is None:
            return 0
        if proc.poll() is None:
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.say(f"gsync did not stop within {STOP_DEADLINE:g} s: killed")
                return -9
            self.say(f"gsync stopped (SIGTERM) in {time.monotonic() - began:.1f} s, exit code "
                     f"{proc.returncode}")
        return proc.returncode

    def show_log_tail(self, lines: int = 25) -> None:
        try:
            with open(self.log_path, errors="replace") as fh:
                tail = fh.read().splitlines()[-lines:]
        except OSError:
            return
        if tail:
            self.say(f"last lines of gsync's log ({self.log_path}):")
            for line in tail:
                self.say("  " + line)
        self.keep = True

    def shutdown(self) -> None:
        if self.probe is not None:
            self.probe.close()
        self.stop_gsync()
        for relay in self.relays:
            relay.stop()
        self.relays = []
        if self.keep:
            self.say(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
