"""[cluster] shard: N instances split the remote relays by rendezvous hashing of their URL,
each relay synced by exactly one of them, and changing N moves about 1/(N + 1) of them; a
repository listed on relays of several shards has its first sync led by one of them."""
import pytest

from gsync.protocol.urls import normalize_relay_url
from gsync.sync.repos import SyncLevel
from gsync.sync.shard import Shard, lead_relay, shard_of
from gsync.sync.targets import SyncItems


def _relays(n):
    return [normalize_relay_url(f"wss://relay{i}.example.org") for i in range(n)] + [
        normalize_relay_url(f"ws://127.0.0.1:{7000 + i}") for i in range(n)]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16])
def test_shards_together_cover_every_relay_exactly_once(count):
    relays = _relays(300)
    shards = [Shard(i, count) for i in range(count)]
    for url in relays:
        assert sum(s.owns(url) for s in shards) == 1, url
    # and the split is roughly even (a hash, not a prefix)
    sizes = [sum(s.owns(u) for u in relays) for s in shards]
    assert min(sizes) >= len(relays) / count * 0.6


@pytest.mark.parametrize("count", [2, 3, 4, 8])
def test_a_thousand_relays_split_evenly(count):
    relays = _relays(500)
    sizes = [0] * count
    for url in relays:
        sizes[shard_of(url, count)] += 1
    fair = len(relays) / count
    # binomial spread: 4 standard deviations either side of a fair share
    slack = 4 * (fair * (1 - 1 / count)) ** 0.5
    assert all(abs(size - fair) <= slack for size in sizes), sizes


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_one_more_instance_moves_about_one_relay_in_n_plus_one(count):
    relays = _relays(500)  # 1,000 URLs
    before = {url: shard_of(url, count) for url in relays}
    after = {url: shard_of(url, count + 1) for url in relays}
    moved = [url for url in relays if before[url] != after[url]]
    # only to the new instance: no relay changes hands between the old ones
    assert all(after[url] == count for url in moved)
    expected = len(relays) / (count + 1)
    assert abs(len(moved) - expected) <= 4 * (expected * (1 - 1 / (count + 1))) ** 0.5, \
        f"{len(moved)} of {len(relays)} moved going {count} -> {count + 1}, expected about {expected:.0f}"


def test_one_fewer_instance_moves_only_the_leavers_relays():
    relays = _relays(500)
    for url in relays:
        if shard_of(url, 4) != 3:
            assert shard_of(url, 3) == shard_of(url, 4), url


def test_the_split_is_stable_across_processes():
    # SHA-256 of index and URL: the same answer in every instance and every run (unlike hash())
    assert shard_of("wss://relay.example.org", 4) == 3
    assert shard_of("ws://127.0.0.1:7001", 4) == 1


def test_shard_text():
    assert Shard.parse(" 1/3 ") == Shard(1, 3)
    assert Shard.parse("1-of-3") == Shard(1, 3)
    assert str(Shard(1, 3)) == "1/3"
    assert Shard(1, 3).instance_name == "1-of-3"
    assert Shard.parse("0/1").owns("wss://anything.example")


@pytest.mark.parametrize("text", ["", "1", "3/3", "-1/2", "0/0", "a/b", "1/2/3", "1-of-", "0-of-0", "1of2"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError):
        Shard.parse(text)


# -- the lead across shards: which shard fetches a repository listed on several


def _two_shard_relays():
    """Two relays, one of each shard of two."""
    relays = _relays(20)
    return (next(u for u in relays if Shard(0, 2).owns(u)),
            next(u for u in relays if Shard(1, 2).owns(u)))


def test_every_shard_picks_the_same_lead_relay_whatever_the_listing_order():
    relays = _relays(3)
    for i in range(50):
        address = f"30617:{'ab' * 32}:repo-{i}"
        assert lead_relay(address, relays) == lead_relay(address, list(reversed(relays))) in relays
    assert lead_relay("30617:x:y", []) is None


def test_leads_spread_over_the_relays_a_repository_lists():
    a, b = _two_shard_relays()
    led_by_a = sum(lead_relay(f"30617:{'cd' * 32}:repo-{i}", [a, b]) == a for i in range(1000))
    assert 400 < led_by_a < 600


def test_exactly_one_shard_leads_each_repository_listed_on_both():
    a, b = _two_shard_relays()
    for i in range(100):
        address = f"30617:{'ef' * 32}:repo-{i}"
        assert sum(Shard(k, 2).leads(address, [a, b]) for k in range(2)) == 1


def test_what_another_shard_leads_is_split_off_with_its_roots():
    a, b = _two_shard_relays()
    shard0 = Shard(0, 2)
    addresses = [f"30617:{'01' * 32}:repo-{i}" for i in range(40)]
    listed = {address: {a, b} for address in addresses}
    listed["30617:only-a:x"] = {a}
    roots = {f"root-{i}": address for i, address in enumerate(addresses)}
    items = SyncItems({address: SyncLevel.FULL for address in listed}, set(roots) | {"root-unknown"})

    here, elsewhere = shard0.split_led_elsewhere(items, listed.get, roots.get)

    led_by_b = {address for address in addresses if lead_relay(address, [a, b]) == b}
    assert led_by_b and set(elsewhere.repos) == led_by_b
    assert set(here.repos) == set(listed) - led_by_b  # a repository only shard 0 lists: here
    assert elsewhere.root_events == {root for root, address in roots.items() if address in led_by_b}
    assert "root-unknown" in here.root_events  # whose repository is not known: nothing to wait for
    # and the other shard leads exactly what shard 0 split off
    here1, elsewhere1 = Shard(1, 2).split_led_elsewhere(items, listed.get, roots.get)
    assert set(here1.repos) & set(elsewhere.repos) == set(elsewhere.repos)
    assert not set(elsewhere1.repos) & led_by_b


def test_an_unknown_repository_and_one_instance_lead_everything_here():
    a, b = _two_shard_relays()
    items = SyncItems({"30617:x:unknown": SyncLevel.FULL}, set())
    assert Shard(0, 2).split_led_elsewhere(items, lambda _: None, lambda _: None)[1] == SyncItems()
    items = SyncItems({f"30617:x:{i}": SyncLevel.FULL for i in range(20)}, set())
    here, elsewhere = Shard(0, 1).split_led_elsewhere(items, lambda _: {a, b}, lambda _: None)
    assert here == items and not elsewhere


def test_a_batch_waits_on_another_shard_only_while_it_stores_and_at_most_so_long():
    from gsync.sync.shard import waits_on_other_shard

    assert waits_on_other_shard(12, since_landed=1, quiet=5, most=60)
    assert not waits_on_other_shard(12, since_landed=5, quiet=5, most=60)  # quiet
    assert not waits_on_other_shard(12, since_landed=None, quiet=5, most=60)  # never stored: away
    assert not waits_on_other_shard(60, since_landed=0, quiet=5, most=60)  # long enough
