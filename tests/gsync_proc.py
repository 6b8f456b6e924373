"""gsync itself, run as operators run it: ``bin/gsync run --config FILE``, in a process of
its own (forked from a warm one, ``tests/forks.py``).

Tests judge it from the outside: what lands on the own relay, what its metrics and
``/status`` say, what it logs (JSON lines, kept in a file for the test to read).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request

from . import forks
from .forks import ROOT
from .relays import free_port, wait_until

# gsync under test paces its background starts this far apart instead of SPEC §5's 1 s, so
# the suite waits on relays rather than on the gate. Tests about pacing set
# ``[sync] background_start_interval_ms`` themselves (``extra``), which wins.
TEST_GATE_MS = "20"
# Likewise, under pytest (tests/conftest.py sets ``GsyncProcess.default_timers``), the window
# that collects batches' own-relay reads into one (0.5 s): each new thread member's batch
# waited for it, thirty times in a row in one test. Merging itself is tested in process with
# the real window (tests/test_own_reads.py); benchmarks keep it. A test's own ``timers`` win.
# And the prices of a start (``sync.method``): the suite's worlds hold a few events of a
# filter, where NIP-77 pays only when starts are free (as the 20 ms gate nearly makes them);
# tests of the method choice pass ``PRODUCTION_PRICES``.
TEST_TIMERS = {"OWN_READ_WINDOW_SECS": 0.1, "START_BYTES": 0, "WAIT_BYTES_PER_SEC": 0}
PRODUCTION_PRICES = {"START_BYTES": 10_000, "WAIT_BYTES_PER_SEC": 80_000}


def allow_list(*relays) -> str:
    return ", ".join(f"127.0.0.1:{r.port}" for r in relays)


class GsyncProcess:
    # Where each gsync's config, state and log go: the test session's temporary directory
    # (tests/conftest.py; pytest keeps the last few sessions' and removes older ones), or the
    # system's, for benchmarks.
    base_dir: str | None = None
    default_timers: dict = {}

    def __init__(self, own, remotes=(), *, domain=None, bootstrap=(), extra: dict | None = None,
                 env: dict | None = None, timers: dict | None = None, args: tuple = ()):
        """``timers``: test-only overrides of long timers (``constants.TEST_TIMER_NAMES``,
        in seconds), passed as ``GSYNC_TEST_TIMERS``; ``args``: more ``gsync run`` options."""
        self.dir = tempfile.mkdtemp(prefix="gsync-", dir=self.base_dir)
        self.metrics_port = free_port()
        self.config_path = os.path.join(self.dir, "gsync.ini")
        sections = {
            "service": {
                "own_relay": own.url,
                "domain": domain or f"127.0.0.1:{own.port}",
                "state_dir": os.path.join(self.dir, "state"),
            },
            "sync": {"bootstrap_relays": " ".join(r.url for r in bootstrap), "batch_window_ms": "500",
                     "background_start_interval_ms": TEST_GATE_MS},
            "network": {"allow_private_addresses": allow_list(*remotes, *bootstrap) or "false"},
            "metrics": {"listen": f"127.0.0.1:{self.metrics_port}"},
            "log": {"level": "debug", "format": "json"},
        }
        for section, values in (extra or {}).items():
            sections.setdefault(section, {}).update(values)
        with open(self.config_path, "w") as fh:
            for section, values in sections.items():
                fh.write(f"[{section}]\n")
                for key, value in values.items():
                    fh.write(f"{key} = {value}\n")
        self.log_path = os.path.join(self.dir, "gsync.log")
        self._log_read, self._log_events = 0, []  # log_events: bytes parsed, what they held
        self.env = {**forks.gsync_env(), **(env or {})}
        timers = {**self.default_timers, **(timers or {})}
        if timers:
            self.env["GSYNC_TEST_TIMERS"] = ",".join(f"{k}={v}" for k, v in timers.items())
        self.args = tuple(args)
        self.proc: subprocess.Popen | None = None

    def start(self) -> GsyncProcess:
        """``bin/gsync run``, forked from this worker's warm gsync process (``tests/forks.py``),
        or a new interpreter where the test changed what one reads at its start (or
        ``GSYNC_TEST_FORK=0`` asks for that)."""
        argv = [os.path.join(ROOT, "bin", "gsync"), "run", "--config", self.config_path, *self.args]
        if forks.can_fork(self.env):
            self.proc = forks.fork_gsync(argv, self.env, self.log_path)
        else:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT,
                                             env=self.env)
        wait_until(self._endpoint_up, timeout=30, interval=0.02, what="gsync metrics endpoint")
        return self

    def _endpoint_up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gsync exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        try:
            return self.get("/healthz").startswith("ok")
        except OSError:
            return False

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as r:
            return r.read().decode()

    def status(self) -> dict:
        return json.loads(self.get("/status"))

    def metric(self, name: str, **labels) -> float:
        total = 0.0
        for line in self.get("/metrics").splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log_text(self) -> str:
        with open(self.log_path, "rb") as fh:
            return fh.read().decode(errors="replace")

    def log_events(self) -> list[dict]:
        """Every JSON line of the log so far (a new list each call). Tests poll this: what was
        read before is kept, and only what gsync wrote since is parsed, up to its last whole
        line (the log only grows: a restarted gsync appends)."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_read)
            new = fh.read()
        whole = new[: new.rfind(b"\n") + 1]
        self._log_read += len(whole)
        for line in whole.decode(errors="replace").splitlines():
            try:
                self._log_events.append(json.loads(line))
            except ValueError:
                pass
        return list(self._log_events)

    def terminate(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code


def memory_kb(pid: int) -> dict:
    """``{"rss": VmRSS, "hwm": VmHWM}`` of ``pid`` in KiB (HWM: the peak resident set)."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[2:5].lower()] = int(line.split()[1])
    return out
