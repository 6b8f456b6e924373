"""Reading the own relay's history: every stored event for a filter, past per-REQ caps.

Relays cap how many events one REQ returns (LocalRelay: 500 per filter), so history is read
in pages, ``until`` = the oldest ``created_at`` of the previous page (inclusive; a crowded
second that brings nothing new is stepped past). A page smaller than the largest the
connection has served is the last (``PageCap``; the first page is always confirmed, which
on loopback costs milliseconds). Used by the self-subscription (full events)
and for the NIP-77 "already have" set (``KeptConnections``). A REQ answer is exactly what the own
relay stores, so that set can never claim an event it lacks — the one property that matters,
because a wrongly claimed event is never fetched. (NIP-77 against the own relay would be
cheaper on the wire but yields only ids, not the timestamps the remote exchange needs.)
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from ..ops import metrics
from ..protocol import messages as wire
from ..protocol.filters import Filter
from ..sync import filter_plan
from ..sync.own_held import HeldEntry
from ..sync.pending import PageCap, slow_answer
from .own_auth import ReadAuth, refusal_for_auth
from .ws import connect as ws_connect

QUERY_TIMEOUT_SECS = 30.0


def history_pages(ws, flt: Filter, cap: PageCap | None = None, counted: bool = False,
                  auth: ReadAuth | None = None) -> Iterator[list[dict]]:
    """Pages of raw events (newest first) until the relay has nothing older for ``flt``.
    ``cap``: what this connection taught of its page size so far (learnt here too).
    ``counted``: each REQ counts as a holdings read (``gsync_own_relay_reads_total``).
    ``auth``: NIP-42 for a page refused for want of it (``own_auth``)."""
    cap = cap if cap is not None else PageCap()
    flt = filter_plan.with_page_limit([flt.replace(limit=None)])[0]  # (newest first: NIP-01)
    seen: set[str] = set()
    until = flt.until
    asked_again = False
    while True:
        if counted:
            metrics.OWN_RELAY_READS.inc()
        started = time.monotonic()
        page = _one_page(ws, flt if until is None else flt.replace(until=until), counted, auth)
        # a relay that stops slow queries (under load) cuts a page anywhere, before its first
        # event too, as a remote does (``FilterPaginationState.next_page``): a slow page is
        # confirmed by the next, a slow nothing asked once more; taken as the end, the
        # self-subscription's read missed what the own relay held (until its daily reread)
        slow = slow_answer(time.monotonic() - started)
        if not page and slow and not asked_again:
            asked_again = True
            continue
        new = [e for e in page if e["id"] not in seen]
        seen.update(e["id"] for e in new)
        if new:
            yield new
        cap.observe(len(page), len(page))  # one filter a REQ: its events are all its own
        if not page or not cap.maybe_cut(len(page), len(page), slow):
            return  # fewer than the connection has served in one page, not slowly: exhausted
        oldest = min(e["created_at"] for e in page)
        if new and (until is None or oldest < until or len(new) == len(page)):
            until = oldest
        else:
            until = oldest - 1  # a crowded second gave nothing new: step past it
        if until < 0 or (flt.since is not None and until < flt.since):
            return


class HeldItems(list):
    """What a read of the own relay returned for a filter: ``(created_at, id)`` pairs, as
    every NIP-77 have-set takes them, and ``entries``, the same events as (id,
    ``HeldEntry``), which the session keeps (``sync.own_held``) so as not to read again."""

    __slots__ = ("entries",)

    def __init__(self, events=()):
        self._take([(e["id"], HeldEntry.of(e)) for e in events])

    @classmethod
    def of_entries(cls, entries) -> HeldItems:
        """The same, of (id, ``HeldEntry``) pairs made already (entries are never changed:
        reads may share them)."""
        items = cls()
        items._take(list(entries))
        return items

    def _take(self, entries: list) -> None:
        self.entries = entries
        self[:] = [(entry.created_at, event_id) for event_id, entry in entries]


class KeptConnections:
    """The own relay's holdings for a filter (every (created_at, id) it stores that the
    filter matches), read over connections kept open between reads, a few per own relay.

    NIP-77 reads the own relay's holdings once per exchange, tens of thousands of times in
    a large sync: a websocket opened per read cost more than the read (TCP, the HTTP
    upgrade read byte by byte). The page size the own relay has taught (``PageCap``) is
    kept per relay, not per connection: a read on a fresh connection (more reads at once
    than are kept) confirmed its first page of ten events or more with a second REQ. (A cap
    learnt too large only ends a read early: fewer held, more fetched, never an event
    claimed that the relay lacks.) A kept connection that fails is dropped and the read
    retried once on a fresh one (relays close idle connections); a fresh one that fails
    raises ``OSError``/``websocket`` errors."""

    def __init__(self, keep: int, connect=ws_connect, timeout: float = QUERY_TIMEOUT_SECS):
        self._keep = keep
        self._connect = connect
        self._timeout = timeout
        self._idle: dict[str, list[tuple]] = {}  # url → idle (connection, the relay's PageCap)
        self._caps: dict[str, PageCap] = {}  # url → what its pages taught
        self._secret: str | None = None
        self._tags = None
        self._auth: dict[str, ReadAuth] = {}  # url → NIP-42 for its reads

    def use_key(self, secret: str | None, tags=None) -> None:
        """Answer an own relay asking for NIP-42 AUTH to read with ``secret`` (``[auth]``),
        naming it as ``tags`` (``own_auth.AuthTags``; None: by the URL dialled)."""
        self._secret = secret
        self._tags = tags
        self._auth.clear()

    def holdings(self, url: str, flt: Filter) -> HeldItems:
        idle = self._idle.setdefault(url, [])
        if idle:
            try:
                return self._read_and_keep(url, *idle.pop(), flt)
            except Exception:
                pass  # kept too long, or closed by the relay: once more on a fresh one
        cap = self._caps.setdefault(url, PageCap())
        return self._read_and_keep(url, self._connect(url, self._timeout), cap, flt)

    def _read_and_keep(self, url: str, ws, cap: PageCap, flt: Filter) -> HeldItems:
        try:
            auth = self._auth.get(url)
            if auth is None:
                tags = self._tags if self._tags is not None and self._tags.dialled == url else None
                auth = self._auth[url] = ReadAuth(url, self._secret, tags=tags)
            items = HeldItems(e for page in history_pages(ws, flt, cap, counted=True, auth=auth) for e in page)
        except BaseException:
            _close(ws)
            raise
        idle = self._idle.setdefault(url, [])
        if len(idle) < self._keep:
            idle.append((ws, cap))
        else:
            _close(ws)
        return items


def _close(ws) -> None:
    try:
        ws.close(timeout=1)
    except Exception:
        pass


def _one_page(ws, flt: Filter, counted: bool = False, auth: ReadAuth | None = None) -> list[dict]:
    """One REQ's events. Refused for want of AUTH, with a key: AUTH (``auth``), and asked once
    more; refused otherwise, or again, ``ConnectionError``."""
    sub = "own-" + uuid.uuid4().hex[:12]
    ws.send(wire.req(sub, [flt]))
    page: list[dict] = []
    asked_again = False
    while True:
        text = ws.recv()
        if counted:
            metrics.OWN_RELAY_READ_BYTES.inc(len(text))
        msg = wire.parse_relay_message(text)
        if isinstance(msg, wire.RelayEvent) and msg.sub_id == sub:
            e = msg.event
            if type(e.get("created_at")) is int and isinstance(e.get("id"), str) and len(e["id"]) == 64:
                page.append(e)
        elif isinstance(msg, wire.Eose) and msg.sub_id == sub:
            ws.send(wire.close(sub))
            return page
        elif auth is not None and auth.note(ws, msg):
            continue
        elif (refusal_for_auth(msg, auth is not None and auth.challenged(ws))
              and getattr(msg, "sub_id", None) in (sub, None)):
            if asked_again or auth is None or not auth.authenticate(ws):
                text = msg.text if auth is None else auth.refusal(msg.text)
                raise ConnectionError(f"own relay refused the history query: {text}")
            asked_again = True
            page = []
            sub = "own-" + uuid.uuid4().hex[:12]
            ws.send(wire.req(sub, [flt]))
        elif isinstance(msg, wire.Closed) and msg.sub_id == sub:
            raise ConnectionError(f"own relay refused the history query: {msg.text}")
