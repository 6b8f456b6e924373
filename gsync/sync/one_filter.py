"""Relays that answer one filter of a REQ (or its first few) and drop the others without a word.

NIP-01 has a REQ's filters OR-ed, and gsync packs up to ten into one REQ. A relay that
queries only one of them (ORLY before October 2025 kept the last filter's answer alone;
minimal relays read ``filters[0]``) sends an EOSE as if the others matched nothing: their
events never arrive, and nothing says why. What NIP-11's ``max_filters`` would have said,
such a relay has to be caught at:

- an answer is **suspect** when one of the REQ's filters matches every event it brought (or
  it brought none): a relay answering one filter could have sent it. An answer that needs two
  filters to explain it proves the relay answers more than one (``unserved_candidates`` is
  None): the relay is not suspected again before its next daily fresh start, whatever its
  sessions (``RelayState.filters_answered``). An answer a cap may have cut (the REQ's
  whole, or a slow one) is not judged: its next page is;
- the suspect REQ's filters that matched nothing are asked alone, one a paced start, for their newest event
  no newer than what the REQ could have brought (``probe_filter``), in the order most likely
  to show such a relay (``probe_order``): a filter on its first page, layer 1 (a relay listed
  in announcements holds some), then the repositories' tags; the next after its answer, at
  most ``PROBES_PER_SESSION`` a session;
- a probe answered with an event the REQ did not bring: the relay answers one filter a REQ
  (``max_filters`` 1, kept across restarts) and its sync starts again so;
- a relay polled one filter a REQ for want of proof either way (``polls_filter_by_filter``),
  or looked at so (``looks_filter_by_filter``: known to drop live subscriptions), is asked,
  once a day, two events it holds (served lately, or found on both sides by a NIP-77
  exchange) in one REQ of two filters of one id each (``Refusals.ask_filters_proof``): its
  answer is judged as any other's above;
- a relay proven to answer several filters may still read only the first few, or the last
  few (a ``max_filters`` it never publishes): once a day it is asked as many events it
  served as a REQ carries there, one a filter (``reach_to_prove``); the first few or the
  last few served alone (``answered_run``), the one next to them is asked alone, and served
  so, the relay is asked that many filters a REQ.

Pure: seen ids and filters in, indices and filters out.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

from .. import constants
from ..protocol.filters import Filter
from . import filter_plan

# Probes a session spends on suspect answers. A relay that answers every filter is proven
# so by its first answer that needs two filters; one whose REQs one filter each explains
# (a relay holding little, or few events a repository) costs this many starts a session,
# each at upkeep priority (after the sync's own starts). One was not enough: spent on a
# filter that held nothing, a relay answering the last filter of each REQ kept a state event
# from the next day's sync too (the simulator, seed 624 of --days 12 --relays 12 --repos 40
# --one-filter 0.4 with caps and until readings).
PROBES_PER_SESSION = 3
# A probe asks for nothing stored in the last minute: an event stored after the suspect REQ
# was answered is no evidence that it was left out.
PROBE_MARGIN_SECS = 60
LAYER1_KINDS = frozenset((30617, 10317))


def polls_filter_by_filter(state) -> bool:
    """Does the relay of ``state`` (a ``RelayState``) get its polls one filter a REQ? When it
    keeps no live subscription (it closes each after its EOSE: all its live coverage is
    polled) and is not proven to answer several filters of a REQ. One that answers one
    filter and holds little is never proven either way (each answer one filter's, its
    probes finding nothing), and its polls of several filters left what came to the others
    for its next daily sync (the simulator, seed 803 of an every-behaviour world: a state
    event, 11 h). A relay keeping live subscriptions streams every filter's new events:
    its overflow polls stay packed."""
    return state.current.live_not_kept and not state.filters_answered


def looks_filter_by_filter(state) -> bool:
    """Does the relay of ``state`` get its hourly live looks one filter a REQ
    (``start_queue.batch_limits``)? When it is known to drop live subscriptions without a
    word (a look found events they missed: ``RelayState.live_dropped_at``), keeps them (one
    keeping none is polled, not looked at), and is not proven to answer several filters of a
    REQ. On such a relay the look is all its live coverage; one that also answered the first
    filter of each REQ alone, holding too little to be caught so, had every look answer that
    filter only, and what came to the others waited for its next daily sync (the simulator's
    seed 974 of a 30-relay world: a patch, 8 h). Not every unproven relay: those syncing by
    NIP-77 answer id fetches of one filter and stay unproven all day, and looks one filter a
    REQ there cost the suite's world a quarter to a half more messages."""
    return (state.live_dropped_at is not None and not state.current.live_not_kept
            and not state.filters_answered)


def asks_filters_proof(state, rejected: Collection[str] = (), now: float = 0.0) -> bool:
    """Is the proof due on the relay of ``state``: two events it holds asked back in one REQ
    of two filters (``Refusals.ask_filters_proof``)? When it is not proven to answer several
    filters of a REQ either way (its polls or its looks may go one filter a REQ for want of
    it: ``polls_filter_by_filter``, ``looks_filter_by_filter``), two events it holds are
    known (``RelayState.proof_ids``), the proof was not asked since its last daily fresh
    start, and it is not known to answer one filter a REQ (``max_filters`` 1: its one-filter
    answer would start its sync again, every day). Any unproven relay, not only those: one
    syncing by NIP-77 (an exchange and an id fetch are one filter each) whose live
    subscriptions it drops was never seen dropping them, its hourly looks of eight filters
    answered for the first alone, and what came to the others waited for the next daily
    sync (the simulator's seed 2507 of a 50-relay world with value caps: a comment, 9 h).
    A REQ a day, once its sync has completed (under the gate a start in a first sync is a
    second of the operator's wait) where nothing goes one filter a REQ for want of it, with
    two events it served (not ones an exchange only found on both sides: one it hides on
    read was asked by id once more, seed 8 of the suite's world), and not of a relay judged
    not to serve ids (a proof by id proves nothing there)."""
    limits = state.current.limits
    if limits is not None and limits.max_filters == 1:
        return False
    if state.filters_answered:
        return not state.reach_proof_asked and bool(reach_to_prove(state, rejected, now))
    return (not state.filters_proof_asked and len(state.proof_ids) == 2
            and not any(i in rejected for i in state.proof_ids)  # (no proof asks what the own relay refused)
            and (polls_filter_by_filter(state) or looks_filter_by_filter(state)
                 or (state.historic_sync_completed_at is not None and state.ids_unserved_at is None
                     and set(state.proof_ids) <= set(state.proof_served))))


def reach_to_prove(state, rejected: Collection[str] = (), now: float = 0.0) -> tuple[str, ...]:
    """The ids the daily proof asks of a relay proven to answer several filters
    (``filters_answered``) but not yet as many as gsync packs into a REQ there, one a
    filter: ids it served (``RelayState.reach_ids``), none the own relay refused
    (``rejected``: it holds what it took, and a refused event asked again is one downloaded
    again for nothing); none when no proof is due. A relay answering the first few filters
    of a REQ and dropping the rest without a word (one reading up to a ``max_filters`` it
    never publishes) answers two, and was taken for one answering all: what came to its
    later filters never arrived (the simulator with relays answering the first 2, 3 or 5
    filters, ``--filter-caps``: seeds 7002 and 7004, ``left_behind``). A live look's interval after
    its sync completed (``now``; at an answer then, the look's: a start in a first sync is a
    second of the operator's wait, and each of the ten events it asks is one downloaded
    again), with ids it served (not of a relay judged not to serve ids), three at least; not
    before ``RelayState.reach_proof_again_at`` (a slow answer's retry)."""
    completed = state.historic_sync_completed_at
    if (completed is None or now - completed < constants.LIVE_AUDIT_SECS or now < state.reach_proof_again_at
            or state.ids_unserved_at is not None):
        return ()
    ids = tuple(i for i in state.reach_ids if i not in rejected)[:filter_plan.filters_per_req(state.current.limits)]
    return ids if len(ids) >= 3 and len(ids) > state.filters_reach else ()


def answered_run(served: Sequence[bool]) -> tuple[int, int] | None:
    """A proof's answer (``served[i]``: the id its filter ``i`` asked came back): how many
    filters a relay answering only a few of a REQ answered, and which filter it left
    unanswered next to them (asked alone to confirm it), when the answer is exactly such a
    run, shorter than the REQ: its first few (a relay reading up to its cap), or its last few
    (one keeping the REQ's newest filters within its cap: the first proof of such a relay
    asked three filters of ten, ``FFFFFFFTTT``, and was taken for three events gone since).
    None otherwise: every filter answered, or a pattern no such relay gives (an event deleted
    since, hidden on read)."""
    n, m = len(served), sum(served)
    if not 1 <= m < n:
        return None
    if all(served[:m]):
        return m, m
    if all(served[n - m:]):
        return m, n - m - 1
    return None


def unserved_candidates(seen: Sequence[Collection[str]]) -> list[int] | None:
    """The filters of a REQ (``seen[i]``: the ids of what it brought that filter ``i``
    matches) a relay answering one filter may have left unanswered: those that matched
    nothing of it (one that matched some was answered, or cut short by a cap of its own:
    what it lacks is no evidence). None when it answered at least two (no single filter
    matches all it brought), or the REQ had one filter."""
    if len(seen) < 2:
        return None
    sets = [set(s) for s in seen]
    brought = set().union(*sets)
    if brought and not any(s == brought for s in sets):
        return None
    return [i for i, s in enumerate(sets) if not s]


def probe_order(filters: Sequence[Filter], candidates: Sequence[int]) -> list[int]:
    """``candidates`` (indices into ``filters``), those most likely to show a relay that
    answers one filter first: a filter on its first page (one on a later page was answered
    before: a one-filter relay may have answered it), then layer 1, then repository tags
    (``#a``, ``#A``), then the rest, each in REQ order."""
    def rank(i: int) -> tuple[int, int]:
        flt = filters[i]
        if flt.kinds and LAYER1_KINDS & set(flt.kinds):
            kind = 0
        elif any(name in ("a", "A") for name, _ in flt.tags):
            kind = 1
        else:
            kind = 2
        return (flt.until is not None, kind)
    return sorted(candidates, key=lambda i: (rank(i), i))


def probe_filter(flt: Filter, newest: int) -> Filter:
    """``flt`` asked for its newest event alone, none newer than ``newest`` (what the
    suspect REQ could have brought: one stored since is no evidence) and, on a page past
    the first, none at the second the page is bounded to: what a page brings again at it
    counts for no filter (``FilterPaginationState.boundary_ids``), and is no evidence."""
    until = newest if flt.until is None else min(flt.until - 1, newest)
    return flt.replace(limit=1, until=until)
