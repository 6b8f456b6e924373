"""Direct-member descendants (SPEC §3): events that reply to a thread member without tagging
the root, one generation deep. Members are learned from what each relay sends; every 5 s the
new ones get descendant filters on that relay: live while the budget allows (else polled, as
``live`` does for any overflow) and one historic batch for what already exists.
"""
from __future__ import annotations

from ... import constants
from ...sync.descendants import member_roots, stale_members
from ...sync.relay_state import RelayState
from ...sync.targets import PendingItems
from .coverage import member_filters


class Descendants:
    """Owned by ``SyncManager``: the roots of Full repositories (who is a direct member) and
    each relay's members (its session's, and those to reopen on its ``RelayState``). What
    it starts goes through ``live`` (live coverage) and ``start_historic`` (a batch),
    passed in."""

    def __init__(self, relays: dict[str, RelayState], live, start_historic):
        self.relays = relays
        self.root_ids: set[str] = set()  # of Full repos: who is a direct member
        self.live = live
        self._start_historic = start_historic

    def set_roots(self, roots: set[str]) -> set[str]:
        """The roots of Full repositories are now ``roots``: the new ones returned; the
        members of those that left go from every relay's tables."""
        before, self.root_ids = self.root_ids, roots
        if before - roots:
            self.prune_members()
        return roots - before

    def note_direct_member(self, state: RelayState, event) -> None:
        if event.id in state.current.members:
            return
        roots = member_roots(event, self.root_ids)
        if roots:
            state.new_members.add(event.id)
            state.member_roots[event.id] = roots

    def prune_members(self) -> None:
        """Roots that left (their repository no longer Full): their members leave every
        relay's tables with them, so descendant filters and polls follow the work."""
        for state in self.relays.values():
            stale = stale_members(state.member_roots, self.root_ids) if state.member_roots else ()
            for member in stale:
                del state.member_roots[member]
                state.current.members.discard(member)
                state.new_members.discard(member)
                state.reopen_members.discard(member)

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
