"""A relay's historic sync done: the Syncing → Connected check (no pending batch now, and
still none a batch window and a second later: seed 001), and the move back from
ConnectedHistoricSyncFailures once missing-event recovery has everything."""
from __future__ import annotations

from ...ops.logging import get_logger
from ...sync.relay_state import ConnectionStatus, RelayState
from ...sync.status import Fact
from ..inbox import CompletionRecheck
from .lifecycle import move_status

log = get_logger("gsync.manager")


class HistoricCompletion:
    """Whether each relay of ``relays`` is done with historic sync (``sync``: the batch
    window), rechecked through ``effects``; and recovered, as ``recovery`` says."""

    def __init__(self, *, sync, relays, recovery, effects, clock, on_complete=lambda state: None):
        self.sync = sync
        self.on_complete = on_complete  # (``Refusals.prove_values_if_due``)
        self.relays = relays
        self.recovery = recovery
        self.effects = effects
        self.clock = clock

    def check(self, state: RelayState) -> None:
        """Double check (seed 001): no pending batch now, and still none 6 s later."""
        if (state.current.syncing() or state.current.completion_check_scheduled
                or state.status != ConnectionStatus.SYNCING):
            return
        state.current.completion_check_scheduled = True
        delay = self.sync.batch_window_ms / 1000 + 1
        self.effects.later(delay, CompletionRecheck(state.url, state.session))

    def on_completion_recheck(self, msg: CompletionRecheck) -> None:
        state = self.relays.in_session(msg.relay, msg.session)
        if state is None:
            return
        state.current.completion_check_scheduled = False
        if state.current.syncing() or state.status != ConnectionStatus.SYNCING:
            return
        move_status(state, Fact.HISTORIC_DONE_WITH_FAILURES if state.batch_failures else Fact.HISTORIC_DONE)
        state.historic_sync_completed_at = self.clock()
        log.info("historic_sync_complete", relay=state.url, status=state.status.name)
        self.promote_if_recovered(state.url)  # recovery may have finished before this check
        self.on_complete(state)

    def promote_if_recovered(self, url: str) -> None:
        state = self.relays.get(url)
        if (
            state is not None
            and state.status == ConnectionStatus.CONNECTED_HISTORIC_SYNC_FAILURES
            and self.recovery.is_fully_recovered(url)
            and not state.unrelated_failure
        ):
            move_status(state, Fact.RECOVERED)
            state.batch_failures = False
            log.info("relay_recovered", relay=url)
