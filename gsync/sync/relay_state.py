"""RelaySyncIndex entries: confirmed sync state and connection lifecycle of one relay.

Pure data plus the small rules that read it (the 15-minute quick-reconnect rule, the status
values the ``ngit_sync_relay_connected`` metric exports). The manager owns these; only it
mutates them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..constants import QUICK_RECONNECT_SECS
from .pending import PendingBatch
from .targets import ConfirmedItems


class ConnectionStatus(enum.IntEnum):
    """Values are the ``ngit_sync_relay_connected`` metric's."""

    DISCONNECTED = 0
    CONNECTING = 1
    SYNCING = 2
    CONNECTED = 3
    CONNECTED_HISTORIC_SYNC_FAILURES = 4


@dataclass
class LiveSub:
    filters: tuple
    control: bool = False  # layer 1: never closed by consolidation
    descendants: bool = False  # thread replies: give their room to core coverage when short


@dataclass
class RelayState:
    url: str
    is_bootstrap: bool = False
    status: ConnectionStatus = ConnectionStatus.DISCONNECTED
    confirmed: ConfirmedItems = field(default_factory=ConfirmedItems)
    last_connected: float | None = None
    disconnected_at: float | None = None
    announcements_synced: bool = False
    historic_sync_completed_at: float | None = None
    # the session in use: the connection object, its number and the relay's limits
    conn: Any = None
    session: int = 0
    attempt: int = 0
    limits: Any = None
    page_cap: Any = None  # pending.PageCap: what this session taught us of its page size
    refused_reason: str = ""  # the SSRF guard said no: never dialled again
    pending: dict[int, PendingBatch] = field(default_factory=dict)
    sub_to_batch: dict[str, int] = field(default_factory=dict)
    live_subs: dict[str, LiveSub] = field(default_factory=dict)
    # (sub id or NIP-77 token, filters) waiting for a slot
    historic_queue: list = field(default_factory=list)
    batch_failures: bool = False
    unrelated_failure: bool = False  # a failure recovery cannot fix (e.g. a refused sub)
    neg_running: set = field(default_factory=set)
    # direct members of threads seen from this relay (their replies are fetched too)
    members: set = field(default_factory=set)
    new_members: set = field(default_factory=set)
    descendants_started_at: float | None = None
    # live coverage that did not fit the relay's budget, polled instead (manager.run_polls)
    polled: list = field(default_factory=list)
    poll_cursor: float | None = None
    poll_started_at: float | None = None
    poll_batch: int | None = None
    negentropy_ok: bool = True
    next_daily_at: float | None = None
    last_error: str = ""
    events_delivered: int = 0
    received_metric: Any = None  # the relay's gsync_remote_events_total child, kept
    gauges: Any = None  # its children of metrics.PER_RELAY_GAUGES, kept
    completion_check_scheduled: bool = False
    slot_wakeup_scheduled: bool = False

    @property
    def connected(self) -> bool:
        return self.conn is not None and self.status >= ConnectionStatus.SYNCING

    def should_fresh_start(self, now: float) -> bool:
        """First connect, or away for more than 15 minutes: confirmed state is too stale."""
        if self.last_connected is None or not self.announcements_synced:
            return True
        return self.disconnected_at is None or now - self.disconnected_at > QUICK_RECONNECT_SECS

    def clear_pending(self) -> None:
        self.slot_wakeup_scheduled = False
        self.neg_running.clear()
        self.pending.clear()
        self.sub_to_batch.clear()
        self.historic_queue.clear()

    def clear_live(self) -> None:
        """Live coverage is gone (disconnect, fresh start): descendant coverage is rebuilt
        for every known member on the next descendants tick."""
        self.new_members |= self.members
        self.members = set()
        self.live_subs.clear()
        self.polled = []
        self.poll_cursor = self.poll_started_at = self.poll_batch = None

    def clear_confirmed(self) -> None:
        self.confirmed = ConfirmedItems()
        self.announcements_synced = False
        self.batch_failures = False
        self.unrelated_failure = False
