"""Shared fixtures: real relays, scripted relays and gsync processes, always stopped."""
import contextlib
import os
import subprocess
import sys

# pytest rewrites the asserts of every test module a worker imports, and of hypothesis (a
# pytest plugin: its 74 modules, 0.8 s of CPU a worker); keep what it wrote for the next run
# even where PYTHONDONTWRITEBYTECODE is set (the files go to tests/__pycache__, which git
# ignores, and to hypothesis's own __pycache__, and are checked against the source as usual).
# Set before anything below imports hypothesis.
sys.dont_write_bytecode = False

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from .gsync_proc import TEST_TIMERS, GsyncProcess  # noqa: E402
from .relays import RelayProcess  # noqa: E402
from .scripted_relay import ScriptedRelay  # noqa: E402

# A status move the table (gsync/sync/status.py) does not have raises, in this process and in
# every gsync the tests start (it inherits the environment), instead of being only logged.
os.environ["GSYNC_STRICT_STATUS"] = "1"

# Property runs judge results, never speed: on a loaded machine (six workers on two cores) one
# example can take longer than hypothesis's 200 ms default deadline, which would fail a
# correct run as "flaky". Every @settings in the tests inherits this.
settings.register_profile("gsync", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gsync")


_PEERS = {"relay_factory", "gsync_factory", "scripted", "seeded_relay"}


def pytest_configure(config):
    """A run on several workers starts cold (a fresh clone): each worker would rewrite the
    asserts of every test module it imports and compile gsync, all ten at once (2.8 s of
    CPU each: half a minute of the two cores). One collection in one process first writes
    what they all read (about 4 s); skipped once the caches are warm."""
    if (os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("GSYNC_WARMING")
            or not isinstance(config.getoption("numprocesses", None), int)
            or config.getoption("numprocesses") < 2 or _caches_warm(config)):
        return
    subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                    *config.args], env=dict(os.environ, GSYNC_WARMING="1"),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=False)


def _caches_warm(config) -> bool:
    """Does every test module have its rewritten bytecode, newer than its source?"""
    here = os.path.dirname(os.path.abspath(__file__))
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
    for name in os.listdir(here):
        if name.startswith("test_") and name.endswith(".py"):
            cached = os.path.join(here, "__pycache__", name[:-3] + "." + tag)
            if not os.path.exists(cached) or os.path.getmtime(cached) < os.path.getmtime(os.path.join(here, name)):
                return False
    return True


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pytest.ini): ten workers for the whole suite, whose long scenarios mostly
    wait on relays and timers; eight for a run that leaves them out (``-m 'not slow'``),
    which mostly computes, so a worker more is only another start to pay for."""
    return 8 if "not slow" in (config.option.markexpr or "") else 10


def pytest_collection_modifyitems(items):
    """The order the workers are handed the tests in. The longest scenarios (``long``, 20 s
    or more) first of all, so none starts last and ends the run alone. Then the rest woven by
    the time each kind takes: the scenarios with real peers (``slow`` with a relay or gsync
    fixture) mostly wait on timers and relays, the other ``slow`` tests (property runs) and
    the quick ones compute; run apart, the waiting ones once filled all ten workers for half a
    minute with the two cores at a quarter of their use (and the property runs ended the run
    alone). Each kind is spread over the run in proportion to its expected time, the waiting
    and the heavy ones over its first three quarters, so the short tests fill the end."""
    def kind(item):
        if item.get_closest_marker("long") is not None:
            return "long"
        if item.get_closest_marker("slow") is None:
            return "quick"
        return "peers" if _PEERS & set(item.fixturenames) else "heavy"

    # expected seconds per test, and the share of the run each kind is spread over (measured
    # on the suite of 1,831: peers 72 tests, 504 s; heavy 15, 170 s; quick 1,727, 353 s)
    secs, span = {"peers": 7.0, "heavy": 11.0, "quick": 0.2}, {"peers": 0.75, "heavy": 0.75, "quick": 1.0}
    kinds = [kind(item) for item in items]
    total = {k: secs[k] * kinds.count(k) for k in secs}
    done = dict.fromkeys(secs, 0.0)

    def place(pair):
        item, k = pair
        if k == "long":
            return -1.0
        at = span[k] * (done[k] + secs[k] / 2) / total[k]
        done[k] += secs[k]
        return at

    order = sorted(zip(items, kinds, strict=True), key=place)
    items[:] = [item for item, _ in order]


def pytest_runtest_setup(item):
    """``--dist loadgroup`` keeps the tests of an ``xdist_group`` on one worker by renaming
    them (``nodeid@group``) as each worker collects. pytest 9 ignores that rename (an item's
    id is no longer ``_nodeid``) and the groups are silently split: every worker then builds
    the group's module fixture again (the 11,000 signed events of test_negentropy_localrelay,
    2 s of both cores each time, 10 s when it held 51,000; a full run took 211 s instead of
    about 150). Such a test fails, saying why, rather than run at that cost."""
    if (getattr(item.config.option, "loadgroup", False)  # set on xdist workers only
            and item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid):
        pytest.fail("--dist loadgroup did not keep this xdist_group on one worker: this pytest "
                    "and pytest-xdist pair does not honour it; install the versions setup.py's "
                    "test extra names (pip install -e '.[test]')", pytrace=False)


@contextlib.contextmanager
def _started(make, stop):
    """A factory ``make(...)`` whose products are all stopped with ``stop`` at teardown."""
    started = []

    def start(*args, **kwargs):
        thing = make(*args, **kwargs)
        started.append(thing)
        return thing

    try:
        yield start
    finally:
        for thing in started:
            stop(thing)


@pytest.fixture(scope="session", autouse=True)
def _gsync_test_defaults(tmp_path_factory):
    GsyncProcess.base_dir = str(tmp_path_factory.mktemp("gsync"))
    GsyncProcess.default_timers = TEST_TIMERS


@pytest.fixture
def relay_factory():
    with _started(lambda **options: RelayProcess(options).start(), RelayProcess.stop) as start:
        yield start


@pytest.fixture
def gsync_factory(relay_factory, scripted):
    """gsync processes, stopped at teardown before the relays of ``relay_factory`` and
    ``scripted`` (requested here so that they are set up first and torn down after): a
    gsync stopping drains its deliveries for up to 20 s, and an own relay stopped before it
    made each such teardown wait that long."""
    def make(own, remotes=(), **kw):
        return GsyncProcess(own, remotes, **kw).start()

    stopped: list[GsyncProcess] = []

    def stop(gsync: GsyncProcess) -> None:
        gsync.terminate()
        stopped.append(gsync)

    with _started(make, stop) as start:
        yield start
    # A status (or batch phase) move the table lacks raised in the manager
    # (GSYNC_STRICT_STATUS), which logged it and went on: the test that drove it fails here.
    for gsync in stopped:
        assert "IllegalMove" not in gsync.log_text(), f"illegal ConnectionStatus move: {gsync.log_path}"
        assert "IllegalBatchMove" not in gsync.log_text(), f"illegal batch phase move: {gsync.log_path}"


@pytest.fixture
def scripted():
    """Scripted relays (tests/scripted_relay.py) for misbehaviour no real relay produces."""
    def make(*events, **knobs):
        return ScriptedRelay(events, **knobs).start()

    with _started(make, ScriptedRelay.stop) as start:
        yield start


@pytest.fixture
def answers_are_prompt(monkeypatch):
    """For tests whose relay answers a REQ when their loop comes round (2 s or more of the
    fake clock after it went): with nothing, such an answer would be taken for one a relay's
    time budget cut (``constants.TIME_CUT_SUSPECT_SECS``) and asked once more. Their subject
    is not slowness: an answer counts as prompt there."""
    from gsync import constants

    monkeypatch.setattr(constants, "TIME_CUT_SUSPECT_SECS", float("inf"))
