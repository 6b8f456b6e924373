"""What the own relay already holds for a filter: the base of every NIP-77 "already have" set.

Asked with a plain REQ on loopback, paginated with ``until`` (relays cap each REQ), keeping
only ``(created_at, id)``. A REQ answer is exactly what the own relay stores, so the set can
never claim an event it lacks — the one property that matters, because a wrongly claimed
event is never fetched. (NIP-77 against the own relay would be cheaper on the wire but only
yields ids, not the timestamps the remote exchange needs.)
"""
from __future__ import annotations

import json
import uuid

import websocket

from ..constants import PAGE_THRESHOLD
from ..protocol import messages as wire
from ..protocol.filters import Filter

QUERY_TIMEOUT_SECS = 30.0


def own_holdings(url: str, flt: Filter, timeout: float = QUERY_TIMEOUT_SECS) -> list[tuple[int, str]]:
    """Every (created_at, id) the relay at ``url`` holds that matches ``flt``.

    Raises ``OSError``/``websocket`` errors when the relay cannot be asked: the caller must
    then not run NIP-77 at all (an empty set would re-download everything, not lose events,
    but the own relay being down means nothing can be delivered anyway).
    """
    ws = websocket.create_connection(url, timeout=timeout, enable_multithread=False)
    try:
        return _paginate(ws, flt.replace(limit=None))
    finally:
        try:
            ws.close(timeout=1)
        except Exception:
            pass


def _paginate(ws, flt: Filter) -> list[tuple[int, str]]:
    found: dict[str, int] = {}
    until = flt.until
    while True:
        page = _one_page(ws, flt if until is None else flt.replace(until=until))
        new = [(ts, eid) for ts, eid in page if eid not in found]
        for ts, eid in page:
            found[eid] = ts
        if len(page) < PAGE_THRESHOLD:
            break  # fewer than a page: exhausted (the design's assumption about page sizes)
        oldest = min(ts for ts, _ in page)
        if new:
            until = oldest
        elif until is not None and oldest >= until:
            until -= 1  # a crowded second gave nothing new: step past it
        else:
            break
        if flt.since is not None and until < flt.since:
            break
    return [(ts, eid) for eid, ts in found.items()]


def _one_page(ws, flt: Filter) -> list[tuple[int, str]]:
    sub = "own-" + uuid.uuid4().hex[:12]
    ws.send(wire.req(sub, [flt]))
    page: list[tuple[int, str]] = []
    while True:
        msg = wire.parse_relay_message(ws.recv())
        if isinstance(msg, wire.RelayEvent) and msg.sub_id == sub:
            ts, eid = msg.event.get("created_at"), msg.event.get("id")
            if type(ts) is int and isinstance(eid, str) and len(eid) == 64:
                page.append((ts, eid))
        elif isinstance(msg, wire.Eose) and msg.sub_id == sub:
            ws.send(json.dumps(["CLOSE", sub]))
            return page
        elif isinstance(msg, wire.Closed) and msg.sub_id == sub:
            raise ConnectionError(f"own relay refused the holdings query: {msg.text}")
