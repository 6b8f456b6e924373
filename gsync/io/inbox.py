"""The manager's inbox: the messages greenlets post to it, one type per thing that can happen.

Greenlets never touch an index; they describe what happened with one of these and put it on
the manager's queue. ``session`` identifies one websocket session of a relay, so a message
from a connection that has since been replaced is recognised as stale and ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocol.event import Event


@dataclass(slots=True)
class HandshakeStarted:
    relay: str
    attempt: int


@dataclass(slots=True)
class HandshakeDone:
    relay: str
    attempt: int
    ws: Any = None  # an open websocket on success
    limits: Any = None  # RelayLimits
    error: str = ""  # failure reason, for logs and the health tracker
    refused: bool = False  # the SSRF guard refused it: do not retry
    # the relay answered the upgrade with 429 (or a 503 with Retry-After): a cooldown, at
    # least ``retry_after`` seconds when it said how long
    rate_limited: bool = False
    retry_after: float | None = None
    # how it failed when no retry in seconds fixes it ("dns", "tls", "http 404"): parked
    permanent: str = ""


@dataclass(slots=True)
class RemoteEvent:
    """A checked event (id, signature, filter match) from a remote relay's subscription."""

    relay: str
    session: int
    sub_id: str
    event: Event
    verified: bool = True  # False: a known id whose checks were skipped (never delivered)
    matched: tuple[int, ...] = ()  # indices of the subscription's filters it matches


@dataclass(slots=True)
class RemoteEvents:
    """The checked events of one read burst from one connection, in order (one queue
    message instead of hundreds)."""

    relay: str
    session: int
    events: list[RemoteEvent]
    applied: Any = None  # a gevent Event the manager sets once it applied them


@dataclass(slots=True)
class ProbeWanted:
    """An imprecise REQ came back with nothing from a relay of a make that may answer those
    so: the manager sends the precise probe, paced (``protocol.precise``). ``filters``: that
    REQ's imprecise filters asking stored events, which the probe asks precisely; ``again``:
    the last probe came back slow with nothing (a time budget may have cut it): the same
    filter once more."""

    relay: str
    session: int
    filters: tuple = ()
    again: bool = False


@dataclass(slots=True)
class ProbeRefused:
    """The relay refused the precise probe (its CLOSED, or a NOTICE taken for it): ``prefix``
    and ``text`` as it said them (``RelayLifecycle.on_probe_refused``)."""

    relay: str
    session: int
    prefix: str
    text: str


@dataclass(slots=True)
class ImpreciseIgnored:
    """The relay answered an imprecise REQ with nothing and a precise probe with something:
    it answers only precise queries (``protocol.precise``; nostr-rs-relay's
    ``limit_scrapers``)."""

    relay: str
    session: int


@dataclass(slots=True)
class RemoteMessage:
    """Any other parsed relay message (EOSE, CLOSED, NOTICE, OK, AUTH …). ``past_until``,
    with an EOSE or CLOSED: per filter of that subscription (by index), how many events it
    matched but for its ``until`` came newer than every ``until`` given (dropped by the
    connection; a relay that ignores ``until`` sends them, and they count toward its cap).
    ``beside``, with a CLOSED the connection made of a refusing NOTICE: how many others were
    open when its REQ went (the book's count, gone with the CLOSE the connection sent)."""

    relay: str
    session: int
    message: Any
    past_until: tuple[int, ...] = ()
    beside: int | None = None


@dataclass(slots=True)
class RelayDisconnected:
    relay: str
    session: int
    reason: str
    misbehaved: bool = False  # gsync hung up on it: back off as after a failure
    # The relay ended it just after a message this long: its read limit, most likely
    # (connection.RelayConnection.sent_too_long); 0 when nothing suggests that.
    sent_too_long: int = 0
    said_too_big: bool = False  # with close status 1009, "message too big"


@dataclass(slots=True)
class NegentropyFinished:
    """One NIP-77 exchange (one filter of a batch) ended, well or not."""

    relay: str
    session: int
    batch_id: int
    token: str
    filter: Any
    result: Any  # negentropy_sync.NegentropyOutcome


@dataclass(slots=True)
class OwnHoldingsRead:
    """The own relay's holdings for a historic batch's filters were read, before any paced
    start was spent on them: the manager now picks NIP-77 or REQ pages per filter."""

    relay: str
    session: int
    batch_id: int
    token: str
    filters: list
    holdings: list | None  # per filter, [(created_at, id)]; None: the own relay failed
    reason: str = ""  # why it failed


@dataclass(slots=True)
class OwnReadsLanded:
    """A merged read of the own relay ended (``sync.own_reads``): what every batch waiting
    on it lacked. The batches are the manager's to answer (``OwnReads.flying``)."""

    read_id: int
    reads: list  # the filters read
    holdings: list | None  # per read, its ``HeldItems``; None: the own relay failed
    reason: str = ""
    epoch: int = 0  # ``OwnHeld.forgotten`` when the read began


@dataclass(slots=True)
class OwnWitnessRead:
    """The own relay, back from an outage, was asked for ``asked`` (``sync.own_witness``):
    ``held``, what it answered, as (id, ``HeldEntry``) pairs (None: it failed, ``reason``)."""

    asked: list
    held: list | None
    reason: str = ""


@dataclass(slots=True)
class OwnReadsDue:
    """The window collecting own-relay reads closed: read what is waiting."""


@dataclass(slots=True)
class OwnEvents:
    """Events the own relay accepted: one read burst or one page of its history, seen
    through the self-subscription, or roots and announcements delivery saw it accept (its
    OK), in case its live stream drops them. ``duplicates``: ids of those delivery saw
    answered ``duplicate:``, which does not tell whether the own relay holds that one or a
    newer one of its address (``RepoSyncIndex.apply_announcement``'s ``held``)."""

    events: list[Event]
    duplicates: frozenset = frozenset()


@dataclass(slots=True)
class OwnHeldConfirmed:
    """Events the own relay answered ``OK true`` to (``duplicate`` included, ``purgatory``
    not), as (id, ``own_held.HeldEntry``): held, for the NIP-77 have-sets (one read burst).
    ``stored_anew``: ids of those it stored anew (not ``duplicate``)."""

    entries: list
    stored_anew: list = field(default_factory=list)


@dataclass(slots=True)
class OwnLanded:
    """New events the own relay stored, seen live by an instance of several (``[cluster]
    shard``): mostly what the other shards delivered. As (id, ``own_held.HeldEntry``)."""

    entries: list


@dataclass(slots=True)
class OwnSubscribed:
    """The self-subscription reached EOSE (READY for systemd). ``layer1``: when its history
    read was whole (not since a reconnect), every layer-1 event (30617, 10317) the own relay
    holds, as (id, ``own_held.HeldEntry``): layer 1's holdings, known without a read of
    their own."""

    reconnect: bool
    layer1: list | None = None


@dataclass(slots=True)
class OwnRelayState:
    """The own relay became unreachable (``up`` False, since ``at``) or reachable again."""

    up: bool
    at: float


@dataclass(slots=True)
class DeliveryCaughtUp:
    """Delivery's backlog fell below the mark the manager asked about (``wake_below``):
    historic starts held for it may go."""


@dataclass(slots=True)
class DeliveryAnswered:
    """The own relay's final answer for one event, when the manager must act on it: refused
    for good, or held in purgatory (a plain delivery is only counted)."""

    event: Event
    outcome: str  # "purgatory" | "rejected"
    reason: str = ""
    source: str = ""  # the remote it was fetched from ("" unknown): a re-fetch asks there
    # offered again once the own relay stores an event anew (``RejectedIndex.add``'s
    # ``until_own_stores``): refused finally (a relay put read-only refuses everything so),
    # or given up while it stored nothing since the first refusal (a full disk)
    until_own_stores: bool = False


@dataclass(slots=True)
class Tick:
    """Maintenance timer (every 2 s)."""

    now: float


@dataclass(slots=True)
class BatchWindowClosed:
    now: float
    # The self-subscription's first history read: what the own relay held all along, so
    # nothing in it counts as a dependency that has just arrived.
    first_read: bool = False


@dataclass(slots=True)
class CompletionRecheck:
    relay: str
    session: int


@dataclass(slots=True)
class HistoricSlotDue:
    """The pacing gate allows this relay's next background start now."""

    relay: str
    session: int


@dataclass(slots=True)
class CooldownEnded:
    """A relay's rate-limit cooldown is over: it is Probing, and the queued work goes out."""

    relay: str


@dataclass(slots=True)
class Stop:
    reason: str = "stop"
    extra: dict = field(default_factory=dict)
