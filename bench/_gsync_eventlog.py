"""``gsync run`` that logs every remote event it receives (``bench/scale --event-log``), for
finding which path brings an event again (issue 40: events received per event wanted).

One tab-separated line per event, appended to the file named by ``GSYNC_EVENT_LOG``:
monotonic time, relay, subscription id, event id, and what the subscription belonged to:
the batch's kind, method, ``follower``/``share_all``/``fetch_by_filter`` (F, S, B; D: no items, descendants), whether its filter
asks by id, and the filter's tag names. Lines starting ``#wait`` are ``method.follower_wait``'s
answers (expected events, starts queued on the leader's relay and on its own, exchanges,
wait, bound, relays syncing side by side, a check's price); lines starting ``#method`` are the planner's method choices (relay, batch,
filters by NIP-77 and by REQ pages, follower/share_all); ``#start`` its batch starts (relay,
batch, new or joined, kind, repositories, roots, leaders, go_now, follower/share_all, starts
queued on the relay). ``bench/_eventlog_report.py`` reads it. Slows gsync
a little (one line per event)."""
from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _install(path: str) -> None:
    from gsync.io.manager.core import SyncManager

    out = open(path, "a", buffering=1)  # line by line: the bench reads it while gsync runs
    original = SyncManager.apply_remote_event

    def apply_remote_event(self, state, msg):
        sub = msg.sub_id
        batch_id = state.current.sub_to_batch.get(sub)
        batch = state.current.pending.get(batch_id) if batch_id is not None else None
        if batch is None:
            what = "live" if sub.startswith("live") else "nobatch"
        else:
            pages = batch.pagination.get(sub)
            flts = [p.page_filter for p in pages.filters] if pages is not None else []
            by_id = any(f.ids for f in flts)
            tags = ",".join(sorted({name for f in flts for name, _ in f.tags})) or "-"
            kinds = ",".join(sorted({str(k) for f in flts for k in (f.kinds or ())})) or "-"
            what = (f"{batch.kind.name}/{batch.method.name}/"
                    f"{'F' if batch.follower else ''}{'S' if batch.share_all else ''}"
                    f"{'B' if batch.fetch_by_filter else ''}"
                    f"{'' if batch.items.repos or batch.items.root_events else 'D'}/{'ids' if by_id else 'flt'}/{tags}/{kinds}")
        out.write(f"{time.monotonic():.3f}\t{state.url}\t{sub}\t{msg.event.id}\t{what}\n")
        return original(self, state, msg)

    SyncManager.apply_remote_event = apply_remote_event

    from gsync.sync import method

    follower_wait = method.follower_wait

    def logged_follower_wait(expected, leader_queued, gate_secs, cap_secs, filters=0, start=method.START_BYTES,
                             own_queued=None, side_by_side=1):
        wait = follower_wait(expected, leader_queued, gate_secs, cap_secs, filters, start, own_queued, side_by_side)
        out.write(f"#wait\t{time.monotonic():.3f}\t{expected}\t{leader_queued}\t{own_queued}\t{filters}"
                  f"\t{wait.wait}\t{wait.max_secs:.2f}\t{side_by_side}\t{start}\n")
        return wait

    method.follower_wait = logged_follower_wait

    from gsync.sync.planner import HistoricPlanner

    choose_methods = HistoricPlanner.choose_methods

    def logged_choose_methods(self, state, batch, filters, holdings, now):
        by_neg, by_req = choose_methods(self, state, batch, filters, holdings, now)
        out.write(f"#method\t{time.monotonic():.3f}\t{state.url}\t{batch.batch_id}\t{len(by_neg)}\t{len(by_req)}"
                  f"\t{'F' if batch.follower else ''}{'S' if batch.share_all else ''}\n")
        return by_neg, by_req

    HistoricPlanner.choose_methods = logged_choose_methods

    start = HistoricPlanner.start

    def logged_start(self, state, items, filters, kind, coalesce, leaders, go_now, now):
        batch, new = start(self, state, items, filters, kind, coalesce, leaders, go_now, now)
        out.write(f"#start\t{time.monotonic():.3f}\t{state.url}\t{batch.batch_id}\t{int(new)}\t{kind.name}"
                  f"\t{len(items.repos)}\t{len(items.root_events)}\t{len(leaders)}\t{int(go_now)}"
                  f"\t{'F' if batch.follower else ''}{'S' if batch.share_all else ''}"
                  f"\t{len(state.current.historic_queue)}\n")
        return batch, new

    HistoricPlanner.start = logged_start


if __name__ == "__main__":
    _install(os.environ["GSYNC_EVENT_LOG"])
    from gsync.ops.cli import main

    sys.exit(main(sys.argv[1:]))
