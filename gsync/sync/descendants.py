"""Direct-member descendants (SPEC §3): one generation below the thread.

A *direct member* is an event that tags a root (issue, patch, PR) by ``e``/``E``/``q``:
layer 3 finds those. Some replies tag only their parent, a direct member, and no root; they
are fetched with ``descendant_filters`` over the members' ids. Membership is decided by
tagging a root directly, so what descendant filters bring in never becomes a member: the
traversal stops after one generation by construction. A member is known however gsync
sees it (a relay's answer, or what the own relay holds: most members are published to it
directly), and its descendants are asked of every relay its repository lists, as its root
is: a reply to it may have reached any of them. Pure.
"""
from __future__ import annotations

from collections.abc import Iterable

from ..protocol.event import Event
from .repos import SyncLevel

REFERENCE_TAGS = ("e", "E", "q")


def full_root_ids(repo_index) -> dict[str, str]:
    """Root event ids of every Full repository (StateOnly repos get no thread sync), each
    with its repository's address."""
    return {
        root: address
        for address, needs in repo_index.items()
        if needs.sync_level is SyncLevel.FULL
        for root in needs.root_events
    }


def member_roots(event: Event, root_ids) -> frozenset[str]:
    """The roots ``event`` is a direct member of (empty: none; a root itself is none)."""
    return roots_tagged(event.id, event.tags, root_ids)


def roots_tagged(event_id: str, tags, root_ids) -> frozenset[str]:
    """The roots an event of ``tags`` (an event's, or a held entry's ``(name, value)``
    pairs) is a direct member of; none for a root itself."""
    if event_id in root_ids:
        return frozenset()
    return frozenset(tag[1] for tag in tags
                     if len(tag) >= 2 and tag[0] in REFERENCE_TAGS and tag[1] in root_ids)


def stale_members(roots_of: dict[str, frozenset], root_ids) -> list[str]:
    """Members none of whose roots is synced any more (``root_ids``: a set, or a mapping
    by root): they leave with their roots."""
    return [member for member, roots in roots_of.items() if not any(root in root_ids for root in roots)]


def is_direct_member(event: Event, root_ids: set[str]) -> bool:
    return bool(roots_tagged(event.id, event.tags, root_ids))


def new_members(events: Iterable[Event], root_ids: set[str], known: set[str]) -> set[str]:
    return {e.id for e in events if e.id not in known and is_direct_member(e, root_ids)}
