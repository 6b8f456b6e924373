"""One NIP-77 reconciliation, client side, over any websocket-like connection (blocking).

``reconcile`` takes a ``send(text)`` and a ``receive(timeout) -> text | None`` (None: nothing
arrived in time), so it works over websocket-client directly or inside a gevent greenlet
with patched sockets; it imports neither. It sends NEG-OPEN with our initial message, answers
every NEG-MSG for its sub id until the negentropy client is satisfied, sends NEG-CLOSE, and
returns the ids each side lacks. Frames for other subscriptions are skipped, since the
connection is shared.

A relay that cannot do NIP-77 for us is a ``NegentropyFailed`` with a reason from a closed
set (a metric label), never a hang: NEG-ERR or a CLOSED naming the exchange
(``too-many-results`` when it refuses the filter for matching too many events: narrower ones
are served), an answer in a protocol version we do not speak, a NOTICE before our first
answer (in any words: public relays refuse NIP-77 that way) or about negentropy after it, a
malformed message, no conclusion before the total deadline, or more ids we lack than one
exchange may report (constants.NEGENTROPY_MAX_NEED_IDS: a relay streaming fresh ids every
round must not fill our memory until the deadline). Errors raised by ``send``/``receive``
themselves propagate untouched: a dropped connection says nothing about the relay's NIP-77
support.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..constants import NEGENTROPY_DEADLINE_SECS, NEGENTROPY_MAX_NEED_IDS
from ..protocol import messages as wire
from ..protocol.filters import Filter
from ..protocol.negentropy import NegentropyClient, NegentropyError, Storage, UnsupportedVersion

Send = Callable[[str], None]
Receive = Callable[[float], "str | bytes | None"]


@dataclass
class NegentropyResult:
    have_ids: list[str]  # we hold them, the relay does not
    need_ids: list[str]  # the relay holds them, we do not
    rounds: int  # messages we sent that the relay answered
    bytes_up: int  # UTF-8 bytes of the NIP-77 frames we sent (NEG-CLOSE included)
    bytes_down: int  # UTF-8 bytes of the NIP-77 frames the relay sent us
    # every id of ``need_ids`` is of an event created at this second or before (None: no
    # need ids; ``NegentropyClient.need_before``)
    need_before: int | None = None
    need_after: int | None = None  # ... and after this second, or at it


class NegentropyFailed(Exception):
    """The relay did not complete NIP-77 with us; ``reason`` says how."""

    REASONS = frozenset(
        {"neg-err", "unsupported-version", "notice", "bad-message", "timeout", "too-many-ids",
         "too-many-results"}
    )

    def __init__(self, reason: str, text: str, result: NegentropyResult, cap: int | None = None):
        assert reason in self.REASONS, reason
        super().__init__(f"{reason}: {text}")
        self.reason = reason
        self.text = text
        self.result = result  # the traffic so far: rounds and bytes still count
        self.cap = cap  # "too-many-results": the result cap the relay gave, if it did


def storage_of(items) -> Storage:
    """A NIP-77 storage of ``(created_at, id hex)`` items, one entry per id (our sources
    overlap: own relay, in flight, refused)."""
    # An id commits to its created_at, so a repeated id repeats its timestamp too.
    unique = {event_id: created_at for created_at, event_id in items}
    return Storage.from_hex(zip(unique.values(), unique.keys(), strict=True))


def reconcile(
    send: Send,
    receive: Receive,
    sub_id: str,
    flt: Filter,
    items: Iterable[tuple[int, str]],
    *,
    frame_size_limit: int = 0,
    deadline_secs: float = NEGENTROPY_DEADLINE_SECS,
    max_need_ids: int = NEGENTROPY_MAX_NEED_IDS,
    clock: Callable[[], float] = time.monotonic,
    storage: Storage | None = None,
) -> NegentropyResult:
    """Reconcile ``items`` (``(created_at, id hex)``) with what the relay holds for ``flt``.
    ``storage``: those items already built (read-only, so it may be shared by exchanges)."""
    deadline = clock() + deadline_secs
    client = NegentropyClient(storage if storage is not None else storage_of(items), frame_size_limit,
                              bound_needs=True)
    exchange = _Exchange(send, receive, sub_id, max_need_ids)
    try:
        exchange.run(client, flt, deadline, clock)
    except NegentropyFailed:
        exchange.close()  # free the relay's state; NEG-CLOSE after NEG-ERR is harmless
        raise
    exchange.close()
    exchange.result.need_before, exchange.result.need_after = client.need_before, client.need_after
    return exchange.result


class _Exchange:
    def __init__(self, send: Send, receive: Receive, sub_id: str, max_need_ids: int):
        self.send_frame = send
        self.receive = receive
        self.sub_id = sub_id
        self.max_need_ids = max_need_ids
        self.result = NegentropyResult([], [], 0, 0, 0)

    def send(self, text: str) -> None:
        self.send_frame(text)
        self.result.bytes_up += len(text.encode())

    def close(self) -> None:
        self.send(wire.neg_close(self.sub_id))

    def fail(self, reason: str, text: str, cap: int | None = None) -> NegentropyFailed:
        return NegentropyFailed(reason, text, self.result, cap)

    def run(self, client: NegentropyClient, flt: Filter, deadline: float, clock) -> None:
        self.send(wire.neg_open(self.sub_id, flt, client.initiate().hex()))
        while True:
            answer = self.next_answer(deadline, clock)
            self.result.rounds += 1
            try:
                step = client.reconcile(answer)
            except UnsupportedVersion as exc:
                raise self.fail("unsupported-version", str(exc)) from None
            except NegentropyError as exc:
                raise self.fail("bad-message", str(exc)) from None
            self.result.have_ids += [i.hex() for i in step.have]
            self.result.need_ids += [i.hex() for i in step.need]
            if len(self.result.need_ids) > self.max_need_ids:
                raise self.fail("too-many-ids", f"more than {self.max_need_ids} ids to fetch")
            if step.message is None:
                return
            self.send(wire.neg_msg(self.sub_id, step.message.hex()))

    def next_answer(self, deadline: float, clock) -> bytes:
        """The relay's next NEG-MSG payload for us, skipping traffic that is not ours."""
        while True:
            remaining = deadline - clock()
            if remaining <= 0:
                raise self.fail("timeout", "no NIP-77 conclusion before the deadline")
            frame = self.receive(remaining)
            if frame is None:
                continue  # the loop re-checks the deadline
            message = wire.parse_relay_message(frame)
            if isinstance(message, wire.NegMsg) and message.sub_id == self.sub_id:
                self.count_down(frame)
                return bytes.fromhex(message.message_hex)
            if isinstance(message, wire.NegErr) and message.sub_id == self.sub_id:
                self.count_down(frame)
                if wire.says_too_many_results(message.text):  # NIP-77 is fine, the filter too wide
                    cap = f" (cap {message.cap})" if message.cap is not None else ""
                    raise self.fail("too-many-results", _reason_text(message) + cap, message.cap)
                raise self.fail("neg-err", _reason_text(message))
            if isinstance(message, wire.Closed) and message.sub_id == self.sub_id:
                # NIP-77 says NEG-ERR; a relay that ends the exchange as it ends a REQ means the same
                self.count_down(frame)
                raise self.fail("neg-err", _reason_text(message))
            if isinstance(message, wire.Notice) and self.refuses_us(message.text):
                raise self.fail("notice", message.text)
            if isinstance(message, wire.Malformed) and self.is_ours(frame):
                self.count_down(frame)
                raise self.fail("bad-message", f"unreadable NIP-77 frame ({message.reason})")

    def refuses_us(self, text: str) -> bool:
        """Before our first answer, a NOTICE in any words is this exchange's refusal
        (primal.net, purplepag.es) — but one saying too many subscriptions are open, which
        the connection takes as the refusal of its last unanswered REQ (a cap is learnt
        from it, and read here it would turn into a rate limit's cooldown). After the first
        answer, only a NOTICE about negentropy."""
        if wire.is_negentropy_notice(text):
            return True
        return self.result.rounds == 0 and not wire.says_too_many_subscriptions(text)

    def is_ours(self, frame: str | bytes) -> bool:
        """A frame the wire parser refused (e.g. non-hex payload) that names our sub id."""
        try:
            items = json.loads(frame)
        except (ValueError, RecursionError, TypeError):
            return False
        return (
            isinstance(items, list)
            and len(items) >= 2
            and items[0] in ("NEG-MSG", "NEG-ERR")
            and items[1] == self.sub_id
        )

    def count_down(self, frame: str | bytes) -> None:
        self.result.bytes_down += len(frame.encode() if isinstance(frame, str) else frame)


def _reason_text(message: wire.NegErr | wire.Closed) -> str:
    """The relay's reason as it wrote it (the parser splits a known prefix off)."""
    if message.prefix in (wire.Prefix.NONE, wire.Prefix.OTHER):
        return message.text
    return f"{message.prefix.value}: {message.text}"
