"""[cluster] shard: N instances split the remote relays by rendezvous hashing of their URL,
each relay synced by exactly one of them, and changing N moves about 1/(N + 1) of them."""
import pytest

from gsync.protocol.urls import normalize_relay_url
from gsync.sync.shard import Shard, shard_of


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
