"""The rejected index: what it keeps of a refused event, and which filters may match it."""
import json

from gsync.protocol.filters import Filter
from gsync.sync.rejected import RejectedIndex

from . import factory as f

alice, bob = f.Author.named("alice"), f.Author.named("bob")
REPO = "30617:" + "a" * 64 + ":proj"


def test_a_refused_event_is_matched_by_its_tags_after_the_full_event_is_gone():
    bug = f.issue(bob, REPO)
    quote = f.quote(bob, bug, content="look")
    index = RejectedIndex(hot_secs=1)
    index.add(quote, now=0)
    index.expire(now=5)  # the hot tier (full events) is gone: only the cold entry is left
    assert index.any_may_match(Filter.make(tags={"q": [bug.id]}))
    assert not index.any_may_match(Filter.make(tags={"q": ["f" * 64]}))
    assert not index.any_may_match(Filter.make(tags={"e": [bug.id]}))  # it tags the root by q only
    assert not index.any_may_match(Filter.make(kinds=[1621], tags={"q": [bug.id]}))
    assert not index.any_may_match(Filter.make(tags={"q": [bug.id]}, until=quote.created_at - 1))


def test_tags_survive_a_restart_and_an_older_file_matches_conservatively():
    bug = f.issue(bob, REPO)
    quote = f.quote(bob, bug, content="look")
    index = RejectedIndex()
    index.add(quote, now=0)
    again = RejectedIndex.loads(index.dumps(), now=1)
    assert quote.id in again and again.items() == [(quote.created_at, quote.id)]
    assert again.any_may_match(Filter.make(tags={"q": [bug.id]}))
    assert not again.any_may_match(Filter.make(tags={"a": [REPO]}))
    # Version 1 kept no tags: any filter that allows the kind may match.
    old = json.dumps({"version": 1, "cold": {quote.id: [quote.created_at, 1, quote.pubkey, 0]}})
    legacy = RejectedIndex.loads(old, now=1)
    assert legacy.any_may_match(Filter.make(tags={"a": [REPO]}))
    assert not legacy.any_may_match(Filter.make(kinds=[1621], tags={"a": [REPO]}))
