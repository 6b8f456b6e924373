"""A NIP-77 result cap end to end (issue 40): strfry's ``["NEG-ERR", sub, "blocked: too many
query results", 10]`` over one repository's 169 issues. Cut by what the own relay holds of
the refused filter, it converges in a few refusals; halving blindly, 46.

``GSYNC_CAP_TEST_GATE_MS=1000`` runs it under the default 1-per-second gate (the figures
the issue measured); the suite runs it under the tests' gate."""
from __future__ import annotations

import os
import time

import pytest

from . import factory as f
from .relays import publish
from .scenario import assert_arrives, bob, our_announcement
from .scripted_relay import Nip77Serve

ISSUES = 169
CAP = 10

# What the own relay holds of the issues beforehand: one (a repository just added
# elsewhere), every other one, all but one in twenty (a re-sync).
HELD = {
    "one": lambda i: i == 0,
    "half": lambda i: i % 2 == 0,
    "most": lambda i: i % 20 != 7,
}


@pytest.mark.parametrize("held,reported", [(held, True) for held in sorted(HELD)] + [("most", False)])
def test_a_result_cap_of_10_over_169_events_converges_in_at_most_15_refusals(
        relay_factory, gsync_factory, scripted, held, reported):
    """``reported``: the NEG-ERR carries the cap (strfry); without it, the cap is learnt."""
    own = relay_factory()
    nip77 = Nip77Serve(max_results=CAP, report_cap=reported)
    remote = scripted(negentropy=nip77, page_size=500)
    repo = our_announcement(own, [remote], d=f"capped-{held}")
    issues = [f.issue(bob, repo, subject=f"capped {i}", created_at=f.BASE_CREATED_AT + 3600 * i)
              for i in range(ISSUES)]
    remote.add(repo, *issues)
    publish(own.url, [repo, *(issue for i, issue in enumerate(issues) if HELD[held](i))])
    extra = {}
    if gate := os.environ.get("GSYNC_CAP_TEST_GATE_MS"):
        extra = {"sync": {"background_start_interval_ms": gate}}
    started = time.monotonic()
    gsync = gsync_factory(own, [remote], extra=extra)
    assert_arrives(own, issues, timeout=200, what="the 169 issues")
    secs = time.monotonic() - started
    print(f"held={held} reported={reported}: {secs:.1f} s, NEG-OPEN {nip77.opened} (refused {nip77.refused}), "
          f"REQ {len(remote.reqs())}")
    assert nip77.refused >= 1, "the relay's cap was reached"
    assert nip77.refused <= 15, f"{nip77.refused} refusals"
    assert "negentropy_unsupported" not in gsync.log_text(), "NIP-77 stayed on"


@pytest.mark.parametrize("reported", [True, False])
def test_a_later_repository_on_a_relay_whose_cap_is_known_is_cut_before_its_first_neg_open(
        relay_factory, gsync_factory, scripted, reported):
    """The cap learnt from the first repository (10, as strfry reports it; or, unreported,
    the most events an exchange there was served for): a repository added later, of which
    the own relay holds 40 issues, is cut by its holdings before any NEG-OPEN, not one
    refusal later, into windows of 8 held (``FILL`` of 10): five exchanges."""
    own = relay_factory()
    nip77 = Nip77Serve(max_results=CAP, report_cap=reported)
    remote = scripted(negentropy=nip77, page_size=500)
    first = our_announcement(own, [remote], d="capped-first")
    first_issues = [f.issue(bob, first, subject=f"first {i}", created_at=f.BASE_CREATED_AT + 3600 * i)
                    for i in range(30)]
    remote.add(first, *first_issues)
    publish(own.url, [first, *first_issues[::2]])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, first_issues, timeout=60, what="the first repository's issues")
    refused, cut, opened = nip77.refused, gsync.log_text().count("negentropy_filter_cut"), nip77.opened
    assert refused >= 1, "the relay's cap was reached"
    second = our_announcement(own, [remote], d="capped-second")
    second_issues = [f.issue(bob, second, subject=f"second {i}", created_at=f.BASE_CREATED_AT + 3600 * i)
                     for i in range(50)]
    remote.add(second, *second_issues)
    publish(own.url, [second, *second_issues[:40]])
    assert_arrives(own, second_issues, timeout=60, what="the second repository's issues")
    second_a = next(t[1] for t in second.tags if t[0] == "d")
    by_second = [flt for flt in nip77.filters[opened:] if any(second_a in v for v in flt.tag("a") or ())]
    print(f"refused {refused} for the first repository, {nip77.refused - refused} for the second, "
          f"its NEG-OPENs {len(by_second)}")
    assert nip77.refused == refused, "the second repository's filter was refused first"
    assert len(by_second) <= 6, [(flt.since, flt.until) for flt in by_second]
    assert gsync.log_text().count("negentropy_filter_cut") > cut, "cut before its start"


@pytest.mark.parametrize("reported", [True, False])
def test_windows_cut_past_a_cap_lose_no_second_on_a_relay_reading_until_as_exclusive(
        relay_factory, gsync_factory, scripted, reported):
    """A relay that reads ``until`` as exclusive in NEG-OPEN as in REQ (PEERS.md), with a
    cap of 10. The own relay holds 60 hourly issues; the relay holds besides one issue a
    second before each of them and one in the same second as the last: where windows cut
    by the holdings end (the second before the next window's first held one; the last held
    second). Each window must still bring its last second's events."""
    own = relay_factory()
    nip77 = Nip77Serve(max_results=CAP, report_cap=reported)
    remote = scripted(negentropy=nip77, page_size=500, until_exclusive=True)
    repo = our_announcement(own, [remote], d=f"capped-exclusive-{reported}")
    hours = [f.BASE_CREATED_AT + 3600 * i for i in range(60)]
    held = [f.issue(bob, repo, subject=f"held {i}", created_at=t) for i, t in enumerate(hours)]
    lacked = [f.issue(bob, repo, subject=f"before {i}", created_at=t - 1) for i, t in enumerate(hours)]
    lacked.append(f.issue(bob, repo, subject="beside the last", created_at=hours[-1]))
    remote.add(repo, *held, *lacked)
    publish(own.url, [repo, *held])
    gsync = gsync_factory(own, [remote])
    assert_arrives(own, lacked, timeout=60, what="the issues at the windows' last seconds")
    bounded = [flt for flt in nip77.filters if flt.until is not None]
    print(f"NEG-OPEN {nip77.opened} (refused {nip77.refused}, {len(bounded)} bounded by until), "
          f"REQ {len(remote.reqs())}")
    assert nip77.refused >= 1 and bounded, "the cap was reached and the filter cut into windows"
    assert nip77.refused <= 15, f"{nip77.refused} refusals"
    assert gsync.metric("gsync_events_dropped_total") == 0
