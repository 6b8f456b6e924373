"""``gsync run``: wire the manager, the metrics endpoint and the signals, then run until told.

Signal handlers only spawn the real work (as gunicorn's gevent worker does), so that work can
block: SIGTERM drains in-flight deliveries within the deadline, then stops.
"""
from __future__ import annotations

import errno
import gc
import signal
import sys

import gevent

from .. import constants
from ..ops import build, metrics, sdnotify
from ..ops.logging import get_logger
from .inbox import Stop
from .manager import SyncManager

log = get_logger("gsync.runner")

DRAIN_DEADLINE_SECS = 20.0  # under systemd's TimeoutStopSec (30 s in the unit)
GC_GEN0_THRESHOLD = 50_000  # Python's default is 700 allocations
TRIM_SECS = 10.0  # how often freed heap memory is handed back to the system


class StartFailed(Exception):
    """gsync cannot start here: ``str()`` is the one line naming the cause and the fix,
    ``code`` what it exits with (``ops.exits``)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def start_metrics_server(listen, manager) -> None:
    """Serve /metrics, /status and /healthz on ``listen``; raises ``StartFailed`` when the
    address cannot be had."""
    if not listen:
        return
    from ..ops.exits import EXIT_BAD_CONFIG, EXIT_METRICS_PORT_BUSY
    from ..ops.http import serve

    host, port = listen
    try:
        serve(listen, manager)
    except OSError as exc:
        where = f"[metrics] listen {host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise StartFailed(f"{where}: the port is in use by another process (another gsync, or "
                              f"this one's previous run still stopping?): stop it, or give gsync "
                              f"another port ([metrics] listen or --metrics-listen)",
                              EXIT_METRICS_PORT_BUSY) from None
        raise StartFailed(f"{where}: {exc.strerror or exc}: set [metrics] listen to an address of "
                          f"this machine and a port gsync may bind (1024 or above), or leave it "
                          f"empty for no endpoint", EXIT_BAD_CONFIG) from None


def state_refused(exc) -> StartFailed:
    """``ops.store.StateRefused`` as the exit code it calls for."""
    from ..ops import exits
    from ..ops.store import StateDiskFailing, StateUnwritable

    code = (exits.EXIT_STATE_UNWRITABLE if isinstance(exc, StateUnwritable)
            else exits.EXIT_STATE_DISK if isinstance(exc, StateDiskFailing) else exits.EXIT_STATE_REFUSED)
    return StartFailed(str(exc), code)


def run(config, *, drain_deadline: float = DRAIN_DEADLINE_SECS) -> int:
    """Run until stopped (0); a failure at start is one line on stderr and its exit code."""
    try:
        manager = start(config)
    except StartFailed as exc:
        print(f"gsync: {exc}", file=sys.stderr)
        return exc.code
    return serve_until_stopped(config, manager, drain_deadline)


def start(config) -> SyncManager:
    """The manager (state_dir locked and read) and its endpoint; raises ``StartFailed``."""
    from ..ops.store import StateRefused

    try:
        manager = SyncManager(config, on_ready=lambda: sdnotify.notify("READY=1\nSTATUS=own relay subscribed"))
    except StateRefused as exc:
        raise state_refused(exc) from None
    metrics.BUILD_INFO.labels(build.version(), build.python_version()).set(1)
    try:
        start_metrics_server(config.metrics.listen, manager)
    except StartFailed:
        manager.saved.close()  # the lock goes with it
        raise
    return manager


def serve_until_stopped(config, manager: SyncManager, drain_deadline: float) -> int:
    """Signals wired, the manager run until a signal's drain stops it; 0."""

    def drain():
        log.info("stopping", reason="SIGTERM", backlog=manager.delivery.backlog)
        sdnotify.notify("STOPPING=1")
        manager.stop()  # no new remote traffic; deliveries keep going
        drained = manager.delivery.drain(drain_deadline)
        log.info("stopped", drained=drained, backlog=manager.delivery.backlog)
        manager.delivery.stop()
        manager.post(Stop("signal"))

    gevent.signal_handler(signal.SIGTERM, gevent.spawn, drain)
    gevent.signal_handler(signal.SIGINT, gevent.spawn, drain)
    gevent.signal_handler(signal.SIGHUP, gevent.spawn, reload_config, config, manager)
    interval = sdnotify.watchdog_interval()
    if interval:
        gevent.spawn(_watchdog, manager, interval)
    gevent.spawn(_extend_start, manager)
    trim = _malloc_trim()
    if trim is not None:
        gevent.spawn(_trim_loop, trim)
    # Everything built so far (modules, config) lives as long as the process: keep it out of
    # the cyclic collector's scans. Sync allocates millions of short-lived containers (event
    # dicts, tag tuples) that reference counting frees; a larger first generation runs the
    # collector less often over them.
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    manager.start()
    log.info("started", version=build.version(), own_relay=config.service.own_relay,
             domains=list(config.service.domains), shard=str(config.cluster.shard))
    if constants.TEST_TIMERS_ACTIVE:
        log.warning("test_timers_active", timers=constants.TEST_TIMERS_ACTIVE)
    manager.run()
    manager.save_state(manager.clock())  # what the drain changed (refusals answered meanwhile)
    manager.saved.close()  # the lock goes with it
    return 0


def _watchdog(manager: SyncManager, interval: float) -> None:
    """WATCHDOG=1 only while the manager loop keeps applying ticks."""
    while True:
        gevent.sleep(interval)
        if manager.alive_recently(interval * 2):
            sdnotify.notify("WATCHDOG=1\nSTATUS=" + manager.summary())


START_EXTEND_EVERY_SECS = 20.0
START_EXTEND_BY_SECS = 60.0


def _extend_start(manager: SyncManager) -> None:
    """Until READY=1, ask systemd for more start time while the manager loop runs: an own
    relay slow to come up is waited for (TimeoutStartSec= in the unit is for a gsync that
    hangs, not for one that waits)."""
    while not manager.ready:
        if manager.alive_recently(START_EXTEND_EVERY_SECS):
            sdnotify.notify(f"EXTEND_TIMEOUT_USEC={int(START_EXTEND_BY_SECS * 1e6)}\n"
                            "STATUS=waiting for the own relay's self-subscription")
        gevent.sleep(START_EXTEND_EVERY_SECS)


def _malloc_trim():
    """glibc's ``malloc_trim``, or None elsewhere (musl, macOS)."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _trim_loop(trim) -> None:
    """Sync allocates in bursts (a page of 500 events, a REQ of ten 32 KB filters); glibc
    keeps the freed pages of those bursts in its heap, so RSS stays at the largest burst
    ever seen. Handing free pages back every few seconds keeps RSS near what is in use."""
    while True:
        gevent.sleep(TRIM_SECS)
        trim(0)


def reload_config(config, manager: SyncManager) -> None:
    """SIGHUP: re-read ``[log]`` and ``[sync] bootstrap_relays`` without a restart, and say
    which other keys differ from what this process started with (they wait for a restart)."""
    from ..ops.config import RELOADABLE_KEYS, ConfigErrors, changed_keys, load_config
    from ..ops.logging import configure_logging

    try:
        fresh = load_config(config.path)
    except ConfigErrors as exc:
        log.error("reload_failed", errors=[str(e) for e in exc.errors])
        return
    changed = changed_keys(config, fresh)
    configure_logging(fresh.log.level, fresh.log.format)
    manager.set_bootstrap_relays(fresh.sync.bootstrap_relays)
    applied = [key for key in changed if key in RELOADABLE_KEYS]
    later = [key for key in changed if key not in RELOADABLE_KEYS]
    log.info("reloaded", applied=applied, log_level=fresh.log.level,
             bootstrap_relays=list(fresh.sync.bootstrap_relays))
    if later:
        log.warning("reload_needs_restart", keys=later,
                    hint="these take effect at the next start (systemctl restart gsync)")
