"""``gsync run`` with tracemalloc on (``bench/scale --tracemalloc``): every 20 s, the top
allocation sites (by size, grouped by line, 3 frames deep) are appended to the file named by
``GSYNC_TRACEMALLOC_OUT``. For finding what holds memory; slows gsync down 2-3x."""
from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import gevent  # noqa: E402


def _watch(path: str) -> None:
    while True:
        gevent.sleep(float(os.environ.get("GSYNC_TRACEMALLOC_SECS", "20")))
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snap.statistics("traceback")
        total = sum(s.size for s in stats)
        with open(path, "a") as fh:
            fh.write(f"== {time.strftime('%H:%M:%S')} traced {total / 2**20:.1f} MiB\n")
            for s in stats[:20]:
                fh.write(f"{s.size / 2**20:8.1f} MiB {s.count:9d} blocks\n")
                for line in s.traceback.format()[-12:]:
                    fh.write(f"      {line}\n")


if __name__ == "__main__":
    tracemalloc.start(int(os.environ.get("GSYNC_TRACEMALLOC_FRAMES", "3")))
    gevent.spawn(_watch, os.environ["GSYNC_TRACEMALLOC_OUT"])
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from gsync.ops.cli import main

    sys.exit(main(sys.argv[1:]))
