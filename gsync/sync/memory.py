"""What gsync learnt about a relay, in the form that outlives the process (SPEC §5, "What
survives a restart").

Pure: records in and out as plain JSON-able values, time passed in. ``ops.store`` writes
them to ``state_dir``; the manager takes a record when a relay is saved (``relay_memory``)
and gives it back when the relay is registered again after a restart (``restore_relay``).

Kept per relay: the limits it taught us (message length, filters per REQ, subscription
cap), the coverage it refused by policy with its probe times, its failure streak and dead
clock, its rate-limit cooldown, when a NIP-77 exchange last went unanswered on it, whether it
answered several filters of one REQ since its last daily fresh start, when it was last
connected and when its daily fresh start is due; and apart, row by row, the items
whose history it has given us (``confirmed_rows``, ``confirmed_diff``) and its thread
members (``io.manager.saved_state``). Not kept: page caps (each connection learns them again by
design, at the cost of one confirming page) and anything of one session (pending batches,
live subscriptions).
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any

from .policy import CoveragePauses
from .repos import SyncLevel
from .targets import ConfirmedItems

MEMORY_VERSION = 1  # of one record; a record of another version is ignored (fresh start)
# The health fields that outlive a connection (sync.health._RelayHealth).
HEALTH_FIELDS = ("failures", "first_failure_at", "last_failure_at", "misbehaviour_streak",
                 "cooldown_until", "learned_gap", "learned_at",
                 "cooldowns_in_a_row", "cooldown_ended_at", "probing")
ROOT_LEVEL = 0  # a confirmed row for a root event; repositories store their SyncLevel's value
_LEVELS = {1: SyncLevel.STATE_ONLY, 2: SyncLevel.FULL}
_LEVEL_VALUES = {SyncLevel.STATE_ONLY: 1, SyncLevel.FULL: 2}


def relay_memory(state, health: dict[str, Any]) -> dict[str, Any]:
    """The record of ``state`` (a ``RelayState``) and its health fields. It changes only
    when something learnt does: a relay connected now says so (``connected``), and when it
    was last seen so is the time of the save that read it back (``restore_relay``), so a
    connected relay's record is not written again at every save."""
    limits = {"max_message": state.max_message_learned, "max_filters": state.max_filters_learned,
              "max_subscriptions": state.max_subscriptions_learned, "max_values": state.max_values_learned}
    return {
        "v": MEMORY_VERSION,
        "connected": state.connected,
        "last_connected": state.last_connected,
        "disconnected_at": state.disconnected_at,
        "announcements_synced": state.announcements_synced,
        "next_daily_at": state.next_daily_at,
        "limits": {k: v for k, v in limits.items() if v is not None},
        "paused": state.paused.snapshot(),
        "nip77_failed_at": state.nip77_failed_at,
        "ids_unserved_at": state.ids_unserved_at,
        "precise_queries": state.precise_queries,
        "precise_refused": state.precise_refused,  # (read alone by a memory saved before it was dated)
        "precise_refused_at": state.precise_refused_at,
        "filters_answered": state.filters_answered,
        "live_dropped_at": state.live_dropped_at,
        "unreached": state.unreached,
        "subscriptions_learned_at": state.subscriptions_learned_at,
        "values_learned_at": state.values_learned_at,
        "health": {k: health.get(k) for k in HEALTH_FIELDS},
    }


# What ``relay_memory`` reads of a relay, read in C: equal keys, equal records (a save builds
# and compares the record only for a relay whose key changed: ``io.manager.saved_state``).
_RECORD_FIELDS = attrgetter("connected", "last_connected", "disconnected_at", "announcements_synced",
                            "next_daily_at", "max_message_learned", "max_filters_learned",
                            "max_subscriptions_learned", "nip77_failed_at", "ids_unserved_at",
                            "precise_queries", "precise_refused_at", "filters_answered", "live_dropped_at",
                            "unreached",
                            "subscriptions_learned_at", "max_values_learned", "values_learned_at")
HEALTH_VALUES = attrgetter(*HEALTH_FIELDS)


def record_key(state, health_values: tuple) -> tuple:
    """Everything ``relay_memory`` makes the record of ``state`` from (``health_values``:
    ``HEALTH_VALUES`` of its health record), as one comparable value: cheaper to take at
    every save than the record."""
    return _RECORD_FIELDS(state), health_values, state.paused.key()


def restore_relay(state, memory: dict[str, Any], saved_at: float | None) -> dict[str, Any] | None:
    """Put ``memory`` back on a newly registered ``state``; its health fields are returned
    for the tracker (None: the record is unusable, the relay starts fresh). A relay that
    was connected at the last save (``saved_at``, wall clock) was last connected then: a
    restart within 15 minutes of it is a quick reconnect (SPEC §4). A malformed record
    raises nothing: it is a fresh start, never a stop."""
    try:
        if memory.get("v") != MEMORY_VERSION:
            return None
        limits = memory.get("limits") or {}
        state.max_message_learned = _int_or_none(limits.get("max_message"))
        state.max_filters_learned = _int_or_none(limits.get("max_filters"))
        state.max_subscriptions_learned = _int_or_none(limits.get("max_subscriptions"))
        state.max_values_learned = _int_or_none(limits.get("max_values"))
        state.last_connected = _float_or_none(memory.get("last_connected"))
        state.disconnected_at = _float_or_none(memory.get("disconnected_at"))
        state.announcements_synced = bool(memory.get("announcements_synced"))
        state.next_daily_at = _float_or_none(memory.get("next_daily_at"))
        state.nip77_failed_at = _float_or_none(memory.get("nip77_failed_at"))
        state.ids_unserved_at = _float_or_none(memory.get("ids_unserved_at"))
        state.precise_queries = memory.get("precise_queries") is True
        state.precise_refused_at = _float_or_none(memory.get("precise_refused_at"))
        if state.precise_refused_at is None and memory.get("precise_refused") is True:
            state.precise_refused_at = float(saved_at or 0.0)  # (saved before it was dated)
        state.filters_answered = memory.get("filters_answered") is True
        state.live_dropped_at = _float_or_none(memory.get("live_dropped_at"))
        state.unreached = memory.get("unreached") is True
        state.subscriptions_learned_at = _float_or_none(memory.get("subscriptions_learned_at"))
        state.values_learned_at = _float_or_none(memory.get("values_learned_at"))
        if memory.get("connected") and saved_at is not None:
            state.last_connected = state.disconnected_at = float(saved_at)
        state.paused = CoveragePauses.restore(memory.get("paused") or [])
        health = memory.get("health") or {}
        return {k: health.get(k) for k in HEALTH_FIELDS}
    except (TypeError, ValueError, AttributeError):
        return None


def confirmed_rows(items: ConfirmedItems) -> dict[str, int]:
    """Confirmed items as rows, item → level: repositories by address, roots by id."""
    rows = {address: _LEVEL_VALUES[level] for address, level in items.repos.items()}
    rows.update((root, ROOT_LEVEL) for root in items.root_events)
    return rows


def confirmed_from_rows(rows) -> ConfirmedItems:
    items = ConfirmedItems()
    for item, level in rows:
        if level == ROOT_LEVEL:
            items.root_events.add(item)
        elif level in _LEVELS:
            items.repos[item] = _LEVELS[level]
    return items


def confirmed_diff(saved: ConfirmedItems, current: ConfirmedItems) -> tuple[dict[str, int], list[str]]:
    """What to write so that the rows of ``saved`` become those of ``current``: (rows to
    put, item → level; items to delete). Set differences, so the cost follows the change
    more than the size (a relay confirms thousands of roots; a save sees a few new)."""
    put = {root: ROOT_LEVEL for root in current.root_events - saved.root_events}
    put.update((address, _LEVEL_VALUES[level]) for address, level in current.repos.items()
               if saved.repos.get(address) is not level)
    delete = list(saved.root_events - current.root_events)
    delete += [address for address in saved.repos.keys() - current.repos.keys()]
    return put, delete


def lost_repositories(rows_by_relay: dict[str, list], known) -> dict[str, frozenset[str]]:
    """Relay → the repositories it confirmed to an earlier process (saved ``confirmed``
    rows) that are not ``known`` now: announcements the own relay lost (its database
    emptied or restored from an older copy) while no process watched, or before this one
    started. No announcement the own relay shows lists that relay for them any more, so
    nothing would ask it again; where to look for them."""
    lost = {}
    for url, rows in rows_by_relay.items():
        addresses = frozenset(item for item, level in rows if level in _LEVELS and item not in known)
        if addresses:
            lost[url] = addresses
    return lost


def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)
