"""The world ``bench/scale`` syncs: many relays, many repositories, each listing 2-3 relays.

- ``base_events``: every event but the announcements (states, roots, replies), signed once
  and cached on disk (``--cache``): they do not depend on which relays a repository lists.
  Per repository one state (30618), about a fifth roots (issues, patches, PRs, ``a``-tagged)
  and the rest replies (NIP-22 comments, some nested; statuses; PR updates; kind-1 quotes).
- ``layout``: for N relays, each repository lists 2 or 3 of them (seeded RNG), so a relay
  holds about ``2.5 / N`` of the world; ``announcements`` signs them with the relays' real
  URLs (ports are only known once the relays are started).
- ``seed_files``: per relay the JSON lines of its repositories' events, for LocalRelay's
  ``seed_file`` option (saved into LMDB before it listens).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass, field

DOMAIN = "grasp.bench.invalid"  # the own relay's public name (never dialled)
BASE_CREATED_AT = 1_700_000_000
ROOT_KINDS = (1617, 1618, 1621)
OWNERS = 64


def owner(i: int):
    from tests import factory as f

    return f.Author.named(f"scale-dev-{i % OWNERS:02d}")


def repo_d(i: int) -> str:
    return f"scale-{i:05d}"


@dataclass
class BaseEvents:
    """Events other than announcements: ``lines[k]`` is the JSON of an event of repository
    ``repo[k]``; ``roots[i]`` the root events (id, json) of repository ``i``."""

    n_repos: int
    lines: list[str] = field(default_factory=list)
    repo: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    roots: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.lines)


def base_events(n_events: int, n_repos: int, cache_dir: str, log=print) -> BaseEvents:
    """``n_events`` includes one announcement per repository (signed per layout), so this
    holds ``n_events - n_repos`` events. Deterministic; cached in ``cache_dir``."""
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"scale-base-{n_events}-{n_repos}-v1.tsv")
    if not os.path.exists(path):
        log(f"signing {n_events - n_repos:,} events into {path} (once; cached)")
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            for i, kind, eid, text in _generate(n_events, n_repos):
                fh.write(f"{i}\t{kind}\t{eid}\t{text}\n")
        os.replace(tmp, path)
    out = BaseEvents(n_repos)
    with open(path) as fh:
        for line in fh:
            i, kind, eid, text = line.rstrip("\n").split("\t", 3)
            i = int(i)
            out.lines.append(text)
            out.repo.append(i)
            out.ids.append(eid)
            if int(kind) in ROOT_KINDS:
                out.roots.setdefault(i, []).append((eid, text))
    return out


def _generate(n_events: int, n_repos: int):
    from tests import factory as f

    if n_events < 4 * n_repos:
        raise ValueError("need at least 4 events per repository (announcement, state, root, reply)")
    people = [f.Author.named(f"scale-user-{i:02d}") for i in range(48)]
    rng = random.Random(f"gsync-bench-scale/{n_events}/{n_repos}")
    clock = iter(range(BASE_CREATED_AT + n_repos, BASE_CREATED_AT + 20 * n_events))
    addresses = [f.repo_addr(owner(i), repo_d(i)) for i in range(n_repos)]
    per_repo = [n_events // n_repos + (1 if i < n_events % n_repos else 0) for i in range(n_repos)]
    for i in range(n_repos):
        ev = f.state(owner(i), repo_d(i), created_at=next(clock))
        yield i, ev.kind, ev.id, ev.to_json()
    roots: dict[int, list] = {}
    comments: dict[str, list] = {}
    plans = []
    for total in per_repo:
        n_roots = max(1, round(total / 5))
        n_roots = min(n_roots, total - 3)
        plans.append(["root"] * n_roots + ["reply"] * (total - 2 - n_roots))
    weights = [("comment", 45), ("nested", 20), ("status", 12), ("quote", 10), ("update", 13)]
    reply_types = [t for t, w in weights for _ in range(w)]
    for step in range(max(len(p) for p in plans)):
        for i in range(n_repos):
            if step >= len(plans[i]):
                continue
            who = people[rng.randrange(len(people))]
            mine = roots.setdefault(i, [])
            if plans[i][step] == "root":
                n = len(mine)
                if n % 3 == 0:
                    ev = f.issue(who, addresses[i], subject=f"issue {i}.{n}", created_at=next(clock))
                elif n % 3 == 1:
                    ev = f.patch(who, addresses[i], content=f"From {i:020x}{n:020x} Mon Sep 17 00:00:00 2001\n"
                                 f"Subject: [PATCH] change {i}.{n}\n\n---\n", created_at=next(clock))
                else:
                    ev = f.pr(who, addresses[i], subject=f"feature {i}.{n}",
                              commit=hashlib.sha1(f"{i}.{n}".encode()).hexdigest(), created_at=next(clock))
                mine.append(ev)
            else:
                root = mine[rng.randrange(len(mine))]
                kind = rng.choice(reply_types)
                if kind == "update" and root.kind != 1618:
                    kind = "comment"
                if kind == "nested" and not comments.get(root.id):
                    kind = "comment"
                if kind == "comment":
                    ev = f.comment(who, root, content=f"reply {step}", created_at=next(clock))
                    comments.setdefault(root.id, []).append(ev)
                elif kind == "nested":
                    parent = rng.choice(comments[root.id])
                    ev = f.comment(who, root, parent, content=f"nested {step}", created_at=next(clock))
                    comments[root.id].append(ev)
                elif kind == "status":
                    ev = f.status(who, root, rng.choice((1630, 1631, 1632, 1633)), created_at=next(clock))
                elif kind == "quote":
                    ev = f.quote(who, root, content=f"see nostr:{root.id[:8]}", created_at=next(clock))
                else:
                    ev = f.pr_update(who, root, commit=hashlib.sha1(f"u{step}.{i}".encode()).hexdigest(),
                                     created_at=next(clock))
            yield i, ev.kind, ev.id, ev.to_json()


def layout(n_relays: int, n_repos: int, seed: str = "") -> list[list[int]]:
    """For each repository, the indices of the 2 or 3 relays it lists."""
    rng = random.Random(f"gsync-bench-scale-layout/{n_relays}/{n_repos}/{seed}")
    return [rng.sample(range(n_relays), rng.choice((2, 3))) for _ in range(n_repos)]


def announcements(n_repos: int, repo_relays: list[list[int]], urls: list[str]) -> list[str]:
    """One announcement per repository, listing our service (clone + relay on ``DOMAIN``)
    and its relays' URLs; JSON lines."""
    from tests import factory as f

    out = []
    for i in range(n_repos):
        who = owner(i)
        ev = f.announcement(
            who, repo_d(i), clone=[f"http://{DOMAIN}/{who.pubkey}/{repo_d(i)}.git"],
            relays=[f"ws://{DOMAIN}", *(urls[r] for r in repo_relays[i])],
            created_at=BASE_CREATED_AT + i,
        )
        out.append(ev.to_json())
    return out


def seed_files(directory: str, base: BaseEvents, repo_relays: list[list[int]], anns: list[str],
               n_relays: int) -> list[str]:
    """Per relay a JSON-lines file of every event of the repositories that list it."""
    per_relay: list[list[str]] = [[] for _ in range(n_relays)]
    for i, relays in enumerate(repo_relays):
        for r in relays:
            per_relay[r].append(anns[i])
    for text, i in zip(base.lines, base.repo, strict=True):
        for r in repo_relays[i]:
            per_relay[r].append(text)
    paths = []
    for r, lines in enumerate(per_relay):
        path = os.path.join(directory, f"relay-{r:03d}.jsonl")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_lines(path: str, lines) -> str:
    with open(path, "w") as fh:
        for line in lines:
            fh.write(line + "\n")
    return path


def live_event(base: BaseEvents, repo: int, n: int, created_at: int) -> tuple[str, str]:
    """A fresh NIP-22 comment on a root of ``repo`` (id, JSON): what a live test publishes."""
    from gsync.protocol.event import parse_event
    from tests import factory as f

    root_id, root_text = base.roots[repo][n % len(base.roots[repo])]
    root = parse_event(json.loads(root_text), check_sig=False)
    ev = f.comment(f.Author.named("scale-live"), root, content=f"live {n}", created_at=created_at)
    return ev.id, ev.to_json()
