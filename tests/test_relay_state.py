"""RelayState's small rules: the order queued starts go out in after a cooldown."""
from gsync.sync.batch_phase import BatchPhase
from gsync.sync.pending import BatchKind, PendingBatch
from gsync.sync.relay_state import RelayState
from gsync.sync.targets import PendingItems


def _batch(state, batch_id, sub_id, **marks):
    batch = PendingBatch(batch_id, PendingItems())
    for name, value in marks.items():
        setattr(batch, name, value)
    state.current.pending[batch_id] = batch
    state.current.sub_to_batch[sub_id] = batch_id
    state.current.historic_queue.append((sub_id, []))
    return batch


def test_after_a_cooldown_discovery_then_started_work_then_new_batches_then_upkeep():
    state = RelayState("wss://r.example")
    _batch(state, 7, "recovery", kind=BatchKind.RECOVERY)
    _batch(state, 5, "new-later")
    _batch(state, 3, "new-earlier")
    _batch(state, 9, "page", phase=BatchPhase.STARTED)
    _batch(state, 8, "discovery", kind=BatchKind.LAYER1)
    _batch(state, 6, "poll", kind=BatchKind.POLL)
    state.current.poll_batch = 6
    _batch(state, 4, "probe", kind=BatchKind.PROBE)
    state.current.probes[4] = ("key",)
    state.current.historic_queue.append(("gone", []))  # its batch ended meanwhile
    state.current.historic_queue.sort(key=lambda entry: state.current.start_priority(entry[0]))
    assert [sub for sub, _ in state.current.historic_queue] == [
        "discovery", "page", "new-earlier", "new-later", "probe", "poll", "recovery", "gone"]


def test_nip77_rests_a_day_after_it_was_advertised_and_not_served():
    from gsync.constants import NIP77_RETRY_SECS

    state = RelayState("wss://r")
    assert not state.nip77_resting(0)
    state.nip77_failed_at = 1_000.0
    assert state.nip77_resting(1_000.0 + NIP77_RETRY_SECS - 1)
    assert not state.nip77_resting(1_000.0 + NIP77_RETRY_SECS)
