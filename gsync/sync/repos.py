"""RepoSyncIndex: what gsync WANTS to sync, one entry per accepted repository (SPEC §3).

Pure. Fed by the self-subscription (Full) and by ``purgatory:`` answers (StateOnly); read by
``derive_relay_targets``. Also home of the two announcement questions every layer-1 event
raises: does it list our service (``lists_service``), and should it go to the own relay at
all (``should_forward_layer1``).

NIP-34 puts all values of a list in one tag (``["clone", u1, u2]``); older or hand-written
events use one tag per value. Both spellings are read everywhere here.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache

from ..constants import MAX_RELAYS_PER_ANNOUNCEMENT, PURGATORY_TTL_SECS, ROOT_KINDS, STATE_KIND
from ..protocol.event import Event
from ..protocol.urls import (
    UrlError,
    clone_url_to_relay_url,
    host_port,
    normalize_domain,
    normalize_relay_url,
)

ANNOUNCEMENT_KIND = 30617
USER_GRASP_LIST_KIND = 10317

# Roots can reach the self-subscription before their announcement (history arrives newest
# first and may span several batch windows). They wait here, bounded because the own relay
# is trusted but not infinitely large.
MAX_WAITING_ROOTS = 100_000


class SyncLevel(enum.Enum):
    FULL = "full"  # accepted by the own relay: state + layer 2 + layer 3
    STATE_ONLY = "state_only"  # held in purgatory: state events only, until promoted


# -- reading announcements ---------------------------------------------------------------

_NO_REPOS: frozenset[str] = frozenset()  # repos_listing of a relay no repository lists


def list_tag_values(event: Event, name: str) -> list[str]:
    """Every value of every ``name`` tag, whether written as one tag or one tag per value."""
    return [value for tag in event.tags if len(tag) >= 2 and tag[0] == name for value in tag[1:]]


def identifier_of(address: str) -> str:
    """The ``d`` part of ``30617:<pubkey>:<d>`` (a ``d`` may itself contain ``:``)."""
    parts = address.split(":", 2)
    return parts[2] if len(parts) == 3 else ""


def owner_of(address: str) -> str:
    """The ``pubkey`` part of ``30617:<pubkey>:<d>`` ("" if it has none)."""
    parts = address.split(":", 2)
    return parts[1] if len(parts) == 3 else ""


def _host_port_or_none(url: str) -> str | None:
    try:
        return host_port(url)
    except UrlError:
        return None


def _relay_host_port(url: str) -> str | None:
    """host[:port] of a ws(s) URL only: a ``relays`` value must be a relay URL."""
    try:
        return host_port(normalize_relay_url(url))
    except UrlError:
        return None


def _clone_host_port(url: str) -> str | None:
    """host[:port] of an http(s) URL only: a ``clone`` value must be a web URL."""
    relay = clone_url_to_relay_url(url)
    return _host_port_or_none(relay) if relay else None


def normalize_domains(domains: Iterable[str]) -> frozenset[str]:
    """Configured public names in ``host_port`` form; unusable entries are skipped."""
    return _normalize_domains(tuple(domains))


@lru_cache(maxsize=16)
def _normalize_domains(domains: tuple[str, ...]) -> frozenset[str]:
    # Cached: layer 1 asks about every announcement on the network with the same config.
    out = set()
    for domain in domains:
        try:
            out.add(normalize_domain(domain))
        except UrlError:
            continue
    return frozenset(out)


def lists_service(announcement: Event, domains: Iterable[str]) -> bool:
    """Does this announcement name our service in both a ``clone`` and a ``relays`` value?

    Both must point at the same configured domain: a clone URL on our host with relays
    elsewhere means the repo's events live elsewhere, and the reverse means no git data here.
    """
    ours = normalize_domains(domains)
    clone_hosts = {_clone_host_port(u) for u in list_tag_values(announcement, "clone")}
    relay_hosts = {_relay_host_port(u) for u in list_tag_values(announcement, "relays")}
    return bool(ours & clone_hosts & relay_hosts)


def announcement_relays(
    announcement: Event, cap: int = MAX_RELAYS_PER_ANNOUNCEMENT, *, exclude=None
) -> set[str]:
    """Relays a repo's events may be found on: its ``relays`` plus the host of each clone URL.

    Invalid URLs are skipped. At most ``cap`` relays, chosen in the order the author wrote
    them (``relays`` first), so the same event always yields the same set and a hostile
    announcement cannot make us dial hundreds of hosts. ``exclude(url) -> bool`` drops
    relays (the own relay) before the cap is applied, so they do not use up places.
    """
    candidates: list[str] = []
    for url in list_tag_values(announcement, "relays"):
        try:
            candidates.append(normalize_relay_url(url))
        except UrlError:
            continue
    for url in list_tag_values(announcement, "clone"):
        relay = clone_url_to_relay_url(url)
        if relay is not None:
            candidates.append(relay)
    chosen: dict[str, None] = {}
    for url in candidates:
        if len(chosen) >= cap:
            break
        if exclude is not None and exclude(url):
            continue
        chosen[url] = None
    return set(chosen)


class OwnRelay:
    """Recognises the own relay under any of its names: never a remote target (SPEC §2)."""

    def __init__(self, own_relay_url: str, domains: Iterable[str]):
        self.url = normalize_relay_url(own_relay_url)
        self.domains = normalize_domains(domains)

    def matches(self, relay_url: str) -> bool:
        try:
            url = normalize_relay_url(relay_url)
        except UrlError:
            return False
        return url == self.url or host_port(url) in self.domains


# -- the index ---------------------------------------------------------------------------


@dataclass
class RepoSyncNeeds:
    """What one repository asks of us: where to look and what to look for."""

    relays: set[str]  # the followed announcement's relays, and those of ``held_instead``
    root_events: set[str] = field(default_factory=set)
    sync_level: SyncLevel = SyncLevel.FULL
    maintainers: frozenset[str] = frozenset()
    # Last ``purgatory:`` answer for this repo; only StateOnly entries expire by it.
    purgatory_seen_at: float | None = None
    # An older announcement the self-subscription showed after the followed one: the own
    # relay holds it in the followed one's place (a relay keeps the newest of an address),
    # so it lost the followed one, and a newer one than either may sit on a relay only the
    # older lists. Its relays are followed too, until the own relay shows the followed one
    # again or a newer one (``apply_announcement``).
    held_instead: str = ""
    listed: frozenset[str] = frozenset()  # the followed announcement's relays
    # the followed announcement itself: offered to the own relay again when it refuses the
    # repository's events (it may have lost it, and no relay may hold it any more)
    announcement: Event | None = None

    @property
    def announcement_id(self) -> str:
        return self.announcement.id if self.announcement is not None else ""

    @property
    def announcement_created_at(self) -> int:
        return self.announcement.created_at if self.announcement is not None else 0


def _is_newer(event: Event, needs: RepoSyncNeeds) -> bool:
    """NIP-01 replaceable ordering: later created_at wins; a tie goes to the lower id."""
    if event.created_at != needs.announcement_created_at:
        return event.created_at > needs.announcement_created_at
    return event.id < needs.announcement_id


class RepoSyncIndex:
    """Repo address ``30617:<pubkey>:<d>`` → ``RepoSyncNeeds``; the source of truth.

    Every mutator returns the relays whose derived work changed ("dirty"), so the caller
    can re-run ``compute_actions`` for just those.
    """

    def __init__(
        self,
        own_relay_url: str,
        domains: Iterable[str],
        max_relays_per_announcement: int = MAX_RELAYS_PER_ANNOUNCEMENT,
    ):
        self.own_relay = OwnRelay(own_relay_url, domains)
        self.max_relays_per_announcement = max_relays_per_announcement
        self._repos: dict[str, RepoSyncNeeds] = {}
        self._waiting_roots: dict[str, set[str]] = {}  # address → root ids seen too early
        # d → addresses: layer 1 asks "maintainer of any repo called d?" for every event.
        self._by_identifier: dict[str, set[str]] = {}
        # relay → addresses of the repos listing it: one relay's targets without a walk
        # over every repository (``targets.relay_needs``)
        self._by_relay: dict[str, set[str]] = {}
        self._state_only: set[str] = set()  # what the per-tick expiry looks at
        self._waiting_count = 0  # root ids in _waiting_roots
        # Moves on whenever the roots of Full repos may have changed (a root, a repository
        # added, promoted or forgotten): ``full_root_ids`` is read again only then
        self.roots_version = 0

    # -- reading

    def __contains__(self, address: str) -> bool:
        return address in self._repos

    def __len__(self) -> int:
        return len(self._repos)

    def __iter__(self) -> Iterator[str]:
        return iter(self._repos)

    def get(self, address: str) -> RepoSyncNeeds | None:
        return self._repos.get(address)

    def items(self) -> Iterable[tuple[str, RepoSyncNeeds]]:
        return self._repos.items()

    def identifiers(self) -> set[str]:
        return set(self._by_identifier)

    def listed_relays(self):
        """Every relay some repo's announcement lists (a view; a relay whose last repo went
        leaves it)."""
        return self._by_relay.keys()

    def repos_listing(self, relay: str) -> set[str] | frozenset[str]:
        """Addresses of the repos whose announcement lists ``relay`` (do not modify)."""
        return self._by_relay.get(relay, _NO_REPOS)  # (not a new set() at every call: ticks ask it per relay)

    def maintainers_of(self, identifier: str) -> set[str]:
        """Pubkeys in the ``maintainers`` tags of every known repo called ``identifier``."""
        return {
            pubkey
            for address in self._by_identifier.get(identifier, ())
            for pubkey in self._repos[address].maintainers
        }

    def is_known_maintainer(self, pubkey: str, identifier: str) -> bool:
        return pubkey in self.maintainers_of(identifier)

    def is_full(self, address: str) -> bool:
        needs = self._repos.get(address)
        return needs is not None and needs.sync_level is SyncLevel.FULL

    # -- writing

    def apply_announcement(self, event: Event, level: SyncLevel, now: float, held: bool = True) -> set[str]:
        """Record an announcement seen through the self-subscription (FULL) or answered
        ``purgatory:`` (STATE_ONLY). Returns the dirty relays. ``held``: the own relay is
        known to hold it (shown by the self-subscription, or stored anew), not only answered
        ``duplicate:``, which a relay also says of an announcement it holds a newer one of."""
        if event.kind != ANNOUNCEMENT_KIND:
            return set()
        address = event.address
        needs = self._repos.get(address)
        if needs is None:
            needs = self._repos[address] = RepoSyncNeeds(relays=set())
            self.roots_version += 1
            self._by_identifier.setdefault(identifier_of(address), set()).add(address)
            self._replace_announcement(needs, event)
            needs.sync_level = level
            waiting = self._waiting_roots.pop(address, set())
            self._waiting_count -= len(waiting)
            needs.root_events |= waiting
            if level is SyncLevel.STATE_ONLY:
                needs.purgatory_seen_at = now
                self._state_only.add(address)
            return set(needs.relays)

        dirty: set[str] = set()
        if _is_newer(event, needs) or (event.id == needs.announcement_id and needs.held_instead):
            # Both sets are dirty: old relays may lose the repo, new ones gain it.
            dirty |= needs.relays
            self._replace_announcement(needs, event)
            dirty |= needs.relays
        elif held and level is needs.sync_level is SyncLevel.FULL and event.id != needs.announcement_id:
            dirty |= self._held_instead(needs, event)
        if level is SyncLevel.FULL and needs.sync_level is SyncLevel.STATE_ONLY:
            # Promoted from purgatory: every relay now owes layers 2 and 3 as well.
            needs.sync_level = SyncLevel.FULL
            needs.purgatory_seen_at = None
            self.roots_version += 1
            self._state_only.discard(address)
            dirty |= needs.relays
        elif level is SyncLevel.STATE_ONLY and needs.sync_level is SyncLevel.STATE_ONLY:
            needs.purgatory_seen_at = now  # still in purgatory: keep it alive
        # A Full entry is never downgraded by a later purgatory answer.
        return dirty

    def note_state_in_purgatory(self, state_event: Event, now: float) -> set[str]:
        """The own relay answered ``purgatory:`` to a state event (30618): it still holds
        the repository it belongs to, and has just restarted its own clock for it (a GRASP
        relay keeps a held announcement alive while its state events arrive). Every
        StateOnly repo with that ``d`` whose owner or maintainer wrote it is kept alive.
        Returns their addresses."""
        if state_event.kind != STATE_KIND:
            return set()
        kept = set()
        for address in self._by_identifier.get(state_event.d_tag, ()):
            needs = self._repos[address]
            if needs.sync_level is not SyncLevel.STATE_ONLY:
                continue
            if state_event.pubkey == owner_of(address) or state_event.pubkey in needs.maintainers:
                needs.purgatory_seen_at = now
                kept.add(address)
        return kept

    def _relays_of(self, event: Event) -> set[str]:
        return announcement_relays(event, self.max_relays_per_announcement, exclude=self.own_relay.matches)

    def _replace_announcement(self, needs: RepoSyncNeeds, event: Event) -> None:
        self._unlist(event.address, needs.relays)
        needs.relays = self._relays_of(event)
        needs.listed = frozenset(needs.relays)
        for relay in needs.relays:
            self._by_relay.setdefault(relay, set()).add(event.address)
        needs.announcement = event
        needs.maintainers = frozenset(list_tag_values(event, "maintainers"))
        needs.held_instead = ""

    def _held_instead(self, needs: RepoSyncNeeds, older: Event) -> set[str]:
        """The own relay showed ``older`` after the followed announcement (see
        ``RepoSyncNeeds.held_instead``): its relays are followed too. Only the last such one
        counts, so the set stays within two announcements' relays. The dirty relays."""
        if needs.held_instead == older.id:
            return set()
        before = set(needs.relays)
        self._unlist(older.address, before)
        needs.relays = set(needs.listed) | self._relays_of(older)
        needs.held_instead = older.id
        for relay in needs.relays:
            self._by_relay.setdefault(relay, set()).add(older.address)
        return before ^ needs.relays

    def apply_root_event(self, event: Event) -> set[str]:
        """Record an issue / patch / PR (1617, 1618, 1621) under each known repo it tags."""
        if event.kind not in ROOT_KINDS:
            return set()
        dirty: set[str] = set()
        for address in set(event.tag_values("a")):
            if not address.startswith(f"{ANNOUNCEMENT_KIND}:"):
                continue
            needs = self._repos.get(address)
            if needs is None:
                self._park_root(address, event.id)
            elif event.id not in needs.root_events:
                needs.root_events.add(event.id)
                self.roots_version += 1
                dirty |= needs.relays
        return dirty

    def _unlist(self, address: str, relays) -> None:
        for relay in relays:
            listing = self._by_relay.get(relay)
            if listing is not None:
                listing.discard(address)
                if not listing:
                    del self._by_relay[relay]

    def _forget(self, address: str) -> None:
        self.roots_version += 1
        self._state_only.discard(address)
        self._unlist(address, self._repos[address].relays)
        del self._repos[address]
        same_name = self._by_identifier[identifier_of(address)]
        same_name.discard(address)
        if not same_name:
            del self._by_identifier[identifier_of(address)]

    def _park_root(self, address: str, event_id: str) -> None:
        if self._waiting_count >= MAX_WAITING_ROOTS:
            return
        waiting = self._waiting_roots.setdefault(address, set())
        if event_id not in waiting:
            waiting.add(event_id)
            self._waiting_count += 1

    def expire_state_only(self, now: float, ttl: float = PURGATORY_TTL_SECS) -> set[str]:
        """Drop StateOnly repos whose last ``purgatory:`` answer (to the announcement or to
        one of its state events) is ``ttl`` old. Dirty relays. (Asked every tick: it looks
        at StateOnly repos only.)"""
        return {relay for relays in self.expire_state_only_repos(now, ttl).values() for relay in relays}

    def expire_state_only_repos(self, now: float, ttl: float = PURGATORY_TTL_SECS) -> dict[str, set[str]]:
        """``expire_state_only``, saying which repos went: address → the relays it listed."""
        expired: dict[str, set[str]] = {}
        for address in list(self._state_only):
            needs = self._repos[address]
            if needs.purgatory_seen_at is not None and now - needs.purgatory_seen_at >= ttl:
                self._forget(address)
                expired[address] = set(needs.relays)
        return expired


# -- layer 1 forwarding (SPEC §3) --------------------------------------------------------


def _grasp_value_host_port(value: str) -> str | None:
    """A ``g`` value may be a URL (any of our schemes) or a bare ``host[:port]``."""
    if "://" in value:
        return _host_port_or_none(value)
    try:
        return normalize_domain(value.rstrip("/"))
    except UrlError:
        return None


def should_forward_layer1(event: Event, index: RepoSyncIndex, domains: Iterable[str]) -> bool:
    """Is this layer-1 event (30617 / 10317) one the own relay would want?

    Everything else layer 1 fetches is the wider network's business: forwarding it would
    only fill the rejected index.
    """
    if event.kind == ANNOUNCEMENT_KIND:
        return lists_service(event, domains) or index.is_known_maintainer(
            event.pubkey, event.d_tag
        )
    if event.kind == USER_GRASP_LIST_KIND:
        ours = normalize_domains(domains)
        return any(_grasp_value_host_port(v) in ours for v in list_tag_values(event, "g"))
    return False
