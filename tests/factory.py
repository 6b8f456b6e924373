"""NIP-34 events for tests, signed for real so they pass every check gsync applies.

Each builder takes ``created_at`` or draws the next value from a module-level counter, so a
test's events are ordered as they are made without reading the clock. ``extra_tags`` lets a
test add what a builder does not know about.

    alice = Author.named("alice")
    repo = announcement(alice, "gsync", clone=["https://relay.example.com/alice/gsync.git"],
                        relays=["wss://relay.example.com"])
    bug = issue(Author.named("bob"), repo, subject="crash on start")
    reply = comment(alice, bug, content="fixed in main")
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

from gsync.protocol.event import Event, generate_secret, public_key, sign_event

BASE_CREATED_AT = 1_700_000_000  # 2023-11-14: recent enough to look real, fixed for replay
_created_at = itertools.count(BASE_CREATED_AT)

KIND_ANNOUNCEMENT = 30617
KIND_STATE = 30618
KIND_PATCH = 1617
KIND_PR = 1618
KIND_PR_UPDATE = 1619
KIND_ISSUE = 1621
KIND_COMMENT = 1111
KIND_STATUS_OPEN, KIND_STATUS_APPLIED, KIND_STATUS_CLOSED, KIND_STATUS_DRAFT = 1630, 1631, 1632, 1633


def next_created_at() -> int:
    return next(_created_at)


@dataclass(frozen=True)
class Author:
    secret: str = field(default_factory=generate_secret, repr=False)
    pubkey: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "pubkey", public_key(self.secret))

    @classmethod
    def named(cls, name: str) -> Author:
        """The same key for the same name in every run: readable, reproducible tests."""
        return cls(hashlib.sha256(f"gsync-test-author:{name}".encode()).hexdigest())

    def sign(self, kind: int, tags=(), content: str = "", created_at: int | None = None) -> Event:
        if created_at is None:
            created_at = next_created_at()
        return sign_event(self.secret, created_at=created_at, kind=kind, tags=tags, content=content)


def _pubkey(who: Author | str) -> str:
    return who.pubkey if isinstance(who, Author) else who


def repo_addr(author: Author | str, d: str) -> str:
    return f"{KIND_ANNOUNCEMENT}:{_pubkey(author)}:{d}"


def _addr(repo: Event | str) -> str:
    """A repository given as its announcement or as its ``30617:<pubkey>:<d>`` address."""
    return repo.address if isinstance(repo, Event) else repo


def _owner(addr: str) -> str:
    return addr.split(":", 2)[1]


def _repo_of(event: Event) -> str | None:
    return event.first_tag_value("a")


# -- repositories ----------------------------------------------------------------------------


def announcement(
    author: Author,
    d: str,
    *,
    clone=(),
    relays=(),
    maintainers=(),
    name: str | None = None,
    description: str | None = None,
    euc: str | None = None,
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 30617. Multi-valued tags are one tag each, as NIP-34 writes them."""
    tags = [["d", d], ["name", name if name is not None else d]]
    if description is not None:
        tags.append(["description", description])
    if clone:
        tags.append(["clone", *clone])
    if relays:
        tags.append(["relays", *relays])
    if maintainers:
        tags.append(["maintainers", *(_pubkey(m) for m in maintainers)])
    if euc is not None:
        tags.append(["r", euc, "euc"])
    return author.sign(KIND_ANNOUNCEMENT, [*tags, *extra_tags], "", created_at)


def state(
    author: Author,
    d: str,
    *,
    refs: dict[str, str] | None = None,
    head: str | None = "refs/heads/main",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 30618: ``refs`` maps ref names to commit ids."""
    if refs is None:
        refs = {"refs/heads/main": hashlib.sha1(d.encode()).hexdigest()}
    tags = [["d", d], *([ref, commit] for ref, commit in refs.items())]
    if head is not None:
        tags.append(["HEAD", f"ref: {head}"])
    return author.sign(KIND_STATE, [*tags, *extra_tags], "", created_at)


# -- root events: issues, patches, pull requests ---------------------------------------------


def _repo_tags(repo: Event | str) -> list[list[str]]:
    addr = _addr(repo)
    return [["a", addr], ["p", _owner(addr)]]


def issue(
    author: Author,
    repo: Event | str,
    *,
    subject: str = "something is broken",
    content: str = "steps to reproduce: …",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 1621, a root event of its repository."""
    tags = [*_repo_tags(repo), ["subject", subject]]
    return author.sign(KIND_ISSUE, [*tags, *extra_tags], content, created_at)


def patch(
    author: Author,
    repo: Event | str,
    reply_to: Event | None = None,
    *,
    content: str = "From 0000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] fix\n\n---\n",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 1617. Without ``reply_to`` it is a root patch (``t root``); with it, the next
    patch of a series, tagging the previous one with a NIP-10 ``reply`` marker."""
    tags = _repo_tags(repo)
    if reply_to is None:
        tags.append(["t", "root"])
    else:
        tags.append(["e", reply_to.id, "", "reply"])
    return author.sign(KIND_PATCH, [*tags, *extra_tags], content, created_at)


def pr(
    author: Author,
    repo: Event | str,
    *,
    subject: str = "add a feature",
    commit: str = "a" * 40,
    clone=("https://git.example.com/fork.git",),
    branch: str | None = None,
    content: str = "",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 1618, a root event: ``commit`` is the tip to merge."""
    tags = [*_repo_tags(repo), ["subject", subject], ["c", commit], ["clone", *clone]]
    if branch is not None:
        tags.append(["branch-name", branch])
    return author.sign(KIND_PR, [*tags, *extra_tags], content, created_at)


def pr_update(
    author: Author,
    pull_request: Event,
    *,
    commit: str = "b" * 40,
    clone=("https://git.example.com/fork.git",),
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 1619: a new tip for ``pull_request``, which it tags NIP-22 style with ``E``/``P``."""
    tags = []
    addr = _repo_of(pull_request)
    if addr is not None:
        tags += _repo_tags(addr)
    tags += [["E", pull_request.id], ["P", pull_request.pubkey], ["c", commit], ["clone", *clone]]
    return author.sign(KIND_PR_UPDATE, [*tags, *extra_tags], "", created_at)


# -- replies -----------------------------------------------------------------------------------


def _scope_tags(target: Event, root: bool) -> list[list[str]]:
    """NIP-22 tags naming ``target``: upper case for the thread root, lower case for the parent."""
    e, a, k, p = ("E", "A", "K", "P") if root else ("e", "a", "k", "p")
    ref = [a, target.address, ""] if target.is_addressable else [e, target.id, "", target.pubkey]
    return [ref, [k, str(target.kind)], [p, target.pubkey]]


def comment(
    author: Author,
    root_event: Event,
    parent_event: Event | None = None,
    *,
    content: str = "looks good",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 1111 (NIP-22). ``parent_event`` defaults to the root: a top-level comment."""
    parent = parent_event if parent_event is not None else root_event
    tags = [*_scope_tags(root_event, root=True), *_scope_tags(parent, root=False)]
    return author.sign(KIND_COMMENT, [*tags, *extra_tags], content, created_at)


def status(
    author: Author,
    root_event: Event,
    kind: int = KIND_STATUS_OPEN,
    *,
    content: str = "",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kinds 1630 open, 1631 applied/merged, 1632 closed, 1633 draft, for an issue/patch/PR."""
    if not KIND_STATUS_OPEN <= kind <= KIND_STATUS_DRAFT:
        raise ValueError(f"{kind} is not a NIP-34 status kind")
    tags = [["e", root_event.id, "", "root"], ["p", root_event.pubkey]]
    addr = _repo_of(root_event)
    if addr is not None:
        tags.append(["a", addr])
        if _owner(addr) != root_event.pubkey:
            tags.append(["p", _owner(addr)])
    return author.sign(kind, [*tags, *extra_tags], content, created_at)


def quote(
    author: Author,
    target: Event | str,
    *,
    content: str = "have a look",
    created_at: int | None = None,
    extra_tags=(),
) -> Event:
    """Kind 1 note quoting an event (its address if addressable, else its id) or a raw value."""
    if isinstance(target, Event):
        target = target.address if target.is_addressable else target.id
    return author.sign(1, [["q", target], *extra_tags], content, created_at)
