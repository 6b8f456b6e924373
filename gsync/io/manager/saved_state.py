"""What the manager keeps in ``state_dir`` (SPEC §5, "What survives a restart"): read once
at start, given back to each relay as it is registered, and written by change on the
maintenance tick (``constants.STATE_SAVE_SECS``) and at stop.

An object the manager owns (not a mixin): the store (``ops.store``) does the I/O, the pure
modules decide the records (``sync.memory``, ``sync.rejected``); this joins them to the
manager's tables.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from operator import countOf

from ... import constants
from ...ops.logging import get_logger
from ...ops.store import StateRefused, StateStore, environmental
from ...sync import memory
from ...sync.rejected import RejectedIndex
from ...sync.relay_state import ChangeTrackedDict
from ...sync.targets import ConfirmedItems

log = get_logger("gsync.state")

LEGACY_MIGRATED = "rejected_json_migrated"
WITNESSES = "own_witnesses"  # ids the own relay stored, asked back at the next start (sync.own_witness)
SAVED_AT = "saved_at"  # wall clock of the last save: when the relays it says connected were


@dataclass
class _Changes:
    """One save's rows, by relay."""

    records: dict = field(default_factory=dict)
    puts: dict = field(default_factory=dict)
    deletes: dict = field(default_factory=dict)
    member_puts: dict = field(default_factory=dict)
    member_deletes: dict = field(default_factory=dict)


class SavedState:
    def __init__(self, store: StateStore, now: float):
        self.store = store
        # of this process's last write (a metric's age, which grows while saves fail): at
        # first the store's open, which proved state_dir writable
        self.saved_at: float | None = now if store.saved_at is not None else None
        self.save_error: str | None = None  # why the saves fail, while they do (gsync status)
        self.last_save_try = now
        self.touched = False  # a message other than a tick applied since the last save (``note_message``)
        self.soon = False  # something a crash must not lose was decided: saved at the next tick
        self._memories: dict[str, dict] = {}  # url → record, until that relay is registered
        self._confirmed: dict[str, list] = {}  # url → saved (item, level) rows, the same
        self._members: dict[str, list] = {}  # url → saved (member, roots) rows, the same
        self._confirmed_repos: dict[str, list] = {}  # url → saved repository rows, until ready (``take_lost``)
        self._witnesses: dict = {}  # what the last process's own relay stored, until ready
        self._saved_witnesses = ""  # as last written
        self._witness_version = None  # the ``OwnWitness.version`` last written
        self._prior_saved_at: float | None = None  # the previous process's last save
        self._saved_records: dict[str, dict] = {}  # url → record as last written
        self._record_keys: dict[str, tuple] = {}  # url → memory.record_key of that record
        self._saved_confirmed: dict[str, ConfirmedItems] = {}  # url → confirmed as last written
        self._signatures: dict[str, tuple] = {}  # url → its confirmed then, and how it looked
        self._saved_members: dict[str, set] = {}  # url → its members as last written
        self._members_of: dict[str, object] = {}  # url → the member_roots they were read from
        self._forget: set[str] = set()  # retired relays whose rows go with the next save

    @classmethod
    def open(cls, state_dir: str, now: float) -> SavedState:
        """Lock and read ``state_dir``; raises ``ops.store.StateRefused`` (locked, newer,
        not writable, the disk full or failing)."""
        return cls(StateStore.open(state_dir, log), now)

    # -- reading, once ----------------------------------------------------------------------

    def load(self, now: float) -> RejectedIndex:
        """Everything saved, kept until each relay is registered; the rejected index
        returned. Unreadable content is a fresh start: aside, one line, empty. The disk or
        the permissions failing is not the content's fault: ``ops.store.StateRefused``, the
        database kept."""
        try:
            try:
                rejected = self._load(now)
            except (sqlite3.Error, UnicodeDecodeError, ValueError, TypeError) as exc:
                if isinstance(exc, sqlite3.Error) and environmental(exc, self.store.dir, self.store.path):
                    raise
                self.store.reset(f"{type(exc).__name__}: {exc}")
                self._memories, self._confirmed, self._members, self._prior_saved_at = {}, {}, {}, None
                self._confirmed_repos = {}
                rejected = self._load(now)
        except (sqlite3.Error, OSError) as exc:
            self.store.close()
            raise self.store.refusal(exc) from None
        except StateRefused:
            self.store.close()
            raise
        log.info("state_loaded", path=self.store.path, relays=len(self._memories),
                 rejected=len(rejected), saved_at=self._prior_saved_at)
        return rejected

    def _load(self, now: float) -> RejectedIndex:
        store = self.store
        rejected, drop = RejectedIndex.from_rows(store.rejected_rows(), now)
        self._memories = store.relay_memories()
        self._confirmed = store.confirmed_rows()
        self._members = store.member_rows()
        self._confirmed_repos = {url: [row for row in rows if row[1] != memory.ROOT_LEVEL]
                                 for url, rows in self._confirmed.items()}
        prior = store.meta(SAVED_AT)
        self._prior_saved_at = float(prior) if prior is not None else None
        self._saved_witnesses = store.meta(WITNESSES) or ""
        try:
            self._witnesses = json.loads(self._saved_witnesses) if self._saved_witnesses else {}
        except ValueError:  # (written by a gsync that kept ids alone)
            self._witnesses = {"ids": [i for i in self._saved_witnesses.split() if len(i) == 64]}
        if store.meta(LEGACY_MIGRATED) is None:
            text = store.read_legacy_rejected()
            if text is not None:
                legacy = RejectedIndex.loads(text, now)
                for event_id, entry in legacy._cold.items():
                    if event_id not in rejected:
                        rejected._put(event_id, entry)
                log.info("rejected_index_migrated", entries=len(legacy))
            puts, _ = rejected.take_changes()
            store.save(now, rejected_puts=puts, rejected_deletes=drop, meta={LEGACY_MIGRATED: "1"})
            drop = []
        store.retire_legacy_rejected()
        if drop:
            store.save(now, rejected_deletes=drop)
        return rejected

    def restore(self, state, health) -> None:
        """A newly registered relay gets what an earlier process learnt of it."""
        record = self._memories.pop(state.url, None)
        rows = self._confirmed.pop(state.url, None)
        members = self._members.pop(state.url, None)
        if record is None:
            return
        saved_health = memory.restore_relay(state, record, self._prior_saved_at)
        if saved_health is None:
            return
        health.restore(state.url, saved_health)
        if rows:
            state.confirmed = memory.confirmed_from_rows(rows)
            self._saved_confirmed[state.url] = state.confirmed.copy()
            self._signatures[state.url] = _signature(state.confirmed)
        else:
            state.announcements_synced = False  # nothing confirmed: its history is owed
        if members:
            # as after a disconnect: the next connection opens their coverage again
            state.member_roots.update((m, frozenset(roots.split())) for m, roots in members)
            state.reopen_members.update(m for m, _ in members)
            self._saved_members[state.url] = {m for m, _ in members}
        self._saved_records[state.url] = record
        log.info("relay_memory_restored", relay=state.url, connected=bool(record.get("connected")),
                 last_connected=state.last_connected, failures=saved_health.get("failures"),
                 paused=len(state.paused), confirmed=len(rows or ()), members=len(members or ()))

    def take_lost(self, known) -> dict[str, frozenset[str]]:
        """Once, when the own relay's first read is applied: relay → the repositories it
        confirmed to an earlier process that are not ``known`` now (``memory.lost_repositories``)."""
        rows, self._confirmed_repos = self._confirmed_repos, {}
        return memory.lost_repositories(rows, known)

    def take_witnesses(self) -> dict:
        """Once, when the own relay's first read is applied: what it had stored for the last
        process (``OwnWitness.snapshot``), to ask it for."""
        witnesses, self._witnesses = self._witnesses, {}
        return witnesses if isinstance(witnesses, dict) else {}

    def forget(self, url: str) -> None:
        """A retired relay: its rows go with the next save."""
        self._forget.add(url)
        self._members_of.pop(url, None)
        self._saved_records.pop(url, None)
        self._record_keys.pop(url, None)
        self._saved_confirmed.pop(url, None)
        self._signatures.pop(url, None)
        self._saved_members.pop(url, None)

    # -- writing, by change -----------------------------------------------------------------

    def note_message(self) -> None:
        """A message other than a tick was applied (``SyncManager.apply``): what it changed
        is saved within STATE_SAVE_SECS."""
        self.touched = True

    def save_soon(self) -> None:
        """A decision the next process must know though this one is killed (a relay's policy
        refusal paused a shape: asked again after a crash, the relay refuses it once more):
        saved at the next tick, not within STATE_SAVE_SECS."""
        self.soon = True

    def due(self, now: float) -> bool:
        """Every ``STATE_SAVE_SECS`` while messages come, every ``STATE_QUIET_SAVE_SECS`` on
        ticks alone; at the next tick after ``save_soon``."""
        if self.soon:
            return True
        waited = now - self.last_save_try
        return waited >= constants.STATE_SAVE_SECS and (self.touched or waited >= constants.STATE_QUIET_SAVE_SECS)

    def save(self, relays, health, rejected: RejectedIndex, now: float, *, ready: bool,
             witness=None) -> None:
        """Write what changed since the last save, in one transaction. Once the manager is
        ready (the own relay's first read applied: every relay with work is registered),
        saved relays no longer registered are forgotten. ``witness``: what the own relay
        stored (an ``OwnWitness``), for the next process to ask it for; its snapshot is
        taken only when it changed since the last save that worked (most saves: a 30-day
        simulated world changed it at 159 of 9,433)."""
        self.last_save_try, self.touched, self.soon = now, False, False
        c = _Changes()
        for state in relays.values():
            if not state.refused_reason:
                self._collect(state, health, c)
        if ready and self._memories:  # their rows go, at this save or the next that works
            self._forget |= set(self._memories)
            self._memories.clear()
            self._confirmed.clear()
            self._members.clear()
        forget = set(self._forget)
        rejected_puts, rejected_deletes = rejected.take_changes()
        meta = {SAVED_AT: repr(now)}
        version = witness.version if witness is not None else None
        if version is not None and version != self._witness_version:
            snapshot = witness.snapshot()
            witnessed = json.dumps(snapshot, separators=(",", ":")) if any(snapshot.values()) else ""
            if witnessed and witnessed != self._saved_witnesses:  # (none yet: the last process's kept)
                meta[WITNESSES] = witnessed
        try:
            self.store.save(now, rejected_puts=rejected_puts, rejected_deletes=rejected_deletes,
                            relays=c.records, forget_relays=forget, confirmed_puts=c.puts,
                            confirmed_deletes=c.deletes, member_puts=c.member_puts,
                            member_deletes=c.member_deletes, meta=meta)
        except (sqlite3.Error, OSError) as exc:
            self.save_error = str(exc)[:300]
            log.warning("state_save_failed", path=self.store.path, reason=self.save_error)
            rejected.keep_changes([i for i, _ in rejected_puts] + list(rejected_deletes))
            self._not_saved(c)
            self.touched = True  # tried again at the next STATE_SAVE_SECS
            return
        self._forget -= forget
        self._saved_witnesses = meta.get(WITNESSES, self._saved_witnesses)
        self._witness_version = version
        self._saved_records.update(c.records)
        self.saved_at, self.save_error = now, None
        if c.records or c.puts or c.deletes or rejected_puts or rejected_deletes or forget:
            log.debug("state_saved", relays=len(c.records), confirmed=sum(map(len, c.puts.values())),
                      unconfirmed=sum(map(len, c.deletes.values())), rejected=len(rejected_puts),
                      unrejected=len(rejected_deletes), forgotten=len(forget))

    def _collect(self, state, health, c: _Changes) -> None:
        """What of ``state`` changed since it was last saved (its memory, confirmed items,
        thread members), into ``c``; taken as saved (undone by ``_not_saved``)."""
        key = memory.record_key(state, health.values(state.url, memory.HEALTH_VALUES))
        if self._record_keys.get(state.url) != key:  # (the record unchanged: not built again)
            record = memory.relay_memory(state, health.snapshot(state.url, memory.HEALTH_FIELDS))
            if self._saved_records.get(state.url) != record:
                c.records[state.url] = record
            self._record_keys[state.url] = key
        signature = _signature(state.confirmed)
        saved = self._signatures.get(state.url)
        if saved is None or saved[0] is not signature[0] or saved[1:] != signature[1:]:
            put, delete = memory.confirmed_diff(
                self._saved_confirmed.get(state.url) or ConfirmedItems(), state.confirmed)
            if put:
                c.puts[state.url] = put
            if delete:
                c.deletes[state.url] = delete
            self._saved_confirmed[state.url] = state.confirmed.copy()
            self._signatures[state.url] = signature
        roots = state.member_roots
        if not getattr(roots, "changed", True) and self._members_of.get(state.url) is roots:
            return  # unchanged since written (comparing every member at every save was a fifth of a save)
        if isinstance(roots, ChangeTrackedDict):
            roots.changed = False
            self._members_of[state.url] = roots
        saved_members = self._saved_members.get(state.url, set())
        if len(saved_members) != len(state.member_roots) or not saved_members >= state.member_roots.keys():
            members = set(state.member_roots)
            put = {m: " ".join(sorted(state.member_roots[m])) for m in members - saved_members}
            if put:
                c.member_puts[state.url] = put
            if saved_members - members:
                c.member_deletes[state.url] = list(saved_members - members)
            self._saved_members[state.url] = members

    def _not_saved(self, c: _Changes) -> None:
        """The write failed: what ``_collect`` took as saved is written again next time."""
        for url in c.records:
            self._saved_records.pop(url, None)
            self._record_keys.pop(url, None)
        for url in set(c.puts) | set(c.deletes):  # written again whole next time
            self._saved_confirmed.pop(url, None)
            self._signatures.pop(url, None)
        for url in set(c.member_puts) | set(c.member_deletes):
            self._saved_members.pop(url, None)
            self._members_of.pop(url, None)

    def close(self) -> None:
        self.store.close()


def _signature(confirmed) -> tuple:
    """Cheap to take every save: a new object (cleared), an item added, a level raised. The
    object itself, compared by identity: held here, it cannot be freed and its id given to
    the object that replaced it (an id alone could not tell them apart)."""
    return (confirmed, len(confirmed.root_events), len(confirmed.repos),
            countOf(confirmed.repos.values(), memory.SyncLevel.FULL))  # (in C: a Python sum was a tenth of a save)
