"""Building blocks of the end-to-end tests: an announcement that lists our service, and
waiting for events to land on the own relay (asked by id, in chunks LocalRelay answers)."""
from __future__ import annotations

from . import factory as f
from .relays import ids_on, wait_until

alice, bob, carol = f.Author.named("alice"), f.Author.named("bob"), f.Author.named("carol")


def our_announcement(own, remotes, d="proj", author=alice, **kw):
    """An announcement listing our service (clone + relay on the own relay's host:port)."""
    host = f"127.0.0.1:{own.port}"
    return f.announcement(
        author, d, clone=[f"http://{host}/{author.pubkey}/{d}.git"],
        relays=[f"ws://{host}", *(r.url for r in remotes)], **kw,
    )


def on_own(own, events) -> set[str]:
    """Which of ``events`` (Event objects or dicts) the own relay holds."""
    ids = sorted({e.id if hasattr(e, "id") else e["id"] for e in events})
    return ids_on(own.url, {"ids": ids}) if ids else set()


def assert_arrives(own, events, timeout=60.0, what="events"):
    """Wait until the own relay holds every one of ``events``. Each look asks only for what
    has not been seen yet (a sync of 1,500 events looked at every half second read them all
    each time: more CPU than gsync spent syncing them); once all have been seen, one read of
    them all confirms it, so an event seen earlier and lost since (an own relay that came
    back empty) is looked for again."""
    want = {e.id for e in events}
    seen: set[str] = set()

    def landed() -> bool:
        missing = sorted(want - seen)
        if missing:
            seen.update(ids_on(own.url, {"ids": missing}))
            if want - seen:
                return False
        held = on_own(own, events)
        seen.intersection_update(held)
        return want <= held

    wait_until(landed, timeout=timeout, interval=0.1 if len(want) <= 200 else 0.5, what=what)


def two_remote_history(own, a, b, d="proj"):
    """One repository's whole history split over remotes ``a`` and ``b``: state, an issue with
    a reply chain, a patch series with a status, a PR with an update, a quote. Returns the
    announcement and what each remote holds (both hold the announcement)."""
    repo = our_announcement(own, [a, b], d=d)
    state = f.state(alice, d)
    bug = f.issue(bob, repo)
    reply = f.comment(alice, bug, content="can you share logs?")
    reply2 = f.comment(bob, bug, reply, content="sure")
    series = f.patch(bob, repo)
    series2 = f.patch(bob, repo, reply_to=series)
    merged = f.status(alice, series, f.KIND_STATUS_APPLIED)
    pull = f.pr(carol, repo)
    pull_update = f.pr_update(carol, pull)
    quoted = f.quote(carol, bug)
    return repo, [repo, state, bug, reply, series, merged], [repo, reply2, series2, pull, pull_update, quoted]


def is_values_proof(raw: dict) -> bool:
    """Is ``raw`` (a filter as JSON decoded) a proof of how wide a list of tag values the
    relay reads (``gsync.sync.values_reach``: its padding among its values)? Tests counting
    a relay's asks leave it out (``tests/test_values_reach.py`` has its own)."""
    from gsync.sync.values_reach import PADDING_PREFIX

    return any(isinstance(v, list) and any(isinstance(x, str) and x.startswith(PADDING_PREFIX) for x in v)
               for k, v in raw.items() if k.startswith("#"))

