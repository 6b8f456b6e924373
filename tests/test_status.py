"""The connection status table (gsync/sync/status.py): every move, and that none is made
anywhere else."""
import ast
import pathlib

import pytest

from gsync.sync.relay_state import RelayState
from gsync.sync.status import TRANSITIONS, ConnectionStatus, Fact, IllegalMove, move

S, F = ConnectionStatus, Fact

EXPECTED = {
    (S.DISCONNECTED, F.DIALLED): S.CONNECTING,
    (S.CONNECTING, F.HANDSHAKE_FAILED): S.DISCONNECTED,
    (S.CONNECTING, F.HANDSHAKE_DONE): S.SYNCING,
    (S.SYNCING, F.CONNECTION_LOST): S.DISCONNECTED,
    (S.CONNECTED, F.CONNECTION_LOST): S.DISCONNECTED,
    (S.CONNECTED_HISTORIC_SYNC_FAILURES, F.CONNECTION_LOST): S.DISCONNECTED,
    (S.DISCONNECTED, F.RETIRED): S.DISCONNECTED,
    (S.CONNECTING, F.RETIRED): S.DISCONNECTED,
    (S.SYNCING, F.RETIRED): S.DISCONNECTED,
    (S.CONNECTED, F.RETIRED): S.DISCONNECTED,
    (S.CONNECTED_HISTORIC_SYNC_FAILURES, F.RETIRED): S.DISCONNECTED,
    (S.SYNCING, F.FRESH_START): S.SYNCING,
    (S.CONNECTED, F.FRESH_START): S.SYNCING,
    (S.CONNECTED_HISTORIC_SYNC_FAILURES, F.FRESH_START): S.SYNCING,
    (S.SYNCING, F.HISTORIC_DONE): S.CONNECTED,
    (S.SYNCING, F.HISTORIC_DONE_WITH_FAILURES): S.CONNECTED_HISTORIC_SYNC_FAILURES,
    (S.CONNECTED_HISTORIC_SYNC_FAILURES, F.RECOVERED): S.CONNECTED,
}


@pytest.mark.parametrize("status", list(S), ids=lambda s: s.name)
@pytest.mark.parametrize("fact", list(F), ids=lambda f: f.name)
def test_every_status_and_fact_moves_as_the_table_says_or_is_refused(status, fact):
    state = RelayState("wss://r.example", status=status)
    if (status, fact) in EXPECTED:
        assert move(state, fact) is EXPECTED[(status, fact)]
        assert state.status is EXPECTED[(status, fact)]
    else:
        with pytest.raises(IllegalMove):
            move(state, fact)
        assert state.status is status  # unchanged


def test_the_table_is_exactly_the_moves_listed_here():
    assert TRANSITIONS == EXPECTED


def test_no_status_is_assigned_outside_the_status_module():
    root = pathlib.Path(__file__).resolve().parent.parent / "gsync"
    found = []
    for path in root.rglob("*.py"):
        if path.name == "status.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for t in targets:
                for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if (isinstance(leaf, ast.Attribute) and leaf.attr == "status"
                            and not (isinstance(leaf.value, ast.Name) and leaf.value.id == "self")):
                        found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []
