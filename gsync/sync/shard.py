"""Static hash sharding of the remote relays across gsync instances (``[cluster] shard``).

Everything gsync knows is derived from the own relay (what to sync) and the remotes (what
they hold), so instances that share one own relay can split the remotes between them with
no coordination: each takes the relays that rank it first, and every relay is then synced
by exactly one instance, while each instance subscribes to the own relay on its own.

Pure. The split is rendezvous (highest-random-weight) hashing: every instance index gets a
weight per relay, SHA-256 of the index and the normalized URL (stable across processes and
versions, unlike ``hash()``), and the relay goes to the heaviest. Going from N to N + 1
instances then moves only the relays the new index outweighs, about 1/(N + 1) of them,
where ``hash % N`` moved about N/(N + 1); the relays that move simply connect and sync
afresh on their new instance.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# ``i/N`` in the INI; ``i-of-N`` where a ``/`` cannot go (systemd instance names, directories).
_SHARD_TEXT = re.compile(r"\s*(-?\d+)\s*(?:/|-of-)\s*(-?\d+)\s*\Z")


def shard_weight(relay_url: str, index: int) -> int:
    """The rendezvous weight of instance ``index`` for ``relay_url`` (a normalized URL)."""
    digest = hashlib.sha256(f"{index}\n{relay_url}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def shard_of(relay_url: str, count: int) -> int:
    """Which of ``count`` shards syncs the relay at ``relay_url`` (a normalized URL)."""
    return max(range(count), key=lambda index: shard_weight(relay_url, index))


@dataclass(frozen=True)
class Shard:
    """This instance's part: shard ``index`` of ``count`` (``0/1``: every relay)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``i/N`` or ``i-of-N`` with 0 <= i < N. Raises ``ValueError`` with the reason."""
        match = _SHARD_TEXT.match(text)
        if not match:
            raise ValueError("must be i/N (or i-of-N), e.g. 0/2: this instance's index, the instance count")
        i, n = int(match.group(1)), int(match.group(2))
        if n < 1 or not 0 <= i < n:
            raise ValueError("must be i/N with N >= 1 and 0 <= i < N, e.g. 0/2 and 1/2 for two instances")
        return cls(i, n)

    def owns(self, relay_url: str) -> bool:
        return self.count == 1 or shard_of(relay_url, self.count) == self.index

    @property
    def instance_name(self) -> str:
        """``i-of-N``: the systemd instance name (``gsync@0-of-2``) and state subdirectory."""
        return f"{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
