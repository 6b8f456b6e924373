"""One NIP-77 exchange for one filter of a historic batch, run in its own greenlet.

It takes what the own relay holds for the filter (read by the manager before it chose NIP-77
for the filter, or asked here with ``own_query``), adds the ids the manager knows are
refused for good or still in flight, reconciles that set with the remote
over the relay's existing connection (NEG-OPEN / NEG-MSG / NEG-CLOSE), and posts the outcome
to the manager. It touches no index. Any failure of the remote's NIP-77 (NEG-ERR, a NOTICE
about negentropy, a version we do not speak, garbage, no answer within 15 s in total) is an
outcome, not an exception: the manager falls back to REQ+EOSE.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gevent.queue import Empty, Queue

from ..constants import NEGENTROPY_DEADLINE_SECS
from ..ops import metrics
from ..protocol.filters import Filter
from . import negentropy_ws
from .events import NegentropyFinished, OwnHoldingsRead
from .own_query import own_holdings, own_holdings_of

# LocalRelay's NIP-77 frame limit is 60,000 bytes; staying under it suits most relays.
FRAME_SIZE_LIMIT = 50_000


@dataclass
class NegentropyOutcome:
    ok: bool
    need_ids: list[str] = field(default_factory=list)
    have_ids: list[str] = field(default_factory=list)
    rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    reason: str = ""
    own_relay_failed: bool = False
    held: int = 0  # events of the filter the own relay holds


def read_holdings(own_url: str, filters, post, *, relay: str, session: int, batch_id: int,
                  token: str) -> None:
    """What the own relay holds of each of ``filters``, posted to the manager, which picks
    each filter's method from it (a failure is an outcome too: REQ pages then)."""
    try:
        holdings, reason = own_holdings_of(own_url, filters), ""
    except Exception as exc:
        holdings, reason = None, f"own relay query failed: {type(exc).__name__}"
    post(OwnHoldingsRead(relay, session, batch_id, token, list(filters), holdings, reason))


def reconcile_filter(conn, own_url: str, flt: Filter, extra_items, post, *, batch_id: int,
                     token: str, deadline_secs: float = NEGENTROPY_DEADLINE_SECS,
                     held=None) -> None:
    """``held``: the own relay's (created_at, id) for ``flt``, if already read."""
    try:
        items = own_holdings(own_url, flt) if held is None else held
    except Exception as exc:
        outcome = NegentropyOutcome(False, reason=f"own relay query failed: {type(exc).__name__}",
                                    own_relay_failed=True)
    else:
        outcome = exchange(conn, token, flt, items + list(extra_items), deadline_secs)
        outcome.held = len(items)
    post(NegentropyFinished(conn.relay, conn.session, batch_id, token, flt, outcome))


def exchange(conn, sub_id: str, flt: Filter, items, deadline_secs: float,
             frame_size_limit: int = FRAME_SIZE_LIMIT) -> NegentropyOutcome:
    """Reconcile ``items`` with the relay behind ``conn`` for ``flt``; the connection's
    reader hands this exchange the NIP-77 frames (and NOTICEs) through a queue."""
    inbox: Queue = Queue()
    conn.neg_waiters[sub_id] = inbox

    def receive(timeout: float):
        try:
            return inbox.get(timeout=timeout)
        except Empty:
            return None

    try:
        r = negentropy_ws.reconcile(conn.send, receive, sub_id, flt, items,
                                    frame_size_limit=frame_size_limit, deadline_secs=deadline_secs)
        return NegentropyOutcome(True, r.need_ids, r.have_ids, r.rounds, r.bytes_up, r.bytes_down)
    except negentropy_ws.NegentropyFailed as exc:
        metrics.NEGENTROPY_FAILURES.labels(exc.reason).inc()
        r = exc.result
        return NegentropyOutcome(False, rounds=r.rounds, bytes_up=r.bytes_up, bytes_down=r.bytes_down,
                                 reason=f"{exc.reason}: {exc.text}")
    finally:
        conn.neg_waiters.pop(sub_id, None)
