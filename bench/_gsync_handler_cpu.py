"""``gsync run`` with the CPU seconds of each manager handler counted (``bench/scale
--handler-cpu``): every handler of the manager's dispatch table, and a few steps inside them
and outside (the self-subscription's parsing), timed by ``time.process_time`` around the
call. None of them waits (the manager applies one message at a time without yielding), so
unlike cProfile's cumulative times under gevent, other greenlets' work never lands in them;
the clock costs about a microsecond a call, so the figures are the process's own. Written as
JSON to ``GSYNC_HANDLER_CPU_OUT`` when gsync exits: {name: [calls, seconds]}, ``total``
the process's CPU seconds. Nested steps are counted in their handler too."""
import json
import os
import sys
import time

_CPU: dict[str, list] = {}


def _timed(name: str, fn):
    clock = time.process_time

    def timed(*args, **kwargs):
        started = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            entry = _CPU.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += clock() - started
    return timed


def _instrument() -> None:
    from gsync.io import connection, delivery, negentropy_ws, self_subscriber
    from gsync.io.manager import core, descendants, historic, lifecycle, own_relay

    dispatch_table = core.SyncManager.dispatch_table

    def timed_table(self):
        return {kind: _timed(kind.__name__, handler) for kind, handler in dispatch_table(self).items()}

    core.SyncManager.dispatch_table = timed_table
    steps = [(self_subscriber.SelfSubscriber, ("_post_events", "_post_landed", "_known_held")),
             (core.SyncManager, ("save_state", "update_metrics")),
             (lifecycle.RelayLifecycle, ("apply_dirty",)),
             (descendants.Descendants, ("run",)),
             (historic.HistoricSync, ("release_followers", "start")),
             (own_relay.OwnRelaySide, ("consider_for_delivery",)),
             # outside the manager: a remote's frame (parse, check, hand over), an OK
             (connection.RelayConnection, ("_handle_frame",)),
             (delivery.OwnRelayDelivery, ("_on_ok",))]
    for cls, names in steps:
        for name in names:
            setattr(cls, name, _timed(f"{cls.__name__}.{name}", getattr(cls, name)))
    negentropy_ws.storage_of = _timed("negentropy_ws.storage_of", negentropy_ws.storage_of)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _instrument()
    try:
        from gsync.ops.cli import main

        code = main(sys.argv[1:])
    finally:
        with open(os.environ["GSYNC_HANDLER_CPU_OUT"], "w") as out:
            json.dump({"total": [1, time.process_time()], **_CPU}, out)
    sys.exit(code)
