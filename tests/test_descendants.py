"""Direct members and their descendants: one generation, decided by tagging a root."""
from gsync.sync.descendants import full_root_ids, is_direct_member, new_members
from gsync.sync.relay_state import PolledCoverage, RelaySession, RelayState
from gsync.sync.repos import RepoSyncIndex, SyncLevel

from . import factory as f

alice, bob = f.Author.named("alice"), f.Author.named("bob")
REPO = f.announcement(alice, "tree", clone=["https://relay.example.com/a/tree.git"],
                      relays=["wss://relay.example.com", "wss://other.example.org"])
ROOT = f.issue(bob, REPO)


def _reply(parent, tag="e", **kw):
    return bob.sign(1, [[tag, parent.id]], "reply", **kw)


def test_an_event_tagging_a_root_by_e_E_or_q_is_a_direct_member():
    for tag in ("e", "E", "q"):
        assert is_direct_member(_reply(ROOT, tag), {ROOT.id})


def test_a_reply_to_a_member_only_is_not_a_member():
    member = f.comment(alice, ROOT)
    grandchild = _reply(member)
    assert is_direct_member(member, {ROOT.id})
    assert not is_direct_member(grandchild, {ROOT.id})


def test_the_root_itself_and_unrelated_tags_are_not_members():
    assert not is_direct_member(ROOT, {ROOT.id})
    assert not is_direct_member(bob.sign(1, [["a", REPO.address], ["p", ROOT.id]]), {ROOT.id})


def test_new_members_skips_known_ones():
    a, b = _reply(ROOT), _reply(ROOT, "E")
    assert new_members([a, b, ROOT], {ROOT.id}, known={a.id}) == {b.id}


def test_only_full_repositories_give_root_ids():
    index = RepoSyncIndex("wss://relay.example.com", ["relay.example.com"])
    index.apply_announcement(REPO, SyncLevel.FULL, now=0)
    index.apply_root_event(ROOT)
    assert full_root_ids(index) == {ROOT.id: REPO.address}  # (with its repository: its relays)
    waiting = f.announcement(alice, "waiting", clone=["https://relay.example.com/a/w.git"],
                             relays=["wss://relay.example.com"])
    index.apply_announcement(waiting, SyncLevel.STATE_ONLY, now=0)
    index.apply_root_event(f.issue(bob, waiting))
    assert full_root_ids(index) == {ROOT.id: REPO.address}


def test_a_lost_session_keeps_the_poll_cursor_and_forgets_the_rest_of_its_polling():
    """Polling resumes from the last successful poll (with its overlap), not from the
    reconnect: whatever came in between is asked for again."""
    state = RelayState("wss://relay.example.com", current=RelaySession(members={"m"}, poll_batch=7))
    for tier, cursor in ((state.polled, 100.0), (state.fresh_polled, 90.0)):
        tier.add(["f"], now=cursor)
        tier.started_at = 104.0
    state.end_session()
    assert (state.polled.cursor, state.fresh_polled.cursor) == (100.0, 90.0)
    for tier in (state.polled, state.fresh_polled):
        assert (tier.filters, tier.started_at, tier.added_at) == ([], None, None)
    assert state.current.poll_batch is None
    # reopened by the next connection: since the gap on a quick reconnect, whole on a fresh start
    assert state.reopen_members == {"m"} and not state.current.members and not state.new_members


def test_fresh_polled_coverage_joins_the_rest_from_the_earlier_cursor():
    settled, fresh = PolledCoverage(), PolledCoverage()
    settled.add(["old"], now=500.0)
    fresh.add(["new"], now=200.0)  # polled since 200: the merged polls must reach back there
    settled.absorb(fresh)
    assert (settled.filters, settled.cursor, settled.added_at) == (["old", "new"], 200.0, 500.0)
    assert (fresh.filters, fresh.added_at) == ([], None)
    empty = PolledCoverage()
    empty.absorb(PolledCoverage())
    assert empty.cursor is None


def test_members_leave_with_their_roots():
    from gsync.sync.descendants import member_roots, stale_members

    other = f.issue(bob, REPO, subject="another")
    both = bob.sign(1111, [["E", ROOT.id], ["e", other.id]])
    one = _reply(ROOT, "E")
    roots_of = {both.id: member_roots(both, {ROOT.id, other.id}), one.id: member_roots(one, {ROOT.id, other.id})}
    assert roots_of[both.id] == {ROOT.id, other.id}
    assert stale_members(roots_of, {ROOT.id, other.id}) == []
    assert stale_members(roots_of, {other.id}) == [one.id]  # the other still holds ``both``
    assert member_roots(ROOT, {ROOT.id}) == frozenset()


def test_a_member_goes_to_every_relay_its_repository_lists_and_leaves_with_its_roots():
    """However it is seen (a relay's checked copy, or a read of the own relay: ``(id,
    HeldEntry)`` pairs), a member is watched on every relay listing its repository; a
    relay's copy names that relay too. The members known, by root, are bounded by the roots:
    gone when their last root leaves."""
    from gsync.io.manager.descendants import Descendants
    from gsync.sync.own_held import HeldEntry

    index = RepoSyncIndex("wss://relay.example.com", ["relay.example.com"])
    index.apply_announcement(REPO, SyncLevel.FULL, now=0)
    index.apply_root_event(ROOT)
    other = f.issue(bob, REPO, subject="another")
    index.apply_root_event(other)
    relays = {url: RelayState(url) for url in ("wss://other.example.org", "wss://bootstrap.example.net")}
    d = Descendants(relays, live=None, start_historic=None, repos=index)
    assert d.set_roots(full_root_ids(index)) == {ROOT.id, other.id}
    held = bob.sign(1111, [["E", ROOT.id], ["e", other.id]])
    d.note_held([(held.id, HeldEntry.of(held)), (ROOT.id, HeldEntry.of(ROOT))])  # (a root is no member)
    listed = relays["wss://other.example.org"]
    assert listed.new_members == {held.id} and listed.member_roots[held.id] == {ROOT.id, other.id}
    assert not relays["wss://bootstrap.example.net"].new_members  # (not listed)
    copy = _reply(other, "q")
    d.note_direct_member(relays["wss://bootstrap.example.net"], copy)  # came from there: watched there too
    assert relays["wss://bootstrap.example.net"].new_members == {copy.id} and copy.id in listed.new_members
    assert d.members_of == {ROOT.id: {held.id}, other.id: {held.id, copy.id}}
    d.set_roots({other.id: REPO.address})  # ROOT left: ``held`` stays, a member of ``other`` still
    assert d.members_of == {other.id: {held.id, copy.id}} and d.roots_of[held.id] == {other.id}
    d.set_roots({})
    assert d.members_of == {} and d.roots_of == {}
