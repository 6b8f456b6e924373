"""state_dir: the database that survives restarts (ops.store), what is kept of each relay
(sync.memory) and of the rejected index, and what happens to bad, foreign or shared state."""
import errno
import json
import os
import sqlite3

import pytest

from gsync import constants
from gsync.io.manager import saved_state
from gsync.io.manager.saved_state import SavedState
from gsync.ops.store import (
    DB_NAME,
    KEEP_MOVED_ASIDE,
    SCHEMA_VERSION,
    StateDiskFailing,
    StateLocked,
    StateRefused,
    StateStore,
    StateTooNew,
    StateUnwritable,
    environmental,
)
from gsync.protocol.filters import Filter
from gsync.sync import memory
from gsync.sync.health import RelayHealthTracker
from gsync.sync.policy import CoveragePauses, coverage_key
from gsync.sync.rejected import RejectedIndex, repo_key
from gsync.sync.relay_state import RelayState
from gsync.sync.repos import SyncLevel
from gsync.sync.targets import SyncItems

from . import factory as f

alice, carol = f.Author.named("alice"), f.Author.named("carol")
REPO = f.repo_addr(alice, "proj")
URL = "wss://remote.example.com"
NOW = 1_700_000_000.0


class _Log:
    def __init__(self):
        self.lines = []

    def warning(self, event, **kw):
        self.lines.append((event, kw))

    info = debug = error = warning


def _store(path, log=None):
    return StateStore.open(str(path), log or _Log())


def _refusals(n, **kw):
    index = RejectedIndex(**kw)
    events = [f.issue(carol, REPO, content=f"n{i}") for i in range(n)]
    for event in events:
        index.add(event, NOW, URL)
    return index, events


# -- the database ------------------------------------------------------------------------


def test_a_new_state_dir_gets_a_wal_database_at_the_current_schema(tmp_path):
    store = _store(tmp_path / "state")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_a_second_instance_on_one_state_dir_is_refused_until_the_first_is_gone(tmp_path):
    first = _store(tmp_path)
    with pytest.raises(StateLocked, match="in use by another gsync .pid \\d+.: one instance per state_dir"):
        _store(tmp_path)
    first.close()
    _store(tmp_path).close()


def test_a_state_dir_gsync_cannot_write_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateRefused, match="cannot use state_dir .*file/state"):
        _store(blocker / "state")


def test_a_database_written_by_a_newer_gsync_is_refused_and_kept(tmp_path):
    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StateTooNew, match="newer gsync"):
        _store(tmp_path)
    assert os.path.exists(tmp_path / DB_NAME)  # never silently dropped
    _store_lock_free = StateStore(str(tmp_path), _Log())
    _store_lock_free._lock()  # the refusal released the lock


@pytest.mark.parametrize("content", [b"not a database at all" * 100, None], ids=["garbage", "truncated"])
def test_a_corrupt_or_truncated_database_is_moved_aside_and_gsync_starts_fresh(tmp_path, content):
    if content is None:  # a real database cut short
        store = _store(tmp_path)
        store.save(NOW, rejected_puts=[(f"{i:064x}", "[1,2,\"\",[],1,null,null]") for i in range(3000)])
        store.close()
        os.remove(tmp_path / (DB_NAME + "-wal")) if os.path.exists(tmp_path / (DB_NAME + "-wal")) else None
        with open(tmp_path / DB_NAME, "r+b") as fh:
            fh.truncate(os.path.getsize(tmp_path / DB_NAME) // 3)
    else:
        (tmp_path / DB_NAME).write_bytes(content)
    log = _Log()
    store = _store(tmp_path, log)
    assert [event for event, _ in log.lines] == ["state_moved_aside"]
    assert store.rejected_rows() == [] and store.relay_memories() == {}
    assert any(name.startswith(DB_NAME + ".bad-") for name in os.listdir(tmp_path))
    store.close()


def test_non_utf8_content_is_moved_aside_and_gsync_starts_fresh(tmp_path):
    store = _store(tmp_path)
    store.db.execute("INSERT INTO rejected (id, entry) VALUES (?, CAST(? AS TEXT))", ("a" * 64, b"\xff\xfe["))
    store.close()
    log = _Log()
    saved = SavedState(_store(tmp_path, log), NOW)
    index = saved.load(NOW)
    assert len(index) == 0
    assert [event for event, _ in log.lines].count("state_moved_aside") == 1
    assert saved.store.rejected_rows() == []
    saved.close()


# -- the rejected index ------------------------------------------------------------------


def test_the_old_rejected_json_is_migrated_once_and_kept_beside(tmp_path):
    index, events = _refusals(3)
    (tmp_path / "rejected.json").write_text(index.dumps())
    saved = SavedState(_store(tmp_path), NOW)
    assert {e.id for e in events} <= {eid for _, eid in saved.load(NOW).items()}
    saved.close()
    assert not os.path.exists(tmp_path / "rejected.json")
    assert os.path.exists(tmp_path / "rejected.json.migrated")
    (tmp_path / "rejected.json").write_text(RejectedIndex().dumps())  # an old gsync ran since
    saved = SavedState(_store(tmp_path), NOW)
    assert len(saved.load(NOW)) == 3  # read once: the database is the truth now
    saved.close()


def test_a_non_utf8_rejected_json_is_moved_aside(tmp_path):
    (tmp_path / "rejected.json").write_bytes(b'{"cold": {"\xff": 1}}')
    log = _Log()
    saved = SavedState(_store(tmp_path, log), NOW)
    assert len(saved.load(NOW)) == 0
    assert [event for event, _ in log.lines] == ["state_moved_aside"]
    assert any(n.startswith("rejected.json.bad-") for n in os.listdir(tmp_path))
    saved.close()


def test_the_rejected_index_is_written_by_change_and_read_back(tmp_path):
    saved = SavedState(_store(tmp_path), NOW)
    index = saved.load(NOW)
    for i in range(50):
        index.add(f.issue(carol, REPO, content=f"n{i}"), NOW, URL)
    saved.save({}, RelayHealthTracker(), index, NOW, ready=True)
    assert index.take_changes() == ([], [])  # saved: nothing left to write
    extra = f.issue(carol, REPO, content="one more")
    index.add(extra, NOW, URL)
    gone = next(eid for _, eid in index.items())
    index.remove(gone)
    puts, deletes = index.take_changes()
    assert [eid for eid, _ in puts] == [extra.id] and deletes == [gone]  # two rows, not 51
    index.keep_changes([extra.id, gone])
    saved.save({}, RelayHealthTracker(), index, NOW + 1, ready=True)
    saved.close()
    again = SavedState(_store(tmp_path), NOW)
    reloaded = again.load(NOW + 2)
    assert len(reloaded) == 50 and extra.id in reloaded and gone not in reloaded
    assert reloaded.any_may_match(Filter.make(kinds=[1621], tags={"a": [REPO]}))
    _, cold = reloaded.take_dependents({repo_key(REPO)}, NOW + 2)
    assert (extra.id, URL) in cold  # its relay came back too: it is fetched again from there
    again.close()


def test_an_entry_with_huge_tags_is_stored_loose_and_the_index_is_bounded_in_bytes():
    huge = f.issue(carol, REPO, extra_tags=[["e", "x" * 65536], ["a", "30617:" + "y" * 65536]])
    index = RejectedIndex()
    index.add(huge, NOW, URL)
    assert index.bytes < 2_000
    puts, _ = index.take_changes()
    assert len(puts[0][1]) < 2_000
    # loose: it may match any filter, so it is never fetched again
    assert index.any_may_match(Filter.make(kinds=[1621], tags={"a": ["30617:someone:else"]}))
    small, _ = _refusals(100, max_bytes=20 * 450)
    assert small.bytes <= 20 * 450 and 10 < len(small) < 100  # the oldest made room


# -- what is kept of a relay -------------------------------------------------------------


def _learnt_relay():
    state = RelayState(URL)
    state.max_message_learned, state.max_filters_learned, state.max_subscriptions_learned = 30_000, 3, 6
    state.last_connected, state.disconnected_at, state.next_daily_at = NOW - 50, NOW - 40, NOW + 80_000
    state.announcements_synced = True
    state.nip77_failed_at = NOW - 100
    state.ids_unserved_at = NOW - 50
    state.precise_queries = True
    state.precise_refused_at = NOW - 45
    state.filters_answered = True
    state.unreached = True
    state.subscriptions_learned_at = NOW - 70
    state.max_values_learned, state.values_learned_at = 25, NOW - 60
    q = Filter.make(kinds=[1], tags={"q": ["x"]})
    state.paused.pause(coverage_key(q), NOW - 10)
    return state, q


def test_whatever_changes_a_relays_record_changes_its_key():
    """A save builds a relay's record only when ``memory.record_key`` changed: every field
    the record holds, the health fields and the pauses included, must change the key."""
    from gsync.sync.status import ConnectionStatus

    state, q = _learnt_relay()
    health = RelayHealthTracker()

    def now_():
        return (memory.record_key(state, health.values(URL, memory.HEALTH_VALUES)),
                memory.relay_memory(state, health.snapshot(URL, memory.HEALTH_FIELDS)))

    changes = [lambda name=name, i=i: setattr(state, name, NOW + i) for i, name in enumerate(
        ("last_connected", "disconnected_at", "next_daily_at", "nip77_failed_at", "ids_unserved_at",
         "subscriptions_learned_at", "values_learned_at", "precise_refused_at"))]
    changes += [lambda name=name: setattr(state, name, 7) for name in
                ("max_message_learned", "max_filters_learned", "max_subscriptions_learned", "max_values_learned")]
    changes += [lambda: setattr(state, "announcements_synced", False),
                lambda: setattr(state, "precise_queries", False),
                lambda: setattr(state, "precise_refused_at", None),
                lambda: setattr(state, "filters_answered", False),
                lambda: setattr(state, "unreached", False),
                lambda: (setattr(state.current, "link", 1), setattr(state, "status", ConnectionStatus.SYNCING)),
                lambda: state.paused.pause(coverage_key(Filter.make(kinds=[1], tags={"e": ["y"]})), NOW),
                lambda: state.paused.kinds_refused(coverage_key(q)),
                lambda: state.paused.due_probes(NOW + 10 ** 6),  # probing now: saved as due at once
                lambda: health.record_failure(URL, NOW), lambda: health.record_failure(URL, NOW + 5),
                lambda: health.record_rate_limited(URL, NOW + 6),
                lambda: health.is_rate_limited(URL, NOW + 100),  # over: probing, ended at NOW + 71
                lambda: health.record_rate_limited(URL, NOW + 101),  # refused again: one more in the row
                lambda: (health.record_success(URL, NOW + 7), health.record_disconnect(URL, NOW + 8, misbehaved=True))]
    key, record = now_()
    for i, change in enumerate(changes):
        change()
        new_key, new_record = now_()
        assert new_record != record, i  # (the change is one the record holds)
        assert new_key != key, i
        key, record = new_key, new_record
    assert now_()[0] == key  # and nothing else does


def test_a_relays_memory_round_trips_through_json():
    state, q = _learnt_relay()
    health = RelayHealthTracker()
    for i in range(4):
        health.record_failure(URL, NOW - 30 + i)
    for i in range(3):  # three query-rate episodes: a pace of 2.4 s learnt
        health.record_rate_limited(URL, NOW - 3000 + 1000 * i)
    record = json.loads(json.dumps(memory.relay_memory(state, health.snapshot(URL, memory.HEALTH_FIELDS))))
    back = RelayState(URL)
    saved_health = memory.restore_relay(back, record, saved_at=NOW)
    assert (back.max_message_learned, back.max_filters_learned, back.max_subscriptions_learned) == (30_000, 3, 6)
    assert back.paused.is_filter_paused(q) and back.paused.keys() == state.paused.keys()
    assert (back.last_connected, back.disconnected_at) == (NOW - 50, NOW - 40)  # not connected at the save
    assert back.next_daily_at == NOW + 80_000 and back.nip77_failed_at == NOW - 100
    assert back.ids_unserved_at == NOW - 50 and back.precise_queries and back.filters_answered
    assert back.precise_refused and back.precise_refused_at == NOW - 45  # (forgotten a month after)
    assert back.unreached  # (what REQ pages left there is synced when its rest from NIP-77 ends)
    assert back.subscriptions_learned_at == NOW - 70  # (the cap is judged again a week after)
    assert (back.max_values_learned, back.values_learned_at) == (25, NOW - 60)  # (likewise)
    restored = RelayHealthTracker()
    restored.restore(URL, saved_health)
    assert restored.failures(URL, NOW) == 4
    assert restored.next_attempt_at(URL, NOW) == health.next_attempt_at(URL, NOW)  # same backoff
    assert restored.start_interval(URL, NOW) == health.start_interval(URL, NOW) == pytest.approx(2.4)
    edited = RelayHealthTracker()  # a record edited by hand: what cannot be read is forgotten
    edited.restore(URL, dict(saved_health, learned_gap="slow", cooldown_until=[1]))
    assert edited.start_interval(URL, NOW) == 1.0 and not edited.is_rate_limited(URL, NOW)
    edited.restore(URL, dict(saved_health, learned_gap=1e9))  # (at most the reactive gate's most)
    assert edited.start_interval(URL, NOW) == constants.REACTIVE_GATE_MAX_SECS


def test_a_row_of_cooldowns_goes_on_across_a_restart():
    """A relay limiting for minutes refuses the first request after each cooldown, and each
    cooldown of the row is twice the last (65, 130, 260 s): a restart in the middle of the
    row goes on with it, not at 65 s again (one more refused request a minute)."""
    health = RelayHealthTracker()
    now = NOW
    health.record_rate_limited(URL, now)
    for _ in range(2):
        now += health.cooldown_remaining(URL, now) + 5
        health.record_rate_limited(URL, now)
    assert health.cooldown_remaining(URL, now) == 260
    now += 265  # over, probing: saved so, then a restart
    assert not health.is_rate_limited(URL, now)
    record = json.loads(json.dumps(memory.relay_memory(RelayState(URL), health.snapshot(URL, memory.HEALTH_FIELDS))))
    restored = RelayHealthTracker()
    restored.restore(URL, memory.restore_relay(RelayState(URL), record, saved_at=now))
    restored.record_rate_limited(URL, now + 10)  # the first request after the restart, refused
    assert restored.cooldown_remaining(URL, now + 10) == 520
    fresh = RelayHealthTracker()  # (a row never saved began again)
    fresh.restore(URL, dict(record["health"], cooldowns_in_a_row=None, probing=None))
    fresh.record_rate_limited(URL, now + 10)
    assert fresh.cooldown_remaining(URL, now + 10) == 65
    for junk in ("3", True, -2, 1.5, [1]):  # a record edited by hand: that count forgotten
        edited = RelayHealthTracker()
        edited.restore(URL, dict(record["health"], cooldowns_in_a_row=junk))
        edited.record_rate_limited(URL, now + 10)
        assert edited.cooldown_remaining(URL, now + 10) == 130


def test_a_relay_connected_at_the_last_save_was_last_connected_then():
    state, _ = _learnt_relay()
    record = memory.relay_memory(state, {})
    record["connected"] = True
    back = RelayState(URL)
    memory.restore_relay(back, record, saved_at=NOW - 5)
    assert back.last_connected == back.disconnected_at == NOW - 5
    assert not back.should_fresh_start(NOW)  # a quick reconnect
    assert back.should_fresh_start(NOW + 16 * 60)


def test_a_refusal_of_notes_saved_before_it_was_dated_counts_from_that_save():
    state, _ = _learnt_relay()
    record = json.loads(json.dumps(memory.relay_memory(state, {})))
    del record["precise_refused_at"]
    back = RelayState(URL)
    memory.restore_relay(back, record, saved_at=NOW - 5)
    assert back.precise_refused and back.precise_refused_at == NOW - 5


def test_a_malformed_or_foreign_relay_record_is_a_fresh_start():
    assert memory.restore_relay(RelayState(URL), {"v": 99}, NOW) is None
    assert memory.restore_relay(RelayState(URL), {"v": 1, "limits": {"max_filters": "x"}}, NOW) is None


def test_a_probe_out_at_the_save_is_due_at_once_after_a_restart():
    pauses = CoveragePauses()
    key = coverage_key(Filter.make(kinds=[1]))
    pauses.pause(key, NOW - 100_000)
    assert pauses.due_probes(NOW) == [key]
    back = CoveragePauses.restore(json.loads(json.dumps(pauses.snapshot())))
    assert back.is_paused(key) and back.due_probes(NOW) == [key]


def test_a_pause_refused_without_notes_too_keeps_that_verdict_over_a_restart_and_loses_it_with_the_pause():
    """A shape refused asked without notes too is not asked so again while its pause lasts,
    a restart included (each restart asked it so again: the simulator's seed 9012 of a
    precise-only world, relay2, ``refused_asked_again``); once the pause ends, neither is
    the verdict kept."""
    pauses = CoveragePauses()
    key = coverage_key(Filter.make(tags={"q": ["x"]}))
    other = coverage_key(Filter.make(ids=["a" * 64]))
    pauses.kinds_refused(key)  # (not paused: nothing to keep)
    assert not pauses.is_kinds_refused(key)
    pauses.pause(key, NOW)
    pauses.pause(other, NOW)
    pauses.kinds_refused(key)
    saved = json.loads(json.dumps(pauses.snapshot()))
    back = CoveragePauses.restore(saved)
    assert back.is_kinds_refused(key) and not back.is_kinds_refused(other)
    assert CoveragePauses.restore([entry[:2] for entry in saved]).is_paused(key)  # (an older file)
    assert back.due_probes(NOW + 100_000) and back.is_kinds_refused(key)  # (probing: still paused)
    back.probe_passed(key)
    assert not back.is_kinds_refused(key) and not back.is_paused(key)
    pauses.lift(key.__eq__)
    assert not pauses.is_kinds_refused(key) and pauses.key() != back.key()


def test_confirmed_items_are_saved_by_difference():
    items = SyncItems({REPO: SyncLevel.FULL, "30617:b:c": SyncLevel.STATE_ONLY}, {"r1", "r2"})
    rows = memory.confirmed_rows(items)
    back = memory.confirmed_from_rows(rows.items())
    assert back.repos == items.repos and back.root_events == items.root_events
    items.root_events.discard("r1")
    items.root_events.add("r3")
    items.repos["30617:b:c"] = SyncLevel.FULL
    put, delete = memory.confirmed_diff(back, items)
    assert put == {"r3": memory.ROOT_LEVEL, "30617:b:c": 2} and delete == ["r1"]
    items.repos.pop(REPO)
    assert memory.confirmed_diff(back, items)[1] == ["r1", REPO]


def test_repositories_a_relay_confirmed_that_are_not_known_now_are_lost_there():
    rows = {URL: [(REPO, 2), ("30617:b:c", 1), ("r1", memory.ROOT_LEVEL)],
            "wss://kept.example.com": [(REPO, 2)], "wss://roots.example.com": [("r2", memory.ROOT_LEVEL)]}
    assert memory.lost_repositories(rows, {REPO}) == {URL: frozenset({"30617:b:c"})}
    assert memory.lost_repositories(rows, set()) == {URL: frozenset({REPO, "30617:b:c"}),
                                                      "wss://kept.example.com": frozenset({REPO})}


def test_the_repositories_each_saved_relay_confirmed_are_taken_once_after_a_restart(tmp_path):
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state = RelayState(URL)
    state.confirmed = SyncItems({REPO: SyncLevel.FULL}, {"r1"})
    saved.save({URL: state}, RelayHealthTracker(), rejected, NOW, ready=True)
    saved.close()

    saved = SavedState(_store(tmp_path), NOW + 60)
    saved.load(NOW + 60)
    saved.restore(RelayState(URL), RelayHealthTracker())  # registered before the own relay's read: still asked
    assert saved.take_lost(set()) == {URL: frozenset({REPO})}
    assert saved.take_lost(set()) == {}  # once
    saved.close()


def test_saved_state_restores_relays_and_forgets_those_no_longer_registered(tmp_path):
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state, q = _learnt_relay()
    state.confirmed = SyncItems({REPO: SyncLevel.FULL}, {"r1"})
    other = RelayState("wss://gone.example.com")
    health = RelayHealthTracker()
    saved.save({URL: state, other.url: other}, health, rejected, NOW, ready=True)
    saved.close()

    saved = SavedState(_store(tmp_path), NOW + 60)
    rejected = saved.load(NOW + 60)
    back = RelayState(URL)
    saved.restore(back, RelayHealthTracker())
    assert back.confirmed.repos == {REPO: SyncLevel.FULL} and back.confirmed.root_events == {"r1"}
    assert back.paused.is_filter_paused(q) and back.max_filters_learned == 3
    saved.save({URL: back}, health, rejected, NOW + 70, ready=True)  # gone.example.com was not registered
    assert set(saved.store.relay_memories()) == {URL}
    saved.close()


def test_confirmed_items_replaced_by_an_object_of_the_same_shape_are_written(tmp_path):
    """A relay's confirmed items replaced by a new object (a fresh start clears them) with as
    many repositories, roots and full ones as the old: its rows are still written, even where
    the new object is given the freed old one's id (CPython reuses it at once)."""
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state, health = RelayState(URL), RelayHealthTracker()
    state.confirmed = SyncItems({REPO: SyncLevel.FULL}, {"r1"})
    saved.save({URL: state}, health, rejected, NOW, ready=True)
    for n in range(20):  # (whether an id comes back is up to the allocator: many tries)
        state.confirmed = SyncItems()  # the saved object freed: its id free for the next one
        state.confirmed = SyncItems({f"30617:x:{n}": SyncLevel.FULL}, {f"root{n}"})
        saved.save({URL: state}, health, rejected, NOW + 1 + n, ready=True)
        rows = dict(saved.store.confirmed_rows()[URL])
        assert rows == {f"30617:x:{n}": 2, f"root{n}": memory.ROOT_LEVEL}, n
    saved.close()


def test_the_last_saves_time_and_a_relays_newest_record_are_read_back(tmp_path):
    """Written by UPDATE where the row is (saved_at at every save, a changed record), by
    INSERT the first time: a restart reads the last of each, one row apiece."""
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state, health = RelayState(URL), RelayHealthTracker()
    state.last_connected = NOW - 100
    saved.save({URL: state}, health, rejected, NOW, ready=True)  # the record's first write
    saved.save({URL: state}, health, rejected, NOW + 10, ready=True)  # nothing changed but the time
    state.last_connected = NOW + 15
    saved.save({URL: state}, health, rejected, NOW + 20, ready=True)  # the record again
    saved.save({URL: state}, health, rejected, NOW + 30, ready=True)
    saved.close()

    again = SavedState(_store(tmp_path), NOW + 40)
    again.load(NOW + 40)
    assert again._prior_saved_at == NOW + 30
    back = RelayState(URL)
    again.restore(back, RelayHealthTracker())
    assert back.last_connected == NOW + 15
    rows = again.store.db.execute("SELECT count(*) FROM relays").fetchone()[0]
    keys = [k for k, in again.store.db.execute("SELECT key FROM meta")]
    assert rows == 1 and len(keys) == len(set(keys))
    again.close()


def test_a_database_of_an_older_schema_is_migrated_in_place(tmp_path):
    from gsync.ops.store import MIGRATIONS

    db = sqlite3.connect(tmp_path / DB_NAME)
    for sql in MIGRATIONS[0]:  # what the first gsync with a database wrote
        db.execute(sql)
    db.execute("INSERT INTO relays (url, memory, saved_at) VALUES (?, '{\"v\": 1}', 0)", (URL,))
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = _store(tmp_path)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert set(store.relay_memories()) == {URL} and store.member_rows() == {}
    store.close()


def test_thread_members_come_back_for_their_descendants(tmp_path):
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state, _ = _learnt_relay()
    state.member_roots = {"m1": frozenset({"r1"}), "m2": frozenset({"r1", "r2"})}
    state.current.members = {"m1", "m2"}
    saved.save({URL: state}, RelayHealthTracker(), rejected, NOW, ready=True)
    del state.member_roots["m1"]
    state.member_roots["m3"] = frozenset({"r2"})
    saved.save({URL: state}, RelayHealthTracker(), rejected, NOW + 1, ready=True)
    assert sorted(m for m, _ in saved.store.member_rows()[URL]) == ["m2", "m3"]
    saved.close()
    saved = SavedState(_store(tmp_path), NOW)
    saved.load(NOW)
    back = RelayState(URL)
    saved.restore(back, RelayHealthTracker())
    # as after a disconnect: their coverage is opened again by the next connection
    assert back.reopen_members == {"m2", "m3"} and back.member_roots["m2"] == {"r1", "r2"}
    saved.close()


def test_a_relays_own_members_table_is_written_when_it_changes_and_only_then(tmp_path):
    """A relay's member_roots (a ChangeTrackedDict) is compared with the rows written only
    after it changed: every change in place is still written."""
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state, _ = _learnt_relay()
    written = []
    save = saved.store.save

    def spy(*args, **kwargs):
        written.append((kwargs.get("member_puts") or {}, kwargs.get("member_deletes") or {}))
        save(*args, **kwargs)

    saved.store.save = spy
    health = RelayHealthTracker()
    state.member_roots["m1"] = frozenset({"r1"})
    state.member_roots.update(m2=frozenset({"r1", "r2"}))
    saved.save({URL: state}, health, rejected, NOW, ready=True)
    saved.save({URL: state}, health, rejected, NOW + 1, ready=True)  # unchanged: nothing written
    del state.member_roots["m1"]
    saved.save({URL: state}, health, rejected, NOW + 2, ready=True)
    state.member_roots["m3"] = frozenset({"r2"})
    saved.save({URL: state}, health, rejected, NOW + 3, ready=True)
    state.member_roots.pop("m2")
    saved.save({URL: state}, health, rejected, NOW + 4, ready=True)
    assert [(sorted(p.get(URL, {})), sorted(d.get(URL, []))) for p, d in written] == [
        (["m1", "m2"], []), ([], []), ([], ["m1"]), (["m3"], []), ([], ["m2"])]
    assert sorted(m for m, _ in saved.store.member_rows()[URL]) == ["m3"]
    saved.close()


def test_a_failed_save_leaves_everything_it_held_to_the_next_save(tmp_path):
    saved = SavedState(_store(tmp_path, _Log()), NOW)
    rejected = saved.load(NOW)
    state, q = _learnt_relay()
    state.confirmed = SyncItems({REPO: SyncLevel.FULL}, {"r1"})
    state.member_roots = {"m1": {"r1"}}
    health = RelayHealthTracker()
    write = saved.store.save

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    saved.store.save = disk_full
    saved.save({URL: state}, health, rejected, NOW, ready=True)
    saved.store.save = write
    saved.save({URL: state}, health, rejected, NOW + 1, ready=True)  # nothing changed since
    saved.close()

    saved = SavedState(_store(tmp_path), NOW + 60)
    saved.load(NOW + 60)
    back = RelayState(URL)
    saved.restore(back, RelayHealthTracker())
    assert back.confirmed.repos == {REPO: SyncLevel.FULL} and back.confirmed.root_events == {"r1"}
    assert back.paused.is_filter_paused(q) and back.max_filters_learned == 3
    assert back.reopen_members == {"m1"}
    saved.close()


def test_the_witnesses_written_follow_every_change_and_a_failed_save_leaves_them_to_the_next(tmp_path):
    """A save snapshots the own relay's witnesses only when they changed since the last
    save that worked (``OwnWitness.version``): whatever changed them (stored, judged gone),
    the next process asks for what this one last knew."""
    from gsync.sync.own_held import HeldEntry
    from gsync.sync.own_witness import OwnWitness

    def issue(i):
        return f"{i:064x}", HeldEntry(NOW, 1621, "a" * 64, ())

    def next_process_asks(path):
        later = SavedState(_store(path), NOW + 60)
        later.load(NOW + 60)
        asked = OwnWitness().restore(later.take_witnesses())
        later.close()
        return asked

    saved = SavedState(_store(tmp_path, _Log()), NOW)
    rejected = saved.load(NOW)
    witness = OwnWitness(size=4)
    witness.stored([issue(1), issue(2)])
    saved.save({}, RelayHealthTracker(), rejected, NOW, ready=True, witness=witness)
    saved.save({}, RelayHealthTracker(), rejected, NOW + 1, ready=True, witness=witness)  # unchanged
    witness.stored([issue(3)])
    saved.save({}, RelayHealthTracker(), rejected, NOW + 2, ready=True, witness=witness)
    saved.close()
    assert next_process_asks(tmp_path) == [issue(3)[0], issue(2)[0], issue(1)[0]]

    saved = SavedState(_store(tmp_path, _Log()), NOW + 3)
    rejected = saved.load(NOW + 3)
    saved.save({}, RelayHealthTracker(), rejected, NOW + 3, ready=True, witness=witness)
    assert witness.judge([issue(2)[0]], []) == [issue(2)[0]]  # the own relay lost it
    write = saved.store.save

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    saved.store.save = disk_full
    saved.save({}, RelayHealthTracker(), rejected, NOW + 4, ready=True, witness=witness)
    saved.store.save = write
    saved.save({}, RelayHealthTracker(), rejected, NOW + 5, ready=True, witness=witness)  # unchanged since
    saved.close()
    assert next_process_asks(tmp_path) == [issue(3)[0], issue(1)[0]]


def test_a_save_is_due_every_30_s_after_a_message_or_a_failed_save_and_every_minute_on_ticks_alone(tmp_path):
    """``SavedState.due``: the manager marks a message (``SyncManager.apply``); a save that
    failed is tried again at the next STATE_SAVE_SECS with or without one."""
    saved = SavedState(_store(tmp_path, _Log()), NOW)
    rejected = saved.load(NOW)
    short, quiet = constants.STATE_SAVE_SECS, constants.STATE_QUIET_SAVE_SECS
    assert not saved.due(NOW + short) and saved.due(NOW + quiet)
    saved.note_message()
    assert not saved.due(NOW + short - 1) and saved.due(NOW + short)
    write = saved.store.save

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    saved.store.save = disk_full
    saved.save({}, RelayHealthTracker(), rejected, NOW + short, ready=True)
    assert saved.due(NOW + 2 * short)  # no message since: the failure is reason enough
    saved.store.save = write
    saved.save({}, RelayHealthTracker(), rejected, NOW + 2 * short, ready=True)
    assert not saved.due(NOW + 3 * short) and saved.due(NOW + 2 * short + quiet)
    saved.close()


# -- the disk and the permissions are not the database's fault (issue 39) ---------------------


def _sqlite_error(connect, statement):
    db = connect()
    try:
        with pytest.raises(sqlite3.Error) as raised:
            db.execute(statement)
    finally:
        db.close()
    return raised.value


def test_only_a_bad_file_is_bad_the_disk_and_the_permissions_name_their_fix(tmp_path):
    path = str(tmp_path / "x.db")
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (v BLOB)")
    db.close()
    read_only = _sqlite_error(lambda: sqlite3.connect(f"file:{path}?mode=ro", uri=True),
                              "INSERT INTO t VALUES (1)")

    def capped():  # a database that may not grow: SQLite's own SQLITE_FULL
        db = sqlite3.connect(path)
        db.execute("PRAGMA max_page_count = 2")
        return db

    full = _sqlite_error(capped, "INSERT INTO t VALUES (zeroblob(100000))")
    (tmp_path / "junk.db").write_bytes(b"not a database " * 100)
    junk = _sqlite_error(lambda: sqlite3.connect(tmp_path / "junk.db"), "SELECT * FROM t")
    d = str(tmp_path)

    assert isinstance(environmental(read_only, d, path), StateUnwritable)
    assert "is full" in str(environmental(full, d, path))
    assert isinstance(environmental(full, d, path), StateDiskFailing)
    assert environmental(junk, d, path) is None  # only this one is moved aside
    for code, kind, says in ((errno.EACCES, StateUnwritable, "writable by the user gsync runs as"),
                             (errno.EROFS, StateUnwritable, "writable"),
                             (errno.ENOSPC, StateDiskFailing, "free space there"),
                             (errno.EIO, StateDiskFailing, "check the disk")):
        refusal = environmental(OSError(code, os.strerror(code), path), d, path)
        assert isinstance(refusal, kind) and says in str(refusal), refusal


def test_a_full_disk_while_loading_stops_gsync_and_never_moves_the_database_aside(tmp_path):
    saved = SavedState(_store(tmp_path), NOW)
    rejected, _ = _refusals(5)
    saved.save({}, RelayHealthTracker(), rejected, NOW, ready=False)
    saved.close()
    (tmp_path / "rejected.json").write_text(_refusals(200)[0].dumps())  # to migrate: a big write
    log = _Log()
    saved = SavedState(_store(tmp_path, log), NOW)
    pages = saved.store.db.execute("PRAGMA page_count").fetchone()[0]
    saved.store.db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full

    with pytest.raises(StateDiskFailing, match="is full .*free space there"):
        saved.load(NOW)
    assert [event for event, _ in log.lines] == []  # nothing moved aside
    assert not [n for n in os.listdir(tmp_path) if ".bad-" in n]
    saved = SavedState(_store(tmp_path), NOW)  # space again: everything is there
    assert len(saved.load(NOW)) == 5 + 200 and not saved.store.moved_aside  # saved, migrated
    saved.close()


def test_only_the_newest_three_moved_aside_databases_are_kept(tmp_path):
    for stamp in ("20250101T000000", "20250102T000000", "20250103T000000", "20250104T000000"):
        for suffix in ("", "-wal"):
            (tmp_path / f"{DB_NAME}.bad-{stamp}{suffix}").write_bytes(b"old")
    (tmp_path / DB_NAME).write_bytes(b"\xff not a database " * 100)
    store = _store(tmp_path)
    store.close()
    kept = sorted(n for n in os.listdir(tmp_path) if ".bad-" in n and not n.endswith("-wal"))
    assert len(kept) == KEEP_MOVED_ASIDE == 3
    assert kept[:2] == [f"{DB_NAME}.bad-20250103T000000", f"{DB_NAME}.bad-20250104T000000"]
    assert os.path.basename(store.moved_aside[0]) == kept[2]
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith("-wal")) == [
        f"{DB_NAME}.bad-20250103T000000-wal", f"{DB_NAME}.bad-20250104T000000-wal"]


def test_the_rejected_index_keeps_its_order_across_a_restart(tmp_path):
    """Rows come back in id order; the next to go is still the oldest refusal, and the rows
    the bound leaves out at load leave the database."""
    events = [f.issue(carol, REPO, content=f"n{i}") for i in range(6)]
    by_id = sorted(events, key=lambda e: e.id)
    index = RejectedIndex(max_entries=6)
    for i, event in enumerate(reversed(by_id)):  # the largest id refused first
        index.add(event, NOW + i, URL)
    saved = SavedState(_store(tmp_path), NOW)
    saved.load(NOW)
    saved.save({}, RelayHealthTracker(), index, NOW + 10, ready=False)
    saved.close()

    store = _store(tmp_path)
    back, drop = RejectedIndex.from_rows(store.rejected_rows(), NOW + 20, max_entries=4)
    store.close()
    oldest_two = {by_id[-1].id, by_id[-2].id}
    assert set(drop) == oldest_two and not oldest_two & {eid for _, eid in back.items()}
    back.add(f.issue(carol, REPO, content="newest"), NOW + 20, URL)
    assert by_id[-3].id not in back and by_id[0].id in back  # the oldest refusal made room


def test_rows_evicted_at_load_leave_the_database(tmp_path, monkeypatch):
    events = [f.issue(carol, REPO, content=f"n{i}") for i in range(6)]
    index = RejectedIndex()
    for i, event in enumerate(events):
        index.add(event, NOW + i, URL)
    saved = SavedState(_store(tmp_path), NOW)
    saved.load(NOW)
    saved.save({}, RelayHealthTracker(), index, NOW + 10, ready=False)
    saved.close()
    class FourAtMost(RejectedIndex):
        def __init__(self, **kw):
            super().__init__(**{"max_entries": 4, **kw})

    monkeypatch.setattr(saved_state, "RejectedIndex", FourAtMost)

    saved = SavedState(_store(tmp_path), NOW + 20)
    assert {eid for _, eid in saved.load(NOW + 20).items()} == {e.id for e in events[2:]}
    rows = {eid for eid, _ in saved.store.rejected_rows()}
    assert rows == {e.id for e in events[2:]}  # the two oldest refusals are gone from disk too
    saved.close()


def test_stale_relay_rows_go_at_the_next_save_that_works(tmp_path):
    saved = SavedState(_store(tmp_path), NOW)
    rejected = saved.load(NOW)
    state, _ = _learnt_relay()
    other = RelayState("wss://gone.example.com")
    health = RelayHealthTracker()
    saved.save({URL: state, other.url: other}, health, rejected, NOW, ready=True)
    saved.close()

    saved = SavedState(_store(tmp_path, _Log()), NOW + 60)
    rejected = saved.load(NOW + 60)
    write = saved.store.save

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    saved.store.save = disk_full
    saved.save({}, health, rejected, NOW + 70, ready=True)  # neither was registered again: stale
    assert saved.save_error == "database or disk is full" and saved.saved_at == NOW + 60  # its open
    saved.store.save = write
    saved.save({}, health, rejected, NOW + 80, ready=True)
    assert saved.store.relay_memories() == {} and saved.store.confirmed_rows() == {}
    assert saved.save_error is None and saved.saved_at == NOW + 80
    saved.close()
