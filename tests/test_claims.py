"""FetchClaims: each missing event is fetched by one batch; the others wait, and get it back
for recovery if that batch ends without it (no loss when one relay fails)."""
from gsync.protocol.filters import Filter
from gsync.sync.claims import FetchClaims

A, B, C = "wss://a.example", "wss://b.example", "wss://c.example"


def ids(*ns):
    return [f"{n:064x}" for n in ns]


def test_the_first_batch_claims_and_later_ones_skip():
    claims = FetchClaims()
    assert claims.claim(A, 1, ids(1, 2, 3)) == set(ids(1, 2, 3))
    assert claims.claim(B, 7, ids(2, 3, 4)) == set(ids(4))
    assert claims.claim(A, 2, ids(1, 5)) == set(ids(5))  # another batch of the same relay too


def test_a_claim_again_by_its_own_batch_is_still_its_own():
    claims = FetchClaims()
    claims.claim(A, 1, ids(1))
    assert claims.claim(A, 1, ids(1)) == set()  # already fetching it: not twice
    assert claims.release(A, 1) == {}  # and nobody waits on it


def test_arrivals_settle_an_id_for_everyone():
    claims = FetchClaims()
    claims.claim(A, 1, ids(1, 2))
    claims.claim(B, 1, ids(1, 2))
    claims.arrived(ids(1)[0])
    assert claims.release(A, 1) == {B: dict.fromkeys(ids(2))}
    assert len(claims) == 0


def test_a_failed_batch_hands_what_did_not_arrive_to_every_relay_that_skipped_it():
    claims = FetchClaims()
    claims.claim(A, 1, ids(1, 2, 3))
    claims.claim(B, 4, ids(1, 2))
    claims.claim(C, 9, ids(2, 3))
    claims.arrived(ids(3)[0])
    handed = claims.release(A, 1)
    assert {r: sorted(v) for r, v in handed.items()} == {B: ids(1, 2), C: ids(2)}
    # unclaimed now: the next exchange that finds them claims them
    assert claims.claim(C, 10, ids(1, 2)) == set(ids(1, 2))


def test_released_batches_leave_nothing_behind():
    claims = FetchClaims()
    for batch in range(50):
        claims.claim(A, batch, ids(*range(batch, batch + 10)))
        claims.claim(B, batch, ids(*range(batch, batch + 10)))
    for batch in range(50):
        claims.release(A, batch)
        claims.release(B, batch)
    assert len(claims) == 0 and not claims._by_batch and not claims._waiting


def test_a_skipped_id_is_handed_back_with_the_filter_that_found_it_there():
    found_here = Filter.make(kinds=[1621], tags={"a": ["30617:aa:one"]})
    claims = FetchClaims()
    claims.claim(A, 1, ids(1, 2))
    claims.claim(B, 3, ids(1, 2), found_by=found_here)
    claims.claim(C, 4, ids(2))
    assert claims.release(A, 1) == {B: dict.fromkeys(ids(1, 2), found_here), C: {ids(2)[0]: None}}
