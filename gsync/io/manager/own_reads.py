"""Own-relay holdings reads merged across batches and relays (``sync.own_reads``).

A batch that lacks part of its filters' holdings (``HistoricSync.ask_own_holdings``) waits
here instead of reading alone: within ``OWN_READ_WINDOW_SECS`` of the first such batch (and,
while a merged read is under way, until it lands) every waiting batch's unread values are
collected, read as one filter per (kinds, authors, tag) in chunks of the tag-value budget,
and each batch is answered from what the session then knows (``OwnHeld``), as if it had
read alone (``on_own_holdings_read``). A read that fails or passes its deadline answers
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


class OwnReads:
    """Mixin of ``SyncManager``: its state lives on the manager (``core.face_own_relay``)."""

    def queue_own_read(self, waiter: OwnReadWaiter) -> None:
        """``waiter`` goes with the next merged read: when the window closes, or when the
        read under way lands."""
        self.own_reads_queued.append(waiter)
        if not self.own_reads_due and not self.own_reads_flying:
            self.own_reads_due = True
            self.effects.later(constants.OWN_READ_WINDOW_SECS, OwnReadsDue())

    def on_own_reads_due(self, msg: OwnReadsDue) -> None:
        self.own_reads_due = False
        if not self.own_reads_flying:  # else when it lands
            self.read_queued_own()

    def read_queued_own(self) -> None:
        """One read of every value the queued batches lack (those still waiting)."""
        waiters, self.own_reads_queued = self.own_reads_queued, []
        waiters = [w for w in waiters if self.own_waiter_batch(w) is not None]
        if not waiters:
            return
        reads = merged_reads([r for w in waiters for r in w.reads], filter_plan.tag_value_budget())
        for read in reads:
            self.own_held.begin(read)
        read_id = next(self._ids)
        self.own_reads_flying[read_id] = waiters
        epoch = self.own_held.forgotten
        log.debug("own_reads_merged", read_id=read_id, batches=len(waiters),
                  asked=sum(len(w.reads) for w in waiters), reads=len(reads))
        greenlet = self.effects.spawn(negentropy_sync.read_merged, self.config.service.own_relay, reads,
                                      self.post, read_id=read_id, fresh=any(w.fresh for w in waiters),
                                      epoch=epoch, busy=self.own_relay_busy)

        def died(g) -> None:  # its answer will never come: this is it
            self.post(OwnReadsLanded(read_id, reads, None, f"own relay query failed: {type(g.exception).__name__}",
                                     epoch))

        greenlet.link_exception(died)

    def await_own_read(self, waiter: OwnReadWaiter) -> None:
        """``waiter`` needs values a merged read is reading right now: it asks again once
        that read lands (``ask_awaited_own``), instead of reading them twice."""
        self.own_reads_awaited.append(waiter)

    def ask_awaited_own(self) -> None:
        """A read landed: the batches that awaited its values ask again (``ask_own_holdings``)."""
        awaited, self.own_reads_awaited = self.own_reads_awaited, []
        for w in awaited:
            batch = self.own_waiter_batch(w)
            if batch is not None:
                self.ask_own_holdings(self._current(w.relay, w.session), batch, w.token, w.filters)

    def own_waiter_batch(self, w: OwnReadWaiter):
        state = self._current(w.relay, w.session)
        batch = state and state.current.pending.get(w.batch_id)
        return batch if batch is not None and w.token in batch.outstanding_subs else None

    def on_own_reads_landed(self, msg: OwnReadsLanded) -> None:
        """The session learns the read (unless an outage came since it began); every batch
        waiting on it gets its filters' holdings, as from a read of its own; then the
        batches queued meanwhile are read, and those that awaited these values ask again."""
        waiters = self.own_reads_flying.pop(msg.read_id, None)
        if waiters is None:
            return  # answered already (its greenlet died, then it posted after all)
        now = self.clock()
        for read in msg.reads:
            self.own_held.end(read)
        learnt = msg.holdings is not None and msg.epoch == self.own_held.forgotten
        if learnt:
            for read, held in zip(msg.reads, msg.holdings, strict=True):
                if isinstance(held, HeldItems):
                    self.own_held.learn(read, held.entries, now)
        read_alone = None  # what the reads returned, for filters the session cannot answer
        for w in waiters:
            if msg.holdings is None:
                holdings = None
            else:
                holdings = []
                for flt in w.filters:
                    known = self.own_held.holdings(flt, now)
                    if known is None:
                        read_alone = read_alone or _index_of(msg.holdings)
                        known = read_alone.matching(flt.replace(limit=None))
                    holdings.append(known)
            self.on_own_holdings_read(OwnHoldingsRead(w.relay, w.session, w.batch_id, w.token, w.filters,
                                                      holdings, msg.reason))
        self.ask_awaited_own()
        if self.own_reads_queued:
            self.read_queued_own()


def _index_of(holdings) -> HaveIndex:
    index = HaveIndex()
    for held in holdings:
        if isinstance(held, HeldItems):
            for event_id, entry in held.entries:
                index.add(event_id, entry)
    return index
