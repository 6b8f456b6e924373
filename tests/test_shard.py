"""[cluster] shard: N instances split the remote relays by a hash of their URL, each relay
synced by exactly one of them."""
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


def test_the_split_is_stable_across_processes():
    # SHA-256 of the URL: the same answer in every instance and every run (unlike hash())
    assert shard_of("wss://relay.example.org", 4) == 1
    assert shard_of("ws://127.0.0.1:7001", 4) == 3


def test_shard_text():
    assert Shard.parse(" 1/3 ") == Shard(1, 3)
    assert str(Shard(1, 3)) == "1/3"
    assert Shard.parse("0/1").owns("wss://anything.example")


@pytest.mark.parametrize("text", ["", "1", "3/3", "-1/2", "0/0", "a/b", "1/2/3"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ValueError):
        Shard.parse(text)
