"""RepoSyncIndex and the announcement rules of SPEC §3: what we want to sync, from whom."""
from gsync.constants import MAX_RELAYS_PER_ANNOUNCEMENT, PURGATORY_TTL_SECS
from gsync.protocol.event import generate_secret, public_key, sign_event
from gsync.sync.repos import (
    OwnRelay,
    RepoSyncIndex,
    SyncLevel,
    announcement_relays,
    identifier_of,
    lists_service,
    should_forward_layer1,
)

DOMAIN = "relay.example.com"
OWN = "ws://127.0.0.1:7777"
ALICE = generate_secret()
BOB = generate_secret()
T0 = 1_700_000_000


def announce(secret=ALICE, d="repo", clone=(), relays=(), maintainers=(), created_at=T0,
             one_tag_per_value=False):
    tags = [["d", d]]
    for name, values in (("clone", clone), ("relays", relays), ("maintainers", maintainers)):
        if not values:
            continue
        if one_tag_per_value:
            tags += [[name, v] for v in values]
        else:
            tags.append([name, *values])
    return sign_event(secret, created_at=created_at, kind=30617, tags=tags)


def ours(**kw):
    """An announcement that lists our service, plus whatever relays the test adds."""
    kw.setdefault("d", "repo")
    clone = [f"https://{DOMAIN}/alice/{kw['d']}.git"] + list(kw.pop("clone", ()))
    relays = [f"wss://{DOMAIN}"] + list(kw.pop("relays", ()))
    return announce(clone=clone, relays=relays, **kw)


def root(secret=BOB, kind=1621, repos=(), created_at=T0 + 10):
    return sign_event(secret, created_at=created_at, kind=kind, tags=[["a", a] for a in repos])


def new_index():
    return RepoSyncIndex(OWN, [DOMAIN])


# -- lists_service ----------------------------------------------------------------------


def test_announcement_with_our_clone_and_relay_lists_service():
    assert lists_service(ours(), [DOMAIN])


def test_one_tag_per_value_form_is_read_too():
    event = announce(
        clone=["https://github.com/a/b.git", f"https://{DOMAIN}/a/b.git"],
        relays=["wss://nos.lol", f"wss://{DOMAIN}"],
        one_tag_per_value=True,
    )
    assert lists_service(event, [DOMAIN])


def test_clone_alone_does_not_list_service():
    event = announce(clone=[f"https://{DOMAIN}/a/b.git"], relays=["wss://nos.lol"])
    assert not lists_service(event, [DOMAIN])


def test_relay_alone_does_not_list_service():
    event = announce(clone=["https://github.com/a/b.git"], relays=[f"wss://{DOMAIN}"])
    assert not lists_service(event, [DOMAIN])


def test_hosts_compare_case_insensitively():
    event = announce(clone=["HTTPS://Relay.Example.COM/a/b.git"], relays=["WSS://RELAY.example.com/"])
    assert lists_service(event, ["relay.EXAMPLE.com"])


def test_no_substring_matching():
    event = announce(
        clone=[f"https://{DOMAIN}.evil.net/a/b.git", f"https://evil-{DOMAIN}/x.git"],
        relays=[f"wss://{DOMAIN}.evil.net", f"wss://evil.net/{DOMAIN}"],
    )
    assert not lists_service(event, [DOMAIN])


def test_clone_must_be_http_and_relay_must_be_ws():
    event = announce(clone=[f"wss://{DOMAIN}/a.git"], relays=[f"https://{DOMAIN}"])
    assert not lists_service(event, [DOMAIN])


def test_port_is_part_of_the_match():
    with_port = announce(clone=["http://localhost:8080/a/b.git"], relays=["ws://localhost:8080"])
    assert lists_service(with_port, ["localhost:8080"])
    assert not lists_service(with_port, ["localhost"])
    assert not lists_service(with_port, ["localhost:9090"])


def test_clone_and_relay_must_name_the_same_domain():
    event = announce(clone=["https://a.example/x.git"], relays=["wss://b.example"])
    assert not lists_service(event, ["a.example", "b.example"])
    both = announce(clone=["https://a.example/x.git"], relays=["wss://a.example"])
    assert lists_service(both, ["a.example", "b.example"])


def test_default_ports_are_the_same_host():
    event = announce(clone=[f"https://{DOMAIN}:443/a.git"], relays=[f"wss://{DOMAIN}:443"])
    assert lists_service(event, [DOMAIN])


def test_garbage_urls_do_not_list_service_or_crash():
    event = announce(clone=["not a url", "https://", "https://[::1"], relays=["wss://", "\x00"])
    assert not lists_service(event, [DOMAIN])


# -- announcement_relays ----------------------------------------------------------------


def test_relays_include_relay_tags_and_clone_hosts_normalised():
    event = announce(
        clone=["https://git.example.org/a/b.git", "http://plain.example:8080/x.git"],
        relays=["wss://Nos.LOL/", "wss://relay.damus.io"],
    )
    assert announcement_relays(event) == {
        "wss://nos.lol",
        "wss://relay.damus.io",
        "wss://git.example.org",
        "ws://plain.example:8080",
    }


def test_invalid_relay_urls_are_skipped():
    event = announce(clone=["ftp://x.example/a", "git@github.com:a/b.git"],
                     relays=["https://not-a-relay.example", "wss://", "wss://ok.example"])
    assert announcement_relays(event) == {"wss://ok.example"}


def test_relays_are_capped_in_the_order_written():
    urls = [f"wss://r{i:02}.example" for i in range(40)]
    event = announce(relays=urls)
    chosen = announcement_relays(event)
    assert len(chosen) == MAX_RELAYS_PER_ANNOUNCEMENT
    assert chosen == set(urls[:MAX_RELAYS_PER_ANNOUNCEMENT])
    assert announcement_relays(event, cap=3) == set(urls[:3])


def test_duplicates_do_not_use_up_the_cap():
    event = announce(relays=["wss://a.example", "wss://A.example/", "wss://b.example"])
    assert announcement_relays(event, cap=2) == {"wss://a.example", "wss://b.example"}


def test_excluded_relays_do_not_use_up_the_cap():
    own = OwnRelay(OWN, [DOMAIN])
    event = ours(relays=["wss://a.example", "wss://b.example"])
    assert announcement_relays(event, cap=2, exclude=own.matches) == {
        "wss://a.example",
        "wss://b.example",
    }


def test_own_relay_matches_by_url_and_by_domain():
    own = OwnRelay(OWN, [DOMAIN, "alt.example:8443"])
    assert own.matches("ws://127.0.0.1:7777/")
    assert own.matches(f"wss://{DOMAIN}")
    assert own.matches(f"ws://{DOMAIN.upper()}")
    assert own.matches("wss://alt.example:8443")
    assert not own.matches("wss://alt.example")
    assert not own.matches("ws://127.0.0.1:7778")
    assert not own.matches("garbage")


# -- RepoSyncIndex: announcements -------------------------------------------------------


def test_announcement_registers_repo_without_own_relay():
    index = new_index()
    event = ours(relays=["wss://nos.lol"], clone=["https://git.example.org/a.git"])
    dirty = index.apply_announcement(event, SyncLevel.FULL, now=0)
    needs = index.get(event.address)
    assert needs.relays == {"wss://nos.lol", "wss://git.example.org"}
    assert needs.sync_level is SyncLevel.FULL
    assert dirty == needs.relays


def test_own_relay_url_is_never_a_target():
    index = new_index()
    event = ours(relays=[OWN, "ws://127.0.0.1:7777/"])
    index.apply_announcement(event, SyncLevel.FULL, now=0)
    assert index.get(event.address).relays == set()


def test_newer_announcement_replaces_relay_set():
    index = new_index()
    old = ours(relays=["wss://old.example", "wss://kept.example"], created_at=T0)
    new = ours(relays=["wss://new.example", "wss://kept.example"], created_at=T0 + 1)
    index.apply_announcement(old, SyncLevel.FULL, now=0)
    dirty = index.apply_announcement(new, SyncLevel.FULL, now=1)
    assert index.get(new.address).relays == {"wss://new.example", "wss://kept.example"}
    assert dirty == {"wss://old.example", "wss://new.example", "wss://kept.example"}


def test_older_announcement_answered_duplicate_is_ignored():
    # "duplicate:" is also what a relay holding a newer one answers: nothing learnt
    index = new_index()
    new = ours(relays=["wss://new.example"], created_at=T0 + 5)
    old = ours(relays=["wss://old.example"], created_at=T0)
    index.apply_announcement(new, SyncLevel.FULL, now=0)
    assert index.apply_announcement(old, SyncLevel.FULL, now=1, held=False) == set()
    assert index.get(new.address).relays == {"wss://new.example"}


def test_an_older_announcement_held_after_the_followed_one_adds_its_relays_until_the_followed_one_is_back():
    # The own relay showed an older one after the one followed: it lost the followed one
    # (it keeps the newest of an address), and a newer one may sit where only the older looks
    index = new_index()
    new = ours(relays=["wss://new.example", "wss://both.example"], created_at=T0 + 5)
    old = ours(relays=["wss://old.example", "wss://both.example"], created_at=T0)
    index.apply_announcement(new, SyncLevel.FULL, now=0)
    assert index.apply_announcement(old, SyncLevel.FULL, now=1) == {"wss://old.example"}
    needs = index.get(new.address)
    assert needs.relays == {"wss://new.example", "wss://both.example", "wss://old.example"}
    assert needs.announcement_id == new.id  # still the newest known: its events are still owed
    assert index.repos_listing("wss://old.example") == {new.address}
    assert index.apply_announcement(old, SyncLevel.FULL, now=2) == set()  # shown again: no change
    # the followed one shown again (delivered back): its relays alone
    assert index.apply_announcement(new, SyncLevel.FULL, now=3) >= {"wss://old.example"}
    assert needs.relays == {"wss://new.example", "wss://both.example"}
    assert "wss://old.example" not in index.listed_relays()


def test_a_newer_announcement_ends_the_older_ones_relays():
    index = new_index()
    mid = ours(relays=["wss://mid.example"], created_at=T0 + 5)
    old = ours(relays=["wss://old.example"], created_at=T0)
    newest = ours(relays=["wss://newest.example"], created_at=T0 + 9)
    index.apply_announcement(mid, SyncLevel.FULL, now=0)
    index.apply_announcement(old, SyncLevel.FULL, now=1)
    index.apply_announcement(newest, SyncLevel.FULL, now=2)
    assert index.get(mid.address).relays == {"wss://newest.example"}
    assert set(index.listed_relays()) == {"wss://newest.example"}


def test_only_the_last_older_announcement_held_counts():
    # bounded: two announcements' relays at most, however often the own relay loses one
    index = new_index()
    new = ours(relays=["wss://new.example"], created_at=T0 + 9)
    index.apply_announcement(new, SyncLevel.FULL, now=0)
    for i in range(5):
        index.apply_announcement(ours(relays=[f"wss://old{i}.example"], created_at=T0 + i), SyncLevel.FULL, now=i)
    assert index.get(new.address).relays == {"wss://new.example", "wss://old4.example"}
    assert set(index.listed_relays()) == {"wss://new.example", "wss://old4.example"}


def test_same_announcement_twice_changes_nothing():
    index = new_index()
    event = ours(relays=["wss://a.example"])
    index.apply_announcement(event, SyncLevel.FULL, now=0)
    assert index.apply_announcement(event, SyncLevel.FULL, now=1) == set()


def test_created_at_tie_goes_to_lower_id():
    a = ours(relays=["wss://a.example"], created_at=T0)
    b = ours(relays=["wss://b.example"], created_at=T0)
    low, high = sorted([a, b], key=lambda e: e.id)
    for order in ([high, low], [low, high]):
        index = new_index()
        for event in order:
            index.apply_announcement(event, SyncLevel.FULL, now=0)
        assert index.get(low.address).announcement_id == low.id


def test_repos_are_keyed_by_author_and_identifier():
    index = new_index()
    index.apply_announcement(ours(d="one"), SyncLevel.FULL, now=0)
    index.apply_announcement(ours(d="two"), SyncLevel.FULL, now=0)
    index.apply_announcement(ours(secret=BOB, d="one"), SyncLevel.FULL, now=0)
    assert len(index) == 3
    assert index.identifiers() == {"one", "two"}
    assert f"30617:{public_key(BOB)}:one" in index


def test_non_announcement_is_ignored():
    index = new_index()
    note = sign_event(ALICE, created_at=T0, kind=1, tags=[["d", "x"]])
    assert index.apply_announcement(note, SyncLevel.FULL, now=0) == set()
    assert len(index) == 0


def test_state_only_is_upgraded_to_full_by_self_subscription():
    index = new_index()
    event = ours(relays=["wss://a.example"])
    assert index.apply_announcement(event, SyncLevel.STATE_ONLY, now=0) == {"wss://a.example"}
    assert index.get(event.address).sync_level is SyncLevel.STATE_ONLY
    dirty = index.apply_announcement(event, SyncLevel.FULL, now=10)
    assert index.get(event.address).sync_level is SyncLevel.FULL
    assert dirty == {"wss://a.example"}  # they now owe layers 2 and 3


def test_full_is_never_downgraded_by_purgatory():
    index = new_index()
    event = ours(relays=["wss://a.example"])
    index.apply_announcement(event, SyncLevel.FULL, now=0)
    newer = ours(relays=["wss://b.example"], created_at=T0 + 1)
    index.apply_announcement(newer, SyncLevel.STATE_ONLY, now=1)
    needs = index.get(event.address)
    assert needs.sync_level is SyncLevel.FULL
    assert needs.relays == {"wss://b.example"}  # but the newer relay set still applies
    assert index.expire_state_only(now=PURGATORY_TTL_SECS * 10) == set()
    assert event.address in index


def test_older_full_announcement_still_promotes_newer_state_only():
    index = new_index()
    purgatory = ours(relays=["wss://new.example"], created_at=T0 + 5)
    accepted = ours(relays=["wss://old.example"], created_at=T0)
    index.apply_announcement(purgatory, SyncLevel.STATE_ONLY, now=0)
    index.apply_announcement(accepted, SyncLevel.FULL, now=1)
    needs = index.get(purgatory.address)
    assert needs.sync_level is SyncLevel.FULL
    assert needs.relays == {"wss://new.example"}


# -- RepoSyncIndex: expiry ---------------------------------------------------------------


def test_state_only_expires_24h_after_last_purgatory_answer():
    index = new_index()
    event = ours(relays=["wss://a.example"])
    index.apply_announcement(event, SyncLevel.STATE_ONLY, now=100)
    assert index.expire_state_only(now=100 + PURGATORY_TTL_SECS - 1) == set()
    assert index.expire_state_only(now=100 + PURGATORY_TTL_SECS) == {"wss://a.example"}
    assert event.address not in index
    assert index.identifiers() == set()


def test_purgatory_answer_again_keeps_state_only_alive():
    index = new_index()
    event = ours(relays=["wss://a.example"])
    index.apply_announcement(event, SyncLevel.STATE_ONLY, now=0)
    index.apply_announcement(event, SyncLevel.STATE_ONLY, now=PURGATORY_TTL_SECS - 10)
    assert index.expire_state_only(now=PURGATORY_TTL_SECS + 10) == set()
    assert event.address in index


def state_event(secret=ALICE, d="repo"):
    return sign_event(secret, created_at=T0 + 20, kind=30618, tags=[["d", d]])


def test_state_events_held_in_purgatory_keep_their_repo_alive():
    """The own relay answering ``purgatory:`` to a state event still holds its repository
    (and a GRASP relay restarts its own clock for it then)."""
    index = new_index()
    event = ours(relays=["wss://a.example"])
    index.apply_announcement(event, SyncLevel.STATE_ONLY, now=0)
    assert index.note_state_in_purgatory(state_event(), now=PURGATORY_TTL_SECS - 10) == {event.address}
    assert index.expire_state_only(now=PURGATORY_TTL_SECS + 10) == set()
    assert index.expire_state_only(now=2 * PURGATORY_TTL_SECS - 10) == {"wss://a.example"}


def test_only_state_by_the_owner_or_a_maintainer_of_that_d_keeps_a_repo_alive():
    index = new_index()
    event = ours(relays=["wss://a.example"], maintainers=[public_key(BOB)])
    index.apply_announcement(event, SyncLevel.STATE_ONLY, now=0)
    stranger = generate_secret()
    assert index.note_state_in_purgatory(state_event(stranger), now=5) == set()
    assert index.note_state_in_purgatory(state_event(d="other"), now=5) == set()
    assert index.note_state_in_purgatory(state_event(BOB), now=5) == {event.address}
    assert index.note_state_in_purgatory(ours(), now=5) == set()  # not a state event


def test_state_in_purgatory_changes_nothing_for_full_repos():
    index = new_index()
    event = ours(relays=["wss://a.example"])
    index.apply_announcement(event, SyncLevel.FULL, now=0)
    assert index.note_state_in_purgatory(state_event(), now=5) == set()
    assert index.get(event.address).purgatory_seen_at is None
    assert index.is_full(event.address) and not index.is_full("30617:x:y")


# -- RepoSyncIndex: root events ----------------------------------------------------------


def test_root_event_is_added_to_the_repo_it_tags():
    index = new_index()
    repo = ours(relays=["wss://a.example"])
    index.apply_announcement(repo, SyncLevel.FULL, now=0)
    issue = root(repos=[repo.address])
    assert index.apply_root_event(issue) == {"wss://a.example"}
    assert index.get(repo.address).root_events == {issue.id}
    assert index.apply_root_event(issue) == set()  # already known


def test_root_kinds_are_patches_prs_and_issues_only():
    index = new_index()
    repo = ours(relays=["wss://a.example"])
    index.apply_announcement(repo, SyncLevel.FULL, now=0)
    for kind in (1617, 1618, 1621):
        assert index.apply_root_event(root(kind=kind, repos=[repo.address]))
    for kind in (1, 1111, 1619, 1630):
        assert index.apply_root_event(root(kind=kind, repos=[repo.address])) == set()
    assert len(index.get(repo.address).root_events) == 3


def test_root_event_tagging_several_repos_joins_each_known_one():
    index = new_index()
    a = ours(d="a", relays=["wss://a.example"])
    b = ours(secret=BOB, d="b", relays=["wss://b.example"])
    for repo in (a, b):
        index.apply_announcement(repo, SyncLevel.FULL, now=0)
    patch = root(kind=1617, repos=[a.address, b.address, "30617:ff:unknown"])
    assert index.apply_root_event(patch) == {"wss://a.example", "wss://b.example"}
    assert patch.id in index.get(a.address).root_events
    assert patch.id in index.get(b.address).root_events


def test_root_event_before_its_announcement_is_adopted_later():
    index = new_index()
    repo = ours(relays=["wss://a.example"])
    issue = root(repos=[repo.address])
    assert index.apply_root_event(issue) == set()
    index.apply_announcement(repo, SyncLevel.FULL, now=0)
    assert index.get(repo.address).root_events == {issue.id}


def test_roots_version_moves_on_whenever_the_roots_of_full_repos_may_change():
    """``roots_version`` is what decides whether the descendants' roots are read again
    (``OwnRelaySide.on_batch_window_closed``): every change to a Full repository's roots
    moves it on, and nothing else needs to."""
    index = new_index()

    def full():
        return {r for _, needs in index.items() if needs.sync_level is SyncLevel.FULL for r in needs.root_events}

    seen = [(index.roots_version, full())]

    def step(changed: bool):
        version, roots = index.roots_version, full()
        if roots != seen[-1][1]:
            assert version != seen[-1][0], "the roots changed and the version did not"
        assert (version != seen[-1][0]) == changed
        seen.append((version, roots))

    repo = ours(relays=["wss://a.example"])
    early = root(repos=[repo.address])
    index.apply_root_event(early)
    step(changed=False)  # parked: no repository yet
    index.apply_announcement(repo, SyncLevel.FULL, now=0)
    step(changed=True)  # adopted with its repository
    index.apply_root_event(root(repos=[repo.address], created_at=T0 + 20))
    step(changed=True)
    index.apply_root_event(early)
    step(changed=False)  # known already
    held = ours(d="held", relays=["wss://b.example"])
    index.apply_announcement(held, SyncLevel.STATE_ONLY, now=0)
    index.apply_root_event(root(repos=[held.address]))
    index.apply_announcement(held, SyncLevel.FULL, now=1)
    step(changed=True)  # promoted: its roots count now
    purgatory = ours(d="gone", relays=["wss://c.example"])
    index.apply_announcement(purgatory, SyncLevel.STATE_ONLY, now=0)
    index.apply_root_event(root(repos=[purgatory.address]))
    seen[-1] = (index.roots_version, full())
    index.expire_state_only(now=PURGATORY_TTL_SECS)
    step(changed=True)


def test_root_event_with_non_repo_a_tag_is_ignored():
    index = new_index()
    issue = root(repos=["30023:abc:article"])
    assert index.apply_root_event(issue) == set()


# -- maintainers and layer-1 forwarding --------------------------------------------------


def test_maintainers_of_a_known_repo():
    index = new_index()
    bob = public_key(BOB)
    index.apply_announcement(ours(d="proj", maintainers=[bob, "cc" * 32]), SyncLevel.FULL, now=0)
    assert index.maintainers_of("proj") == {bob, "cc" * 32}
    assert index.is_known_maintainer(bob, "proj")
    assert not index.is_known_maintainer(bob, "other")
    assert not index.is_known_maintainer(public_key(ALICE), "proj")  # the tag, not the author


def test_maintainers_follow_the_newest_announcement():
    index = new_index()
    bob = public_key(BOB)
    index.apply_announcement(ours(d="proj", maintainers=[bob]), SyncLevel.FULL, now=0)
    index.apply_announcement(ours(d="proj", created_at=T0 + 1), SyncLevel.FULL, now=1)
    assert not index.is_known_maintainer(bob, "proj")


def test_forward_announcement_that_lists_our_service():
    assert should_forward_layer1(ours(), new_index(), [DOMAIN])


def test_forward_announcement_by_known_maintainer_with_same_d():
    index = new_index()
    index.apply_announcement(ours(d="proj", maintainers=[public_key(BOB)]), SyncLevel.FULL, now=0)
    fork = announce(secret=BOB, d="proj", relays=["wss://elsewhere.example"])
    assert should_forward_layer1(fork, index, [DOMAIN])
    other_d = announce(secret=BOB, d="other", relays=["wss://elsewhere.example"])
    assert not should_forward_layer1(other_d, index, [DOMAIN])


def test_do_not_forward_unrelated_announcement():
    stranger = announce(secret=BOB, relays=["wss://nos.lol"], clone=["https://github.com/b/r.git"])
    assert not should_forward_layer1(stranger, new_index(), [DOMAIN])


def grasp_list(*values):
    return sign_event(ALICE, created_at=T0, kind=10317, tags=[["g", v] for v in values])


def test_forward_user_grasp_list_naming_our_service():
    index = new_index()
    assert should_forward_layer1(grasp_list("wss://other.example", f"wss://{DOMAIN}"), index, [DOMAIN])
    assert should_forward_layer1(grasp_list(f"https://{DOMAIN.upper()}/"), index, [DOMAIN])
    assert should_forward_layer1(grasp_list(DOMAIN), index, [DOMAIN])


def test_multi_value_g_tag_is_read():
    event = sign_event(ALICE, created_at=T0, kind=10317, tags=[["g", "wss://x.example", DOMAIN]])
    assert should_forward_layer1(event, new_index(), [DOMAIN])


def test_do_not_forward_user_grasp_list_without_us():
    index = new_index()
    assert not should_forward_layer1(grasp_list("wss://other.example"), index, [DOMAIN])
    assert not should_forward_layer1(grasp_list(f"wss://{DOMAIN}.evil.net"), index, [DOMAIN])
    assert not should_forward_layer1(grasp_list("not a url at all"), index, [DOMAIN])


def test_other_kinds_are_not_forwarded_by_layer1():
    note = sign_event(ALICE, created_at=T0, kind=1, tags=[["g", DOMAIN]])
    assert not should_forward_layer1(note, new_index(), [DOMAIN])


def test_identifier_of_keeps_colons_in_d():
    assert identifier_of("30617:abc:my:repo") == "my:repo"


def test_one_relays_targets_from_the_relay_listing_equal_the_full_derivation():
    """The manager asks one relay's targets (``relay_needs``, from the relay → repos
    listing) and whether a relay is listed at all: after any change they must agree with
    ``derive_relay_targets`` over every repository (a stale listing would connect or sync
    the wrong relays)."""
    import random

    from gsync.sync.targets import SyncItems, derive_relay_targets, relay_needs

    rng = random.Random(3)
    index = RepoSyncIndex(OWN, [DOMAIN])
    relays = [f"wss://r{i}.example" for i in range(5)]
    keys = [ALICE, BOB]
    roots = []
    for step in range(300):
        action = rng.choice(("announce", "announce", "purgatory", "root", "expire"))
        now = T0 + step * 3600
        if action in ("announce", "purgatory"):
            ev = ours(secret=rng.choice(keys), d=f"d{rng.randint(0, 3)}",
                      relays=rng.sample(relays, rng.randint(0, 3)), created_at=T0 + rng.randint(0, 50))
            index.apply_announcement(ev, SyncLevel.FULL if action == "announce" else SyncLevel.STATE_ONLY, now)
        elif action == "root":
            addr = f"30617:{public_key(rng.choice(keys))}:d{rng.randint(0, 3)}"
            ev = sign_event(BOB, created_at=T0 + step, kind=1621, tags=[["a", addr]])
            roots.append(ev.id)
            index.apply_root_event(ev)
        else:
            ttl = rng.choice((0, 10 ** 9))
            index.expire_state_only(now, ttl=ttl)
            if ttl == 0:  # every StateOnly repo has had its last purgatory answer by now
                assert all(n.sync_level is SyncLevel.FULL for _, n in index.items())
        targets = derive_relay_targets(index)
        assert set(index.listed_relays()) == set(targets), action
        for relay in relays:  # one relay's targets, from the relay → repos listing
            assert relay_needs(index, relay) == targets.get(relay, SyncItems()), (action, relay)
