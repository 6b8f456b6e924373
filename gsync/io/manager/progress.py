"""Feeds ``sync.progress`` from the manager's tables: one ``RelayWork`` per relay (its queue,
the pages its paging filters are expected to take, its gate) and the repositories' relays.
The decisions (what is complete, how long is left) are the pure module's."""
from __future__ import annotations

from ...ops import metrics
from ...sync import filter_plan
from ...sync.batch_phase import BatchPhase
from ...sync.progress import RelayWork, SyncProgress, repos_complete, sync_progress
from ...sync.relay_state import RelayState


def pages_expected(state: RelayState) -> int:
    """Further starts the relay's paging REQs (queued or open) are expected to take: for each,
    as many pages as its most paged filter took so far (``sync.progress``: how deep a history
    goes is not known before its EOSE), twice over for repository events (layer 2): each
    such page brings roots, whose threads then take a start of their own."""
    session = state.current
    open_subs = session.book.subscriptions if session.book is not None else ()
    sub_ids = [sub_id for sub_id, _ in session.historic_queue]
    sub_ids += [sub_id for sub_id in session.sub_to_batch if sub_id in open_subs]
    expected = 0
    for sub_id in sub_ids:
        batch = session.pending.get(session.sub_to_batch.get(sub_id, -1))
        paging = batch.pagination.get(sub_id) if batch is not None else None
        if paging is not None and paging.filters:
            pages = max(f.pages for f in paging.filters)
            by_repo = any(filter_plan.asks_by_repo(f.original_filter) for f in paging.filters)
            expected += pages * (2 if by_repo else 1)
    return expected


def starts_reading_own(state: RelayState) -> int:
    """Filters of the relay's batches whose methods wait for the own relay's holdings
    (``sync.progress``: a start each, until their methods are chosen)."""
    return sum(len(batch.semantic_filters) for batch in state.current.pending.values()
               if batch.phase is BatchPhase.READING_OWN)


def relay_work(state: RelayState, health, now: float, settle_secs: float = 0.0) -> RelayWork:
    url = state.url
    return RelayWork(
        url=url,
        status=state.status,
        unreachable=bool(state.refused_reason) or health.parked(url, now) is not None
        or health.is_dead(url, now),
        starts_queued=len(state.current.historic_queue),
        pages_expected=pages_expected(state),
        starts_reading_own=starts_reading_own(state),
        gate_secs=health.start_interval(url, now),
        pace_secs=health.start_pace(url),
        wait_secs=health.may_start_background(url, now) if state.current.historic_queue else 0.0,
        settle_secs=settle_secs,
        events_delivered=state.events_delivered,
    )


def read_progress(relays, repos, health, sync, now: float) -> tuple[SyncProgress, list[RelayWork]]:
    """The round's progress, and the rows it was computed from (for per-relay gauges).
    ``sync``: the [sync] config, for the wait of the Syncing → Connected check
    (``HistoricCompletion.check``: the batch window and a second)."""
    settle = sync.batch_window_ms / 1000 + 1
    works = [relay_work(state, health, now, settle) for state in relays.values()]
    counted = {w.url for w in works if not w.unreachable}
    done = repos_complete(((address, needs.sync_level, needs.relays) for address, needs in repos.items()),
                          {url: state.confirmed for url, state in relays.items()}, counted)
    return sync_progress(works, len(repos), done), works


def publish(progress: SyncProgress) -> None:
    """The progress gauges (per relay, ``metrics.STARTS_QUEUED`` is the manager's
    ``update_metrics``': a series only for a relay in the table)."""
    metrics.SYNC_REPOS_COMPLETE.set(progress.repos_complete)
    metrics.SYNC_RELAYS_SYNCED.set(progress.relays_synced)
    metrics.SYNC_SECONDS_LEFT.set(-1 if progress.secs_left is None else progress.secs_left)
