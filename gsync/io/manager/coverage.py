"""What a relay is asked for: the filters of its items and of its thread members, within its
session's limits and without the shapes it refused by policy. Pure functions of its state,
read by every part of the manager that builds a subscription.
"""
from __future__ import annotations

from ...sync import filter_plan
from ...sync.relay_state import RelayState
from ...sync.targets import PendingItems


def sync_filters(state: RelayState, items: PendingItems, since: int | None, allowed_only: bool = True):
    """Layers 2 and 3 and state for ``items``; without the shapes this relay refused by
    policy unless ``allowed_only`` is False (what a probe looks for)."""
    limits = state.current.limits
    filters = filter_plan.build_sync_level_aware_filters(
        items.repos, items.root_events, since=since, budget=filter_plan.tag_value_budget(limits),
        most=filter_plan.values_cap(limits))
    return state.paused.allowed(filters) if allowed_only else filters


def member_filters(state: RelayState, ids, allowed_only: bool = True):
    """Descendant filters for the thread members ``ids`` (SPEC §3), as ``sync_filters``."""
    limits = state.current.limits
    filters = filter_plan.descendant_filters(ids, budget=filter_plan.tag_value_budget(limits),
                                             most=filter_plan.values_cap(limits))
    return state.paused.allowed(filters) if allowed_only else filters
