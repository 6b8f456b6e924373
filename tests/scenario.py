"""Building blocks of the end-to-end tests: an announcement that lists our service, and
waiting for events to land on the own relay (asked by id, in chunks LocalRelay answers)."""
from __future__ import annotations

from . import factory as f
from .relays import ids_on, wait_until

alice = f.Author.named("alice")


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
    want = {e.id for e in events}
    wait_until(lambda: want <= on_own(own, events), timeout=timeout, interval=0.5, what=what)
