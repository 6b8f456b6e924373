"""The rejected index: what the own relay refused, what each refusal may wait for, and what
survives a restart (the cold tier on disk)."""
import json

from gsync.constants import REJECTED_HOT_SECS, STORE_PROBE_FIRST_SECS, STORE_PROBE_MAX_SECS
from gsync.protocol.filters import Filter
from gsync.sync.rejected import (
    MAX_DEPENDENCIES,
    OWN_STORES_KEY,
    STORE_RELEASES_MAX,
    TIME_KEY_PREFIX,
    RejectedIndex,
    author_key,
    dependencies,
    event_key,
    maintainer_key,
    repo_key,
)

from . import factory as f

alice, carol = f.Author.named("alice"), f.Author.named("carol")
REMOTE = "wss://remote.example.com"
REPO = f.repo_addr(alice, "proj")
CAROLS_REPO = f.repo_addr(carol, "proj")


def test_a_refused_announcement_waits_for_its_author_to_become_a_maintainer():
    ann = f.announcement(carol, "proj")
    assert dependencies(ann) == (maintainer_key(carol.pubkey, "proj"),)


def test_a_refused_state_event_waits_for_a_maintainer_listing_or_its_own_repository():
    st = f.state(carol, "proj")
    assert set(dependencies(st)) == {maintainer_key(carol.pubkey, "proj"), repo_key(CAROLS_REPO)}


def test_other_events_wait_for_the_repositories_they_name_and_the_events_they_reference():
    root = f.patch(alice, REPO)
    follow_up = f.patch(carol, CAROLS_REPO, reply_to=root)
    comment = f.comment(carol, f.issue(alice, REPO))
    assert set(dependencies(follow_up)) == {repo_key(CAROLS_REPO), event_key(root.id)}
    assert set(dependencies(comment)) == {event_key(comment.tag_values("E")[0])}


def test_dependencies_are_bounded_and_skip_what_names_nothing():
    many = carol.sign(1, [["e", f"{i:064x}"] for i in range(50)] + [["e", "not-an-id"], ["a", "1:x:y"]])
    keys = dependencies(many)
    assert len(keys) == 8 and all(k.startswith("event:") for k in keys)
    assert dependencies(carol.sign(1, [["t", "x"]])) == ()


def test_released_entries_come_back_hot_with_their_relay_then_leave_the_index():
    index = RejectedIndex(hot_secs=120)
    ann, other = f.announcement(carol, "proj"), f.announcement(carol, "elsewhere")
    index.add(ann, now=0, relay=REMOTE)
    index.add(other, now=0, relay=REMOTE)
    hot, cold = index.take_dependents({maintainer_key(carol.pubkey, "proj")}, now=10)
    assert hot == [(ann, REMOTE)] and cold == []
    assert ann.id not in index and other.id in index  # keyed by (author, d), not by author
    assert index.take_dependents({maintainer_key(carol.pubkey, "proj")}, now=10) == ([], [])


def test_past_the_hot_tier_only_the_id_and_its_relay_remain_to_fetch_again():
    index = RejectedIndex(hot_secs=120)
    follow_up = f.patch(carol, CAROLS_REPO)
    index.add(follow_up, now=0, relay=REMOTE)
    # Not expired by the tick yet: its hot time is what counts.
    hot, cold = index.take_dependents({repo_key(CAROLS_REPO)}, now=121)
    assert hot == [] and cold == [(follow_up.id, REMOTE)]


def test_an_entry_waiting_on_several_things_is_released_by_any_of_them_once():
    index = RejectedIndex()
    st = f.state(carol, "proj")
    index.add(st, now=0)
    hot, _ = index.take_dependents({maintainer_key(carol.pubkey, "proj"), repo_key(CAROLS_REPO)}, now=1)
    assert [e.id for e, _ in hot] == [st.id]
    assert index.take_dependents({repo_key(CAROLS_REPO)}, now=1) == ([], [])


def test_cold_entries_expire_after_seven_days_and_take_their_keys_along():
    index = RejectedIndex(hot_secs=120, cold_secs=7 * 86400)
    ann = f.announcement(carol, "proj")
    index.add(ann, now=0)
    assert index.expire(now=7 * 86400 - 1) == []
    assert ann.id in index
    assert index.expire(now=7 * 86400) == [ann.id]  # (the manager offers it again: out of seen)
    assert ann.id not in index and index.take_dependents({maintainer_key(carol.pubkey, "proj")}, 0) == ([], [])


def test_expire_skips_its_scans_only_while_nothing_is_due():
    """``expire`` runs every tick and skips its scans until the earliest entry is due: the
    same entries go, at the same calls, as with a scan at every call."""
    import random

    rng = random.Random(5)
    events = [f.issue(carol, CAROLS_REPO, subject=f"s{i}") for i in range(12)]
    skipping, scanning = RejectedIndex(hot_secs=120, cold_secs=3600), RejectedIndex(hot_secs=120, cold_secs=3600)
    now = 0.0
    for _ in range(400):
        now += rng.choice((1, 7, 60, 119, 120, 121, 900, 3599))
        roll = rng.random()
        if roll < 0.3:
            event, at = rng.choice(events), now - rng.choice((0, 0, 5, 3000))
            skipping.add(event, at)
            scanning.add(event, at)
        elif roll < 0.35:
            event = rng.choice(events)
            skipping.remove(event.id)
            scanning.remove(event.id)
        else:
            skipping.expire(now)
            scanning._expiry = float("-inf")  # a scan at every call
            scanning.expire(now)
        assert skipping.items() == scanning.items() and skipping._hot.keys() == scanning._hot.keys()
    # read back from its rows (cold entries only): they expire as well
    index = RejectedIndex(hot_secs=120, cold_secs=3600)
    index.add(events[0], now)
    loaded, _ = RejectedIndex.from_rows(index.take_changes()[0], now + 60, hot_secs=120, cold_secs=3600)
    loaded.expire(now + 3599)
    assert len(loaded) == 1
    loaded.expire(now + 3600)
    assert len(loaded) == 0


def test_a_new_refusal_replaces_the_old_entry():
    index = RejectedIndex()
    ann = f.announcement(carol, "proj")
    index.add(ann, now=0, relay="wss://a.example.com")
    index.add(ann, now=5, relay="wss://b.example.com")
    assert len(index) == 1
    assert index.take_dependents(dependencies(ann), now=5) == ([(ann, "wss://b.example.com")], [])


def test_the_cold_tier_survives_a_restart_with_relays_and_keys():
    index = RejectedIndex()
    st, ann = f.state(carol, "proj"), f.announcement(carol, "proj")
    index.add(st, now=100, relay=REMOTE)
    index.add(ann, now=100)
    loaded = RejectedIndex.loads(index.dumps(), now=200)
    assert sorted(loaded.items()) == sorted(index.items())
    _, cold = loaded.take_dependents({repo_key(CAROLS_REPO)}, now=200)
    assert cold == [(st.id, REMOTE)]  # hot events are not saved: fetched again by id
    assert loaded.take_dependents(dependencies(ann), now=200) == ([], [(ann.id, "")])  # no relay known


def test_an_event_refused_with_everything_else_waits_for_the_own_relay_to_store_again():
    """Given up while the own relay stored nothing (a full disk): released when it stores
    again, before a restart and after one; and by what it waited on besides, as ever."""
    index = RejectedIndex()
    reply = f.comment(carol, f.issue(alice, f.announcement(alice, "proj")))
    plain = f.issue(carol, f.announcement(alice, "proj"))
    index.add(reply, now=100, relay=REMOTE, until_own_stores=True)
    index.add(plain, now=100, relay=REMOTE)
    assert index.waits_on(OWN_STORES_KEY)
    loaded = RejectedIndex.loads(index.dumps(), now=200)
    assert loaded.waits_on(OWN_STORES_KEY)
    assert loaded.take_dependents({OWN_STORES_KEY}, now=200) == ([], [(reply.id, REMOTE)])
    assert not loaded.waits_on(OWN_STORES_KEY) and plain.id in loaded
    assert index.take_dependents({OWN_STORES_KEY}, now=101) == ([(reply, REMOTE)], [])
    index.add(reply, now=102, until_own_stores=True)
    keys = dependencies(reply)
    assert keys and index.take_dependents(keys[:1], now=103) == ([(reply, "")], [])
    assert not index.waits_on(OWN_STORES_KEY)


def test_an_event_released_by_the_own_relay_storing_again_a_few_times_then_waits_out_its_week():
    """Refused with everything again and again after those releases, it is likely an error
    of its own (in a quiet hour nothing else was stored): not released at every store."""
    index = RejectedIndex()
    issue = f.issue(carol, f.announcement(alice, "proj"))
    for n in range(STORE_RELEASES_MAX):
        index.add(issue, now=100 + n, until_own_stores=True)
        assert index.take_dependents({OWN_STORES_KEY}, now=100 + n) == ([(issue, "")], [])
    index.add(issue, now=5000, until_own_stores=True)
    assert not index.waits_on(OWN_STORES_KEY) and issue.id in index


def test_with_nothing_stored_anew_one_event_refused_with_everything_is_offered_again_at_doubling_gaps():
    """A quiet world (seed 421 of the stress mix): the own relay put read-only refused two
    issues, is writable again, and nothing new comes to show it. One waiting event is offered
    again a gap after the first waited, then at doubling gaps to the longest, the one refused
    longest ago first (one refused again goes to the back); the probes are no releases
    (refused again, it still waits on the own relay storing); a store anew starts the next
    wait with the short gap again."""
    index = RejectedIndex()
    first = f.issue(carol, f.announcement(alice, "proj"), content="first")
    newest = f.issue(carol, f.announcement(alice, "proj"), content="newest")
    plain = f.issue(alice, f.announcement(alice, "proj"), content="refused for itself")
    index.add(first, now=100, relay=REMOTE, until_own_stores=True)
    index.add(newest, now=200, relay=REMOTE, until_own_stores=True)
    index.add(plain, now=200, relay=REMOTE)
    assert index.take_store_probe(now=100 + STORE_PROBE_FIRST_SECS - 1) == ([], [])
    at = 100 + STORE_PROBE_FIRST_SECS
    assert at > 200 + REJECTED_HOT_SECS
    assert index.take_store_probe(now=at) == ([], [(first.id, REMOTE)])  # past the hot tier: fetched
    assert first.id not in index and newest.id in index and index.waits_on(OWN_STORES_KEY)
    index.add(first, now=at + 1, relay=REMOTE, until_own_stores=True)  # refused again
    probes, gap = [], 2 * STORE_PROBE_FIRST_SECS
    for _ in range(STORE_RELEASES_MAX + 3):
        assert index.take_store_probe(now=at + gap - 1) == ([], [])
        at += gap
        hot, cold = index.take_store_probe(now=at)
        assert len(hot) + len(cold) == 1
        probed = hot[0][0] if hot else next(e for e in (first, newest) if e.id == cold[0][0])
        probes.append(probed.id)
        index.add(probed, now=at, relay=REMOTE, until_own_stores=True)  # refused again
        assert index.waits_on(OWN_STORES_KEY)
        gap = min(STORE_PROBE_MAX_SECS, 2 * gap)
    assert gap == STORE_PROBE_MAX_SECS
    assert probes[::2] == [newest.id] * len(probes[::2]) and probes[1::2] == [first.id] * len(probes[1::2])
    assert index.take_store_probe(now=at + gap) == ([], [(newest.id, REMOTE)])
    assert index.take_store_probe(now=at + 3 * gap) == ([(first, REMOTE)], [])  # its body kept: the newest added
    assert index.take_store_probe(now=at + 10 * gap) == ([], [])
    assert plain.id in index  # what waits on its own dependencies is never probed
    # a store anew: the next wait starts with the short gap
    index.own_stored()
    index.add(first, now=at, relay=REMOTE, until_own_stores=True)
    assert index.take_store_probe(now=at + STORE_PROBE_FIRST_SECS) == ([(first, REMOTE)], [])


def test_a_probe_offers_an_announcement_before_what_waits_on_it_its_body_if_kept():
    """Seed 304 of the per-filter stress mix: the own relay back empty with its disk full
    refused 2,460 events and the announcements of their repositories; nothing new came, and
    the probe offered an issue, refused as of a repository not hosted, at every probe, for a
    week. A probe offers an announcement first, then states and roots, then the rest; hot,
    without a fetch; across a restart, fetched."""
    index = RejectedIndex()
    ann = f.announcement(alice, "proj")
    own_issue = f.issue(carol, ann)
    reply = f.comment(carol, own_issue)
    index.add(reply, now=100, relay=REMOTE, until_own_stores=True)
    index.add(own_issue, now=110, relay=REMOTE, until_own_stores=True)
    index.add(ann, now=500, relay="wss://other.example", until_own_stores=True)
    at = 100 + STORE_PROBE_FIRST_SECS  # the announcement was refused at 500: hot until 620
    loaded = RejectedIndex.loads(index.dumps(), now=at)
    assert index.take_store_probe(now=at) == ([(ann, "wss://other.example")], [])
    assert loaded.take_store_probe(now=at) == ([], [(ann.id, "wss://other.example")])
    assert loaded.take_store_probe(now=at + 2 * STORE_PROBE_FIRST_SECS) == ([], [(own_issue.id, REMOTE)])
    assert loaded.take_store_probe(now=at + 6 * STORE_PROBE_FIRST_SECS) == ([], [(reply.id, REMOTE)])


def test_the_own_stores_key_keeps_an_entry_within_its_bound_of_keys():
    many = f.issue(carol, f.announcement(alice, "proj"),
                   extra_tags=[["e", f"{i:064x}"] for i in range(2 * MAX_DEPENDENCIES)])
    index = RejectedIndex()
    index.add(many, now=100, until_own_stores=True)
    loaded = RejectedIndex.loads(index.dumps(), now=200)
    assert loaded.waits_on(OWN_STORES_KEY)


def test_each_relay_is_written_once():
    index = RejectedIndex()
    for i in range(20):
        index.add(f.issue(carol, REPO, subject=str(i)), now=0, relay=REMOTE)
    assert index.dumps().count(REMOTE) == 1


def test_a_format_1_file_still_loads_and_its_entries_wait_on_their_author():
    st = f.state(carol, "proj")
    old = json.dumps({"version": 1, "cold": {st.id: [st.created_at, st.kind, st.pubkey, 100.0]}})
    index = RejectedIndex.loads(old, now=200)
    assert index.items() == [(st.created_at, st.id)]
    assert index.take_dependents({author_key(carol.pubkey)}, now=200) == ([], [(st.id, "")])


def test_unreadable_files_and_entries_cost_nothing_but_themselves():
    st = f.state(carol, "proj")
    good = RejectedIndex()
    good.add(st, now=100)
    saved = json.loads(good.dumps())
    saved["cold"]["f" * 64] = ["junk"]
    saved["cold"]["not-an-id"] = [1, 100.0, -1, []]
    assert RejectedIndex.loads(json.dumps(saved), now=200).items() == [(st.created_at, st.id)]
    for text in ("", "{", "[]", '{"cold": 5}', '{"version": 2}'):
        assert len(RejectedIndex.loads(text, now=0)) == 0


def test_entries_older_than_the_cold_tier_are_not_loaded():
    index = RejectedIndex(cold_secs=1000)
    index.add(f.state(carol, "proj"), now=0)
    assert len(RejectedIndex.loads(index.dumps(), now=999, cold_secs=1000)) == 1
    assert len(RejectedIndex.loads(index.dumps(), now=1000, cold_secs=1000)) == 0


# -- which filters may match an entry (the NIP-77 method choice) --

bob = f.Author.named("bob")
OTHER_REPO = "30617:" + "a" * 64 + ":proj"


def test_a_refused_event_is_matched_by_its_tags_after_the_full_event_is_gone():
    bug = f.issue(bob, OTHER_REPO)
    quote = f.quote(bob, bug, content="look")
    index = RejectedIndex(hot_secs=1)
    index.add(quote, now=0)
    index.expire(now=5)  # the hot tier (full events) is gone: only the cold entry is left
    assert index.any_may_match(Filter.make(tags={"q": [bug.id]}))
    assert not index.any_may_match(Filter.make(tags={"q": ["f" * 64]}))
    assert not index.any_may_match(Filter.make(tags={"e": [bug.id]}))  # it tags the root by q only
    assert not index.any_may_match(Filter.make(kinds=[1621], tags={"q": [bug.id]}))
    assert not index.any_may_match(Filter.make(tags={"q": [bug.id]}, until=quote.created_at - 1))


def test_tags_survive_a_restart_and_an_older_file_matches_conservatively():
    bug = f.issue(bob, OTHER_REPO)
    quote = f.quote(bob, bug, content="look")
    index = RejectedIndex()
    index.add(quote, now=0)
    again = RejectedIndex.loads(index.dumps(), now=1)
    assert quote.id in again and again.items() == [(quote.created_at, quote.id)]
    assert again.any_may_match(Filter.make(tags={"q": [bug.id]}))
    assert not again.any_may_match(Filter.make(tags={"a": [OTHER_REPO]}))
    # Version 1 kept no tags: any filter that allows the kind may match.
    old = json.dumps({"version": 1, "cold": {quote.id: [quote.created_at, 1, quote.pubkey, 0]}})
    legacy = RejectedIndex.loads(old, now=1)
    assert legacy.any_may_match(Filter.make(tags={"a": [OTHER_REPO]}))
    assert not legacy.any_may_match(Filter.make(kinds=[1621], tags={"a": [OTHER_REPO]}))


def test_an_event_dated_ahead_of_the_clock_is_due_at_its_time_before_and_after_a_restart():
    """Refused an hour before its ``created_at`` (a relay refusing what is too far in the
    future): released once its time has come. One dated past the index's week gets no time
    key (its entry is gone before), one a few seconds ahead neither (clocks differ)."""
    now = 1_800_000_000
    repo = f.announcement(alice, "proj")
    ahead = f.issue(carol, repo, created_at=now + 3600)
    far = f.issue(carol, repo, content="far", created_at=now + 30 * 86_400)
    near = f.issue(carol, repo, content="near", created_at=now + 5)
    index = RejectedIndex()
    for event in (ahead, far, near):
        index.add(event, now=now, relay=REMOTE)
    key = f"{TIME_KEY_PREFIX}{now + 3600}"
    assert index.waits_on(key) and not any(index.waits_on(f"{TIME_KEY_PREFIX}{e.created_at}") for e in (far, near))
    loaded = RejectedIndex.loads(index.dumps(), now=now + 10)
    assert index.due(now + 3599) == set() and loaded.due(now + 3599) == set()
    assert index.due(now + 3600) == {key} and loaded.due(now + 4000) == {key}
    assert loaded.take_dependents({key}, now=now + 4000) == ([], [(ahead.id, REMOTE)])
    assert index.due(now + 5000) == set()  # (popped once)


def test_an_event_dated_ahead_waits_for_its_time_not_for_the_own_relay_storing():
    """Seed 460 of the stress mix: an issue dated hours ahead, refused as too late (a final
    refusal) waited on the own relay storing too; released at each store, refused again as
    too late, it spent its rounds before its time, and refused once more when its time came
    (the own relay read-only then) it waited out the week. Dated ahead, it waits for its
    time alone; refused at its time, it waits on the own relay storing with every round."""
    now = 1_800_000_000
    ahead = f.issue(carol, f.announcement(alice, "proj"), created_at=now + 3600)
    index = RejectedIndex()
    for n in range(STORE_RELEASES_MAX + 1):
        index.add(ahead, now=now + n, relay=REMOTE, until_own_stores=True)
        assert not index.waits_on(OWN_STORES_KEY)
        assert index.take_dependents({OWN_STORES_KEY}, now=now + n) == ([], [])
    index.add(ahead, now=now + 3600, relay=REMOTE, until_own_stores=True)  # at its time: read-only
    assert index.waits_on(OWN_STORES_KEY)


def test_time_keys_of_entries_gone_do_not_pile_up():
    """Entries removed before their time (released otherwise, pushed out) leave their time
    keys behind in the heap: dropped once they are twice the entries and a thousand more."""
    now = 1_800_000_000
    repo = f.announcement(alice, "proj")
    index = RejectedIndex()
    for i in range(5000):
        event = f.issue(carol, repo, content=f"ahead {i}", created_at=now + 3600 + i % 2000)
        index.add(event, now=now, relay=REMOTE)
        index.remove(event.id)
    assert len(index) == 0 and len(index._times) <= 1001


def test_released_by_a_store_what_needs_another_released_entry_waits_for_it_to_be_accepted():
    """Refused with everything else: an announcement, an issue of its repository, a comment on
    the issue, and an issue of another repository. The own relay storing again releases the
    announcement and the other issue; the issue waits for its repository, the comment for
    the issue (no longer for the own relay storing), and both for a time key besides,
    across a restart too."""
    from gsync.constants import RELEASE_BEHIND_OTHERS_SECS

    index = RejectedIndex()
    ann = f.announcement(alice, "proj")
    own_issue = f.issue(carol, ann)
    reply = f.comment(carol, own_issue)
    other = f.issue(carol, f.announcement(carol, "proj"))
    for event in (ann, own_issue, reply, other):
        index.add(event, now=100, relay=REMOTE, until_own_stores=True)
    hot, cold = index.take_dependents({OWN_STORES_KEY}, now=101)
    assert sorted(e.id for e, _ in hot) == sorted([ann.id, other.id]) and cold == []
    assert not index.waits_on(OWN_STORES_KEY)
    index = RejectedIndex.loads(index.dumps(), now=102)
    assert index.take_dependents({OWN_STORES_KEY}, now=102) == ([], [])
    assert index.take_dependents({repo_key(REPO)}, now=103) == ([], [(own_issue.id, REMOTE)])
    assert index.take_dependents({event_key(own_issue.id)}, now=104) == ([], [(reply.id, REMOTE)])
    for event in (own_issue, reply):  # the announcement refused again: they go by the time key
        index.add(event, now=200, relay=REMOTE, until_own_stores=True)
    index.add(ann, now=200, relay=REMOTE, until_own_stores=True)
    index.take_dependents({OWN_STORES_KEY}, now=201)
    assert index.due(201 + RELEASE_BEHIND_OTHERS_SECS - 2) == set()
    due = index.due(201 + RELEASE_BEHIND_OTHERS_SECS)
    assert due and index.take_dependents(due, now=201 + RELEASE_BEHIND_OTHERS_SECS) == (
        [], sorted([(own_issue.id, REMOTE), (reply.id, REMOTE)]))
