"""A historic batch's phase table (``sync.batch_phase``): every move, and every move it
lacks, exhaustively; and what the phase says of the batch (``PendingBatch.started``,
``residual_retried``, ``residual_by_filter``)."""
import pytest

from gsync.sync.batch_phase import (
    RESIDUAL,
    STARTED,
    TRANSITIONS,
    BatchPhase,
    IllegalBatchMove,
    Step,
)
from gsync.sync.pending import PendingBatch
from gsync.sync.targets import PendingItems

P, S = BatchPhase, Step

EXPECTED = {
    (P.QUEUED, S.WAITS_FOR_LEAD): P.FOLLOWING,
    (P.QUEUED, S.READS_OWN): P.READING_OWN,
    (P.FOLLOWING, S.READS_OWN): P.READING_OWN,
    (P.READING_OWN, S.METHODS_CHOSEN): P.QUEUED,
    (P.QUEUED, S.JOINED): P.JOINED,
    (P.QUEUED, S.FIRST_START): P.STARTED,
    (P.STARTED, S.IDS_ASKED_AGAIN): P.IDS_RETRIED,
    (P.STARTED, S.ASKED_BY_FILTER): P.BY_FILTER,
    (P.IDS_RETRIED, S.ASKED_BY_FILTER): P.BY_FILTER_AFTER_RETRY,
    (P.QUEUED, S.CONFIRMED): P.DONE,
    (P.STARTED, S.CONFIRMED): P.DONE,
    (P.IDS_RETRIED, S.CONFIRMED): P.DONE,
    (P.BY_FILTER, S.CONFIRMED): P.DONE,
    (P.BY_FILTER_AFTER_RETRY, S.CONFIRMED): P.DONE,
}


def batch_in(phase: BatchPhase) -> PendingBatch:
    b = PendingBatch(7, PendingItems())
    b.phase = phase
    return b


def test_the_table_is_the_lifecycle_written_out():
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize(("phase", "step"), sorted(EXPECTED, key=lambda k: (k[0].value, k[1].value)),
                         ids=lambda v: v.name)
def test_every_legal_move(phase, step):
    b = batch_in(phase)
    assert b.move(step) is EXPECTED[phase, step]
    assert b.phase is EXPECTED[phase, step]


ILLEGAL = sorted(((p, s) for p in P for s in S if (p, s) not in EXPECTED),
                 key=lambda k: (k[0].value, k[1].value))


@pytest.mark.parametrize(("phase", "step"), ILLEGAL, ids=lambda v: v.name)
def test_every_other_move_raises_and_leaves_the_phase(phase, step):
    b = batch_in(phase)
    with pytest.raises(IllegalBatchMove) as raised:
        b.move(step)
    assert (raised.value.batch_id, raised.value.phase, raised.value.step) == (7, phase, step)
    assert b.phase is phase


def test_gone_batches_move_no_more():
    """A batch that joined another, or confirmed, is out of every table: any step on it is
    a caller's bug (confirming twice, say)."""
    assert not any(p in (P.JOINED, P.DONE) for p, _ in TRANSITIONS)


def test_every_phase_is_reached_and_every_live_phase_ends():
    reached = {P.QUEUED} | set(TRANSITIONS.values())
    assert reached == set(P)
    ends = {p for p, s in TRANSITIONS if s in (S.CONFIRMED, S.JOINED)}
    # waiting for a lead or for the own relay's answer always ends in a choice first
    assert ends == set(P) - {P.FOLLOWING, P.READING_OWN, P.JOINED, P.DONE}


def test_what_the_phase_says_of_the_batch():
    b = PendingBatch(1, PendingItems())
    assert (b.phase, b.started, b.residual_retried, b.residual_by_filter) == (P.QUEUED, False, False, False)
    for step in (S.READS_OWN, S.METHODS_CHOSEN):
        b.move(step)
        assert not b.started
    b.move(S.FIRST_START)
    assert (b.started, b.residual_retried, b.residual_by_filter) == (True, False, False)
    b.move(S.IDS_ASKED_AGAIN)
    assert (b.started, b.residual_retried, b.residual_by_filter) == (True, True, False)
    b.move(S.ASKED_BY_FILTER)
    assert (b.started, b.residual_retried, b.residual_by_filter) == (True, True, True)
    direct = batch_in(P.STARTED)
    direct.move(S.ASKED_BY_FILTER)
    assert (direct.residual_retried, direct.residual_by_filter) == (False, True)
    assert set(STARTED) == {P.STARTED, *RESIDUAL}


# -- the manager moves its batches through the table (in process) -------------------------


def test_a_relays_first_sync_moves_its_batches_through_the_table(tmp_path):
    """Layer 1 and the first AddFilters read the own relay; it holds nothing, so both go by
    REQ pages and the AddFilters joins layer 1's batch (one start carries both); layer 1's
    batch starts, ends DONE, and nothing is left pending."""
    from gsync.sync.pending import BatchKind
    from gsync.sync.relay_state import ConnectionStatus

    from .manager_harness import ManagerHarness
    from .test_manager_decisions import A, listed_on

    h = ManagerHarness(tmp_path)
    h.own_relay_holds(*listed_on(A, 3))
    h.connect(A)
    batches = list(h.state(A).current.pending.values())
    assert [b.kind for b in batches] == [BatchKind.LAYER1, BatchKind.SYNC]
    assert [b.phase for b in batches] == [P.READING_OWN, P.READING_OWN]
    h.answer_own_reads()
    layer1, sync = batches
    assert (layer1.phase, sync.phase) == (P.STARTED, P.JOINED)
    assert list(h.state(A).current.pending) == [layer1.batch_id]
    h.settle(A)
    assert h.state(A).status is ConnectionStatus.CONNECTED and not h.state(A).current.pending
    assert (layer1.phase, sync.phase) == (P.DONE, P.JOINED)


def test_the_manager_raises_an_illegal_move_under_tests_and_only_logs_it_outside(monkeypatch):
    """``historic.move_batch``: as ``lifecycle.move_status`` for a relay's status."""
    from types import SimpleNamespace

    from gsync.io.manager.historic import move_batch

    state = SimpleNamespace(url="wss://a.example")
    b = batch_in(P.DONE)
    monkeypatch.setenv("GSYNC_STRICT_STATUS", "1")
    with pytest.raises(IllegalBatchMove):
        move_batch(state, b, S.CONFIRMED)  # confirmed twice
    monkeypatch.delenv("GSYNC_STRICT_STATUS")
    move_batch(state, b, S.CONFIRMED)  # logged (illegal_batch_move); the manager goes on
    assert b.phase is P.DONE
    move_batch(state, batch_in(P.QUEUED), S.FIRST_START)
