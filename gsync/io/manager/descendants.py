"""Direct-member descendants (SPEC §3): events that reply to a thread member without tagging
the root, one generation deep. Members are learned from what relays send and from what the
own relay is read to hold (most are published to it directly: a relay's copy of one it holds
is never fetched, or never checked); each goes to every relay its repository lists, and
every 5 s the new ones get descendant filters on each: live while the budget allows (else
polled, as ``live`` does for any overflow) and one historic batch for what already exists.
"""
from __future__ import annotations

from ... import constants
from ...sync.descendants import REFERENCE_TAGS, roots_tagged, stale_members
from ...sync.relay_state import RelayState
from ...sync.targets import PendingItems
from .coverage import member_filters


class Descendants:
    """Owned by ``SyncManager``: the roots of Full repositories (who is a direct member) and
    each relay's members (its session's, and those to reopen on its ``RelayState``). What
    it starts goes through ``live`` (live coverage) and ``start_historic`` (a batch),
    passed in."""

    def __init__(self, relays: dict[str, RelayState], live, start_historic, repos):
        self.relays = relays
        self.repos = repos  # the repository index: which relays a root's repository lists
        self.root_ids: dict[str, str] = {}  # of Full repos: who is a direct member; root → its repository
        # every member known, by root, and the roots of each: a relay gets those of the roots
        # it is asked for (``members_of_roots``); they leave with their roots (``prune_members``)
        self.members_of: dict[str, set[str]] = {}
        self.roots_of: dict[str, frozenset[str]] = {}
        self.live = live
        self._start_historic = start_historic

    def set_roots(self, roots: dict[str, str]) -> set[str]:
        """The roots of Full repositories are now ``roots`` (each with its repository's
        address): the new ones returned; the members of those that left go from every
        relay's tables."""
        before, self.root_ids = self.root_ids, roots
        if before.keys() - roots.keys():
            self.prune_members()
        return roots.keys() - before.keys()

    def repositories_of(self, event, cap: int = constants.MAX_DEPENDENCIES) -> list[str]:
        """The Full repositories ``event`` belongs to by the threads it references: a root
        it tags, or a member whose roots are known (a comment tags its issue, not its
        repository; a reply tags the comment). At most ``cap``: a hostile event's tags cost
        no more."""
        out: dict[str, None] = {}
        for tag in event.tags:
            if len(out) >= cap:
                break
            if len(tag) < 2 or tag[0] not in REFERENCE_TAGS:
                continue
            for root in (tag[1],) if tag[1] in self.root_ids else self.roots_of.get(tag[1], ()):
                address = self.root_ids.get(root)
                if address is not None:
                    out[address] = None
        return list(out)[:cap]

    def note_direct_member(self, state: RelayState, event) -> None:
        """``event`` came from ``state``'s relay, checked."""
        self.note_member(event.id, event.tags, state)

    def note_held(self, entries) -> None:
        """What a read of the own relay returned (``(id, HeldEntry)`` pairs): the members
        among it."""
        if not self.root_ids:
            return
        for event_id, entry in entries:
            if entry.tags:
                self.note_member(event_id, entry.tags)

    def note_member(self, event_id: str, tags, came_from: RelayState | None = None) -> None:
        """If an event of ``tags`` is a direct member, every relay its roots' repositories
        list (and ``came_from``'s) gets its descendants' coverage at the next tick, unless it
        has it already."""
        roots = roots_tagged(event_id, tags, self.root_ids)
        if not roots:
            return
        urls = {came_from.url} if came_from is not None else set()
        self.roots_of[event_id] = roots
        for root in roots:
            self.members_of.setdefault(root, set()).add(event_id)
            needs = self.repos.get(self.root_ids[root])
            if needs is not None:
                urls.update(needs.relays)
        for url in urls:
            state = self.relays.get(url)
            if state is None or event_id in state.current.members:
                continue
            state.new_members.add(event_id)
            state.member_roots[event_id] = roots

    def prune_members(self) -> None:
        """Roots that left (their repository no longer Full): their members leave every
        relay's tables with them, so descendant filters and polls follow the work."""
        for root in self.members_of.keys() - self.root_ids.keys():
            for member in self.members_of.pop(root):
                left = self.roots_of.get(member, frozenset()) - {root}
                if left:
                    self.roots_of[member] = left
                else:
                    self.roots_of.pop(member, None)
        for state in self.relays.values():
            stale = stale_members(state.member_roots, self.root_ids) if state.member_roots else ()
            for member in stale:
                del state.member_roots[member]
                state.current.members.discard(member)
                state.new_members.discard(member)
                state.reopen_members.discard(member)

    def members_of_roots(self, state: RelayState, roots) -> None:
        """``state``'s relay is asked for ``roots``' threads (any batch of layer 3: a fresh
        start, a daily sync, roots new to it, a repository that lists it since): every member
        known of them gets its descendants' coverage there at the next tick (a relay listed
        after a member was seen, or whose roots came after it started, would get none)."""
        if not self.members_of:
            return
        for root in roots:
            for member in self.members_of.get(root, ()):
                if member not in state.current.members and member not in state.new_members:
                    state.new_members.add(member)
                    state.member_roots[member] = self.roots_of[member]

    def run(self, now: float) -> None:
        """New members of each connected relay get their coverage, once per
        DESCENDANT_TICK_SECS."""
        for state in self.relays.values():
            if not (state.new_members and state.connected):  # (the set first: mostly empty, and cheaper)
                continue
            if now - (state.descendants_started_at or 0) < constants.DESCENDANT_TICK_SECS:
                continue
            state.descendants_started_at = now
            ids, state.new_members = state.new_members, set()
            state.current.members |= ids
            filters = member_filters(state, ids)
            self.live.open_members(state, filters, fresh=True)
            self._start_historic(state, PendingItems(), filters)
