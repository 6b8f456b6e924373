"""Misbehaving relays, as knobs for the scripted relay (tests/scripted_relay.py).

Each function returns the ``ScriptedRelay`` keyword arguments of one misbehaviour, so a test
(or ``bench/soak``) starts it with ``scripted(**hostile.stalls_half_way())``. Every one keeps
misbehaving on every session, so reconnecting does not make it go away:

- ``endless_negentropy``: every NEG-OPEN starts a stream of valid-looking NEG-MSG rounds for
  that exchange (fresh ids we lack, a fingerprint that never matches) that never stops.
- ``stalls_half_way``: the first REQ of a session gets half a websocket frame, then nothing
  (the socket stays open).
- ``floods_unrequested``: every REQ is answered with a stream of valid, signed events nobody
  asked for: kind-1 notes matching none of its filters, and the same on subscription ids
  that were never opened.
- ``floods_duplicates``: every REQ is answered with its own events (those it asked for),
  sent again and again.
- ``floods_new``: every REQ is answered with all of a great many genuine events it matches,
  at once, each sent once (events gsync did ask for, each new: only the delivery backlog
  bounds them).
- ``oversized_frames``: every REQ gets a 2 MiB message (over gsync's 1 MiB message bound),
  then the header of a 64 MiB frame (over its 4 MiB frame bound).
- ``prefix_storm``: every REQ gets a NOTICE with each standard prefix, and a CLOSED whose
  prefix cycles through them.

``Counter`` objects report what a relay sent, so a test can tell a flood from a trickle.
"""
from __future__ import annotations

import itertools
import json
import os
import struct
import threading
import time

from . import factory as f
from .scripted_relay import Raw

# NIP-01 / NIP-42 machine-readable prefixes, and GRASP-01's purgatory, and none at all.
STANDARD_PREFIXES = ("duplicate", "pow", "blocked", "rate-limited", "invalid", "restricted",
                     "mute", "error", "auth-required", "unsupported", "purgatory")


class Counter:
    def __init__(self):
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int = 1) -> None:
        with self._lock:
            self.value += n


def unrequested_notes(n: int, author: f.Author | None = None, forged_every: int = 0) -> list[str]:
    """``n`` kind-1 notes (JSON) that tag no repository: no gsync filter matches them. All
    genuine, except every ``forged_every``-th, whose signature is another note's."""
    author = author or f.Author.named("flooder")
    notes = [author.sign(1, [], f"nobody asked for note {i}").to_dict() for i in range(n)]
    if forged_every:
        for i in range(0, n, forged_every):
            notes[i] = dict(notes[i], sig=notes[(i + 1) % n]["sig"])
    return [json.dumps(note, separators=(",", ":")) for note in notes]


def _event_frame(sub_id: str, event_json: str) -> str:
    return f'["EVENT",{json.dumps(sub_id)},{event_json}]'


# -- NIP-77 ---------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def endless_round(ids_per_round: int, first: int) -> str:
    """One NEG-MSG payload (hex): ``ids_per_round`` fresh ids in a range up to timestamp 1,
    then the rest of the space with a random fingerprint, so there is always another round."""
    ids = b"".join((first + i).to_bytes(32, "big") for i in range(ids_per_round))
    id_range = _varint(2) + _varint(0) + _varint(2) + _varint(ids_per_round) + ids
    rest = _varint(0) + _varint(0) + _varint(1) + os.urandom(16)
    return (b"\x61" + id_range + rest).hex()


def endless_negentropy(ids_per_round: int = 100, sent: Counter | None = None) -> dict:
    sent = sent or Counter()
    numbers = itertools.count(0, ids_per_round)

    def stream(conn, sub_id: str) -> None:
        while conn.open:
            conn.send("NEG-MSG", sub_id, endless_round(ids_per_round, next(numbers)))
            sent.add()

    def handler(relay, conn, message):
        if message[0] == "NEG-OPEN" and len(message) > 1:
            threading.Thread(target=stream, args=(conn, message[1]), daemon=True).start()
        return []

    return {"negentropy": handler}


# -- frames ---------------------------------------------------------------------------------


def half_a_frame(size: int = 1000) -> Raw:
    """The header of a ``size``-byte text frame and half its payload."""
    return Raw(bytes([0x81, 126]) + struct.pack("!H", size) + b"x" * (size // 2))


def stalls_half_way() -> dict:
    def on_message(relay, conn, message):
        if isinstance(message, list) and message[:1] == ["REQ"]:
            conn.send_frame(half_a_frame())
            relay.wait_stopped()  # this session's thread stops here: nothing more is written
            return []
        return None

    return {"on_message": on_message}


def oversized_frames(sent: Counter | None = None) -> dict:
    sent = sent or Counter()

    def frames(relay, conn, sub_id, filters):
        sent.add()
        too_long = json.dumps(["NOTICE", "x" * (2 * 1024 * 1024)])
        huge_header = Raw(bytes([0x81, 127]) + struct.pack("!Q", 64 * 1024 * 1024))
        return [too_long, huge_header]

    return {"extra_frames_for_req": frames}


# -- floods ---------------------------------------------------------------------------------


def _hold(relay, delay: float, gate) -> None:
    if gate is not None:
        while not gate.wait(0.2) and not relay.wait_stopped(0):
            pass
    if delay:
        relay.wait_stopped(delay)


def floods_unrequested(notes: list[str], total: int | None = None, sent: Counter | None = None,
                       delay: float = 0.0, gate: threading.Event | None = None) -> dict:
    """Each REQ is answered with ``notes`` over and over (on its own sub id and on one never
    opened), ``delay`` seconds after it arrived (and once ``gate`` is set), until the
    connection closes or ``total`` events were sent in all."""
    sent = sent or Counter()

    def frames(relay, conn, sub_id, filters):
        _hold(relay, delay, gate)
        for i, note in enumerate(itertools.cycle(notes)):
            if not conn.open or (total is not None and sent.value >= total):
                return
            sent.add()
            yield _event_frame(sub_id if i % 2 else "never-opened", note)

    return {"extra_frames_for_req": frames}


def floods_duplicates(total: int | None = None, sent: Counter | None = None,
                      gate: threading.Event | None = None) -> dict:
    """Each REQ is answered with the events it asked for, then (once ``gate`` is set) with
    them again and again."""
    sent = sent or Counter()

    def frames(relay, conn, sub_id, filters):
        _hold(relay, 0.0, gate)
        own = [json.dumps(e) for e in relay.answer([flt.replace(limit=None) for flt in filters])]
        if not own:
            return
        for event_json in itertools.cycle(own):
            if not conn.open or (total is not None and sent.value >= total):
                return
            sent.add()
            yield _event_frame(sub_id, event_json)

    return {"extra_frames_for_req": frames}


def floods_new(events: list, sent: Counter | None = None,
               gate: threading.Event | None = None) -> dict:
    """Each REQ (once ``gate`` is set) is answered with every one of ``events`` (Event
    objects) its filters match, all at once, whatever its ``limit``: a relay holding a
    great many genuine events that belong to a repository (spam, or just a big one). Each
    event is sent once (a second REQ matching them, its live one, is a flood of duplicates:
    ``floods_duplicates``), so what is offered does not hang on how many REQs were out when
    the gate opened (12,001 under load, where 6,000 were meant: ``test_flood_memory``)."""
    sent = sent or Counter()
    offered: set[str] = set()

    def frames(relay, conn, sub_id, filters):
        _hold(relay, 0.0, gate)
        unlimited = [flt.replace(limit=None) for flt in filters]
        for event in events:
            if not conn.open:
                return
            if event.id not in offered and any(flt.matches(event) for flt in unlimited):
                offered.add(event.id)
                sent.add()
                yield _event_frame(sub_id, event.to_json())

    return {"extra_frames_for_req": frames}


# -- refusals -------------------------------------------------------------------------------


def end_storm(per_req: int) -> dict:
    """Answers every REQ as usual, and adds ``per_req`` EOSE and CLOSED for subscriptions
    nobody opened."""

    def frames(relay, conn, sub_id, filters):
        return [[("EOSE", "CLOSED")[i % 2], f"nobody-{sub_id}-{i}", *(["error: x"] if i % 2 else [])]
                for i in range(per_req)]

    return {"extra_frames_for_req": frames}


def auth_storm(challenges: int, answer_wait: float = 10.0) -> dict:
    """Answers the first message of each session with ``challenges`` NIP-42 challenges, each
    new (a client with a key must sign an answer to every one it answers). The first goes
    alone and the rest only once the client answered it (or ``answer_wait`` seconds passed):
    a client that hangs up in the middle of a burst may drop the answers it had queued, so a
    storm sent at once could leave a loaded client no answer on the wire at all. The rest go
    from a thread of their own, as a relay that reads while it writes."""
    seen: set[int] = set()
    lock = threading.Lock()

    def answered(relay, conn) -> bool:
        with relay._received_lock:
            return any(c == conn.id and isinstance(m, list) and m[:1] == ["AUTH"]
                       for c, m in relay.received)

    def storm(relay, conn):
        conn.send_frame(["AUTH", f"challenge-{conn.id}-0"])
        deadline = time.monotonic() + answer_wait
        while conn.open and not answered(relay, conn) and time.monotonic() < deadline:
            time.sleep(0.01)
        conn.send_frames(["AUTH", f"challenge-{conn.id}-{i}"] for i in range(1, challenges))

    def on_message(relay, conn, message):
        with lock:
            if conn.id in seen:
                return None
            seen.add(conn.id)
        threading.Thread(target=storm, args=(relay, conn), daemon=True).start()
        return []

    return {"on_message": on_message}


def prefix_storm(closed: Counter | None = None) -> dict:
    closed = closed or Counter()
    prefixes = itertools.cycle(STANDARD_PREFIXES)

    def on_message(relay, conn, message):
        if not (isinstance(message, list) and message[:1] == ["REQ"] and len(message) > 1):
            return None
        notices = [["NOTICE", f"{p}: this is a {p} notice"] for p in STANDARD_PREFIXES]
        closed.add()
        return notices + [["NOTICE", "no prefix at all"],
                          ["CLOSED", message[1], f"{next(prefixes)}: closed by the storm"]]

    return {"on_message": on_message}
