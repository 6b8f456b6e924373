"""A relay's connection status, and every move it can make, as one table.

Theory of operation (after h11's ``_state.py``): a relay's ``ConnectionStatus`` changes only
here, through ``move(state, fact)``, where ``fact`` is what happened (dialled, handshake
done, historic sync complete…) and ``TRANSITIONS`` says where that leads from each status.
A fact the table has no row for, from the status the relay is in, is a bug in the caller:
``move`` raises ``IllegalMove`` and leaves the status as it was (the manager logs it, and
re-raises it under tests). Pure: no clock, no I/O.
"""
from __future__ import annotations

import enum


class ConnectionStatus(enum.IntEnum):
    """Values are the ``ngit_sync_relay_connected`` metric's."""

    DISCONNECTED = 0
    CONNECTING = 1
    SYNCING = 2
    CONNECTED = 3
    CONNECTED_HISTORIC_SYNC_FAILURES = 4


class Fact(enum.Enum):
    """What happened to a relay's connection."""

    DIALLED = "dialled"  # its handshake was queued
    HANDSHAKE_FAILED = "handshake failed"  # refused, failed, timed out, rate limited
    HANDSHAKE_DONE = "handshake done"  # a session starts: historic sync runs
    CONNECTION_LOST = "connection lost"  # the session ended (either side)
    RETIRED = "retired"  # no work left: it leaves every table
    # its sync starts again on the live connection: the daily sync, or anything else
    # that calls for one (``RelayLifecycle.fresh_start``: what the relay taught, the own
    # relay's loss, an owner new to a relay asked precisely…)
    FRESH_START = "fresh start"
    HISTORIC_DONE = "historic sync done"  # no batch left, double-checked
    HISTORIC_DONE_WITH_FAILURES = "historic sync done with failures"
    RECOVERED = "recovered"  # missing-event recovery fetched what the failures lost


S, F = ConnectionStatus, Fact
_CONNECTED = (S.SYNCING, S.CONNECTED, S.CONNECTED_HISTORIC_SYNC_FAILURES)

TRANSITIONS: dict[tuple[ConnectionStatus, Fact], ConnectionStatus] = {
    (S.DISCONNECTED, F.DIALLED): S.CONNECTING,
    (S.CONNECTING, F.HANDSHAKE_FAILED): S.DISCONNECTED,
    (S.CONNECTING, F.HANDSHAKE_DONE): S.SYNCING,
    **{(s, F.CONNECTION_LOST): S.DISCONNECTED for s in _CONNECTED},
    **{(s, F.RETIRED): S.DISCONNECTED for s in S},  # whatever it was doing
    **{(s, F.FRESH_START): S.SYNCING for s in _CONNECTED},
    (S.SYNCING, F.HISTORIC_DONE): S.CONNECTED,
    (S.SYNCING, F.HISTORIC_DONE_WITH_FAILURES): S.CONNECTED_HISTORIC_SYNC_FAILURES,
    (S.CONNECTED_HISTORIC_SYNC_FAILURES, F.RECOVERED): S.CONNECTED,
}
del S, F


class IllegalMove(Exception):
    def __init__(self, url: str, status: ConnectionStatus, fact: Fact):
        super().__init__(f"{url}: no move from {status.name} on {fact.value}")
        self.url, self.status, self.fact = url, status, fact


def move(state, fact: Fact) -> ConnectionStatus:
    """``state.status`` after ``fact`` (``TRANSITIONS``); ``IllegalMove``, the status
    unchanged, if the table has no such move."""
    new = TRANSITIONS.get((state.status, fact))
    if new is None:
        raise IllegalMove(state.url, state.status, fact)
    state.status = new
    return new
