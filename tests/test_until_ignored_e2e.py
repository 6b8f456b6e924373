"""A relay that ignores a filter's ``until`` (a page past the first brings the newest events
again), end to end: gsync sees the newer events it drops, stops paging that relay, and
reaches what no page can by NIP-77 and fetches by id (whose pages it asks again while the
relay may have cut them: it caps an id filter as it caps any)."""
from __future__ import annotations

import pytest

from . import factory as f
from .relays import publish
from .scenario import assert_arrives, bob, our_announcement


@pytest.mark.slow
def test_a_repository_on_a_relay_ignoring_until_arrives_whole_in_its_first_sync(
        relay_factory, gsync_factory, scripted):
    own = relay_factory()
    remote = scripted(negentropy="serve", page_size=20, ignores_until=True)
    repo = our_announcement(own, [remote], d="ignores-until")
    issues = [f.issue(bob, repo, subject=f"issue {i}", created_at=f.BASE_CREATED_AT + 60 * i) for i in range(70)]
    remote.add(repo, *issues)
    publish(own.url, [repo])  # nothing of its history held: REQ pages first
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, issues, timeout=60, what="the 70 issues, past the relay's first page of 20")
    assert "relay_ignores_until" in gsync.log_text()
