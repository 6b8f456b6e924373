"""Shared fixtures: real relays and gsync processes that are always stopped."""
import pytest

from .gsync_proc import GsyncProcess
from .relays import RelayProcess
from .scripted_relay import ScriptedRelay


@pytest.fixture
def relay_factory():
    started: list[RelayProcess] = []

    def start(**options) -> RelayProcess:
        relay = RelayProcess(options).start()
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()


@pytest.fixture
def gsync_factory():
    started: list[GsyncProcess] = []

    def start(own, remotes=(), **kw) -> GsyncProcess:
        proc = GsyncProcess(own, remotes, **kw).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.terminate()


@pytest.fixture
def scripted():
    """Scripted relays (tests/scripted_relay.py) for misbehaviour no real relay produces."""
    started: list[ScriptedRelay] = []

    def start(*events, **knobs) -> ScriptedRelay:
        relay = ScriptedRelay(events, **knobs).start()
        started.append(relay)
        return relay

    yield start
    for relay in started:
        relay.stop()
