"""Relays that answer only precise queries: nostr-rs-relay with ``limit_scrapers = true``
(its sample config calls it recommended; off by default).

Such a relay scores each filter of a REQ: ``ids`` 2, ``authors``, ``kinds`` and any tags 1
each; a REQ with one filter under 2 is a "scraper", answered with an EOSE and nothing, and
not kept live (scsibug/nostr-rs-relay, ``Subscription::is_scraper``). gsync's layer 1 asks
``kinds`` alone and layers 2 and 3 one tag alone (``#a``, ``#e``, …), and the precise filters
packed with them go unanswered too: such a relay gave gsync nothing, silently.

Other relays refuse imprecise queries in words: khatru's ``AntiSyncBots`` policy (in its
README's example, so in relays built from it) closes any REQ with a filter that may bring
kind-1 notes without naming authors ("blocked: an author must be specified to get their kind:1
notes"), every tag filter of ours among them, and the NEG-OPENs and id fetches alike. A tag or
``ids`` filter refused alone (``may_be_refused_for_kinds``) is paused as any refused shape, and
asked once more with ``NOTES_EXCLUDED`` (``kinds_probe``): served so, the refusal was about
kinds, and from then on the relay's tag and ``ids`` filters ask those kinds (its ``kinds``
filters as they are: not refused); refused so, it was about the shape. Notes tagging a
repository or a thread come from other relays.

No second criterion makes those filters precise and loses nothing, so a relay is asked so
only once it is known to need it (``probe``: a precise query that brings what an imprecise
one did not), and then every filter it is asked is made precise (``made_precise``): a tag
filter asks the kinds NIP-34 and its threads use (``PRECISE_KINDS``: an event of another kind
tagging a repository comes from other relays only), a ``kinds`` filter the authors of the
repositories listing the relay (a new repository by someone else is found elsewhere).

Pure: filters in, filters out.
"""
from __future__ import annotations

from collections.abc import Iterable

from .filters import Filter

# What a repository's history and its threads are made of: notes and replies (1), deletions
# (5), reposts (6, 16), reactions (7), NIP-22 comments (1111), patches, PRs, PR updates,
# issues, replies to them (1617, 1618, 1619, 1621, 1622), statuses (1630-1633), labels
# (1985), zaps (9735), user GRASP lists (10317), announcements and states (30617, 30618).
PRECISE_KINDS = frozenset({1, 5, 6, 7, 16, 1111, 1617, 1618, 1619, 1621, 1622, 1630, 1631, 1632, 1633,
                           1985, 9735, 10317, 30617, 30618})
# What a relay refusing filters that may bring notes without naming authors is asked
NOTES_EXCLUDED = PRECISE_KINDS - {1}
# The software a relay's NIP-11 names that may limit imprecise queries so (the only one known).
LIMITING_SOFTWARE = "nostr-rs-relay"
# A probe asks for at most this many announcements, of at most this many authors.
PROBE_LIMIT = 5
PROBE_AUTHORS = 50
# A probe that found nothing (the relay held none of that yet) is asked again at the next
# imprecise REQ that brings nothing this long after, at the earliest (a paced start each)
PROBE_AGAIN_SECS = 3600.0


def precision(f: Filter) -> int:
    """nostr-rs-relay's score of a filter: ids 2, authors, kinds, tags 1 each."""
    return 2 * (f.ids is not None) + (f.authors is not None) + (f.kinds is not None) + bool(f.tags)


def is_imprecise(f: Filter) -> bool:
    return precision(f) < 2


def may_limit(software: str) -> bool:
    """Is the relay of a make known to answer imprecise queries with nothing?"""
    return LIMITING_SOFTWARE in software.lower()


def made_precise(f: Filter, authors: frozenset[str], kinds: frozenset[int] = PRECISE_KINDS,
                 ids_too: bool = False) -> Filter:
    """``f`` as a relay answering only precise queries is asked it: a tag filter with
    ``kinds`` (``PRECISE_KINDS``), a ``kinds`` filter with ``authors`` (if any are known); an
    ``ids`` filter with ``kinds`` too when ``ids_too`` (AntiSyncBots refuses one without: an id
    NIP-77 found there, under a filter asking those kinds, is of one of them). Any other as
    it is."""
    asks_by = ids_too if f.ids is not None else bool(f.tags)  # (an ids filter: only if ``ids_too``)
    if asks_by and f.kinds is None and f.authors is None:
        return f.replace(kinds=kinds)
    if not is_imprecise(f):
        return f
    if f.kinds is not None and f.authors is None and authors:
        return f.replace(authors=authors)
    return f


def may_be_refused_for_kinds(f: Filter) -> bool:
    """Might a relay have refused ``f`` for the kinds it may bring: a tag or ``ids`` filter
    naming no authors, asking any kind or notes among them? (An id fetch after a NIP-77
    exchange whose filter was not refused, layer 1's, may be the first refused.)"""
    return shape_may_be_refused_for_kinds(f.kinds, f.tags, f.ids is not None, f.authors is not None)


def shape_may_be_refused_for_kinds(kinds, tags, ids: bool, authors: bool) -> bool:
    """``may_be_refused_for_kinds`` of a shape (``sync.policy.coverage_key``'s parts)."""
    return (bool(tags) or ids) and not authors and (kinds is None or 1 in kinds)


def kinds_probe(f: Filter) -> Filter:
    """``f``, refused, as it is asked once more to tell whether the refusal was about kinds."""
    return made_precise(f, frozenset(), NOTES_EXCLUDED, ids_too=True)


def probe_sources(trigger: Iterable[Filter], authors: Iterable[str]) -> list[tuple[Filter, Filter]]:
    """The precise forms of ``trigger``'s filters (those asking stored events of a REQ that
    came back with nothing, the imprecise ones first: a precise one is its own form, ignored
    beside them all the same), each beside the filter it was made from (a probe
    refused for its shape pauses that one's shape: ``RelayLifecycle.on_probe_refused``): each
    asks only what its imprecise form asked (within the same bounds), so an event it brings,
    one that form matches, shows the relay ignored that REQ; on a relay answering everything,
    each brings what the REQ would have and proves nothing. A tag filter with
    ``PRECISE_KINDS``, a ``kinds`` filter with the owners of the repositories listing the
    relay (at most ``PROBE_AUTHORS``); one that stays imprecise (no owner known) is left out.
    At most ``PROBE_LIMIT`` events each; each probe asks one of them, in turn
    (``probe_turn``). (Until 2026-12-07 the probe asked the owners' announcements and their
    roots by id, whatever the REQ had asked: on a relay answering everything, an empty REQ
    asking replies to roots that have none was "proved" ignored.)"""
    chosen = frozenset(sorted(authors)[:PROBE_AUTHORS])
    made = ((f, made_precise(f, chosen)) for f in trigger)
    return [(f, m.replace(limit=PROBE_LIMIT)) for f, m in made if not is_imprecise(m)]


def proves_ignored(trigger: Iterable[Filter], event) -> bool:
    """Does a probe's ``event`` show that the relay ignored the REQ that came back empty
    (``trigger``: its imprecise filters asking stored events)? Only if one of them asked for
    it, a second inside its time bounds: an event at a bound's very second is no proof, since
    relays that read ``until`` (or ``since``) as exclusive never send it (the simulator's seed
    1501: a page bounded to a second such a relay held nothing before, then the probe's
    announcement at that second, marked a relay answering every query as one answering only
    precise queries)."""
    at = event.created_at
    return any(f.matches(event) and (f.until is None or at < f.until) and (f.since is None or at > f.since)
               for f in trigger)


def probe_turn(filters: list, turn: int) -> list:
    """The one of ``probe_sources``' filters the ``turn``-th probe of a relay asks, alone in its REQ:
    a relay answering one filter of a REQ (the first or the last) dropped the others, and a
    relay both such and answering only precise queries never showed it (the simulator's
    seed 815 of the every-behaviour world: an announcement only that relay held never came).
    In the REQ's order, and round again."""
    return [filters[turn % len(filters)]] if filters else []
