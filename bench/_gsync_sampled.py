"""``gsync run`` sampled by its own CPU clock (``bench/scale --sample``): every 5 ms of the
process's CPU time (``ITIMER_PROF``: user and kernel, never a wait) a signal records the
Python stack that is running, whichever greenlet it is. Unlike cProfile (which slows gsync
about 2.5 times, and under gevent counts other greenlets' work in a caller's cumulative
time) the samples cost little and weigh every stack by the CPU it used; unlike an outside
sampler, a turn lost to another process on the same core is never counted. Written when
gsync exits to ``GSYNC_SAMPLE_OUT``: one line per stack, root first, frames ``file:function``
separated by ``;``, then the sample count (the collapsed form flame graphs read);
``bench/scale`` sums them by frame (``sample_summary``)."""
import os
import signal
import sys
from collections import Counter

INTERVAL = 0.005

_STACKS: Counter = Counter()


def _frame_name(frame) -> str:
    code = frame.f_code
    path = code.co_filename
    short = path.rsplit("gsync/", 1)[-1] if "/gsync/" in path else os.path.basename(path)
    return f"{short}:{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}"


def _sample(signum, frame) -> None:
    names = []
    while frame is not None:
        names.append(_frame_name(frame))
        frame = frame.f_back
    _STACKS[";".join(reversed(names))] += 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    signal.signal(signal.SIGPROF, _sample)
    signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)
    try:
        from gsync.ops.cli import main

        code = main(sys.argv[1:])
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(os.environ["GSYNC_SAMPLE_OUT"], "w") as out:
            for stack, count in _STACKS.items():
                out.write(f"{stack} {count}\n")
    sys.exit(code)
