"""A historic batch's phase, and every move it can make, as one table.

As ``sync.status`` does for a relay's connection status: a ``PendingBatch``'s phase
changes only here, through ``move(batch, step)``, where ``step`` is what the manager did
with it (read the own relay for it, made it wait for a lead, sent its first start, asked
its residual again…) and ``TRANSITIONS`` says where that leads from each phase. A step the
table has no row for, from the phase the batch is in, is a bug in the caller: ``move``
raises ``IllegalBatchMove`` and leaves the phase as it was (the manager logs it, and
re-raises it under tests: GSYNC_STRICT_STATUS=1). Pure: no clock, no I/O.

The path of a batch::

    QUEUED ──waits for lead──> FOLLOWING ──reads own──> READING_OWN ──methods chosen──> QUEUED
      │ │└─────────────reads own──────────────────────────┘
      │ └──joined (another pending batch took its items)──> JOINED
      └──first start──> STARTED ──ids asked again──> IDS_RETRIED
                           │                            └──asked by filter──> BY_FILTER_AFTER_RETRY
                           └──asked by filter──> BY_FILTER
    (QUEUED, STARTED and the residual phases) ──confirmed──> DONE

What the phase does not say, because it is not where the batch is but how it got there
or what it is for, stays on the batch: ``failed`` (an outcome, set in any phase, read when
it confirms), ``follower``/``led_elsewhere``/``share_all``/``coalesce_wanted`` (which lead
it waited for and how its methods are to be chosen, read after the wait ended) and
``coalescable`` (a REQ batch of AddFilters or layer 1: it takes in later AddFilters,
before and after its first start).
"""
from __future__ import annotations

import enum


class BatchPhase(enum.Enum):
    QUEUED = "queued"  # nothing of it started: its starts (if any yet) wait in the relay's queue
    FOLLOWING = "following"  # waits for other relays' (or another shard's) lead on its items
    READING_OWN = "reading own"  # its methods wait for what the own relay holds of its filters
    STARTED = "started"  # a start of it went: later AddFilters queue beside it, not re-pack it
    IDS_RETRIED = "ids retried"  # NIP-77's residual asked by id once more
    BY_FILTER = "by filter"  # NIP-77's residual asked by the filters that found it
    BY_FILTER_AFTER_RETRY = "by filter after retry"  # the same, after the retry by id
    JOINED = "joined"  # its items went into another pending batch: it is gone
    DONE = "done"  # confirmed (failed or not): it is gone


class Step(enum.Enum):
    """What the manager did with a batch."""

    WAITS_FOR_LEAD = "waits for lead"
    READS_OWN = "reads own holdings"
    METHODS_CHOSEN = "methods chosen"
    FIRST_START = "first start"
    IDS_ASKED_AGAIN = "ids asked again"
    ASKED_BY_FILTER = "asked by filter"
    JOINED = "joined another batch"
    CONFIRMED = "confirmed"


P, S = BatchPhase, Step
RESIDUAL = (P.IDS_RETRIED, P.BY_FILTER, P.BY_FILTER_AFTER_RETRY)
STARTED = (P.STARTED, *RESIDUAL)  # a start of it went

TRANSITIONS: dict[tuple[BatchPhase, Step], BatchPhase] = {
    (P.QUEUED, S.WAITS_FOR_LEAD): P.FOLLOWING,
    (P.QUEUED, S.READS_OWN): P.READING_OWN,
    (P.FOLLOWING, S.READS_OWN): P.READING_OWN,
    (P.READING_OWN, S.METHODS_CHOSEN): P.QUEUED,
    (P.QUEUED, S.JOINED): P.JOINED,
    (P.QUEUED, S.FIRST_START): P.STARTED,
    (P.STARTED, S.IDS_ASKED_AGAIN): P.IDS_RETRIED,
    (P.STARTED, S.ASKED_BY_FILTER): P.BY_FILTER,
    (P.IDS_RETRIED, S.ASKED_BY_FILTER): P.BY_FILTER_AFTER_RETRY,
    **{(p, S.CONFIRMED): P.DONE for p in (P.QUEUED, *STARTED)},
}
del P, S


class IllegalBatchMove(Exception):
    def __init__(self, batch_id: int, phase: BatchPhase, step: Step):
        super().__init__(f"batch {batch_id}: no move from {phase.name} on {step.value}")
        self.batch_id, self.phase, self.step = batch_id, phase, step


def move(batch, step: Step) -> BatchPhase:
    """``batch.phase`` after ``step`` (``TRANSITIONS``); ``IllegalBatchMove``, the phase
    unchanged, if the table has no such move."""
    new = TRANSITIONS.get((batch.phase, step))
    if new is None:
        raise IllegalBatchMove(batch.batch_id, batch.phase, step)
    batch.phase = new
    return new
