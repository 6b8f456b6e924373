"""derive_relay_targets and compute_actions: the pure three-way diff of seed 001."""
from gsync.protocol.event import generate_secret, sign_event
from gsync.sync.repos import RepoSyncIndex, RepoSyncNeeds, SyncLevel
from gsync.sync.targets import AddFilters, SyncItems, compute_actions, derive_relay_targets

FULL, STATE = SyncLevel.FULL, SyncLevel.STATE_ONLY
A, B = "wss://a.example", "wss://b.example"
R1, R2, R3 = "30617:aa:one", "30617:aa:two", "30617:bb:three"


def items(repos=None, roots=()):
    return SyncItems(dict(repos or {}), set(roots))


# -- derive_relay_targets ----------------------------------------------------------------


def test_derive_inverts_repo_relays_into_relay_repos():
    index = {
        R1: RepoSyncNeeds(relays={A, B}, root_events={"e1"}),
        R2: RepoSyncNeeds(relays={B}, root_events={"e2", "e3"}),
    }
    targets = derive_relay_targets(index)
    assert targets == {
        A: items({R1: FULL}, {"e1"}),
        B: items({R1: FULL, R2: FULL}, {"e1", "e2", "e3"}),
    }


def test_derive_keeps_sync_level_and_omits_state_only_roots():
    index = {
        R1: RepoSyncNeeds(relays={A}, root_events={"e1"}, sync_level=STATE),
        R2: RepoSyncNeeds(relays={A}, root_events={"e2"}),
    }
    assert derive_relay_targets(index)[A] == items({R1: STATE, R2: FULL}, {"e2"})


def test_derive_of_empty_index_is_empty():
    assert derive_relay_targets({}) == {}


def test_repo_without_relays_targets_nothing():
    assert derive_relay_targets({R1: RepoSyncNeeds(relays=set(), root_events={"x"})}) == {}


def test_derive_accepts_a_repo_sync_index():
    secret = generate_secret()
    event = sign_event(secret, created_at=1, kind=30617,
                       tags=[["d", "r"], ["relays", A, "ws://127.0.0.1:9"]])
    index = RepoSyncIndex("ws://127.0.0.1:9", ["relay.example.com"])
    index.apply_announcement(event, FULL, now=0)
    assert derive_relay_targets(index) == {A: items({event.address: FULL})}


# -- compute_actions ---------------------------------------------------------------------


def test_everything_is_new_against_empty_pending_and_confirmed():
    targets = {A: items({R1: FULL}, {"e1"})}
    assert compute_actions(targets, {}, {}, connected={A}) == [
        AddFilters(A, {R1: FULL}, frozenset({"e1"}))
    ]


def test_target_minus_pending_minus_confirmed():
    targets = {A: items({R1: FULL, R2: FULL, R3: FULL}, {"e1", "e2", "e3"})}
    pending = {A: [items({R1: FULL}, {"e1"})]}
    confirmed = {A: items({R2: FULL}, {"e2"})}
    assert compute_actions(targets, pending, confirmed, connected={A}) == [
        AddFilters(A, {R3: FULL}, frozenset({"e3"}))
    ]


def test_items_pending_in_several_batches_are_all_subtracted():
    targets = {A: items({R1: FULL, R2: FULL}, {"e1", "e2"})}
    pending = {A: [items({R1: FULL}), items({R2: FULL}, {"e1"}), items(roots={"e2"})]}
    assert compute_actions(targets, pending, {}, connected={A}) == []


def test_disconnected_relays_are_skipped():
    targets = {A: items({R1: FULL}), B: items({R1: FULL})}
    actions = compute_actions(targets, {}, {}, connected={B})
    assert [a.relay for a in actions] == [B]


def test_nothing_new_gives_no_action():
    targets = {A: items({R1: FULL}, {"e1"})}
    confirmed = {A: items({R1: FULL, R2: FULL}, {"e1", "e9"})}
    assert compute_actions(targets, {}, confirmed, connected={A}) == []


def test_state_only_confirmed_repo_promoted_to_full_is_new_work():
    targets = {A: items({R1: FULL})}
    confirmed = {A: items({R1: STATE})}
    assert compute_actions(targets, {}, confirmed, connected={A}) == [
        AddFilters(A, {R1: FULL}, frozenset())
    ]


def test_full_coverage_covers_a_state_only_target():
    targets = {A: items({R1: STATE})}
    assert compute_actions(targets, {A: [items({R1: FULL})]}, {}, connected={A}) == []


def test_only_restricts_the_diff_to_dirty_relays():
    targets = {A: items({R1: FULL}), B: items({R2: FULL})}
    actions = compute_actions(targets, {}, {}, connected={A, B}, only={B})
    assert [a.relay for a in actions] == [B]


def test_actions_are_sorted_by_relay():
    targets = {B: items({R1: FULL}), A: items({R1: FULL})}
    assert [a.relay for a in compute_actions(targets, {}, {}, connected={A, B})] == [A, B]


def test_compute_actions_does_not_mutate_its_inputs():
    targets = {A: items({R1: FULL}, {"e1"})}
    confirmed = {A: items({R2: FULL})}
    pending = {A: [items({R3: FULL})]}
    compute_actions(targets, pending, confirmed, connected={A})
    assert confirmed == {A: items({R2: FULL})}
    assert pending == {A: [items({R3: FULL})]}
    assert targets == {A: items({R1: FULL}, {"e1"})}


# -- SyncItems ---------------------------------------------------------------------------


def test_merging_items_keeps_the_higher_level():
    merged = items({R1: STATE, R2: FULL}, {"e1"})
    merged.add(items({R1: FULL, R2: STATE, R3: STATE}, {"e2"}))
    assert merged == items({R1: FULL, R2: FULL, R3: STATE}, {"e1", "e2"})


def test_empty_items_are_falsy():
    assert not items()
    assert items(roots={"e"})


def test_add_filters_items_round_trip():
    action = AddFilters(A, {R1: STATE}, frozenset({"e"}))
    assert action.items == items({R1: STATE}, {"e"})


def test_partition_takes_the_given_items_at_this_ones_levels():
    here = SyncItems({"30617:a:x": SyncLevel.FULL, "30617:a:y": SyncLevel.STATE_ONLY}, {"r1", "r2"})
    new = SyncItems({"30617:a:x": SyncLevel.STATE_ONLY, "30617:a:z": SyncLevel.FULL}, {"r2", "r3"})
    inside, rest = here.partition(new)
    assert inside == SyncItems({"30617:a:x": SyncLevel.FULL}, {"r2"})
    assert rest == SyncItems({"30617:a:y": SyncLevel.STATE_ONLY}, {"r1"})
