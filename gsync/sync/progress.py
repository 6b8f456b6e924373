"""How far a sync round has come and how long it has left (SPEC §7 "Progress"): the first
sync, and each daily fresh start, as repositories complete, relays synced, events delivered,
starts queued and an estimate of the time left.

Pure: the manager reads its tables into one ``RelayWork`` per relay and the repositories'
relays, and calls ``sync_progress``; ``/status``, the gauges, ``gsync status`` and ``gsync
demo`` show what it returns (``progress_line`` is the one line an operator reads). No clock:
what depends on time (the wait before a relay's next start) comes in with the rows.

The time left. Under the pacing gate (SPEC §5, one background start per relay per ``gate``
seconds) a relay's historic sync takes one gate interval per start, whatever the start
brings: the starts, not the bytes, set the pace. Relays are gated apart and run side by
side, so the slowest sets the time: the max over syncing relays of
``wait + (starts queued + pages expected) × gate + settle`` (the Syncing → Connected check's
wait once its last batch is done), where ``gate`` is the slower of the gate's interval and the
pace the relay's starts have actually gone at lately (``RelayHealthTracker.start_pace``:
answers slower than the gate, or delivery holding history back, make them slower).

The queue alone is not enough: a filter being paged holds one start in the queue at a time,
however deep its history, and in a first sync against an own relay that holds nothing the
pages are most of the work (measured: a remote of 9,000 issues over 30 repositories, 33 s
under the 1 s gate; at 8 s the queue held 4 starts, 25 s were left). How deep a history goes is not known until the relay says EOSE, so a
filter that has taken ``n`` pages is expected to take ``n`` more (``RelayWork.pages_expected``,
twice that for repository events: their roots' threads take starts of their own). The queue
also leaves out the batches whose methods wait for the own relay's holdings: each of their
filters counts a start (``RelayWork.starts_reading_own``; NIP-77 takes one a filter, REQ pages
fewer, ten filters a start, then pages), an estimate on the high side for the second or so a
read of loopback takes (seconds on a loaded machine: 7 of a 38 s first sync, while the queue
said 2 s were left). Measured at
a quarter of the way: 0.81-0.87 of the time then taken where the work is known up front
(NIP-77, one filter a start: tests/test_first_sync_progress.py), 0.2-0.8 while histories are
paged into an empty own relay (the threads of roots not fetched yet cannot be counted yet).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .repos import SyncLevel
from .status import ConnectionStatus
from .targets import SyncItems

SYNCED_STATUSES = (ConnectionStatus.CONNECTED, ConnectionStatus.CONNECTED_HISTORIC_SYNC_FAILURES)


@dataclass(frozen=True)
class RelayWork:
    """One relay's part of the round, as the manager reads it off its tables."""

    url: str
    status: ConnectionStatus
    unreachable: bool = False  # refused, parked or dead: nothing is fetched from it for now
    starts_queued: int = 0  # historic REQs, pages and NIP-77 exchanges waiting for the gate
    pages_expected: int = 0  # further pages of the filters being paged (one per page taken)
    starts_reading_own: int = 0  # filters whose methods wait for the own relay's holdings: a start each
    gate_secs: float = 0.0  # seconds between its background starts (proactive or reactive gate)
    pace_secs: float | None = None  # seconds between its background starts as they went lately
    wait_secs: float = 0.0  # until its next start may go (a cooldown, the gate)
    settle_secs: float = 0.0  # the Syncing → Connected check's wait after its last batch
    events_delivered: int = 0

    @property
    def synced(self) -> bool:
        return self.status in SYNCED_STATUSES

    @property
    def syncing(self) -> bool:
        return self.status is ConnectionStatus.SYNCING

    def secs_per_start(self) -> float:
        """The gate's interval, or the pace its starts went at lately if that is slower."""
        return max(self.gate_secs, self.pace_secs or 0.0)

    def secs_left(self) -> float | None:
        """Its historic sync's time left: 0 unless syncing; None with the gate off before
        its starts have shown a pace (they then go as fast as the relay answers)."""
        if not self.syncing:
            return 0.0
        starts = self.starts_queued + self.pages_expected + self.starts_reading_own
        if starts and self.secs_per_start() <= 0:
            return None
        return max(0.0, self.wait_secs) + starts * self.secs_per_start() + self.settle_secs


@dataclass(frozen=True)
class SyncProgress:
    repos_complete: int
    repos_total: int
    relays_synced: int
    relays_total: int
    relays_syncing: int
    relays_unreachable: int
    events_delivered: int
    starts_queued: int
    secs_left: float | None  # 0: nothing left; None: unknown (the gate is off)
    slowest: str | None  # the relay that sets the time left

    def as_dict(self) -> dict:
        return {
            "repos_complete": self.repos_complete,
            "repos_total": self.repos_total,
            "relays_synced": self.relays_synced,
            "relays_total": self.relays_total,
            "relays_syncing": self.relays_syncing,
            "relays_unreachable": self.relays_unreachable,
            "events_delivered": self.events_delivered,
            "starts_queued": self.starts_queued,
            "secs_left": None if self.secs_left is None else round(self.secs_left, 1),
            "slowest_relay": self.slowest,
        }


def repos_complete(repos: Iterable[tuple[str, SyncLevel, Iterable[str]]],
                   confirmed: Mapping[str, SyncItems], counted) -> int:
    """Repositories whose history every counted relay listing them has confirmed (at the
    repository's level). ``repos``: ``(address, level, relays)``; ``counted``: the relays
    this instance syncs and can reach now (another shard's relays, and unreachable ones,
    do not hold a repository back: nothing more can be fetched from them for now)."""
    # (SyncItems.covers_repo inlined, in loops rather than all() of a generator: a scrape
    # asks it of every repository and relay, the most of a scrape's cost with hundreds)
    held = {url: items.repos for url, items in confirmed.items()}
    full, state_only = SyncLevel.FULL, SyncLevel.STATE_ONLY
    done = 0
    for address, level, relays in repos:
        for url in relays:
            if url in counted:
                have = held[url].get(address) if url in held else None
                if have is not full and (have is None or level is not state_only):
                    break
        else:
            done += 1
    return done


def sync_progress(relays: Iterable[RelayWork], repos_total: int, repos_done: int) -> SyncProgress:
    relays = list(relays)
    slowest, secs_left = None, 0.0
    for work in relays:
        left = work.secs_left()
        if left is None:
            slowest, secs_left = work.url, None
            break
        if left > secs_left:
            slowest, secs_left = work.url, left
    return SyncProgress(
        repos_complete=repos_done,
        repos_total=repos_total,
        relays_synced=sum(w.synced for w in relays),
        relays_total=len(relays),
        relays_syncing=sum(w.syncing for w in relays),
        relays_unreachable=sum(w.unreachable for w in relays),
        events_delivered=sum(w.events_delivered for w in relays),
        starts_queued=sum(w.starts_queued for w in relays),
        secs_left=secs_left,
        slowest=slowest,
    )


# -- for people -----------------------------------------------------------------------------


def duration(secs: float) -> str:
    """``45 s``, ``12 min 5 s``, ``3 h 20 min``: as precise as a glance needs."""
    secs = int(round(secs))
    if secs < 60:
        return f"{secs} s"
    if secs < 3600:
        return f"{secs // 60} min {secs % 60} s"
    return f"{secs // 3600} h {secs % 3600 // 60} min"


def progress_line(progress: Mapping) -> str:
    """``SyncProgress.as_dict()`` (as ``/status`` serves it) as one line, e.g. ``syncing: 12/30
    repos complete, 1/2 relays synced, 9,000 events delivered, 42 starts queued, about 1 min
    10 s left (slowest: wss://…)``."""
    p = progress
    syncing = p.get("relays_syncing", 0)
    relays = f"{p.get('relays_synced', 0)}/{p.get('relays_total', 0)} relays synced"
    if p.get("relays_unreachable"):
        relays += f" ({p['relays_unreachable']} unreachable)"
    parts = [
        f"{p.get('repos_complete', 0)}/{p.get('repos_total', 0)} repos complete",
        relays,
        f"{p.get('events_delivered', 0):,} events delivered",
    ]
    if not syncing:
        return "synced: " + ", ".join(parts)
    queued = p.get("starts_queued", 0)
    parts.append(f"{queued:,} start{'' if queued == 1 else 's'} queued")
    left = p.get("secs_left")
    if left is None:
        parts.append("time left unknown (pacing gate off)")
    else:
        slowest = f" (slowest: {p['slowest_relay']})" if p.get("slowest_relay") else ""
        parts.append(f"about {duration(left)} left{slowest}")
    return "syncing: " + ", ".join(parts)
