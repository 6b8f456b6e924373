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

A repository lists 2-3 relays, often of different shards, and a first sync would then fetch
its whole history once per shard. So each repository has a lead relay (``lead_relay``: the
heaviest of its relays by the same kind of weight, per repository), which every shard
computes alike from the announcement; the shard that owns it leads the repository's first
sync, and another shard's relays that list it wait, bounded, for those events to reach the
own relay before they choose their method (``split_led_elsewhere``; the manager does the
waiting, as for a leader of its own, ``sync.lead``). Nothing is exchanged between shards:
the own relay they share is the channel, and a leader's shard that is away only costs the
wait. Each shard sees what the others store there live (``io.self_subscriber``'s landed
stream), so a waiting batch waits on while another shard is still storing
(``waits_on_other_shard``) and then knows what it stored without reading it back.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from .targets import SyncItems

# What a batch waits for when another shard leads its repositories' first sync
# (``Shard.split_led_elsewhere``), as ``sync.lead`` keys a leading batch: no batch of this
# instance is that leader, so only the wait's bound ends the wait: as long as the pages it
# saves are worth (``sync.method.follower_wait``), FOLLOWER_WAIT_MAX_SECS at most.
OTHER_SHARD_LEAD = ("another shard", 0)

_CACHED = 4096  # relays' shards and repositories' lead relays kept (a hash each, asked often)

# ``i/N`` in the INI; ``i-of-N`` where a ``/`` cannot go (systemd instance names, directories).
_SHARD_TEXT = re.compile(r"\s*(-?\d+)\s*(?:/|-of-)\s*(-?\d+)\s*\Z")


def waits_on_other_shard(waited: float, since_landed: float | None, quiet: float, most: float) -> bool:
    """Does a batch that has waited ``waited`` seconds for another shard's lead (past the
    usual bound) wait on? While the other shards stored something within ``quiet``
    seconds (``since_landed``; None: nothing yet), ``most`` seconds in all: a shard whose
    delivery backlog drains at the own relay's pace stores its leads' events late, and
    fetching them here meanwhile brings them twice."""
    return waited < most and since_landed is not None and since_landed < quiet


def shard_weight(relay_url: str, index: int) -> int:
    """The rendezvous weight of instance ``index`` for ``relay_url`` (a normalized URL)."""
    return _weight(f"{index}\n{relay_url}")


def _weight(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


@lru_cache(maxsize=_CACHED)
def shard_of(relay_url: str, count: int) -> int:
    """Which of ``count`` shards syncs the relay at ``relay_url`` (a normalized URL).
    (Cached: asked of every relay a repository lists, at every tick and batch.)"""
    return max(range(count), key=lambda index: shard_weight(relay_url, index))


def lead_relay(address: str, relays: Iterable[str]) -> str | None:
    """The relay that leads the first sync of the repository at ``address`` across shards:
    the heaviest of ``relays`` (normalized URLs) by SHA-256 of the address and the URL, so
    leads spread over the relays and every shard picks the same one. None without relays."""
    return _lead_relay(address, tuple(sorted(relays)))


@lru_cache(maxsize=_CACHED)
def _lead_relay(address: str, relays: tuple[str, ...]) -> str | None:
    return max(relays, key=lambda url: _weight(f"{address}\n{url}"), default=None)


@dataclass(frozen=True)
class Shard:
    """This instance's part: shard ``index`` of ``count`` (``0/1``: every relay)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str, sep: str = "/") -> Shard:
        """``i/N`` or ``i-of-N`` with 0 <= i < N. Raises ``ValueError`` with the reason,
        which shows the form with ``sep`` (``-of-`` where the text came from ``--shard``)."""
        form, first, second = f"i{sep}N", f"0{sep}2", f"1{sep}2"
        match = _SHARD_TEXT.match(text)
        if not match:
            raise ValueError(f"must be {form}, e.g. {first}: this instance's index, the instance count")
        i, n = int(match.group(1)), int(match.group(2))
        if n < 1 or not 0 <= i < n:
            raise ValueError(f"must be {form} with N >= 1 and 0 <= i < N (counted from 0), e.g. "
                             f"{first} and {second} for two instances")
        return cls(i, n)

    def owns(self, relay_url: str) -> bool:
        return self.count == 1 or shard_of(relay_url, self.count) == self.index

    def leads(self, address: str, relays: Iterable[str]) -> bool:
        """Does this shard lead the first sync of the repository at ``address`` (listing
        ``relays``)? It does when it owns the lead relay, or the repository lists none."""
        lead = lead_relay(address, relays)
        return lead is None or self.owns(lead)

    def split_led_elsewhere(self, items: SyncItems, relays_of: Callable[[str], Iterable[str] | None],
                            repo_of_root: Callable[[str], str | None]) -> tuple[SyncItems, SyncItems]:
        """``items`` of a relay of this shard: (what this shard leads, what another shard
        leads). ``relays_of``: the relays a repository lists (None: not known); a root goes
        with its repository (``repo_of_root``; None: not known). What is not known is led
        here: nothing waits for a lead nobody has."""
        here, elsewhere = SyncItems(), SyncItems()

        def led_here(address: str | None) -> bool:
            relays = relays_of(address) if address is not None else None
            return self.count == 1 or relays is None or self.leads(address, relays)

        for address, level in items.repos.items():
            (here if led_here(address) else elsewhere).repos[address] = level
        for root in items.root_events:
            (here if led_here(repo_of_root(root)) else elsewhere).root_events.add(root)
        return here, elsewhere

    @property
    def instance_name(self) -> str:
        """``i-of-N``: the systemd instance name (``gsync@0-of-2``) and state subdirectory."""
        return f"{self.index}-of-{self.count}"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
