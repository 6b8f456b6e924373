"""One NIP-77 exchange for one filter of a historic batch, run in its own greenlet.

It takes what the own relay holds for the filter (read by the manager before it chose NIP-77
for the filter, or asked here with ``own_query``), adds the ids the manager knows are
refused for good or still in flight, reconciles that set with the remote
over the relay's existing connection (NEG-OPEN / NEG-MSG / NEG-CLOSE), and posts the outcome
to the manager. It touches no index. Any failure of the remote's NIP-77 (NEG-ERR, a NOTICE
before the first answer or about negentropy, a version we do not speak, garbage, no answer
within 15 s in total) is an outcome, not an exception: the manager falls back to REQ+EOSE,
or splits the filter when the relay refused it for its number of results.
"""
from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import gevent
import gevent.pool
from gevent.event import AsyncResult
from gevent.lock import BoundedSemaphore
from gevent.queue import Empty, Queue

from .. import constants
from ..constants import (
    MAX_RUNNING_EXCHANGES,
    NEGENTROPY_DEADLINE_SECS,
    OWN_READ_DEFER_STEP_SECS,
    OWN_READ_MAX_DEFER_SECS,
    OWN_READS_AT_ONCE_TOTAL,
    OWN_READS_PER_BATCH,
    SHARED_HOLDINGS_SECS,
)
from ..ops import metrics
from ..protocol import negentropy
from ..protocol.filters import Filter
from ..protocol.negentropy import Storage
from ..sync.result_caps import SILENT_CAP_MIN, oldest_compared
from . import negentropy_ws
from .inbox import NegentropyFinished, OwnReadsLanded, OwnWitnessRead
from .own_query import KeptConnections

# LocalRelay's NIP-77 frame limit is 60,000 bytes; staying under it suits most relays.
FRAME_SIZE_LIMIT = 50_000


def frame_size_limit(max_message_length: int) -> int:
    """A NIP-77 message's limit (binary: hex doubles it on the wire) for a relay taking
    messages of ``max_message_length``: FRAME_SIZE_LIMIT, less if its messages are shorter."""
    fitting = (max_message_length - 2 * negentropy.FRAME_SLACK) // 2
    return max(negentropy.MIN_FRAME_SIZE_LIMIT, min(FRAME_SIZE_LIMIT, fitting))


@dataclass
class NegentropyOutcome:
    ok: bool
    need_ids: list[str] = field(default_factory=list)
    have_ids: list[str] = field(default_factory=list)
    rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    reason: str = ""
    failure: str = ""  # NegentropyFailed.reason (e.g. "too-many-results"); "" otherwise
    cap: int | None = None  # "too-many-results": the result cap the relay gave, if it did
    own_relay_failed: bool = False
    held: int = 0  # events of the filter the own relay holds
    # (``read_also``, what the own relay returned for it as ``HeldItems.entries``) when the
    # exchange read that part of its filter: the manager keeps it (``OwnHeld.learn``)
    read_also: tuple | None = None
    beyond: int = 0  # events the have-set claimed besides: in flight to the own relay, refused
    need_before: int | None = None  # ``NegentropyResult.need_before``, ``need_after``
    need_after: int | None = None
    # What the relay compared, when that is at least SILENT_CAP_MIN (its events, as the
    # exchange found them: ``advertised``), the second its oldest was created at or a later
    # one (``oldest``; None: not known), and how many ids of the have-set it lacks are that
    # old or older (``have_upto``). A relay that compares only its newest events (a silent
    # cap) is asked again below ``oldest`` (``result_caps.SilentCap``).
    advertised: int = 0
    oldest: int | None = None
    have_upto: int = 0
    # the have-set's ids it compared (held on both sides), with their created_at
    compared_held: dict = field(default_factory=dict)
    # the newest two of the own relay's ids the relay did not lack (held on both sides,
    # whatever the count compared): events it holds, for the proof that it answers several
    # filters a REQ when nothing it served can give one (``Refusals.keep_held_ids``)
    held_both: tuple = ()

    def note_held_both(self, items) -> None:
        """Fill ``held_both`` from the own relay's ``items`` ((created_at, id))."""
        have = set(self.have_ids)
        self.held_both = tuple(event_id for _, event_id in heapq.nlargest(
            2, (item for item in items if item[1] not in have)))

    def note_advertised(self, items) -> None:
        """Fill ``advertised``, ``oldest`` and ``have_upto`` from the have-set ``items``
        ((created_at, id)), for an exchange that compared SILENT_CAP_MIN events or more."""
        if len(items) - len(self.have_ids) + len(self.need_ids) < SILENT_CAP_MIN:
            return
        have = set(self.have_ids)
        both = self.compared_held = {event_id: created_at for created_at, event_id in items if event_id not in have}
        self.advertised = len(both) + len(self.need_ids)
        self.oldest = oldest_compared(min(both.values(), default=None), bool(self.need_ids), self.need_before,
                                      self.need_after)
        if self.oldest is not None:
            self.have_upto = len({event_id for created_at, event_id in items
                                  if created_at <= self.oldest and event_id in have})


class SharedHoldings:
    """The own relay's holdings for a filter, read once for every exchange that asks for the
    same filter at about the same time. Layer 1 is the same filter on every relay and
    matches every announcement the own relay holds: read per relay, hundreds of relays
    meant hundreds of identical full reads. A read is shared while it runs and reused for
    ``reuse_secs`` after: a snapshot that old can only miss events stored since, never
    claim one the own relay lacks (those come back as needed and are recognised by id)."""

    def __init__(self, read, reuse_secs: float = SHARED_HOLDINGS_SECS, clock=time.monotonic):
        self._read = read
        self._reuse = reuse_secs
        self._clock = clock
        self._reading: dict[str, AsyncResult] = {}
        self._done: OrderedDict[str, list] = OrderedDict()  # [read at, items, Storage]; oldest first

    def get(self, url: str, flt: Filter, fresh: bool = False) -> list[tuple[int, str]]:
        """``fresh``: read now, whatever was read before (a batch that waited for another
        relay's lead counts what that relay brought), and keep that for the others."""
        now = self._clock()
        while self._done and now - next(iter(self._done.values()))[0] >= self._reuse:
            self._done.popitem(last=False)
        key = flt.to_json()
        if fresh:
            self._done.pop(key, None)
        elif key in self._done:
            return self._done[key][1]
        if key in self._reading and not fresh:
            return self._reading[key].get()  # waits; a failed read fails its waiters too
        result = self._reading[key] = AsyncResult()
        try:
            items = self._read(url, flt)
        except BaseException as exc:
            result.set_exception(exc)
            raise
        finally:
            if self._reading.get(key) is result:
                del self._reading[key]
        result.set(items)
        self._done[key] = [self._clock(), items, None]
        return items

    def storage(self, flt: Filter, items) -> Storage | None:
        """The NIP-77 storage of a shared read ``items`` (as ``get`` returned them), built
        once and shared by the exchanges that add nothing to it (read-only): layer 1 on
        every relay reconciles the same thousands of announcements. None for small reads,
        which are cheaper built per exchange than kept."""
        if len(items) < SHARED_STORAGE_MIN_ITEMS:
            return None
        entry = self._done.get(flt.to_json())
        if entry is None or entry[1] is not items:
            return None
        if entry[2] is None:
            entry[2] = negentropy_ws.storage_of(items)
        return entry[2]


SHARED_STORAGE_MIN_ITEMS = 1_000  # a shared read this large is reconciled from one storage

# Every exchange holds its filter's have-set while it runs (layer 1: every announcement the
# own relay holds): at most this many run at once, whatever the number of relays.
_running = BoundedSemaphore(MAX_RUNNING_EXCHANGES)
_kept = KeptConnections(keep=MAX_RUNNING_EXCHANGES)
_holdings = SharedHoldings(_kept.holdings)


def authenticate_reads(secret: str | None, tags=None) -> None:
    """Answer an own relay that asks for NIP-42 AUTH to read the holdings with ``secret``,
    naming it as ``tags`` (``own_auth.AuthTags``)."""
    _kept.use_key(secret, tags)


# Reads of the own relay's holdings before methods are chosen: a batch's filters are read
# side by side (one after the other, a batch of 27 layer-3 filters waited a second for the
# loopback round trips, holding its first paced start), within a bound over all batches.
_reads = BoundedSemaphore(OWN_READS_AT_ONCE_TOTAL)


def give_way(busy, sleep=gevent.sleep, clock=time.monotonic,
             step: float = OWN_READ_DEFER_STEP_SECS, most: float = OWN_READ_MAX_DEFER_SECS) -> float:
    """Before a read of the own relay: wait while ``busy()`` (it is slow to answer what
    delivery sends it: deliveries go first), ``most`` seconds at most. Returns the wait."""
    if busy is None:
        return 0.0
    start = clock()
    while busy() and clock() - start < most:
        sleep(step)
    return clock() - start


def read_merged(own_url: str, reads, post, *, read_id: int, fresh: bool = False, epoch: int = 0,
                busy=None) -> None:
    """What the own relay holds of each of ``reads`` (the merged reads of every batch
    waiting: ``sync.own_reads``), posted to the manager as one ``OwnReadsLanded``, which
    answers each batch from it (a failure is an outcome too: REQ pages then). ``fresh``:
    not from an earlier read (``SharedHoldings.get``). ``busy``: the own relay is slow to
    answer deliveries (``give_way``)."""
    holdings, reason = _read_each(own_url, reads, fresh, busy)
    post(OwnReadsLanded(read_id, list(reads), holdings, reason, epoch))


def ask_back(own_url: str, asked, filters, post) -> None:
    """The own relay asked which of the witnesses ``asked`` it still holds, by ``filters``
    (``sync.own_witness``): what they return posted as one ``OwnWitnessRead``."""
    holdings, reason = _read_each(own_url, filters, True, None)
    held = None if holdings is None else [pair for items in holdings for pair in items.entries]
    post(OwnWitnessRead(list(asked), held, reason))


def _read_each(own_url: str, reads, fresh: bool, busy) -> tuple[list | None, str]:
    """Each of ``reads`` (None: nothing to read) side by side, all by
    ``OWN_READ_DEADLINE_SECS``: (per read, its ``HeldItems`` or None; "") or (None, why)."""

    def read(flt: Filter | None):
        if flt is None:
            return None
        give_way(busy)
        with _reads:
            try:
                return _holdings.get(own_url, flt, fresh)
            except Exception as exc:  # an outcome (not a greenlet's traceback on stderr)
                return exc

    pool = gevent.pool.Pool(OWN_READS_PER_BATCH)
    spawned = [pool.spawn(read, flt) for flt in reads]
    deadline = constants.OWN_READ_DEADLINE_SECS
    done = gevent.joinall(spawned, timeout=deadline)
    holdings, reason = [r.value for r in spawned], ""
    failed = next((h for h in holdings if isinstance(h, Exception)), None)
    if len(done) < len(spawned):  # the rest are given up: REQ pages for the whole batch
        pool.kill(block=False)
        holdings, reason = None, f"own relay query past its {deadline:g} s deadline"
    elif failed is not None:
        holdings, reason = None, f"own relay query failed: {type(failed).__name__}"
    return holdings, reason


def reconcile_filter(conn, own_url: str, flt: Filter, extra_items, post, *, batch_id: int,
                     token: str, deadline_secs: float = NEGENTROPY_DEADLINE_SECS,
                     held=None, read_also: Filter | None = None, frame_size_limit: int = FRAME_SIZE_LIMIT,
                     busy=None, started=None, asks: Filter | None = None) -> None:
    """``held``: the own relay's (created_at, id) for ``flt``, if already known, but for
    ``read_also`` (part of ``flt``), read here; ``busy``: the own relay is slow to answer
    deliveries (``give_way``); ``started``: a list the monotonic time its turn came is
    appended to (the manager's deadline); ``asks``: the filter the NEG-OPEN sends, when not
    ``flt`` (``pending.exchange_asks``; the answer is ``flt``'s)."""
    asks = flt if asks is None else asks
    if held is None or read_also is not None:
        give_way(busy)
    with _running:
        if started is not None:
            started.append(time.monotonic())
        try:
            read = None
            if held is None:
                items = _holdings.get(own_url, asks)
            elif read_also is not None:
                read = _holdings.get(own_url, read_also)
                items = _with(held, read)
            else:
                items = held
        except Exception as exc:
            outcome = NegentropyOutcome(False, reason=f"own relay query failed: {type(exc).__name__}",
                                        own_relay_failed=True)
        else:
            extra = list(extra_items)
            shared = None if extra else _holdings.storage(asks, items)
            outcome = exchange(conn, token, asks, items + extra if extra else items, deadline_secs,
                               frame_size_limit=frame_size_limit, storage=shared)
            outcome.held, outcome.beyond = len(items), len(extra)
            if outcome.ok:
                outcome.note_advertised(items + extra if extra else items)
                outcome.note_held_both(items)
            if read is not None:
                outcome.read_also = (read_also, read.entries)
    post(NegentropyFinished(conn.relay, conn.session, batch_id, token, flt, outcome))


def _with(held, read) -> list:
    """``held`` and what was ``read`` besides, each id once."""
    ids = {event_id for _, event_id in held}
    return list(held) + [item for item in read if item[1] not in ids]


def exchange(conn, sub_id: str, flt: Filter, items, deadline_secs: float,
             frame_size_limit: int = FRAME_SIZE_LIMIT, storage: Storage | None = None) -> NegentropyOutcome:
    """Reconcile ``items`` with the relay behind ``conn`` for ``flt``; the connection's
    reader hands this exchange the NIP-77 frames (and NOTICEs) through a queue."""
    inbox: Queue = Queue()
    conn.open_negentropy(sub_id, inbox)

    def receive(timeout: float):
        try:
            return inbox.get(timeout=timeout)
        except Empty:
            return None

    try:
        def send(text: str) -> None:
            conn.send_negentropy(sub_id, text)

        r = negentropy_ws.reconcile(send, receive, sub_id, flt, items, storage=storage,
                                    frame_size_limit=frame_size_limit, deadline_secs=deadline_secs)
        return NegentropyOutcome(True, r.need_ids, r.have_ids, r.rounds, r.bytes_up, r.bytes_down,
                                 need_before=r.need_before, need_after=r.need_after)
    except negentropy_ws.NegentropyFailed as exc:
        metrics.NEGENTROPY_FAILURES.labels(exc.reason).inc()
        r = exc.result
        return NegentropyOutcome(False, rounds=r.rounds, bytes_up=r.bytes_up, bytes_down=r.bytes_down,
                                 reason=f"{exc.reason}: {exc.text}", failure=exc.reason, cap=exc.cap)
    finally:
        conn.end_negentropy(sub_id)
