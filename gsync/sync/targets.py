"""From "what repos want" to "what each relay still owes us": the design's two pure algorithms.

``derive_relay_targets`` inverts RepoSyncIndex (repo → relays) into relay → items;
``compute_actions`` is the three-way diff target − pending − confirmed, and the ONLY place
that decides which new subscriptions to create (seed 001, "Core Algorithms").

Target, pending and confirmed state all have the same shape, ``SyncItems``: repos with the
level they are synced at, and root event ids. The level matters for the diff: a repo
confirmed StateOnly and now Full still owes its layer-2/3 filters.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .repos import RepoSyncNeeds, SyncLevel


@dataclass
class SyncItems:
    """Repos (address → level) and root event ids, for one relay."""

    repos: dict[str, SyncLevel] = field(default_factory=dict)
    root_events: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.repos or self.root_events)

    def add(self, other: SyncItems) -> None:
        """Merge ``other`` in; a repo keeps the higher of the two levels."""
        for address, level in other.repos.items():
            self.repos[address] = _higher(self.repos.get(address), level)
        self.root_events |= other.root_events

    def covers_repo(self, address: str, level: SyncLevel) -> bool:  # (inlined in progress.repos_complete)
        have = self.repos.get(address)
        return have is SyncLevel.FULL or (have is not None and level is SyncLevel.STATE_ONLY)

    def copy(self) -> SyncItems:
        return SyncItems(dict(self.repos), set(self.root_events))

    def partition(self, items: SyncItems) -> tuple[SyncItems, SyncItems]:
        """(what of ``items`` is here, at this one's levels; the rest of this one)."""
        inside = SyncItems({a: level for a, level in self.repos.items() if a in items.repos},
                           self.root_events & items.root_events)
        rest = SyncItems({a: level for a, level in self.repos.items() if a not in inside.repos},
                         self.root_events - inside.root_events)
        return inside, rest


# The design's names for the same shape in its three roles.
RelaySyncNeeds = SyncItems  # target: what a relay should give us
PendingItems = SyncItems  # in flight in one PendingBatch
ConfirmedItems = SyncItems  # RelaySyncIndex: historic sync completed


def _higher(a: SyncLevel | None, b: SyncLevel) -> SyncLevel:
    return SyncLevel.FULL if SyncLevel.FULL in (a, b) else b


@dataclass(frozen=True)
class AddFilters:
    """New work for one connected relay: build live + historic filters for these items."""

    relay: str
    repos: Mapping[str, SyncLevel]
    root_events: frozenset[str]

    @property
    def items(self) -> SyncItems:
        return SyncItems(dict(self.repos), set(self.root_events))


def derive_relay_targets(
    repo_index: Mapping[str, RepoSyncNeeds] | Iterable,
) -> dict[str, RelaySyncNeeds]:
    """relay → the repos it is listed for, and the root events of its Full repos.

    Accepts a ``RepoSyncIndex`` or any mapping of address → ``RepoSyncNeeds``. Root events
    of StateOnly repos are left out: those repos get state filters only.
    """
    targets: dict[str, RelaySyncNeeds] = {}
    for address, needs in repo_index.items():
        for relay in needs.relays:
            _add_repo(targets.setdefault(relay, RelaySyncNeeds()), address, needs)
    return targets


def relay_needs(repo_index, relay: str) -> RelaySyncNeeds:
    """``derive_relay_targets(repo_index).get(relay)`` (empty if absent) for one relay,
    from the index's relay → repos listing: the cost follows that relay's repos."""
    target = RelaySyncNeeds()
    for address in repo_index.repos_listing(relay):
        _add_repo(target, address, repo_index.get(address))
    return target


def _add_repo(target: RelaySyncNeeds, address: str, needs: RepoSyncNeeds) -> None:
    """A repo listing the relay: its level, and its root events if it is Full."""
    target.repos[address] = _higher(target.repos.get(address), needs.sync_level)
    if needs.sync_level is SyncLevel.FULL:
        target.root_events |= needs.root_events


def compute_actions(
    targets: Mapping[str, RelaySyncNeeds],
    pending: Mapping[str, Iterable[PendingItems]],
    confirmed: Mapping[str, ConfirmedItems],
    connected: Iterable[str],
    only: Iterable[str] | None = None,
) -> list[AddFilters]:
    """Three-way diff: for each connected relay, target − pending − confirmed.

    ``pending`` maps a relay to the items of each of its PendingBatches. Relays that are not
    connected are skipped: they get their work from compute_actions on (re)connect. ``only``
    restricts the diff to some relays (the dirty ones after a self-subscription batch).
    Sorted by relay so the result is deterministic.
    """
    connected = set(connected)
    relays = set(targets) & connected
    if only is not None:
        relays &= set(only)
    actions = []
    for relay in sorted(relays):
        have = confirmed.get(relay, SyncItems()).copy()
        for items in pending.get(relay, ()):
            have.add(items)
        want = targets[relay]
        repos = {a: lvl for a, lvl in want.repos.items() if not have.covers_repo(a, lvl)}
        root_events = frozenset(want.root_events - have.root_events)
        if repos or root_events:
            actions.append(AddFilters(relay, repos, root_events))
    return actions
