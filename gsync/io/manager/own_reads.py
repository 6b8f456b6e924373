"""Own-relay holdings reads merged across batches and relays (``sync.own_reads``).

A batch that lacks part of its filters' holdings (``HistoricPlanner.ask_own_holdings``) waits
here instead of reading alone: within ``OWN_READ_WINDOW_SECS`` of the first such batch (and,
while a merged read is under way, until it lands) every waiting batch's unread values are
collected, read as one filter per (kinds, authors, tag) in chunks of the tag-value budget,
and each batch is answered from what the session then knows (``OwnHeld``), as if it had
read alone (``HistoricPlanner.holdings_read``). A read that fails or passes its deadline answers
every batch waiting on it as failed: each goes by REQ pages, as a batch whose own read
failed always has.
"""
from __future__ import annotations

from dataclasses import dataclass

from ... import constants
from ...ops.logging import get_logger
from ...sync import filter_plan
from ...sync.have_index import HaveIndex
from ...sync.own_reads import merged_reads
from .. import negentropy_sync
from ..inbox import OwnHoldingsRead, OwnReadsDue, OwnReadsLanded
from ..own_query import HeldItems

log = get_logger("gsync.manager")


@dataclass(slots=True)
class OwnReadWaiter:
    """A batch waiting for a merged read: its filters, and what of them it lacked."""

    relay: str
    session: int
    batch_id: int
    token: str
    filters: list
    reads: list  # OwnHeld.missing of each filter that lacked something
    fresh: bool  # a follower: not from a snapshot read before its leader's events came
    # read ahead for a batch that waits for another shard's lead (``HistoricSync.
    # wait_for_leaders``): learnt only, the batch asks once its wait is over
    ahead: bool = False


class OwnReads:
    """The batches waiting for a merged read of the own relay, and the reads under way:
    owned here, nowhere else. What the reads return is learnt into ``own_held`` (what the
    session knows the own relay holds, which historic sync reads too); waiting batches are
    looked up in ``relays``; reads run in greenlets (``effects``) that answer through
    ``post``, unless the own relay is ``busy()``."""

    def __init__(self, *, own_held, relays, effects, post, own_relay: str, ids, clock, busy):
        self.own_held = own_held
        self.relays = relays
        self.effects = effects
        self.post = post
        self.own_relay = own_relay
        self.ids = ids  # the manager's counter: read ids unique among its tokens
        self.clock = clock
        self.busy = busy
        # batches whose holdings wait for a read of the same values under way (one per batch
        # at most)
        self.awaited: list[OwnReadWaiter] = []
        # batches whose unread values wait for the next merged read (``sync.own_reads``),
        # and those a merged read under way will answer (by its id): one entry per batch
        self.queued: list[OwnReadWaiter] = []
        self.flying: dict[int, list[OwnReadWaiter]] = {}
        self.due = False  # the collecting window's timer is set
        # reads no batch waits for, only learnt (``learn``): with the next merged read
        self.unwaited: list = []

    def queue(self, waiter: OwnReadWaiter) -> None:
        """``waiter`` goes with the next merged read: when the window closes, or when the
        read under way lands."""
        self.queued.append(waiter)
        if not self.due and not self.flying:
            self.due = True
            self.effects.later(constants.OWN_READ_WINDOW_SECS, OwnReadsDue())

    def learn(self, filters) -> None:
        """Read what the own relay holds of ``filters`` with the next merged read, for what
        it tells (the thread members among it, ``OwnHeld.on_learn``), no batch waiting on
        it: what is known or being read already is not read again."""
        now = self.clock()
        reads = [read for flt in filters if (read := self.own_held.unread(flt, now)) is not None]
        if not reads:
            return
        self.unwaited += reads
        if not self.due and not self.flying:
            self.due = True
            self.effects.later(constants.OWN_READ_WINDOW_SECS, OwnReadsDue())

    def on_due(self, msg: OwnReadsDue) -> None:
        self.due = False
        if not self.flying:  # else when it lands
            self.read_queued()

    def read_queued(self) -> None:
        """One read of every value the queued batches lack (those still waiting)."""
        waiters, self.queued = self.queued, []
        waiters = [w for w in waiters if self.waiting(w) is not None]
        unwaited, self.unwaited = self.unwaited, []
        if not waiters and not unwaited:
            return
        reads = merged_reads([r for w in waiters for r in w.reads] + unwaited, filter_plan.tag_value_budget())
        for read in reads:
            self.own_held.begin(read)
        read_id = next(self.ids)
        self.flying[read_id] = waiters
        epoch = self.own_held.forgotten
        log.debug("own_reads_merged", read_id=read_id, batches=len(waiters),
                  asked=sum(len(w.reads) for w in waiters), reads=len(reads))
        handle = self.effects.spawn(negentropy_sync.read_merged, self.own_relay, reads,
                                    self.post, read_id=read_id, fresh=any(w.fresh for w in waiters),
                                    epoch=epoch, busy=self.busy)

        def died(exc) -> None:  # its answer will never come: this is it
            self.post(OwnReadsLanded(read_id, reads, None, f"own relay query failed: {type(exc).__name__}",
                                     epoch))

        self.effects.on_death(handle, died)

    def await_read(self, waiter: OwnReadWaiter) -> None:
        """``waiter`` needs values a merged read is reading right now: it asks again once
        that read lands (``land``'s ``ask_again``), instead of reading them twice."""
        self.awaited.append(waiter)

    def waiting(self, w: OwnReadWaiter):
        """``w``'s relay state and batch, while the batch still waits for this answer (else
        None)."""
        state = self.relays.in_session(w.relay, w.session)
        batch = state and state.current.pending.get(w.batch_id)
        return (state, batch) if batch is not None and w.token in batch.outstanding_subs else None

    def land(self, msg: OwnReadsLanded, answer, ask_again) -> None:
        """The session learns the read (unless an outage came since it began); every batch
        waiting on it gets its filters' holdings through ``answer`` (an ``OwnHoldingsRead``),
        as from a read of its own; those that awaited these values ``ask_again(state, batch,
        token, filters)``; then the batches queued meanwhile are read."""
        waiters = self.flying.pop(msg.read_id, None)
        if waiters is None:
            return  # answered already (its greenlet died, then it posted after all)
        now = self.clock()
        for read in msg.reads:
            self.own_held.end(read)
        if msg.holdings is not None and msg.epoch == self.own_held.forgotten:
            for read, held in zip(msg.reads, msg.holdings, strict=True):
                if isinstance(held, HeldItems):
                    self.own_held.learn(read, held.entries, now)
        read_alone = None  # what the reads returned, for filters the session cannot answer
        for w in waiters:
            if w.ahead:
                continue
            holdings = None
            if msg.holdings is not None:
                holdings = []
                for flt in w.filters:
                    known = self.own_held.holdings(flt, now)
                    if known is None:
                        read_alone = read_alone or _index_of(msg.holdings)
                        known = read_alone.matching(flt.replace(limit=None))
                    holdings.append(known)
            answer(OwnHoldingsRead(w.relay, w.session, w.batch_id, w.token, w.filters, holdings, msg.reason))
        awaited, self.awaited = self.awaited, []
        for w in awaited:
            found = self.waiting(w)
            if found is not None:
                ask_again(*found, w.token, w.filters)
        if self.queued or self.unwaited:
            self.read_queued()


def _index_of(holdings) -> HaveIndex:
    index = HaveIndex()
    for held in holdings:
        if isinstance(held, HeldItems):
            for event_id, entry in held.entries:
                index.add(event_id, entry)
    return index
