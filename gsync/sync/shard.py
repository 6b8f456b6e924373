"""Static hash sharding of the remote relays across gsync instances (``[cluster] shard``).

Everything gsync knows is derived from the own relay (what to sync) and the remotes (what
they hold), so instances that share one own relay can split the remotes between them with
no coordination: each takes the relays whose URL hashes to its index, as Prometheus'
``hashmod`` relabelling splits scrape targets. Every relay is then synced by exactly one
instance, and each instance subscribes to the own relay on its own.

Pure. The hash is SHA-256 of the normalized URL (stable across processes and versions,
unlike ``hash()``); changing the instance count moves relays between instances, which
simply connect and sync them afresh.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


def shard_of(relay_url: str, count: int) -> int:
    """Which of ``count`` shards syncs the relay at ``relay_url`` (a normalized URL)."""
    digest = hashlib.sha256(relay_url.encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclass(frozen=True)
class Shard:
    """This instance's part: shard ``index`` of ``count`` (``0/1``: every relay)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``i/N`` with 0 <= i < N. Raises ``ValueError`` with the reason."""
        index, sep, count = text.strip().partition("/")
        try:
            i, n = int(index), int(count)
        except ValueError:
            raise ValueError("must be i/N, e.g. 0/2 (this instance's index, the instance count)") from None
        if not sep or n < 1 or not 0 <= i < n:
            raise ValueError("must be i/N with N >= 1 and 0 <= i < N, e.g. 0/2 and 1/2 for two instances")
        return cls(i, n)

    def owns(self, relay_url: str) -> bool:
        return self.count == 1 or shard_of(relay_url, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
