"""One NIP-77 exchange for one filter of a historic batch, run in its own greenlet.

It asks the own relay what it already holds for the filter (``own_query``), adds the ids the
manager knows are refused for good or still in flight, reconciles that set with the remote
over the relay's existing connection (NEG-OPEN / NEG-MSG / NEG-CLOSE), and posts the outcome
to the manager. It touches no index. Any failure of the remote's NIP-77 (NEG-ERR, a NOTICE
about negentropy, a version we do not speak, garbage, no answer within 15 s in total) is an
outcome, not an exception: the manager falls back to REQ+EOSE.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from gevent.queue import Empty, Queue

from ..constants import NEGENTROPY_DEADLINE_SECS
from ..protocol import messages as wire
from ..protocol.filters import Filter
from ..protocol.negentropy import NegentropyClient, NegentropyError, Storage
from .events import NegentropyFinished
from .own_query import own_holdings

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


def reconcile_filter(conn, own_url: str, flt: Filter, extra_items, post, *, batch_id: int,
                     token: str, deadline_secs: float = NEGENTROPY_DEADLINE_SECS) -> None:
    try:
        items = own_holdings(own_url, flt)
    except Exception as exc:
        outcome = NegentropyOutcome(False, reason=f"own relay query failed: {type(exc).__name__}",
                                    own_relay_failed=True)
    else:
        outcome = exchange(conn, token, flt, items + list(extra_items), deadline_secs)
    post(NegentropyFinished(conn.relay, conn.session, batch_id, token, flt, outcome))


def exchange(conn, sub_id: str, flt: Filter, items, deadline_secs: float,
             frame_size_limit: int = FRAME_SIZE_LIMIT, clock=time.monotonic) -> NegentropyOutcome:
    """Reconcile ``items`` with the relay behind ``conn`` for ``flt``."""
    unique = {eid: ts for ts, eid in items}  # the have-set's sources overlap
    storage = Storage.from_hex((ts, eid) for eid, ts in unique.items())
    client = NegentropyClient(storage, frame_size_limit)
    inbox: Queue = Queue()
    conn.neg_waiters[sub_id] = inbox
    outcome = NegentropyOutcome(True)
    need: list[bytes] = []
    have: list[bytes] = []
    deadline = clock() + deadline_secs
    try:
        message = client.initiate().hex()
        text = wire.neg_open(sub_id, flt, message)
        while True:
            conn.send(text)
            outcome.bytes_up += len(message) // 2
            outcome.rounds += 1
            reply = _next_reply(inbox, deadline - clock())
            if reply is None:
                return _failed(outcome, "no NIP-77 answer within the deadline")
            if isinstance(reply, wire.NegErr):
                return _failed(outcome, f"NEG-ERR {reply.prefix.value}: {reply.text}")
            if isinstance(reply, wire.Notice):
                return _failed(outcome, f"NOTICE: {reply.text}")
            outcome.bytes_down += len(reply.message_hex) // 2
            try:
                step = client.reconcile(bytes.fromhex(reply.message_hex))
            except NegentropyError as exc:
                return _failed(outcome, f"bad NIP-77 message: {exc}")
            have += step.have
            need += step.need
            if step.message is None:
                break
            message = step.message.hex()
            text = wire.neg_msg(sub_id, message)
    finally:
        conn.neg_waiters.pop(sub_id, None)
        conn.send(wire.neg_close(sub_id))
    outcome.need_ids = [i.hex() for i in need]
    outcome.have_ids = [i.hex() for i in have]
    return outcome


def _next_reply(inbox: Queue, timeout: float):
    if timeout <= 0:
        return None
    try:
        return inbox.get(timeout=timeout)
    except Empty:
        return None


def _failed(outcome: NegentropyOutcome, reason: str) -> NegentropyOutcome:
    outcome.ok = False
    outcome.reason = reason
    return outcome
