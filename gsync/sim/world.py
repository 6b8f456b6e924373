"""The simulated world: keys, relays, repositories and what gets published, all drawn from
one seed (``random.Random``; no wall clock, no hash-ordered iteration).

Events are signed for real (every check gsync applies passes), with the BIP-340 auxiliary
randomness derived from the id, so the same seed gives the same bytes in every process.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import coincurve
from coincurve._libsecp256k1 import ffi, lib

from ..protocol.event import Event, compact_json, compute_id

DOMAIN = "grasp.example"
OWN_URL = "ws://127.0.0.1:9"  # never dialled: the simulator answers for the own relay
START = 1_800_000_000.0  # the simulated epoch (2027-01-15)
DAY = 86_400.0

KIND_ANNOUNCEMENT, KIND_STATE = 30617, 30618
KIND_PATCH, KIND_ISSUE, KIND_COMMENT = 1617, 1621, 1111
IMPORT_PER_SECOND = 15  # an import's events a second (``World.imported``)


class Keys:
    """A named key, the same in every run."""

    def __init__(self, name: str):
        self.secret = hashlib.sha256(f"gsync-sim:{name}".encode()).digest()
        self._key = coincurve.PrivateKey(self.secret)
        self.pubkey = self._key.public_key_xonly.format().hex()
        # the keypair made once: coincurve's sign_schnorr makes it again and verifies what
        # it signed at every call (a quarter of the cost); the signature is the same bytes
        self._keypair = ffi.new("secp256k1_keypair *")
        if not lib.secp256k1_keypair_create(self._key.context.ctx, self._keypair, self.secret):
            raise ValueError("invalid secret")

    def sign(self, kind: int, tags, content: str, created_at: int) -> Event:
        tags = [list(t) for t in tags]
        eid = compute_id(self.pubkey, created_at, kind, tags, content)
        aux = hashlib.sha256(b"aux" + bytes.fromhex(eid)).digest()
        sig = self._sign(bytes.fromhex(eid), aux).hex()
        # (its tags and content as JSON kept, as parse_event keeps them: a relay sends an
        # event many times, and encoding them at each send showed in profiles)
        return Event(eid, self.pubkey, created_at, kind, tuple(tuple(t) for t in tags), content, sig,
                     _json_parts=(compact_json(tags), compact_json(content)))

    def _sign(self, message: bytes, aux: bytes) -> bytes:
        signature = ffi.new("unsigned char[64]")
        if not lib.secp256k1_schnorrsig_sign32(self._key.context.ctx, signature, message, self._keypair, aux):
            raise ValueError("signing failed")
        return bytes(ffi.buffer(signature))


@dataclass
class Repo:
    owner: Keys
    d: str
    relays: list[str]  # the remote relays its latest announcement lists
    lists_us: bool  # its announcements list our domain (the own relay accepts them)
    roots: list[Event] = field(default_factory=list)
    announcement: Event | None = None
    # its comments, for replies that tag only one of them (``World.member_reply``)
    members: list[Event] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{KIND_ANNOUNCEMENT}:{self.owner.pubkey}:{self.d}"


def _comment_tags(root: Event) -> list[list[str]]:
    """A NIP-22 comment's tags on ``root``, as clients write a top-level one."""
    return [["E", root.id, "", root.pubkey], ["K", str(root.kind)], ["P", root.pubkey],
            ["e", root.id, "", root.pubkey], ["k", str(root.kind)], ["p", root.pubkey]]


def relay_url(i: int) -> str:
    return f"wss://relay{i}.example"


class World:
    """What exists: relays (a pool, some used only once churn names them), authors and
    repositories, and the maker of every event. ``repo_of`` maps each event id to the
    repository it belongs to (the own relay's accept policy and the liveness check read it)."""

    def __init__(self, rng: random.Random, *, relays: int, repos: int,
                 series: random.Random | None = None, series_share: float = 0.0,
                 imports: random.Random | None = None, imports_share: float = 0.0):
        self.rng = rng
        # patch series sent at one second (``series``), imports (``imports``): each drawn
        # apart from ``rng``, so that without them the world is what it was before them
        self._series, self._series_share = series, series_share
        self.imports_rng, self.imports_share = imports, imports_share
        self.relay_urls = [relay_url(i) for i in range(relays)]
        self.spare_urls = [relay_url(i) for i in range(relays, relays + max(2, relays // 4))]
        self.bootstrap = self.relay_urls[:2]
        self.authors = [Keys(f"author{i}") for i in range(max(8, repos // 2))]
        self.repos: list[Repo] = []
        self.repo_of: dict[str, Repo] = {}
        self.member_of: dict[str, str] = {}  # a reply tagging only a thread member → that member
        self.events: dict[str, Event] = {}  # every genuine event made, by id
        self._n_repos = repos
        self._counter = 0

    # -- making events --------------------------------------------------------------------

    def _keep(self, event: Event, repo: Repo) -> Event:
        self.events[event.id] = event
        self.repo_of[event.id] = repo
        return event

    def _pick_relays(self) -> list[str]:
        pool = self.relay_urls
        n = 1 + min(len(pool) - 1, self.rng.choice((0, 0, 1, 1, 2)))
        return self.rng.sample(pool, n)

    def new_repo(self, created_at: int) -> tuple[Repo, Event]:
        i = len(self.repos)
        repo = Repo(self.rng.choice(self.authors), f"repo{i}", self._pick_relays(), self.rng.random() < 0.9)
        self.repos.append(repo)
        return repo, self.announce(repo, created_at)

    def announce(self, repo: Repo, created_at: int) -> Event:
        ours = [f"wss://{DOMAIN}"] if repo.lists_us else []
        clone = f"https://{DOMAIN if repo.lists_us else 'git.elsewhere.example'}/{repo.owner.pubkey[:8]}/{repo.d}.git"
        tags = [["d", repo.d], ["name", repo.d], ["clone", clone], ["relays", *ours, *repo.relays]]
        created_at = max(created_at, repo.announcement.created_at + 1) if repo.announcement else created_at
        event = repo.owner.sign(KIND_ANNOUNCEMENT, tags, "", created_at)
        repo.announcement = event
        return self._keep(event, repo)

    def churn(self, repo: Repo, created_at: int) -> Event:
        """A newer announcement listing another set of relays (one added or dropped)."""
        relays = list(repo.relays)
        pool = self.relay_urls + self.spare_urls
        if len(relays) > 1 and self.rng.random() < 0.5:
            relays.remove(self.rng.choice(relays))
        else:
            extra = [u for u in pool if u not in relays]
            if extra:
                relays.append(self.rng.choice(extra))
        repo.relays = relays
        return self.announce(repo, created_at)

    def state(self, repo: Repo, created_at: int) -> Event:
        self._counter += 1
        tags = [["d", repo.d], ["refs/heads/main", hashlib.sha1(f"{repo.d}{self._counter}".encode()).hexdigest()],
                ["HEAD", "ref: refs/heads/main"]]
        return self._keep(repo.owner.sign(KIND_STATE, tags, "", created_at), repo)

    def root(self, repo: Repo, created_at: int) -> Event:
        self._counter += 1
        author = self.rng.choice(self.authors)
        kind = self.rng.choice((KIND_ISSUE, KIND_ISSUE, KIND_PATCH))
        tags = [["a", repo.address], ["p", repo.owner.pubkey]]
        tags.append(["subject", f"issue {self._counter}"] if kind == KIND_ISSUE else ["t", "root"])
        event = author.sign(kind, tags, f"root {self._counter}", created_at)
        repo.roots.append(event)
        return self._keep(event, repo)

    def series(self, repo: Repo, root: Event) -> list[Event]:
        """The rest of a patch series ``root`` opens (``series_share`` of roots), one to five
        patches by its author at its very second, as a client sends a series: what makes a
        relay's page end inside a second. Empty for most roots."""
        rng = self._series
        if rng is None or rng.random() >= self._series_share:
            return []
        author = next(a for a in self.authors if a.pubkey == root.pubkey)
        made = []
        for _ in range(rng.randint(1, 5)):
            self._counter += 1
            tags = [["a", repo.address], ["p", repo.owner.pubkey], ["t", "root"]]
            event = author.sign(KIND_PATCH, tags, f"root {self._counter}", root.created_at)
            repo.roots.append(event)
            made.append(self._keep(event, repo))
        return made

    def imported(self, repo: Repo, created_at: int) -> list[Event]:
        """An import (a tracker migrated in one go): 100 to 400 issues and comments on them,
        ``IMPORT_PER_SECOND`` to a second from ``created_at`` on, as a tool that stamps
        them as it signs them sends them: more in a repository than a relay's result cap,
        page boundaries inside its seconds. Drawn from ``imports`` alone."""
        rng = self.imports_rng
        made: list[Event] = []
        roots: list[Event] = []
        for i in range(rng.randint(100, 400)):
            second = created_at + i // IMPORT_PER_SECOND
            self._counter += 1
            author = rng.choice(self.authors)
            if roots and rng.random() < 0.4:
                tags = _comment_tags(rng.choice(roots))
                made.append(self._keep(author.sign(KIND_COMMENT, tags, f"imported {self._counter}", second), repo))
                continue
            tags = [["a", repo.address], ["p", repo.owner.pubkey], ["subject", f"imported {self._counter}"]]
            event = self._keep(author.sign(KIND_ISSUE, tags, f"imported {self._counter}", second), repo)
            repo.roots.append(event)
            roots.append(event)
            made.append(event)
        return made

    def imports_now(self) -> bool:
        """Does the world's next import come now (odds per publication: a twentieth of the
        share of repositories whose history holds one)?"""
        return self.imports_rng is not None and self.imports_rng.random() < self.imports_share / 20

    def import_target(self) -> Repo:
        return self.imports_rng.choice(self.repos)

    def comment(self, repo: Repo, root: Event, created_at: int) -> Event:
        self._counter += 1
        author = self.rng.choice(self.authors)
        event = self._keep(author.sign(KIND_COMMENT, _comment_tags(root), f"comment {self._counter}", created_at), repo)
        repo.members.append(event)
        return event

    def member_reply(self, rng: random.Random, created_at: int) -> tuple[Repo, Event] | None:
        """A reply tagging only a thread member (a comment), not its root: a kind-1 reply or
        a reaction, as clients send them. Drawn from ``rng`` alone (without them, the world
        is what it was)."""
        repos = [repo for repo in self.repos if repo.members]
        if not repos:
            return None
        repo = rng.choice(repos)
        member = rng.choice(repo.members)
        author = rng.choice(self.authors)
        kind = rng.choice((1, 7))
        event = self._keep(author.sign(kind, [["e", member.id, "", member.pubkey], ["p", member.pubkey]],
                                       "+" if kind == 7 else f"re {rng.randrange(10 ** 9)}", created_at), repo)
        self.member_of[event.id] = member.id
        return repo, event

    def activity(self, created_at: int) -> tuple[Repo, Event] | None:
        """One publication somewhere in the world: what, and of which repository."""
        r = self.rng.random()
        if not self.repos or (r < 0.04 and len(self.repos) < 2 * self._n_repos):
            return self.new_repo(created_at)
        repo = self.rng.choice(self.repos)
        if r < 0.08:
            return repo, self.churn(repo, created_at)
        if r < 0.18:
            return repo, self.state(repo, created_at)
        if r < 0.5 or not repo.roots:
            return repo, self.root(repo, created_at)
        return repo, self.comment(repo, self.rng.choice(repo.roots), created_at)

    def history(self, start: int) -> list[tuple[Repo, Event]]:
        """What the world held before gsync first started: every repository with its
        announcement, state, roots and comments, oldest first."""
        made = []
        for _ in range(self._n_repos):
            born = start - self.rng.randrange(2, 365) * int(DAY)
            repo, ann = self.new_repo(born)
            made.append((repo, ann))
            made.append((repo, self.state(repo, born + 60)))
            for _ in range(self.rng.randrange(0, 5)):
                root = self.root(repo, born + self.rng.randrange(3600, int(DAY)))
                made.append((repo, root))
                made += [(repo, patch) for patch in self.series(repo, root)]
                for _ in range(self.rng.randrange(0, 4)):
                    made.append((repo, self.comment(repo, root, root.created_at + self.rng.randrange(60, 86_400))))
            if self.imports_rng is not None and self.imports_rng.random() < self.imports_share:
                at = born + self.imports_rng.randrange(3600, int(DAY))
                made += [(repo, event) for event in self.imported(repo, at)]
        made.sort(key=lambda pair: (pair[1].created_at, pair[1].id))
        return made
