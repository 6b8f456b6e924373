"""``gsync run`` under cProfile timed by the process's CPU clock (``bench/scale --profile``):
the profile, written to ``GSYNC_PROFILE_OUT`` when gsync exits, counts CPU seconds, so a
greenlet waiting on a socket or a sleep costs nothing in it (with the wall clock, they filled
the top of every profile and other processes' turns inflated every figure)."""
import cProfile
import os
import sys
import time

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    try:
        from gsync.ops.cli import main

        code = main(sys.argv[1:])
    finally:
        profiler.disable()
        profiler.dump_stats(os.environ["GSYNC_PROFILE_OUT"])
    sys.exit(code)
