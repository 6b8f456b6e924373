"""Shared fixtures: real relays that are always stopped, whatever the test did."""
import pytest

from .relays import RelayProcess


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
