"""A relay simulated at the message level: NIP-01 (stored events, filters with
``since``/``until``/``limit``, EOSE, CLOSED with reasons, live matching), NIP-11 limits,
NIP-42 AUTH and NIP-77 through the project's negentropy (``protocol.negentropy``).

``handle(session, text)`` takes one client frame and returns the frames the relay answers
with, in order; ``publish`` stores an event and returns the live frames it causes per session.
Faults are attributes the simulator sets and clears (``rate_limited_until``, ``refused_tags``,
``no_eose``, ``neg_mode``, ``ids_unserved``, ``up``); by default it behaves as LocalRelay does
(the differential test in tests/test_sim.py holds it to that).
"""
from __future__ import annotations

import json
import random
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import repeat
from json.encoder import encode_basestring_ascii as _json_string  # (json.dumps of a str)

from ..protocol.event import Event, EventError, parse_event
from ..protocol.filters import Filter
from ..protocol.negentropy import NegentropyServer, Storage
from ..protocol.nip11 import RelayLimits


def filter_from_json(obj) -> Filter:
    """A filter as a client's REQ or NEG-OPEN carries it (its decoded JSON object), checked
    as a relay checks it. Raises ``ValueError``."""
    if not isinstance(obj, dict):
        raise ValueError("filter is not an object")
    # (built as Filter.make builds it, and the lists checked by map: a relay model reads
    # every filter of every REQ, and this showed in the simulator's profiles)
    ids = authors = kinds = since = until = limit = None
    tags = []
    for key, value in obj.items():
        if key in ("ids", "authors"):
            if not isinstance(value, list) or not all(map(isinstance, value, repeat(str))):
                raise ValueError(f"{key} must be a list of strings")
            if key == "ids":
                ids = frozenset(value)
            else:
                authors = frozenset(value)
        elif key == "kinds":
            if not isinstance(value, list) or not set(map(type, value)) <= {int}:
                raise ValueError("kinds must be a list of integers")
            kinds = frozenset(value)
        elif key.startswith("#") and len(key) == 2:
            if not isinstance(value, list) or not all(map(isinstance, value, repeat(str))):
                raise ValueError(f"{key} must be a list of strings")
            tags.append((key[1], frozenset(value)))
        elif key in ("since", "until", "limit"):
            if type(value) is not int or value < 0:
                raise ValueError(f"{key} must be a non-negative integer")
            if key == "since":
                since = value
            elif key == "until":
                until = value
            else:
                limit = value
        else:
            raise ValueError(f"unknown filter field {key!r}")
    tags.sort()
    return Filter(ids, authors, kinds, tuple(tags), since, until, limit)


_FILTERS: dict[str, list[Filter] | str] = {}  # a REQ's filters' JSON -> filter_from_json of each, or why not
_FILTERS_KEPT = 4096  # (emptied when full: gsync asks the same filters of many relays, and again)


# a REQ's start with a subscription id JSON writes as it is (printable ASCII, no quote or
# backslash): the rest of the frame is the text ``filters_from_json`` keeps filters by
_REQ_HEAD = re.compile(r'\["REQ","([ !#-\[\]-~]*)",')


def filters_from_json(raw_filters: list, text: str = "") -> list[Filter]:
    """``filter_from_json`` of each of a REQ's filters; ``text``: their JSON as the frame
    carries it (the same text, the same filters: made once). Raises ``ValueError``."""
    made = _FILTERS.get(text) if text else None
    if made is None:
        try:
            made = [filter_from_json(f) for f in raw_filters]
        except ValueError as exc:
            made = str(exc)
        if text:
            if len(_FILTERS) >= _FILTERS_KEPT:
                _FILTERS.clear()
            _FILTERS[text] = made
    if isinstance(made, str):
        raise ValueError(made)
    return made


# A filter's bounds as gsync writes them (``Filter.to_json``: after its selectors, the last
# of which ends with the ``]`` of its list), each after a comma
_N = "(0|[1-9][0-9]*)"
_BOUNDS = re.compile(f'(?:,"since":{_N})?(?:,"until":{_N})?(?:,"limit":{_N})?')
_NO_SELECTORS = (None, None, None, ())
_SELECTORS: dict[str, tuple | None] = {}  # selectors' text -> (ids, authors, kinds, tags) of a filter, or None
_SELECTORS_KEPT = 4096


def _selectors(text: str) -> tuple | None:
    """The selectors a filter's selectors' text gives (``filter_from_json`` of it), or None
    if it is not a valid filter's (or names a bound): made once."""
    made = _SELECTORS.get(text)
    if made is None and text not in _SELECTORS:
        try:
            obj = json.loads("{" + text + "}")
            made = None if obj.keys() & {"since", "until", "limit"} else filter_from_json(obj)
        except ValueError:
            made = None
        if made is not None:
            made = (made.ids, made.authors, made.kinds, made.tags)
        if len(_SELECTORS) >= _SELECTORS_KEPT:
            _SELECTORS.clear()
        _SELECTORS[text] = made
    return made


def plain_filters(text: str) -> list[Filter] | None:
    """A REQ's filters from their text in the frame (``{...},{...}]``, what follows its
    subscription id) when each is written as gsync writes filters: its selectors' JSON read
    once (``_selectors``), its bounds (since, until, limit) off the text; the same filters as
    ``filters_from_json`` of the decoded frame. None when the text is anything else (or its
    selectors are not a valid filter's): the frame is decoded then.

    A filter is taken to end at the first ``}`` after its start, its bounds to be the
    comma-separated bounds before that: the selectors' text that leaves is read as JSON (as
    an object's content) and must be valid, which it is only if the cut is where JSON ends
    them (a cut inside a string leaves it unterminated, one inside a list leaves it open)."""
    filters = []
    pos, last = 0, len(text) - 1
    bounds = _BOUNDS.fullmatch
    while text.startswith("{", pos):
        close = text.find("}", pos)
        if close < 0:
            return None
        end = text.rfind("]", pos, close) + 1  # (the selectors' end, if any)
        if end:
            m = bounds(text, end, close)
            if m is None:
                return None
            parts = _selectors(text[pos + 1:end])
            if parts is None:
                return None
        else:  # bounds only, or nothing
            m = bounds("," + text[pos + 1:close]) if close > pos + 1 else bounds("")
            if m is None:
                return None
            parts = _NO_SELECTORS
        since, until, limit = m.groups()
        filters.append(Filter(*parts, since and int(since), until and int(until), limit and int(limit)))
        if close == last - 1 and text[last] == "]":
            return filters
        if text.startswith(",", close + 1):
            pos = close + 2
        else:
            return None
    return None


def _read_plain(text: str) -> bool:
    """``plain_filters`` of ``text``, kept in ``_FILTERS`` (where ``filters_from_json`` finds
    it); False if not plain."""
    made = plain_filters(text)
    if made is None:
        return False
    if len(_FILTERS) >= _FILTERS_KEPT:
        _FILTERS.clear()
    _FILTERS[text] = made
    return True


def take_token(bucket: tuple[float, float] | None, burst: int, every: float, now: float):
    """A token bucket of ``burst`` tokens, one more every ``every`` seconds, held as (tokens,
    when counted) (None: full): (whether one is taken now, the bucket after)."""
    tokens, at = bucket or (float(burst), now)
    tokens = min(float(burst), tokens + max(0.0, now - at) / every)
    return (True, (tokens - 1, now)) if tokens >= 1 else (False, (tokens, now))


def _event_frame(sub_id: str, event: Event) -> str:
    return '["EVENT",' + _json_string(sub_id) + "," + event.to_json() + "]"


# The frames a REQ is answered with, a string at a time: what json.dumps writes of the list
# (its ", " between items), without its encoder's walk of the list (one EOSE per REQ
# showed in profiles)
def _closed(sub_id: str, text: str) -> str:
    return '["CLOSED", ' + _json_string(sub_id) + ", " + _json_string(text) + "]"


def _eose(sub_id: str) -> str:
    return '["EOSE", ' + _json_string(sub_id) + "]"


def _newest_first(event: Event) -> tuple:
    return (-event.created_at, event.id)


# ``SimRelay.auth_late``: how long after an AUTH is read it takes effect (khatru checks its
# signature in a goroutine while the messages after it are read)
AUTH_TAKES_SECS = 0.005
# How a relay capping a filter's values refuses one past its cap (strfry: "total filter items
# too large", a NOTICE "ERROR: bad req: ..."; others count the values)
VALUE_CAP_WORDS = "error: too many values in filter"

@dataclass
class RelaySession:
    """One websocket session, as the relay sees it."""

    number: int
    subs: dict = field(default_factory=dict)  # sub id -> [Filter]
    negs: dict = field(default_factory=dict)  # sub id -> NegentropyServer
    challenge: str = ""
    authed: bool = False
    authed_at: float | None = None  # (``SimRelay.auth_late``) when our AUTH takes effect
    queries: tuple[float, float] | None = None  # SimRelay.query_limit's bucket (take_token)


class EventStore:
    """Events by id, with indexes by kind and by tag value; replaceable and addressable
    events keep only the newest per key (NIP-01)."""

    def __init__(self):
        self.events: dict[str, Event] = {}
        self.by_kind: dict[int, dict[str, None]] = {}
        self.by_tag: dict[str, dict[str, dict[str, None]]] = {}  # tag name -> value -> ids
        self.by_key: dict[tuple, str] = {}
        self.changes = 0  # events added and removed so far (a cache of what it holds is stale when this moved)
        # a filter's selectors -> [a filter of them, every event they match newest first, the
        # negated created_at of each, the changes count they hold for]: brought up to date
        # when next asked, from the changes since (``_changed``, ``_catch_up``)
        self._matched: dict[tuple, list] = {}
        self._changed: list[tuple[bool, Event]] = []  # (added, event) of the last changes
        self._changed_from = 0  # the changes count before _changed[0]
        self._storages: dict[Filter, tuple[int, Storage]] = {}  # filter -> storage(filter), while nothing changed
        self._storages_at = 0  # the changes count _storages holds for

    def __contains__(self, event_id: str) -> bool:
        return event_id in self.events

    def __len__(self) -> int:
        return len(self.events)

    @staticmethod
    def key(event: Event) -> tuple | None:
        if 30000 <= event.kind < 40000:
            return (event.kind, event.pubkey, event.d_tag)
        if 10000 <= event.kind < 20000 or event.kind in (0, 3):
            return (event.kind, event.pubkey)
        return None

    def add(self, event: Event) -> bool:
        """Store ``event``; False if held already or older than what its key holds."""
        if event.id in self.events:
            return False
        key = self.key(event)
        if key is not None:
            old_id = self.by_key.get(key)
            if old_id is not None:
                old = self.events[old_id]
                # the newest wins; of two at the same second, the lowest id (NIP-01)
                if (-old.created_at, old.id) < (-event.created_at, event.id):
                    return False
                self.remove(old_id)
            self.by_key[key] = event.id
        self.events[event.id] = event
        self.changes += 1
        self.by_kind.setdefault(event.kind, {})[event.id] = None
        for tag in event.tags:
            if len(tag) >= 2 and len(tag[0]) == 1:
                self.by_tag.setdefault(tag[0], {}).setdefault(tag[1], {})[event.id] = None
        self._change(True, event)
        return True

    def remove(self, event_id: str) -> None:
        event = self.events.pop(event_id, None)
        if event is None:
            return
        self.changes += 1
        self.by_kind.get(event.kind, {}).pop(event_id, None)
        for tag in event.tags:
            if len(tag) >= 2 and len(tag[0]) == 1:
                self.by_tag.get(tag[0], {}).get(tag[1], {}).pop(event_id, None)
        key = self.key(event)
        if key is not None and self.by_key.get(key) == event_id:
            del self.by_key[key]
        self._change(False, event)

    _CHANGES_KEPT = 512  # (a kept list further behind is made again)

    def _change(self, added: bool, event: Event) -> None:
        changed = self._changed
        if not self._matched:  # (nothing kept to bring up to date)
            changed.clear()
            self._changed_from = self.changes
            return
        if len(changed) >= 2 * self._CHANGES_KEPT:
            del changed[:self._CHANGES_KEPT]
            self._changed_from += self._CHANGES_KEPT
        changed.append((added, event))

    def _catch_up(self, made: list) -> bool:
        """Bring a kept list up to date: each event added or removed since is put in or taken
        out of it where its selectors match it, at its place (newest first; of one second, by
        id), as ``query`` would make it again. False if it is too far behind."""
        flt, found, negated, at = made
        if at < self._changed_from:
            return False
        for added, event in self._changed[at - self._changed_from:]:
            if flt.matches(event, in_time=False):
                i = bisect_left(found, _newest_first(event), key=_newest_first)
                if added:
                    found.insert(i, event)
                    negated.insert(i, -event.created_at)
                elif i < len(found) and found[i] is event:
                    del found[i]
                    del negated[i]
        made[3] = self.changes
        return True

    def candidates(self, flt: Filter) -> tuple:
        """Ids that may match ``flt``, from its most selective index, in no order (``query``
        sorts what matches); and whether they are those of its only tag's values, each
        matching its selectors if it is of its kinds and authors (``_matching``)."""
        if flt.ids is not None:
            return [i for i in flt.ids if i in self.events], False
        best = best_size = None
        for name, values in flt.tags:
            index = self.by_tag.get(name)
            found = [ids for ids in map(index.get, values) if ids] if index else []
            size = sum(map(len, found))
            if best is None or size < best_size:
                best, best_size = found, size
        if best is not None:
            return (best[0] if len(best) == 1 else set().union(*best)), len(flt.tags) == 1
        if flt.kinds is not None:
            best = [ids for ids in map(self.by_kind.get, flt.kinds) if ids]
            return (best[0] if len(best) == 1 else set().union(*best)), False
        return list(self.events), False

    def _matching(self, flt: Filter) -> list[Event]:
        """Every stored event ``flt``'s selectors match (``Filter.matches``, its bounds
        aside), in no order. Found by its only tag's values (most of gsync's filters), an
        event has the tag: only its kind and author are left to check, here (matching the
        tag again, per event, showed in profiles)."""
        ids, by_its_tag = self.candidates(flt)
        events = map(self.events.__getitem__, ids)
        if not by_its_tag:
            return [e for e in events if flt.matches(e, in_time=False)]
        kinds, authors = flt.kinds, flt.authors
        if authors is None:
            return list(events) if kinds is None else [e for e in events if e.kind in kinds]
        return [e for e in events if (kinds is None or e.kind in kinds) and e.pubkey in authors]

    def storage(self, flt: Filter) -> tuple[int, Storage]:
        """What ``flt`` matches (no limit) as a NIP-77 storage, with its size: made once
        while nothing changed (storages are read only)."""
        if self._storages_at != self.changes:
            self._storages.clear()
            self._storages_at = self.changes
        made = self._storages.get(flt)
        if made is None:
            if len(self._storages) >= 64:
                self._storages.clear()
            items = self.query(flt)
            made = self._storages[flt] = (len(items), Storage.from_hex((e.created_at, e.id) for e in items))
        return made

    def query(self, flt: Filter, cap: int | None = None, hidden=frozenset()) -> list[Event]:
        """What ``flt`` matches, newest first, at most ``limit`` (and ``cap``)."""
        # Kept by its selectors (ids, authors, kinds, tags), not by its bounds: gsync asks the
        # same selectors with another since, until or limit at nearly every REQ (a page, a
        # poll, a live form), and what matches in a time span is a run of the list, newest
        # first: found by bisection on the negated created_at. Kept through changes (brought
        # up to date from the changes since, when asked): publications would otherwise empty
        # a relay's lists several times a day.
        key = (flt.ids, flt.authors, flt.kinds, flt.tags)
        made = self._matched.get(key)
        if made is not None and made[3] != self.changes and not self._catch_up(made):
            made = None
        if made is None:
            if len(self._matched) >= 256:
                self._matched.clear()
            found = self._matching(flt)
            found.sort(key=_newest_first)
            made = self._matched[key] = [flt, found, [-e.created_at for e in found], self.changes]
        _, found, negated, _ = made
        since, until = flt.since, flt.until
        lo = 0 if until is None else bisect_left(negated, -until)
        hi = len(found) if since is None else bisect_right(negated, -since)
        limit = flt.limit
        if cap is not None:
            limit = cap if limit is None else min(limit, cap)
        if hidden:
            found = [e for e in found[lo:hi] if e.id not in hidden]
            return found if limit is None else found[:limit]
        return found[lo:hi if limit is None else min(hi, lo + limit)]


class SimRelay:
    def __init__(self, url: str, *, page_cap: int = 500, max_subs: int = 20, nip77: bool = True,
                 nip11: bool = True, auth_required: bool = False, max_sync_events: int | None = None,
                 until_exclusive: bool = False):
        self.url = url
        self.store = EventStore()
        self.page_cap = page_cap
        self.max_subs = max_subs
        self.nip77 = nip77
        self.nip11 = nip11
        self.auth_required = auth_required
        self.max_sync_events = max_sync_events  # strfry's maxSyncEvents: NEG-ERR past it
        # its NIP-77 compares a filter's newest this many events only, and says nothing of the
        # rest (khatru relays: the negentropy vector is the store's query, capped as any query)
        self.neg_silent_cap: int | None = None
        self.until_exclusive = until_exclusive  # reads a filter's until as exclusive (PEERS.md)
        self.req_cap: int | None = None  # caps a whole REQ's answer, its filters together (PEERS.md)
        self.limit_zero_unlimited = False  # reads limit 0 as no limit: a live REQ sends stored events
        # closes every subscription after its EOSE (PEERS.md: "EOSE followed by CLOSED"), live
        # ones too: what comes later is found only by asking again
        self.closes_after_eose = False
        self.ignores_until = False  # reads a filter as if it had no until
        self.since_exclusive = False  # reads a filter's since as exclusive (created_at > since)
        # answers each filter of a REQ on its own, one after the other (khatru, under
        # ngit-relay): an event two filters match comes twice, newest first only per filter;
        # a live event once per filter it matches
        self.per_filter = False
        # serves a filter without a limit its oldest events first, its page cap of them (nostream:
        # ``LIMIT 500 ORDER BY created_at ASC``); with a limit, its newest, as NIP-01 says
        self.oldest_first = False
        # refuses a REQ in a NOTICE alone, naming no subscription, no CLOSED (nostream refuses
        # an invalid filter so; strfry "too many concurrent REQs")
        self.notice_refusals = False
        self.notice_names = False  # its refusing NOTICE names the REQ: ["NOTICE", sub_id, reason]
        # requiring AUTH, refuses what it read before it "restricted: permission denied", not
        # "auth-required:" as NIP-42 says (nostr_relay)
        self.auth_restricted = False
        # requiring AUTH, as khatru does: no challenge at connect, one with each refusal for want
        # of AUTH (before its CLOSED or NEG-ERR), and each message read in a goroutine of its own,
        # so an AUTH takes effect ``AUTH_TAKES_SECS`` after it is read (its signature checked):
        # what is read meanwhile, the REQs sent just after it, is refused again
        self.auth_late = False
        # answers only precise queries, as nostr-rs-relay with ``limit_scrapers`` (its NIP-11
        # names that software): a REQ with a filter scoring under 2 (ids 2; authors, kinds,
        # tags 1 each) gets an EOSE and nothing, and is not kept live
        self.precise_only = False
        # refuses any filter naming no authors whose kinds are missing or hold 1, as khatru's
        # AntiSyncBots policy does (REQs, NEG-OPENs, id fetches alike)
        self.anti_sync_bots = False
        # refuses a REQ whose filter asks a limit above its page cap, in a NOTICE naming the
        # cap, as nostream does ("Subscription rejected: Limit too high: …")
        self.limit_refusals = False
        # answers one filter of a REQ, "first" or "last", and drops the rest without a word
        # (minimal relays reading filters[0]; ORLY before October 2025 kept the last one's)
        self.one_filter: str | None = None
        # reads the first this many filters of a REQ and drops the rest without a word, stored
        # answer and live subscription alike (a ``max_filters`` it enforces and never
        # publishes); None: reads them all
        self.filter_cap: int | None = None
        # keeps the last ``filter_cap`` filters of a REQ instead of the first (a relay keeping
        # the newest filters within its cap)
        self.filter_cap_last = False
        # refuses a filter holding more than this many values in one list (its ids, its authors
        # or one tag's), the REQ or NEG-OPEN as a whole, saying so in words about its size
        # (``VALUE_CAP_WORDS``); None: takes any. ``value_cap_said``: the words name the cap
        self.value_cap: int | None = None
        # the cap counts a filter's tag values (its tags' lists together) and a filter past
        # it is not queried, without a word: nothing for it, its NIP-77 exchange over nothing
        # (an SQL event store's empty query: fiatjaf's eventstore before it said so); its
        # live subscription still matches it
        self.value_cap_silent = False
        # its refusal of a subscription past ``max_subs`` names the cap (nostream: "Number of
        # subscriptions must be less than or equal to 10"); else strfry's words, no number
        self.subs_cap_said = False
        self.value_cap_said = False
        # it drops every live subscription carrying a ``limit`` once its stored events are
        # sent, without a word (ORLY's handle-req.go since October 2025: ``len(events) >=
        # *f.Limit`` cancels it, ``limit: 0`` included, its CLOSED suppressed): nothing new
        # reaches such a subscription
        self.drops_live = False
        # answers a REQ after a time that grows with what it reads, and stops a query at its
        # time budget (seconds), sending what it read by then and its EOSE (a relay whose
        # database cancels slow statements): a cut anywhere, told from an end only by how long
        # the answer took. Its REQs are read side by side: a slow answer holds up no other
        # frame. None: answers at once, whole. ``answer_secs``: the last REQ's time (the
        # simulator delays its frames by it), drawn from ``slow_rng``
        # its NIP-11 names nostr-rs-relay, which it is, answering every query (``limit_scrapers``
        # off, its default; ``precise_only``: on)
        self.names_rs = False
        self.query_budget: float | None = None
        # a slow relay's draws (None: it answers at once); slow without a budget, its answers
        # come whole, however long they take (50 ms an event, busy moments of 1-40 s: past
        # gsync's 30 s stall at times; ``SimOptions.slow_unbounded``)
        self.slow_rng: random.Random | None = None
        self.answer_secs = 0.0
        # (burst, seconds a query): REQs and NEG-OPENs of one session past a token bucket are
        # refused "rate-limited:" (PEERS.md: LocalRelay's per-connection query limit), for good
        self.query_limit: tuple[int, float] | None = None
        self.up = True
        self.down_until = float("-inf")  # while down: when it comes back (inf: dead for good)
        self.dead = False  # gone for good
        self.sessions: dict[int, RelaySession] = {}
        # faults, set and cleared by the simulator
        self.rate_limited_until = float("-inf")
        self.refused_tags: frozenset[str] = frozenset()
        self.no_eose = False
        self.neg_mode = "serve"  # "serve" | "notice" | "ignore"
        self.ids_unserved = False
        self.ids_unserved_spans: list[tuple[float, float]] = []  # (from, until) of each such fault
        self.hidden: set[str] = set()  # stored, advertised by NIP-77, never served by REQ
        self.now = 0.0  # set by the simulator before each call

    # -- NIP-11 ---------------------------------------------------------------------------

    def limits(self) -> RelayLimits | None:
        if not self.nip11:
            return None
        nips = frozenset({1, 11, 42} | ({77} if self.nip77 else set()))
        return RelayLimits(max_subscriptions=self.max_subs, max_limit=self.page_cap,
                           auth_required=self.auth_required, supported_nips=nips,
                           software="https://git.sr.ht/~gheartsfield/nostr-rs-relay"
                           if self.precise_only or self.names_rs else "")

    # -- sessions -------------------------------------------------------------------------

    def open_session(self, number: int) -> list[str]:
        session = self.sessions[number] = RelaySession(number)
        if self.auth_required:
            session.challenge = f"challenge-{number}"
            if not self.auth_late:
                return [json.dumps(["AUTH", session.challenge])]
        return []

    def authed(self, session: RelaySession) -> bool:
        """``session`` authenticated (``auth_late``: and the AUTH taken by now)."""
        if not session.authed and session.authed_at is not None and self.now >= session.authed_at:
            session.authed = True
        return session.authed

    def _challenged(self, session: RelaySession, frames: list[str], refused: str) -> list[str]:
        """A refusal's frames: ``auth_late`` sends the challenge first with each for want of AUTH."""
        if self.auth_late and refused.startswith("auth-required:"):
            return [json.dumps(["AUTH", session.challenge]), *frames]
        return frames

    def close_session(self, number: int) -> None:
        self.sessions.pop(number, None)

    def handle(self, number: int, text: str) -> list[str]:
        session = self.sessions.get(number)
        if session is None:
            return []
        if text.startswith('["REQ","') and (head := _REQ_HEAD.match(text)):
            # (filters seen before, or written as gsync writes them, after a plain subscription
            # id: the frame is read without decoding it)
            rest = text[head.end():]
            if rest in _FILTERS or _read_plain(rest):
                return self.on_req(session, head.group(1), None, rest)
        try:
            msg = json.loads(text)
        except ValueError:
            return [json.dumps(["NOTICE", "invalid: could not parse"])]
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            return [json.dumps(["NOTICE", "invalid: not a message"])]
        verb = msg[0]
        if verb == "REQ" and len(msg) >= 2:
            head = f'["REQ",{json.dumps(msg[1])},' if isinstance(msg[1], str) else None
            return self.on_req(session, msg[1], msg[2:], text[len(head):] if head and text.startswith(head) else "")
        if verb == "CLOSE" and len(msg) >= 2:
            session.subs.pop(msg[1], None)
            return []
        if verb == "AUTH" and len(msg) >= 2:
            return self.on_auth(session, msg[1])
        if verb == "NEG-OPEN" and len(msg) >= 4:
            return self.on_neg_open(session, msg[1], msg[2], msg[3])
        if verb == "NEG-MSG" and len(msg) >= 3:
            return self.on_neg_msg(session, msg[1], msg[2])
        if verb == "NEG-CLOSE" and len(msg) >= 2:
            session.negs.pop(msg[1], None)
            return []
        if verb == "EVENT" and len(msg) >= 2:
            return self.on_event(msg[1])
        return [json.dumps(["NOTICE", f"invalid: unknown message {verb[:20]}"])]

    def on_auth(self, session: RelaySession, raw) -> list[str]:
        try:
            event = parse_event(raw)
        except EventError as exc:
            return [json.dumps(["OK", raw.get("id", "") if isinstance(raw, dict) else "", False, f"invalid: {exc}"])]
        challenge = event.first_tag_value("challenge")
        ok = event.kind == 22242 and session.challenge and challenge == session.challenge
        if ok and self.auth_late and not session.authed:
            if session.authed_at is None:
                session.authed_at = self.now + AUTH_TAKES_SECS
        else:
            session.authed = session.authed or bool(ok)
        return [json.dumps(["OK", event.id, bool(ok), "" if ok else "invalid: wrong challenge"])]

    def refusal(self, session: RelaySession, filters: list[Filter]) -> str | None:
        if self.auth_required and not self.authed(session):
            return "restricted: permission denied" if self.auth_restricted else "auth-required: authenticate first"
        if self.now < self.rate_limited_until:
            return "rate-limited: slow down"
        if self.query_limit is not None:
            taken, session.queries = take_token(session.queries, *self.query_limit, self.now)
            if not taken:
                return "rate-limited: too many queries"
        for f in filters:
            if self.value_cap is not None and not self.value_cap_silent and f.most_values() > self.value_cap:
                return f"{VALUE_CAP_WORDS} (max {self.value_cap})" if self.value_cap_said else VALUE_CAP_WORDS
            for name, _ in f.tags:
                if name in self.refused_tags:
                    return f"blocked: #{name} queries are not allowed here"
            if self.anti_sync_bots and f.authors is None and (f.kinds is None or 1 in f.kinds):
                return "blocked: an author must be specified to get their kind:1 notes"
        return None

    def past_silent_cap(self, f: Filter) -> bool:
        """Is ``f`` a filter this relay's silent cap leaves unqueried (``value_cap_silent``)?"""
        return (self.value_cap_silent and f.limit != 0
                and sum(len(values) for _, values in f.tags) > self.value_cap)

    def _refused(self, sub_id: str, reason: str) -> str:
        """A REQ's refusal: its CLOSED, or a NOTICE alone (``notice_refusals``), naming the REQ
        or not (``notice_names``)."""
        if not self.notice_refusals:
            return _closed(sub_id, reason)
        return json.dumps(["NOTICE", sub_id, reason] if self.notice_names else ["NOTICE", reason])

    def on_req(self, session: RelaySession, sub_id, raw_filters, text: str = "") -> list[str]:
        if not isinstance(sub_id, str) or not sub_id:
            return [json.dumps(["NOTICE", "invalid: bad subscription id"])]
        try:
            filters = filters_from_json(raw_filters, text)
        except ValueError as exc:
            return [_closed(sub_id, f"invalid: {exc}")]
        if self.precise_only and any(
                2 * (f.ids is not None) + (f.authors is not None) + (f.kinds is not None) + bool(f.tags) < 2
                for f in filters):
            session.subs.pop(sub_id, None)
            return [_eose(sub_id)]  # (a "scraper": nothing, and not kept)
        if sub_id not in session.subs and len(session.subs) >= self.max_subs:
            return [self._refused(sub_id, f"error: too many concurrent REQs (max {self.max_subs})"
                                  if self.subs_cap_said else "error: too many concurrent REQs")]
        if self.limit_refusals and any(f.limit is not None and f.limit > self.page_cap for f in filters):
            session.subs.pop(sub_id, None)
            return [json.dumps(["NOTICE", "Subscription rejected: Limit too high: Filter limit must be less "
                                          f"than or equal to {self.page_cap}"])]
        refused = self.refusal(session, filters)
        if refused:
            session.subs.pop(sub_id, None)
            return self._challenged(session, [self._refused(sub_id, refused)], refused)
        if self.filter_cap is not None:
            # (the rest dropped as it is read, live too)
            filters = filters[-self.filter_cap:] if self.filter_cap_last else filters[:self.filter_cap]
        session.subs[sub_id] = filters
        head = '["EVENT",' + _json_string(sub_id) + ","  # (_event_frame's start, made once per REQ)
        answered = filters
        if self.one_filter is not None:
            answered = filters[:1] if self.one_filter == "first" else filters[-1:]
        if self.value_cap_silent:
            answered = [f for f in answered if not self.past_silent_cap(f)]
        frames = [head + e.to_json() + "]" for e in self.answer(answered)]
        if self.slow_rng is not None and any(f.limit != 0 for f in filters):
            frames = self.timed(frames)
        sent = len(frames)
        if self.no_eose and any(f.limit != 0 for f in filters):
            return frames
        frames.append(_eose(sub_id))
        if self.closes_after_eose:
            del session.subs[sub_id]
            frames.append(_closed(sub_id, ""))
        elif self.drops_live and any(f.limit is not None and sent >= f.limit for f in filters):
            del session.subs[sub_id]  # (no CLOSED: the client thinks it open)
        return frames

    def timed(self, frames: list[str]) -> list[str]:
        """A slow relay's answer (``query_budget``): its time drawn (a start, then 20 ms an
        event read, each within a factor of two; one in five a busy moment of 1-8 s more), set
        in ``answer_secs``; past the budget, the events read by then."""
        rng = self.slow_rng
        if self.query_budget is None:  # (slow without a budget)
            secs = rng.uniform(0.05, 1.0) + 0.05 * len(frames) * rng.uniform(0.5, 2.0)
            self.answer_secs = secs + (rng.uniform(1.0, 40.0) if rng.random() < 0.2 else 0.0)
            return frames
        secs = rng.uniform(0.05, 1.0) + 0.02 * len(frames) * rng.uniform(0.5, 2.0)
        if rng.random() < 0.2:
            secs += rng.uniform(1.0, 8.0)
        if secs > self.query_budget:
            frames = frames[:int(len(frames) * self.query_budget / secs)]
            secs = self.query_budget
        self.answer_secs = secs
        return frames

    def exchange_secs(self, rounds: int) -> float:
        """How long a slow relay (``query_budget``) takes over a NIP-77 exchange of ``rounds``
        rounds beside the round trips: a start of each round's reads (50 ms - 1 s), one round
        in five a busy moment of 1-4 s more; at most 12 s in all, within gsync's own deadline
        on an exchange (``constants.NEGENTROPY_DEADLINE_SECS``, which the simulator's
        exchanges, run at once, do not meet). 0 on any other relay."""
        if self.slow_rng is None:
            return 0.0
        rng = self.slow_rng
        secs = sum(rng.uniform(0.05, 1.0) + (rng.uniform(1.0, 4.0) if rng.random() < 0.2 else 0.0)
                   for _ in range(rounds))
        return min(secs, 12.0)

    def answer(self, filters: list[Filter]) -> list[Event]:
        """The stored events a REQ's filters ask for, each once, per filter at most its
        ``limit`` and the relay's page cap, newest first (at most ``req_cap`` in all)."""
        out: dict[str, Event] = {}
        each: list[Event] = []  # (a relay answering per filter: every filter's answer in turn)
        asked = 0
        for f in filters:
            if (f.limit == 0 and not self.limit_zero_unlimited) or (self.ids_unserved and f.ids is not None):
                continue
            asked += 1
            read = self.as_read(f if f.limit != 0 else f.replace(limit=None))
            if self.oldest_first and read.limit is None:
                found = self.store.query(read, None, self.hidden)[::-1][:self.page_cap]
            else:
                found = self.store.query(read, self.page_cap, self.hidden)
            if self.per_filter:
                each += found
            else:
                for e in found:
                    out.setdefault(e.id, e)
        if self.per_filter:
            return each if self.req_cap is None else each[:self.req_cap]
        # (one filter's answer: newest first already, each event once)
        found = list(out.values()) if asked == 1 else sorted(out.values(), key=_newest_first)
        return found if self.req_cap is None else found[:self.req_cap]

    def as_read(self, f: Filter) -> Filter:
        """``f`` as this relay reads it: ``since`` and ``until`` exclusive on one that reads
        them so, and ``until`` none at all on one that ignores it."""
        if self.since_exclusive and f.since is not None:
            f = f.replace(since=f.since + 1)
        if f.until is None:
            return f
        if self.ignores_until:
            return f.replace(until=None)
        return f.replace(until=f.until - 1) if self.until_exclusive else f

    def on_neg_open(self, session: RelaySession, sub_id, raw_filter, message_hex) -> list[str]:
        if not self.nip77 or self.neg_mode == "notice":
            return [json.dumps(["NOTICE", "ERROR: negentropy is disabled"])]
        if self.neg_mode == "ignore":
            return []
        try:
            flt = filter_from_json(raw_filter)
        except ValueError as exc:
            return [json.dumps(["NEG-ERR", sub_id, f"invalid: {exc}"])]
        refused = self.refusal(session, [flt])
        if refused:
            return self._challenged(session, [json.dumps(["NEG-ERR", sub_id, refused])], refused)
        size, storage = self.store.storage(self.as_read(flt).replace(limit=None))
        if self.past_silent_cap(flt):
            size, storage = 0, Storage.from_hex(())
        if self.max_sync_events is not None and size > self.max_sync_events:
            return [json.dumps(["NEG-ERR", sub_id, "blocked: too many query results"])]
        if self.neg_silent_cap is not None and size > self.neg_silent_cap:
            newest = self.store.query(self.as_read(flt).replace(limit=None), cap=self.neg_silent_cap)
            storage = Storage.from_hex((e.created_at, e.id) for e in newest)
        server = NegentropyServer(storage)
        session.negs[sub_id] = server
        return self.on_neg_msg(session, sub_id, message_hex)

    def on_neg_msg(self, session: RelaySession, sub_id, message_hex) -> list[str]:
        server = session.negs.get(sub_id)
        if server is None:
            return [json.dumps(["NEG-ERR", sub_id, "closed: no such negentropy session"])]
        try:
            answer = server.respond(bytes.fromhex(message_hex))
        except Exception as exc:  # a broken message ends the exchange, as relays do
            session.negs.pop(sub_id, None)
            return [json.dumps(["NEG-ERR", sub_id, f"invalid: {type(exc).__name__}"])]
        return [json.dumps(["NEG-MSG", sub_id, answer.hex()])]

    def on_event(self, raw) -> list[str]:
        try:
            event = parse_event(raw)
        except EventError as exc:
            return [json.dumps(["OK", raw.get("id", "") if isinstance(raw, dict) else "", False, f"invalid: {exc}"])]
        stored = self.store.add(event)
        return [json.dumps(["OK", event.id, True, "" if stored else "duplicate: already have this event"])]

    # -- the world publishes --------------------------------------------------------------

    def publish(self, event: Event) -> dict[int, list[str]]:
        """Store ``event`` (as a user's client would publish it) and send it to every open
        subscription it matches: session number -> frames."""
        if not self.store.add(event):
            return {}
        out: dict[int, list[str]] = {}
        for number, session in self.sessions.items():
            for sub_id, filters in session.subs.items():
                matching = sum((self.as_read(f) if self.since_exclusive else f).matches(event) for f in filters)
                if matching:
                    frame = _event_frame(sub_id, event)
                    out.setdefault(number, []).extend([frame] * (matching if self.per_filter else 1))
        return out

    def lose(self, fraction: float, rng) -> int:
        """A restart that lost data: ``fraction`` of the stored events, drawn by ``rng``."""
        ids = sorted(self.store.events)
        lost = [i for i in ids if rng.random() < fraction]
        for i in lost:
            self.store.remove(i)
        return len(lost)


def all_values(event: Event, name: str) -> list[str]:
    """Every value of every tag called ``name`` (NIP-34's ``relays`` and ``clone`` tags
    carry several)."""
    return [v for t in event.tags if len(t) >= 2 and t[0] == name for v in t[1:]]


WRITE_BURST, WRITE_EVERY_SECS = 15, 4.0  # the own relay's write limit (``Faults.own_rate_limited``)
OWN_AHEAD_LIMIT_SECS = 900  # the own relay refuses events dated further ahead (strfry's default)


class OwnRelay:
    """The own relay, GRASP-like: it accepts announcements that list its domain (a clone URL
    and a relays URL on it) and the events of repositories it accepted (``repo_of``: the
    world's map from event id to repository); everything else is ``blocked:``."""

    def __init__(self, domain: str, repo_of):
        self.domain = domain
        self.repo_of = repo_of
        self.store = EventStore()
        self.accepted: dict[str, str] = {}  # repository address -> the announcement's id
        # address -> (created_at, id) of the newest announcement it ever stored, kept through
        # losses (what gsync's self-subscription showed it: ``Checker.wanted_relays``)
        self.newest: dict[str, tuple[int, str]] = {}
        self.stored_at: dict[str, float] = {}  # id -> when it was stored (simulated time)
        # announcements stored and losses so far: what ``accepted`` and the store hold of the
        # announcements moved when this did (``Checker.wanted_relays`` keys on it)
        self.listing_changes = 0
        self.up = True
        self.full_until = float("-inf")  # until then its disk is full: every write refused "error:"
        self.readonly_until = float("-inf")  # until then read-only: every event refused "restricted:"
        # until then gsync's writes go through a token bucket (WRITE_BURST, one a WRITE_EVERY_SECS)
        self.write_limit_until = float("-inf")
        self.write_tokens: tuple[float, float] | None = None  # (tokens, when counted): take_token

    def lists_us(self, event: Event) -> bool:
        clone = any(v.startswith(f"https://{self.domain}/") for v in all_values(event, "clone"))
        relays = any(v.rstrip("/") in (f"wss://{self.domain}", f"ws://{self.domain}")
                     for v in all_values(event, "relays"))
        return clone and relays

    def accepts(self, event: Event) -> tuple[bool, str]:
        if event.kind == 30617:
            return (True, "") if self.lists_us(event) else (False, "blocked: does not list this relay")
        repo = self.repo_of.get(event.id)
        if repo is None or repo.address not in self.accepted:
            return False, "blocked: not an event of a repository hosted here"
        return True, ""

    def lose_since(self, since: float) -> int:
        """A crash: what was stored at ``since`` or later is gone."""
        lost = [i for i, at in self.stored_at.items() if at >= since]
        self.listing_changes += 1
        for event_id in lost:
            self.store.remove(event_id)
            del self.stored_at[event_id]
        self.accepted = {address: event_id for address, event_id in self.accepted.items() if event_id in self.store}
        return len(lost)

    def submit(self, event: Event, now: float) -> tuple[bool, str, bool]:
        """An EVENT: (accepted, OK text, stored anew)."""
        if now < self.readonly_until:  # (before any other check: a write policy's answer)
            return False, "restricted: this relay is read-only for maintenance", False
        if event.created_at > now + OWN_AHEAD_LIMIT_SECS:
            return False, "invalid: created_at too late", False
        if now < self.write_limit_until:
            taken, self.write_tokens = take_token(self.write_tokens, WRITE_BURST, WRITE_EVERY_SECS, now)
            if not taken:
                return False, "rate-limited: slow down, too many events", False
        ok, why = self.accepts(event)
        if not ok:
            return False, why, False
        if event.id in self.store:
            return True, "duplicate: already have this event", False
        if now < self.full_until:
            return False, "error: no space left on device", False
        stored = self.store.add(event)
        if stored:
            self.stored_at[event.id] = now
        if stored and event.kind == 30617:
            self.listing_changes += 1
            self.accepted[f"30617:{event.pubkey}:{event.d_tag}"] = event.id
            at, newest_id = self.newest.get(event.address, (-1, ""))
            if event.created_at > at or (event.created_at == at and event.id < newest_id):
                self.newest[event.address] = (event.created_at, event.id)
        return True, "" if stored else "duplicate: have a newer one", stored
