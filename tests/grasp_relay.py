"""The own relay as a GRASP-01 relay answers gsync, played by a scripted relay.

A GRASP-01 relay hosts git repositories announced with NIP-34 and keeps only what belongs
to them. What gsync must get right depends on its answers, so tests use this one:

    own = GraspRelay.start(scripted)     # own.url / own.port, like any relay
    own.host(announcement, *events)      # a repository already hosted (its git data is here)
    own.git_data_arrived(address)        # a held announcement is accepted: stored and served
    own.answers[event_id]                # every answer to an EVENT: [(accepted, message)]

How it answers an ``EVENT`` (the rules of GRASP-01 and of ngit-grasp, simplified):

- an announcement (30617) listing this relay (an http(s) clone URL and a ws relay URL on its
  host:port): for a repository it hosts, stored at once; for a new one, held in purgatory
  (``OK true "purgatory: …"``: not stored, not served) until the test says its git data
  arrived (then stored, and so served to the self-subscription);
- an announcement not listing this relay: stored when its author is the owner or in the
  ``maintainers`` tag of a repository with the same ``d`` that it hosts or holds, else
  ``blocked``;
- a state event (30618) by the owner or a maintainer of a repository with that ``d``:
  ``purgatory:`` while the repository is held, stored once it is hosted; else ``blocked``;
- anything else: stored when it names a repository it hosts (``a``/``A``/``q``); naming
  none, when it references an event it stores (``e``/``E``/``q``); else ``blocked`` (an
  event of a repository this relay does not host, or an orphan).
"""
from __future__ import annotations

import threading

from gsync.protocol.event import Event, EventError, parse_event

PURGATORY = "purgatory: won't be served until git data arrives"


def _values(event: Event, names) -> list[str]:
    return [v for t in event.tags if len(t) >= 2 and t[0] in names for v in t[1:2]]


def _list_values(event: Event, name: str) -> list[str]:
    return [v for t in event.tags if len(t) >= 2 and t[0] == name for v in t[1:]]


class GraspRelay:
    def __init__(self):
        self.relay = None
        self.hosted: dict[str, Event] = {}  # address → the announcement it serves
        self.held: dict[str, Event] = {}  # address → announcement waiting for git data
        self.held_state: dict[str, list[dict]] = {}
        self.git_data: set[str] = set()  # addresses whose git data is here
        self.answers: dict[str, list[tuple[bool, str]]] = {}
        self._lock = threading.RLock()

    @classmethod
    def start(cls, scripted) -> GraspRelay:
        """``scripted`` is the test's scripted-relay fixture."""
        grasp = cls()
        grasp.relay = scripted(page_size=None, on_message=grasp.on_message)
        return grasp

    # -- what tests see ---------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.relay.url

    @property
    def port(self) -> int:
        return self.relay.port

    @property
    def events(self) -> list[dict]:
        return self.relay.events

    def stores(self, event) -> bool:
        return any(e["id"] == event.id for e in self.relay.events)

    def offered(self, event) -> int:
        """How many times gsync sent this event."""
        with self._lock:
            return len(self.answers.get(event.id, []))

    def refused(self, event) -> bool:
        with self._lock:
            return any(not ok for ok, _ in self.answers.get(event.id, []))

    def host(self, announcement: Event, *events: Event) -> None:
        """A repository whose git data is already here, with events it already stores."""
        with self._lock:
            self.git_data.add(announcement.address)
            self._store(announcement)
            for event in events:
                self.relay.broadcast(event.to_dict())

    def git_data_arrived(self, address: str) -> None:
        """The repository's git data was pushed: a held announcement is accepted."""
        with self._lock:
            self.git_data.add(address)
            held = self.held.pop(address, None)
            if held is not None:
                self._store(held)
            for raw in self.held_state.pop(address, []):
                self.relay.broadcast(raw)

    # -- the relay's side -------------------------------------------------------------

    def on_message(self, relay, conn, message):
        if not (isinstance(message, list) and message[:1] == ["EVENT"] and len(message) > 1
                and isinstance(message[1], dict)):
            return None  # REQ, CLOSE, …: an ordinary relay
        raw = message[1]
        try:
            event = parse_event(raw)
        except EventError as exc:
            return [["OK", str(raw.get("id", "")), False, f"invalid: {exc.reason}"]]
        with self._lock:
            accepted, text = self._judge(event, raw)
            self.answers.setdefault(event.id, []).append((accepted, text))
        return [["OK", event.id, accepted, text]]

    def _judge(self, event: Event, raw: dict) -> tuple[bool, str]:
        if event.kind == 30617:
            return self._announcement(event)
        if event.kind == 30618:
            return self._state(event, raw)
        named = [v for v in _values(event, ("a", "A", "q")) if v.startswith("30617:")]
        if named:
            if any(address in self.hosted for address in named):
                return self._stored(raw)
            return False, "blocked: event of a repository this relay does not host"
        stored = {e["id"] for e in self.relay.events}
        if any(ref in stored for ref in _values(event, ("e", "E", "q"))):
            return self._stored(raw)
        return False, "blocked: references nothing this relay holds"

    def _announcement(self, event: Event) -> tuple[bool, str]:
        address = event.address
        if self._lists_this_relay(event):
            if address in self.hosted or address in self.git_data:
                self._store(event)
                return True, ""
            self.held[address] = event
            return True, PURGATORY
        if address in self.hosted or event.pubkey in self._maintainers(event.d_tag):
            self._store(event)
            return True, ""
        return False, "blocked: does not list this relay and is by no maintainer of a repository here"

    def _state(self, event: Event, raw: dict) -> tuple[bool, str]:
        repos = [a for a, ann in {**self.held, **self.hosted}.items()
                 if ann.d_tag == event.d_tag
                 and (ann.pubkey == event.pubkey or event.pubkey in _list_values(ann, "maintainers"))]
        if any(a in self.hosted for a in repos):
            return self._stored(raw)
        if repos:
            self.held_state.setdefault(repos[0], []).append(raw)
            return True, PURGATORY
        return False, "blocked: state of a repository this relay does not host"

    def _maintainers(self, d: str) -> set[str]:
        out = set()
        for ann in (*self.hosted.values(), *self.held.values()):
            if ann.d_tag == d:
                out |= {ann.pubkey, *_list_values(ann, "maintainers")}
        return out

    def _lists_this_relay(self, event: Event) -> bool:
        host = f"127.0.0.1:{self.port}"
        clone = any(u.split("://", 1)[-1].startswith(host + "/") for u in _list_values(event, "clone")
                    if u.startswith(("http://", "https://")))
        relays = any(u.rstrip("/") in (f"ws://{host}", f"wss://{host}") for u in _list_values(event, "relays"))
        return clone and relays

    def _store(self, announcement: Event) -> None:
        current = self.hosted.get(announcement.address)
        if current is None or announcement.created_at >= current.created_at:
            self.hosted[announcement.address] = announcement
        self.held.pop(announcement.address, None)
        self.relay.broadcast(announcement.to_dict())

    def _stored(self, raw: dict) -> tuple[bool, str]:
        self.relay.broadcast(raw)
        return True, ""
